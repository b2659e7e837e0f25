"""Plots for the questions people ask of rollouts (needs ``pip install zarr-skip[notebooks]``).

Every function takes a :class:`~zarr_skip.Cache` (its complete steps, or those given as
``steps``), one :class:`~zarr_skip.StepView` or a list of step views, and returns a
``matplotlib.figure.Figure``. :func:`plot_response_lengths`, :func:`plot_truncation` and
:func:`plot_scores` also take a list of caches (several runs): each run is then a line over
the steps in its own colour, labelled by its experiment name (see
:func:`~zarr_skip.notebook.trends.plot_trend`). Figures are built without pyplot, so nothing global is opened:
Jupyter shows a returned figure (after ``%matplotlib inline``), scripts call ``fig.savefig``.
Pass ``ax`` to draw into an existing axes instead (its figure is returned).

Only what a plot needs is read: response lengths of a jagged column come from its stored
per-row lengths (no token is read); a padded batch's lengths need its ``response_mask``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from zarr_skip.cache import Cache
from zarr_skip.errors import ConfigError, ConfigTypeError
from zarr_skip.lazy import StepView
from zarr_skip.notebook.trends import matplotlib_module, plot_trend, run_labels
from zarr_skip.views.measures import SCORE_COLUMNS, lengths_and_width, pick, response_lengths, row_scores

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "THEME_RC",
    "follow_theme",
    "plot_minibatches",
    "plot_response_lengths",
    "plot_scores",
    "plot_trend",
    "plot_truncation",
    "response_lengths",  # measures, re-exported: plots and the rollout views count the same way
    "row_scores",
]

logger = logging.getLogger(__name__)

#: steps of a cache plotted at most when ``steps`` is not given (evenly spaced)
MAX_STEPS = 40
Source = Cache | StepView | Sequence[StepView] | Sequence[Cache]
_GREY = "#8b949e"
#: matplotlib settings under which a figure reads on a light and a dark notebook theme alike:
#: transparent backgrounds, mid-grey text, axes and ticks
THEME_RC = {
    "figure.facecolor": "none",
    "axes.facecolor": "none",
    "savefig.facecolor": "none",
    "savefig.transparent": True,
    "text.color": _GREY,
    "axes.labelcolor": _GREY,
    "axes.edgecolor": _GREY,
    "axes.titlecolor": _GREY,
    "xtick.color": _GREY,
    "ytick.color": _GREY,
    "grid.color": _GREY,
}


def follow_theme() -> None:
    """Make the figures drawn from now on follow the notebook's theme (:data:`THEME_RC`):
    transparent backgrounds and grey text, readable in JupyterLab's light and dark themes."""
    _matplotlib().rcParams.update(THEME_RC)


def _matplotlib() -> Any:
    return matplotlib_module()  # MissingExtraError naming [notebooks] without matplotlib


def _runs(source: object) -> list[Cache] | None:
    """``source`` as several runs (a list of caches), else ``None``."""
    if isinstance(source, Sequence) and source and all(isinstance(c, Cache) for c in source):
        return list(source)
    return None


def _axes(ax: Axes | None, figsize: tuple[float, float] = (7.0, 3.6)) -> tuple[Figure, Axes]:
    mpl = _matplotlib()
    if ax is not None:
        return cast("Figure", ax.figure), ax
    fig = mpl.figure.Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _subsample(steps: list[int]) -> list[int]:
    if len(steps) <= MAX_STEPS:
        return steps
    pick = np.unique(np.linspace(0, len(steps) - 1, MAX_STEPS).round().astype(int))
    logger.info("plotting %d of %d steps (pass steps= to choose)", len(pick), len(steps))
    return [steps[i] for i in pick]


def _views(source: Source, steps: Sequence[int] | None) -> list[StepView]:
    """The step views a plot covers: a cache's ``steps`` (default: its complete ones)."""
    if isinstance(source, StepView):
        if steps is not None:
            raise ConfigError("steps: only with a cache (a step view is one step)")
        return [source]
    if isinstance(source, Cache):
        chosen = list(steps) if steps is not None else _subsample(source.steps())
        if not chosen:
            raise ConfigError(f"{source.location}: no complete step to plot")
        return [source.load(s) for s in chosen]
    views = cast("list[StepView]", list(source))
    if not views or not all(isinstance(v, StepView) for v in views):
        raise ConfigTypeError("source: expected a Cache, a StepView or a non-empty list of StepViews")
    if steps is not None:
        raise ConfigError("steps: only with a cache")
    return views


def _max_length(source: Source, width: int | None, max_length: int | None) -> int | None:
    if max_length is not None:
        return int(max_length)
    if width is not None:
        return width
    if isinstance(source, Cache) and source.fingerprint and "max_response_length" in source.fingerprint:
        return int(source.fingerprint["max_response_length"])
    return None


def _check_kind(kind: str) -> None:
    if kind not in ("box", "violin"):
        raise ConfigError(f"kind: expected 'box' or 'violin', got {kind!r}")


def _distribution(ax: Axes, data: list[np.ndarray], labels: list[str], kind: str) -> None:
    positions = np.arange(1, len(data) + 1)
    if kind == "box":
        ax.boxplot(
            data,
            positions=positions,
            patch_artist=True,
            widths=0.6,
            showfliers=True,
            boxprops={"facecolor": "#9ecae1", "edgecolor": "#3182bd"},
            medianprops={"color": "#08306b"},
            flierprops={"markersize": 2, "alpha": 0.5},
        )
    else:
        ok = [i for i, d in enumerate(data) if d.size]
        if ok:
            ax.violinplot([data[i] for i in ok], positions=positions[ok], showmedians=True, widths=0.8)
    ax.set_xticks(positions, labels)
    ax.set_xlim(0.4, len(data) + 0.6)


def _step_labels(views: Sequence[StepView]) -> list[str]:
    """Step numbers; with views of several runs, each under its run's label (never two bare "3")."""
    caches: list[Cache] = []
    for v in views:
        if isinstance(v.cache, Cache) and not any(v.cache is c for c in caches):
            caches.append(v.cache)
    if len(caches) < 2 and len({v.step for v in views}) == len(views):
        return [str(v.step) for v in views]
    labels = dict(zip(map(id, caches), run_labels(caches), strict=True))
    return [f"{labels.get(id(v.cache), f'view {i}')}\n{v.step}" for i, v in enumerate(views)]


def plot_response_lengths(
    source: Source,
    *,
    steps: Sequence[int] | None = None,
    column: str | None = None,
    max_length: int | None = None,
    kind: str = "box",
    bins: int = 40,
    ax: Axes | None = None,
) -> Figure:
    """Response lengths: a histogram for one step, one box (or violin) per step for several.

    Parameters
    ----------
    source : a cache (its complete steps, or ``steps``), a step view or a list of them.
    column : see :func:`response_lengths`.
    max_length : drawn as a dashed line; default: the padded width, else the cache
        fingerprint's ``max_response_length``.
    kind : ``box`` or ``violin`` (several steps).
    """
    _check_kind(kind)
    runs = _runs(source)
    if runs is not None:
        return plot_trend(runs, "length", steps=steps, ax=ax)
    views = _views(source, steps)
    found = [lengths_and_width(v, column) for v in views]
    limit = _max_length(source, found[0][1], max_length)
    fig, ax = _axes(ax)
    if len(views) == 1:
        lengths = found[0][0]
        ax.hist(lengths, bins=bins, color="#6baed6", edgecolor="white")
        med = float(np.median(lengths)) if lengths.size else 0.0
        ax.axvline(med, color="#08306b", lw=1.2, label=f"median {med:.0f}")
        if limit is not None:
            share = float((lengths >= limit).mean()) if lengths.size else 0.0
            ax.axvline(limit, color="#cb181d", ls="--", lw=1.2, label=f"max {limit} ({share:.0%} hit it)")
        ax.set_xlabel("response length (tokens)")
        ax.set_ylabel("responses")
        ax.set_title(f"response lengths, step {views[0].step} ({lengths.size} responses)")
        ax.legend(frameon=False)
    else:
        _distribution(ax, [f[0] for f in found], _step_labels(views), kind)
        if limit is not None:
            ax.axhline(limit, color="#cb181d", ls="--", lw=1)
            ax.annotate(
                f"max {limit}",
                xy=(1.0, limit),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="bottom",
                fontsize=8,
                color="#cb181d",
                xytext=(-2, 1),
                textcoords="offset points",
            )
            ax.set_ylim(0, max(limit, max((float(f[0].max()) for f in found if f[0].size), default=0)) * 1.08)
        ax.set_xlabel("step")
        ax.set_ylabel("response length (tokens)")
        ax.set_title("response lengths per step")
    return fig


def plot_truncation(
    source: Source,
    *,
    steps: Sequence[int] | None = None,
    column: str | None = None,
    max_length: int | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Share of responses that reached the maximum length, one bar per step.

    ``max_length`` defaults to the padded width of a padded batch, else the cache
    fingerprint's ``max_response_length``; pass it for step views of jagged batches.
    """
    runs = _runs(source)
    if runs is not None:
        return plot_trend(runs, "truncated", steps=steps, ax=ax)
    views = _views(source, steps)
    found = [lengths_and_width(v, column) for v in views]
    limit = _max_length(source, found[0][1], max_length)
    if limit is None:
        raise ConfigError("max_length: unknown for jagged step views; pass max_length=")
    shares = np.array([float((f[0] >= limit).mean()) if f[0].size else 0.0 for f in found])
    fig, ax = _axes(ax)
    x = np.arange(len(views))
    bars = ax.bar(x, shares * 100, color="#fc9272", edgecolor="#cb181d", width=0.6)
    ax.bar_label(bars, labels=[f"{s:.0%}" for s in shares], padding=2, fontsize=8)
    ax.set_xticks(x, _step_labels(views))
    ax.set_ylim(0, max(10.0, float(shares.max()) * 100 * 1.25))
    ax.set_xlabel("step")
    ax.set_ylabel(f"% of responses at {limit} tokens")
    ax.set_title("truncated responses per step")
    return fig


def plot_scores(
    source: Source,
    column: str | None = None,
    *,
    steps: Sequence[int] | None = None,
    reduce: str = "sum",
    kind: str = "box",
    bins: int = 40,
    ax: Axes | None = None,
) -> Figure:
    """Scores or rewards: a histogram for one step, one box (or violin) per step for several.

    Parameters
    ----------
    column : the score column; default: the first of :data:`SCORE_COLUMNS` present.
    reduce : for token-level columns, ``sum`` or ``mean`` per row (see :func:`row_scores`).
    """
    _check_kind(kind)
    runs = _runs(source)
    if runs is not None:
        return plot_trend(runs, "score", steps=steps, ax=ax)
    views = _views(source, steps)
    scores = [row_scores(v, column, reduce) for v in views]
    name = pick(views[0], column, SCORE_COLUMNS, "score")
    spec = views[0][name].spec
    label = name if not spec.jagged and not spec.shape else f"{name} ({reduce} per row)"
    fig, ax = _axes(ax)
    if len(views) == 1:
        data = scores[0][np.isfinite(scores[0])]
        ax.hist(data, bins=bins, color="#74c476", edgecolor="white")
        if data.size:
            ax.axvline(float(np.mean(data)), color="#00441b", lw=1.2, label=f"mean {np.mean(data):.3g}")
            ax.legend(frameon=False)
        ax.set_xlabel(label)
        ax.set_ylabel("responses")
        ax.set_title(f"{label}, step {views[0].step}")
    else:
        _distribution(ax, [s[np.isfinite(s)] for s in scores], _step_labels(views), kind)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_title(f"{label} per step")
    return fig


def plot_minibatches(source: Source, *, steps: Sequence[int] | None = None, ax: Axes | None = None) -> Figure:
    """Rows per mini-batch, stacked per step (mini-batch metadata only).

    With a cache and no ``steps``, steps that are not complete are drawn too, as one hatched
    bar of the rows their complete mini-batches hold, labelled with their state.
    """
    partial: list[Any] = []
    if isinstance(source, Cache) and steps is None:
        infos = source.status()
        partial = [i for i in infos if not i.complete]
        complete = _subsample([i.step for i in infos if i.complete])
        views = [source.load(s) for s in complete]
    else:
        views = _views(source, steps)
    entries = sorted([(v.step, v) for v in views] + [(i.step, i) for i in partial], key=lambda e: e[0])
    if not entries:
        raise ConfigError(f"{getattr(source, 'location', source)}: no step to plot")
    fig, ax = _axes(ax)
    colours = _matplotlib().colormaps["tab10"]
    indices: set[int] = set()
    for x, (_, item) in enumerate(entries):
        if isinstance(item, StepView):
            bottom = 0
            for p in item.minibatch_info:
                ax.bar(x, p.rows, bottom=bottom, width=0.6, color=colours(p.index % 10), edgecolor="white")
                bottom += p.rows
                indices.add(p.index)
        else:
            ax.bar(x, item.rows, width=0.6, color="none", edgecolor="#cb181d", hatch="//")
            ax.annotate(
                f"{item.state} {item.done}/{item.expected}",
                (x, item.rows),
                ha="center",
                va="bottom",
                fontsize=8,
                color="#cb181d",
                xytext=(0, 2),
                textcoords="offset points",
            )
    if 0 < len(indices) <= 10:
        from matplotlib.patches import Patch

        ax.legend(
            handles=[Patch(color=colours(i % 10), label=f"mini-batch {i}") for i in sorted(indices)],
            frameon=False,
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
        )
    ax.set_xticks(np.arange(len(entries)), [str(e[0]) for e in entries])
    ax.set_xlabel("step")
    ax.set_ylabel("rows")
    ax.set_title("rows per mini-batch")
    return fig
