"""Random access through the map-style RolloutDataset: whole batches read together.

``RolloutDataset.__getitems__`` (which a DataLoader with a batch size calls) gives the items of
``ds[i]`` for each index, read in two rounds of requests for the whole batch, each chunk fetched
and decoded once; small decoded chunks are kept in a per-process memo (``store.memo``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import split, worker_state
from torch.utils.data import DataLoader

import zarr_skip as zs
from zarr_skip.data import RolloutDataset, collate_rollouts
from zarr_skip.errors import ConfigError, ConfigTypeError, RowIndexError
from zarr_skip.lazy import read_rows
from zarr_skip.store import reads
from zarr_skip.store.memo import ChunkMemo
from zarr_skip.synthetic import Preset, as_mapping, jagged_payload

FP = {"experiment_name": "map", "n": 4}
#: each step's mini-batch sizes (rows); 32 rows a step
MINIBATCHES = {1: (16, 16), 2: (32,), 3: (8, 12, 12)}
ROWS = 32


def _parts(step: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    return split(as_mapping(jagged_payload(Preset(rows=ROWS, max_prompt=64, max_response=128, n=4), step=step)), sizes)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three steps of the realistic jagged payload in small chunks (a row's values span chunks)."""
    path = tmp_path_factory.mktemp("map") / "cache"
    cache = zs.open_cache(path, FP, chunk_bytes=512)
    for step, sizes in MINIBATCHES.items():
        for part in _parts(step, sizes):
            cache.write(step, part, expected=len(sizes))
    return path


def same(got: Any, want: Any) -> bool:
    """An item's value equals what ``load()`` gives for that row, as an item holds it."""
    if isinstance(want, np.generic):
        return isinstance(got, torch.Tensor) and got.dim() == 0 and got.item() == want.item()
    if isinstance(want, torch.Tensor):
        return type(got) is torch.Tensor and got.dtype == want.dtype and torch.equal(got, want)
    return type(got) is type(want) and got == want


def same_items(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return list(a) == list(b) and all(same(a[k], b[k]) if k in a else False for k in b)


def test_the_payload_has_every_column_kind(local: Path) -> None:
    view = zs.open_cache(local).load(3)
    kinds = {view[n].spec.kind for n in view.columns}
    assert {"nested", "tensor", "str", "json"} <= kinds
    coded = {n for n in view.columns if view[n]._dict is not None}
    assert coded and {"responses", "tags", "keys"}.isdisjoint(coded)  # dictionary and plain jagged


def test_a_batch_equals_its_items_and_load(local: Path) -> None:
    ds = RolloutDataset(local)
    n = len(ds)
    assert n == ROWS * len(MINIBATCHES)
    rng = np.random.default_rng(0)
    picks = [
        rng.integers(-n, n, 40).tolist(),  # random, negative, across steps and mini-batches
        [5, 5, 70, 5, -1, 0, 95, 40, 40],  # repeated, unsorted
        list(range(n))[::-1],  # every row, backwards
        [17],
        [],
    ]
    cache = zs.open_cache(local)
    for indices in picks:
        batch = ds.__getitems__(indices)
        assert len(batch) == len(indices)
        for i, item in zip(indices, batch, strict=True):
            assert same_items(item, ds[i])
            view = cache.load(item["step"])
            assert item["step"] == i % n // ROWS + 1 and item["row"] == i % n % ROWS
            starts = np.cumsum([0] + [len(m) for m in view.minibatches])
            assert starts[item["minibatch"]] <= item["row"] < starts[item["minibatch"] + 1]
            for name in view.columns:
                assert same(item[name], view[name][item["row"]]), (i, name)
    twice = ds.__getitems__([3, 3])
    assert twice[0] is not twice[1] and twice[0]["responses"].data_ptr() != twice[1]["responses"].data_ptr()


def test_dataloader_shuffled_through_workers_gives_every_row_once(local: Path) -> None:
    ds = RolloutDataset(local, columns=["responses", "prompt_len", "uid", "raw_prompt", "tags"])
    loader = DataLoader(
        ds,
        batch_size=7,
        shuffle=True,
        generator=torch.Generator().manual_seed(3),
        num_workers=2,
        collate_fn=collate_rollouts,
    )
    got = list(loader)
    rows = [(int(s), int(r)) for b in got for s, r in zip(b["step"], b["row"], strict=True)]
    assert sorted(rows) == [(s, r) for s in MINIBATCHES for r in range(ROWS)] and rows != sorted(rows)
    for batch in got:  # each batch equals its rows read one by one (which equal load())
        idx = [(int(s) - 1) * ROWS + int(r) for s, r in zip(batch["step"], batch["row"], strict=True)]
        want = collate_rollouts([ds[i] for i in idx])
        assert set(batch) == set(want)
        for name in want:
            if isinstance(want[name], torch.Tensor):
                assert torch.equal(batch[name], want[name]), name
            else:
                assert batch[name] == want[name], name


def _count_fetches(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], Counter[tuple[str, int]]]:
    """The chunks of each call of ``fetch_chunks`` (a round of requests), and how often each
    (array, chunk) was fetched."""
    calls: list[int] = []
    fetched: Counter[tuple[str, int]] = Counter()
    original = reads.fetch_chunks

    def counted(storage: Any, items: Any, *rest: Any) -> Any:
        calls.append(len(items))
        fetched.update((item[0].path, item[1]) for item in items)
        return original(storage, items, *rest)

    monkeypatch.setattr(reads, "fetch_chunks", counted)
    return calls, fetched


def test_a_batch_reads_in_two_rounds_each_chunk_once(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, fetched = _count_fetches(monkeypatch)
    indices = np.random.default_rng(1).integers(0, 3 * ROWS, 64).tolist()
    ds = RolloutDataset(local)
    for step in MINIBATCHES:
        ds.source.view(step)  # the views (their records) loaded
    ds.source.memo = ChunkMemo(0)  # nothing kept: every chunk fetched
    calls.clear()
    ds.__getitems__(indices)
    assert len(calls) == 2  # the lengths, codes and dense rows; then the values
    assert set(fetched.values()) == {1}  # each chunk once a batch
    batch_chunks = sum(calls)
    calls.clear()
    fetched.clear()
    for i in indices:
        ds[i]
    assert len(calls) == 2 * len(indices)  # one item: every column in two rounds, not two per column
    assert sum(calls) > 3 * batch_chunks and max(fetched.values()) > 1  # item by item: chunks again


def test_the_memo_keeps_small_chunks_and_hands_out_copies(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, _ = _count_fetches(monkeypatch)
    ds = RolloutDataset(local)
    indices = [40, 3, 90, 41, 3]
    first = ds.__getitems__(indices)
    assert len(ds.source.memo) > 0 and ds.source.memo.nbytes <= ds.source.memo.max_bytes
    for item in first:  # a caller changing its items changes nothing kept
        item["prompt_len"] += 1000
        item["responses"].fill_(-1)
    calls.clear()
    again = ds.__getitems__(indices)
    assert sum(calls) == 0  # every chunk of this small cache is small: all from the memo
    cache = zs.open_cache(local)
    for item in again:
        view = cache.load(item["step"])
        for name in view.columns:
            assert same(item[name], view[name][item["row"]]), name
    held = next(iter(ds.source.memo._held.values()))
    assert not held.flags.writeable


def test_chunk_memo_is_bounded_least_recently_used_first() -> None:
    memo = ChunkMemo(max_bytes=3000, max_chunk_bytes=1000)
    for k in range(3):
        memo.put(k, np.zeros(1000, np.uint8))
    assert memo.get(0) is not None  # 0 used last: 1 is dropped next
    memo.put(3, np.zeros(1000, np.uint8))
    assert memo.get(1) is None and memo.get(0) is not None and len(memo) == 3 and memo.nbytes == 3000
    memo.put(4, np.zeros(1001, np.uint8))  # too large to keep
    assert memo.get(4) is None and (memo.hits, memo.misses) == (2, 2)
    with pytest.raises(ConfigError):
        ChunkMemo(-1)


def test_read_rows_of_several_steps_equal_column_reads(local: Path) -> None:
    cache = zs.open_cache(local)
    views = [cache.load(s) for s in MINIBATCHES]
    mask = np.zeros(ROWS, bool)
    mask[[1, 30]] = True
    requests = [(views[0], [9, 2, 2, 31]), (views[1], slice(3, 20, 4)), (views[2], mask), (views[0], 7)]
    names = views[0].columns
    got = read_rows(requests, names)
    for (view, rows), read in zip(requests, got, strict=True):
        for name in names:
            want = view[name][rows] if not isinstance(rows, int) else view[name][[rows]]
            value = read[name]
            if isinstance(want, torch.Tensor) and want.is_nested:
                assert [r.tolist() for r in value.unbind()] == [r.tolist() for r in want.unbind()], name
            elif isinstance(want, torch.Tensor):
                assert torch.equal(value, want), name
            else:
                assert list(value) == list(want), name


def test_bad_indices_are_typed_errors_naming_the_index(local: Path) -> None:
    ds = RolloutDataset(local, columns=["uid"])
    for bad in ("3", 1.5, None, True):
        with pytest.raises(ConfigTypeError, match="index with an int"):
            ds[bad]  # type: ignore[index]
        with pytest.raises(ConfigTypeError, match="index with an int"):
            ds.__getitems__([0, bad])  # type: ignore[list-item]
    for bad in (96, -97, 10**30):
        with pytest.raises(RowIndexError, match=rf"index {bad} out of range for 96 rows at .*cache"):
            ds[bad]
        with pytest.raises(IndexError, match=rf"index {bad} out of range"):
            ds.__getitems__([1, bad])
    assert ds[np.int64(-96)]["row"] == 0 and ds.__getitems__([np.int32(95)])[0]["row"] == ROWS - 1


def test_a_worker_freezes_what_it_inherited_and_keeps_freed_memory_the_main_process_neither(local: Path) -> None:
    import gc

    before = gc.get_freeze_count()
    ds = RolloutDataset(local, columns=["responses", "uid"])
    here = list(DataLoader(ds, batch_size=8, collate_fn=worker_state))
    assert sum(b["rows"] for b in here) == len(ds)
    # no worker: the caller's process is left alone (its allocator gives freed memory back)
    assert gc.get_freeze_count() == before and all(b["refaults"] > 5000 for b in here)
    for batch_size in (8, None):  # __getitems__, then __getitem__
        batches = list(DataLoader(ds, batch_size=batch_size, num_workers=1, collate_fn=worker_state))
        assert sum(b["rows"] if batch_size else 1 for b in batches) == len(ds)
        # what the worker inherited, frozen; what it frees, kept for reuse
        assert all(b["frozen"] > before + 1000 and b["refaults"] < 500 for b in batches)
    assert gc.get_freeze_count() == before
