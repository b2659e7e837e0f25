"""Keys stay inside the cache: names from users and from stored records are checked, and the
local backend never reads or writes through a symbolic link that leads out of the root."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_batch
from zarr.storage import MemoryStore

import zarr_skip as zs
from zarr_skip.format import layout
from zarr_skip.store.storage import Storage, open_store

SECRET = b"outside the cache: never returned as data"


# -- pure checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b", "a\x00b", "/abs", 3, None], ids=repr)
def test_a_segment_is_one_name_inside_its_directory(name: Any) -> None:
    assert layout.name_problem(name) is not None


@pytest.mark.parametrize("name", ["a", "w-host-1-ab12", "responses", "a.b", "é", "x..y"])
def test_ordinary_names_are_segments(name: str) -> None:
    assert layout.name_problem(name) is None
    assert layout.column_name_problem(name) is None


@pytest.mark.parametrize("name", [".hidden", "zarr.json", "../x", "a\x00", "x/y", "a\\b", "a\ud800"], ids=repr)
def test_column_names_that_could_clash_or_escape_are_refused(name: str) -> None:
    assert layout.column_name_problem(name) is not None


@pytest.mark.parametrize("key", ["/etc/passwd", "a/../../x", "a//b", "a/./b", "a\x00/b", "a\\..\\b", "../x"], ids=repr)
def test_keys_that_leave_the_cache(key: str) -> None:
    assert layout.key_problem(key) is not None


@pytest.mark.parametrize("key", ["", "zarr.json", "e_p/GBS4_N2_in8_out16/3/r1/0/w-x/responses/values/c.0"])
def test_keys_inside_the_cache(key: str) -> None:
    assert layout.key_problem(key) is None


# -- names given by a user ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "a/../../b", "a\x00b", "zarr.json", "..", "a\\b", "s\udc80"], ids=repr)
def test_a_bad_column_name_is_refused_before_anything_is_written(tmp_path: Path, fingerprint: dict, name: str) -> None:
    root = tmp_path / "cache"
    cache = zs.open_cache(root, fingerprint)
    cache.write(1, make_batch(4))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(zs.UnsupportedColumnError, match="not a valid column name"):
        cache.write(2, {"ok": torch.zeros(4), name: torch.ones(4)})
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert not list(tmp_path.glob("x")) and not list(tmp_path.glob("b"))


@pytest.mark.parametrize("run_id", ["../x", "a/b", "a\x00", ""], ids=repr)
def test_a_bad_run_id_is_refused(tmp_path: Path, fingerprint: dict, run_id: str) -> None:
    with pytest.raises(zs.ConfigError, match="run_id"):
        zs.open_cache(tmp_path / "cache", fingerprint, run_id=run_id)


@pytest.mark.parametrize("experiment", ["../x", "/abs", "a/../b", "a\x00", "."], ids=repr)
def test_a_bad_experiment_name_is_refused(tmp_path: Path, fingerprint: dict, experiment: str) -> None:
    with pytest.raises(zs.ConfigError, match="experiment"):
        zs.open_cache(tmp_path / "cache", fingerprint, experiment=experiment)


@pytest.mark.parametrize("backend", ["local", "memory"])
@pytest.mark.parametrize("key", ["../secret", "/etc/hostname", "a/../../secret", "a\x00"], ids=repr)
def test_storage_refuses_keys_that_leave_the_root(tmp_path: Path, backend: str, key: str) -> None:
    (tmp_path / "secret").write_bytes(SECRET)
    store = open_store(tmp_path / "cache") if backend == "local" else MemoryStore()
    storage = Storage(store)
    for call in (
        lambda: storage.get(key),
        lambda: storage.get_many([key]),
        lambda: storage.set(key, b"x"),
        lambda: storage.create_if_absent(key, b"x"),
        lambda: storage.delete(key),
        lambda: storage.delete_prefix(key),
    ):
        with pytest.raises(zs.OutsideCacheError):
            call()
    assert (tmp_path / "secret").read_bytes() == SECRET


def test_a_checked_directory_does_not_let_a_bad_last_segment_through(tmp_path: Path) -> None:
    """Every local read checks its whole key (at C speed in the common case): after ``a/b/c``
    was read, ``a/b/..`` and its kin are still refused."""
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "cache" / "a" / "b").mkdir(parents=True)
    (tmp_path / "cache" / "a" / "b" / "c").write_bytes(b"fine")
    storage = Storage(open_store(tmp_path / "cache"))
    assert storage.get("a/b/c") == b"fine"
    for key in ("a/b/..", "a/b/", "a/b/.", "a/b/x\\..\\..", "a/b/\x00"):
        with pytest.raises(zs.OutsideCacheError):
            storage.get(key)
    assert storage.get("a/b/c") == b"fine"


# -- names in stored records ----------------------------------------------------------------------


def _verified_clean(cache: Any) -> bool:
    """Whether verify() calls the cache clean; a way out of the cache is one of its problems."""
    report = cache.verify()
    assert report.ok or any(p.kind in ("OutsideCacheError", "metadata", "MetadataError") for p in report.problems)
    return report.ok


def _record(root: Path, step: int) -> tuple[Path, dict[str, Any]]:
    (path,) = [p for p in root.rglob("zarr.json") if p.parent.parent.parent.name == str(step) and p.parent.name == "0"]
    doc = json.loads(path.read_bytes())
    return path, doc


def _rewrite(path: Path, doc: dict[str, Any], edit: Any) -> None:
    """Edit a mini-batch record as an adversary would: its checksum recomputed."""
    part = doc["attributes"][layout.PART_ATTR]
    edit(part)
    part["checksum"] = layout.doc_checksum(part)
    path.write_text(json.dumps(doc))


def _plant_outside(tmp_path: Path, part_dir: Path, data: str) -> Path:
    """A copy of the real data file, placed outside the cache, with a known payload."""
    outside = tmp_path / "outside"
    shutil.copyfile(part_dir / data, outside)
    return outside


def test_a_record_whose_data_path_climbs_out_is_refused(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    cache = zs.open_cache(root, fingerprint)
    cache.write(1, {"x": torch.arange(8)})
    path, doc = _record(root, 1)
    data = doc["attributes"][layout.PART_ATTR]["data"]
    # the same bytes outside the cache, reached by climbing out of the mini-batch directory
    climb = os.path.relpath(_plant_outside(tmp_path, path.parent, data), path.parent)
    assert climb.startswith("..")
    _rewrite(path, doc, lambda part: part.update(data=climb))
    reader = zs.open_cache(root, fingerprint, read_only=True)
    with pytest.raises(zs.CorruptCacheError, match="inside the cache"):
        reader.load(1)["x"][:]
    assert not _verified_clean(reader)


def test_a_record_whose_column_name_climbs_out_is_refused(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    cache = zs.open_cache(root, fingerprint)
    cache.write(1, {"x": torch.arange(8)})
    path, doc = _record(root, 1)
    data_file = path.parent / doc["attributes"][layout.PART_ATTR]["data"]
    shutil.copyfile(data_file, tmp_path / "x")  # the data, one level outside

    def climb(part: dict[str, Any]) -> None:
        part["columns"] = {"../../../../../../x": part["columns"]["x"]}

    _rewrite(path, doc, climb)
    with pytest.raises(zs.CorruptCacheError, match="inside the cache"):
        zs.open_cache(root, fingerprint, read_only=True).load(1)


def test_a_symlinked_data_directory_pointing_outside_is_never_read(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    cache = zs.open_cache(root, fingerprint)
    cache.write(1, {"x": torch.arange(8)})
    path, doc = _record(root, 1)
    data_dir = path.parent / doc["attributes"][layout.PART_ATTR]["data"]
    # the data moved outside, a link left in its place: the bytes are the right ones, but
    # reading them means leaving the cache
    shutil.move(data_dir, tmp_path / "moved")
    data_dir.symlink_to(tmp_path / "moved", target_is_directory=True)
    reader = zs.open_cache(root, fingerprint, read_only=True)
    with pytest.raises(zs.OutsideCacheError, match="symbolic link"):
        reader.load(1)["x"][:]
    assert not _verified_clean(reader)


def test_a_symlinked_step_directory_is_not_listed_nor_deleted(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    cache = zs.open_cache(root, fingerprint)
    cache.write(1, {"x": torch.arange(8)})
    step_dir = root / cache.experiment / "1"
    shutil.move(step_dir, tmp_path / "step")
    step_dir.symlink_to(tmp_path / "step", target_is_directory=True)
    with pytest.raises(zs.OutsideCacheError):
        cache.status()
    with pytest.raises(zs.OutsideCacheError):
        cache.delete(1)
    assert (tmp_path / "step").is_dir() and any((tmp_path / "step").rglob("w-*.zip"))


def test_writes_never_go_through_a_link_out_of_the_root(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    cache = zs.open_cache(root, fingerprint)
    cache.write(1, {"x": torch.arange(8)})
    exp_dir = root / cache.experiment
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (exp_dir / "2").symlink_to(outside, target_is_directory=True)
    with pytest.raises(zs.OutsideCacheError):
        cache.write(2, {"x": torch.arange(8)})
    assert list(outside.iterdir()) == []


def test_a_cache_root_that_is_itself_a_link_works(tmp_path: Path, fingerprint: dict) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    cache = zs.open_cache(tmp_path / "link", fingerprint)
    cache.write(1, {"x": torch.arange(8)})
    view = zs.open_cache(tmp_path / "link", fingerprint, read_only=True).load(1)
    assert torch.equal(view["x"][:], torch.arange(8))
    assert zs.open_cache(real, fingerprint, read_only=True).verify().ok


def test_a_foreign_file_no_key_can_name_blocks_nothing(tmp_path: Path, fingerprint: dict) -> None:
    """A file someone dropped into a step, a run or a mini-batch whose name holds a backslash
    (no key can name it) is not the cache's: reads, status, verify, gc and the step's next
    write go on (each refused the whole step with OutsideCacheError), and it stays."""
    cache = zs.open_cache(tmp_path, fingerprint)
    first = cache.write(1, make_batch(4), expected=2)
    part = tmp_path / first.path
    dropped = [part.parent.parent / "notes\\x.txt", part.parent / "a\\b", part / "w\\y.zip"]
    for f in dropped:
        f.write_text("not the cache's")
    other = zs.open_cache(tmp_path, fingerprint)
    assert other.status()[0].state == "writing"
    assert other.gc(dry_run=True).removed == ()
    second = cache.write(1, make_batch(4, seed=1), expected=2)
    assert second.step_complete
    reader = zs.open_cache(tmp_path)
    assert len(reader.load(1).to_dict()["uid"]) == 8
    assert reader.verify().ok
    assert [r.path for r in reader.gc(dry_run=True).removed] == []
    assert all(f.exists() for f in dropped)
