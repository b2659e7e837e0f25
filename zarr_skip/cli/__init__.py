"""The ``zarr-skip`` command line."""

from __future__ import annotations

from zarr_skip.cli.main import main

__all__ = ["main"]
