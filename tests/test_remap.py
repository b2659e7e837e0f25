"""Unit and property tests for zarr_skip.trainer.remap."""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarr_skip.trainer.remap import (
    GroupMismatch,
    GroupMismatchError,
    KeyFormatError,
    Remap,
    RemapError,
    SampleIdError,
    group_by_uid,
    parse_key,
    parse_sample_step,
    remap,
)

# ---------------------------------------------------------------------------
# parse_sample_step


@pytest.mark.parametrize(
    ("uid", "step"),
    [
        ("sample_0_42", 42),
        ("sample_3_1", 1),
        ("uid_sample_0_42", 42),
        ("uid_sample_3_1", 1),
        ("sample_12_0", 0),
        ("sample_0_007", 7),
    ],
)
def test_parse_sample_step_valid(uid: str, step: int) -> None:
    assert parse_sample_step(uid) == step


def test_parse_sample_step_numpy_str() -> None:
    assert parse_sample_step(np.array(["uid_sample_1_7"], dtype=object)[0]) == 7
    assert parse_sample_step(np.str_("sample_1_9")) == 9


@pytest.mark.parametrize(
    "uid",
    [
        "bad_id",
        "",
        "sample_1",
        "sample_1_2_3",
        "uid_uid_sample_1_2",
        "sample_a_2",
        "sample_1_x",
        "sample_1_-2",
        "Sample_1_2",
        "sample_1_2 ",
        "sample_1_\u00b2",
        "xuid_sample_1_2",
    ],
)
def test_parse_sample_step_invalid(uid: str) -> None:
    with pytest.raises(SampleIdError) as info:
        parse_sample_step(uid)
    assert repr(uid) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_parse_sample_step_non_string() -> None:
    with pytest.raises(SampleIdError, match="None"):
        parse_sample_step(None)  # type: ignore[arg-type]
    with pytest.raises(SampleIdError, match="42"):
        parse_sample_step(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# parse_key / group_by_uid


def test_parse_key_splits_from_the_right() -> None:
    assert parse_key("abc_0_0") == ("abc", 0, 0)
    assert parse_key("uid_sample_0_3_2_1") == ("uid_sample_0_3", 2, 1)
    assert parse_key("a_b_c_10_20") == ("a_b_c", 10, 20)
    assert parse_key("x_1_2") == ("x", 1, 2)
    assert parse_key("a__0_0") == ("a_", 0, 0)


@pytest.mark.parametrize("key", ["abc", "abc_1", "_1_2", "abc_x_1", "abc_1_y", "abc_1_2_", 5, None])
def test_parse_key_invalid(key: Any) -> None:
    with pytest.raises(KeyFormatError) as info:
        parse_key(key)
    assert repr(key) in str(info.value)
    assert isinstance(info.value, RemapError) and isinstance(info.value, ValueError)


def test_group_by_uid_first_seen_order() -> None:
    keys = ["b_0_0", "a_0_0", "b_1_0", "c_0_0", "a_1_0", "b_2_0"]
    assert group_by_uid(keys) == [[0, 2, 5], [1, 4], [3]]


def test_group_by_uid_uids_with_underscores() -> None:
    keys = ["uid_sample_0_1_0_0", "uid_sample_0_1_1_0", "uid_sample_0_2_0_0", "uid_sample_0_10_0_0"]
    assert group_by_uid(keys) == [[0, 1], [2], [3]]


def test_group_by_uid_empty_and_numpy() -> None:
    assert group_by_uid([]) == []
    assert group_by_uid(np.array(["x_0_0", "y_0_0", "x_1_0"])) == [[0, 2], [1]]


def test_group_by_uid_bad_key() -> None:
    with pytest.raises(KeyFormatError, match="'nope'"):
        group_by_uid(["a_0_0", "nope"])


# ---------------------------------------------------------------------------
# remap: examples


def _cached(groups: list[int], *, uid_prefix: str = "old") -> tuple[list[str], list[dict[str, Any]]]:
    """Cached keys/tags: group g (uid ``{prefix}{g}``) has ``groups[g]`` sessions, interleaved."""
    keys: list[str] = []
    tags: list[dict[str, Any]] = []
    longest = max(groups, default=0)
    for session in range(longest):
        for g, size in enumerate(groups):
            if session < size:
                keys.append(f"{uid_prefix}{g}_{session}_0")
                tags.append(
                    {
                        "status": "finished",
                        "global_steps": 3,
                        "min_global_steps": 2,
                        "max_global_steps": 3,
                        "is_prompt": False,
                        "seq_len": 10 * g + session,
                        "extra": {"nested": [g, session]},
                    }
                )
    return keys, tags


def test_remap_basic_matching_counts() -> None:
    keys, tags = _cached([2, 2])
    # interleaved: old0_0, old1_0, old0_1, old1_1
    r = remap(keys, tags, ["p", "q"], n=2, step=7)
    assert isinstance(r, Remap)
    assert r.indices == (0, 2, 1, 3)
    assert r.keys == ("p_0_0", "p_1_0", "q_0_0", "q_1_0")
    assert r.groups == (0, 1)
    assert r.mismatch is None
    assert r.short_groups == 0
    assert r.prompt_keys == ("p", "q")
    assert r.prompt_tags == (
        {"is_prompt": True, "status": "finished", "global_steps": 7},
        {"is_prompt": True, "status": "finished", "global_steps": 7},
    )
    assert r.prompt_tags[0] is not r.prompt_tags[1]
    for tag, row in zip(r.tags, r.indices, strict=True):
        assert tag["global_steps"] == tag["min_global_steps"] == tag["max_global_steps"] == 7
        assert "is_prompt" not in tag
        assert tag["seq_len"] == tags[row]["seq_len"]
        assert tag["status"] == "finished"


def test_remap_tags_are_deep_copies() -> None:
    keys, tags = _cached([1])
    snapshot = copy.deepcopy(tags)
    r = remap(keys, tags, ["p"], n=3, step=1)
    assert tags == snapshot
    r.tags[0]["extra"]["nested"].append("changed")
    assert tags == snapshot
    assert r.tags[1]["extra"]["nested"] == [0, 0]
    assert len({id(t) for t in r.tags}) == 3


def test_remap_cycles_within_short_group(caplog: pytest.LogCaptureFixture) -> None:
    keys, tags = _cached([3, 1])
    with caplog.at_level(logging.INFO, logger="zarr_skip.trainer.remap"):
        r = remap(keys, tags, ["p", "q"], n=4, step=2)
    old0 = group_by_uid(keys)[0]
    old1 = group_by_uid(keys)[1]
    assert r.indices[:4] == (old0[0], old0[1], old0[2], old0[0])
    assert r.indices[4:] == (old1[0],) * 4
    assert r.short_groups == 2
    assert "fewer than n=4" in caplog.text


def test_remap_more_prompts_than_groups_cycles(caplog: pytest.LogCaptureFixture) -> None:
    keys, tags = _cached([2, 2])
    with caplog.at_level(logging.WARNING, logger="zarr_skip.trainer.remap"):
        r = remap(keys, tags, ["a", "b", "c", "d", "e"], n=2, step=9)
    assert r.groups == (0, 1, 0, 1, 0)
    assert r.mismatch == GroupMismatch(cached_groups=2, prompts=5, step=9, source_step=9)
    assert "2 prompt groups" in caplog.text and "5 prompts" in caplog.text
    assert len(r.keys) == 10 and len(set(r.keys)) == 10


def test_remap_fewer_prompts_than_groups_uses_first(caplog: pytest.LogCaptureFixture) -> None:
    keys, tags = _cached([2, 2, 2])
    with caplog.at_level(logging.WARNING, logger="zarr_skip.trainer.remap"):
        r = remap(keys, tags, ["a"], n=2, step=4, source_step=3)
    assert r.groups == (0,)
    assert r.mismatch is not None and r.mismatch.cached_groups == 3 and r.mismatch.prompts == 1
    assert "first 1 groups" in caplog.text
    assert "cached step 3" in caplog.text


def test_remap_error_policy_raises_naming_counts_and_step() -> None:
    keys, tags = _cached([2, 2])
    with pytest.raises(GroupMismatchError) as info:
        remap(keys, tags, ["a", "b", "c"], n=2, step=11, policy="error")
    msg = str(info.value)
    assert "step 11" in msg and "2 prompt groups" in msg and "3 prompts" in msg
    assert isinstance(info.value, ValueError)
    # no mismatch: the error policy is silent
    assert remap(keys, tags, ["a", "b"], n=2, step=11, policy="error").mismatch is None


def test_remap_error_policy_names_source_step() -> None:
    keys, tags = _cached([1])
    with pytest.raises(GroupMismatchError, match=r"step 5: the cache \(step 2\)"):
        remap(keys, tags, ["a", "b"], n=1, step=5, policy="error", source_step=2)


def test_remap_no_groups_is_error() -> None:
    with pytest.raises(RemapError, match="no trajectory groups"):
        remap([], [], ["a"], n=2, step=1)
    with pytest.raises(RemapError, match="no trajectory groups"):
        remap([], [], [], n=2, step=1, policy="error")


def test_remap_validation_errors() -> None:
    keys, tags = _cached([2])
    with pytest.raises(RemapError, match="2 keys but 1 tags"):
        remap(keys, tags[:1], ["a"], n=2, step=1)
    with pytest.raises(RemapError, match="'a' occurs more than once"):
        remap(keys, tags, ["a", "a"], n=2, step=1)
    for bad_n in (0, -1, 1.5, True):
        with pytest.raises(RemapError, match="positive integer"):
            remap(keys, tags, ["a"], n=bad_n, step=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="policy"):
        remap(keys, tags, ["a"], n=2, step=1, policy="drop")
    with pytest.raises(RemapError, match="expected a mapping"):
        remap(keys, [tags[0], "x"], ["a"], n=2, step=1)  # type: ignore[list-item]
    with pytest.raises(KeyFormatError):
        remap(["bad"], [{}], ["a"], n=1, step=1)


def test_remap_none_tag_becomes_fresh_dict() -> None:
    r = remap(["u_0_0"], [None], ["a"], n=1, step=3)
    assert r.tags == ({"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3},)


def test_remap_numpy_inputs() -> None:
    keys, tags = _cached([2, 2])
    r = remap(np.array(keys), np.array(tags, dtype=object), np.array(["p", "q"], dtype=object), n=2, step=1)
    assert r.keys == ("p_0_0", "p_1_0", "q_0_0", "q_1_0")
    assert all(type(k) is str for k in r.keys + r.prompt_keys)


def test_remap_is_frozen() -> None:
    keys, tags = _cached([1])
    r = remap(keys, tags, ["a"], n=1, step=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.keys = ()  # type: ignore[misc]
    assert not hasattr(r, "__dict__")


def test_remap_empty_prompts_with_groups() -> None:
    keys, tags = _cached([2])
    r = remap(keys, tags, [], n=2, step=1)
    assert r.indices == () and r.keys == () and r.prompt_keys == ()
    assert r.mismatch is not None


# ---------------------------------------------------------------------------
# remap: properties

_uid_chars = st.sampled_from("abcxyz019_-")
_uid = st.text(_uid_chars, min_size=1, max_size=8)


@st.composite
def _cache_and_prompts(draw: st.DrawFn) -> tuple[list[str], list[dict[str, Any]], list[str], int]:
    # uids may contain "_" and digits: keys are split from the right.
    old_uids = draw(st.lists(_uid, min_size=1, max_size=6, unique=True))
    rows: list[tuple[str, int]] = []
    for uid in old_uids:
        sessions = draw(st.integers(1, 5))
        rows.extend((uid, s) for s in range(sessions))
    order = draw(st.permutations(range(len(rows))))
    keys = [f"{rows[i][0]}_{rows[i][1]}_0" for i in order]
    tags = [
        draw(
            st.fixed_dictionaries(
                {"status": st.just("finished"), "seq_len": st.integers(0, 99)},
                optional={
                    "is_prompt": st.booleans(),
                    "global_steps": st.integers(0, 9),
                    "note": st.lists(st.integers(), max_size=2),
                },
            )
        )
        for _ in keys
    ]
    prompts = draw(st.lists(_uid, min_size=0, max_size=7, unique=True))
    n = draw(st.integers(1, 4))
    return keys, tags, prompts, n


@settings(max_examples=150, deadline=None)
@given(_cache_and_prompts(), st.integers(0, 10_000))
def test_remap_properties(case: tuple[list[str], list[dict[str, Any]], list[str], int], step: int) -> None:
    keys, tags, prompts, n = case
    keys_before, tags_before = list(keys), copy.deepcopy(tags)

    r = remap(keys, tags, prompts, n=n, step=step)

    # originals unmodified
    assert keys == keys_before and tags == tags_before
    # shapes
    assert len(r.indices) == len(r.keys) == len(r.tags) == n * len(prompts)
    assert r.prompt_keys == tuple(prompts) and len(r.prompt_tags) == len(prompts)
    # every new key unique and well formed
    assert len(set(r.keys)) == len(r.keys)
    for i, key in enumerate(r.keys):
        assert key == f"{prompts[i // n]}_{i % n}_0"
    # indices within range
    assert all(0 <= i < len(keys) for i in r.indices)
    # each prompt's rows all come from one cached group, the one reported
    groups = group_by_uid(keys)
    owner = {row: g for g, rows in enumerate(groups) for row in rows}
    for p in range(len(prompts)):
        rows = r.indices[p * n : (p + 1) * n]
        assert {owner[row] for row in rows} == {r.groups[p]}
        assert r.groups[p] == p % len(groups)
        # as many distinct rows as the group can give
        assert len(set(rows)) == min(n, len(groups[r.groups[p]]))
    # tags: steps set, is_prompt dropped, other fields carried over
    for tag, row in zip(r.tags, r.indices, strict=True):
        assert tag["global_steps"] == tag["min_global_steps"] == tag["max_global_steps"] == step
        assert "is_prompt" not in tag
        assert tag["seq_len"] == tags[row]["seq_len"]
        assert tag.get("note") == tags[row].get("note")
    for ptag in r.prompt_tags:
        assert ptag == {"is_prompt": True, "status": "finished", "global_steps": step}
    # mismatch reported exactly when the counts differ
    assert (r.mismatch is None) == (len(groups) == len(prompts))


@settings(max_examples=60, deadline=None)
@given(_cache_and_prompts())
def test_remap_error_policy_property(case: tuple[list[str], list[dict[str, Any]], list[str], int]) -> None:
    keys, tags, prompts, n = case
    groups = len(group_by_uid(keys))
    if groups == len(prompts):
        assert remap(keys, tags, prompts, n=n, step=1, policy="error") == remap(keys, tags, prompts, n=n, step=1)
    else:
        with pytest.raises(GroupMismatchError, match=f"{groups} prompt groups"):
            remap(keys, tags, prompts, n=n, step=1, policy="error")


def test_errors_belong_to_the_core_tree() -> None:
    import zarr_skip
    from zarr_skip.errors import ZarrSkipError

    assert GroupMismatchError is zarr_skip.GroupMismatchError
    for cls in (GroupMismatchError, RemapError, KeyFormatError, SampleIdError):
        assert issubclass(cls, ZarrSkipError) and issubclass(cls, ValueError)
