"""Per-step RL signals (zarr_skip.views.signals): the pure figures, and a step's figures checked
against the values ``load()`` hands back, computed here with plain Python."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip.synthetic import text_rollouts
from zarr_skip.views.signals import signals, step_signals

pytest.importorskip("tokenizers")

FP = {
    "experiment_name": "e",
    "project_name": "p",
    "gen_batch_size": 8,
    "n": 4,
    "max_prompt_length": 128,
    "max_response_length": 96,
}


def test_signals_of_hand_made_rows() -> None:
    scores = np.array([1, 1, 1, 1, 0, 1, 0, 0, 1, np.nan], dtype=float)
    lengths = np.array([10, 20, 30, 40, 96, 20, 96, 50, 5, 7])
    uids = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 2, dtype=object)
    s = signals(7, scores, lengths, uids=uids, max_length=96, data_source="x", score_column="score")
    assert (s.step, s.data_source, s.rows, s.groups) == (7, "x", 10, 3)
    assert s.binary and s.accuracy == pytest.approx(6 / 9)
    assert s.score_mean == pytest.approx(6 / 9) and s.score_std == pytest.approx(np.std([1] * 6 + [0] * 3))
    assert s.length_mean == pytest.approx(lengths.mean())
    assert s.length_correct == pytest.approx(np.mean([10, 20, 30, 40, 20, 5]))
    assert s.length_wrong == pytest.approx(np.mean([96, 96, 50]))
    assert s.truncated == pytest.approx(0.2)
    assert s.same_score_groups == pytest.approx(0.5)  # a: all 1; b: mixed; c has one finite score only
    assert s.to_dict()["same_score_groups"] == s.same_score_groups


def test_non_binary_scores_give_no_accuracy_and_missing_columns_give_none() -> None:
    s = signals(1, np.array([0.5, 0.25, 1.0]), np.array([3, 4, 5]))
    assert not s.binary and s.accuracy is None and s.length_correct is None and s.length_wrong is None
    assert s.truncated is None and s.groups == 0 and s.same_score_groups is None
    assert s.score_mean == pytest.approx(1.75 / 3)
    s = signals(1, None, np.array([3, 4]), uids=np.array(["a", "a"], dtype=object), max_length=4)
    assert s.rows == 2 and s.score_mean is None and s.same_score_groups is None and s.truncated == 0.5


def _fmean(values: list[int]) -> float | None:
    return statistics.fmean(values) if values else None


def expected_signals(view: Any) -> dict[str | None, dict[str, Any]]:
    """The figures from the values ``load()`` gives, with plain Python."""
    scores = [float(x) for x in view["score"][:]]
    lengths = [int(x) for x in view["responses"].lengths()]
    uids = [str(u) for u in view["uid"][:]]
    sources = [str(s) for s in view["data_source"][:]]
    out: dict[str | None, dict[str, Any]] = {}
    for source in [None, *sorted(set(sources))]:
        rows = [i for i in range(len(scores)) if source is None or sources[i] == source]
        groups: dict[str, set[float]] = defaultdict(set)
        for i in rows:
            groups[uids[i]].add(scores[i])
        out[source] = {
            "rows": len(rows),
            "score_mean": statistics.fmean(scores[i] for i in rows),
            "score_std": statistics.pstdev([scores[i] for i in rows]),
            "accuracy": sum(scores[i] == 1 for i in rows) / len(rows),
            "length_mean": statistics.fmean(lengths[i] for i in rows),
            "length_correct": _fmean([lengths[i] for i in rows if scores[i] == 1]),
            "length_wrong": _fmean([lengths[i] for i in rows if scores[i] == 0]),
            "truncated": sum(lengths[i] >= 96 for i in rows) / len(rows),
            "groups": len(groups),
            "same_score_groups": sum(len(v) == 1 for v in groups.values()) / len(groups),
        }
    return out


def test_step_signals_match_what_load_gives(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(3, text_rollouts(8, 4, seed=5, step=3))
    view = cache.load(3)
    found = step_signals(view)
    want = expected_signals(view)
    assert [s.data_source for s in found] == list(want)
    for s in found:
        assert s.step == 3 and s.binary and s.score_column == "score" and s.max_length == 96
        for key, value in want[s.data_source].items():
            assert getattr(s, key) == pytest.approx(value), (s.data_source, key)


def test_a_token_level_score_is_summed_per_row(tmp_path: Path) -> None:
    batch = text_rollouts(4, 4, seed=2, step=1)
    plain = [float(x) for x in batch["score"]]
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, {k: v for k, v in batch.items() if k not in ("score", "acc", "data_source")})
    (s,) = step_signals(cache.load(1), max_length=40)
    assert s.score_column == "token_level_scores" and s.data_source is None
    assert s.score_mean == pytest.approx(statistics.fmean(plain))
    lengths = [len(r) for r in batch["responses"].unbind()]
    assert s.truncated == pytest.approx(sum(n >= 40 for n in lengths) / len(lengths))


def test_padded_responses_without_a_mask_have_no_lengths(tmp_path: Path) -> None:
    import torch

    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, {"responses": torch.arange(8).reshape(2, 4), "score": torch.tensor([0.0, 1.0])})
    (s,) = step_signals(cache.load(1))
    assert s.rows == 2 and s.accuracy == 0.5 and s.length_mean is None and s.truncated is None


def uneven_groups() -> dict[str, Any]:
    """A step of 8 groups: 4 of two answers (2 all 1, 2 mixed) and 4 of one answer (all 1)."""
    import torch

    scores = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    uids = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "f", "g", "h"]
    return {
        "responses": torch.ones(len(scores), 4, dtype=torch.int64),
        "response_mask": torch.ones(len(scores), 4, dtype=torch.int64),
        "score": torch.tensor(scores),
        "uid": uids,
    }


def test_same_score_groups_say_how_many_groups_they_are_a_share_of(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, uneven_groups())
    (s,) = step_signals(cache.load(1))
    assert s.groups == 8 and s.same_score_groups == 0.5 and s.scored_groups == 4  # 2 of the 4 groups of 2+
    assert s.to_dict()["scored_groups"] == 4
    one = signals(1, np.array([1.0, np.nan, 0.0]), None, uids=np.array(["a", "a", "b"], dtype=object))
    assert one.groups == 2 and one.same_score_groups is None and one.scored_groups == 0


def test_the_rewards_verls_agent_loop_returns_are_the_scores(tmp_path: Path) -> None:
    import torch

    scores = [1.0, 0.0, 1.0, 1.0]  # rm_scores: token-level, the score on the last response token
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    rm = torch.zeros(4, 4, dtype=torch.bfloat16)
    rm[torch.arange(4), mask.sum(1) - 1] = torch.tensor(scores, dtype=torch.bfloat16)
    batch = {"responses": mask * 7, "response_mask": mask, "rm_scores": rm, "uid": ["a", "a", "b", "b"]}
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, batch)
    view = cache.load(1)
    (s,) = step_signals(view)
    assert s.score_column == "rm_scores" and s.binary and s.accuracy == 0.75 and s.same_score_groups == 0.5
    assert view.group("a").best == [0] and view.group("a").worst == [1]
    # the table's and the exports' score too (it was missing from both)
    assert cache.table()["score"].tolist() == scores
    cache.export(tmp_path / "r.jsonl", steps=1)
    assert [json.loads(line)["score"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == scores


def test_padded_responses_with_an_attention_mask_only_have_lengths(tmp_path: Path) -> None:
    import torch

    from zarr_skip.views.measures import response_lengths

    lengths = torch.tensor([4, 2, 1, 3])  # verl's rollout output: prompts, responses, attention_mask, no response_mask
    response = (torch.arange(4)[None, :] < lengths[:, None]).long()
    attention = torch.cat([torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]]), response], dim=1)
    batch = {"prompts": torch.full((4, 3), 5), "responses": response * 7, "attention_mask": attention}
    cache = zs.open_cache(tmp_path / "c", {**FP, "max_response_length": 4})
    cache.write(1, {**batch, "score": torch.tensor([0.0, 1.0, 1.0, 0.0]), "uid": ["a", "a", "b", "b"]})
    view = cache.load(1)
    assert response_lengths(view).tolist() == [4, 2, 1, 3]
    (s,) = step_signals(view)
    assert s.length_mean == 2.5 and s.length_correct == 1.5 and s.length_wrong == 3.5 and s.truncated == 0.25


def test_a_multi_turn_response_counts_its_tool_tokens(tmp_path: Path) -> None:
    """verl's agent loop masks the tool's tokens inside a response out of the loss
    (``response_mask`` 0 there): they are the response's tokens all the same, as verl counts
    them; a response is its tokens up to its mask's last 1 (it was the count of 1s)."""
    import numpy as np
    import torch

    from zarr_skip.views.measures import response_lengths
    from zarr_skip.views.text import token_ids

    mask = torch.tensor([[1, 0, 0, 1, 1, 0], [1, 1, 0, 1, 1, 1], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    responses = torch.arange(1, 25).reshape(4, 6) * (torch.arange(6)[None, :] < torch.tensor([[5], [6], [2], [0]]))
    batch = {"responses": responses, "response_mask": mask, "score": torch.tensor([1.0, 0.0, 1.0, 0.0])}
    cache = zs.open_cache(tmp_path / "c", {**FP, "max_response_length": 6})
    cache.write(1, {**batch, "prompts": torch.full((4, 2), 9), "uid": ["a", "a", "b", "b"]})
    view = cache.load(1)
    assert response_lengths(view).tolist() == [5, 6, 2, 0]  # was [3, 5, 2, 0]
    (s,) = step_signals(view)
    assert s.truncated == 0.25 and s.length_mean == 13 / 4  # row 1 fills the 6 tokens: truncated
    ids = token_ids(view, "responses")
    assert [r.tolist() for r in ids] == [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12], [13, 14], []]
    shown = view.rollout(1).rollout
    assert shown.response_ids.tolist() == [7, 8, 9, 10, 11, 12] and shown.length == 6 and shown.truncated
    table = cache.table()
    assert table["response_length"].tolist() == [5, 6, 2, 0]
    assert table["truncated"].tolist() == [False, True, False, False]
    assert np.array_equal(np.asarray(view["response_mask"][:]), mask.numpy())  # stored as it was


def test_per_token_values_of_a_multi_turn_response_reduce_over_its_mask(tmp_path: Path) -> None:
    """A reduction is what the loss sees (verl's masked mean): the tool's tokens, masked out,
    are not in it, though they are in the response's length."""
    import torch

    mask = torch.tensor([[1, 0, 0, 1, 0, 0], [1, 1, 1, 1, 0, 0]])
    logp = torch.tensor([[-1.0, 9, 9, -3, 0, 0], [-1.0, -1, -1, -1, 0, 0]])
    batch = {"responses": torch.ones(2, 6, dtype=torch.long) * mask.cumsum(1).clamp(max=1), "response_mask": mask}
    cache = zs.open_cache(tmp_path / "c", {**FP, "max_response_length": 6})
    cache.write(1, {**batch, "old_log_probs": logp, "uid": ["a", "a"]})
    table = cache.table(reduce={"old_log_probs": "mean"})
    assert table["old_log_probs_mean"].tolist() == [-2.0, -1.0]
    assert table["response_length"].tolist() == [4, 4]


def test_every_view_takes_the_same_score(tmp_path: Path) -> None:
    """A step with a per-row ``score`` and ``token_level_scores`` that differ: the signals, the
    rollouts, ``find`` and the plots' scores all take ``score`` (the rollouts, ``find`` and the
    plots took the token-level sums, so the report's figures and its list disagreed)."""
    import torch

    from zarr_skip.views.measures import row_scores

    tls = torch.zeros(4, 3)
    tls[:, 2] = torch.tensor([0.0, 5.0, 0.0, 5.0])
    batch = {"responses": torch.ones(4, 3, dtype=torch.long), "response_mask": torch.ones(4, 3, dtype=torch.long)}
    cache = zs.open_cache(tmp_path / "c", {**FP, "max_response_length": 3})
    batch |= {"score": torch.tensor([1.0, 0.0, 1.0, 0.0]), "token_level_scores": tls, "uid": list("aabb")}
    cache.write(1, batch)
    view = cache.load(1)
    (s,) = step_signals(view)
    assert s.score_mean == 0.5 and s.accuracy == 0.5
    assert row_scores(view).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert view.rollout(0).rollout.score == 1.0
    assert list(view.find(best=1).rows) == [0]


def test_token_level_scores_in_bf16_export_their_sums(tmp_path: Path) -> None:
    """bf16, which numpy has not, reduced per row by the export (a bare TypeError: 'Got
    unsupported ScalarType BFloat16') as by the table."""
    import torch

    tls = torch.zeros(2, 3, dtype=torch.bfloat16)
    tls[:, 2] = torch.tensor([0.5, 1.0], dtype=torch.bfloat16)
    batch = {"responses": torch.ones(2, 3, dtype=torch.long), "response_mask": torch.ones(2, 3, dtype=torch.long)}
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, {**batch, "token_level_scores": tls, "uid": ["a", "a"]})
    cache.export(tmp_path / "r.jsonl", steps=1)
    assert [json.loads(line)["score"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == [0.5, 1.0]
    assert cache.table()["score"].tolist() == [0.5, 1.0]


def test_padded_responses_with_an_attention_mask_only_in_records_and_tables(tmp_path: Path, capsys: Any) -> None:
    """The same step in ``show --text``, exports and ``table()``: every response counted its
    padding (length 4 of 4, all truncated) and kept it in its ids; they now take the
    response's part of ``attention_mask``, as the signals and rollout views do."""
    import torch

    from zarr_skip.cli.main import main

    lengths = torch.tensor([4, 2, 1, 3])
    response = (torch.arange(4)[None, :] < lengths[:, None]).long()
    attention = torch.cat([torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]]), response], dim=1)
    batch = {"prompts": torch.full((4, 3), 5), "responses": response * 7, "attention_mask": attention}
    cache = zs.open_cache(tmp_path / "c", {**FP, "max_response_length": 4})
    cache.write(1, {**batch, "uid": ["a", "a", "b", "b"]})
    assert main(["show", str(tmp_path / "c"), "1", "--text", "--rows", "4", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)["rollouts"]
    assert [r["response_length"] for r in records] == [4, 2, 1, 3]
    assert [r["truncated"] for r in records] == [True, False, False, False]
    assert [r["response_ids"] for r in records][1] == [7, 7]
    assert [r["prompt_length"] for r in records] == [2, 3, 1, 2]
    pytest.importorskip("pandas")
    table = cache.table()
    assert table["response_length"].tolist() == [4, 2, 1, 3] and table["truncated"].tolist() == [1, 0, 0, 0]
    assert table["prompt_length"].tolist() == [2, 3, 1, 2]
