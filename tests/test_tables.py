"""Steps and caches as pandas tables: contents against load(), what is read, rounds of requests."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FINGERPRINT, CountingStore, make_batch

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


def test_table_matches_load(location: Any) -> None:
    cache = _write(location)
    table = cache.table()
    assert list(table.columns) == [
        "step", "minibatch", "row", "uid", "response_length", "truncated", "tags", "raw_prompt", "scores", "bf16_scalar"
    ]  # fmt: skip
    assert len(table) == sum(len(cache.load(s)) for s in cache.steps())
    for step in cache.steps():
        view = cache.load(step)
        mine = table[table["step"] == step]
        assert mine["row"].tolist() == list(range(len(view)))
        assert mine["minibatch"].tolist() == [p.index for p in view._parts for _ in range(p.rows)]
        assert mine["response_length"].tolist() == view["responses"].lengths().tolist()
        assert mine["truncated"].tolist() == [n >= FINGERPRINT["max_response_length"] for n in mine["response_length"]]
        assert mine["uid"].tolist() == list(view["uid"][:])
        assert mine["tags"].tolist() == list(view["tags"][:])
        assert mine["raw_prompt"].tolist() == [list(r) for r in view["raw_prompt"][:]]
        assert mine["scores"].dtype == np.float32 and np.array_equal(mine["scores"].to_numpy(), view["scores"][:])
        bf16 = view["bf16_scalar"][:].float().numpy()
        assert mine["bf16_scalar"].dtype == np.float32 and np.array_equal(mine["bf16_scalar"].to_numpy(), bf16)
        assert_frame_equal(view.to_pandas(), mine.reset_index(drop=True))


def assert_frame_equal(a: Any, b: Any) -> None:
    pd.testing.assert_frame_equal(a, b)


def test_columns_and_steps_choose_what_is_read(location: Any) -> None:
    cache = _write(location)
    table = cache.table(columns=["scores", "responses"], steps=[3, 1])
    assert list(table.columns) == ["step", "minibatch", "row", "response_length", "scores"]
    assert table["step"].unique().tolist() == [3, 1]  # in the order asked for
    with pytest.raises(zs.ConfigError, match="input_ids"):
        cache.table(columns=["input_ids"])
    with pytest.raises(KeyError, match="nope"):
        cache.table(columns=["nope"])
    with pytest.raises(zs.StepNotFoundError):
        cache.table(steps=[9])


def test_jagged_columns_read_their_lengths_never_their_values() -> None:
    store = CountingStore()  # memory only: it counts the keys read
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


def test_jagged_lengths_the_records_keep_are_read_from_no_chunk() -> None:
    store = CountingStore()
    cache = zs.open_cache(store, dict(FINGERPRINT), chunk_bytes=32)  # token ids in several chunks
    batches = [make_batch(6, seed=i) for i in range(2)]
    for b in batches:
        cache.write(1, b, expected=2)
    view = zs.open_cache(store).load(1)
    assert all(p.arrays["responses"]["lengths"].value_ends is not None for p in view._parts)
    store.reads.clear()
    table = zs.open_cache(store).table(columns=["responses"])
    assert table["response_length"].tolist() == [len(r) for b in batches for r in b["responses"].unbind()]
    assert not [k for k in store.reads if "/responses/" in k], sorted(store.reads)


def test_steps_of_other_schemas_and_incomplete_steps(location: Any) -> None:
    cache = _write(location, range(1, 3))
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


def test_large_json_columns_are_left_out_unless_asked_for(location: Any) -> None:
    cache = zs.open_cache(location, dict(FINGERPRINT))
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


# ------------------------------------------------------------------ names that do not lie


def _text_cache() -> zs.Cache:
    from zarr_skip.synthetic import text_rollouts

    cache = zs.open_cache(CountingStore(), {"experiment_name": "names", "n": 4, "max_response_length": 48})
    cache.write(1, text_rollouts(3, 4, seed=1, step=1, max_response=48))
    cache.write(2, text_rollouts(3, 4, seed=1, step=2, max_response=48, padded=True))
    return cache


def _unpadded(view: Any, name: str) -> list[np.ndarray]:
    """``name``'s rows from load(), padding cut by the response mask."""
    col = view[name][:]
    if getattr(col, "is_nested", False):
        return [r.float().numpy() for r in col.unbind()]
    mask = view["response_mask"][:].bool()
    return [r[m].float().numpy() for r, m in zip(col, mask, strict=True)]


def test_token_columns_are_reduced_by_the_schema_and_lengths_are_named_len() -> None:
    cache = _text_cache()
    table = cache.table(reduce={"old_log_probs": "mean", "token_level_scores": "max"})
    names = list(table.columns)
    assert names[:12] == [
        "step", "minibatch", "row", "uid", "data_source", "prompt_length", "response_length", "truncated",
        "score", "reward", "acc", "advantage",
    ]  # fmt: skip
    for jagged in ("advantages", "old_log_probs", "token_level_scores", "token_level_rewards", "responses"):
        assert jagged not in names  # never the column's name for something else
    assert "advantages_len" in names and "old_log_probs_mean" in names and "token_level_scores_max" in names
    for step in (1, 2):
        view, mine = cache.load(step), table[table["step"] == step]
        adv = _unpadded(view, "advantages")
        assert mine["advantage"].to_numpy() == pytest.approx([float(np.mean(r)) for r in adv])
        scores = _unpadded(view, "token_level_scores")
        assert mine["score"].tolist() == pytest.approx([float(view["score"][i]) for i in range(len(view))])
        assert mine["reward"].tolist() == pytest.approx(
            [float(np.sum(r)) for r in _unpadded(view, "token_level_rewards")]
        )
        assert mine["token_level_scores_max"].tolist() == pytest.approx([float(np.max(r)) for r in scores])
        logp = _unpadded(view, "old_log_probs")
        assert mine["old_log_probs_mean"].tolist() == pytest.approx([float(np.mean(r)) for r in logp], rel=1e-6)
        lengths = [len(r) for r in _unpadded(view, "responses")]
        assert mine["response_length"].tolist() == lengths
        assert mine["truncated"].tolist() == [n >= 48 for n in lengths]
        assert mine["acc"].tolist() == list(view["acc"][:])
    assert table["advantage"].dtype == np.float64 and table["advantages_len"].dropna().gt(0).all()


def test_a_stored_score_is_the_score_and_sums_only_stand_in() -> None:
    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT))
    values = torch.tensor([0.5, 1.5, 2.0, 0.0, 1.0, 3.0])
    per_token = torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 2, 3, 6]))
    cache.write(1, {"token_level_scores": per_token, "token_level_rewards": per_token})
    cache.write(2, {"token_level_scores": per_token, "score": np.array([7.0, 8.0, 9.0])})
    table = cache.table()
    assert table[table["step"] == 1]["score"].tolist() == [2.0, 2.0, 4.0]  # the row sums
    assert table[table["step"] == 1]["reward"].tolist() == [2.0, 2.0, 4.0]
    assert table[table["step"] == 2]["score"].tolist() == [7.0, 8.0, 9.0]  # the stored column
    assert "zs_score" not in table


def test_stored_columns_named_like_computed_ones_keep_their_names() -> None:
    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT))
    batch = make_batch(4, seed=1)
    batch.update(row=np.arange(10, 14), truncated=["yes", "no", "no", "yes"], reward=np.array([1.0, 0.0, 1.0, 0.5]))
    batch["responses_len"] = np.array([-1, -2, -3, -4])
    cache.write(1, batch)
    table = cache.table()
    assert table["row"].tolist() == [10, 11, 12, 13] and table["zs_row"].tolist() == [0, 1, 2, 3]
    assert table["truncated"].tolist() == ["yes", "no", "no", "yes"]
    assert table["zs_truncated"].tolist() == [n >= 16 for n in cache.load(1)["responses"].lengths()]
    assert table["reward"].tolist() == [1.0, 0.0, 1.0, 0.5]
    batch = make_batch(4, seed=1)
    batch.update(row=np.arange(4), zs_row=np.arange(4))
    cache.write(2, batch)
    with pytest.raises(zs.SchemaMismatchError, match="'row' and its other name 'zs_row'"):
        cache.table(steps=[2])


def test_reductions_are_checked_before_anything_is_read() -> None:
    cache = _text_cache()
    with pytest.raises(zs.ConfigError, match="median"):
        cache.table(reduce={"advantages": "median"})
    with pytest.raises(zs.ConfigError, match="'uid'.*no numbers per token"):
        cache.table(reduce={"uid": "mean"})
    with pytest.raises(zs.ConfigTypeError):
        cache.table(reduce=["advantages"])  # type: ignore[arg-type]
    assert cache.load(1).to_pandas(["row"], reduce={"advantages": "first"})["advantages_first"].notna().all()


def test_a_padded_step_of_no_rows_is_a_table_of_no_rows() -> None:
    """A padded step with no rows: its mask could not be reshaped (a bare ValueError from
    to_pandas, and from cache.table for the whole cache)."""
    from zarr_skip.synthetic import Preset, padded_batch

    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT))
    cache.write(1, padded_batch(Preset(rows=4, max_prompt=8, max_response=16, n=4), seed=1, step=1))
    cache.write(2, {name: value[:0] for name, value in cache.load(1).to_dict().items()})
    empty = cache.load(2).to_pandas(reduce={"old_log_probs": "mean"})
    assert len(empty) == 0 and "response_length" in empty and "old_log_probs_mean" in empty
    assert cache.table()["step"].tolist() == [1, 1, 1, 1]


def test_a_mask_narrower_than_its_column_is_not_used() -> None:
    cache = zs.open_cache(CountingStore(), dict(FINGERPRINT))
    responses = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    cache.write(1, {"responses": responses, "response_mask": torch.ones(2, 2, dtype=torch.int64)})
    cache.write(2, {"responses": responses, "response_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])})
    table = cache.table()
    assert table["response_length"].tolist() == [4, 4, 2, 1]  # the whole row; then the mask's count


def test_steps_is_checked_as_export_checks_it(location: Any) -> None:
    """One step as an int (as export and rescore take it); a bad one a typed error naming steps."""
    cache = _write(location, range(1, 3))
    assert cache.table(steps=2)["step"].unique().tolist() == [2]
    with pytest.raises(zs.ConfigTypeError, match="steps: expected a step"):
        cache.table(steps="1")
    with pytest.raises(zs.ConfigTypeError, match="steps: expected an int, got float"):
        cache.table(steps=[1.0])
    with pytest.raises(zs.ConfigError, match="steps: expected non-negative ints, got -1"):
        cache.table(steps=[-1])


def test_a_step_named_twice_is_in_the_table_once(location: Any) -> None:
    cache = _write(location, range(1, 3))
    table = cache.table(steps=[2, 1, 2])
    assert table["step"].tolist() == [2] * len(cache.load(2)) + [1] * len(cache.load(1))
