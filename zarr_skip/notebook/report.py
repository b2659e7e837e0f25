"""A report of a cache as one self-contained HTML file, to open in a browser or share.

``zarr-skip report LOCATION [STEPS]`` (or :func:`write_report`) writes, first, what an RL team
reads: per step the mean score (accuracy when scores are 0/1) with its spread, the share of
GRPO groups whose answers all scored the same, the response length of correct and wrong
answers and the truncation, as plots (inline PNGs, a light and a dark version chosen by the
reader's colour scheme) and a table (folded when long); the same per data source. Then, for
each chosen step, its rollouts: a list (the answer beside the ground truth ``reward_model``
holds) and the GRPO groups' cards (the ``n`` responses of one prompt side by side, best and
worst marked). Storage details (mini-batches, bytes) come last.

Nothing is fetched when the file is viewed. One small inline script sorts the tables (click a
heading) and filters the rollout lists; without it the page is complete, only static.

Only the shown rows of each step are read for its rollouts (the ``uid`` column whole, to form
the groups); the signals read each complete step's score, length, ``uid`` and
``data_source`` columns (the stored lengths of jagged responses, no token).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zarr_skip.errors import AmbiguousExperimentError, ConfigError, MissingExtraError, StorageError
from zarr_skip.notebook._report_rollouts import step_section
from zarr_skip.notebook._report_signals import figure_html, signals_section, sources_section
from zarr_skip.notebook.trends import matplotlib_module, run_signals
from zarr_skip.views._html import CSS, Markup, badge, esc, table, wrap
from zarr_skip.views.browse import decoder
from zarr_skip.views.display import human_age, human_bytes, ratio_text

if TYPE_CHECKING:
    from zarr_skip.cache import Cache
    from zarr_skip.format.state import StepInfo

__all__ = ["ROWS", "SCRIPT", "report_html", "write_report"]

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
.zs-page summary { cursor: pointer; color: var(--zs-muted); margin: 4px 0; }
.zs-plots { display: flex; flex-wrap: wrap; gap: 12px; }
.zs-plots figure { margin: 0; }
.zs-plots img { width: 560px; max-width: 100%; height: auto; border-radius: 6px; border: 1px solid var(--zs-border); }
.zs-plot-dark { display: none; }
@media (prefers-color-scheme: dark) {
  body:not([data-jp-theme-light="true"]) .zs-plot-light { display: none; }
  body:not([data-jp-theme-light="true"]) .zs-plot-dark { display: inline; }
}
.zs-group { margin: 10px 0 16px; }
.zs-truth { margin: 2px 0; }
.zs-page table.zs-sortable.zs-js th { cursor: pointer; user-select: none; }
.zs-page table.zs-sortable th[data-dir="asc"]::after { content: " ▲"; }
.zs-page table.zs-sortable th[data-dir="desc"]::after { content: " ▼"; }
.zs-filter { margin: 6px 0; font-size: 12px; }
.zs-filter input, .zs-filter select { font: inherit; margin-right: 8px; }
"""
#: sorts every ``table.zs-sortable`` by a clicked heading (cells' ``data-v``, numbers as numbers)
#: and puts a text box and a choice (correct, wrong, truncated) above each ``table.zs-filterable``
SCRIPT = """
(() => {
  const value = td => (td.dataset.v !== undefined ? td.dataset.v : td.textContent);
  const sortBy = (table, i, th) => {
    const dir = th.dataset.dir === "asc" ? "desc" : "asc";
    for (const other of table.tHead.rows[0].cells) delete other.dataset.dir;
    th.dataset.dir = dir;
    const body = table.tBodies[0], rows = [...body.rows], sign = dir === "asc" ? 1 : -1;
    const numeric = rows.every(r => value(r.cells[i]) === "" || !isNaN(Number(value(r.cells[i]))));
    rows.sort((a, b) => {
      const x = value(a.cells[i]), y = value(b.cells[i]);
      if (numeric) return sign * ((x === "" ? -Infinity : Number(x)) - (y === "" ? -Infinity : Number(y)));
      return sign * x.localeCompare(y);
    });
    body.append(...rows);
  };
  for (const table of document.querySelectorAll("table.zs-sortable")) {
    table.classList.add("zs-js");
    [...table.tHead.rows[0].cells].forEach((th, i) => {
      th.title = "sort";
      th.addEventListener("click", () => sortBy(table, i, th));
    });
  }
  for (const table of document.querySelectorAll("table.zs-filterable")) {
    const bar = document.createElement("div");
    bar.className = "zs-filter";
    const text = document.createElement("input");
    text.type = "search";
    text.placeholder = "filter rollouts (any text)";
    const kind = document.createElement("select");
    for (const [v, label] of [["", "all"], ["correct", "correct"], ["wrong", "wrong"], ["truncated", "truncated"]]) {
      kind.add(new Option(label, v));
    }
    const count = document.createElement("span");
    const apply = () => {
      const q = text.value.toLowerCase();
      let shown = 0;
      for (const r of table.tBodies[0].rows) {
        const ok = (!q || r.textContent.toLowerCase().includes(q)) &&
          (kind.value === "" || (kind.value === "correct" && r.dataset.correct === "yes") ||
           (kind.value === "wrong" && r.dataset.correct === "no") ||
           (kind.value === "truncated" && r.dataset.truncated === "yes"));
        r.hidden = !ok;
        shown += ok;
      }
      count.textContent = `${shown} of ${table.tBodies[0].rows.length} shown`;
    };
    text.addEventListener("input", apply);
    kind.addEventListener("change", apply);
    bar.append(text, kind, count);
    table.before(bar);
    apply();
  }
})();
"""


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
                human_bytes(i.nbytes_stored),
                ratio_text(i.nbytes, i.nbytes_stored),
                human_age(now - i.updated) if i.updated else "-",
            ]
        )
    headers = ["step", "state", "mini-batches", "rows", "stored", "ratio", "age"]
    return table(headers, rows, numeric=(2, 3, 4, 5, 6))


def _storage(cache: Cache, infos: Sequence[StepInfo], shown: set[int], plots: bool) -> Markup:
    """The storage details: every step's state, mini-batches and bytes, and the mini-batch plot."""
    parts = ['<section id="storage"><h2>storage</h2>', _step_table(infos, shown)]
    if plots and any(i.complete for i in infos):
        from zarr_skip.notebook import plots as p

        parts.append(
            f'<div class="zs-plots">{figure_html("rows per mini-batch", lambda: p.plot_minibatches(cache))}</div>'
        )
    return Markup("".join(parts) + "</section>")


def _chosen(cache: Cache, steps: Sequence[int] | None, complete: list[int]) -> list[int]:
    chosen = list(steps) if steps is not None else complete[-1:]
    missing = [s for s in chosen if s not in complete]
    if missing:
        raise ConfigError(f"steps {missing}: not complete in {cache.experiment!r} (complete: {complete or 'none'})")
    return chosen


def _head(cache: Cache, infos: Sequence[StepInfo], fp: dict[str, Any], chosen: list[int]) -> str:
    from zarr_skip import __version__

    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    nav = " ".join(f'<a href="#step-{s}">step {s}</a>' for s in chosen)
    return (
        f"<h1>zarr_skip report: {esc(cache.experiment)}</h1>"
        f'<div class="zs-muted"><code>{esc(cache.location)}</code> · {len(infos)} steps · written {esc(when)} '
        f"by zarr_skip {esc(__version__)}</div>"
        f'<details><summary>fingerprint</summary><div class="zs-text">{esc(json.dumps(fp, indent=1))}</div></details>'
        f'<nav><a href="#signals">signals</a> · <a href="#sources">per data source</a> · rollouts: {nav or "none"}'
        ' · <a href="#storage">storage</a></nav>'
    )


def report_html(
    cache: Cache,
    steps: Sequence[int] | None = None,
    *,
    tokenizer: Any = None,
    rows: int = ROWS,
    max_length: int | None = None,
    plots: bool = True,
    tokens: bool = False,
    script: bool = True,
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
    plots : draw the plots (needs matplotlib: :class:`~zarr_skip.MissingExtraError` naming
        ``[notebooks]`` without it).
    tokens : add each response's tokens coloured by log-prob (folded; about 100 bytes a token).
    script : add the inline script that sorts and filters the tables (the page is complete
        without it).
    """
    if cache.experiment is None:
        raise AmbiguousExperimentError(f"{cache.location}: holds several experiments; open one with experiment=NAME")
    infos = cache.status()
    complete = [i.step for i in infos if i.complete]
    chosen = _chosen(cache, steps, complete)
    if plots:
        try:
            matplotlib_module()  # before any work: MissingExtraError naming the extra
        except MissingExtraError as exc:
            raise MissingExtraError(
                f"{exc}; or leave the plots out (plots=False, zarr-skip report --no-plots)"
            ) from exc
    fp = cache.fingerprint or {}
    if max_length is None and "max_response_length" in fp:
        max_length = int(fp["max_response_length"])
    dec = decoder(cache, tokenizer)
    parts = [_head(cache, infos, fp, chosen)]
    if complete:
        (run,) = run_signals(cache, complete, max_length=max_length)
        parts += [signals_section(run, plots), sources_section(run, plots)]
    for s in chosen:
        parts.append(step_section(cache.load(s), dec, max_length, rows, tokens))
    parts.append(_storage(cache, infos, set(chosen), plots))
    title = f"zarr_skip report: {cache.experiment}"
    page = wrap("".join(parts), style=False, cls="zs-page")
    js = f"<script>{SCRIPT}</script>" if script else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="color-scheme" content="light dark"><title>{esc(title)}</title>'
        f"<style>{CSS}{_PAGE_CSS}</style></head>"
        f"<body>{page}{js}</body></html>\n"
    )


def write_report(cache: Cache, path: str | Path, steps: Sequence[int] | None = None, **options: Any) -> Path:
    """Write :func:`report_html` to ``path`` (written whole to a hidden temp file beside it, then
    renamed into place): a directory is a ConfigError before anything is read, a file that
    cannot be written a StorageError naming it, with no partial file left."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"report: path {str(out)!r} is a directory; name the .html file to write")
    page = report_html(cache, steps, **options)
    tmp = out.with_name(f".{out.name}.partial")
    try:
        tmp.write_text(page, encoding="utf-8", errors="backslashreplace")  # values are escaped; this is a backstop
        size = tmp.stat().st_size
        tmp.replace(out)
    except OSError as exc:
        raise StorageError(f"report: path {str(out)!r}: cannot write it ({exc})") from exc
    finally:
        with contextlib.suppress(OSError):  # renamed, or no place for it
            tmp.unlink(missing_ok=True)
    logger.info("wrote the report of %s (%d bytes) to %s", cache.experiment, size, out)
    return out
