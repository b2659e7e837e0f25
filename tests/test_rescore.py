"""Cache.rescore: a new verifier over cached rollouts, its scores beside the stored ones."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_data import MINIBATCHES, fill

import zarr_skip as zs
from zarr_skip.errors import ConfigTypeError, MissingExtraError
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer

pytest.importorskip("pandas")


def boxed(rollout: dict[str, Any]) -> float:
    """A verifier: 1 when the response's last \\boxed{} answer is the ground truth."""
    found = re.findall(r"\\boxed\{([^}]*)\}", rollout["response"])
    return float(bool(found) and found[-1].strip() == rollout["reward_model"]["ground_truth"])


def test_new_scores_beside_the_stored_ones(tmp_path: Path) -> None:
    written = fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")
    seen: list[dict[str, Any]] = []

    def verifier(rollout: dict[str, Any]) -> float:
        seen.append(rollout)
        return boxed(rollout)

    table = cache.rescore(verifier, steps=[1, 3], tokenizer=TOKENIZER_PATH)
    assert list(table.columns) == ["step", "minibatch", "row", "uid", "score", "new_score"]
    assert table[["step", "row"]].values.tolist() == [[s, r] for s in (1, 3) for r in range(12)]
    assert table["minibatch"].tolist() == [0] * 5 + [1] * 7 + [0] * 3 + [1] * 4 + [2] * 5
    stored = np.concatenate([written[s]["score"] for s in (1, 3)])
    assert table["score"].tolist() == stored.astype(float).tolist()
    # the synthetic scores are those of the same check: the new verifier agrees with them
    assert table["new_score"].tolist() == table["score"].tolist()
    tok = shipped_tokenizer()
    first = seen[0]
    assert first["response"] == tok.decode(written[1]["responses"].unbind()[0].tolist(), skip_special_tokens=True)
    assert first["messages"] == written[1]["raw_prompt"][0] and first["uid"] == written[1]["uid"][0]
    assert {"extra_info", "data_source", "acc"} <= set(first)


def test_several_scores_and_chosen_columns(tmp_path: Path) -> None:
    fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")
    table = cache.rescore(
        lambda r: {"length": len(r["response"]), "right": boxed(r)},
        steps=2,
        columns=["reward_model"],
        tokenizer=TOKENIZER_PATH,
    )
    assert list(table.columns) == ["step", "minibatch", "row", "uid", "score", "length", "right"]
    assert len(table) == sum(MINIBATCHES[2])
    with pytest.raises(ConfigTypeError, match="step 2, row 0: the rescoring function returned 'x'"):
        cache.rescore(lambda r: "x", steps=2, tokenizer=TOKENIZER_PATH)  # type: ignore[arg-type, return-value]
    with pytest.raises(KeyError, match="step 2: no column 'nope'"):
        cache.rescore(boxed, steps=2, columns=["nope"], tokenizer=TOKENIZER_PATH)
    with pytest.raises(ConfigTypeError, match=r"step 2, row 0: the rescoring function returned 'x' for 'b'"):
        cache.rescore(lambda r: {"a": 1, "b": "x"}, steps=2, tokenizer=TOKENIZER_PATH)  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize(
    ("fn", "kw", "match"),
    [
        ("boxed", {}, "fn: expected a function of a rollout, got str 'boxed'"),
        (boxed, {"columns": "reward_model"}, r"columns: expected a list .* \(wrap one name in a list\)"),
        (boxed, {"score": 3}, "score: expected a name"),
        (boxed, {"steps": "2"}, "steps: expected a step"),
    ],
)
def test_bad_calls_are_typed_errors_before_anything_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fn: Any, kw: dict[str, Any], match: str
) -> None:
    fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")
    monkeypatch.setattr(zs.Cache, "load", lambda *a, **k: pytest.fail("read before the arguments were checked"))
    with pytest.raises(ConfigTypeError, match=match):
        cache.rescore(fn, tokenizer=TOKENIZER_PATH, **kw)


def test_an_error_in_the_function_says_which_rollout(tmp_path: Path) -> None:
    fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")

    def fails_on_row_3(rollout: dict[str, Any]) -> float:
        if rollout["row"] == 3:
            raise ZeroDivisionError("the verifier divided by zero")
        return 1.0

    with pytest.raises(ZeroDivisionError, match="the verifier divided by zero") as info:  # the user's own error
        cache.rescore(fails_on_row_3, steps=2, tokenizer=TOKENIZER_PATH)
    assert info.value.__notes__ == ["zarr_skip: raised by the rescoring function on step 2, row 3"]


def test_without_pandas_a_missing_extra_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(tmp_path / "cache")
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(MissingExtraError, match=r"zarr-skip\[pandas\]"):
        zs.open_cache(tmp_path / "cache").rescore(boxed)


def test_a_jagged_column_reaches_the_function_as_its_row(tmp_path: Path) -> None:
    """A jagged column asked for (token ids, log-probs) is each rollout's row as a list."""
    fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")
    seen: list[list[int]] = []

    def count(rollout: dict[str, Any]) -> float:
        seen.append(rollout["responses"])
        return float(len(rollout["responses"]))

    table = cache.rescore(count, steps=2, columns=["responses"], tokenizer=TOKENIZER_PATH)
    stored = cache.load(2)["responses"][:]
    assert seen == [row.tolist() for row in stored.unbind()] and all(type(r) is list for r in seen)
    assert table["new_score"].tolist() == [float(len(r)) for r in seen]
    with pytest.raises(zs.ColumnNotFoundError, match="step 2: no column 'nope'"):
        cache.rescore(count, steps=2, columns=["nope"], tokenizer=TOKENIZER_PATH)


def test_a_step_named_twice_is_rescored_once(tmp_path: Path) -> None:
    fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")
    table = cache.rescore(boxed, steps=[2, 2], tokenizer=TOKENIZER_PATH)
    assert table["row"].tolist() == list(range(sum(MINIBATCHES[2])))


@pytest.mark.parametrize(("name", "kw"), [("score", {}), ("acc", {"score": "acc"}), ("row", {}), ("uid", {})])
def test_a_new_score_named_as_a_column_of_the_table_is_refused(tmp_path: Path, name: str, kw: dict[str, Any]) -> None:
    """Not written over the stored score (or the key) without a word."""
    fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")
    with pytest.raises(zs.ConfigError, match=f"step 2, row 0: the rescoring function returned a score named '{name}'"):
        cache.rescore(lambda r: {name: 1.0, "other": 0.0}, steps=2, tokenizer=TOKENIZER_PATH, **kw)
