"""Columns as arrays (shape, dtype, ndim, len, ``np.asarray``, iteration) and steps as mappings."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FINGERPRINT, CountingStore, assert_equal, concat, make_batch

import zarr_skip as zs
from zarr_skip import lazy


def _batch(rows: int, seed: int, offset: int = 0) -> dict[str, Any]:
    batch = make_batch(rows, seed=seed, offset=offset)
    rng = np.random.default_rng(seed)
    batch["per_row"] = [rng.standard_normal((int(n), 2)).astype(np.float64) for n in rng.integers(0, 5, rows)]
    batch["bf16_scalar"] = torch.randn(rows).bfloat16()
    return batch


@pytest.fixture
def step() -> tuple[zs.StepView, dict[str, Any]]:
    """A step of three mini-batches whose arrays have many small chunks."""
    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT), chunk_bytes=24)
    batches = [_batch(7, seed=i, offset=10 * i) for i in range(3)]
    for b in batches:
        cache.write(2, b, expected=3)
    return cache.load(2), concat(batches)


def test_shape_dtype_ndim_len(step: Any) -> None:
    view, _ = step
    want = {
        "input_ids": ((21, 5), torch.int64),
        "bf16": ((21, 3), torch.bfloat16),
        "bf16_scalar": ((21,), torch.bfloat16),
        "responses": ((21, None), torch.int64),
        "per_row": ((21, None, 2), np.dtype(np.float64)),
        "uid": ((21,), np.dtype(object)),
        "tags": ((21,), np.dtype(object)),
        "scores": ((21,), np.dtype(np.float32)),
    }
    for name, (shape, dtype) in want.items():
        col = view[name]
        assert (col.shape, col.dtype, col.ndim, len(col)) == (shape, dtype, len(shape), 21), name


def test_asarray_matches_indexing(step: Any) -> None:
    view, _ = step
    for name in view:
        col = view[name]
        got, whole = np.asarray(col), col[:]
        assert got.shape[0] == 21 and isinstance(got, np.ndarray), name
        if col.spec.kind == "tensor":
            want = whole.float().numpy() if whole.dtype == torch.bfloat16 else whole.numpy()
            assert got.dtype == want.dtype and np.array_equal(got, want), name
        elif col.spec.kind == "nested":
            assert got.dtype == object and [r.tolist() for r in got] == [r.tolist() for r in whole.unbind()]
            assert all(isinstance(r, np.ndarray) and r.dtype == np.int64 for r in got)
        elif col.spec.kind in ("rows", "ndarray"):
            assert_equal(got, whole if isinstance(whole, np.ndarray) else _objects(whole), name)
        else:
            assert got.dtype == object and list(got) == list(whole), name


def _objects(rows: list[Any]) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        out[i] = r
    return out


def test_asarray_honours_dtype_and_copy(step: Any) -> None:
    view, _ = step
    scores = view["scores"]
    assert np.asarray(scores, dtype=np.float64).dtype == np.float64
    assert np.array_equal(np.asarray(scores, dtype=np.float64), scores[:].astype(np.float64))
    assert np.array(scores, copy=True).dtype == np.float32
    with pytest.raises(ValueError, match="copy=False"):
        np.array(scores, copy=False)
    assert np.asarray(view["uid"], dtype=str).tolist() == list(view["uid"][:])
    assert np.asarray(view["input_ids"], dtype=np.int32).dtype == np.int32
    with pytest.raises(ValueError, match="jagged"):
        np.asarray(view["responses"], dtype=np.int64)
    assert np.asarray(view["responses"], dtype=object).dtype == object


def test_iteration_gives_the_rows_indexing_gives(step: Any, monkeypatch: Any) -> None:
    view, merged = step
    for per_block in (1, 2, 8):
        monkeypatch.setattr(lazy, "ITER_CHUNKS", per_block)
        for name in view:
            col = view[name]
            rows = list(col)
            assert len(rows) == 21, name
            for i, row in enumerate(rows):
                assert_equal(row, col[i], f"{name}[{i}] with {per_block} chunks a block")
    assert [r.tolist() for r in view["responses"]] == [r.tolist() for r in merged["responses"].unbind()]


class RangeCountingStore(CountingStore):
    """Counts each (key, byte range) read: chunks of a shard are ranges of one key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranges: Counter[tuple[str, Any]] = Counter()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.ranges[key, None if byte_range is None else (byte_range.start, byte_range.end)] += 1
        return await super().get(key, prototype, byte_range)

    def with_read_only(self, read_only: bool = False) -> RangeCountingStore:
        other = RangeCountingStore(self._store_dict, read_only=read_only)
        other.reads, other.bytes_read, other.ranges = self.reads, self.bytes_read, self.ranges
        return other


@pytest.mark.parametrize("name", ["responses", "uid", "input_ids", "per_row"])
def test_iteration_reads_each_chunk_once(name: str, monkeypatch: Any) -> None:
    store = RangeCountingStore()
    cache = zs.open_cache(store, dict(FINGERPRINT), chunk_bytes=8)
    for i in range(3):
        cache.write(2, _batch(9, seed=i), expected=3)
    view = cache.load(2)
    arrays = [a for p in view._parts for a in p.arrays[name].values()]
    chunks = sum(len(a.sizes) for a in arrays)
    assert any(len(a.sizes) > 2 for a in arrays), "the test needs arrays of several chunks"
    monkeypatch.setattr(lazy, "ITER_CHUNKS", 2)  # many blocks, rows straddling them
    store.ranges.clear()
    rows = list(view[name])
    assert len(rows) == 27
    data = {k: n for k, n in store.ranges.items() if "/w-" in k[0]}
    assert set(data.values()) == {1}, f"ranges read more than once: {data}"
    by_file: dict[str, list[tuple[int, int]]] = {}
    for key, span in data:
        by_file.setdefault(key, []).append(span)
    for spans in by_file.values():  # no byte twice: adjacent chunks come in one ranged read
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    read = [a for a in arrays if a.value_ends is None]  # lengths whose records keep their ends: not read
    assert sum(e - s for spans in by_file.values() for s, e in spans) == sum(sum(a.sizes) for a in read)
    assert len(data) <= chunks


@pytest.mark.parametrize("name", ["responses", "input_ids"])
def test_iteration_reads_the_next_block_ahead_and_stopping_early_leaves_nothing_reading(
    name: str, monkeypatch: Any
) -> None:
    """While the rows of one block are handed out, the next block is read (by a helper thread);
    a loop that breaks early stops it, and the rows it got are exact."""
    import threading

    from zarr_skip.store import blocks

    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT), chunk_bytes=8)
    for i in range(3):
        cache.write(2, _batch(9, seed=i), expected=3)
    col = cache.load(2)[name]
    monkeypatch.setattr(lazy, "ITER_CHUNKS", 2)
    started: list[tuple[int, int]] = []
    real_submit = blocks.BlocksAhead._submit
    monkeypatch.setattr(
        blocks.BlocksAhead, "_submit", lambda self, i: started.append(self._ranges[i]) or real_submit(self, i)
    )
    rows = iter(col)
    first = next(rows)
    assert len(started) == 2, "the second block is asked for while the first one's rows are handed out"
    assert_equal(first, col[0])
    got = [first] + [next(rows) for _ in range(3)]
    del rows  # the loop stops early
    assert not [t for t in threading.enumerate() if t.name.startswith("zarr-skip-ahead")]
    for i, row in enumerate(got):
        assert_equal(row, col[i])


def test_iterating_rows_without_values() -> None:
    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT))
    empty = torch.nested.nested_tensor_from_jagged(torch.zeros(0, dtype=torch.int64), offsets=torch.zeros(4).long())
    cache.write(1, {"responses": empty, "text": ["", "", ""], "obj": [None, {}, []]})
    view = cache.load(1)
    assert [r.tolist() for r in view["responses"]] == [[], [], []]
    assert list(view["text"]) == ["", "", ""] and list(view["obj"]) == [None, {}, []]
    assert [r.tolist() for r in np.asarray(view["responses"])] == [[], [], []]


def test_a_step_is_a_mapping_of_its_columns(step: Any) -> None:
    view, _ = step
    as_dict = dict(view)
    assert list(as_dict) == view.columns == list(view.keys())
    assert all(isinstance(c, zs.LazyColumn) and c.name == n for n, c in as_dict.items())
    assert [n for n, _ in view.items()] == view.columns
    assert [c.name for c in view.values()] == view.columns
    assert view.get("uid") is view["uid"] and view.get("nope") is None and view.get("nope", 3) == 3
    assert len(view) == 21 and len(view.keys()) == len(view.columns)
