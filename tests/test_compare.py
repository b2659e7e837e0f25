"""``zarr-skip compare A B``: both runs' signals per common step, the --json figures checked
against the values ``load()`` gives (computed with plain Python in test_signals)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_signals import expected_signals, uneven_groups

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.synthetic import text_rollouts

pytest.importorskip("tokenizers")


def _run(path: Path, name: str, steps: list[int], seed: int) -> zs.Cache:
    fp = {
        "experiment_name": name,
        "project_name": "p",
        "gen_batch_size": 4,
        "n": 4,
        "max_prompt_length": 128,
        "max_response_length": 96,
    }
    cache = zs.open_cache(path, fp)
    for step in steps:
        cache.write(step, text_rollouts(6, 4, seed=seed, step=step))
    return zs.open_cache(path, experiment=cache.experiment)


@pytest.fixture
def runs(tmp_path: Path) -> tuple[zs.Cache, zs.Cache]:
    return _run(tmp_path / "a", "baseline", [1, 2, 3], 1), _run(tmp_path / "b", "lr_2e-6", [2, 3, 4], 2)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_json_figures_match_load(runs: tuple[zs.Cache, zs.Cache], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = runs
    code, out, err = run(capsys, "compare", str(a.location), str(b.location), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["a"]["label"], doc["b"]["label"]) == ("baseline", "lr_2e-6")
    assert doc["a"]["experiment"] == a.experiment and doc["b"]["experiment"] == b.experiment
    assert [s["step"] for s in doc["steps"]] == [2, 3]  # the common complete steps
    for entry in doc["steps"]:
        for side, cache in (("a", a), ("b", b)):
            want = expected_signals(cache.load(entry["step"]))
            got = {None: entry[side], **entry[side]["sources"]}
            assert set(got) == set(want)
            for source, figures in want.items():
                for key, value in figures.items():
                    assert got[source][key] == pytest.approx(value), (side, entry["step"], source, key)


def test_compare_prints_both_runs_side_by_side(
    runs: tuple[zs.Cache, zs.Cache], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs
    png = tmp_path / "c.png"
    code, out, err = run(
        capsys, "compare", str(a.location), str(b.location), "--steps", "3", "--by-source", "--plot", str(png)
    )
    assert code == 0, err
    assert out.startswith("A: baseline") and "\nB: lr_2e-6" in out
    assert "step 3 " in out and "step 2 " not in out
    sa, sb = expected_signals(a.load(3))[None], expected_signals(b.load(3))[None]
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("accuracy"))
    assert line.split()[1:] == [f"{sa['accuracy']:.1%}", f"{sb['accuracy']:.1%}"]
    assert "[synthetic/arithmetic]" in out or "[synthetic/word_problems]" in out
    assert png.read_bytes().startswith(b"\x89PNG") and f"wrote {png}" in out


def test_compare_takes_latest_and_minus_k_among_the_common_steps(
    runs: tuple[zs.Cache, zs.Cache], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs  # steps 1-3 and 2-4: in common 2 and 3 (-1 was refused: "not taken here")
    code, out, err = run(capsys, "compare", str(a.location), str(b.location), "--steps", "-1", "-2", "--json")
    assert code == 0, err
    assert [s["step"] for s in json.loads(out)["steps"]] == [3, 2]
    code, _, err = run(capsys, "compare", str(a.location), str(b.location), "--steps", "-3")
    assert code == 2 and "there are 2 complete step(s) (2, 3)" in err


def test_compare_refuses_steps_not_in_both(
    runs: tuple[zs.Cache, zs.Cache], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs
    code, _, err = run(capsys, "compare", str(a.location), str(b.location), "--steps", "1")
    assert code == 2 and "step(s) 1: not complete in both runs" in err and "[2, 3, 4]" in err
    c = _run(tmp_path / "c", "other", [7], 3)
    code, _, err = run(capsys, "compare", str(a.location), str(c.location))
    assert code == 2 and "no step is complete in both runs" in err
    code, _, err = run(capsys, "compare", str(a.location), str(b.location), "--plot", str(tmp_path / "no" / "x.png"))
    assert code == 2 and "does not exist" in err


def test_compare_takes_the_steps_of_a_range_that_both_runs_hold(
    runs: tuple[zs.Cache, zs.Cache], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs  # steps 1-3 and 2-4
    code, out, err = run(capsys, "compare", str(a.location), str(b.location), "--steps", "1-4", "--json")
    assert code == 0, err
    assert [s["step"] for s in json.loads(out)["steps"]] == [2, 3]
    assert "2 step(s) of the range not complete in both runs, left out: 1, 4" in err
    # a step named alone must be in both; a range with none in both is refused
    code, _, err = run(capsys, "compare", str(a.location), str(b.location), "--steps", "2-3", "4")
    assert code == 2 and "step(s) 4: not complete in both runs" in err
    code, _, err = run(capsys, "compare", str(a.location), str(b.location), "--steps", "5-9")
    assert code == 2 and "step(s) 5, 6, 7, 8, 9: not complete in both runs" in err


def test_compare_two_experiments_of_one_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(tmp_path / "c", "base", [1, 2], 1)
    b = _run(tmp_path / "c", "tuned", [2], 2)
    loc = str(tmp_path / "c")
    code, _, err = run(capsys, "compare", loc, loc)
    assert code == 2 and "several experiments" in err
    code, out, err = run(capsys, "compare", loc, loc, "-e", "base", "--experiment-b", "tuned", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["a"]["experiment"], doc["b"]["experiment"]) == (a.experiment, b.experiment)
    assert [s["step"] for s in doc["steps"]] == [2]
    assert doc["steps"][0]["b"]["accuracy"] == pytest.approx(expected_signals(b.load(2))[None]["accuracy"])


def test_compare_names_the_groups_of_the_same_score_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for name in ("a", "b"):
        cache = zs.open_cache(tmp_path / name, {"experiment_name": name, "project_name": "p"})
        cache.write(1, uneven_groups())
        paths.append(str(tmp_path / name))
    code, out, err = run(capsys, "compare", *paths)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("  same-score groups"))
    assert line.split()[2:] == ["50.0%", "of", "4", "50.0%", "of", "4"]  # 2 of the 4 groups of 2+ answers, not of 8


def test_compare_does_not_round_a_small_truncation_away(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    paths = []
    for name, long in (("a", 1), ("b", 0)):  # 1 response of 256 at the limit (0.4%), against none
        lengths = torch.tensor([4] * long + [2] * (256 - long))
        mask = (torch.arange(4)[None, :] < lengths[:, None]).long()
        cache = zs.open_cache(tmp_path / name, {"experiment_name": name, "project_name": "p"})
        cache.write(1, {"responses": mask * 7, "response_mask": mask})
        paths.append(str(tmp_path / name))
    code, out, err = run(capsys, "compare", *paths)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("  truncated"))
    assert line.split()[1:] == ["0.4%", "0.0%"]  # was: 0% and 0%
