"""Damaged caches give typed errors naming what and where, never wrong data.

Damage to keys (a data file's chunk region truncated, emptied, the data file or a record gone,
garbage or edited records) runs over the ``location`` fixture (memory, a directory, S3) through
``helpers.Keys``. The bit flips stay on a local directory: they are what a disk does to files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ChunkRegion, Keys, chunk_region, make_batch, write_sharded

import zarr_skip as zs


def _write(where: Any, fingerprint: dict) -> tuple[zs.Cache, Any]:
    cache = zs.open_cache(where, fingerprint)
    cache.write(5, make_batch(6, seed=1), expected=2)
    info = cache.write(5, make_batch(6, seed=2), expected=2)
    cache.write(6, make_batch(3, seed=3))
    return cache, info


@pytest.fixture
def written(tmp_path: Path, fingerprint: dict) -> tuple[Path, zs.Cache, Any]:
    """On a local directory, whose files get bit flips."""
    return (tmp_path, *_write(tmp_path, fingerprint))


@pytest.fixture
def keyed(location: Any, fingerprint: dict) -> tuple[Keys, zs.Cache, Any]:
    """The same cache on every backend, damaged through its keys."""
    cache, info = _write(location, fingerprint)
    return Keys(location), cache, info


def chunk_file(root: Path, info: Any, column: str) -> ChunkRegion:
    """The chunk member of ``column`` (``name`` or ``name/values``) in a mini-batch's data file."""
    return chunk_region(root / info.path, column)


def test_flipped_byte_raises_checksum_error_naming_everything(written: Any) -> None:
    root, cache, info = written
    path = chunk_file(root, info, "input_ids")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    view = cache.load(5)
    with pytest.raises(zs.ChecksumError) as exc:
        view["input_ids"][:]
    msg = str(exc.value)
    assert "step 5" in msg and "mini-batch 1" in msg and "'input_ids'" in msg and str(path) in msg
    assert view["uid"][:]  # other columns still read
    report = cache.verify()
    assert not report.ok and report.steps == (5, 6)
    (problem,) = report.problems
    assert (problem.step, problem.minibatch, problem.column, problem.path) == (5, 1, "input_ids", str(path))
    assert problem.kind == "ChecksumError"


def test_every_single_bit_flip_in_a_chunk_is_caught(written: Any) -> None:
    root, cache, info = written
    path = chunk_file(root, info, "responses/values")
    good = path.read_bytes()
    for pos in range(0, len(good), max(1, len(good) // 40)):
        bad = bytearray(good)
        bad[pos] ^= 0x80
        path.write_bytes(bytes(bad))
        with pytest.raises(zs.CorruptCacheError):
            cache.load(5)["responses"][:]
    path.write_bytes(good)
    cache.load(5)["responses"][:]


@pytest.mark.parametrize("damage", ["truncate", "delete", "empty"])
def test_missing_or_truncated_chunk(keyed: Any, damage: str) -> None:
    keys, cache, info = keyed
    path = keys.region(info.path, "old_log_probs")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-7])
    elif damage == "delete":
        path.unlink()
    else:
        path.write_bytes(b"")
    with pytest.raises(zs.MissingDataError, match=r"step 5, mini-batch 1, column 'old_log_probs'") as exc:
        cache.load(5)["old_log_probs"][:]
    assert isinstance(exc.value, FileNotFoundError)
    problems = cache.verify(5).problems  # the data file cut there, or gone: what follows is lost too
    assert {p.kind for p in problems} == {"MissingDataError"} and {p.minibatch for p in problems} == {1}
    assert {p.path for p in problems} == {str(path)}


def test_deleted_minibatch_metadata(keyed: Any) -> None:
    keys, cache, info = keyed
    keys.delete(f"{info.path}/zarr.json")
    with pytest.raises(zs.MissingDataError, match=r"step 5 was recorded complete"):
        cache.load(5)
    assert cache.load(6)["uid"][:]  # the rest still loads


def test_garbage_minibatch_metadata(keyed: Any) -> None:
    keys, cache, info = keyed
    keys.write(f"{info.path}/zarr.json", b"\x00garbage{")
    with pytest.raises(zs.MissingDataError):
        cache.load(5)
    problems = cache.verify(5).problems
    assert problems and problems[0].kind == "metadata"


def test_altered_minibatch_metadata_fails_its_checksum(keyed: Any) -> None:
    keys, cache, info = keyed
    meta = f"{info.path}/zarr.json"
    doc = json.loads(keys.read(meta))
    doc["attributes"]["zarr_skip.part"]["columns"]["input_ids"]["arrays"]["data"]["shape"][0] = 5
    keys.write(meta, json.dumps(doc).encode())
    with pytest.raises(zs.MetadataError, match="checksum mismatch"):
        cache.load(5)


def test_garbage_step_and_root_metadata(keyed: Any, location: Any) -> None:
    keys, cache, info = keyed
    keys.write("exp_proj/GBS4_N2_in8_out16/5/zarr.json", b"not json")
    assert len(cache.load(5)) == 12  # the summary is only a cache: the mini-batches decide
    assert [i.complete for i in cache.status()] == [True, True]
    keys.write("zarr.json", b"{{{")
    with pytest.raises(zs.MetadataError, match=r"zarr.json: not valid JSON"):
        zs.open_cache(location)


@pytest.fixture
def sharded(tmp_path: Path, fingerprint: dict) -> tuple[Any, Path, Any]:
    cache, _, array = write_sharded(tmp_path, fingerprint)
    return cache, tmp_path / array.key(0), array


def test_a_flipped_bit_in_a_shard_names_its_chunk(sharded: Any) -> None:
    cache, path, array = sharded
    good = path.read_bytes()
    third = array.offset + sum(array.sizes[:3])
    bad = bytearray(good)
    bad[third + 1] ^= 0x04  # inside chunk 3
    path.write_bytes(bytes(bad))
    with pytest.raises(zs.ChecksumError, match=rf"column 'responses', chunk 3 \(bytes \d+\.\.\d+ of {path}\)"):
        cache.load(3)["responses"][:]
    assert [(p.kind, p.path) for p in cache.verify(3).problems] == [("ChecksumError", str(path))]


def test_a_damaged_shard_index_is_found_by_verify(sharded: Any) -> None:
    cache, path, array = sharded
    good = path.read_bytes()
    bad = bytearray(good)
    bad[array.offset + sum(array.sizes) + 3] ^= 0x01  # the index zarr reads; zarr_skip reads by its manifest
    path.write_bytes(bytes(bad))
    assert cache.load(3)["responses"][:] is not None
    (problem,) = cache.verify(3).problems
    assert problem.kind == "ChecksumError" and "index" in problem.error


def test_a_flipped_bit_in_the_zip_directory_is_found_by_verify(written: Any) -> None:
    """A bit flip in the version a data file's central directory says a member needs (the
    chunks untouched): reads go on (zarr_skip reads by the record), verify reports the file
    (zarr's ZipStore could not open it), never an untyped NotImplementedError."""
    root, cache, info = written
    (path,) = (root / info.path).glob("*.zip")
    data = bytearray(path.read_bytes())
    data[data.rfind(b"PK\x01\x02") + 6] ^= 0x40  # version needed to extract: 2.0 becomes 8.4
    path.write_bytes(bytes(data))
    assert len(cache.load(5)["input_ids"][:]) == 12
    problems = cache.verify(5).problems
    assert problems and {(p.minibatch, p.path) for p in problems} == {(1, str(path))}
    assert all("not a readable ZIP data file" in p.error for p in problems)
