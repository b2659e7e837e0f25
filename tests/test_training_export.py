"""Training exports: SFT and DPO records in TRL's conversational formats, from a cache whose
scores are known (best, worst, ties, groups of one score, min_score), by API and CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.errors import ConfigError, ConfigTypeError, StorageError, TokenizerNotFoundError
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts

FP = {"experiment_name": "training", "n": 4}
#: the scores of step 1's four groups of four answers (rows 0-3, 4-7, 8-11, 12-15)
SCORES = [1, 0, 1, 0.5] + [0.5] * 4 + [0, 0, 0, 0.25] + [math.nan, 2, 0, 1]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("training") / "cache"
    batch = dict(text_rollouts(4, 4, seed=3, step=1, max_response=40))
    batch["score"] = np.array(SCORES, dtype=np.float32)
    cache = zs.open_cache(path, FP)
    cache.write(1, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    return path, batch


def answer(batch: dict[str, Any], row: int) -> str:
    ids = batch["responses"].unbind()[row].tolist()
    return shipped_tokenizer().decode(ids, skip_special_tokens=True)


def prompt(batch: dict[str, Any], row: int) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in batch["raw_prompt"][row]]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sft_best_answer_of_each_group(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, batch = written
    cache = zs.open_cache(path)
    report = cache.export(tmp_path / "sft.jsonl", format="sft")
    records = read_jsonl(tmp_path / "sft.jsonl")
    assert [r["row"] for r in records] == [0, 4, 11, 13]  # ties: the first in stored order
    assert report.records == 4 and report.groups == 4 and report.file_format == "jsonl"
    first = records[0]
    assert first["messages"] == [*prompt(batch, 0), {"role": "assistant", "content": answer(batch, 0)}]
    assert first["step"] == 1 and first["uid"] == batch["uid"][0] and first["score"] == 1.0
    assert "completion_ids" not in first


def test_sft_best_of_and_min_score(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    cache = zs.open_cache(written[0])
    cache.export(tmp_path / "a.jsonl", format="sft", best_of=2)
    assert [r["row"] for r in read_jsonl(tmp_path / "a.jsonl")] == [0, 2, 4, 5, 11, 8, 13, 15]
    cache.export(tmp_path / "b.jsonl", format="sft", best_of=4, min_score=1)
    rows = read_jsonl(tmp_path / "b.jsonl")
    assert [(r["row"], r["score"]) for r in rows] == [(0, 1.0), (2, 1.0), (13, 2.0), (15, 1.0)]


def test_dpo_pairs_best_against_worst(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, batch = written
    cache = zs.open_cache(path)
    report = cache.export(tmp_path / "dpo.jsonl", format="dpo", token_ids=True)
    records = read_jsonl(tmp_path / "dpo.jsonl")
    # group 2 (rows 4-7) has one score: no pair; the NaN of row 12 is never chosen
    assert [(r["chosen_row"], r["rejected_row"]) for r in records] == [(0, 1), (11, 8), (13, 14)]
    assert [(r["score_chosen"], r["score_rejected"]) for r in records] == [(1, 0), (0.25, 0), (2, 0)]
    assert report.records == 3 and report.groups == 4
    r = records[0]
    assert r["prompt"] == prompt(batch, 0) and r["uid"] == batch["uid"][0] and r["step"] == 1
    assert r["chosen"] == [{"role": "assistant", "content": answer(batch, 0)}]
    assert r["rejected"] == [{"role": "assistant", "content": answer(batch, 1)}]
    assert r["chosen_ids"] == batch["responses"].unbind()[0].tolist()
    assert r["rejected_ids"] == batch["responses"].unbind()[1].tolist()
    assert r["prompt_ids"] == batch["prompts"].unbind()[0].tolist()


def test_dpo_more_pairs_and_min_score(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    cache = zs.open_cache(written[0])
    cache.export(tmp_path / "a.jsonl", format="dpo", pairs=3)
    pairs = [(r["chosen_row"], r["rejected_row"]) for r in read_jsonl(tmp_path / "a.jsonl")]
    assert pairs == [(0, 1), (2, 1), (11, 8), (11, 9), (11, 10), (13, 14)]
    cache.export(tmp_path / "b.jsonl", format="dpo", pairs="all", min_score=1)
    assert [(r["chosen_row"], r["rejected_row"]) for r in read_jsonl(tmp_path / "b.jsonl")] == [
        (0, 1),
        (2, 1),
        (13, 14),
    ]


def test_parquet_holds_the_same_records(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    cache = zs.open_cache(written[0])
    for fmt in ("sft", "dpo"):
        cache.export(tmp_path / f"{fmt}.jsonl", format=fmt)
        report = cache.export(tmp_path / f"{fmt}.parquet", format=fmt)
        assert report.file_format == "parquet"
        assert pq.read_table(tmp_path / f"{fmt}.parquet").to_pylist() == read_jsonl(tmp_path / f"{fmt}.jsonl")


def test_from_the_cli(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    loc = str(written[0])
    out = tmp_path / "sft.jsonl"
    assert main(["export", loc, "1", str(out), "--format", "sft", "--min-score", "1"]) == 0
    assert [r["row"] for r in read_jsonl(out)] == [0, 13]
    assert main(["export", loc, "1", str(out), "--format", "sft"]) == 2  # exists, no --overwrite
    dpo = tmp_path / "dpo.parquet"
    assert main(["export", loc, "all", str(dpo), "--format", "dpo", "--pairs", "all", "--token-ids"]) == 0
    assert main(["export", loc, "all", str(tmp_path / "x.jsonl"), "--format", "dpo", "--pairs", "some"]) == 2
    assert main(["export", loc, "1", str(tmp_path / "y.jsonl"), "--format", "sft", "--min-score", "nan"]) == 2
    assert main(["export", loc, "1", str(tmp_path / "y.jsonl"), "--format", "dpo", "--score", "nope"]) == 2
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "y.jsonl").exists()


def test_bad_requests_name_what_to_do(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    cache = zs.open_cache(written[0])
    with pytest.raises(ConfigError, match=r"name the file \.jsonl or \.parquet"):
        cache.export(tmp_path / "out.csv", format="sft")
    with pytest.raises(KeyError, match="step 1: no per-row column 'reward'"):
        cache.export(tmp_path / "out.jsonl", format="sft", score="reward")
    with pytest.raises(ConfigError, match="best_of: these choose training records"):
        cache.export(tmp_path / "out.jsonl", best_of=2)
    with pytest.raises(TokenizerNotFoundError, match="not a local file"):
        cache.export(tmp_path / "out.jsonl", format="sft", tokenizer=tmp_path / "none.json")
    plain = zs.open_cache(tmp_path / "plain", FP)
    plain.write(1, text_rollouts(1, 2, step=1))
    with pytest.raises(TokenizerNotFoundError, match="none is recorded"):
        plain.export(tmp_path / "out.jsonl", format="dpo")
    assert not list(tmp_path.glob("*.jsonl")) and not list(tmp_path.glob(".*"))  # nothing written


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"format": "sft", "min_score": "1"}, ConfigTypeError, "min_score: expected a number, got str '1'"),
        ({"format": "dpo", "min_score": [1]}, ConfigTypeError, "min_score: expected a number, got list"),
        ({"format": "sft", "min_score": True}, ConfigTypeError, "min_score: expected a number, got bool"),
        ({"format": "sft", "min_score": math.nan}, ConfigError, "min_score: expected a finite number, got nan"),
        ({"format": "sft", "score": 3}, ConfigTypeError, r"score: expected a name \(a str\), got int 3"),
        ({"format": "sft", "token_ids": "yes"}, ConfigTypeError, "token_ids: expected True or False, got str"),
        ({"format": "sft", "best_of": 2.0}, ConfigTypeError, "best_of: expected an int, got float"),
        ({"format": "sft", "best_of": 0}, ConfigError, "best_of=0: keep at least one answer"),
        ({"format": "dpo", "pairs": 1.5}, ConfigTypeError, "pairs: expected an int, got float"),
        ({"format": "dpo", "pairs": "some"}, ConfigError, "pairs='some': give the most pairs"),
        ({"format": "sft", "steps": "1"}, ConfigTypeError, "steps: expected a step"),
        ({"format": "sft", "steps": [1.0]}, ConfigTypeError, "steps: expected an int, got float"),
    ],
)
def test_bad_choices_are_typed_errors_before_anything_is_read(
    written: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kw: dict[str, Any],
    error: type,
    match: str,
) -> None:
    cache = zs.open_cache(written[0])
    monkeypatch.setattr(zs.Cache, "load", lambda *a, **k: pytest.fail("read before the arguments were checked"))
    with pytest.raises(error, match=match):
        cache.export(tmp_path / "out.jsonl", **kw)
    assert not list(tmp_path.iterdir())


def test_numpy_numbers_choose_as_python_ones(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """best_of, pairs, min_score and steps as numpy gives them: the same records as Python's."""
    cache = zs.open_cache(written[0])
    for fmt, kw, np_kw in [
        ("sft", {"best_of": 2, "min_score": 1.0}, {"best_of": np.int64(2), "min_score": np.float32(1.0)}),
        ("dpo", {"pairs": 2}, {"pairs": np.int32(2)}),
    ]:
        cache.export(tmp_path / f"{fmt}.jsonl", format=fmt, steps=1, **kw)
        cache.export(tmp_path / f"{fmt}_np.jsonl", format=fmt, steps=np.int64(1), **np_kw)
        plain, numpy = read_jsonl(tmp_path / f"{fmt}.jsonl"), read_jsonl(tmp_path / f"{fmt}_np.jsonl")
        assert plain and numpy == plain


def test_infinite_scores_rank_and_are_null_in_json_lines(tmp_path: Path) -> None:
    """An answer scored inf is the best (-inf the worst); strict JSON has no infinity: null."""
    cache = zs.open_cache(tmp_path / "cache", FP)
    batch = dict(text_rollouts(2, 2, seed=3, step=1, max_response=20))
    batch["score"] = np.array([0, math.inf, 1, -math.inf], dtype=np.float32)
    cache.write(1, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    cache.export(tmp_path / "sft.jsonl", format="sft")
    assert [(r["row"], r["score"]) for r in read_jsonl(tmp_path / "sft.jsonl")] == [(1, None), (2, 1.0)]
    cache.export(tmp_path / "dpo.jsonl", format="dpo")
    pairs = [
        (r["chosen_row"], r["rejected_row"], r["score_chosen"], r["score_rejected"])
        for r in read_jsonl(tmp_path / "dpo.jsonl")
    ]
    assert pairs == [(1, 0, None, 0.0), (2, 3, 1.0, None)]


def test_a_directory_or_a_path_inside_the_cache_is_refused(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """As for rollout exports: a ConfigError naming the path, nothing written."""
    cache = zs.open_cache(written[0])
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ConfigError, match="dir.jsonl' is a directory"):
        cache.export(tmp_path / "dir.jsonl", format="sft")
    with pytest.raises(ConfigError, match="inside the cache"):
        cache.export(written[0] / "sft.jsonl", format="sft")
    assert not (written[0] / "sft.jsonl").exists() and not list(tmp_path.glob(".*"))
    loc = str(written[0])
    assert main(["export", loc, "1", str(written[0] / "dpo.parquet"), "--format", "dpo"]) == 2
    assert not (written[0] / "dpo.parquet").exists()


def test_a_file_that_cannot_be_written_is_a_storage_error(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError, match="cannot write it"):
        zs.open_cache(written[0]).export(tmp_path / "file" / "sft.jsonl", format="sft")


def test_a_step_named_twice_is_exported_once(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """As the CLI reads `1 1`: the same records as the step named once, not each twice."""
    cache = zs.open_cache(written[0])
    for fmt in ("sft", "dpo"):
        once = cache.export(tmp_path / f"{fmt}.jsonl", format=fmt, steps=1)
        twice = cache.export(tmp_path / f"{fmt}2.jsonl", format=fmt, steps=[1, np.int64(1)])
        assert twice.steps == (1,) and twice.records == once.records and twice.groups == once.groups
        assert read_jsonl(tmp_path / f"{fmt}2.jsonl") == read_jsonl(tmp_path / f"{fmt}.jsonl")


@pytest.mark.parametrize(
    "options", [["--min-score", "1"], ["--best-of", "2"], ["--pairs", "all"], ["--token-ids"], ["--score", "acc"]]
)
@pytest.mark.parametrize("fmt", [[], ["--format", "jsonl"], ["--format", "verl"]])
def test_cli_training_options_without_a_training_format_are_refused(
    written: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any, options: list[str], fmt: list[str]
) -> None:
    """`export LOC all sft.jsonl --min-score 1` without --format sft wrote every rollout."""
    out = tmp_path / ("dump" if fmt[1:] == ["verl"] else "sft.jsonl")
    assert main(["export", str(written[0]), "all", str(out), *fmt, *options]) == 2
    assert f"{options[0]}: these choose training records; pass --format sft or --format dpo" in capsys.readouterr().err
    assert not out.exists()


def test_a_lone_surrogate_in_a_prompt_is_escaped_not_an_error(tmp_path: Path) -> None:
    """UTF-8 cannot encode it: written \\udxxx as rollout exports write it, in both file formats."""
    pq = pytest.importorskip("pyarrow.parquet")
    cache = zs.open_cache(tmp_path / "cache", FP)
    batch = dict(text_rollouts(2, 2, seed=3, step=1, max_response=20))
    batch["score"] = np.array([1, 0, 1, 0], dtype=np.float32)
    batch["raw_prompt"] = [[{"role": "user", "content": "bad \ud800 é ✓"}]] * 2 + list(batch["raw_prompt"][2:])
    cache.write(1, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    for fmt in ("sft", "dpo"):
        cache.export(tmp_path / f"{fmt}.jsonl", format=fmt)
        cache.export(tmp_path / f"{fmt}.parquet", format=fmt)
        records = read_jsonl(tmp_path / f"{fmt}.jsonl")
        assert pq.read_table(tmp_path / f"{fmt}.parquet").to_pylist() == records
        first = records[0]["messages" if fmt == "sft" else "prompt"][0]
        assert first == {"role": "user", "content": "bad \\ud800 é ✓"}


def test_rows_without_a_uid_are_groups_of_their_own(tmp_path: Path) -> None:
    """uid None says no prompt is known: such rows are not one group (they were grouped as "None")."""
    cache = zs.open_cache(tmp_path / "cache", FP)
    batch = dict(text_rollouts(2, 2, seed=3, step=1, max_response=20))
    batch["uid"] = ["a", "a", None, None]
    batch["score"] = np.array([1, 0, 1, 0], dtype=np.float32)
    cache.write(1, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    cache.export(tmp_path / "sft.jsonl", format="sft")
    assert [(r["row"], r["uid"]) for r in read_jsonl(tmp_path / "sft.jsonl")] == [(0, "a"), (2, None), (3, None)]
    cache.export(tmp_path / "dpo.jsonl", format="dpo")
    assert [(r["chosen_row"], r["rejected_row"]) for r in read_jsonl(tmp_path / "dpo.jsonl")] == [(0, 1)]
