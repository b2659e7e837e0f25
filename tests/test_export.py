"""Parquet and JSON Lines exports, one record per rollout, read back by pyarrow, pandas and DuckDB."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import make_batch

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.errors import ConfigError, MissingExtraError, StepNotFoundError, StorageError
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
    assert table.schema.field("score").type == pa.float32() and table.schema.field("acc").type == pa.bool_()
    assert table.schema.field("extra_info").type.num_fields == 4  # JSON objects of one shape: a struct
    d = table.to_pydict()
    assert d["step"] == [1] * 12 + [2] * 12 and d["row"] == list(range(12)) * 2
    assert d["response"] == responses(steps[1]) + responses(steps[2])
    assert d["uid"] == column(steps[1], "uid") + column(steps[2], "uid")
    assert d["score"] == [float(s) for s in column(steps[1], "score") + column(steps[2], "score")]
    assert d["truncated"] == [n == 48 for n in d["response_length"]]
    assert d["extra_info"] == column(steps[1], "extra_info") + column(steps[2], "extra_info")
    assert d["minibatch"] == [0] * 24 and d["experiment"] == [cache.experiment] * 24
    assert d["messages"][0] == [{"role": "user", "content": steps[1]["raw_prompt"][0][0]["content"]}]
    frame = __import__("pandas").read_parquet(out)
    assert list(frame.columns) == list(report.columns) and len(frame) == 24
    right = duckdb.sql(
        f"select count(*), avg(response_length) from '{out}' "
        "where acc and extra_info.answer = reward_model.ground_truth"
    ).fetchall()
    assert right[0][0] == sum(d["acc"]) > 0


def test_jsonl_reads_back_in_json_and_duckdb(cache: zs.Cache, steps: dict[int, Any], tmp_path: Path) -> None:
    out = tmp_path / "rollouts.jsonl"
    report = cache.export(out, steps=np.int64(2))  # a step as numpy gives it
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
    assert d["tags"] == batch["tags"]  # JSON objects of one shape: nested
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


# ------------------------------------------------------------------ formats from names


def test_the_format_follows_the_name_and_a_contradiction_is_an_error(cache: zs.Cache, tmp_path: Path) -> None:
    import gzip

    report = cache.export(tmp_path / "r.jsonl.gz", steps=1)
    assert report.format == "jsonl"
    with gzip.open(tmp_path / "r.jsonl.gz", "rt", encoding="utf-8") as f:
        assert [json.loads(line)["row"] for line in f] == list(range(12))
    for name, fmt in (("r.jsonl", "parquet"), ("r.parquet", "jsonl"), ("r.jsonl.gz", "parquet")):
        with pytest.raises(ConfigError, match=rf"format '{fmt}' but .*{name} is named as") as err:
            cache.export(tmp_path / "other" / name, format=fmt)
        assert "rename it" in str(err.value)
    assert not (tmp_path / "other").exists()
    assert cache.export(tmp_path / "plain.data", steps=1, format="jsonl").format == "jsonl"  # no suffix of its own


def test_a_compressed_name_gets_a_compressed_file_or_an_error(cache: zs.Cache, tmp_path: Path) -> None:
    import gzip

    cache.export(tmp_path / "r.gz", steps=1, format="jsonl")  # was plain text under a .gz name
    with gzip.open(tmp_path / "r.gz", "rt", encoding="utf-8") as f:
        assert len(f.readlines()) == 12
    for name, fmt in (("r.gz", "parquet"), ("r.zst", "jsonl"), ("r.bz2", "jsonl")):
        with pytest.raises(ConfigError, match=rf"format '{fmt}' but path .*{name} is named as"):
            cache.export(tmp_path / "other" / name, steps=1, format=fmt)
    assert not (tmp_path / "other").exists()


def test_an_unknown_format_lists_every_format(cache: zs.Cache, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="format 'SFT': choose one of parquet, jsonl, sft, dpo"):
        cache.export(tmp_path / "r.jsonl", format="SFT")  # type: ignore[arg-type]


def test_the_prompt_is_the_text_the_model_saw_beside_its_messages(cache: zs.Cache, tmp_path: Path) -> None:
    from zarr_skip.synthetic.text import chat_prompt

    cache.export(tmp_path / "r.jsonl", steps=1)
    first = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    question = first["extra_info"]["question"]
    assert first["prompt"] == chat_prompt(question)  # the template's tokens kept
    assert first["prompt"].startswith("<|im_start|>user\n") and first["prompt"].endswith("<|im_start|>assistant\n")
    assert first["messages"] == [{"role": "user", "content": first["raw_prompt"][0]["content"]}]
    assert "<|im_end|>" not in first["response"]


# ------------------------------------------------------------------ nothing changed on the way out

HOSTILE = {
    "reward": [1.0, 0.0, 1.0, 0.5],
    "row": [10, 11, 12, 13],
    "step": ["a", "b", "c", "d"],
    "truncated": ["x", "y", "z", "w"],
    "prompt": ["p0", "p1", "p2", "p3"],
    "messages": [{"m": i} for i in range(4)],
    "response": [[1], [2], [3], [4]],
    "experiment": ["e"] * 4,
    "minibatch": [-1, -2, -3, -4],
}


def _hostile_cache(tmp_path: Path) -> zs.Cache:
    import numpy as np

    cache = zs.open_cache(tmp_path / "hostile", {"experiment_name": "hostile", "max_response_length": 4})
    batch: dict[str, Any] = {k: np.array(v) if k in ("reward", "row", "minibatch") else v for k, v in HOSTILE.items()}
    batch["responses"] = make_batch(4, seed=2)["responses"]
    batch["score"] = np.array([float("nan"), float("inf"), 1.0, float("-inf")], dtype=np.float32)
    batch["big"] = np.array([2**64 - 1, 0, 1, 2**63], dtype=np.uint64)
    batch["huge"] = [{"n": 2**70}, {"n": -(2**70)}, {"n": 1}, {"n": 0}]
    batch["ragged"] = [{"a": 1}, {"b": 2}, {"a": 1.5}, None]
    batch["nan_json"] = [[float("nan")], [float("inf")], [1.0], []]
    cache.write(1, batch)
    return zs.open_cache(tmp_path / "hostile")


def test_stored_columns_named_like_computed_fields_are_exported_as_stored(tmp_path: Path) -> None:
    cache = _hostile_cache(tmp_path)
    cache.export(tmp_path / "h.parquet")
    cache.export(tmp_path / "h.jsonl")
    table = pq.read_table(tmp_path / "h.parquet").to_pydict()
    records = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    for got in (table, {k: [r[k] for r in records] for k in records[0]}):
        for name, stored in HOSTILE.items():
            assert got[name] == stored, name
        assert got["zs_row"] == [0, 1, 2, 3] and got["zs_step"] == [1] * 4 and got["zs_minibatch"] == [0] * 4
        assert got["zs_experiment"] == [cache.experiment] * 4
        assert got["zs_truncated"] == [n >= 4 for n in got["response_length"]]
        assert got["response_ids"] == [r.tolist() for r in make_batch(4, seed=2)["responses"].unbind()]


def test_nan_infinities_and_big_integers_round_trip(tmp_path: Path) -> None:
    import math

    cache = _hostile_cache(tmp_path)
    cache.export(tmp_path / "h.parquet")
    cache.export(tmp_path / "h.jsonl")
    table = pq.read_table(tmp_path / "h.parquet")
    assert table.schema.field("big").type == pa.uint64() and table.schema.field("score").type == pa.float32()
    d = table.to_pydict()
    records = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    for got in (d, {k: [r[k] for r in records] for k in records[0]}):
        score = got["score"]
        assert math.isnan(score[0]) and score[1:] == [math.inf, 1.0, -math.inf]
        assert got["big"] == [2**64 - 1, 0, 1, 2**63]
    assert [r["huge"] for r in records] == [{"n": 2**70}, {"n": -(2**70)}, {"n": 1}, {"n": 0}]
    assert [r["ragged"] for r in records] == [{"a": 1}, {"b": 2}, {"a": 1.5}, None]
    text = set(json.loads(table.schema.metadata[b"zarr_skip.json_columns"]))
    assert {"huge", "ragged"} <= text and "nan_json" not in text  # no one arrow type for theirs: JSON text, exact
    assert [None if v is None else json.loads(v) for v in d["huge"]] == [r["huge"] for r in records]
    assert [None if v is None else json.loads(v) for v in d["ragged"]] == [{"a": 1}, {"b": 2}, {"a": 1.5}, None]
    assert table.schema.field("nan_json").type == pa.list_(pa.float64())
    assert math.isnan(d["nan_json"][0][0]) and d["nan_json"][1:] == [[math.inf], [1.0], []]
    assert math.isnan(records[0]["nan_json"][0])


def test_an_export_into_the_cache_itself_is_refused_before_anything_is_written(cache: zs.Cache) -> None:
    root = Path(cache.storage.root)  # type: ignore[arg-type]
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for inside in (root / "zarr.json", root / "sub" / "r.parquet", root / "r.jsonl"):
        with pytest.raises(ConfigError, match=f"inside the cache at {root}"):
            cache.export(inside)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert zs.open_cache(root).steps() == [1, 2]


def test_cli_export_takes_the_format_from_the_name(cache: zs.Cache, tmp_path: Path, capsys: Any) -> None:
    loc = str(tmp_path / "cache")
    assert main(["export", loc, "all", str(tmp_path / "rollouts.parquet")]) == 0  # no --format: parquet
    capsys.readouterr()
    assert (tmp_path / "rollouts.parquet").is_file() and pq.read_table(tmp_path / "rollouts.parquet").num_rows == 24
    assert main(["export", loc, "1", str(tmp_path / "r.jsonl.gz")]) == 0
    capsys.readouterr()
    assert main(["export", loc, "1", str(tmp_path / "x.parquet"), "--format", "jsonl"]) == 2
    err = capsys.readouterr().err
    assert "format 'jsonl'" in err and "named as parquet" in err and not (tmp_path / "x.parquet").exists()
    assert main(["export", loc, "1", str(tmp_path / "x.parquet"), "--format", "verl"]) == 2
    err = capsys.readouterr().err
    assert "--format verl" in err and "directory" in err and not (tmp_path / "x.parquet").exists()
    assert main(["export", loc, "1", str(tmp_path / "dumps")]) == 2  # a directory name needs --format verl
    err = capsys.readouterr().err
    assert "cannot tell the format" in err and "--format verl" in err and not (tmp_path / "dumps").exists()
    assert main(["export", loc, "1", str(tmp_path / "cache" / "r.parquet")]) == 2
    assert "inside the cache" in capsys.readouterr().err


def test_a_verl_export_into_the_cache_itself_is_refused(cache: zs.Cache, capsys: Any) -> None:
    from zarr_skip.legacy.transfer import export_steps

    root = Path(cache.storage.root)  # type: ignore[arg-type]
    before = sorted(p for p in root.rglob("*"))
    with pytest.raises(ConfigError, match="inside the cache"):
        export_steps(cache, [1], root / "dumps")
    assert main(["export", str(root), "1", str(root / "dumps"), "--format", "verl"]) == 2
    assert "inside the cache" in capsys.readouterr().err
    assert sorted(p for p in root.rglob("*")) == before


def test_torch_dtypes_numpy_lacks_export_as_float32_exactly(tmp_path: Path) -> None:
    import torch

    c = zs.open_cache(tmp_path / "c", {"a": 1})
    bf = torch.tensor([1.5, -2.0, float("nan")]).bfloat16()
    f8 = torch.tensor([0.5, 1.0, -448.0]).to(torch.float8_e4m3fn)
    c.write(1, {"bf": bf, "f8": f8})
    c.export(tmp_path / "x.parquet")
    table = pq.read_table(tmp_path / "x.parquet")
    assert table.schema.field("bf").type == pa.float32() and table.schema.field("f8").type == pa.float32()
    d = table.to_pydict()
    assert d["bf"][:2] == [1.5, -2.0] and d["bf"][2] != d["bf"][2]  # NaN stays NaN
    assert d["f8"] == f8.float().tolist()


def test_a_column_of_other_types_in_other_steps_is_json_text_in_parquet(tmp_path: Path) -> None:
    c = zs.open_cache(tmp_path / "c", {"a": 1})
    import numpy as np

    c.write(1, {"info": [{"a": 1}, {"a": 2}], "n": ["x", "y"], "f": np.array([0.5, 1.5], dtype=np.float32)})
    c.write(2, {"info": [{"b": "q"}, {"b": "r"}], "n": ["z", "w"], "f": np.array([0.1, 2.0])})
    c.export(tmp_path / "x.parquet")
    table = pq.read_table(tmp_path / "x.parquet")
    assert json.loads(table.schema.metadata[b"zarr_skip.json_columns"]) == ["info"]
    assert [json.loads(v) for v in table.column("info").to_pylist()] == [{"a": 1}, {"a": 2}, {"b": "q"}, {"b": "r"}]
    assert table.column("n").to_pylist() == ["x", "y", "z", "w"]
    assert table.schema.field("f").type == pa.float64() and table.column("f").to_pylist() == [0.5, 1.5, 0.1, 2.0]


def test_a_path_under_a_file_is_a_storage_error(cache: zs.Cache, tmp_path: Path) -> None:
    """The error of writing, not one of cleaning up after it (the partial file has no place)."""
    (tmp_path / "file").write_text("")
    for name in ("out.jsonl", "out.parquet"):
        with pytest.raises(StorageError, match="cannot write it"):
            cache.export(tmp_path / "file" / name)


def test_a_step_named_twice_is_exported_once(cache: zs.Cache, tmp_path: Path) -> None:
    report = cache.export(tmp_path / "out.jsonl", steps=[2, 1, 2])
    assert report.steps == (2, 1) and report.rows == 24
    assert [json.loads(line)["step"] for line in (tmp_path / "out.jsonl").read_text().splitlines()] == [2] * 12 + [
        1
    ] * 12


def test_an_empty_choice_of_steps_is_an_error_naming_steps(cache: zs.Cache, tmp_path: Path) -> None:
    # was "no complete steps to export in experiment ...", as if the cache held none
    for call in (
        lambda: cache.export(tmp_path / "r.jsonl", steps=[]),
        lambda: cache.export(tmp_path / "s.jsonl", steps=(), format="sft"),
        lambda: cache.rescore(lambda r: 1.0, steps=[]),
    ):
        with pytest.raises(ConfigError, match=r"steps: empty; name the steps to (export|rescore), or pass steps=None"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
