"""Trends over steps of one or several runs: the per-step signals of :mod:`zarr_skip.views.signals`
as lines, one colour per run, labelled by the run's experiment name.

Steps are drawn on a numeric axis, so step 3 of two runs is the same place on it and each
line says which run it is (the legend). With ``by_source`` each data source gets its own line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from zarr_skip.cache import Cache
from zarr_skip.errors import AmbiguousExperimentError, ConfigError, ConfigTypeError, MissingExtraError
from zarr_skip.views.signals import StepSignals, step_signals

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SIGNALS", "RunSignals", "plot_trend", "run_labels", "run_signals"]

logger = logging.getLogger(__name__)

#: what :func:`plot_trend` draws: name -> (title, y label)
SIGNALS = {
    "score": ("mean score per step (band: ± 1 std)", "score"),
    "same_score_groups": ("GRPO groups whose answers all scored the same", "share of groups"),
    "length": ("mean response length per step", "tokens"),
    "truncated": ("responses truncated at the length limit", "share of responses"),
}
#: steps of a run read at most when ``steps`` is not given (evenly spaced)
MAX_STEPS = 40


@dataclass(frozen=True, slots=True)
class RunSignals:
    """One run's signals: ``steps[i]`` holds :func:`step_signals` of its i-th step (the whole
    step first, then one per data source)."""

    label: str
    steps: tuple[tuple[StepSignals, ...], ...]


def matplotlib_module() -> Any:
    """matplotlib (with ``matplotlib.figure``), or :class:`MissingExtraError` naming the extra."""
    try:
        import matplotlib
        import matplotlib.figure
        import matplotlib.ticker
    except ImportError as exc:
        raise MissingExtraError(
            "plots need matplotlib, which is not installed: pip install 'zarr-skip[notebooks]'"
        ) from exc
    return matplotlib


def _label(cache: Cache) -> str:
    fp = cache.fingerprint or {}
    name = fp.get("experiment_name")
    return str(name) if name else str(cache.experiment or cache.location)


def run_labels(caches: Sequence[Cache]) -> list[str]:
    """Each run's label: its experiment name, made unique with its role, then its location."""
    labels = [_label(c) for c in caches]
    if len(set(labels)) < len(labels):
        labels = [
            f"{lab} ({str(c.experiment).rsplit('/', 1)[-1]})" if labels.count(lab) > 1 else lab
            for c, lab in zip(caches, labels, strict=True)
        ]
    if len(set(labels)) < len(labels):
        labels = [
            f"{lab} [{c.location}]" if labels.count(lab) > 1 else lab for c, lab in zip(caches, labels, strict=True)
        ]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} #{i + 1}" for i, lab in enumerate(labels)]
    return labels


def _subsample(steps: list[int]) -> list[int]:
    if len(steps) <= MAX_STEPS:
        return steps
    pick = np.unique(np.linspace(0, len(steps) - 1, MAX_STEPS).round().astype(int))
    logger.info("reading %d of %d steps (pass steps= to choose)", len(pick), len(steps))
    return [steps[i] for i in pick]


def run_signals(
    caches: Cache | Sequence[Cache], steps: Sequence[int] | None = None, *, max_length: int | None = None
) -> list[RunSignals]:
    """The signals of each cache's complete steps (or of ``steps``, those each holds complete)."""
    runs = [caches] if isinstance(caches, Cache) else list(caches)
    if not runs or not all(isinstance(c, Cache) for c in runs):
        raise ConfigTypeError("caches: expected a Cache or a non-empty list of Caches")
    out = []
    for cache, label in zip(runs, run_labels(runs), strict=True):
        if cache.experiment is None:
            raise AmbiguousExperimentError(
                f"{cache.location}: holds several experiments; open one with experiment=NAME"
            )
        complete = cache.steps()
        chosen = [s for s in steps if s in complete] if steps is not None else _subsample(complete)
        found = tuple(tuple(step_signals(cache.load(s), max_length=max_length)) for s in chosen)
        out.append(RunSignals(label, found))
    return out


def _series(run: RunSignals, source: str | None) -> list[StepSignals]:
    return [s for step in run.steps for s in step if s.data_source == source]


def _line(ax: Axes, rows: list[StepSignals], signal: str, label: str, colour: Any, style: str) -> None:
    x = np.array([s.step for s in rows], dtype=float)

    def values(name: str) -> np.ndarray:
        return np.array([np.nan if getattr(s, name) is None else getattr(s, name) for s in rows], dtype=float)

    if signal == "score":
        y, spread = values("score_mean"), values("score_std")
        ax.plot(x, y, style, color=colour, marker="o", ms=3, label=label)
        ax.fill_between(x, y - spread, y + spread, color=colour, alpha=0.15, lw=0)
    elif signal == "length" and rows and all(s.binary for s in rows):
        ax.plot(x, values("length_correct"), style, color=colour, marker="o", ms=3, label=f"{label}: correct")
        ax.plot(x, values("length_wrong"), ":", color=colour, marker="x", ms=3, label=f"{label}: wrong")
    else:
        name = {"length": "length_mean"}.get(signal, signal)
        ax.plot(x, values(name), style, color=colour, marker="o", ms=3, label=label)


def plot_trend(
    runs: Cache | Sequence[Cache] | Sequence[RunSignals],
    signal: str = "score",
    *,
    steps: Sequence[int] | None = None,
    by_source: bool = False,
    ax: Axes | None = None,
) -> Figure:
    """One signal per step as lines: one colour per run (or per data source with ``by_source``
    and one run), labelled in the legend.

    Parameters
    ----------
    runs : a cache, several caches (one per run), or their :func:`run_signals`.
    signal : ``score`` (mean with a ± std band; accuracy when scores are 0/1),
        ``same_score_groups``, ``length`` (split by correct and wrong when scores are 0/1) or
        ``truncated``.
    steps : the steps to draw (default: each run's complete steps).
    by_source : a line per data source (the whole step otherwise).
    """
    if signal not in SIGNALS:
        raise ConfigError(f"signal: expected one of {', '.join(SIGNALS)}, got {signal!r}")
    found = list(runs) if isinstance(runs, Sequence) and runs and isinstance(runs[0], RunSignals) else None
    data = cast("list[RunSignals]", found) if found is not None else run_signals(cast("Any", runs), steps)
    mpl = matplotlib_module()
    if ax is None:
        fig = mpl.figure.Figure(figsize=(7.0, 3.6), layout="constrained")
        ax = fig.add_subplot()
    colours = mpl.colormaps["tab10"]
    styles = ["-", "--", "-.", (0, (1, 1)), (0, (5, 1, 1, 1))]
    lines = 0
    for r, run in enumerate(data):
        keys: list[str | None] = [None]
        if by_source:
            named = sorted({s.data_source for step in run.steps for s in step if s.data_source is not None})
            keys = list(named) if named else [None]
        for k, source in enumerate(keys):
            rows = _series(run, source)
            if not rows:
                continue
            colour = colours((k if len(data) == 1 else r) % 10)
            name = run.label if source is None else (source if len(data) == 1 else f"{run.label} · {source}")
            _line(ax, rows, signal, name, colour, "-" if len(data) == 1 else cast("str", styles[k % len(styles)]))
            lines += 1
    if not lines:
        raise ConfigError("no complete step to plot in " + ", ".join(r.label for r in data))
    title, ylabel = SIGNALS[signal]
    binary = all(s.binary for run in data for step in run.steps for s in step)
    if signal == "score" and binary:
        title, ylabel = "accuracy per step (0/1 scores; band: ± 1 std)", "accuracy"
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    drawn = sorted({s.step for run in data for step in run.steps for s in step})
    if len(drawn) <= 12:  # every step its own tick; a single one in the middle
        ax.set_xticks(drawn, [str(s) for s in drawn])
        if len(drawn) == 1:
            ax.set_xlim(drawn[0] - 1, drawn[0] + 1)
    else:
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    if signal in ("same_score_groups", "truncated") or (signal == "score" and binary):
        ax.set_ylim(-0.03, 1.03)
    ax.legend(frameon=False, fontsize=8)
    return cast("Figure", ax.figure)
