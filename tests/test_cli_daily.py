"""The CLI as an RL engineer uses it daily: one rollout (--row), a uid prefix, latest and -K
steps, ``python -m zarr_skip``, -o always an output, no abbreviations, hints that run."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import FINGERPRINT, make_batch

import zarr_skip as zs
from zarr_skip.cli.main import EXAMPLES, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
UIDS = ["abc1", "abc1", "abd2", "abd2", "xyz9", "xyz9"]


@pytest.fixture
def loc(tmp_path: Path) -> str:
    cache = zs.open_cache(tmp_path / "cache", dict(FINGERPRINT))
    for step in (1, 2, 3):
        batch = make_batch(6, seed=step)
        batch["uid"] = UIDS
        batch["scores"] = np.arange(6, dtype=np.float32) + 10 * step
        cache.write(step, batch)
    cache.write(4, make_batch(6, seed=4), expected=2)  # incomplete: never "latest"
    return str(tmp_path / "cache")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rows_shown(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return list(json.loads(out)["rollouts"])


def test_show_row_shows_one_rollout_and_options_are_never_abbreviated(loc: str, capsys: Any) -> None:
    (one,) = rows_shown(capsys, "show", loc, "2", "--row", "4")
    assert one["row"] == 4 and one["step"] == 2 and one["scores"] == 24.0
    code, out, _ = run(capsys, "show", loc, "2", "--row", "4")
    assert code == 0 and out.count("── row") == 1 and "── row 4 · uid xyz9" in out
    assert rows_shown(capsys, "show", loc, "2", "--row", "-1")[0]["row"] == 5
    code, _, err = run(capsys, "show", loc, "2", "--row", "6")
    assert code == 2 and "row 6 out of range for 6 rows" in err
    code, _, err = run(capsys, "show", loc, "2", "--ro", "4")  # a prefix of --row / --rows: refused
    assert code == 2 and "unrecognized arguments: --ro" in err
    code, _, err = run(capsys, "show", loc, "2", "--tok", "x")
    assert code == 2 and "--tok" in err
    parsers = [build_parser()]
    for p in list(parsers):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
    assert len(parsers) > 7 and all(not p.allow_abbrev for p in parsers)


def test_uid_takes_a_unique_prefix(loc: str, capsys: Any) -> None:
    group = rows_shown(capsys, "show", loc, "1", "--uid", "abd")
    assert [r["row"] for r in group] == [2, 3] and {r["uid"] for r in group} == {"abd2"}
    assert [r["row"] for r in rows_shown(capsys, "show", loc, "1", "--uid", "xyz9")] == [4, 5]
    code, _, err = run(capsys, "show", loc, "1", "--uid", "ab")
    assert code == 2 and "uid prefix 'ab' begins 2 uids (abc1, abd2)" in err
    code, _, err = run(capsys, "show", loc, "1", "--uid", "q")
    assert code == 2 and "no rows with uid 'q'" in err
    with pytest.raises(zs.ConfigError, match="begins 2 uids"):
        from zarr_skip.views.records import rows_of_uid

        rows_of_uid(zs.open_cache(loc).load(1), "ab")


def test_steps_take_latest_and_negative_indices(loc: str, tmp_path: Path, capsys: Any) -> None:
    assert rows_shown(capsys, "show", loc, "latest", "--row", "0")[0]["step"] == 3  # step 4 is incomplete
    assert rows_shown(capsys, "show", loc, "-1", "--row", "0")[0]["step"] == 3
    assert rows_shown(capsys, "show", loc, "-3", "--row", "0")[0]["step"] == 1
    code, _, err = run(capsys, "show", loc, "-4")
    assert code == 2 and "there are 3 complete step(s) (1, 2, 3)" in err
    code, out, _ = run(capsys, "show", loc, "-2", "--rows", "1", "--json")
    assert code == 0 and json.loads(out)["step"] == 2
    code, out, _ = run(capsys, "verify", loc, "-1", "latest", "--json")
    assert code == 0 and json.loads(out)["experiments"][0]["steps"] == [3]
    code, out, _ = run(capsys, "export", loc, "-2", "latest", str(tmp_path / "r.jsonl"))
    assert code == 0, out
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in records}) == [2, 3]
    code, _, _ = run(capsys, "rm", loc, "-1", "--yes")
    assert code == 0 and zs.open_cache(loc).steps() == [1, 2]


def test_steps_after_an_option(loc: str, tmp_path: Path, capsys: Any) -> None:
    """``report LOC -e NAME -1`` said 'unrecognized arguments: -1' (steps after an option were
    taken only when none began with '-'), and ``verify LOC -e NAME 1`` refused any step there."""
    name = zs.open_cache(loc).experiment
    assert name is not None
    out = tmp_path / "r.html"
    code, got, err = run(capsys, "report", loc, "-e", name, "-1", "1", "-o", str(out), "--no-plots", "--json")
    assert code == 0, err
    assert json.loads(got)["steps"] == [3, 1] and out.is_file()
    code, got, err = run(capsys, "verify", loc, "-e", name, "-2", "1", "--json")
    assert code == 0, err
    assert json.loads(got)["experiments"][0]["steps"] == [2, 1]
    code, _, err = run(capsys, "verify", loc, "-e", name, "1", "--nope")
    assert code == 2 and "unrecognized arguments: 1 --nope" in err  # an unknown option still is one


def test_dash_o_is_an_output_everywhere(loc: str, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "o.parquet"
    pytest.importorskip("pyarrow")
    code, _, err = run(capsys, "export", loc, "1", "2", "-o", str(out))
    assert code == 0, err
    import pyarrow.parquet as pq

    assert sorted(set(pq.read_table(out).column("step").to_pylist())) == [1, 2]
    for command in (["ls", loc], ["show", loc, "1"], ["verify", loc]):
        code, _, err = run(capsys, *command, "-o", "endpoint_url=http://x")
        assert code == 2 and "unrecognized arguments: -o" in err
    code, _, err = run(capsys, "export", loc, "1")
    assert code == 2 and "expected STEP... OUT (or -o OUT)" in err


def test_python_dash_m_zarr_skip_runs_the_cli(loc: str) -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "zarr_skip", "ls", loc, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert [s["step"] for s in json.loads(done.stdout)["experiments"][0]["steps"]] == [1, 2, 3, 4]


def _examples() -> list[str]:
    """Every ``zarr-skip ...`` line of the help texts."""
    texts = [EXAMPLES]
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts += [p.epilog or "" for p in action.choices.values()]
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip().startswith("zarr-skip ")]
    return [re.split(r"\s{2,}", line)[0] for line in lines]  # the command, not its comment


def test_every_example_in_the_help_parses(capsys: Any) -> None:
    examples = _examples()
    assert len(examples) > 20
    for line in examples:
        argv = shlex.split(line)[1:]
        args, extra = build_parser().parse_known_args(argv)
        steps_after_options = getattr(args, "trailing_steps", False) and all(not x.startswith("-") for x in extra)
        assert not extra or steps_after_options, line


def test_build_parser_is_split_into_short_functions() -> None:
    tree = ast.parse((ROOT / "zarr_skip" / "cli" / "main.py").read_text())
    lengths = {f.name: f.end_lineno - f.lineno + 1 for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}  # type: ignore[operator]
    assert all(n <= 80 for n in lengths.values()), {k: v for k, v in lengths.items() if v > 80}
    assert lengths["build_parser"] < 40
