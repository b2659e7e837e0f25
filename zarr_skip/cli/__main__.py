"""``python -m zarr_skip.cli``."""

import sys

from zarr_skip.cli.main import main

sys.exit(main())
