"""What a newcomer meets on the CLI's face: not-found steps, subgroups, JSON keys, warnings, bars, docs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import FINGERPRINT, make_batch

import zarr_skip as zs
from zarr_skip.cli._format import Bar
from zarr_skip.cli.main import main
from zarr_skip.format.chunks import DEFAULT_CHUNK_BYTES

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = {**FINGERPRINT, "role": "rollout"}
EXP = "exp_proj/GBS4_N2_in8_out16/rollout"


@pytest.fixture
def loc(tmp_path: Path) -> Path:
    cache = zs.open_cache(tmp_path / "cache", ROLLOUT, chunk_bytes=128)
    cache.write(1, make_batch(6, seed=1))
    cache.write(2, make_batch(6, seed=2))
    return tmp_path / "cache"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_of_a_missing_step_says_not_found_like_show(loc: Path, capsys: Any) -> None:
    code, out, err = run(capsys, "verify", str(loc), "9")
    assert code == 2 and out == ""
    assert "step(s) 9 not found in experiment" in err and "complete steps: 1, 2" in err and "BROKEN" not in err
    code, _, err2 = run(capsys, "show", str(loc), "9")
    assert code == 2 and "not found" in err2
    code, out, _ = run(capsys, "verify", str(loc), "1-2")
    assert code == 0 and "2 step(s)" in out


@pytest.mark.parametrize("below", [EXP, f"{EXP}/1", "exp_proj"])
def test_ls_on_a_group_inside_a_cache_names_the_cache_above(loc: Path, below: str, capsys: Any) -> None:
    code, _, err = run(capsys, "ls", str(loc / below))
    assert code == 2
    assert f"is not a zarr_skip cache but a group inside one: the cache is at {loc}" in err
    hint = f"run: zarr-skip ls {loc}" + (f" -e {EXP}" if below.startswith(EXP) else "")
    assert hint in err
    code, _, err = run(capsys, "ls", str(loc.parent / "elsewhere"))
    assert code == 2 and "no zarr_skip cache here" in err


def test_gc_and_rm_json_name_the_location(loc: Path, capsys: Any) -> None:
    for argv in (["gc", str(loc), "--dry-run", "--json"], ["gc", str(loc), "--keep-last", "1", "--yes", "--json"]):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and json.loads(out)["location"] == str(loc)
    code, out, _ = run(capsys, "rm", str(loc), "2", "--yes", "--json")
    assert code == 0 and json.loads(out)["location"] == str(loc)
    for cmd in (["ls"], ["verify"]):
        code, out, _ = run(capsys, *cmd, str(loc), "--json")
        assert json.loads(out)["location"] == str(loc)


def test_the_commands_own_warnings_look_like_logged_ones(tmp_path: Path, loc: Path, capsys: Any) -> None:
    from test_legacy import dump_tq, tq_payload

    # an {exp}_{proj} name with several "_": the import guesses the split and warns
    dump_tq(tmp_path / "dumps" / "my_exp_proj" / "GBS4_N2_in8_out16", 7, tq_payload(seed=0, step=7))
    code, _, err = run(capsys, "import", str(tmp_path / "dumps"), str(tmp_path / "imported"))
    assert code == 0
    own = [line for line in err.splitlines() if "split" in line]
    assert own and all(line.startswith("zarr-skip: WARNING: ") for line in own)
    code, _, err = run(capsys, "export", str(loc), "1", str(tmp_path / "r.jsonl"), "--format", "jsonl")
    logged = [line for line in err.splitlines() if "no tokenizer known" in line]
    assert code == 0 and logged and logged[0].startswith("zarr-skip: WARNING: ")
    assert not re.search(r"^warning: ", err, re.M)


def test_verify_reports_progress_against_a_total(loc: Path) -> None:
    calls: list[tuple[int, int]] = []
    report = zs.open_cache(loc).verify(progress=lambda done, total: calls.append((done, total)))
    assert report.chunks > 2
    assert calls[0] == (0, report.chunks) and calls[-1] == (report.chunks, report.chunks)
    assert all(total == report.chunks for _, total in calls)
    stream = io.StringIO()
    with Bar(True, "verify", "chunk", stream=stream) as bar:
        bar.to(0, report.chunks)
    assert f"0/{report.chunks}" in stream.getvalue()


def test_docs_give_the_chunk_size_the_code_uses() -> None:
    text = (ROOT / "docs" / "format.md").read_text()
    sizes = set(re.findall(r"about (\d+) ([KM]iB) of [a-z ]*per chunk", text))
    assert sizes, "docs/format.md states the chunk size"
    assert {int(n) << (10 if unit == "KiB" else 20) for n, unit in sizes} == {DEFAULT_CHUNK_BYTES}
