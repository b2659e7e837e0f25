"""A write's chunks are compressed while the writer takes its place, and no work outlives it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_equal, make_batch

import zarr_skip as zs
from zarr_skip.errors import StepCompleteError
from zarr_skip.store import chunkjobs, writer


def test_compression_starts_before_the_index_is_claimed(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoding = threading.Event()
    encode, claim = chunkjobs.encode_chunk, writer._claim

    def traced_encode(*args: Any) -> bytes:
        encoding.set()
        return encode(*args)

    def waiting_claim(*args: Any, **kwargs: Any) -> Any:
        # the pool is already compressing this batch while the index is being claimed
        assert encoding.wait(10), "no chunk was encoded before the claim"
        return claim(*args, **kwargs)

    monkeypatch.setattr(chunkjobs, "encode_chunk", traced_encode)
    monkeypatch.setattr(writer, "_claim", waiting_claim)
    batch = make_batch(64)
    zs.open_cache(str(tmp_path), fingerprint).write(1, batch)
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(1).to_dict(), batch)


def test_a_writer_that_loses_its_claim_encodes_again_and_stores_exactly(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds = writer._holds
    lost: list[str] = []

    def first_claim_lost(storage: Any, key: str, claim: dict[str, Any]) -> bool:
        if not lost:  # as when two writers both won the exclusive create of index 0
            lost.append(key)
            return False
        return holds(storage, key, claim)

    encoded: list[int] = []
    encode = chunkjobs.encode_chunk
    monkeypatch.setattr(chunkjobs, "encode_chunk", lambda *a: encoded.append(1) or encode(*a))
    monkeypatch.setattr(writer, "_holds", first_claim_lost)
    batch = make_batch(6)
    cache = zs.open_cache(str(tmp_path), fingerprint)
    info = cache.write(1, batch, expected=2)
    assert lost and info.index == 1
    chunks_per_write = len(encoded) // 2
    assert chunks_per_write > 0 and len(encoded) == 2 * chunks_per_write  # every chunk twice
    # the "other writer" of index 0 gives up; another mini-batch completes the step
    cache._storage.delete(lost[0])
    other = make_batch(3, seed=1)
    assert cache.write(1, other, expected=2).index == 0
    view = zs.open_cache(str(tmp_path), fingerprint).load(1)
    assert_equal(view.minibatches[0].to_dict(), other)
    assert_equal(view.minibatches[1].to_dict(), batch)


def test_a_refused_write_leaves_no_compression_behind(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = zs.open_cache(str(tmp_path), fingerprint)
    cache.write(1, make_batch(6))
    made: list[chunkjobs.ChunkJobs] = []
    init = chunkjobs.ChunkJobs.__init__

    def traced_init(self: chunkjobs.ChunkJobs, *args: Any) -> None:
        init(self, *args)
        made.append(self)

    monkeypatch.setattr(chunkjobs.ChunkJobs, "__init__", traced_init)
    with pytest.raises(StepCompleteError):
        cache.write(1, make_batch(4096, seed=1))
    assert len(made) == 1 and not made[0]._arrays  # every job it started was dropped
    assert_equal(cache.load(1).to_dict(), make_batch(6))
