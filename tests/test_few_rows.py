"""A read of a few rows of a jagged column costs about those rows: each data file opened once
per round of reads, small reads made in the calling thread (no task handed to the pool per
piece) (``zarr_skip/store/fetching.py``, ``zarr_skip/store/_localfs.py``). Counts, never
timings."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FINGERPRINT
from zarr.storage import MemoryStore

import zarr_skip as zs
from zarr_skip.errors import MissingDataError
from zarr_skip.format import blosc_frames, chunks
from zarr_skip.store import _localfs, blockreads, fetching, reads
from zarr_skip.store.storage import Storage

BLOCK = 1024
CHUNK_BYTES = 8 << 10


def _batch(rows: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(100, 400, rows)
    offsets = torch.zeros(rows + 1, dtype=torch.int64)
    offsets[1:] = torch.from_numpy(lengths).cumsum(0)
    values = torch.from_numpy(rng.integers(0, 151936, int(offsets[-1])))
    return {"responses": torch.nested.nested_tensor_from_jagged(values, offsets=offsets)}


def _step(location: Any, parts: int = 4, rows: int = 256) -> tuple[zs.StepView, list[torch.Tensor]]:
    cache = zs.open_cache(
        location, FINGERPRINT, chunk_bytes=CHUNK_BYTES, compression=zs.Compression("auto", blocksize=BLOCK)
    )
    batches = [_batch(rows, i) for i in range(parts)]
    for b in batches:
        cache.write(1, b, expected=parts)
    return zs.open_cache(location).load(1), [r for b in batches for r in b["responses"].unbind()]


def _same(got: Any, want: list[torch.Tensor]) -> None:
    rows = got.unbind()
    assert len(rows) == len(want) and all(torch.equal(a, b) for a, b in zip(rows, want, strict=True))


def test_a_few_rows_open_each_data_file_once_per_round_in_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    view, want = _step(tmp_path / "cache")
    col = view["responses"]
    files = {p.arrays["responses"]["values"].file for p in view._parts}
    assert len(files) == 4
    opened: Counter[str] = Counter()
    threads: set[int] = set()
    open_, spans_ = _localfs.Tree._open, _localfs.Tree.read_spans

    def counting_open(self: _localfs.Tree, key: str, flags: int) -> int | None:
        if key.endswith(".zip"):
            opened[key] += 1
        return open_(self, key, flags)

    def counting_spans(self: _localfs.Tree, requests: Any) -> Any:
        threads.add(threading.get_ident())
        return spans_(self, requests)

    monkeypatch.setattr(_localfs.Tree, "_open", counting_open)
    monkeypatch.setattr(_localfs.Tree, "read_spans", counting_spans)
    idx = np.sort(np.random.default_rng(0).choice(len(want), 64, replace=False))
    _same(col[idx], [want[i] for i in idx])
    # one round (the rows' blocks, their records saying where the rows lie): each data file
    # opened once, where a file was opened for every piece of every chunk read (dozens), and
    # the rows' lengths were read in a round before
    assert sum(opened.values()) == 4 and set(opened.values()) == {1}
    assert threads == {threading.get_ident()}  # a few small reads: no task handed to the pool


def test_a_large_fetch_is_still_shared_among_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view, want = _step(tmp_path / "cache")
    monkeypatch.setattr(fetching, "SERIAL_FETCH_BYTES", 0)
    threads: set[int] = set()
    spans_ = _localfs.Tree.read_spans

    def counting_spans(self: _localfs.Tree, requests: Any) -> Any:
        threads.add(threading.get_ident())
        return spans_(self, requests)

    monkeypatch.setattr(_localfs.Tree, "read_spans", counting_spans)
    _same(view["responses"][:], want)
    assert threads and threading.get_ident() not in threads


def test_get_spans_gives_each_span_or_none_for_an_absent_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(bytes(range(100)))
    storage = Storage(zs.open_cache(tmp_path, FINGERPRINT)._storage.store)
    for serial in (True, False):
        got = storage.get_spans([("f", [(0, 3), (98, 5)]), ("absent", [(0, 1)])], serial=serial)
        assert got == [[bytes([0, 1, 2]), bytes([98, 99])], None]
    memory = Storage(MemoryStore())
    assert memory.get_spans([("absent", [(0, 1)])]) == [None]


def test_a_cut_data_file_read_in_one_range_is_a_missing_data_error(tmp_path: Path) -> None:
    view, want = _step(tmp_path / "cache", parts=1)
    col = view["responses"]
    col.lengths()
    a = view._parts[0].arrays["responses"]["values"]
    path = tmp_path / "cache" / str(view._parts[0].path) / Path(str(a.file)).name
    data = path.read_bytes()
    path.write_bytes(data[: a.offset + a.sizes[0] + a.sizes[1] // 2])  # cut inside chunk 1
    with pytest.raises(MissingDataError):
        col[np.array([len(want) - 1, 0])]


def test_a_gathered_frame_decodes_to_its_blocks_in_one_call() -> None:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 151936, 4 * 1024 + 100).astype("<u4")  # 4 blocks of 4 KiB and a short one
    codec = chunks.Compression("blosc-zstd", 1, "shuffle", 4096).codec()
    assert codec is not None
    frame = bytes(codec.encode(raw))
    starts = blosc_frames.block_starts(frame)
    head = blosc_frames.parse_header(frame)
    assert starts is not None and head is not None and head.blocks == 5
    ends = (*starts[1:], len(frame))
    body = raw.view(np.uint8)
    for pick in ([1], [0, 3], [1, 2, 4], [4]):
        gathered = blosc_frames.gathered_frame(head, pick, [frame[starts[k] : ends[k]] for k in pick])
        want = b"".join(bytes(body[k * 4096 : (k + 1) * 4096]) for k in pick)
        assert bytes(codec.decode(gathered)) == want
        assert head.gathered_bytes(pick) == len(want) == sum(head.block_bytes(k) for k in pick)
        assert head.block_sizes(pick) == [head.block_bytes(k) for k in pick]
    with pytest.raises(ValueError, match="blocks"):  # the short block is not the frame's last
        blosc_frames.gathered_frame(head, [4, 0], [frame[starts[4] :], frame[starts[0] : ends[0]]])
    for bad in ([5], [-1, 0], [1, 1], []):  # outside the frame, repeated, none
        with pytest.raises(ValueError, match="blocks"):
            blosc_frames.gathered_frame(head, bad, [frame[starts[0] : ends[0]]] * len(bad))


def test_the_blocks_of_a_chunk_are_decoded_in_one_codec_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view, want = _step(tmp_path / "cache")
    col = view["responses"]
    col.lengths()
    calls: list[int] = []
    plans: list[int] = []
    real_codec, real_decode = chunks.Compression.codec, blockreads.decode

    class Counting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def decode(self, buf: Any, out: Any = None) -> Any:
            calls.append(1)
            return self.inner.decode(buf, out=out)

    def counting_plan(p: blockreads.BlockPlan, blobs: Any, where: str) -> np.ndarray:
        plans.append(len(p.blocks))
        return real_decode(p, blobs, where)

    monkeypatch.setattr(chunks.Compression, "codec", lambda self: Counting(real_codec(self)))
    monkeypatch.setattr(blockreads, "decode", counting_plan)
    idx = np.sort(np.random.default_rng(1).choice(len(want), 64, replace=False))
    _same(col[idx], [want[i] for i in idx])
    assert plans and sum(plans) > len(plans)  # some chunks gave several blocks
    assert len(calls) == len(plans)  # one call per chunk, where there was one per block


def test_a_few_rows_are_decoded_by_this_thread_and_the_pool_pulling_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No task per chunk, and no static share per thread that leaves this one waiting: this
    thread and the pool's threads take the next chunk when free (``share_out``)."""
    view, want = _step(tmp_path / "cache")
    col = view["responses"]
    col.lengths()
    monkeypatch.setattr(reads, "PARALLEL_DECODE_BYTES", 0)  # the pool, however little to decode
    handed: list[int] = []
    parallel = _localfs.parallel
    monkeypatch.setattr(_localfs, "parallel", lambda fn, items: handed.append(len(items)) or parallel(fn, items))
    shared: list[int] = []
    share_out = _localfs.share_out
    monkeypatch.setattr(
        _localfs,
        "share_out",
        lambda fn, items, mine=(): shared.append(len(items) + len(mine)) or share_out(fn, items, mine),
    )
    idx = np.sort(np.random.default_rng(2).choice(len(want), 64, replace=False))
    _same(col[idx], [want[i] for i in idx])
    assert not handed and len(shared) == 1 and shared[0] > _localfs.workers()  # every chunk, pulled
    shared.clear()
    monkeypatch.setattr(reads, "SERIAL_DECODE_BYTES", 0)
    assert len(col[:].unbind()) == len(want)  # the whole column: chunk by chunk, pulled by the threads
    assert not handed and shared and max(shared) > _localfs.workers()
