"""tests/verl_integration: run against the real verl, only in the verl environment.

``bash scripts/verl_env.sh test`` (or ``make test-verl``) builds ``.venv-verl`` with
verl==0.9.1 and runs this directory. Anywhere verl does not import (the main ``.venv``), the
test modules here are not collected at all, so the main suite neither fails nor skips on them.

The directory is not called ``tests/verl``: pytest's default import mode puts ``tests/`` on
``sys.path``, where a ``verl/`` directory would be importable as a namespace package named
``verl`` and fool every ``importlib.util.find_spec("verl")`` check in the main suite.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    importlib.import_module("verl.utils.skip")
except ImportError:
    collect_ignore_glob = ["test_*.py"]
else:
    collect_ignore_glob = []

HERE = Path(__file__).resolve().parent

logging.getLogger("zarr_skip").setLevel(logging.DEBUG)
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


@pytest.fixture(autouse=True)
def _clean_verl_state() -> Iterator[None]:
    """verl's SkipManager and registry as verl left them, before and after every test."""
    from verl_fakes import reset_skip_manager

    import zarr_skip.integrations.verl as zv

    zv.uninstall()
    reset_skip_manager()
    saved_tq = sys.modules.get("transfer_queue")
    yield
    zv.uninstall()
    reset_skip_manager()
    if saved_tq is None:
        sys.modules.pop("transfer_queue", None)
    else:
        sys.modules["transfer_queue"] = saved_tq


@pytest.fixture
def fake_tq() -> Any:
    """A fresh in-memory ``transfer_queue`` module in ``sys.modules``."""
    from verl_fakes import FakeTransferQueue

    return FakeTransferQueue().install()
