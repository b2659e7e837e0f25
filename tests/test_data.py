"""zarr_skip.data: the map-style and iterable torch datasets, their sharding and the collate."""

from __future__ import annotations

import os
import pickle
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from helpers import chunk_region, make_batch, split, worker_state
from torch.utils.data import DataLoader

import zarr_skip as zs
from zarr_skip.data import RolloutBatch, RolloutDataset, RolloutIterableDataset, collate_rollouts
from zarr_skip.data._plan import resolve_rank, row_span, shard_blocks
from zarr_skip.data._source import Block
from zarr_skip.errors import ConfigError
from zarr_skip.store import reads
from zarr_skip.synthetic import text_rollouts

FP = {"experiment_name": "data", "n": 4}
#: each step's mini-batch sizes (rows)
MINIBATCHES = {1: (5, 7), 2: (12,), 3: (3, 4, 5)}
COLUMNS = ["responses", "old_log_probs", "hidden", "score", "uid", "extra_info", "response_length"]


def fill(location: Any) -> dict[int, dict[str, Any]]:
    """Write :data:`MINIBATCHES` steps of readable rollouts (with a dense ``hidden`` column)."""
    cache = zs.open_cache(location, FP, chunk_bytes=256)  # small chunks: a block spans several
    written = {}
    for step, sizes in MINIBATCHES.items():
        batch = dict(text_rollouts(3, 4, seed=7, step=step, max_response=40))
        batch["hidden"] = torch.arange(12 * 3, dtype=torch.float32).reshape(12, 3) + 100 * step
        for part in split(batch, sizes):
            cache.write(step, part, expected=len(sizes))
        written[step] = batch
    return written


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "cache"
    fill(path)
    return path


def keys(items: Any) -> list[tuple[int, int]]:
    return [(int(it["step"]), int(it["row"])) for it in items]


ALL_ROWS = sorted((s, r) for s, sizes in MINIBATCHES.items() for r in range(sum(sizes)))


def assert_item_equals_load(item: dict[str, Any], cache: zs.Cache) -> None:
    view = cache.load(item["step"])
    mb_starts = np.cumsum([0] + [len(m) for m in view.minibatches])
    assert mb_starts[item["minibatch"]] <= item["row"] < mb_starts[item["minibatch"] + 1]
    for name in COLUMNS:
        want = view[name][item["row"]]
        got = item[name]
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want), name
        elif isinstance(want, np.generic):
            assert isinstance(got, torch.Tensor) and got.dim() == 0 and got.item() == want.item(), name
        else:
            assert got == want and not isinstance(got, (np.ndarray, torch.Tensor)), name


def test_map_items_equal_load_and_pickle_without_handles(local: Path) -> None:
    ds = RolloutDataset(local, columns=COLUMNS)
    assert len(ds) == len(ALL_ROWS)
    cache = zs.open_cache(local)
    assert keys(ds[i] for i in range(len(ds))) == ALL_ROWS
    for i in (0, 4, 5, 11, 12, 30, -1):
        assert_item_equals_load(ds[i], cache)
    item = ds[0]
    assert item["responses"].dim() == 1 and item["hidden"].shape == (3,) and isinstance(item["uid"], str)
    assert isinstance(item["extra_info"], dict)
    ds[3]  # opens the store and loads a step
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.source._cache is None and not clone.source._views
    assert keys([clone[7]]) == [ALL_ROWS[7]]
    with pytest.raises(IndexError, match="out of range for 36 rows"):
        ds[36]


def test_a_relative_location_travels_as_the_callers_directory(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(local.parent)
    ds = RolloutDataset(local.name, columns=["score"])
    monkeypatch.chdir("/")  # a process that starts elsewhere: a Ray worker, a spawned DataLoader worker
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.source.location == str(local) and keys([clone[0]]) == [ALL_ROWS[0]]


def test_a_step_named_twice_gives_its_rows_once(local: Path) -> None:
    # every row once an epoch, as the exports and the CLI read `3 3` (its rows came twice)
    wanted = [k for k in ALL_ROWS if k[0] in (1, 3)]
    assert keys(RolloutDataset(local, columns=["score"], steps=[3, 1, 3])) == sorted(wanted, key=lambda k: k[0] != 3)
    assert sorted(keys(RolloutIterableDataset(local, columns=["score"], steps=[1, 3, 1]))) == sorted(wanted)


def test_no_steps_asked_for_is_an_empty_dataset(local: Path) -> None:
    """``steps=[]`` (a filter that kept none) gives no rows: the datasets pickle (to spawned
    DataLoader workers) and iterate, batched too. With no step to take the default columns
    from, pickling and the batches raised a bare IndexError."""
    for ds in (
        RolloutDataset(local, steps=[]),
        RolloutIterableDataset(local, steps=[]),
        RolloutIterableDataset(local, steps=[], batch_size=4, shuffle=True),
    ):
        assert len(ds) == 0 and len(pickle.loads(pickle.dumps(ds))) == 0
        assert list(DataLoader(ds, batch_size=None)) == []
    assert list(RolloutIterableDataset(local, steps=[], batch_size=4)) == []


def test_map_through_dataloader_workers(local: Path) -> None:
    ds = RolloutDataset(local, columns=["responses", "score"], steps=[1, np.int64(3)])
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_rollouts)
    batches = list(loader)
    got = [(int(s), int(r)) for b in batches for s, r in zip(b["step"], b["row"], strict=True)]
    assert got == [k for k in ALL_ROWS if k[0] in (1, 3)]
    assert set(batches[0]) == {"step", "minibatch", "row", "responses", "responses_len", "score"}


def test_forked_workers_go_on_with_the_steps_their_parent_loaded(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On local files a forked worker reads through the parent's cache and step views (made
    when the dataset was) instead of opening the store and reading every step's records again:
    ~12-30 ms of each worker's start on 8 medium steps."""
    from zarr_skip.data import _source

    iterable = RolloutIterableDataset(local, columns=["responses", "uid"], block_rows=4)
    mapped = RolloutDataset(local, columns=["responses", "score"])
    assert iterable.source.cache.storage.fork_safe
    assert not zs.open_cache(zarr.storage.MemoryStore(), FP).storage.fork_safe

    def reopened(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a forked worker opened the store again")

    monkeypatch.setattr(_source, "open_cache", reopened)
    assert sorted(keys(DataLoader(iterable, batch_size=None, num_workers=2))) == ALL_ROWS
    batches = list(DataLoader(mapped, batch_size=4, num_workers=2, collate_fn=collate_rollouts))
    assert [(int(s), int(r)) for b in batches for s, r in zip(b["step"], b["row"], strict=True)] == ALL_ROWS


def epoch_rows(location: Any, *, world: int, workers: int, **kw: Any) -> list[list[tuple[int, int]]]:
    """Each rank's rows of one epoch through a DataLoader with ``workers`` workers."""
    out = []
    for rank in range(world):
        ds = RolloutIterableDataset(location, columns=["responses", "uid"], rank=rank, world_size=world, **kw)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        out.append(keys(loader))
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_across_two_ranks_by_two_workers(local: Path, shuffle: bool) -> None:
    per_rank = epoch_rows(local, world=2, workers=2, shuffle=shuffle, seed=3, block_rows=4, buffer_blocks=2)
    seen = Counter(k for rows in per_rank for k in rows)
    assert sorted(seen) == ALL_ROWS and set(seen.values()) == {1}
    assert abs(len(per_rank[0]) - len(per_rank[1])) <= 2  # shares of 4 shards differ by one row at most
    if not shuffle:
        assert sorted(per_rank[0] + per_rank[1]) == ALL_ROWS


def test_seed_and_epoch_fix_the_order(local: Path) -> None:
    def order(seed: int, epoch: int) -> list[tuple[int, int]]:
        ds = RolloutIterableDataset(local, columns=["uid"], shuffle=True, seed=seed, block_rows=3, buffer_blocks=3)
        ds.set_epoch(epoch)
        return keys(ds)

    first = order(1, 0)
    assert order(1, 0) == first and sorted(first) == ALL_ROWS
    assert first != ALL_ROWS  # shuffled
    assert order(1, 1) != first and order(2, 0) != first
    assert keys(RolloutIterableDataset(local, columns=["uid"])) == ALL_ROWS  # no shuffle: stored order


def test_a_negative_seed_or_epoch_is_refused_when_given(local: Path) -> None:
    """The shuffle seeds numpy from the seed and the epoch, which takes non-negative ints only:
    a negative one (or an epoch past int64) was taken, then iterating raised numpy's bare
    ValueError (or struct.error); now the call that gives it raises a ConfigError naming it."""
    with pytest.raises(ConfigError, match="seed"):
        RolloutIterableDataset(local, columns=["uid"], shuffle=True, seed=-1)
    ds = RolloutIterableDataset(local, columns=["uid"], shuffle=True, seed=2**63)
    for epoch in (-1, 2**63):
        with pytest.raises(ConfigError, match="epoch"):
            ds.set_epoch(epoch)
    assert ds.epoch == 0 and sorted(keys(ds)) == ALL_ROWS


@pytest.mark.parametrize("batched", [False, True])
def test_set_epoch_reaches_persistent_workers(local: Path, batched: bool) -> None:
    """``persistent_workers=True`` keeps the workers' copies of the dataset between epochs:
    each epoch still takes the order ``set_epoch`` chose in the main process (it repeated the
    first epoch's order), the order non-persistent workers give, every row once."""
    kw: dict[str, Any] = {"batch_size": 4} if batched else {}
    ds = RolloutIterableDataset(local, columns=["uid"], shuffle=True, block_rows=3, buffer_blocks=2, **kw)
    loader_kw: dict[str, Any] = {"batch_size": None} if batched else {"batch_size": 4}

    def epochs(persistent: bool) -> list[list[tuple[int, int]]]:
        loader = DataLoader(ds, num_workers=2, persistent_workers=persistent, collate_fn=collate_rollouts, **loader_kw)
        out = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            out.append([(int(s), int(r)) for b in loader for s, r in zip(b["step"], b["row"], strict=True)])
        return out

    kept, fresh = epochs(True), epochs(False)
    assert kept == fresh
    assert all(sorted(e) == ALL_ROWS for e in kept) and len({tuple(e) for e in kept}) == 3


def test_set_epoch_reaches_persistent_forkserver_workers(local: Path) -> None:
    """Workers started with forkserver (what the S3 recipe uses) unpickle the dataset: they
    open its epoch through /proc and follow set_epoch as forked ones do."""
    ds = RolloutIterableDataset(local, columns=["uid"], shuffle=True, block_rows=3, buffer_blocks=2)
    seen = []
    for context, persistent in (("forkserver", True), (None, False)):
        loader = DataLoader(
            ds,
            batch_size=4,
            num_workers=2,
            persistent_workers=persistent,
            collate_fn=collate_rollouts,
            multiprocessing_context=context,
        )
        orders = []
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            orders.append([(int(s), int(r)) for b in loader for s, r in zip(b["step"], b["row"], strict=True)])
        seen.append(orders)
    assert seen[0] == seen[1] and seen[0][0] != seen[0][1]


def test_a_pickled_dataset_follows_its_epoch_or_warns_where_it_cannot(
    local: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pickled, the dataset's epoch is the same shared cell (opened through /proc); a deep
    copy's is its own; where /proc cannot serve, the epoch travels as its value and a
    persistent worker of that kind says once that set_epoch cannot reach it."""
    import copy

    import zarr_skip.data._iterable as iterable

    ds = RolloutIterableDataset(local, columns=["uid"], shuffle=True, block_rows=3)
    ds.set_epoch(4)
    linked, own = pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)
    ds.set_epoch(5)
    assert (linked.epoch, own.epoch) == (5, 4)
    linked.set_epoch(6)
    assert ds.epoch == 6
    monkeypatch.setattr(iterable, "reachable", lambda: False)
    ds.set_epoch(4)
    clone = pickle.loads(pickle.dumps(ds))
    ds.set_epoch(5)
    assert clone.epoch == 4  # its own value now
    monkeypatch.setattr(iterable, "get_worker_info", lambda: type("Info", (), {"num_workers": 1, "id": 0})())
    monkeypatch.setattr(iterable, "_settle_worker", lambda: None)  # not this test process's gc or malloc
    with caplog.at_level("WARNING", logger="zarr_skip.data._iterable"):
        assert keys(ds) == keys(ds) and keys(linked) == keys(linked)  # linked: no warning
        assert not caplog.records
        first = keys(clone)
        assert not caplog.records  # the first epoch is the one it was given
        assert keys(clone) == first and keys(clone) == first
    (record,) = caplog.records
    assert "each epoch repeats epoch 4's order" in record.getMessage()


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the epoch is a memfd on Linux only")
def test_an_epoch_freed_at_interpreter_exit_closes_its_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset freed at interpreter exit after its module's globals were cleared (``os`` is
    None then; a dataset in a reference cycle, say) still closes its epoch's descriptor,
    without an "Exception ignored" traceback."""
    import zarr_skip.data._iterable as iterable

    epoch = iterable.SharedEpoch(3)
    fd = epoch._fd
    assert fd >= 0 and os.fstat(fd)
    monkeypatch.setattr(iterable, "os", None)  # as interpreter finalisation leaves the module
    epoch.__del__()
    with pytest.raises(OSError):
        os.fstat(fd)
    epoch._fd = -1  # closed: the collector's own call has nothing left to do


def test_iterable_items_equal_load_and_memory_holds_a_few_blocks(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = RolloutIterableDataset(local, columns=COLUMNS, block_rows=4, buffer_blocks=2)
    assert len(ds) == 36
    reads: list[int] = []
    original = ds._segment

    def traced(block: Block) -> Any:
        reads.append(block.rows)
        return original(block)

    monkeypatch.setattr(ds, "_segment", traced)
    cache = zs.open_cache(local)
    it = iter(ds)
    first = [next(it) for _ in range(3)]
    assert sum(reads) <= 4  # in stored order one block of four rows at a time, not a step
    items = first + list(it)
    assert keys(items) == ALL_ROWS and max(reads) <= 4
    for item in items:
        assert_item_equals_load(item, cache)
    reads.clear()
    ds = RolloutIterableDataset(local, columns=COLUMNS, block_rows=4, buffer_blocks=2, shuffle=True)
    original = ds._segment
    monkeypatch.setattr(ds, "_segment", traced)
    it = iter(ds)
    first = [next(it) for _ in range(3)]
    assert sum(reads) <= 8  # shuffled: a buffer of two blocks of four rows
    items = first + list(it)
    assert sorted(keys(items)) == ALL_ROWS and max(reads) <= 4
    for item in items[:5]:
        assert_item_equals_load(item, cache)


def test_each_chunk_is_fetched_once_an_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # one mini-batch of 200 rows in small chunks: blocks of 64 rows fetched its small columns'
    # chunks (and the chunks at block edges) several times an epoch
    cache = zs.open_cache(tmp_path / "cache", FP, chunk_bytes=1024)
    cache.write(1, dict(text_rollouts(50, 4, seed=1, max_response=40)), expected=1)
    fetched: Counter[tuple[str, int]] = Counter()
    original = reads.fetch_chunks

    def counted(storage: Any, items: Any, *rest: Any) -> Any:
        fetched.update((item[0].path, item[1]) for item in items)
        return original(storage, items, *rest)

    monkeypatch.setattr(reads, "fetch_chunks", counted)
    ds = RolloutIterableDataset(tmp_path / "cache")
    ds.source.view(1)  # the view (its metadata) loaded
    fetched.clear()
    batches = list(DataLoader(ds, batch_size=64, collate_fn=collate_rollouts))
    assert sum(len(b["row"]) for b in batches) == 200
    assert len(fetched) > 2 * len(ds.source.columns) and set(fetched.values()) == {1}
    rows = [item["responses"] for item in ds._items(Block(1, 0, 0, 200))[:2]]
    assert rows[0].untyped_storage().data_ptr() == rows[1].untyped_storage().data_ptr()  # views of one buffer


def test_ranks_from_torch_distributed(local: Path, tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert resolve_rank(None, None) == (0, 1)
        assert resolve_rank(1, 3) == (1, 3)  # the arguments win
    finally:
        dist.destroy_process_group()
    with pytest.raises(ConfigError, match="0 <= rank < world_size"):
        resolve_rank(2, 2)


def test_a_dataset_made_before_init_process_group_refuses_to_read(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made before ``torch.distributed`` is initialised, a dataset took rank 0 of 1, and every
    rank would silently read every row: it says so when iterated on rank 1 of 2."""
    import torch.distributed as dist

    early = RolloutIterableDataset(local, columns=["uid"])
    pinned = RolloutIterableDataset(local, columns=["uid"], rank=0, world_size=1)  # asked for: every row
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    with pytest.raises(
        ConfigError, match="made for rank 0 of 1, but torch.distributed says this process is rank 1 of 2"
    ):
        next(iter(early))
    assert len(keys(pinned)) == len(ALL_ROWS)
    late = RolloutIterableDataset(local, columns=["uid"])
    assert (late.rank, late.world_size) == (1, 2)
    assert set(keys(late)) < set(ALL_ROWS)


def test_shard_plan_is_exact_and_balanced() -> None:
    blocks = [Block(s, 0, 0, n) for s, n in enumerate([5, 1, 9, 0, 4])]
    for world, workers in ((1, 1), (2, 1), (1, 3), (7, 1), (5, 5)):
        for shuffle in (False, True):
            rows = []
            sizes = []
            for rank in range(world):
                for worker in range(workers):
                    span = row_span(19, world, rank, workers, worker)
                    pieces = shard_blocks(blocks, span, shuffle=shuffle, seed=1, epoch=2)
                    sizes.append(sum(p.rows for p in pieces))
                    rows += [(p.step, r) for p in pieces for r in range(p.start, p.stop)]
            assert sorted(rows) == sorted((b.step, r) for b in blocks for r in range(b.rows))
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("total", [0, 1, 17, 36, 100])
@pytest.mark.parametrize(("world", "workers", "batch"), [(1, 2, 4), (2, 2, 5), (3, 4, 3), (1, 3, 64), (2, 5, 1)])
def test_batches_are_shared_among_workers_whole(total: int, world: int, workers: int, batch: int) -> None:
    """With a batch size, a rank's equal share of the rows goes to its workers in whole
    batches: they cover it exactly, and only the worker holding the rank's last row may end on
    a short batch, so the workers yield exactly the batches one process would cut."""
    for rank in range(world):
        lo, hi = total * rank // world, total * (rank + 1) // world
        spans = [row_span(total, world, rank, workers, w, batch) for w in range(workers)]
        assert spans[0][0] == lo and spans[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # back to back
        assert all((b - a) % batch == 0 for a, b in spans if b < hi)
        batches = sum(-(-(b - a) // batch) for a, b in spans)
        assert batches == -(-(hi - lo) // batch)
        shares = [(b - a) // batch for a, b in spans]
        assert max(shares) - min(shares) <= 1  # balanced in whole batches


def test_the_workers_yield_what_len_says(local: Path) -> None:
    """36 rows in batches of 8 through 2 workers: 5 batches, one short one (it was 6: each
    worker ended on a short batch of its own, and torch warned that len() was wrong)."""
    for drop_last in (False, True):
        ds = RolloutIterableDataset(local, columns=["uid"], batch_size=8, drop_last=drop_last)
        loader = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=collate_rollouts)
        sizes = sorted(len(b["row"]) for b in loader)
        assert len(sizes) == len(ds) == len(loader) == (4 if drop_last else 5)
        assert sizes == ([8] * 4 if drop_last else [4, 8, 8, 8, 8])


@pytest.mark.s3
def test_on_s3(s3_server: Any) -> None:
    url = s3_server.s3_url(f"t-{uuid.uuid4().hex[:12]}")
    from zarr_skip.store._s3 import open_s3_store

    fill(open_s3_store(url, s3_server.storage_options))
    ds = RolloutDataset(url, columns=COLUMNS, storage_options=s3_server.storage_options)
    cache = zs.open_cache(url, storage_options=s3_server.storage_options)
    assert len(ds) == 36
    assert_item_equals_load(ds[20], cache)
    for item in ds.__getitems__([35, 0, 20, 20, -1, 7]):  # a DataLoader batch: two rounds of requests
        assert_item_equals_load(item, cache)
    # obstore's runtime does not survive fork(): S3 workers start by forkserver (or spawn)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="forkserver")
    assert keys(loader) == ALL_ROWS
    per_rank = []
    for rank in range(2):
        it = RolloutIterableDataset(
            url, columns=["uid"], storage_options=s3_server.storage_options, rank=rank, world_size=2, block_rows=5
        )
        per_rank.append(keys(it))  # in this process (the workers are shown above)
    assert sorted(per_rank[0] + per_rank[1]) == ALL_ROWS and len(per_rank[1]) == 18


def test_store_objects_and_bad_columns_are_refused(local: Path) -> None:
    with pytest.raises(ConfigError, match="not a store object"):
        RolloutDataset(zs.open_cache(local).storage.store)  # type: ignore[arg-type]
    with pytest.raises(zs.ColumnNotFoundError, match="step 1: no column 'nope'"):
        RolloutDataset(local, columns=["nope"])
    with pytest.raises(zs.ColumnNotFoundError, match="step 1: no column 'nope'"):
        RolloutIterableDataset(local, columns=["uid", "nope"])


def test_collate_pads_or_nests_jagged_columns() -> None:
    items = [
        {"step": 1, "row": 0, "ids": torch.tensor([1, 2, 3]), "h": torch.ones(2), "uid": "a"},
        {"step": 1, "row": 1, "ids": torch.tensor([4]), "h": torch.zeros(2), "uid": "b"},
    ]
    batch = collate_rollouts(items, pad_value=-1)
    assert batch["ids"].tolist() == [[1, 2, 3], [4, -1, -1]] and batch["ids_len"].tolist() == [3, 1]
    assert batch["h"].shape == (2, 2) and batch["uid"] == ["a", "b"] and batch["row"].dtype == torch.int64
    nested = collate_rollouts(items, jagged="nested")
    assert nested["ids"].is_nested and [t.tolist() for t in nested["ids"].unbind()] == [[1, 2, 3], [4]]
    with pytest.raises(ConfigError, match="choose 'pad' or 'nested'"):
        collate_rollouts(items, jagged="ragged")


def test_a_batch_is_one_buffer_and_pickles_it_once(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = list(RolloutIterableDataset(local, columns=COLUMNS, steps=[1]))
    batch = collate_rollouts(items)
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    assert {"row", "responses", "responses_len", "hidden", "score"} <= set(tensors)
    assert len({v.untyped_storage().data_ptr() for v in tensors.values()}) == 1
    _, (bases, views, plain, order) = batch.__reduce__()
    assert len(bases) == 1 and set(views) == set(tensors) and order == list(batch)
    back = pickle.loads(pickle.dumps(batch))
    assert isinstance(back, RolloutBatch) and list(back) == list(batch)
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
        else:
            assert back[name] == value, name
    assert back["responses"][1, : back["responses_len"][1]].tolist() == items[1]["responses"].tolist()
    nested = collate_rollouts(items, jagged="nested")
    _, (bases, views, plain, order) = nested.__reduce__()
    assert len(bases) == 1 and len(views["responses"]) == 2  # the values and offsets, in the one buffer
    back = pickle.loads(pickle.dumps(nested))
    assert back["responses"].is_nested and back["responses"].layout == torch.jagged
    assert [r.tolist() for r in back["responses"].unbind()] == [it["responses"].tolist() for it in items]
    assert back["responses"].dtype == items[0]["responses"].dtype and torch.equal(back["hidden"], batch["hidden"])
    # through DataLoader workers: one shared-memory buffer (one file descriptor) per batch
    import zarr_skip.data._shm as shm

    received = []

    def counting(original: Any) -> Any:
        def counted(*args: Any) -> Any:
            received.append(original.__name__)
            return original(*args)

        return counted

    ds = RolloutIterableDataset(local, columns=COLUMNS)
    it = iter(DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate_rollouts))
    # patched once the workers run (their pickler must find the originals under their names)
    monkeypatch.setattr(shm, "_borrow", counting(shm._borrow))  # a descriptor sent
    monkeypatch.setattr(shm, "_reopen", counting(shm._reopen))  # or opened through /proc
    loaded = list(it)
    assert len(received) == len(loaded) == 8  # 18 + 18 rows: four batches of five or less per worker
    assert set(received) == {"_reopen" if shm.reachable() else "_borrow"}  # no descriptor sent where /proc serves
    assert sorted(keys(r for b in loaded for r in _rows(b))) == ALL_ROWS


def _rows(batch: dict[str, Any]) -> list[dict[str, int]]:
    return [{"step": int(s), "row": int(r)} for s, r in zip(batch["step"], batch["row"], strict=True)]


def test_shuffled_items_hold_one_buffer_at_a_time(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import weakref

    ds = RolloutIterableDataset(local, columns=COLUMNS, shuffle=True, block_rows=4, buffer_blocks=2)
    alive: list[weakref.ref[Any]] = []  # the dense column of the rows each buffer's items were cut from
    most = []
    original = ds._buffer_items

    def traced(group: list[Block]) -> list[Any]:
        most.append(sum(r() is not None for r in alive))
        items = original(group)
        cut_from = {id(it.origin[0]): it.origin[0].columns["hidden"].tensor for it in items}
        alive.extend(weakref.ref(tensor) for tensor in cut_from.values())
        assert len(group) == 1 or len({id(it.origin[0]) for it in items}) == 1  # a buffer's blocks joined
        return items

    monkeypatch.setattr(ds, "_buffer_items", traced)
    assert sum(1 for _ in ds) == 36
    # reading a buffer, at most the rows of the item the loop holds (its buffer's) are alive:
    # the previous buffers were dropped before it
    assert len(most) == 6 and max(most) <= 1


def test_collate_promotes_dtypes_and_refuses_rows_that_differ_beyond_dim_0() -> None:
    mixed = [
        {"ids": torch.tensor([1, 2], dtype=torch.int32), "x": torch.tensor([0.5], dtype=torch.float16)},
        {"ids": torch.tensor([3], dtype=torch.int64), "x": torch.tensor([1.5, 2.5], dtype=torch.float32)},
    ]
    batch = collate_rollouts(mixed, pad_value=-1)
    assert batch["ids"].dtype == torch.int64 and batch["ids"].tolist() == [[1, 2], [3, -1]]
    assert batch["x"].dtype == torch.float32 and batch["x"].tolist() == [[0.5, -1.0], [1.5, 2.5]]
    rows = [{"h": torch.ones(2, 3)}, {"h": torch.zeros(1, 3)}]
    padded = collate_rollouts(rows)
    assert padded["h"].shape == (2, 2, 3) and padded["h_len"].tolist() == [2, 1]
    assert torch.equal(padded["h"][1], torch.zeros(2, 3)) and torch.equal(padded["h"][0], torch.ones(2, 3))
    for bad in (
        [{"h": torch.ones(2, 3)}, {"h": torch.ones(2, 4)}],  # trailing dimensions differ
        [{"h": torch.ones(2)}, {"h": torch.ones(2, 1)}],  # number of dimensions differs
        [{"h": torch.ones(2)}, {"h": torch.tensor(1.0)}],  # a 0-d row among jagged ones
    ):
        with pytest.raises(ConfigError, match="column 'h': rows differ beyond their first dimension"):
            collate_rollouts(bad)


def test_fresh_shared_memory_reads_as_zeros() -> None:
    # what a worker's collate relies on to leave a zero padding unwritten (see the next test)
    for _ in range(3):
        storage = torch.UntypedStorage._new_shared(1 << 16)  # type: ignore[attr-defined]  # untyped in torch
        data = torch.empty(0, dtype=torch.uint8).set_(storage)
        assert not data.any()
        data.fill_(7)  # then freed: the next one must not hand these bytes back
        del data, storage


@pytest.mark.parametrize("pad_value", [0, -1, -0.0])
def test_a_worker_leaves_a_zero_padding_unwritten_with_the_same_batch(
    local: Path, monkeypatch: pytest.MonkeyPatch, pad_value: float
) -> None:
    import zarr_skip.data._shm as shm
    import zarr_skip.data.collate as collate_module

    # plain dicts: collated from their values (the dataset's own items are gathered from their
    # blocks, whose padding test_data_batches checks)
    items = [dict(item) for item in RolloutIterableDataset(local, columns=COLUMNS, steps=[1])]
    in_process = collate_rollouts(items, pad_value=pad_value)
    fills: list[int] = []
    original = torch.Tensor.fill_

    def counted(self: torch.Tensor, value: Any) -> torch.Tensor:
        fills.append(self.numel())
        return original(self, value)

    monkeypatch.setattr(torch.Tensor, "fill_", counted)
    monkeypatch.setattr(collate_module, "get_worker_info", lambda: object())  # as in a worker: shared memory
    monkeypatch.setattr(shm, "_LENDER", None)  # this process's own buffers, new: they read as zeros
    in_worker = collate_rollouts(items, pad_value=pad_value)
    padded = [name for name in in_worker if f"{name}_len" in in_worker]
    assert len(padded) == 2  # responses, old_log_probs
    # a padded tensor is filled (besides the 1-element conversions of pad_value) only when its
    # padding is not all zero bits: -1 always, -0.0 in a float column (its sign bit), 0 never
    nonzero = [n for n in padded if pad_value == -1 or (str(pad_value) == "-0.0" and in_worker[n].is_floating_point())]
    assert len([n for n in fills if n > 1]) == len(nonzero) == {"0": 0, "-1": 2, "-0.0": 1}[str(pad_value)]
    assert shm.lend(in_worker["responses"].untyped_storage()) is not None  # in a buffer it lends
    assert list(in_worker) == list(in_process)
    for name, value in in_process.items():
        got = in_worker[name]
        if isinstance(value, torch.Tensor):
            assert got.dtype == value.dtype and torch.equal(got, value), name
            if value.is_floating_point():
                assert torch.equal(torch.signbit(got), torch.signbit(value)), name
        else:
            assert got == value, name


def test_a_worker_freezes_what_it_inherited_and_keeps_freed_memory_the_main_process_neither(local: Path) -> None:
    import gc

    before = gc.get_freeze_count()
    ds = RolloutIterableDataset(local, columns=COLUMNS)
    here = list(DataLoader(ds, batch_size=8, collate_fn=worker_state))
    assert sum(b["rows"] for b in here) == len(ALL_ROWS)
    # no worker: the caller's process is left alone (its allocator gives freed memory back)
    assert gc.get_freeze_count() == before and all(b["refaults"] > 5000 for b in here)
    batches = list(DataLoader(ds, batch_size=8, num_workers=1, collate_fn=worker_state))
    assert sum(b["rows"] for b in batches) == len(ALL_ROWS)
    # the worker froze the objects it inherited (torch, the test session) before reading, and
    # reuses the memory it frees (72 MiB allocated again: 18432 pages, faulted in by default)
    assert all(b["frozen"] > before + 1000 and b["refaults"] < 500 for b in batches)
    assert gc.get_freeze_count() == before


def test_a_damaged_chunk_is_a_typed_error_in_every_dataset(tmp_path: Path) -> None:
    """A flipped bit in a data file reaches the training loop as the ChecksumError that names
    the step, mini-batch, column and file (raised in a DataLoader worker, re-raised in the main
    process): never rows of wrong values."""
    cache = zs.open_cache(tmp_path, {"damaged": 1})
    cache.write(5, make_batch(6, seed=1), expected=2)
    info = cache.write(5, make_batch(6, seed=2), expected=2)
    path = chunk_region(tmp_path / info.path, "input_ids")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    where = r"step 5, mini-batch 1, column 'input_ids'"
    with pytest.raises(zs.ChecksumError, match=where):
        list(RolloutIterableDataset(tmp_path))
    with pytest.raises(zs.ChecksumError, match=where):
        RolloutDataset(tmp_path)[8]
    assert RolloutDataset(tmp_path)[2]["row"] == 2  # the sound mini-batch still reads
    loader = DataLoader(RolloutIterableDataset(tmp_path, batch_size=4), batch_size=None, num_workers=2)
    with pytest.raises(zs.ChecksumError, match=where) as exc:
        list(loader)
    assert str(path) in str(exc.value)
    # torch shuts down a loader whose worker raised by waiting 5 s for each worker (a plain
    # IterableDataset does the same): one such loader here, not one per dataset
