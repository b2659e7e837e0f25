"""Damaged caches give typed errors naming what and where, never wrong data.

Damage is done to keys (missing, truncated, emptied, garbage, edited), the same on every backend
(``location``: memory, a directory, S3). The bit flips stay on a local directory: they are what
a disk does to files; an object store keeps or loses whole objects, which the other tests cover.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import Keys, make_batch, write_sharded

import zarr_skip as zs


def _write(location: Any, fingerprint: dict) -> tuple[Keys, zs.Cache, Any]:
    cache = zs.open_cache(location, fingerprint)
    cache.write(5, make_batch(6, seed=1), expected=2)
    info = cache.write(5, make_batch(6, seed=2), expected=2)
    cache.write(6, make_batch(3, seed=3))
    return Keys(location), cache, info


@pytest.fixture
def written(location: Any, fingerprint: dict) -> tuple[Keys, zs.Cache, Any]:
    return _write(location, fingerprint)


@pytest.fixture
def on_disk(tmp_path: Path, fingerprint: dict) -> tuple[Keys, zs.Cache, Any]:
    """The same cache in a local directory, whose files get bit flips."""
    return _write(tmp_path, fingerprint)


def test_flipped_byte_raises_checksum_error_naming_everything(on_disk: Any) -> None:
    keys, cache, info = on_disk
    key = keys.chunks(info.path, "input_ids")[0]
    path = keys.path(key)
    data = bytearray(keys.read(key))
    data[len(data) // 2] ^= 0x01
    keys.write(key, bytes(data))
    view = cache.load(5)
    with pytest.raises(zs.ChecksumError) as exc:
        view["input_ids"][:]
    msg = str(exc.value)
    assert "step 5" in msg and "mini-batch 1" in msg and "'input_ids'" in msg and path in msg
    assert view["uid"][:]  # other columns still read
    report = cache.verify()
    assert not report.ok and report.steps == (5, 6)
    (problem,) = report.problems
    assert (problem.step, problem.minibatch, problem.column, problem.path) == (5, 1, "input_ids", path)
    assert problem.kind == "ChecksumError"


def test_every_single_bit_flip_in_a_chunk_is_caught(on_disk: Any) -> None:
    keys, cache, info = on_disk
    key = keys.chunks(info.path, "responses/values")[0]
    good = keys.read(key)
    for pos in range(0, len(good), max(1, len(good) // 40)):
        bad = bytearray(good)
        bad[pos] ^= 0x80
        keys.write(key, bytes(bad))
        with pytest.raises(zs.CorruptCacheError):
            cache.load(5)["responses"][:]
    keys.write(key, good)
    cache.load(5)["responses"][:]


@pytest.mark.parametrize("damage", ["truncate", "delete", "empty"])
def test_missing_or_truncated_chunk(written: Any, damage: str) -> None:
    keys, cache, info = written
    key = keys.chunks(info.path, "old_log_probs")[0]
    if damage == "truncate":
        keys.write(key, keys.read(key)[:-7])
    elif damage == "delete":
        keys.delete(key)
    else:
        keys.write(key, b"")
    with pytest.raises(zs.MissingDataError, match=r"step 5, mini-batch 1, column 'old_log_probs'") as exc:
        cache.load(5)["old_log_probs"][:]
    assert isinstance(exc.value, FileNotFoundError)
    assert [p.kind for p in cache.verify(5).problems] == ["MissingDataError"]


def test_deleted_minibatch_metadata(written: Any) -> None:
    keys, cache, info = written
    keys.delete(f"{info.path}/zarr.json")
    with pytest.raises(zs.MissingDataError, match=r"step 5 was recorded complete"):
        cache.load(5)
    assert cache.load(6)["uid"][:]  # the rest still loads


def test_garbage_minibatch_metadata(written: Any) -> None:
    keys, cache, info = written
    keys.write(f"{info.path}/zarr.json", b"\x00garbage{")
    with pytest.raises(zs.MissingDataError):
        cache.load(5)
    problems = cache.verify(5).problems
    assert problems and problems[0].kind == "metadata"


def test_altered_minibatch_metadata_fails_its_checksum(written: Any) -> None:
    keys, cache, info = written
    meta = f"{info.path}/zarr.json"
    doc = json.loads(keys.read(meta))
    doc["attributes"]["zarr_skip.part"]["columns"]["input_ids"]["arrays"]["data"]["shape"][0] = 5
    keys.write(meta, json.dumps(doc).encode())
    with pytest.raises(zs.MetadataError, match="checksum mismatch"):
        cache.load(5)


def test_garbage_step_and_root_metadata(written: Any) -> None:
    keys, cache, info = written
    keys.write("exp_proj/GBS4_N2_in8_out16/5/zarr.json", b"not json")
    assert len(cache.load(5)) == 12  # the summary is only a cache: the mini-batches decide
    assert [i.complete for i in cache.status()] == [True, True]
    keys.write("zarr.json", b"{{{")
    with pytest.raises(zs.MetadataError, match=r"zarr.json: not valid JSON"):
        zs.open_cache(cache.storage.store)


@pytest.fixture
def sharded(tmp_path: Path, fingerprint: dict) -> tuple[Any, Path, Any]:
    cache, _, array = write_sharded(tmp_path, fingerprint)
    return cache, tmp_path / array.key(0), array


def test_a_flipped_bit_in_a_shard_names_its_chunk(sharded: Any) -> None:
    cache, path, array = sharded
    good = path.read_bytes()
    third = sum(array.sizes[:3])
    bad = bytearray(good)
    bad[third + 1] ^= 0x04  # inside chunk 3
    path.write_bytes(bytes(bad))
    with pytest.raises(zs.ChecksumError, match=rf"column 'responses', chunk 3 of shard {path}"):
        cache.load(3)["responses"][:]
    assert [(p.kind, p.path) for p in cache.verify(3).problems] == [("ChecksumError", str(path))]


def test_a_damaged_shard_index_is_found_by_verify(sharded: Any) -> None:
    cache, path, array = sharded
    good = path.read_bytes()
    bad = bytearray(good)
    bad[sum(array.sizes) + 3] ^= 0x01  # the index zarr reads; zarr_skip reads by its manifest
    path.write_bytes(bytes(bad))
    assert cache.load(3)["responses"][:] is not None
    (problem,) = cache.verify(3).problems
    assert problem.kind == "ChecksumError" and "index" in problem.error
