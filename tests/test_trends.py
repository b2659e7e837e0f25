"""Trend plots of several runs: one colour per run, labelled, steps on a shared numeric axis."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip import plots
from zarr_skip.synthetic import text_rollouts
from zarr_skip.views.signals import step_signals

pytest.importorskip("matplotlib")
pytest.importorskip("tokenizers")


def _fp(name: str) -> dict[str, object]:
    return {
        "experiment_name": name,
        "project_name": "p",
        "gen_batch_size": 4,
        "n": 4,
        "max_prompt_length": 128,
        "max_response_length": 96,
    }


def _run(path: Path, name: str, steps: list[int], seed: int) -> zs.Cache:
    cache = zs.open_cache(path, _fp(name))
    for step in steps:
        cache.write(step, text_rollouts(4, 4, seed=seed, step=step))
    return zs.open_cache(path, experiment=cache.experiment)


@pytest.fixture
def runs(tmp_path: Path) -> list[zs.Cache]:
    return [_run(tmp_path / "a", "baseline", [1, 2, 3], 1), _run(tmp_path / "b", "lr_2e-6", [2, 3, 4], 2)]


def _lines(fig: object) -> dict[str, tuple[list[float], list[float]]]:
    ax = fig.axes[0]  # type: ignore[attr-defined]
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}


def test_two_runs_draw_one_labelled_line_each_on_shared_steps(runs: list[zs.Cache]) -> None:
    fig = plots.plot_scores(runs)
    lines = _lines(fig)
    assert set(lines) == {"baseline", "lr_2e-6"}
    a, b = lines["baseline"], lines["lr_2e-6"]
    assert a[0] == [1.0, 2.0, 3.0] and b[0] == [2.0, 3.0, 4.0]  # step 3 of both at x=3, told apart by colour
    assert fig.axes[0].get_lines()[0].get_color() != fig.axes[0].get_lines()[1].get_color()
    want = [step_signals(runs[1].load(s))[0].score_mean for s in (2, 3, 4)]
    assert b[1] == pytest.approx(want)
    assert "accuracy" in fig.axes[0].get_title()  # 0/1 scores
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["baseline", "lr_2e-6"]
    fig.savefig(io.BytesIO(), format="png")


def test_length_splits_by_correct_and_wrong_and_truncation_and_same_score(runs: list[zs.Cache]) -> None:
    lines = _lines(plots.plot_response_lengths(runs, steps=[2, 3]))
    assert set(lines) == {"baseline: correct", "baseline: wrong", "lr_2e-6: correct", "lr_2e-6: wrong"}
    s = step_signals(runs[0].load(3))[0]
    assert lines["baseline: wrong"][1][1] == pytest.approx(s.length_wrong)
    trunc = _lines(plots.plot_truncation(runs))
    assert trunc["lr_2e-6"][1] == pytest.approx([step_signals(runs[1].load(t))[0].truncated for t in (2, 3, 4)])
    same = _lines(plots.plot_trend(runs, "same_score_groups"))
    assert same["baseline"][1] == pytest.approx([step_signals(runs[0].load(t))[0].same_score_groups for t in (1, 2, 3)])


def test_by_source_and_labels_made_unique(runs: list[zs.Cache], tmp_path: Path) -> None:
    one = _lines(plots.plot_trend(runs[:1], "score", by_source=True))
    sources = sorted({str(x) for s in (1, 2, 3) for x in runs[0].load(s)["data_source"][:]})
    assert sorted(one) == sources
    twin = _run(tmp_path / "c", "baseline", [1], 3)
    labels = plots.run_signals([runs[0], twin])
    assert len({r.label for r in labels}) == 2 and all(r.label.startswith("baseline") for r in labels)
    with pytest.raises(zs.ConfigError, match="signal"):  # a ZarrSkipError, as every error
        plots.plot_trend(runs, "loss")
    with pytest.raises(zs.ConfigTypeError, match="list of Caches"):
        plots.run_signals([])
    drawn = _lines(plots.plot_trend(labels, "length"))  # signals read once, drawn again without reads
    assert len(drawn) == 4 and all(np.isfinite(y).any() for _, y in drawn.values())


def test_step_views_of_two_runs_are_labelled_by_run(runs: list[zs.Cache]) -> None:
    fig = plots.plot_response_lengths([runs[0].load(3), runs[1].load(3)])
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["baseline\n3", "lr_2e-6\n3"]  # never "3" and "3"
    one = plots.plot_response_lengths([runs[0].load(2), runs[0].load(3)])
    assert [t.get_text() for t in one.axes[0].get_xticklabels()] == ["2", "3"]
