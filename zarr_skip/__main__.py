"""``python -m zarr_skip``: the ``zarr-skip`` command."""

import sys

from zarr_skip.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
