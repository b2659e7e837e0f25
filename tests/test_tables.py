"""Steps and caches as pandas tables: contents against load(), what is read, rounds of requests."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FINGERPRINT, CountingStore, make_batch

import zarr_skip as zs
from zarr_skip.store.storage import Storage

pd = pytest.importorskip("pandas")


def _write(location: Any, steps: range = range(1, 4), parts: int = 2) -> zs.Cache:
    cache = zs.open_cache(location, dict(FINGERPRINT))
    for step in steps:
        for i in range(parts):
            batch = make_batch(5 + i, seed=10 * step + i, offset=100 * step + 10 * i)
            batch["bf16_scalar"] = torch.randn(5 + i).bfloat16()
            cache.write(step, batch, expected=parts)
    return cache


def test_table_matches_load() -> None:
    cache = _write(CountingStore())
    table = cache.table()
    assert list(table.columns) == [
        "step", "minibatch", "row", "responses", "uid", "tags", "raw_prompt", "scores", "bf16_scalar"
    ]  # fmt: skip
    assert len(table) == sum(len(cache.load(s)) for s in cache.steps())
    for step in cache.steps():
        view = cache.load(step)
        mine = table[table["step"] == step]
        assert mine["row"].tolist() == list(range(len(view)))
        assert mine["minibatch"].tolist() == [p.index for p in view._parts for _ in range(p.rows)]
        assert mine["responses"].tolist() == view["responses"].lengths().tolist()
        assert mine["uid"].tolist() == list(view["uid"][:])
        assert mine["tags"].tolist() == list(view["tags"][:])
        assert mine["raw_prompt"].tolist() == [list(r) for r in view["raw_prompt"][:]]
        assert mine["scores"].dtype == np.float32 and np.array_equal(mine["scores"].to_numpy(), view["scores"][:])
        bf16 = view["bf16_scalar"][:].float().numpy()
        assert mine["bf16_scalar"].dtype == np.float32 and np.array_equal(mine["bf16_scalar"].to_numpy(), bf16)
        assert_frame_equal(view.to_pandas(), mine.reset_index(drop=True))


def assert_frame_equal(a: Any, b: Any) -> None:
    pd.testing.assert_frame_equal(a, b)


def test_columns_and_steps_choose_what_is_read() -> None:
    cache = _write(CountingStore())
    table = cache.table(columns=["scores", "responses"], steps=[3, 1])
    assert list(table.columns) == ["step", "minibatch", "row", "scores", "responses"]
    assert table["step"].unique().tolist() == [3, 1]  # in the order asked for
    with pytest.raises(zs.ConfigError, match="input_ids"):
        cache.table(columns=["input_ids"])
    with pytest.raises(KeyError, match="nope"):
        cache.table(columns=["nope"])
    with pytest.raises(zs.StepNotFoundError):
        cache.table(steps=[9])


def test_jagged_columns_read_their_lengths_never_their_values() -> None:
    store = CountingStore()
    cache = _write(store)
    cache = zs.open_cache(store)
    store.reads.clear()
    table = cache.table()
    assert len(table) == 33
    chunks = {k for k in store.reads if "/w-" in k and not k.endswith("zarr.json")}
    columns = {k.split("/w-")[1].split("/")[1] for k in chunks}
    assert columns == {"responses", "uid", "tags", "raw_prompt", "scores", "bf16_scalar"}
    assert not [k for k in chunks if "/responses/" in k and "/lengths/" not in k], "read jagged values"
    assert not [k for k in store.reads if "/input_ids" in k or "/attention_mask" in k]
    store.reads.clear()
    cache.table(columns=["responses"])
    assert {k.split("/w-")[1].split("/", 1)[1] for k in store.reads if "/w-" in k} == {"responses/lengths/c.0"}


def test_steps_of_other_schemas_and_incomplete_steps() -> None:
    cache = _write(CountingStore(), range(1, 3))
    cache.write(3, {"scores": np.arange(4, dtype=np.float32), "extra": ["a", "b", "c", "d"]})
    cache.write(4, make_batch(3), expected=2)  # incomplete: left out
    table = cache.table(columns=["scores", "extra", "uid"])
    assert table["step"].unique().tolist() == [1, 2, 3]
    third = table[table["step"] == 3]
    assert third["scores"].tolist() == [0.0, 1.0, 2.0, 3.0] and third["extra"].tolist() == ["a", "b", "c", "d"]
    assert all(v is None or (isinstance(v, float) and math.isnan(v)) for v in third["uid"])
    assert table[table["step"] == 1]["extra"].isna().all()
    with pytest.raises(zs.IncompleteStepError):
        cache.table(steps=[4])
    assert len(zs.open_cache(CountingStore(), dict(FINGERPRINT)).table()) == 0


def test_large_json_columns_are_left_out_unless_asked_for() -> None:
    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT))
    cache.write(1, {"small": [{"a": i} for i in range(4)], "big": [{"text": "x" * 2000}] * 4})
    assert list(cache.table().columns) == ["step", "minibatch", "row", "small"]
    assert cache.table(columns=["big"])["big"].tolist() == [{"text": "x" * 2000}] * 4


def test_a_table_of_many_steps_waits_for_a_few_rounds(location: Any, monkeypatch: Any) -> None:
    """However many steps: the step listing, the steps' listings with their summaries, their
    mini-batch records, then every column's chunks, each one round of requests."""
    cache = _write(location, range(1, 7), parts=2)
    rounds: list[int] = []
    real = Storage.run
    monkeypatch.setattr(Storage, "run", lambda self, coro: rounds.append(1) or real(self, coro))
    local = cache.storage.root is not None
    for steps in ([2, 5], None):
        rounds.clear()
        table = cache.table(steps=steps)
        assert len(table) == 11 * (2 if steps else 6)
        assert len(rounds) == (0 if local else 3 if steps else 4), rounds  # local files: no event loop


def test_a_missing_pandas_names_the_extra(monkeypatch: Any) -> None:
    cache = _write(CountingStore(), range(1, 2))
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas -> ImportError
    with pytest.raises(zs.MissingExtraError, match=r"zarr-skip\[pandas\]") as err:
        cache.table()
    assert isinstance(err.value, ImportError)
    with pytest.raises(zs.MissingExtraError, match=r"zarr-skip\[pandas\]"):
        cache.load(1).to_pandas()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cyclic_gc_is_paused_while_a_table_is_built_and_restored_after(enabled: bool, monkeypatch: Any) -> None:
    """The records of many steps are many small containers: the cyclic collector is paused
    while they are read and put together, and left as it was, also after an error."""
    import gc

    from zarr_skip import tables

    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT))
    cache.write(1, make_batch(4, seed=1))
    seen: list[bool] = []
    real = tables.views_table
    monkeypatch.setattr(tables, "views_table", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k))
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        assert len(cache.table()) == 4
        assert seen == [False] and gc.isenabled() is enabled
        with pytest.raises(KeyError):
            cache.table(columns=["no such column"])
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
