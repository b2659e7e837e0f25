"""RolloutIterableDataset(batch_size=...): batches cut from the decoded blocks, equal to the
per-row items collated."""

from __future__ import annotations

import copy
import gc
import pickle
from collections import Counter
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_data import ALL_ROWS, COLUMNS, fill
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

import zarr_skip as zs
import zarr_skip.data._batches as batches_module
import zarr_skip.data._shm as shm
import zarr_skip.data.collate as collate_module
from zarr_skip.data import RolloutBatch, RolloutIterableDataset, collate_rollouts
from zarr_skip.data._batches import Segment, cut
from zarr_skip.data.collate import RowItem
from zarr_skip.errors import ConfigError, ConfigTypeError


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("batches") / "cache"
    fill(path)
    return path


def plain(items: list[Any]) -> list[dict[str, Any]]:
    """The items as plain dicts: collated from their own values, not from their blocks."""
    return [dict(item) for item in items]


def assert_same(got: RolloutBatch, want: RolloutBatch) -> None:
    assert isinstance(got, RolloutBatch) and list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        if not isinstance(w, torch.Tensor):
            assert g == w, name
            continue
        assert isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.is_nested == w.is_nested, name
        if w.is_nested:
            assert torch.equal(g.values(), w.values()) and torch.equal(g.offsets(), w.offsets()), name
        else:
            assert g.shape == w.shape and torch.equal(g, w), name


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("jagged", ["pad", "nested"])
def test_batches_equal_the_items_collated(local: Path, shuffle: bool, jagged: str) -> None:
    # batch sizes that divide the blocks, cross them, and take one row; blocks of 3 rows cut
    # the mini-batches (5, 7 / 12 / 3, 4, 5) unevenly
    for batch_size in (1, 4, 5, 64):
        for block_rows in (3, 256):
            kw: dict[str, Any] = {"columns": COLUMNS, "shuffle": shuffle, "seed": 3, "block_rows": block_rows}
            items = list(RolloutIterableDataset(local, **kw))
            # the items' own values collated (plain dicts: not gathered from their blocks)
            want = [collate_rollouts(plain(items[i : i + batch_size]), jagged=jagged) for i in range(0, 36, batch_size)]
            ds = RolloutIterableDataset(local, batch_size=batch_size, jagged=jagged, **kw)
            got = list(ds)
            assert len(got) == len(want) == len(ds)
            for g, w in zip(got, want, strict=True):
                assert_same(g, w)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("jagged", ["pad", "nested"])
def test_items_are_collated_from_their_blocks_as_from_their_values(
    local: Path, monkeypatch: pytest.MonkeyPatch, shuffle: bool, jagged: str
) -> None:
    """collate_rollouts gathers a batch of the dataset's untouched items from the blocks they
    were cut from (one copy a column, as the dataset's own batches): the same batch as their
    values collated one by one, for batches within a block, across blocks and of one row."""
    gathered = []
    original = batches_module.make_batch

    def traced(runs: Any, *args: Any) -> RolloutBatch:
        gathered.append(len(runs))
        return original(runs, *args)

    monkeypatch.setattr(batches_module, "make_batch", traced)
    for batch_size in (1, 4, 5, 64):
        for block_rows in (3, 256):
            kw: dict[str, Any] = {"columns": COLUMNS, "shuffle": shuffle, "seed": 3, "block_rows": block_rows}
            items = list(RolloutIterableDataset(local, **kw))
            assert all(isinstance(item, RowItem) for item in items)
            for i in range(0, 36, batch_size):
                assert_same(
                    collate_rollouts(items[i : i + batch_size], jagged=jagged),
                    collate_rollouts(plain(items[i : i + batch_size]), jagged=jagged),
                )
    assert gathered and max(gathered) <= collate_module.MAX_RUNS
    if not shuffle:  # in stored order every batch of at most MAX_RUNS blocks is gathered from them
        assert len(gathered) == sum(-(-36 // b) for b in (1, 4, 5)) * 2  # of 64 rows: 6 or 12 blocks


def test_a_changed_item_is_collated_from_its_values(local: Path) -> None:
    """An item changed in any way is collated from its own values (its block's would be wrong);
    an item copies and pickles as a plain dict, without its block."""
    items = list(RolloutIterableDataset(local, columns=["responses", "uid", "hidden"]))[:4]
    want = collate_rollouts(plain(items))
    assert_same(collate_rollouts(items), want)
    changes = [
        lambda it: it.__setitem__("hidden", it["hidden"] + 1),
        lambda it: it.update(hidden=it["hidden"] + 1),
        lambda it: it.setdefault("hidden", None),
        lambda it: it.__ior__({"hidden": it["hidden"] + 1}),
    ]
    for change in changes:
        fresh = list(RolloutIterableDataset(local, columns=["responses", "uid", "hidden"]))[:4]
        change(fresh[1])
        assert fresh[1].origin is None and fresh[0].origin is not None
        assert_same(collate_rollouts(fresh), collate_rollouts(plain(fresh)))
    fresh = list(RolloutIterableDataset(local, columns=["responses", "uid", "hidden"]))[:4]
    fresh[2]["hidden"] = fresh[2]["hidden"] + 1
    assert torch.equal(collate_rollouts(fresh)["hidden"][2], items[2]["hidden"] + 1)
    for removal in (lambda it: it.pop("uid"), lambda it: it.__delitem__("uid"), lambda it: it.popitem()):
        fresh = list(RolloutIterableDataset(local, columns=["responses", "uid", "hidden"]))[:2]
        removal(fresh[0])
        assert fresh[0].origin is None
        with pytest.raises(ConfigError, match="other columns"):
            collate_rollouts(fresh)
    for copied in (copy.copy(items[0]), pickle.loads(pickle.dumps(items[0])), copy.deepcopy(items[0]), items[0].copy()):
        assert type(copied) is dict and copied.keys() == items[0].keys()
        assert torch.equal(copied["responses"], items[0]["responses"])


def test_pad_value_and_a_batch_whose_rows_agree(local: Path) -> None:
    items = list(RolloutIterableDataset(local, columns=["responses", "hidden"]))
    for pad_value in (0, -1):
        want = collate_rollouts(plain(items[:8]), pad_value=pad_value)
        got = next(
            iter(RolloutIterableDataset(local, columns=["responses", "hidden"], batch_size=8, pad_value=pad_value))
        )
        assert_same(got, want)
    assert collate_rollouts(got) is got  # what DataLoader(batch_size=None) hands it: passed as is
    one = next(iter(RolloutIterableDataset(local, columns=["responses"], batch_size=1)))
    assert "responses_len" not in one and one["responses"].shape == (1, len(items[0]["responses"]))


def test_through_workers_and_ranks_every_row_once(local: Path) -> None:
    seen: Counter[tuple[int, int]] = Counter()
    per_rank = []
    for rank in range(2):
        ds = RolloutIterableDataset(local, columns=COLUMNS, rank=rank, world_size=2, shuffle=True, seed=1, batch_size=4)
        batches = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=collate_rollouts))
        assert all(isinstance(b, RolloutBatch) and len(b["row"]) <= 4 for b in batches)
        rows = [(int(s), int(r)) for b in batches for s, r in zip(b["step"], b["row"], strict=True)]
        per_rank.append(rows)
        seen.update(rows)
    assert sorted(seen) == ALL_ROWS and set(seen.values()) == {1}
    assert len(per_rank[0]) == len(per_rank[1]) == 18


def test_drop_last_len_and_bad_arguments(local: Path) -> None:
    assert len(RolloutIterableDataset(local, batch_size=5)) == 8  # 36 rows
    ds = RolloutIterableDataset(local, batch_size=5, drop_last=True)
    assert len(ds) == 7 and [len(b["row"]) for b in ds] == [5] * 7
    for bad in (0, -2):
        with pytest.raises(ConfigError, match=rf"batch_size: expected an int in 1 \.\. .*, got {bad}"):
            RolloutIterableDataset(local, batch_size=bad)
    for wrong in (2.5, True, "8"):
        with pytest.raises(ConfigTypeError, match="batch_size: expected an int, got"):
            RolloutIterableDataset(local, batch_size=wrong)  # type: ignore[arg-type]
    ds = RolloutIterableDataset(local, batch_size=np.int64(5))  # type: ignore[arg-type]
    assert ds.batch_size == 5 and type(ds.batch_size) is int and len(ds) == 8
    with pytest.raises(ConfigError, match="choose 'pad' or 'nested'"):
        RolloutIterableDataset(local, batch_size=4, jagged="ragged")


def test_cut_takes_each_row_once_in_order() -> None:
    segs = [Segment({"row": np.arange(n)}, {}) for n in (5, 2, 6)]
    orders = [(s, np.arange(s.rows)[::-1]) for s in segs]
    batches = list(cut(orders, 4, drop_last=False))
    flat = [(id(seg), int(i)) for runs in batches for seg, idx in runs for i in idx]
    assert flat == [(id(s), int(i)) for s, o in orders for i in o]
    assert [sum(len(idx) for _, idx in runs) for runs in batches] == [4, 4, 4, 1]
    assert [len(runs) for runs in batches] == [1, 3, 1, 1]  # a batch may take rows of several segments
    assert [sum(len(i) for _, i in r) for r in cut(orders, 4, drop_last=True)] == [4, 4, 4]


def jagged_steps(path: Path) -> Path:
    """Two steps of jagged columns: bfloat16 values with a trailing axis, and token ids stored
    as int32 in step 1 and int64 in step 2 (a batch across both promotes them)."""
    cache = zs.open_cache(path, {"t": "dtypes"})
    for step, ids_dtype in ((1, torch.int32), (2, torch.int64)):
        lengths = [3, 1, 5, 2, 4][: 3 + step]
        hidden = [torch.randn(n, 2, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16) for n in lengths]
        ids = [torch.arange(n, dtype=ids_dtype) + 10 * step for n in lengths]
        cache.write(
            step,
            {
                "hidden": torch.nested.as_nested_tensor(hidden, layout=torch.jagged),
                "ids": torch.nested.as_nested_tensor(ids, layout=torch.jagged),
            },
        )
    return path


def test_shuffled_items_keep_each_steps_dtypes(tmp_path: Path) -> None:
    """A shuffle buffer's blocks are joined for its items only when that keeps every column's
    dtype: token ids stored as int32 in one step and int64 in the next stay so in the items
    (and a batch of both promotes them, as from their values)."""
    where = jagged_steps(tmp_path / "cache")
    cache = zs.open_cache(where)
    stored = {s: cache.load(s)["ids"][0].dtype for s in (1, 2)}
    assert stored == {1: torch.int32, 2: torch.int64}
    items = list(RolloutIterableDataset(where, shuffle=True, buffer_blocks=2))
    assert {int(it["step"]): it["ids"].dtype for it in items} == stored
    assert len({id(it.origin[0]) for it in items}) == 2  # not joined: each step's own rows
    joined = list(RolloutIterableDataset(where, columns=["hidden"], shuffle=True, buffer_blocks=2))
    assert len({id(it.origin[0]) for it in joined}) == 1  # one dtype: the buffer's blocks joined
    assert_same(collate_rollouts(items[:6]), collate_rollouts(plain(items[:6])))
    assert_same(collate_rollouts(joined[:6]), collate_rollouts(plain(joined[:6])))


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_shuffled_batches_keep_each_steps_dtypes(tmp_path: Path, batch_size: int) -> None:
    """Shuffled batches are those of the items collated: a batch of int32 rows only holds
    int32 token ids. The buffer's blocks were joined for the batches whatever their dtypes, so
    a batch of step 1's rows came out int64 (the items, not joined, stayed int32)."""
    where = jagged_steps(tmp_path / "cache")
    kw: dict[str, Any] = {"shuffle": True, "seed": 5, "buffer_blocks": 2}
    items = list(RolloutIterableDataset(where, **kw))
    got = list(RolloutIterableDataset(where, batch_size=batch_size, **kw))
    want = [collate_rollouts(plain(items[i : i + batch_size])) for i in range(0, len(items), batch_size)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert {torch.int32, torch.int64} <= {b["ids"].dtype for b in got}


@pytest.mark.parametrize("pad_value", [float("-inf"), float("nan"), 2.0**70])
def test_a_pad_value_a_column_cannot_hold_is_a_config_error(local: Path, pad_value: float) -> None:
    """pad_value is written into every padded column: -inf (to mask log-probs, say) fits the
    float log-probs but not the int64 token ids, and torch's bare RuntimeError ("value cannot
    be converted") escaped from collate_rollouts and from the dataset's batches. Now a
    ConfigError names the column and its dtype; nested columns, never padded, take it."""
    columns = ["old_log_probs", "responses"]
    items = list(RolloutIterableDataset(local, columns=columns))[:4]
    assert len({len(it["responses"]) for it in items}) > 1  # padded
    for batch in (items, plain(items)):
        with pytest.raises(ConfigError, match="pad_value=.*column 'responses' holds int64"):
            collate_rollouts(batch, pad_value=pad_value)
    ds = RolloutIterableDataset(local, columns=columns, batch_size=4, pad_value=pad_value)
    with pytest.raises(ConfigError, match="pad_value=.*column 'responses' holds int64"):
        next(iter(ds))
    nested = collate_rollouts(items, jagged="nested", pad_value=pad_value)
    assert nested["responses"].is_nested
    floats = collate_rollouts([{"old_log_probs": it["old_log_probs"]} for it in items], pad_value=pad_value)
    short = int(floats["old_log_probs_len"].argmin())
    tail = floats["old_log_probs"][short, int(floats["old_log_probs_len"][short]) :]
    assert tail.numel() > 0
    np.testing.assert_array_equal(tail.numpy(), np.full(tail.shape, pad_value, dtype=np.float32))  # NaN equal


def test_python_ints_past_int64_stay_python_ints(tmp_path: Path) -> None:
    """A column of Python ints (hashes, say) is stored and loaded as they are; batched, those
    that fit an int64 become a tensor, and a batch holding one past it kept them as its list:
    it raised numpy's bare ValueError "Overflow when unpacking long long"."""
    hashes, small = [2**64 - 1, 3, -(2**63), 5], [1, 2, 3, 4]
    cache = zs.open_cache(tmp_path / "cache", {"t": "ints"})
    cache.write(1, {"h": hashes, "n": small, "x": torch.zeros(4)}, expected=1)
    assert cache.load(1)["h"][:] == hashes
    items = list(RolloutIterableDataset(tmp_path / "cache"))
    batches = [
        collate_rollouts(items),
        collate_rollouts(plain(items)),
        next(iter(RolloutIterableDataset(tmp_path / "cache", batch_size=4))),
    ]
    for batch in batches:
        assert batch["h"] == hashes
        assert batch["n"].dtype == torch.int64 and batch["n"].tolist() == small
    assert collate_rollouts(plain(items[1:3]))["h"].tolist() == hashes[1:3]  # these fit


@pytest.mark.parametrize("pad_value", [0, -1, -0.0])
def test_batches_in_reused_worker_buffers_pad_as_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pad_value: float
) -> None:
    where = jagged_steps(tmp_path / "cache")
    kw: dict[str, Any] = {"columns": ["hidden", "ids"], "shuffle": True}
    wants = []
    for seed in range(3):  # each round's rows in another order, so a reused buffer holds others
        items = list(RolloutIterableDataset(where, seed=seed, **kw))
        wants.append([collate_rollouts(plain(items[i : i + 3]), pad_value=pad_value) for i in range(0, 9, 3)])
        for i, w in zip(range(0, 9, 3), wants[-1], strict=True):  # the items padded as torch pads them
            for name in ("hidden", "ids"):
                rows = [it[name].to(w[name].dtype) for it in items[i : i + 3]]
                assert torch.equal(pad_sequence(rows, batch_first=True, padding_value=pad_value), w[name])
    assert {w["ids"].dtype for w in wants[0]} == {torch.int64} and wants[0][0]["hidden"].dtype == torch.bfloat16
    monkeypatch.setattr(collate_module, "get_worker_info", lambda: object())  # as a worker: its buffers
    monkeypatch.setattr(shm, "_LENDER", None)
    for seed, want in enumerate(wants):  # new buffers, then the same ones, dirty with earlier batches
        ds = RolloutIterableDataset(where, seed=seed, batch_size=3, pad_value=pad_value, **kw)
        got = [ForkingPickler.loads(ForkingPickler.dumps(b)) for b in ds]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
        del got, g
        gc.collect()
    assert len(shm.lender().buffers) == 3  # those of the first round (each batch's, while held) reused


def test_collate_refuses_what_is_not_a_list_of_items() -> None:
    row = {"row": 0, "x": torch.ones(2)}
    with pytest.raises(ConfigTypeError, match="takes a list of items .* got a dict; .*batch_size=None"):
        collate_rollouts(row)  # type: ignore[arg-type]  # a batch a user's dataset made itself
    with pytest.raises(ConfigTypeError, match="item 1 is a Tensor, not a dict of columns"):
        collate_rollouts([row, torch.ones(2)])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"item 2 has other columns than item 0 \(differing: \['y'\]\)"):
        collate_rollouts([row, row, {**row, "y": 1}])
    assert collate_rollouts([]) == {}
    batch = collate_rollouts([row, row])
    with pytest.raises(ConfigError, match=r"item 0 is a whole batch .* DataLoader\(ds, batch_size=None"):
        collate_rollouts([batch, batch])  # a DataLoader(batch_size=4) over a dataset of batches


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"seed": "a"}, ConfigTypeError, "seed: expected an int, got str 'a'"),
        ({"shuffle": "yes"}, ConfigTypeError, "shuffle: expected True or False"),
        ({"drop_last": "x", "batch_size": 3}, ConfigTypeError, "drop_last: expected True or False"),
        ({"block_rows": "x"}, ConfigTypeError, "block_rows: expected an int"),
        ({"block_rows": 0}, ConfigError, "block_rows: expected an int in 1 .."),
        ({"buffer_blocks": 2.5}, ConfigTypeError, "buffer_blocks: expected an int, got float 2.5"),
        ({"buffer_blocks": "3"}, ConfigTypeError, "buffer_blocks: expected an int, got str '3'"),
        ({"buffer_blocks": 0}, ConfigError, "buffer_blocks: expected an int in 1 .."),
        ({"rank": 1.0, "world_size": 2}, ConfigTypeError, "rank: expected an int, got float"),
        ({"rank": True, "world_size": 2}, ConfigTypeError, "rank: expected an int, got bool"),
        ({"rank": -1, "world_size": 2}, ConfigError, "rank: expected an int in 0 .."),
        ({"rank": 0, "world_size": "2"}, ConfigTypeError, "world_size: expected an int, got str"),
        ({"rank": 0, "world_size": 0}, ConfigError, "world_size: expected an int in 1 .."),
        ({"rank": 2, "world_size": 2}, ConfigError, r"rank=2, world_size=2: need .* 0 <= rank < world_size"),
        ({"pad_value": "x", "batch_size": 4}, ConfigTypeError, "pad_value: expected a number, got str"),
        ({"pad_value": True}, ConfigTypeError, "pad_value: expected a number, got bool"),
        ({"columns": "responses"}, ConfigTypeError, r"columns: expected a list .* \(wrap one name in a list\)"),
        ({"steps": "12"}, ConfigTypeError, "steps: expected a step"),
        ({"experiment": 5}, ConfigTypeError, r"experiment: expected a name \(a str\), got int 5"),
        ({"experiment": ""}, ConfigError, "experiment: expected a name, got an empty str"),
        ({"storage_options": "anon"}, ConfigTypeError, "storage_options: expected a mapping"),
        ({"storage_options": [("anon", True)]}, ConfigTypeError, "storage_options: expected a mapping"),
        ({"steps": [1.5]}, ConfigTypeError, "steps: expected an int, got float"),
    ],
)
def test_bad_arguments_are_typed_errors_naming_them(local: Path, kw: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        RolloutIterableDataset(local, **kw)
    if "pad_value" in kw:
        with pytest.raises(error, match=match):
            collate_rollouts([{"x": torch.ones(2)}], pad_value=kw["pad_value"])


def test_set_epoch_takes_an_int(local: Path) -> None:
    ds = RolloutIterableDataset(local, shuffle=True)
    with pytest.raises(ConfigTypeError, match="epoch: expected an int"):
        ds.set_epoch("1")  # type: ignore[arg-type]
    ds.set_epoch(np.int64(2))  # type: ignore[arg-type]
    assert ds.epoch == 2


def test_torch_default_collate_takes_the_batches_too(local: Path) -> None:
    """``DataLoader(batch_size=None)`` without ``collate_fn``: torch's ``default_convert``
    copies each batch in the worker (``copy.copy``), which must not go through the pickling
    that lends the worker's shared buffers (it raised AttributeError there)."""
    ds = RolloutIterableDataset(local, columns=COLUMNS, batch_size=5)
    ours = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=collate_rollouts))
    theirs = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(theirs) == len(ours) == 8
    for got, want in zip(theirs, ours, strict=True):
        assert isinstance(got, RolloutBatch)
        assert_same(got, want)
    batch = next(iter(ds))
    for copied in (copy.copy(batch), copy.deepcopy(batch)):
        assert type(copied) is RolloutBatch and copied is not batch
        assert_same(copied, batch)
    deep = copy.deepcopy(batch)
    deep["responses"].zero_()
    assert bool(batch["responses"].any())  # a deep copy owns its tensors


def test_every_configuration_gives_each_row_once_and_len_batches(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks, workers (simulated in this process), batch sizes, block and buffer sizes, shuffle
    and drop_last together: each rank's workers yield exactly ``len()`` batches, every row once
    across the ranks (drop_last: all but each rank's last short batch), none short but the last."""
    import zarr_skip.data._iterable as iterable

    monkeypatch.setattr(iterable, "_settle_worker", lambda: None)  # not this test process's gc or malloc
    rng = np.random.default_rng(0)
    for _ in range(24):
        world, workers, size = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 12))
        shuffle, drop_last = bool(rng.integers(2)), bool(rng.integers(2))
        block_rows, buffer_blocks = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        seen: list[tuple[int, int]] = []
        for rank in range(world):
            ds = RolloutIterableDataset(
                local, columns=["uid"], rank=rank, world_size=world, batch_size=size, shuffle=shuffle,
                drop_last=drop_last, block_rows=block_rows, buffer_blocks=buffer_blocks, seed=5,
            )  # fmt: skip
            batches = []
            for worker in range(workers):
                info = type("Info", (), {"num_workers": workers, "id": worker})()
                monkeypatch.setattr(iterable, "get_worker_info", lambda info=info: info)
                batches += [b for b in ds]
            sizes = [len(b["row"]) for b in batches]
            assert len(batches) == len(ds), (world, workers, size, rank)
            assert sizes.count(size) >= len(sizes) - 1 and (not drop_last or set(sizes) <= {size})
            seen += [(int(s), int(r)) for b in batches for s, r in zip(b["step"], b["row"], strict=True)]
        assert len(seen) == len(set(seen)) and set(seen) <= set(ALL_ROWS)
        if not drop_last:
            assert sorted(seen) == ALL_ROWS


@pytest.mark.parametrize(
    ("dtype", "pad_value"), [(torch.uint8, -1), (torch.int64, 2.5), (torch.bool, -100), (torch.int8, 300)]
)
def test_a_pad_value_an_exact_column_would_change_is_a_config_error(dtype: torch.dtype, pad_value: float) -> None:
    """torch's fill_ wraps -1 into uint8 as 255, cuts 2.5 to 2 in int64 and makes -100 True in a
    bool mask, silently: the padding then reads as data."""
    items = [{"mask": torch.ones(3, dtype=dtype)}, {"mask": torch.ones(1, dtype=dtype)}]
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ConfigError, match=f"pad_value={pad_value!r}: column 'mask' holds {name}"):
        collate_rollouts(items, pad_value=pad_value)
    kept = collate_rollouts(items, pad_value=0)  # a value the column holds as it is
    assert kept["mask"].dtype == dtype and kept["mask"][1, 1:].tolist() == [0, 0]
