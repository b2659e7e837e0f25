"""Terminal rendering for the ``zarr-skip`` command: tables, sizes, ages, rows, progress bars."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Self, TextIO

from zarr_skip.format.escapes import terminal_text
from zarr_skip.format.specs import nested_rows
from zarr_skip.views.display import human_bytes

__all__ = ["Bar", "age", "clip", "human_bytes", "render_rows", "SafeFormatter", "table", "terminal_safe"]

WIDTH = 100  # characters of one rendered value
HEAD = 8  # elements shown of one row


def terminal_safe(text: str) -> str:
    """``text`` with everything a terminal would act on shown escaped (``\\x1b``, ``\\x9b``,
    ``\\ud800``): a cache written by someone else cannot set the window title, write the
    clipboard or clear the screen through ``show``, ``ls`` or a message. Every line the
    command prints outside ``--json`` goes through it (:class:`~zarr_skip.cli._context.Context`)."""
    return terminal_text(text)


class SafeFormatter(logging.Formatter):
    """A log formatter whose lines are :func:`terminal_safe` (a library warning may quote a
    recorded path, a column name or a stored value)."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], right: Sequence[int] = ()) -> str:
    """A plain-text table; columns whose index is in ``right`` are right-aligned."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def age(updated: float, now: float | None = None) -> str:
    """``42s``, ``5m``, ``3h``, ``2d`` since ``updated`` (``-`` when unknown)."""
    if updated <= 0:
        return "-"
    s = max(0.0, (time.time() if now is None else now) - updated)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit}"
    return f"{s:.0f}s"


def clip(text: str, width: int = WIDTH) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def _number(x: Any) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def _elements(values: Any) -> str:
    """``[a, b, c, ...]`` of a tensor or array row (flattened), with its shape when cut."""
    import numpy as np
    import torch

    if isinstance(values, torch.Tensor):
        shape = list(values.shape)
        tensor = values.detach().reshape(-1)
        if tensor.dtype.is_floating_point and tensor.dtype not in (torch.float32, torch.float64):
            tensor = tensor.float()
        size, items = tensor.numel(), tensor[:HEAD].tolist()
    else:
        arr = np.asarray(values)
        shape, flat = list(arr.shape), arr.reshape(-1)
        size = flat.size
        items = flat[:HEAD].tolist() if arr.dtype.kind in "biufc" else [repr(v) for v in flat[:HEAD]]
    if not shape:
        return _number(items[0]) if items else "[]"
    text = "[" + ", ".join(_number(v) for v in items) + (", ..." if size > HEAD else "") + "]"
    return text if len(shape) == 1 and size <= HEAD else f"{text} shape={shape}"


def _to_json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr, separators=(", ", ": "))


def render_rows(column: Any, n: int) -> list[str]:
    """The first ``n`` rows of a :class:`~zarr_skip.LazyColumn`, one readable line each.

    Jagged rows show their length and head, strings and JSON rows (tags, keys) their JSON
    text; pickled rows are not unpickled, only measured.
    """
    spec = column.spec
    n = min(n, len(column))
    if n <= 0:
        return []
    if spec.kind == "pickle":
        return [f"<pickled, {int(b)} bytes>" for b in column.lengths()[:n]]
    value = column[:n]
    rows = nested_rows(value) if spec.kind == "nested" else [value[i] for i in range(n)]
    if spec.kind in ("nested", "rows"):
        return [clip(f"len {len(r)}: {_elements(r)}") for r in rows]
    if spec.kind in ("tensor", "ndarray"):
        return [clip(_elements(r)) for r in rows]
    return [clip(_to_json_text(r)) for r in rows]


class Bar:
    """A tqdm progress bar on stderr, or nothing (tqdm missing, disabled, or not a terminal).

    ``enabled=None`` shows it only when stderr is a terminal.
    """

    def __init__(
        self, enabled: bool | None, desc: str, unit: str, total: int | None = None, stream: TextIO | None = None
    ) -> None:
        self._bar: Any = None
        if enabled is False:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # the "cli" extra is optional
            return
        self._bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            file=stream or sys.stderr,
            disable=None if enabled is None else False,
            leave=False,
            dynamic_ncols=True,
        )

    def to(self, n: int, total: int | None = None) -> None:
        """Move the bar to ``n`` done (of ``total`` when given)."""
        if self._bar is None:
            return
        if total is not None and self._bar.total != total:
            self._bar.total = total
            self._bar.refresh()  # show "done/total" from now on, not a bare count
        self._bar.update(n - self._bar.n)

    def callback(self) -> Callable[..., None]:
        """``progress(done)`` or ``progress(done, total)`` for the library's progress hooks."""
        return lambda done, total=None: self.to(done, total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
