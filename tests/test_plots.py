"""Plots: the right number of boxes and bars, the right values, reading only what they need."""

from __future__ import annotations

import io
import sys
from typing import Any

import numpy as np
import pytest
import torch
from helpers import CountingStore, make_batch

import zarr_skip as zs
from zarr_skip.notebook import plots
from zarr_skip.synthetic import Preset, padded_batch

pytest.importorskip("matplotlib")


@pytest.fixture
def jagged(fingerprint: dict[str, Any]) -> tuple[zs.Cache, CountingStore]:
    """Steps 1-3 complete (2 mini-batches of 6 rows each), step 4 partial (1 of 2)."""
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint, chunk_bytes=64)
    for step in (1, 2, 3):
        for mb in range(2):
            cache.write(step, make_batch(6, seed=10 * step + mb), expected=2)
    zs.open_cache(store, fingerprint).write(4, make_batch(6, seed=99), expected=2)
    return zs.open_cache(store), store


@pytest.fixture
def padded(fingerprint: dict[str, Any]) -> zs.Cache:
    """Two steps of verl's padded DataProto (max response 16)."""
    cache = zs.open_cache(CountingStore(), fingerprint)
    for step in (1, 2):
        cache.write(step, padded_batch(Preset(rows=16, max_prompt=8, max_response=16, n=4), seed=1, step=step))
    return cache


def n_boxes(fig: Any) -> int:
    return sum(type(p).__name__ == "PathPatch" for p in fig.axes[0].patches)


def n_bars(fig: Any) -> int:
    return sum(type(p).__name__ == "Rectangle" for p in fig.axes[0].patches)


def test_lengths_of_a_jagged_column_read_no_token(jagged: tuple[zs.Cache, CountingStore]) -> None:
    cache, store = jagged
    view = cache.load(2)
    store.reads.clear()
    lengths = plots.response_lengths(view)
    want = np.concatenate([make_batch(6, seed=20 + mb)["responses"].offsets().diff().numpy() for mb in range(2)])
    assert lengths.tolist() == want.tolist()
    value_keys = {a["values"].key(c) for a in view["responses"]._parts for c in range(len(a["values"].sizes))}
    assert not set(store.reads) & value_keys  # the lengths, or the records' value_ends: no token
    assert all("/responses/lengths/" in k for k in store.reads), sorted(store.reads)


def test_lengths_of_a_padded_batch_sum_its_mask(padded: zs.Cache) -> None:
    view = padded.load(2)
    mask = view["response_mask"][:]
    assert plots.response_lengths(view).tolist() == mask.sum(-1).tolist()
    fig = plots.plot_truncation(padded)  # max length: the padded width
    heights = [p.get_height() for p in fig.axes[0].patches]
    want = [float((padded.load(s)["response_mask"][:].sum(-1) == 16).float().mean()) * 100 for s in (1, 2)]
    assert heights == pytest.approx(want)
    assert "16 tokens" in fig.axes[0].get_ylabel()
    with pytest.raises(TypeError, match="response_mask"):
        plots.response_lengths(view, "old_log_probs")


def test_length_distribution_one_box_per_step_or_a_histogram(jagged: tuple[zs.Cache, CountingStore]) -> None:
    cache, _ = jagged
    fig = plots.plot_response_lengths(cache)
    assert n_boxes(fig) == 3
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "3"]
    assert n_boxes(plots.plot_response_lengths(cache, steps=[1, 3])) == 2
    violins = plots.plot_response_lengths([cache.load(1), cache.load(2)], kind="violin")
    assert len(violins.axes[0].collections) >= 2
    hist = plots.plot_response_lengths(cache.load(1), bins=7)
    assert n_bars(hist) == 7
    assert sum(p.get_height() for p in hist.axes[0].patches) == 12
    hist.savefig(io.BytesIO(), format="png")  # renders headless


def test_truncation_needs_a_max_length_for_jagged_views(jagged: tuple[zs.Cache, CountingStore]) -> None:
    cache, _ = jagged
    fig = plots.plot_truncation(cache)  # max_response_length of the fingerprint: 16
    assert n_bars(fig) == 3 and all(p.get_height() == 0 for p in fig.axes[0].patches)
    fig = plots.plot_truncation(cache, max_length=4)
    lengths = plots.response_lengths(cache.load(1))
    assert fig.axes[0].patches[0].get_height() == pytest.approx(100 * float((lengths >= 4).mean()))
    with pytest.raises(zs.ConfigError, match="max_length"):  # a ZarrSkipError, as every error
        plots.plot_truncation(cache.load(1))


def test_scores_per_step_and_for_one_step(jagged: tuple[zs.Cache, CountingStore]) -> None:
    cache, _ = jagged
    assert n_boxes(plots.plot_scores(cache)) == 3  # "scores" found by name
    view = cache.load(3)
    want = np.concatenate([make_batch(6, seed=30 + mb)["scores"] for mb in range(2)])
    assert plots.row_scores(view, "scores") == pytest.approx(want)
    hist = plots.plot_scores(view, "scores", bins=5)
    assert n_bars(hist) == 5 and hist.axes[0].get_xlabel() == "scores"
    # token-level values: one sum (or mean) per row, empty rows give nan means
    per_row = plots.row_scores(view, "old_log_probs")
    assert per_row == pytest.approx(view["old_log_probs"][:].sum(-1).double().numpy())
    jag = view["responses"][:]
    sums = plots.row_scores(view, "responses")
    assert sums.tolist() == [float(r.sum()) for r in jag.unbind()]
    means = plots.row_scores(view, "responses", reduce="mean")
    lengths = view["responses"].lengths()
    assert np.isnan(means[lengths == 0]).all()
    assert means[lengths > 0] == pytest.approx(sums[lengths > 0] / lengths[lengths > 0])


def test_scores_of_no_rows_are_none(fingerprint: dict[str, Any]) -> None:
    """A step (or mini-batch) of no rows, or token rows all empty, has no score to sum: numpy
    could not reshape its empty values (a bare ValueError from ``find(best=...)`` too)."""
    cache = zs.open_cache(CountingStore(), fingerprint)
    cache.write(1, make_batch(0))
    rows = [torch.zeros(0), torch.zeros(0)]
    empty = {**make_batch(2), "responses": torch.nested.nested_tensor(rows, layout=torch.jagged)}
    cache.write(2, empty)
    view = cache.load(1)
    for column in ("scores", "old_log_probs", "responses"):
        assert plots.row_scores(view, column).shape == (0,)
    assert view.find(best=2).rows.tolist() == [] and view.find(score=(0, 1)).rows.tolist() == []
    assert plots.row_scores(cache.load(2), "responses").tolist() == [0.0, 0.0]


def test_missing_or_unplottable_columns_raise(
    jagged: tuple[zs.Cache, CountingStore], fingerprint: dict[str, Any]
) -> None:
    cache, _ = jagged
    with pytest.raises(KeyError, match="no column 'reward'"):
        plots.plot_scores(cache, "reward")
    with pytest.raises(KeyError, match="no column 'answers'"):
        plots.plot_response_lengths(cache, column="answers")
    with pytest.raises(TypeError, match="uid"):
        plots.plot_scores(cache, "uid")
    other = zs.open_cache(CountingStore(), fingerprint)
    other.write(1, {"x": torch.arange(3)})
    with pytest.raises(KeyError, match="no score column"):
        plots.plot_scores(other)
    with pytest.raises(KeyError, match="no response column"):
        plots.plot_response_lengths(other)
    with pytest.raises(zs.ConfigError, match="no complete step"):
        plots.plot_response_lengths(zs.open_cache(CountingStore(), fingerprint))
    with pytest.raises(zs.IncompleteStepError):
        plots.plot_response_lengths(cache, steps=[4])
    with pytest.raises(zs.ConfigError, match="kind"):
        plots.plot_scores(cache.load(1), kind="bars")


def test_minibatch_sizes_stack_per_step_and_show_partial_steps(jagged: tuple[zs.Cache, CountingStore]) -> None:
    cache, _ = jagged
    fig = plots.plot_minibatches(cache)
    ax = fig.axes[0]
    assert n_bars(fig) == 3 * 2 + 1
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4"]
    assert [p.get_height() for p in ax.patches] == [6] * 7
    assert any(t.get_text() == "writing 1/2" for t in ax.texts)
    assert n_bars(plots.plot_minibatches(cache.load(2))) == 2


def test_plots_draw_into_a_given_axes(jagged: tuple[zs.Cache, CountingStore]) -> None:
    from matplotlib.figure import Figure

    cache, _ = jagged
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert plots.plot_truncation(cache, ax=left) is fig
    assert plots.plot_scores(cache, ax=right) is fig
    assert n_bars(fig) == 3 and len(right.patches) == 3


def test_a_clear_error_without_matplotlib(
    jagged: tuple[zs.Cache, CountingStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, _ = jagged
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'zarr-skip\[notebooks\]'"):
        plots.plot_response_lengths(cache)
