"""A report of a cache as one self-contained HTML file, to open in a browser or share.

``zarr-skip report LOCATION [STEPS] -o report.html`` (or :func:`write_report`) writes the
cache's step table, the plots :mod:`zarr_skip.plots` draws (PNG images inlined as data URLs, in
a light and a dark version chosen by the reader's colour scheme) and, for each chosen step, its
rollouts with decoded text, grouped by GRPO group (the ``n`` responses of one prompt side by
side, best and worst marked). Nothing is fetched when the file is viewed: no scripts, no
external styles, fonts or images.

Only the shown rows of each step are read (the ``uid`` column whole, to form the groups).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.views._html import CSS, Markup, badge, esc, legend, table, wrap
from zarr_skip.views._rows import RolloutReader
from zarr_skip.views.browse import decoder
from zarr_skip.views.display import human_age, human_bytes, ratio_text
from zarr_skip.views.groups import group_html
from zarr_skip.views.rollouts import page_html, summary_html

if TYPE_CHECKING:
    from zarr_skip.cache import Cache
    from zarr_skip.format.state import StepInfo
    from zarr_skip.lazy import StepView

__all__ = ["ROWS", "report_html", "write_report"]

logger = logging.getLogger(__name__)

#: rollouts shown per step unless told otherwise (whole GRPO groups, so a few more may show)
ROWS = 64
_STATE_KIND = {"complete": "ok", "writing": "warn", "abandoned": "bad"}
_PAGE_CSS = """
:root { color-scheme: light dark; }
body { margin: 0; }
.zs-page { background: var(--zs-bg); min-height: 100vh; padding: 16px 28px; box-sizing: border-box;
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.zs-page h1 { font-size: 22px; margin: 4px 0 2px; }
.zs-page h2 { font-size: 17px; margin: 22px 0 6px; border-bottom: 1px solid var(--zs-border); padding-bottom: 3px; }
.zs-page a { color: var(--zs-info-fg); }
.zs-page code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.zs-plots { display: flex; flex-wrap: wrap; gap: 12px; }
.zs-plots figure { margin: 0; }
.zs-plots img { max-width: 100%; height: auto; border-radius: 6px; border: 1px solid var(--zs-border); }
.zs-plot-dark { display: none; }
@media (prefers-color-scheme: dark) {
  body:not([data-jp-theme-light="true"]) .zs-plot-light { display: none; }
  body:not([data-jp-theme-light="true"]) .zs-plot-dark { display: inline; }
}
.zs-group { margin: 10px 0 16px; }
"""


def _figure_png(draw: Callable[[], Any], dark: bool) -> str:
    """``draw()``'s figure as a base64 PNG, drawn with a dark style when ``dark``."""
    import matplotlib
    import matplotlib.style

    style = dict(matplotlib.style.library["dark_background"]) if dark else {}
    with matplotlib.rc_context(style):
        fig = draw()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=96, facecolor=fig.get_facecolor())
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _plots(cache: Cache, max_length: int | None) -> Markup:
    from zarr_skip.notebook import plots

    kinds: list[tuple[str, Callable[[], Any]]] = [
        ("response lengths per step", lambda: plots.plot_response_lengths(cache)),
        ("truncated responses per step", lambda: plots.plot_truncation(cache, max_length=max_length)),
        ("scores per step", lambda: plots.plot_scores(cache)),
        ("rows per mini-batch", lambda: plots.plot_minibatches(cache)),
    ]
    figures, skipped = [], []
    for title, draw in kinds:
        try:
            light, dark = _figure_png(draw, False), _figure_png(draw, True)
        except (KeyError, ValueError, TypeError) as exc:  # no such column, no max length, no step
            skipped.append(f"{title}: {str(exc).strip(chr(39))}")
            continue
        figures.append(
            f'<figure data-plot="{esc(title)}">'
            f'<img class="zs-plot-light" alt="{esc(title)}" src="data:image/png;base64,{light}">'
            f'<img class="zs-plot-dark" alt="{esc(title)}" src="data:image/png;base64,{dark}"></figure>'
        )
    notes = "".join(f'<div class="zs-muted">not drawn: {esc(s)}</div>' for s in skipped)
    return Markup(f'<div class="zs-plots">{"".join(figures)}</div>{notes}')


def _step_table(infos: Sequence[StepInfo], shown: set[int]) -> Markup:
    now = time.time()
    rows = []
    for i in infos:
        step = Markup(f'<a href="#step-{i.step}">{i.step}</a>') if i.step in shown else i.step
        rows.append(
            [
                step,
                badge(i.state, _STATE_KIND.get(i.state, "")),
                f"{i.done}/{i.expected}",
                i.rows,
                human_bytes(i.nbytes),
                ratio_text(i.raw_nbytes, i.nbytes),
                human_age(now - i.updated) if i.updated else "-",
            ]
        )
    headers = ["step", "state", "mini-batches", "rows", "stored", "ratio", "age"]
    return table(headers, rows, numeric=(2, 3, 4, 5, 6))


def _chosen_rows(reader: RolloutReader, limit: int) -> list[tuple[str | None, np.ndarray]]:
    """Whole GRPO groups, in the order they first appear, until ``limit`` rows are chosen (at
    least one group); without a ``uid`` column the first ``limit`` rows, ungrouped."""
    n = len(reader)
    if "uid" not in reader.view:
        return [(None, np.arange(min(n, limit), dtype=np.int64))]
    uids = reader.uids()
    _, first = np.unique(uids, return_index=True)
    out: list[tuple[str | None, np.ndarray]] = []
    taken = 0
    for start in np.sort(first):
        if out and taken >= limit:
            break
        rows = np.flatnonzero(uids == uids[start])
        out.append((str(uids[start]), rows))
        taken += len(rows)
    return out


def _step_section(view: StepView, dec: Any, max_length: int | None, rows: int, tokens: bool) -> Markup:
    start = f'<section class="zs-step" id="step-{view.step}" data-step="{view.step}"><h2>step {view.step}</h2>'
    if "responses" not in view:
        columns = ", ".join(view.columns)
        return Markup(f'{start}<div class="zs-muted">no responses column (columns: {esc(columns)})</div></section>')
    reader = RolloutReader(view, dec, max_length)
    groups = _chosen_rows(reader, rows)
    every = np.concatenate([r for _, r in groups]) if groups else np.empty(0, np.int64)
    rollouts = {r.row: r for r in reader.read(every, tokens=tokens and dec is not None)}  # a read per column
    shown = len(every)
    what = f"{len(groups)} group{'s' if len(groups) != 1 else ''}" if groups and groups[0][0] is not None else "rows"
    parts = f"{len(view.parts)} mini-batch{'es' if len(view.parts) != 1 else ''}"
    head = f"{len(view)} rows in {parts}; showing {shown} ({what})"
    scores = [r.score for r in rollouts.values() if r.score is not None]
    if scores:
        head += f"; mean score of those shown {np.mean(scores):.4g}"
    if max_length is not None and rollouts:
        share = np.mean([r.truncated for r in rollouts.values()])
        head += f"; {share:.0%} truncated at {max_length}"
    body: list[str] = []
    firsts: list[int] = []
    for uid, group in groups:
        items = [rollouts[int(i)] for i in group]
        if uid is None:
            body += [summary_html(r) for r in items]
            firsts += [r.row for r in items]
        else:
            body.append(f'<div class="zs-group" data-uid="{esc(uid)}">{group_html(uid, items, style=False)}</div>')
            firsts.append(int(group[0]))
    drawn = page_html(body, firsts)  # at most PAGE_CHARS of rows per step
    hint = legend() if tokens and dec is not None else Markup("")
    if dec is None:
        hint = Markup('<div class="zs-muted">no tokenizer: token ids shown (pass --tokenizer PATH)</div>')
    return Markup(f'{start}<div class="zs-muted">{esc(head)}</div>{hint}{drawn}</section>')


def report_html(
    cache: Cache,
    steps: Sequence[int] | None = None,
    *,
    tokenizer: Any = None,
    rows: int = ROWS,
    max_length: int | None = None,
    plots: bool = True,
    tokens: bool = False,
) -> str:
    """The report page of ``cache`` as a string.

    Parameters
    ----------
    cache : the cache (one experiment).
    steps : steps whose rollouts are shown (complete ones); default: the latest complete step.
    tokenizer : decodes the tokens (see :func:`zarr_skip.views.browse.decoder`); without one
        token ids are shown.
    rows : rollouts shown per step (whole GRPO groups: the group that reaches it is kept whole).
    max_length : the response length limit; default: the fingerprint's ``max_response_length``.
    plots : draw the plots (needs matplotlib).
    tokens : add each response's tokens coloured by log-prob (folded; about 100 bytes a token).
    """
    if cache.experiment is None:
        raise ValueError(f"{cache.location}: holds several experiments; open one with experiment=NAME")
    infos = cache.status()
    complete = [i.step for i in infos if i.complete]
    chosen = list(steps) if steps is not None else complete[-1:]
    missing = [s for s in chosen if s not in complete]
    if missing:
        raise ValueError(f"steps {missing}: not complete in {cache.experiment!r} (complete: {complete or 'none'})")
    fp = cache.fingerprint or {}
    if max_length is None and "max_response_length" in fp:
        max_length = int(fp["max_response_length"])
    dec = decoder(cache, tokenizer)
    from zarr_skip import __version__

    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"<h1>zarr_skip report: {esc(cache.experiment)}</h1>"
        f'<div class="zs-muted"><code>{esc(cache.location)}</code> · {len(infos)} steps · written {esc(when)} '
        f"by zarr_skip {esc(__version__)}</div>"
        f'<details><summary>fingerprint</summary><div class="zs-text">{esc(json.dumps(fp, indent=1))}</div></details>'
    )
    nav = " ".join(f'<a href="#step-{s}">step {s}</a>' for s in chosen)
    parts = [head, f"<nav>rollouts: {nav or 'none'}</nav>", "<h2>steps</h2>", _step_table(infos, set(chosen))]
    if plots and complete:
        parts += ["<h2>plots</h2>", _plots(cache, max_length)]
    for s in chosen:
        parts.append(_step_section(cache.load(s), dec, max_length, rows, tokens))
    title = f"zarr_skip report: {cache.experiment}"
    page = wrap("".join(parts), style=False, cls="zs-page")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="color-scheme" content="light dark"><title>{esc(title)}</title>'
        f"<style>{CSS}{_PAGE_CSS}</style></head>"
        f"<body>{page}</body></html>\n"
    )


def write_report(cache: Cache, path: str | Path, steps: Sequence[int] | None = None, **options: Any) -> Path:
    """Write :func:`report_html` to ``path`` (written whole, then renamed into place)."""
    out = Path(path)
    page = report_html(cache, steps, **options)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(page, encoding="utf-8", errors="backslashreplace")  # values are escaped; this is a backstop
    size = tmp.stat().st_size
    tmp.replace(out)
    logger.info("wrote the report of %s (%d bytes) to %s", cache.experiment, size, out)
    return out
