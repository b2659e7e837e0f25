"""Parquet and JSON Lines exports, one record per rollout, read back by pyarrow, pandas and DuckDB."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import make_batch

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.errors import ConfigError, MissingExtraError, StepNotFoundError
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")
FP = {"experiment_name": "export", "n": 4, "max_response_length": 48}


@pytest.fixture(scope="module")
def steps() -> dict[int, Any]:
    return {
        1: text_rollouts(3, 4, seed=1, step=1, max_response=48),
        2: text_rollouts(3, 4, seed=1, step=2, max_response=48, padded=True),
    }


@pytest.fixture
def cache(tmp_path: Path, steps: dict[int, Any]) -> zs.Cache:
    cache = zs.open_cache(tmp_path / "cache", FP)
    for step, batch in steps.items():
        cache.write(step, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    return zs.open_cache(tmp_path / "cache")


def responses(batch: Any) -> list[str]:
    tok = shipped_tokenizer()
    if isinstance(batch, dict):
        rows = [r.tolist() for r in batch["responses"].unbind()]
    else:  # padded
        rows = [
            r[m.bool()].tolist() for r, m in zip(batch.batch["responses"], batch.batch["response_mask"], strict=True)
        ]
    return [tok.decode(r, skip_special_tokens=True) for r in rows]


def column(batch: Any, name: str) -> list[Any]:
    return list(batch[name] if isinstance(batch, dict) else batch.non_tensor_batch[name])


def test_parquet_reads_back_in_pyarrow_pandas_and_duckdb(
    cache: zs.Cache, steps: dict[int, Any], tmp_path: Path
) -> None:
    out = tmp_path / "out" / "rollouts.parquet"
    report = cache.export(out)
    assert report.format == "parquet" and report.steps == (1, 2) and report.rows == 24
    assert report.tokenizer is not None and out.is_file()
    assert not list(out.parent.glob("*.partial"))
    table = pq.read_table(out)
    assert table.num_rows == 24
    assert table.schema.field("messages").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert table.schema.field("score").type == pa.float64() and table.schema.field("acc").type == pa.bool_()
    d = table.to_pydict()
    assert d["step"] == [1] * 12 + [2] * 12 and d["row"] == list(range(12)) * 2
    assert d["response"] == responses(steps[1]) + responses(steps[2])
    assert d["uid"] == column(steps[1], "uid") + column(steps[2], "uid")
    assert d["score"] == [float(s) for s in column(steps[1], "score") + column(steps[2], "score")]
    assert d["truncated"] == [n == 48 for n in d["response_length"]]
    assert [json.loads(x) for x in d["extra_info"]] == column(steps[1], "extra_info") + column(steps[2], "extra_info")
    assert d["messages"][0] == [{"role": "user", "content": steps[1]["raw_prompt"][0][0]["content"]}]
    frame = __import__("pandas").read_parquet(out)
    assert list(frame.columns) == list(report.columns) and len(frame) == 24
    right = duckdb.sql(
        f"select count(*), avg(response_length) from '{out}' where acc and json_extract_string(extra_info, '$.answer') "
        "= json_extract_string(reward_model, '$.ground_truth')"
    ).fetchall()
    assert right[0][0] == sum(d["acc"]) > 0


def test_jsonl_reads_back_in_json_and_duckdb(cache: zs.Cache, steps: dict[int, Any], tmp_path: Path) -> None:
    out = tmp_path / "rollouts.jsonl"
    report = cache.export(out, steps=2)
    assert report.format == "jsonl" and report.steps == (2,)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["response"] for r in records] == responses(steps[2])
    assert records[3]["extra_info"] == column(steps[2], "extra_info")[3]  # JSON stays JSON
    assert records[3]["messages"][0]["role"] == "user"
    got = duckdb.sql(f"select row, extra_info.answer from read_json_auto('{out}') order by row").fetchall()
    assert [a for _, a in got] == [e["answer"] for e in column(steps[2], "extra_info")]


def test_without_a_tokenizer_ids_are_exported_and_a_warning_says_how(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fp = {"experiment_name": "plain", "n": 2, "max_response_length": 16}
    c = zs.open_cache(tmp_path / "c", fp)
    batch = make_batch(6, seed=3)
    c.write(1, batch)
    with caplog.at_level(logging.WARNING, "zarr_skip"):
        report = c.export(tmp_path / "plain.parquet")
    assert report.tokenizer is None and "no tokenizer known" in caplog.text
    d = pq.read_table(tmp_path / "plain.parquet").to_pydict()
    assert d["response"] == [None] * 6
    assert d["response_ids"] == [r.tolist() for r in batch["responses"].unbind()]
    assert d["scores"] == pytest.approx([float(x) for x in batch["scores"]])  # a per-row column of its own
    assert [json.loads(t) for t in d["tags"]] == batch["tags"]
    assert "bf16" not in d and "input_ids" not in d  # token rows are no per-row values


def test_bad_requests_write_nothing(cache: zs.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="cannot tell the format"):
        cache.export(tmp_path / "out.csv")
    with pytest.raises(ConfigError, match="choose one of parquet, jsonl"):
        cache.export(tmp_path / "out.x", format="csv")
    with pytest.raises(StepNotFoundError, match="step 7 not found"):
        cache.export(tmp_path / "out.parquet", steps=[1, 7])
    assert not (tmp_path / "out.parquet").exists()
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingExtraError, match=r"zarr-skip\[export\]"):
        cache.export(tmp_path / "out.parquet")
    cache.export(tmp_path / "out.jsonl")  # JSON Lines needs no pyarrow


def test_cli_export_parquet_and_jsonl(cache: zs.Cache, steps: dict[int, Any], tmp_path: Path, capsys: Any) -> None:
    loc, out = str(tmp_path / "cache"), tmp_path / "r.parquet"
    assert main(["export", loc, "all", str(out), "--format", "parquet"]) == 0
    assert "24 rollouts of 2 step(s)" in capsys.readouterr().out
    assert pq.read_table(out).num_rows == 24
    assert main(["export", loc, "1", str(out), "--format", "parquet"]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["export", loc, "1", str(tmp_path), "--format", "jsonl"]) == 2
    assert "is a directory" in capsys.readouterr().err
    jl = tmp_path / "r.jsonl"
    assert main(["export", loc, "1", str(jl), "--format", "jsonl", "--tokenizer", str(TOKENIZER_PATH), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == 12 and doc["location"] == loc and doc["path"] == str(jl)
    assert [json.loads(x)["response"] for x in jl.read_text().splitlines()] == responses(steps[1])
    assert main(["export", loc, "1", str(jl), "--format", "jsonl", "--overwrite", "--tokenizer", "nope/model"]) == 2
    assert "never downloads" in capsys.readouterr().err
