"""Text and HTML renderings of caches, steps and columns (for terminals and Jupyter).

``repr()`` of a cache, a step or a column is one line from what the handle holds, with no
store request (:func:`cache_head`, :func:`step_head`, :func:`column_head`), so a ``%r`` in a
log line or a debugger pane reads nothing. The listings are for IPython's pretty printer and
Jupyter (``_repr_pretty_``, ``_repr_html_``): they read metadata only (``zarr.json``
documents and directory listings), except a column's, which also reads its first
:data:`PREVIEW_ROWS` rows with ``col[:k]`` (only the chunks holding them). So showing a cache,
a step or a column stays instant on large caches. A cache with more than :data:`MAX_STEPS`
steps shows its first and last steps around an ellipsis row, and reads the status of those
steps only.

HTML uses inline styles only (no scripts, no external assets); every value is escaped.
"""

from __future__ import annotations

import html
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from zarr_skip.errors import ZarrSkipError
from zarr_skip.format.escapes import terminal_text, utf8_text
from zarr_skip.format.specs import nested_rows
from zarr_skip.store.catalog import list_steps

if TYPE_CHECKING:
    from zarr_skip.cache import Cache
    from zarr_skip.format.specs import ColumnSpec
    from zarr_skip.format.state import StepInfo
    from zarr_skip.lazy import LazyColumn, StepView

logger = logging.getLogger(__name__)

#: steps listed in a cache's table at most (half from the start, half from the end)
MAX_STEPS = 50
#: rows a column's preview reads
PREVIEW_ROWS = 5
#: mini-batches listed in a step's rendering at most
MAX_MINIBATCHES = 32
#: characters of a string, JSON value or meta_info value shown
TEXT_CHARS = 80
#: elements of a row of tokens (or any array) shown
TOKENS = 8

#: text and background colours of the state badges
STATE_COLOURS = {
    "complete": ("#116329", "#dafbe1"),
    "writing": ("#7d4e00", "#fff8c5"),
    "abandoned": ("#a40e26", "#ffebe9"),
}
_TABLE = "border-collapse:collapse;margin:4px 0;font-size:12px"
_CELL = "padding:1px 8px"
_ROW = "border-bottom:1px solid rgba(128,128,128,0.3)"
_MONO = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace"


class PrettyPrinter(Protocol):
    """What ``_repr_pretty_`` uses of IPython's pretty printer (``IPython.lib.pretty``)."""

    def text(self, obj: str) -> None: ...


class _Html(str):
    """Text that is already HTML (a badge, a nested table): not escaped again."""


# -- formatting helpers -----------------------------------------------------------------------


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def human_age(seconds: float) -> str:
    """``90`` -> ``'1.5 min'``; a negative or unknown age gives ``'-'``."""
    if math.isnan(seconds) or seconds < 0:
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def ratio_text(raw: int, stored: int) -> str:
    """Compression ratio as ``'3.2x'`` (``'-'`` when nothing is stored)."""
    return f"{raw / stored:.1f}x" if stored and raw else "-"


def _clip(text: str, limit: int = TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _compact(value: Any, limit: int = TEXT_CHARS) -> str:
    """A JSON value on one line, without spaces, clipped."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return _clip(text, limit)


def _esc(text: Any) -> str:
    """``text`` as HTML text, a lone surrogate shown as ``\\ud800`` (so the page can be encoded)."""
    return text if isinstance(text, _Html) else html.escape(utf8_text(str(text)), quote=True)


def row_shape(spec: ColumnSpec) -> str:
    """The shape of one row: ``(2048,)`` dense, ``(*)`` jagged, ``-`` for per-row objects."""
    if spec.kind in ("str", "json", "pickle"):
        return "-"
    if spec.jagged:
        return "(" + ", ".join(["*", *map(str, spec.shape)]) + ")"
    return str(tuple(spec.shape))


def _badge(state: str) -> _Html:
    fg, bg = STATE_COLOURS.get(state, ("#333333", "#eeeeee"))
    return _Html(
        f'<span style="color:{fg};background:{bg};border-radius:8px;padding:1px 7px;'
        f'font-weight:600;font-size:11px">{_esc(state)}</span>'
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[int] = (0,)) -> str:
    """An HTML table; columns numbered in ``left`` are left-aligned, the others right-aligned."""

    def cell(tag: str, i: int, value: Any) -> str:
        align = "left" if i in left else "right"
        return f'<{tag} style="{_CELL};text-align:{align}">{_esc(value)}</{tag}>'

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join(f'<tr style="{_ROW}">' + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f'<table style="{_TABLE}"><thead><tr style="{_ROW}">{head}</tr></thead><tbody>{body}</tbody></table>'


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[int] = (0,)) -> list[str]:
    cells = [[str(h) for h in headers]] + [[str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in cells
    ]


def _box(title: str, body: str) -> str:
    return f'<div style="margin:2px 0">{title}{body}</div>'


# -- the cache --------------------------------------------------------------------------------


def cache_head(cache: Cache) -> str:
    """``repr(cache)``: its location and experiment, from the handle alone (no store request)."""
    return f"<zarr_skip.Cache {str(cache.location)!r} experiment={cache.experiment!r}>"


def _step_listing(cache: Cache, limit: int) -> tuple[int, list[StepInfo], list[StepInfo]]:
    """(number of steps, infos of the first steps, infos of the last steps) within ``limit``."""
    assert cache.experiment is not None
    steps = list_steps(cache.storage, cache.experiment)
    if len(steps) <= limit:
        return len(steps), cache.status(steps), []
    first, last = steps[: limit - limit // 2], steps[len(steps) - limit // 2 :]
    infos = cache.status(first + last)
    return len(steps), infos[: len(first)], infos[len(first) :]


def _step_row(info: StepInfo, now: float) -> list[Any]:
    age = human_age(now - info.updated) if info.updated else "-"
    return [
        info.step,
        info.state,
        f"{info.done}/{info.expected}",
        info.rows,
        human_bytes(info.nbytes_stored),
        ratio_text(info.nbytes, info.nbytes_stored),
        age,
    ]


_STEP_HEADERS = ["step", "state", "mini-batches", "rows", "stored", "ratio", "age"]


def _gap(total: int, first: Sequence[StepInfo], last: Sequence[StepInfo]) -> list[Any]:
    return ["…", f"{total - len(first) - len(last)} more steps", "", "", "", "", ""]


def _totals(total: int, infos: Sequence[StepInfo], shown: bool) -> str:
    if not shown:
        return f"{total} steps (showing the first and last {len(infos) // 2 or len(infos)})"
    counts = Counter(i.state for i in infos)
    states = ", ".join(f"{counts[s]} {s}" for s in ("complete", "writing", "abandoned") if counts[s])
    stored = human_bytes(sum(i.nbytes_stored for i in infos))
    rows = sum(i.rows for i in infos)
    return f"{total} step{'s' if total != 1 else ''}" + (f": {states}; {rows} rows, {stored} stored" if total else "")


def cache_text(cache: Cache) -> str:
    """A text table of the cache's steps (or of its experiments when none is chosen)."""
    lines = [cache_head(cache)]
    try:
        if cache.experiment is None:
            found = cache.experiments()
            if not found:
                return lines[0] + "\nno experiments stored"
            lines.append(f"{len(found)} experiments; open one with open_cache(location, experiment=NAME):")
            lines += [f"  {name}  {_compact(fp, 200)}" for name, fp in found.items()]
            return terminal_text("\n".join(lines))
        total, first, last = _step_listing(cache, MAX_STEPS)
    except (ZarrSkipError, OSError) as exc:
        logger.warning("cannot read the status of %s: %s", cache.location, exc)
        return terminal_text(lines[0] + f"\nerror reading the status: {exc}")
    now = time.time()
    lines.append(_totals(total, first + last, not last))
    if total:
        rows = [_step_row(i, now) for i in first]
        if last:
            rows += [_gap(total, first, last)] + [_step_row(i, now) for i in last]
        lines += _text_table(_STEP_HEADERS, rows, left=(1,))
    return terminal_text("\n".join(lines))


def cache_html(cache: Cache) -> str:
    """An HTML table of the cache's steps with state badges (or a list of its experiments)."""
    where = f"<b>zarr_skip cache</b> <code>{_esc(cache.location)}</code>"
    try:
        if cache.experiment is None:
            found = cache.experiments()
            if not found:
                return _box(where, "<div>no experiments stored</div>")
            rows = [
                [name, _Html(f'<code style="{_MONO}">{_esc(_compact(fp, 400))}</code>')] for name, fp in found.items()
            ]
            hint = (
                f"<div>{len(found)} experiments; open one with "
                "<code>zs.open_cache(location, experiment=NAME)</code></div>"
            )
            return _box(where, hint + _table(["experiment", "fingerprint"], rows, left=(0, 1)))
        total, first, last = _step_listing(cache, MAX_STEPS)
    except (ZarrSkipError, OSError) as exc:
        logger.warning("cannot read the status of %s: %s", cache.location, exc)
        return _box(where, f"<div>error reading the status: {_esc(exc)}</div>")
    now = time.time()
    head = (
        f"{where}<div>experiment <code>{_esc(cache.experiment)}</code></div>"
        f"<div>{_esc(_totals(total, first + last, not last))}</div>"
    )

    def row(i: StepInfo) -> list[Any]:
        cells = _step_row(i, now)
        cells[1] = _badge(i.state)
        return cells

    rows = [row(i) for i in first]
    if last:
        rows += [_gap(total, first, last)] + [row(i) for i in last]
    body = _table(_STEP_HEADERS, rows, left=(1,)) if total else ""
    if cache.fingerprint:
        body += (
            f'<details><summary>fingerprint</summary><code style="{_MONO}">'
            f"{_esc(_compact(cache.fingerprint, 2000))}</code></details>"
        )
    return _box(head, body)


# -- a step -----------------------------------------------------------------------------------


def _column_rows(view: StepView) -> list[list[Any]]:
    out = []
    for name, spec in view.schema.items():
        col = view[name]  # metadata only: nothing is read until it is indexed
        out.append(
            [
                name,
                spec.kind,
                spec.dtype,
                row_shape(spec),
                human_bytes(col.nbytes_stored),
                human_bytes(col.nbytes),
                ratio_text(col.nbytes, col.nbytes_stored),
            ]
        )
    return out


_COLUMN_HEADERS = ["column", "kind", "dtype", "row shape", "stored", "raw", "ratio"]


def _part_rows(view: StepView) -> list[list[Any]]:
    parts = view.minibatch_info
    shown = parts if len(parts) <= MAX_MINIBATCHES else parts[: MAX_MINIBATCHES // 2] + parts[-MAX_MINIBATCHES // 2 :]
    rows = [[p.index, p.run, p.rows, human_bytes(p.nbytes_stored), human_bytes(p.nbytes)] for p in shown]
    if len(shown) < len(parts):
        rows.insert(MAX_MINIBATCHES // 2, ["…", f"{len(parts) - len(shown)} more", "", "", ""])
    return rows


def _step_title(view: StepView) -> str:
    return (
        f"step {view.step}: {len(view)} rows in {len(view.minibatch_info)} mini-batch"
        f"{'es' if len(view.minibatch_info) != 1 else ''}, {human_bytes(view.nbytes_stored)} stored "
        f"({human_bytes(view.nbytes)} raw, {ratio_text(view.nbytes, view.nbytes_stored)}), "
        f"batch type {view.batch_type}"
    )


def step_head(view: StepView) -> str:
    """``repr(view)``: the step, its rows and mini-batches (no store request)."""
    return f"<zarr_skip.StepView step={view.step} rows={len(view)} minibatches={len(view.minibatch_info)}>"


def step_text(view: StepView) -> str:
    """The step's columns, mini-batches and meta_info as text (metadata only)."""
    lines = [step_head(view), _step_title(view)]
    lines += ["  " + s for s in _text_table(_COLUMN_HEADERS, _column_rows(view), left=(0, 1, 2, 3))]
    lines.append("mini-batches:")
    lines += ["  " + s for s in _text_table(["index", "run", "rows", "stored", "raw"], _part_rows(view), left=(1,))]
    lines.append(f"meta_info: {_compact(view.meta_info, 400)}")
    return terminal_text("\n".join(lines))


def step_html(view: StepView) -> str:
    """The step's columns, mini-batches and meta_info as HTML (metadata only)."""
    title = f"<div><b>{_esc(_step_title(view))}</b></div>"
    cols = _table(_COLUMN_HEADERS, _column_rows(view), left=(0, 1, 2, 3))
    opened = " open" if len(view.minibatch_info) <= 8 else ""
    parts = (
        f"<details{opened}><summary>{len(view.minibatch_info)} mini-batches</summary>"
        + _table(["index", "run", "rows", "stored", "raw"], _part_rows(view), left=(1,))
        + "</details>"
    )
    meta_rows = [[k, _Html(f'<code style="{_MONO}">{_esc(_compact(v))}</code>')] for k, v in view.meta_info.items()]
    meta = (
        "<details open><summary>meta_info</summary>"
        + (_table(["key", "value"], meta_rows, left=(0, 1)) if meta_rows else "<div>(empty)</div>")
        + "</details>"
    )
    return _box(title, cols + parts + meta)


# -- a column ---------------------------------------------------------------------------------


def _numbers(values: Any) -> np.ndarray:
    """A row (torch tensor or numpy array) as a flat numpy array for display."""
    if hasattr(values, "detach"):  # torch: bf16 and float8 have no numpy dtype
        t = values.detach()
        if t.dtype.is_floating_point and t.dtype.itemsize < 4:
            t = t.float()
        values = t.numpy()
    return np.asarray(values).reshape(-1)


def _scalar(x: Any) -> str:
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.4g}"
    if isinstance(x, (np.bool_, bool)):
        return str(bool(x))
    if isinstance(x, (np.integer, int)):
        return str(int(x))
    if isinstance(x, bytes):
        return _clip(repr(x), 24)
    return _clip(repr(x.item() if isinstance(x, np.generic) else x), 24)


def _format_array(values: Any) -> str:
    flat = _numbers(values)
    body = ", ".join(_scalar(x) for x in flat[:TOKENS])
    return f"[{body}{', …' if flat.size > TOKENS else ''}]"


def format_row(spec: ColumnSpec, value: Any) -> tuple[str, str]:
    """``(length, text)`` of one row for a preview: length is empty for non-jagged rows."""
    if spec.kind in ("nested", "rows"):
        n = int(value.shape[0]) if hasattr(value, "shape") else len(value)
        return str(n), _format_array(value)
    if spec.kind in ("str", "json", "pickle"):
        if isinstance(value, str):
            return str(len(value)), _clip(repr(value))
        return "", _compact(value) if spec.kind == "json" else _clip(repr(value))
    shape = getattr(value, "shape", ())
    if len(shape) == 0:
        return "", _scalar(_numbers(value)[0]) if hasattr(value, "shape") else _scalar(value)
    return "", _format_array(value)


def preview(col: LazyColumn, rows: int = PREVIEW_ROWS) -> tuple[list[tuple[str, str]], str]:
    """The first ``rows`` rows of a column formatted for display, and a note (errors, more rows).

    Reads ``col[:rows]`` only: the chunks holding those rows (and, for a jagged column, its
    per-row lengths).
    """
    k = min(rows, len(col))
    more = f"… {len(col) - k} more rows" if len(col) > k else ""
    if col.spec.kind == "pickle" and not getattr(col, "_allow_pickle", False):
        return [], "pickled rows: load the step with allow_pickle=True to preview them"
    try:
        values = col[:k]
    except (ZarrSkipError, OSError) as exc:
        logger.warning("cannot preview column %r of step %d: %s", col.name, col.step, exc)
        return [], f"cannot read rows: {exc}"
    items = nested_rows(values) if col.spec.kind == "nested" else values
    return [format_row(col.spec, v) for v in items], more


def _column_title(col: LazyColumn) -> str:
    s = col.spec
    shape = row_shape(s)
    return (
        f"column {col.name!r} of step {col.step}: {s.kind} {s.dtype}"
        + (f", row shape {shape}" if shape != "-" else "")
        + f", {len(col)} rows, {human_bytes(col.nbytes_stored)} stored ({human_bytes(col.nbytes)} raw)"
    )


def column_head(col: LazyColumn) -> str:
    """``repr(col)``: the column's name, step, kind, dtype and rows (no store request)."""
    s = col.spec
    return f"<zarr_skip.LazyColumn {col.name!r} step={col.step} kind={s.kind} dtype={s.dtype} rows={len(col)}>"


def column_text(col: LazyColumn) -> str:
    """The column's description and its first rows as text."""
    s = col.spec
    lines = [column_head(col), _column_title(col)]
    rows, note = preview(col)
    jagged = s.kind in ("nested", "rows", "str")
    for i, (n, text) in enumerate(rows):
        lines.append(f"  {i:>3}  " + (f"len {n:>5}  " if jagged else "") + text)
    if note:
        lines.append("  " + note)
    return terminal_text("\n".join(lines))


def column_html(col: LazyColumn) -> str:
    """The column's description and its first rows as HTML."""
    title = f"<div><b>{_esc(_column_title(col))}</b></div>"
    rows, note = preview(col)
    jagged = col.spec.kind in ("nested", "rows", "str")
    headers = ["row", "length", "value"] if jagged else ["row", "value"]
    cells = [
        [i, *([n] if jagged else []), _Html(f'<code style="{_MONO}">{_esc(text)}</code>')]
        for i, (n, text) in enumerate(rows)
    ]
    body = _table(headers, cells, left=(len(headers) - 1,)) if cells else ""
    if note:
        body += f"<div>{_esc(note)}</div>"
    return _box(title, body)
