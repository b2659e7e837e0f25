"""Exclusive creates on a local or mounted file system: one rename where the kernel can."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zarr_skip.store import _beneath
from zarr_skip.store._localfs import Tree


@pytest.mark.parametrize("noreplace", [True, False], ids=["renameat2", "link"])
def test_a_create_stands_once_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, noreplace: bool
) -> None:
    if not noreplace:  # a file system that refuses RENAME_NOREPLACE: link and unlink
        monkeypatch.setattr(_beneath, "_noreplace", False)
    tree = Tree(tmp_path)
    tree.create("a/b/zarr.json", b"first")
    tree.create("a/b/zarr.json", b"second")
    assert tree.read("a/b/zarr.json") == b"first"
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["zarr.json"]


def test_renameat2_says_whether_the_name_was_free(tmp_path: Path) -> None:
    if _beneath._RENAMEAT2 is None:
        pytest.skip("renameat2(RENAME_NOREPLACE) is not available here")
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    assert _beneath.rename_noreplace(str(tmp_path / "a"), str(tmp_path / "b")) is False
    assert (tmp_path / "b").read_bytes() == b"b" and (tmp_path / "a").exists()
    assert _beneath.rename_noreplace(str(tmp_path / "a"), str(tmp_path / "c")) is True
    assert (tmp_path / "c").read_bytes() == b"a" and not (tmp_path / "a").exists()


def test_a_cache_kept_until_interpreter_exit_closes_quietly(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from helpers import make_batch\n"
        "import zarr_skip as zs\n"
        f"cache = zs.open_cache({str(tmp_path / 'c')!r}, {{'n': 1}})\n"
        "cache.write(0, make_batch(8), expected=1)\n"
    )
    root = str(Path(__file__).parent.parent)
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
