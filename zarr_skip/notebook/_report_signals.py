"""The report's signal sections: per-step trend plots first, then their figures as a table
(folded when long), for the whole step and per data source; and the plots' PNG rendering."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from zarr_skip.notebook.trends import RunSignals, plot_trend
from zarr_skip.views._html import Markup, esc
from zarr_skip.views.signals import StepSignals

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["OPEN_TABLE_STEPS", "figure_html", "signal_tables", "signals_section", "sources_section"]

#: a signal table of at most this many rows is shown open; a longer one is folded under the plots
OPEN_TABLE_STEPS = 10
PLOTS = (
    ("score", "mean score (accuracy when 0/1) with its spread"),
    ("same_score_groups", "GRPO groups whose answers all scored the same"),
    ("length", "response length, correct and wrong"),
    ("truncated", "truncated responses"),
)
HEADERS = (
    "step",
    "data source",
    "rows",
    "mean score",
    "± std",
    "accuracy",
    "same-score groups",
    "length",
    "correct",
    "wrong",
    "truncated",
)


def _png(draw: Callable[[], Figure], dark: bool) -> str:
    import matplotlib
    import matplotlib.style

    style = dict(matplotlib.style.library["dark_background"]) if dark else {}
    with matplotlib.rc_context(style):
        fig = draw()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=96, facecolor=fig.get_facecolor())
    return base64.b64encode(buf.getvalue()).decode("ascii")


def figure_html(title: str, draw: Callable[[], Figure]) -> Markup:
    """One plot as a figure of two inline PNGs (light and dark; the page's scheme picks one)."""
    light, dark = _png(draw, False), _png(draw, True)
    return Markup(
        f'<figure data-plot="{esc(title)}">'
        f'<img class="zs-plot-light" alt="{esc(title)}" src="data:image/png;base64,{light}">'
        f'<img class="zs-plot-dark" alt="{esc(title)}" src="data:image/png;base64,{dark}"></figure>'
    )


def _plots(run: RunSignals, by_source: bool) -> Markup:
    figures, skipped = [], []
    for signal, title in PLOTS:
        try:
            figures.append(figure_html(title, partial(plot_trend, [run], signal, by_source=by_source)))
        except (KeyError, ValueError, TypeError) as exc:
            skipped.append(f"{title}: {exc}")
    notes = "".join(f'<div class="zs-muted">not drawn: {esc(s)}</div>' for s in skipped)
    return Markup(f'<div class="zs-plots">{"".join(figures)}</div>{notes}')


def _pct(x: float | None) -> tuple[str, str]:
    return ("-", "") if x is None else (f"{x:.1%}", f"{x:.6g}")


def _num(x: float | None) -> tuple[str, str]:
    return ("-", "") if x is None else (f"{x:.4g}", f"{x:.6g}")


def _cells(s: StepSignals) -> list[tuple[str, str]]:
    """``(shown text, sort value)`` per column of :data:`HEADERS`."""
    same = _pct(s.same_score_groups)
    return [
        (str(s.step), str(s.step)),
        (s.data_source if s.data_source is not None else "all", s.data_source or ""),
        (str(s.rows), str(s.rows)),
        _num(s.score_mean),
        _num(s.score_std),
        _pct(s.accuracy),
        (f"{same[0]} of {s.scored_groups}" if s.scored_groups else "-", same[1]),
        _num(s.length_mean),
        _num(s.length_correct),
        _num(s.length_wrong),
        _pct(s.truncated),
    ]


def signal_tables(rows: Sequence[StepSignals], *, caption: str, key: str) -> Markup:
    """The figures as a sortable table (a ``<details>``, open when short)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in HEADERS)
    body = []
    for s in rows:
        tds = "".join(
            f'<td class="zs-num" data-v="{esc(v)}">{esc(t)}</td>' if i not in (1,) else f"<td>{esc(t)}</td>"
            for i, (t, v) in enumerate(_cells(s))
        )
        body.append(f'<tr data-step="{s.step}">{tds}</tr>')
    opened = " open" if len(rows) <= OPEN_TABLE_STEPS else ""
    table = (
        f'<table class="zs-table zs-sortable" data-table="{esc(key)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )
    return Markup(f"<details{opened}><summary>{esc(caption)}</summary>{table}</details>")


def signals_section(run: RunSignals, plots: bool) -> Markup:
    """Per step: the plots, then the table of figures."""
    whole = [step[0] for step in run.steps]
    parts = ["<h2>signals per step</h2>"]
    if plots:
        parts.append(_plots(run, by_source=False))
    parts.append(signal_tables(whole, caption=f"figures of {len(whole)} step(s)", key="steps"))
    return Markup(f'<section id="signals">{"".join(parts)}</section>')


def sources_section(run: RunSignals, plots: bool) -> Markup:
    """Per data source (when the steps have a ``data_source`` column)."""
    rows = [s for step in run.steps for s in step[1:]]
    if not rows:
        return Markup("")
    sources = sorted({str(s.data_source) for s in rows})
    parts = [f"<h2>per data source ({len(sources)}: {esc(', '.join(sources))})</h2>"]
    if plots and len(sources) > 1:
        parts.append(_plots(run, by_source=True))
    parts.append(signal_tables(rows, caption=f"figures of {len(sources)} source(s) over the steps", key="sources"))
    return Markup(f'<section id="sources">{"".join(parts)}</section>')
