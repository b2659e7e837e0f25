"""Large arrays are compressed several chunks per blosc call, while the batch is still encoded.

The frames cut out of one call are those of one call per chunk, byte for byte
(``format/blosc_frames.py``); the compression of a batch's token ids runs while its per-row
objects are encoded; a write whose encoding fails leaves no work running.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from helpers import assert_equal
from numcodecs import blosc

import zarr_skip as zs
from zarr_skip.errors import UnsupportedColumnError
from zarr_skip.format import chunks, columns, jsonvalues
from zarr_skip.format.blosc_frames import split_frame
from zarr_skip.store import _localfs, chunkjobs

RNG = np.random.default_rng(7)
ARRAYS = {
    "token ids (narrowed)": RNG.integers(0, 151_000, 300_000),
    "log-probs": -RNG.exponential(2.0, 300_000).astype(np.float32),
    "incompressible": RNG.integers(0, 2**63, 100_000, dtype=np.int64),
    "zeros": np.zeros(200_000, np.float64),
    "rows of three": RNG.integers(0, 60_000, (70_000, 3)).astype(np.uint16),
}
CODECS = [
    chunks.Compression("blosc-zstd", 1, "shuffle", 1 << 20),
    chunks.Compression("blosc-zstd", 5, "bitshuffle", 1 << 20),
    chunks.Compression("lz4", 1, "noshuffle", 1 << 20),
]


@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.name}-{c.level}-{c.shuffle}")
def test_chunks_of_one_call_are_the_chunks_of_one_call_each(name: str, codec: chunks.Compression) -> None:
    arr = columns.narrow(ARRAYS[name])
    per, rows, _ = chunkjobs.chunking(arr, codec, 64 << 10)
    full = arr.shape[0] // per
    assert full >= 2
    together = chunkjobs.encode_chunks(arr, 1, full - 1, per, codec)
    alone = [chunkjobs.encode_chunk(arr, r, codec) for r in rows[1:full]]
    assert together == alone
    decoder = codec.codec()
    assert decoder is not None
    for blob, r in zip(together, rows[1:full], strict=True):
        decoded = np.frombuffer(bytes(decoder.decode(blob[:-4])), arr.dtype)
        assert np.array_equal(decoded.reshape(-1, *arr.shape[1:]), arr[r])
        assert chunks.crc32c(blob[:-4]) == chunks.trailer(blob)


def test_a_frame_that_is_not_equal_blocks_is_not_cut() -> None:
    data = np.arange(4096, dtype=np.uint32)
    frame = blosc.compress(data, b"zstd", 1, 1, 4096)
    assert split_frame(frame, 4, 4096) is not None
    assert split_frame(frame, 2, 4096) is None  # another block count
    assert split_frame(frame, 4, 8192) is None  # another block size
    assert split_frame(frame[:-1], 4, 4096) is None  # truncated
    assert split_frame(b"\x03" + frame[1:], 4, 4096) is None  # an unknown version
    assert split_frame(frame[:10], 4, 4096) is None
    whole = blosc.compress(data, b"zstd", 1, 1, 1 << 20)  # one block for all
    assert split_frame(whole, 4, 4096) is None


def _jagged(values: np.ndarray, rows: int) -> torch.Tensor:
    offsets = torch.from_numpy(np.linspace(0, len(values), rows + 1).astype(np.int64))
    return torch.nested.nested_tensor_from_jagged(torch.from_numpy(values), offsets)


def _batch(rows: int = 64, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "tags": [{"step": i, "status": "finished"} for i in range(rows)],  # objects first
        "responses": _jagged(rng.integers(0, 151_000, 400_000), rows),
        "old_log_probs": _jagged(-rng.exponential(2.0, 400_000).astype(np.float32), rows),
        "uid": [f"u{i // 4}" for i in range(rows)],
    }


def test_a_batch_with_large_arrays_is_stored_exactly_and_plain_zarr_reads_it(tmp_path: Path, fingerprint: dict) -> None:
    batch = _batch()
    cache = zs.open_cache(str(tmp_path), fingerprint, chunk_bytes=64 << 10)
    info = cache.write(1, batch)
    view = zs.open_cache(str(tmp_path), fingerprint).load(1)
    assert list(view.keys()) == list(batch)  # the batch's order, whatever the encoding order
    assert_equal(view.to_dict(), batch)
    (data_file,) = (tmp_path / info.path).glob("*.zip")  # the mini-batch's one data file
    with zarr.storage.ZipStore(data_file, mode="r") as zipped:
        stored = zarr.open_array(zipped, path="responses/values", mode="r")
        assert np.array_equal(stored[:], batch["responses"].values().numpy())


def test_large_arrays_are_compressed_while_the_per_row_objects_are_encoded(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    compressed = threading.Event()
    encode, rows_of = chunkjobs.encode_chunks, jsonvalues.json_rows
    seen: list[bool] = []

    def traced(*args: Any) -> list[bytes]:
        out = encode(*args)
        compressed.set()
        return out

    def waiting_rows(rows: Any) -> Any:
        # the token ids were encoded before these objects: their chunks are compressed meanwhile
        seen.append(compressed.wait(60))
        return rows_of(rows)

    monkeypatch.setattr(chunkjobs, "encode_chunks", traced)
    monkeypatch.setattr(columns, "json_rows", waiting_rows)
    batch = _batch()
    zs.open_cache(str(tmp_path), fingerprint, chunk_bytes=64 << 10).write(1, batch)
    assert seen and all(seen)
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(1).to_dict(), batch)


def test_one_thread_compresses_while_the_batch_is_encoded(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch, chunk_jobs: list
) -> None:
    # Asserts the pool's decisions, not the OS schedule: which threads are put on the large
    # arrays before and after spread(). The early thread's blosc call waits until spread() has
    # run, so that what spread() finds left to share does not depend on how fast that thread was.
    made = chunk_jobs
    spread_done = threading.Event()
    put_on_large: list[bool] = []  # per thread put on the large arrays: after spread()?
    waited: list[bool] = []
    encode_many, submit, spread = chunkjobs.encode_chunks, _localfs.submit, chunkjobs.ChunkJobs.spread

    def held(*args: Any) -> list[bytes]:
        if not made[-1]._spread:
            waited.append(spread_done.wait(30))
        return encode_many(*args)

    def counted_submit(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "_compress_large":
            put_on_large.append(made[-1]._spread)
        return submit(fn, *args)

    def spread_then_release(self: chunkjobs.ChunkJobs) -> None:
        spread(self)
        spread_done.set()

    monkeypatch.setattr(chunkjobs, "encode_chunks", held)
    monkeypatch.setattr(_localfs, "submit", counted_submit)
    monkeypatch.setattr(chunkjobs.ChunkJobs, "spread", spread_then_release)
    batch = _batch()
    cache = zs.open_cache(str(tmp_path), fingerprint, chunk_bytes=64 << 10)
    cache.write(1, batch)
    assert put_on_large.count(False) == 1  # while the batch is encoded: one thread
    assert put_on_large.count(True) == _localfs.workers() - 1  # then every thread of the pool
    assert all(waited)  # the early call was released by spread(), not by the time-out
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(1).to_dict(), batch)


def test_a_batch_refused_while_encoding_leaves_no_compression_running(
    tmp_path: Path, fingerprint: dict, chunk_jobs: list
) -> None:
    cache = zs.open_cache(str(tmp_path), fingerprint, chunk_bytes=64 << 10)
    cache.write(1, _batch(seed=1))
    made = chunk_jobs
    bad = dict(_batch(seed=2), extra=[object()] * 64)  # encoded after the tensors: refused
    with pytest.raises(UnsupportedColumnError, match="extra"):
        cache.write(2, bad)
    jobs = made[-1]
    assert not jobs._arrays and not jobs._large and not jobs._later and not jobs._tails
    deadline = time.monotonic() + 60
    while jobs._threads and time.monotonic() < deadline:  # the call in progress ends
        time.sleep(0.01)
    assert jobs._threads == 0
    assert cache.steps() == [1] and not (tmp_path / cache.experiment / "2").exists()
    assert_equal(cache.load(1).to_dict(), _batch(seed=1))


def test_only_chunks_blosc_frames_one_block_each_are_compressed_together() -> None:
    arr = np.zeros(1 << 20, np.float32)
    auto = chunks.Compression().for_dtype(arr.dtype)
    assert chunkjobs._groupable(arr, 131072, auto)  # 512 KiB chunks, 1 MiB blocks
    assert not chunkjobs._groupable(arr, 1 << 19, auto)  # 2 MiB chunks: two blocks each
    assert not chunkjobs._groupable(arr, 131072, chunks.Compression("blosc-zstd", 1, "shuffle", 0))  # blosc's own
    assert not chunkjobs._groupable(arr, 131072, chunks.Compression("zstd", 1))
    assert not chunkjobs._groupable(arr, 16, auto)  # 64 bytes: blosc copies it
    huge = chunks.Compression("blosc-zstd", 1, "shuffle", 1 << 30)
    assert not chunkjobs._groupable(arr, 1 << 25, huge)  # 128 MiB chunks: calls near blosc's limit
