"""The test suite's throw-away servers, for the benchmarks that need them.

The SeaweedFS S3 server (``tests/_s3server.py``) and its FUSE mounts (``tests/_fuse.py``) live
with the tests; the benchmarks reuse them rather than copy them. :func:`test_helper` finds one
of those modules wherever the test suite keeps it (``tests/<name>.py``, or inside
``tests/helpers``), so that moving them does not break the benchmarks.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from .machine import REPO_ROOT


def _by_path(name: str) -> ModuleType | None:
    for path in (REPO_ROOT / "tests" / f"{name}.py", REPO_ROOT / "tests" / "helpers" / f"{name}.py"):
        if not path.is_file():
            continue
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so that the helpers' own imports of each other find it
        spec.loader.exec_module(module)
        return module
    return None


def test_helper(name: str, needs: str) -> ModuleType:
    """The test helper module ``name`` (e.g. ``"_s3server"``), which must define ``needs``.

    Raises
    ------
    ImportError
        No module of the test suite defines ``needs`` (names the places looked at).
    """
    candidates = [f"tests.{name}", f"tests.helpers.{name}", f"tests.helpers.{name.lstrip('_')}", "tests.helpers"]
    sys.path.insert(0, str(REPO_ROOT / "tests"))  # the helpers import each other as top-level modules
    try:
        found = _by_path(name)
        if found is not None and hasattr(found, needs):
            return found
        for cand in candidates:
            try:
                module = importlib.import_module(cand)
            except ImportError:
                continue
            if hasattr(module, needs):
                return module
    finally:
        sys.path.remove(str(REPO_ROOT / "tests"))
    raise ImportError(f"no test helper defines {needs!r}: looked for tests/{name}.py and {candidates}")
