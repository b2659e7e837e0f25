"""``zarr-skip show --text``: decoded rollouts with badges, as text and as JSON records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts

pytest.importorskip("tokenizers")
FP = {"experiment_name": "cli_text", "n": 4, "max_response_length": 48}


@pytest.fixture(scope="module")
def batch() -> dict[str, Any]:
    return text_rollouts(4, 4, seed=5, max_response=48)


@pytest.fixture
def loc(tmp_path: Path, batch: dict[str, Any]) -> Path:
    cache = zs.open_cache(tmp_path / "cache", FP)
    cache.write(1, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    return tmp_path / "cache"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def decoded(batch: dict[str, Any], row: int) -> str:
    return str(shipped_tokenizer().decode(batch["responses"][row].tolist(), skip_special_tokens=True))


def test_show_text_prints_decoded_rollouts_with_badges(loc: Path, batch: dict[str, Any], capsys: Any) -> None:
    code, out, err = run(capsys, "show", str(loc), "1", "--text", "--rows", "2")
    assert code == 0, err
    assert out.startswith("step 1 of fp-") and "16 rows, first 2 shown" in out
    assert out.count("── row ") == 2
    assert f"── row 0 · uid {batch['uid'][0]}" in out
    length = len(batch["responses"][0])
    assert f"[{batch['data_source'][0]}] [{length}/48 tokens]" in out
    assert f"[score {batch['score'][0]:.4g}]" in out
    assert "user:\n    " + batch["raw_prompt"][0][0]["content"][:60] in out
    first_line = decoded(batch, 0).splitlines()[0]
    assert "response:\n    " + first_line[:60] in out
    assert all(len(line) <= 100 for line in out.splitlines() if not line.startswith("── "))  # wrapped
    assert "<|im_end|>" not in out


def test_truncated_rollouts_say_so(loc: Path, batch: dict[str, Any], capsys: Any) -> None:
    cut = [i for i in range(16) if len(batch["responses"][i]) == 48]
    assert cut, "the generator gives truncated rollouts"
    code, out, _ = run(capsys, "show", str(loc), "1", "--text", "--rows", "16")
    assert code == 0
    assert out.count("[TRUNCATED at 48]") == len(cut)


def test_show_uid_gives_the_whole_group(loc: Path, batch: dict[str, Any], capsys: Any) -> None:
    uid = batch["uid"][8]
    code, out, _ = run(capsys, "show", str(loc), "1", "--uid", uid)
    assert code == 0
    assert [int(line.split()[2]) for line in out.splitlines() if line.startswith("── row")] == [8, 9, 10, 11]
    code, _, err = run(capsys, "show", str(loc), "1", "--uid", "nope")
    assert code == 2 and "no rows with uid 'nope'" in err
    code, _, err = run(capsys, "show", str(loc), "1", "--uid", uid, "--rows", "2")
    assert code == 2 and "not allowed with argument" in err


def test_show_text_json_gives_records(loc: Path, batch: dict[str, Any], capsys: Any) -> None:
    code, out, _ = run(capsys, "show", str(loc), "1", "--text", "--rows", "3", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["location"] == str(loc) and doc["step"] == 1 and doc["max_response_length"] == 48
    recs = doc["rollouts"]
    assert [r["row"] for r in recs] == [0, 1, 2]
    r = recs[1]
    assert r["response"] == decoded(batch, 1)
    assert r["uid"] == batch["uid"][1] and r["data_source"] == batch["data_source"][1]
    assert r["response_length"] == len(batch["responses"][1]) and r["prompt_length"] == len(batch["prompts"][1])
    assert r["score"] == float(batch["score"][1]) and r["acc"] == bool(batch["acc"][1])
    assert r["reward"] == pytest.approx(float(batch["token_level_rewards"][1].sum()))
    assert r["advantage"] == pytest.approx(float(batch["advantages"][1][0]))
    assert r["messages"] == [{"role": "user", "content": batch["raw_prompt"][1][0]["content"]}]
    assert r["extra_info"] == batch["extra_info"][1] and r["reward_model"] == batch["reward_model"][1]


def test_tokenizer_option_overrides_the_recorded_one(tmp_path: Path, batch: dict[str, Any], capsys: Any) -> None:
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, batch)
    cache.set_attributes({"model": "/nowhere/model"})
    code, out, err = run(capsys, "show", str(tmp_path / "c"), "1", "--text", "--rows", "1")
    assert code == 0
    assert "'/nowhere/model' is not on this machine" in err and "pass --tokenizer PATH" in err
    assert "response ids (" in out and "response:" not in out
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(TOKENIZER_PATH, model / "tokenizer.json")
    code, out, err = run(capsys, "show", str(tmp_path / "c"), "1", "--rows", "1", "--tokenizer", str(model))
    assert code == 0 and err == ""
    assert decoded(batch, 0).splitlines()[0][:50] in out
    code, _, err = run(capsys, "show", str(tmp_path / "c"), "1", "--text", "--tokenizer", "Qwen/Qwen2.5-7B")
    assert code == 2 and "never downloads" in err


def _strict(text: str) -> Any:
    """``text`` parsed as strict JSON (RFC 8259: no NaN or Infinity, which jq, JavaScript and
    Go refuse)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_with_nan_scores(tmp_path: Path, batch: dict[str, Any], capsys: Any) -> None:
    """A NaN score (or an infinite one, or NaN in meta_info) was printed as ``NaN`` /
    ``Infinity``, which is not JSON: the document failed in every strict parser. Numbers JSON
    cannot hold are now ``null``."""
    hostile = dict(batch)
    hostile["score"] = np.array([np.nan, np.inf, -np.inf] + [0.5] * 13, dtype=np.float32)
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, hostile, meta_info={"temperature": float("nan"), "top": [1.0, float("inf")]})
    loc = str(tmp_path / "c")
    tokenizer = str(TOKENIZER_PATH)
    code, out, err = run(capsys, "show", loc, "1", "--text", "--rows", "4", "--json", "--tokenizer", tokenizer)
    assert code == 0, err
    assert [r["score"] for r in _strict(out)["rollouts"]] == [None, None, None, 0.5]
    code, out, err = run(capsys, "show", loc, "1", "--json")
    assert code == 0, err
    assert _strict(out)["meta_info"] == {"temperature": None, "top": [1.0, None]}
