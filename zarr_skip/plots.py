"""Plots of a cache's steps (matplotlib figures); the code lives in :mod:`zarr_skip.notebook.plots`."""

from __future__ import annotations

from zarr_skip.notebook.plots import (
    THEME_RC,
    follow_theme,
    plot_minibatches,
    plot_response_lengths,
    plot_scores,
    plot_trend,
    plot_truncation,
)
from zarr_skip.notebook.trends import run_signals
from zarr_skip.views.measures import response_lengths, row_scores

__all__ = [
    "THEME_RC",
    "follow_theme",
    "plot_minibatches",
    "plot_response_lengths",
    "plot_scores",
    "plot_trend",
    "plot_truncation",
    "response_lengths",
    "row_scores",
    "run_signals",
]
