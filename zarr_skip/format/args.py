"""The arguments of the reading API, checked where they come in (pure: no I/O).

Every public reading method (``text``, ``messages``, ``rollout``, ``group``, ``find``,
``page``, indexing, ``np.asarray(col, dtype)``, ``to_pandas``, ``table``, ``export``) calls one
of these first, so a bad argument is a typed error naming the argument, the value and what was
expected, before anything is read:

- a wrong type: :class:`~zarr_skip.errors.ConfigTypeError` (a ``TypeError``);
- a value outside what is allowed: :class:`~zarr_skip.errors.ConfigError` (a ``ValueError``);
- a row outside the step: :class:`~zarr_skip.errors.RowIndexError` (an ``IndexError``);
- a column the step does not hold: :class:`~zarr_skip.errors.ColumnNotFoundError` (a ``KeyError``).
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from zarr_skip.errors import ColumnNotFoundError, ConfigError, ConfigTypeError, RowIndexError

__all__ = [
    "MAX_COUNT",
    "column",
    "columns",
    "count",
    "dtype",
    "flag",
    "maybe_count",
    "maybe_flag",
    "name",
    "number",
    "path",
    "row",
    "rows",
    "url_scheme",
    "whole",
]

#: the largest count (rows, page sizes, limits) an argument may name: above it numpy's int64
#: arithmetic would overflow
MAX_COUNT = 1 << 62

#: a URL's scheme (RFC 3986: a letter, then letters, digits, ``+``, ``-`` or ``.``) and ``://``
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def whole(value: Any, name: str, where: str = "") -> int:
    """``value`` as an int (a Python or numpy integer, not a bool nor a float)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigTypeError(f"{_at(where)}{name}: expected an int, got {_shown(value)}")
    return operator.index(value)


def count(value: Any, name: str, *, low: int = 0, high: int = MAX_COUNT, where: str = "") -> int:
    """``value`` as an int in ``low .. high``."""
    n = whole(value, name, where)
    if not low <= n <= high:
        raise ConfigError(f"{_at(where)}{name}: expected an int in {low} .. {high:,}, got {n!r:.40}")
    return n


def maybe_count(value: Any, name: str, *, low: int = 0, high: int = MAX_COUNT, where: str = "") -> int | None:
    """:func:`count`, or None."""
    return None if value is None else count(value, name, low=low, high=high, where=where)


def flag(value: Any, name: str, where: str = "") -> bool:
    """``value`` as True or False."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigTypeError(f"{_at(where)}{name}: expected True or False, got {_shown(value)}")
    return bool(value)


def maybe_flag(value: Any, name: str, where: str = "") -> bool | None:
    """:func:`flag`, or None."""
    return None if value is None else flag(value, name, where)


def maybe_callable(value: Any, name: str, where: str = "") -> Any:
    """``value`` if it is callable, or None (a progress callback, say)."""
    if value is not None and not callable(value):
        raise ConfigTypeError(f"{_at(where)}{name}: expected a callable or None, got {_shown(value)}")
    return value


def number(value: Any, name: str, *, finite: bool = False, where: str = "") -> float:
    """``value`` as a float (a Python or numpy number, not a bool); with ``finite``, neither NaN
    nor infinite."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigTypeError(f"{_at(where)}{name}: expected a number, got {_shown(value)}")
    out = float(value)
    if finite and not math.isfinite(out):
        raise ConfigError(f"{_at(where)}{name}: expected a finite number, got {out!r}")
    return out


def name(value: Any, what: str, where: str = "") -> str:
    """``value`` as a non-empty name (a column's, a format's): a str."""
    if not isinstance(value, str):
        raise ConfigTypeError(f"{_at(where)}{what}: expected a name (a str), got {_shown(value)}")
    if not value:
        raise ConfigError(f"{_at(where)}{what}: expected a name, got an empty str")
    return value


def row(value: Any, n: int, name: str = "row", where: str = "") -> int:
    """``value`` as a row number ``0 .. n-1`` (a negative one counts from the end)."""
    i = whole(value, name, where)
    if not -n <= i < n:
        raise RowIndexError(f"{_at(where)}{name} {i!r:.40} out of range for {n} rows (expected -{n} .. {n - 1})")
    return i + n if i < 0 else i


def rows(value: Any, n: int, name: str = "rows", where: str = "", *, none: bool = True) -> Any:
    """A row selection of ``n`` rows, checked: None (all, when ``none``), one row (an int,
    made non-negative), a slice of ints, or row numbers (a sequence or 1-d array of ints, or a
    boolean mask of ``n``) as a 1-d int64 array of rows ``0 .. n-1``."""
    if value is None and none:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return row(value, n, name, where)
    if isinstance(value, slice):
        for part in ("start", "stop", "step"):
            bound = getattr(value, part)
            if bound is not None:
                whole(bound, f"{name} slice {part}", where)
        if value.step == 0:
            raise ConfigError(f"{_at(where)}{name}: slice step cannot be zero")
        return value
    if isinstance(value, (str, bytes, dict, set, frozenset)) or not isinstance(value, (Sequence, np.ndarray)):
        if not _is_tensor(value):
            raise ConfigTypeError(
                f"{_at(where)}{name}: expected an int, a slice, a sequence of ints or None, got {_shown(value)}"
            )
    return _row_array(value, n, name, where)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "numpy")


def _row_array(value: Any, n: int, name: str, where: str) -> np.ndarray:
    try:
        idx = np.asarray(value.cpu() if _is_tensor(value) else value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigTypeError(f"{_at(where)}{name}: expected a sequence of ints, got {_shown(value)} ({exc})") from None
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise RowIndexError(f"{_at(where)}{name}: a boolean mask of shape {idx.shape}, expected ({n},)")
        return np.flatnonzero(idx).astype(np.int64)
    if idx.dtype == object and idx.ndim == 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in idx):
        bad = next(v for v in idx if not -n <= v < n)  # ints numpy cannot hold: out of range
        raise RowIndexError(f"{_at(where)}{name}: row {bad!r:.40} out of range for {n} rows")
    if idx.size == 0 and idx.ndim == 1:
        return np.empty(0, np.int64)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        what = f"{idx.ndim}-d array of {idx.dtype}" if idx.dtype != object else _shown(value)
        raise ConfigTypeError(f"{_at(where)}{name}: expected a 1-d sequence of ints, got a {what}")
    if idx.dtype.kind == "u" and idx.size and int(idx.max()) >= n:
        raise RowIndexError(f"{_at(where)}{name}: row {int(idx.max())} out of range for {n} rows")
    idx = idx.astype(np.int64)
    out = np.where(idx < 0, idx + n, idx)
    if out.size and (int(out.min()) < 0 or int(out.max()) >= n):
        bad = int(idx[(out < 0) | (out >= n)][0])
        raise RowIndexError(f"{_at(where)}{name}: row {bad} out of range for {n} rows (expected -{n} .. {n - 1})")
    return out


def column(value: Any, known: Iterable[str], name: str = "column", where: str = "") -> str:
    """``value`` as the name of one of the ``known`` columns."""
    if not isinstance(value, str):
        raise ConfigTypeError(f"{_at(where)}{name}: expected a column name (a str), got {_shown(value)}")
    names = list(known)
    if value not in names:
        raise ColumnNotFoundError(f"{_at(where)}{name}: no column {value!r:.80} (columns: {', '.join(names)})")
    return value


def columns(value: Any, known: Iterable[str] | None = None, name: str = "columns", where: str = "") -> list[str] | None:
    """``value`` as a list of column names (each one of ``known`` when given), or None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        hint = " (wrap one name in a list)" if isinstance(value, str) else ""
        raise ConfigTypeError(f"{_at(where)}{name}: expected a list of column names or None, got {_shown(value)}{hint}")
    out = list(value)
    names = None if known is None else list(known)
    for v in out:
        if names is None:
            if not isinstance(v, str):
                raise ConfigTypeError(f"{_at(where)}{name}: expected column names (str), got {_shown(v)}")
        else:
            column(v, names, name, where)
    twice = sorted({v for v in out if out.count(v) > 1})
    if twice:  # a dict of columns holds each once: the second was most likely meant as another
        raise ConfigError(f"{_at(where)}{name}: {', '.join(map(repr, twice))} named twice")
    return out


def dtype(value: Any, name: str = "dtype", where: str = "") -> np.dtype | None:
    """``value`` as a numpy dtype (None stays None)."""
    if value is None:
        return None
    try:
        out: np.dtype[Any] = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise ConfigTypeError(
            f"{_at(where)}{name}: expected a numpy dtype (np.float32, 'int64', ...), got {_shown(value)} ({exc})"
        ) from None
    if out.kind in "OV" and np.dtype(value) != np.dtype(object):  # structured / void: no column is one
        raise ConfigError(f"{_at(where)}{name}: a {out} array cannot hold a column; expected a plain dtype")
    return out


def path(value: Any, name: str = "path", where: str = "") -> str:
    """``value`` as a non-empty filesystem path."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigTypeError(f"{_at(where)}{name}: expected a path (str or os.PathLike), got {_shown(value)}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{_at(where)}{name}: expected a non-empty path, got {value!r:.80}")
    return text


def url_scheme(location: str) -> str | None:
    """The scheme of ``location`` in lower case when it is a URL (``S3://b/p`` gives ``"s3"``),
    or ``None`` for a path: ``/data/run://1`` and ``./a://b`` are paths, since what comes
    before their ``://`` is not a scheme."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else None
