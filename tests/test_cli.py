"""The ``zarr-skip`` command: a few real subprocess runs, the rest through ``main(argv)``.

The cache under test has, in experiment ``.../rollout``: steps 1 (two mini-batches) and 2
complete, 3 abandoned (written by a process that exited before finishing it) and 4 being
written (by this test process); in ``.../rollout_tq`` a complete step 5 stored as the
SkipManager's TransferQueue mapping.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FINGERPRINT, ChunkRegion, chunk_region, make_batch

import zarr_skip as zs
from zarr_skip.cli._context import UsageError, parse_steps, parse_storage_options
from zarr_skip.cli.main import main

try:
    from tests._s3server import seaweedfs_fixture_server
except ImportError:
    from _s3server import seaweedfs_fixture_server  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
ROLLOUT = {**FINGERPRINT, "role": "rollout"}
TQ = {**FINGERPRINT, "role": "rollout_tq"}
EXP = "exp_proj/GBS4_N2_in8_out16/rollout"
EXP_TQ = "exp_proj/GBS4_N2_in8_out16/rollout_tq"

_ABANDON = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import zarr_skip as zs
from helpers import FINGERPRINT, make_batch
cache = zs.open_cache({loc!r}, {{**FINGERPRINT, "role": "rollout"}})
cache.write(3, make_batch(4, seed=3), expected=2)  # 1 of 2, then the process exits
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def tq_mapping(rows: int = 4, seed: int = 0) -> dict[str, Any]:
    """A mini-batch as the SkipManager's rollout_tq role stores it."""
    batch = make_batch(rows, seed)
    tags = batch.pop("tags")
    return {**batch, "tags": tags, "keys": [f"k{seed}-{i}" for i in range(rows)]}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    loc = tmp_path_factory.mktemp("cli") / "cache"
    code = _ABANDON.format(root=str(ROOT), tests=str(TESTS), loc=str(loc))
    writer = subprocess.Popen([sys.executable, "-c", code], env=_env(), cwd=ROOT)
    cache = zs.open_cache(loc, ROLLOUT)
    cache.write(1, make_batch(6, seed=1), expected=2)
    cache.write(1, make_batch(6, seed=2), expected=2)
    cache.write(2, make_batch(4, seed=4))
    cache.write(4, make_batch(4, seed=5), expected=2)  # this (live) process: "writing"
    zs.open_cache(loc, TQ).write(5, tq_mapping(), meta_info={"global_steps": 5})
    assert writer.wait(120) == 0
    assert [(i.step, i.state) for i in cache.status()] == [
        (1, "complete"),
        (2, "complete"),
        (3, "abandoned"),
        (4, "writing"),
    ]
    return loc


@pytest.fixture
def loc(template: Path, tmp_path: Path) -> str:
    """A private copy of the template cache."""
    return str(shutil.copytree(template, tmp_path / "cache"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def states(loc: str, experiment: str = EXP) -> dict[int, str]:
    return {i.step: i.state for i in zs.open_cache(loc, experiment=experiment).status()}


def chunk_file(loc: str, step: int, column: str) -> ChunkRegion:
    """The one chunk of ``column`` in mini-batch 0 of ``step``, inside its data file."""
    (part,) = [p for p in Path(loc, EXP, str(step)).glob("*/0") if p.is_dir()]
    return chunk_region(part, column)


def flip_byte(path: ChunkRegion) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------ real processes


@pytest.mark.slow
def test_subprocess_exit_codes_and_output(loc: str, tmp_path: Path) -> None:
    broken = str(shutil.copytree(loc, tmp_path / "broken"))
    flipped = chunk_file(broken, 1, "input_ids")
    flip_byte(flipped)
    cmds = {
        "ls": ["ls", loc, "--json"],
        "verify": ["verify", broken],
        "show": ["show", loc, "99", "-e", "rollout"],
    }
    procs = {
        k: subprocess.Popen(
            [sys.executable, "-m", "zarr_skip.cli", *argv],
            env=_env(),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k, argv in cmds.items()
    }
    done = {k: (p.wait(120), *p.communicate()) for k, p in procs.items()}
    code, out, err = done["ls"]
    assert code == 0, err
    doc = json.loads(out)
    steps = {e["name"]: {s["step"]: s["state"] for s in e["steps"]} for e in doc["experiments"]}
    assert steps == {EXP: {1: "complete", 2: "complete", 3: "abandoned", 4: "writing"}, EXP_TQ: {5: "complete"}}
    code, out, err = done["verify"]
    assert code == 1 and "BROKEN step 1, mini-batch 0, column 'input_ids'" in out and str(flipped) in out
    code, out, err = done["show"]
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [f"zarr-skip show: error: {err.split('error: ', 1)[1].strip()}"]
    assert "step 99 not found" in err


# ------------------------------------------------------------------ ls / show


def test_ls_table_and_selection(loc: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "ls", loc)
    assert code == 0
    assert f"{EXP}: 4 step(s) (2 complete, 1 abandoned, 1 writing)" in out and EXP_TQ in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert lines["1"][1:4] == ["complete", "2/2", "12"] and lines["3"][1:3] == ["abandoned", "1/2"]
    assert lines["4"][1:3] == ["writing", "1/2"] and lines["1"][-1].endswith("s")  # age
    code, out, _ = run(capsys, "ls", loc, "-e", "rollout_tq", "--json")
    (exp,) = json.loads(out)["experiments"]
    assert exp["name"] == EXP_TQ and exp["fingerprint"] == TQ
    (step,) = exp["steps"]
    assert step["rows"] == 4 and step["nbytes"] > 0 and step["ratio"] > 0 and step["age_seconds"] >= 0
    code, _, err = run(capsys, "ls", loc, "-e", "nope")
    assert code == 2 and "experiment 'nope' not found" in err and EXP in err
    code, _, err = run(capsys, "ls", str(Path(loc).parent / "missing"))
    assert code == 2 and "does not exist" in err


def test_show_columns_and_rows(loc: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", loc, "5", "-e", "rollout_tq", "--rows", "2")
    assert code == 0
    assert f"step 5 of {EXP_TQ}: complete, 1 mini-batch(es), 4 rows" in out
    assert 'meta_info: {"global_steps": 5}' in out
    head = out.split("first 2 row(s):")[0]
    table = {line.split()[0]: line.split() for line in head.splitlines() if line.split()[:1]}
    assert table["responses"][1:3] == ["nested", "int64"] and table["bf16"][1:3] == ["tensor", "bfloat16"]
    assert table["tags"][1] == "json" and table["keys"][1] == "str"
    assert '  0  {"global_steps": 1, "status": "finished", "seq_len":' in out
    assert '  1  "k0-1"' in out and "  2  " not in out.split("first 2 row(s):")[1]
    assert "len " in out.split("responses (nested int64):")[1].splitlines()[1]
    code, out, _ = run(capsys, "show", loc, "1", "-e", "rollout", "--json", "--rows", "1")
    doc = json.loads(out)
    assert doc["step"] == 1 and doc["rows"] == 12 and doc["minibatches"] == 2
    cols = {c["name"]: c for c in doc["columns"]}
    assert set(cols) == set(make_batch())
    assert all(
        c["nbytes"] > 0 and c["nbytes_stored"] > 0 and c["raw_nbytes"] == c["nbytes"] and len(c["head"]) == 1
        for c in cols.values()
    )
    assert cols["uid"]["head"] == ['"uid-0"'] and cols["input_ids"]["shape"] == [5]


def test_show_errors(loc: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", loc, "3", "-e", "rollout")
    assert code == 2 and "step 3 is abandoned: 1 of 2 mini-batches" in err
    code, _, err = run(capsys, "show", loc, "1")
    assert code == 2 and "several experiments" in err and EXP_TQ in err
    code, _, err = run(capsys, "show", loc, "x", "-e", "rollout")
    assert code == 2 and "step 'x': expected a number, latest or -K" in err
    for extra in ((), ("--text",)):  # were 0 rows, silently
        code, _, err = run(capsys, "show", loc, "1", "-e", "rollout", "--rows", "-3", *extra)
        assert code == 2 and "--rows -3: expected a number of rows >= 0" in err


# ------------------------------------------------------------------ verify


def test_verify_detects_a_flipped_byte(loc: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "verify", loc)
    assert code == 0 and out.count(": ok") == 2
    flipped = chunk_file(loc, 2, "old_log_probs")
    flip_byte(flipped)
    code, out, _ = run(capsys, "verify", loc, "-e", "rollout", "--json")
    assert code == 1
    (exp,) = json.loads(out)["experiments"]
    (problem,) = exp["problems"]
    assert (problem["step"], problem["minibatch"], problem["column"]) == (2, 0, "old_log_probs")
    assert problem["path"] == str(flipped) and problem["kind"] == "ChecksumError"
    assert exp["steps"] == [1, 2] and exp["chunks"] > 0
    code, out, _ = run(capsys, "verify", loc, "1", "-e", "rollout")
    assert code == 0 and "1 step(s)" in out
    code, out, _ = run(capsys, "verify", loc, "3-4", "-e", "rollout")  # named incomplete steps are problems
    assert code == 1 and "step 3: incomplete: step is abandoned" in out and "step 4: incomplete" in out


def test_progress_bar_and_fallback(
    loc: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "verify", loc, "--progress", "-e", "rollout")
    assert code == 0 and "verify" in err and "chunk" in err
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the optional dependency is missing
    code, _, err = run(capsys, "verify", loc, "--progress", "-e", "rollout")
    assert code == 0 and err == ""


# ------------------------------------------------------------------ gc / rm


def test_gc_dry_run_then_yes(loc: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = states(loc)
    code, out, _ = run(capsys, "gc", loc, "--dry-run")
    assert code == 0 and "would remove" in out and f"{EXP}/3" in out and "abandoned" in out
    assert "steps being written, kept: [4]" in out and "dry run: nothing removed" in out
    assert states(loc) == before
    code, out, _ = run(capsys, "gc", loc, "--keep-last", "1", "--pin", "1", "--dry-run", "--json")
    doc = json.loads(out)
    removals = {e["name"]: [(r["step"], r["reason"].split(":")[0]) for r in e["removals"]] for e in doc["experiments"]}
    assert doc["dry_run"] and not doc["removed"]
    assert removals == {EXP: [(3, "abandoned")], EXP_TQ: []}  # 2 is the newest, 1 is pinned
    code, out, err = run(capsys, "gc", loc)  # not a terminal, no --yes: refuse
    assert code == 2 and "stdin is not a terminal" in err and states(loc) == before
    code, out, _ = run(capsys, "gc", loc, "--yes")
    assert code == 0 and f"removed {Path(loc) / EXP / '3'}" in out
    assert states(loc) == {1: "complete", 2: "complete", 4: "writing"}
    code, out, _ = run(capsys, "gc", loc, "--keep-last", "1", "--yes", "--json")
    assert [r["step"] for r in json.loads(out)["experiments"][0]["removals"]] == [1]
    assert states(loc) == {2: "complete", 4: "writing"} and states(loc, EXP_TQ) == {5: "complete"}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "code"), [("n\n", 1), ("y\n", 0)])
def test_gc_asks_on_a_terminal(
    loc: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, answer: str, code: int
) -> None:
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    got, _, err = run(capsys, "gc", loc)
    assert got == code and "remove 1 item(s)? [y/N]" in err
    assert (3 in states(loc)) == (answer == "n\n")


def test_gc_removes_only_what_it_showed_before_the_confirmation(
    loc: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step completing while the question waits would make --keep-last retire one more: the
    answer applies to the list shown, nothing else is removed."""
    from zarr_skip.cli._context import Context

    def confirm_late(self: Context, question: str) -> bool:
        zs.open_cache(loc, ROLLOUT).write(6, make_batch(4, seed=6))  # meanwhile, step 6 completes
        return True

    monkeypatch.setattr(Context, "confirm", confirm_late)
    code, out, _ = run(capsys, "gc", loc, "-e", "rollout", "--keep-last", "1")
    assert code == 0 and "would remove" in out
    assert states(loc) == {2: "complete", 4: "writing", 6: "complete"}  # 2 was not listed: kept
    assert f"removed {Path(loc) / EXP / '1'}" in out and f"removed {Path(loc) / EXP / '2'}" not in out


def test_rm(loc: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "rm", loc, "2", "9", "-e", "rollout", "--yes")
    assert code == 2 and "step(s) 9 not found" in err and 2 in states(loc)
    code, _, err = run(capsys, "rm", loc, "2", "-e", "rollout")
    assert code == 2 and "stdin is not a terminal" in err and 2 in states(loc)
    code, out, err = run(capsys, "rm", loc, "1-2", "4", "-e", "rollout", "--yes", "--json")
    assert code == 0 and json.loads(out) == {"location": loc, "experiment": EXP, "removed": [1, 2, 4]}
    assert "zarr-skip: WARNING: step(s) [4] are being written by a live run" in err
    assert states(loc) == {3: "abandoned"}
    code, _, err = run(capsys, "rm", loc, "5", "--yes")
    assert code == 2 and "several experiments" in err


# ------------------------------------------------------------------ arguments


def test_argument_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_steps(["3-5", "7", "4"]) == [3, 4, 5, 7]
    assert parse_steps(["all"], allow_all=True) is None
    for bad in (["x"], ["all"], ["-3"]):
        with pytest.raises(UsageError):
            parse_steps(bad)
    assert parse_steps(["0-999999"]) == list(range(1_000_000))
    with pytest.raises(UsageError, match=r"'5-3': the end is below the start \(write 3-5\)"):
        parse_steps(["5-3"])  # was no step at all, silently
    with pytest.raises(UsageError, match=r"'0-999999999999': 1000000000000 steps, at most 1,000,000 \(or give 'all'\)"):
        parse_steps(["0-999999999999"])  # was a list of 10**12 numbers
    assert parse_storage_options(["endpoint_url=http://h:9000", "anon=true", "n=3"]) == {
        "endpoint_url": "http://h:9000",
        "anon": True,
        "n": 3,
    }
    code, _, err = run(capsys, "ls", "x", "--storage-option", "novalue")
    assert code == 2 and "expected KEY=VALUE" in err
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "examples:" in out and "exit status" in out
    code, out, _ = run(capsys, "export", "--help")
    assert code == 0 and "zarr-skip export runs/cache 12 13 dumps/ --format verl" in out
    code, _, err = run(capsys, "frobnicate")
    assert code == 2 and "invalid choice" in err


# ------------------------------------------------------------------ import / export


def test_import_export_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_legacy import dump_tq, tq_payload

    fp_dir = tmp_path / "dumps" / "exp_proj" / "GBS4_N2_in8_out16"
    for i in range(2):
        dump_tq(fp_dir, 7, tq_payload(seed=i, step=7), minibatch=i)
    dump_tq(fp_dir, 8, tq_payload(seed=3, step=8), minibatch=1)  # mini-batch 0 missing
    loc = str(tmp_path / "cache")
    code, out, err = run(capsys, "import", str(tmp_path / "dumps"), loc)
    assert code == 0, err
    assert "imported 1 step(s), skipped 1, failed 0" in out and "missing [0]" in out
    assert "split 'exp_proj'" not in err  # one "_": no guess warning
    code, out, _ = run(capsys, "import", str(tmp_path / "dumps"), loc, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["steps"][0]["reason"].startswith("already complete")
    code, out, _ = run(capsys, "export", loc, "all", str(tmp_path / "out"), "--format", "verl")
    assert code == 0 and "step 7: nested tq_batch.pt, 2 file(s), 8 rows" in out
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.pt")) == [
        "exp_proj/GBS4_N2_in8_out16/7/0/tq_batch.pt",
        "exp_proj/GBS4_N2_in8_out16/7/1/tq_batch.pt",
    ]
    code, _, err = run(capsys, "export", loc, "7", str(tmp_path / "out"), "--format", "verl")
    assert code == 2 and "exist" in err
    code, out, _ = run(
        capsys,
        "export",
        loc,
        "7",
        str(tmp_path / "out"),
        "--format",
        "verl",
        "--overwrite",
        "--layout",
        "flat",
        "--json",
    )
    assert code == 0 and json.loads(out)["steps"][0]["reason"] == "flat tq_batch.pt"
    code, _, err = run(capsys, "import", str(tmp_path / "nothing"), loc)
    assert code == 2 and "is not a directory" in err


def test_import_refuses_hostile_pickles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_legacy import _Shell, dump_tq, tq_payload

    marker = tmp_path / "pwned"
    payload = tq_payload(rows=2, step=3)
    payload["tags"][0]["evil"] = _Shell(marker)
    dump_tq(tmp_path / "dumps" / "e_p" / "GBS1_N2_in4_out4", 3, payload)
    loc = str(tmp_path / "cache")
    code, out, err = run(capsys, "import", str(tmp_path / "dumps"), loc)
    assert code == 1 and not marker.exists()
    assert "FAILED" in out and "UnsafePickleError" in err and "posix.system" in err
    with pytest.raises(zs.CacheNotFoundError):  # the refused import wrote nothing
        zs.open_cache(loc)
    code, out, err = run(capsys, "import", str(tmp_path / "dumps"), loc, "--allow-pickle")
    assert code == 0 and marker.exists()  # explicit opt-in: the payload ran
    cache = zs.open_cache(loc, experiment="e_p/GBS1_N2_in4_out4/rollout_tq")
    assert cache.steps() == [3] and cache.load(3)["tags"][0]["evil"] == 0


def test_untyped_failures_are_one_line(
    loc: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("store exploded\nsecond line")

    monkeypatch.setattr(zs, "open_cache", broken)
    code, _, err = run(capsys, "ls", loc)
    assert code == 1 and err == "zarr-skip ls: error: RuntimeError: store exploded (-v shows the traceback)\n"
    with pytest.raises(RuntimeError):
        main(["ls", loc, "-v"])
    monkeypatch.undo()
    empty = tmp_path / "empty"
    emptied = zs.open_cache(empty, FINGERPRINT)
    emptied.write(0, {"x": np.zeros(1)})
    emptied.delete(0)  # a cache root and one experiment, no steps
    code, out, _ = run(capsys, "ls", str(empty), "--json")
    assert code == 0 and [e["steps"] for e in json.loads(out)["experiments"]] == [[]]


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.timeout(120)
def test_s3_location_with_storage_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_legacy import dump_tq, tq_payload

    with seaweedfs_fixture_server(tmp_path / "weed") as server:
        url = server.s3_url("cli")
        opts = [x for k, v in server.storage_options.items() for x in ("--storage-option", f"{k}={json.dumps(v)}")]
        dump_tq(tmp_path / "dumps" / "exp_proj" / "GBS4_N2_in8_out16", 7, tq_payload(seed=1, step=7))
        code, out, err = run(capsys, "import", str(tmp_path / "dumps"), url, *opts)
        assert code == 0 and "imported 1 step(s)" in out, err
        code, out, err = run(capsys, "ls", url, *opts, "--json")
        assert code == 0, err
        assert [[s["step"] for s in e["steps"]] for e in json.loads(out)["experiments"]] == [[7]]
        code, out, _ = run(capsys, "verify", url, *opts)
        assert code == 0 and ": ok" in out
        code, out, _ = run(capsys, "rm", url, "7", *opts, "--yes")
        cache = zs.open_cache(url, experiment=EXP_TQ, storage_options=server.storage_options)
        # SeaweedFS may keep listing the emptied prefix "7/": check that no key is left
        assert code == 0 and cache.steps() == [] and cache.storage.list_prefix(f"{EXP_TQ}/7") == []
        code, _, err = run(capsys, "ls", url)  # no credentials, no endpoint
        assert code in (1, 2) and err.count("\n") == 1


def test_show_renders_every_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loc = str(tmp_path / "c")
    batch = {
        "big": torch.arange(40).view(2, 4, 5),
        "text": ["x" * 300, "line\nbreak"],
        "labels": np.array(["ab", "cd"]),
        "ragged": np.array([np.arange(3), np.arange(12)] + [None], dtype=object)[:2],
        "frac": [Fraction(1, 3), Fraction(2, 3)],
        "flag": torch.tensor([True, False]),
    }
    zs.open_cache(loc, FINGERPRINT).write(0, batch, allow_pickle=True)
    code, out, _ = run(capsys, "show", loc, "0")
    assert code == 0
    rows = out.split("row(s):")[1]
    assert "[0, 1, 2, 3, 4, 5, 6, 7, ...] shape=[4, 5]" in rows
    assert '"xxxx' in rows and "..." in rows and '"line\\nbreak"' in rows
    assert "'ab'" in rows and "len 12: [0, 1, 2, 3, 4, 5, 6, 7, ...]" in rows
    assert "<pickled, " in rows and "Fraction" not in rows  # pickled rows are measured, never unpickled
    assert "  0  True" in rows and all(len(line) <= 110 for line in rows.splitlines())
