"""Repeated rows stored once: dictionary encoding of jagged columns, written and read back."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from helpers import CountingStore, assert_equal, concat, make_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zarr_skip as zs
from zarr_skip.format import dictionary
from zarr_skip.format.columns import encode_column
from zarr_skip.format.restore import restore


def _roundtrip(col: Any) -> Any:
    widened = {
        k: v.astype(np.int64 if k in ("lengths", "codes") else col.spec.storage_dtype) for k, v in col.arrays.items()
    }
    return restore(col.spec, widened, allow_pickle=True)


def _nested(rows: list[list[int]]) -> torch.Tensor:
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    values = torch.tensor([v for r in rows for v in r], dtype=torch.int64)
    return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)


def _grpo_rows(n_groups: int, n: int) -> dict[str, Any]:
    """Per-row objects as verl's repeat(interleave=True) leaves them: the n rows of a group are
    the same Python objects."""
    prompts = [{"role": "user", "content": f"question {g} " + "x" * 200} for g in range(n_groups)]
    extra = [{"index": g, "question": f"q{g}", "answer": str(g * 7)} for g in range(n_groups)]
    obj = np.empty(n_groups * n, dtype=object)
    for i in range(n_groups * n):
        obj[i] = [prompts[i // n]]
    return {
        "raw_prompt": obj,
        "extra_info": [extra[i // n] for i in range(n_groups * n)],
        "uid": [f"uid-{i // n}" for i in range(n_groups * n)],  # equal strings, distinct objects
        "data_source": ["openai/gsm8k"] * (n_groups * n),
        "prompts": _nested([[g, g + 1, g + 2, 7] for g in range(n_groups) for _ in range(n)]),
        "responses": _nested([list(range(i, i + i % 5 + 1)) for i in range(n_groups * n)]),
    }


def test_shared_and_equal_rows_are_stored_once() -> None:
    rows = _grpo_rows(4, 8)
    for name in ("raw_prompt", "extra_info", "uid", "data_source", "prompts"):
        col = encode_column(name, rows[name])
        assert "codes" in col.arrays, name
        codes = np.asarray(col.arrays["codes"])
        assert len(codes) == 32 and col.arrays["lengths"].shape[0] == (1 if name == "data_source" else 4), name
        assert_equal(_roundtrip(col), rows[name], name)
    plain = encode_column("responses", rows["responses"])  # rows differ within a group
    assert "codes" not in plain.arrays


def test_repeated_per_row_numpy_arrays_roundtrip() -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((1, 2), np.float32)
    rows = np.empty(5, dtype=object)
    for i, r in enumerate([a, a, b, a.copy(), b]):
        rows[i] = r
    col = encode_column("r", rows)
    assert list(np.asarray(col.arrays["codes"])) == [0, 0, 1, 0, 1]
    back = _roundtrip(col)
    assert [x.tolist() for x in back] == [x.tolist() for x in rows] and back[0] is not back[1]


def test_a_dictionary_is_used_only_when_it_pays() -> None:
    assert "codes" not in encode_column("u", ["a", "b", "c", "a"]).arrays  # 3 distinct of 4
    assert "codes" in encode_column("u", ["a", "b", "a", "b"]).arrays
    assert "codes" not in encode_column("u", ["a"]).arrays


def test_equal_token_rows_differing_in_a_middle_value_are_not_merged() -> None:
    rows = [[1, 2, 3, 4, 5], [1, 2, 9, 4, 5], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
    col = encode_column("p", _nested(rows))
    assert list(np.asarray(col.arrays["codes"])) == [0, 1, 0, 0]
    assert [r.tolist() for r in _roundtrip(col).unbind()] == rows


def test_float_rows_compare_by_bits() -> None:
    nan2 = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)[0]
    rows = [[0.0, np.nan], [-0.0, np.nan], [0.0, np.nan], [0.0, nan2]]
    values = torch.tensor(np.array(rows, dtype=np.float32).reshape(-1))
    nt = torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 2, 4, 6, 8]))
    codes, entries = dictionary.repeated_rows(values.numpy(), np.array([2, 2, 2, 2])) or (None, None)
    assert codes is None  # -0.0, 0.0 and two NaN payloads: 3 distinct of 4, no dictionary
    assert_equal(_roundtrip(encode_column("f", nt)), nt)


pool_str = st.lists(st.text(max_size=8), min_size=1, max_size=4)
pool_json = st.lists(
    st.dictionaries(st.text(max_size=3), st.integers(-5, 5) | st.none() | st.text(max_size=3), max_size=3),
    min_size=1,
    max_size=4,
)
pool_tokens = st.lists(st.lists(st.integers(0, 2**40), max_size=5), min_size=1, max_size=4)


@given(
    st.one_of(
        pool_str.map(lambda p: ("str", p)), pool_json.map(lambda p: ("json", p)), pool_tokens.map(lambda p: ("tok", p))
    ),
    st.lists(st.integers(0, 3), min_size=1, max_size=24),
    st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_rows_drawn_from_a_small_pool_roundtrip(pool: tuple[str, list[Any]], picks: list[int], shared: bool) -> None:
    kind, values = pool
    chosen = [values[i % len(values)] for i in picks]
    if not shared:  # equal values, distinct objects
        chosen = [type(v)(v) if isinstance(v, (list, dict)) else v for v in chosen]
    value: Any = _nested(chosen) if kind == "tok" else chosen
    col = encode_column("c", value, allow_pickle=True)
    if len(picks) >= 2 and len({repr(v) for v in chosen}) <= len(picks) / 2:
        assert "codes" in col.arrays
    assert_equal(_roundtrip(col), value)


def _step(location: Any, fingerprint: dict[str, Any], plain_first: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Step 1: a mini-batch written plain (as zarr_skip before dictionaries) and one
    dictionary-encoded, or the other way round."""
    batches = [_grpo_rows(3, 4), _grpo_rows(2, 4)]
    cache = zs.open_cache(location, fingerprint, chunk_bytes=64)
    for i, b in enumerate(batches):
        with monkeypatch.context() as m:
            if (i == 0) == plain_first:
                m.setattr(dictionary, "MAX_DISTINCT_SHARE", 0.0)
            cache.write(1, b, expected=2)
    return cache, batches


@pytest.mark.parametrize("plain_first", [True, False])
def test_a_step_mixing_plain_and_dictionary_minibatches_reads_exactly(
    tmp_path: Any, fingerprint: dict[str, Any], plain_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, batches = _step(tmp_path / "c", fingerprint, plain_first, monkeypatch)
    view = zs.open_cache(tmp_path / "c").load(1)
    kinds = [("codes" in p.arrays["raw_prompt"]) for p in view._parts]
    assert kinds == [not plain_first, plain_first]
    want = concat(batches)
    assert_equal(view.to_dict(), want)
    for name in ("raw_prompt", "extra_info", "uid", "data_source", "prompts", "responses"):
        col, full = view[name], want[name]
        assert_equal(col[:], full, name)
        every = full.unbind() if isinstance(full, torch.Tensor) else list(full)
        for i in (0, 5, 11, 12, 19, -1):
            assert_equal(col[i], every[i], f"{name}[{i}]")
        for a, b in ((3, 15), (12, 20), (0, 1), (7, 7)):
            sub = col[a:b]
            got = sub.unbind() if isinstance(sub, torch.Tensor) else list(sub)
            assert len(got) == b - a
            for j, g in enumerate(got):
                assert_equal(g, every[a + j], f"{name}[{a}:{b}][{j}]")
        picked = col[[19, 0, 13, 13, 4]]
        got = picked.unbind() if isinstance(picked, torch.Tensor) else list(picked)
        for g, i in zip(got, [19, 0, 13, 13, 4], strict=True):
            assert_equal(g, every[i], f"{name}[[...{i}]]")
        for g, want_row in zip(list(col), every, strict=True):  # iteration
            assert_equal(g, want_row, f"{name} iterated")
        as_array = np.asarray(col)
        assert as_array.shape[0] == len(every) and as_array.dtype == object
        for g, want_row in zip(as_array, every, strict=True):
            assert_equal(g, want_row.numpy() if isinstance(want_row, torch.Tensor) else want_row, f"{name} asarray")
        lengths = np.array([len(r) if not isinstance(r, str) else len(r.encode()) for r in every])
        if name in ("prompts", "responses", "uid", "data_source"):
            assert np.array_equal(col.lengths(), lengths), name
    table = view.to_pandas()
    assert table["uid"].tolist() == want["uid"] and table["data_source"].tolist() == want["data_source"]
    assert table["prompt_length"].tolist() == [len(r) for r in want["prompts"].unbind()]


def test_repeated_rows_come_back_as_one_object_each_and_cost_less(tmp_path: Any, fingerprint: dict[str, Any]) -> None:
    batch = _grpo_rows(16, 8)
    cache = zs.open_cache(tmp_path / "c", fingerprint)
    cache.write(1, batch)
    col = cache.load(1)["extra_info"]
    rows = col[:]
    assert rows[0] is rows[7] and rows[0] is not rows[8]  # decoded once per group, as torch.save shares
    for got in (np.asarray(col), np.asarray(cache.load(1)["uid"])):  # so does np.asarray
        assert got.dtype == object and got[0] is got[7] and got[0] is not got[8]
    assert np.asarray(cache.load(1)["uid"], dtype=str).tolist() == batch["uid"]
    entry = cache.load(1)._parts[0].arrays["extra_info"]
    assert entry["values"].rows < sum(len(str(r)) for r in batch["extra_info"]) / 4


def test_a_row_read_of_a_dictionary_column_reads_its_minibatch_only(fingerprint: dict[str, Any]) -> None:
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint, chunk_bytes=64)
    cache.write(1, _grpo_rows(8, 4), expected=2)
    cache.write(1, _grpo_rows(8, 4), expected=2)
    view = zs.open_cache(store).load(1)
    col = view["raw_prompt"]
    values = view._parts[1].arrays["raw_prompt"]["values"]
    assert values.shard and len(values.sizes) > 3
    store.reads.clear()
    assert_equal(col[33], _grpo_rows(8, 4)["raw_prompt"][1])
    read = {k for k in store.reads if "/c." in k}
    assert all(f"/{view._parts[1].index}/" in k for k in read)  # nothing of mini-batch 0
    assert {k for k in read if "/values/" in k} == {f"{values.path}/c.0"}  # one shard, a ranged read
    assert len([k for k in read if "/values/" not in k]) == 2  # its codes and lengths


def test_old_caches_without_dictionaries_read_and_the_version_is_3(
    tmp_path: Any, fingerprint: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dictionary, "MAX_DISTINCT_SHARE", 0.0)
    batch = make_batch(8)
    cache = zs.open_cache(tmp_path / "c", fingerprint)
    cache.write(1, batch)
    assert all("codes" not in a for a in cache.load(1)._parts[0].arrays.values())
    monkeypatch.undo()
    assert_equal(zs.open_cache(tmp_path / "c").load(1).to_dict(), batch)
    from zarr_skip.format import layout

    assert layout.FORMAT_VERSION == 4


@given(st.lists(st.integers(0, 5), min_size=2, max_size=40), st.integers(1, 3))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_dictionary_rows_through_a_cache(
    tmp_path_factory: pytest.TempPathFactory, fingerprint: dict[str, Any], picks: list[int], minibatches: int
) -> None:
    pool = [f"text {i} " * i for i in range(6)]
    location = tmp_path_factory.mktemp("h")
    cache = zs.open_cache(location, fingerprint, chunk_bytes=32)
    batches = []
    for m in range(minibatches):
        rows = [pool[p] for p in picks[m:]]
        batches.append({"t": rows, "tok": _nested([[p] * p for p in picks[m:]])})
        cache.write(1, batches[-1], expected=minibatches)
    view = cache.load(1)
    want = concat(batches)
    assert_equal(view.to_dict(), want)
    n = len(view)
    for i in range(n):
        assert view["t"][i] == want["t"][i]
    assert_equal(view["t"][1:n], want["t"][1:n])


def test_token_rows_alike_at_the_sampled_places_are_still_grouped(monkeypatch: pytest.MonkeyPatch) -> None:
    # equal in length and at every probed place (dictionary.PROBES values spread over the row):
    # the cheap signature cannot tell them apart, the signature of all values must
    calls: list[int] = []
    content = dictionary._content
    monkeypatch.setattr(dictionary, "_content", lambda *a: calls.append(1) or content(*a))
    a, b = [0] * 20, [0] * 20
    a[1] = 1  # probes of a 20-value row: 0, 2, 5, 8, 10, 13, 16, 19
    rows = [a, b, b, b, a, b]
    col = encode_column("c", _nested(rows))
    assert calls and np.asarray(col.arrays["codes"]).tolist() == [0, 1, 1, 1, 0, 1]
    assert_equal(_roundtrip(col), _nested(rows))
    # the rows of GRPO groups (equal neighbours) are grouped by the cheap signature alone
    calls.clear()
    groups = [[g, 7, g * 3, 1, 2] + [g] * g for g in range(1, 9) for _ in range(4)]
    col = encode_column("p", _nested(groups))
    assert not calls and np.asarray(col.arrays["codes"]).tolist() == [g // 4 for g in range(32)]
    assert_equal(_roundtrip(col), _nested(groups))


def test_short_token_rows_alike_at_first_middle_and_last_are_told_apart() -> None:
    a, b = [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]
    rows = [a, b, b, b, a, b]
    col = encode_column("c", _nested(rows))
    assert "codes" in col.arrays
    assert np.asarray(col.arrays["codes"]).tolist() == [0, 1, 1, 1, 0, 1]
    assert_equal(_roundtrip(col), _nested(rows))


def test_rows_of_mostly_different_lengths_are_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    # sampled responses: their lengths alone show that a dictionary cannot pay, so no value of
    # theirs is read for a signature (0.13 ms a column of a small step, once per column)
    probed: list[int] = []
    probe = dictionary._probe
    monkeypatch.setattr(dictionary, "_probe", lambda *a: probed.append(1) or probe(*a))
    rows = [[r] * (r + 1) for r in range(8)] + [[9], [9]]  # 9 lengths among 10 rows
    col = encode_column("responses", _nested(rows))
    assert "codes" not in col.arrays and not probed
    assert_equal(_roundtrip(col), _nested(rows))
    # rows of few lengths are still probed, and equal ones still grouped
    rows = [[1, 2], [3, 4], [1, 2], [1, 2]]
    col = encode_column("prompts", _nested(rows))
    assert probed and np.asarray(col.arrays["codes"]).tolist() == [0, 1, 0, 0]
