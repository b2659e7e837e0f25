"""Finding rows of a step: by uid, score, truncation, length or text, and paging through it.

``view.find(...)`` and ``view.page(k)`` return a :class:`~zarr_skip.views.rollouts.RolloutList`.
Each criterion reads one column of the step, whole, and only when it is given: ``uid`` the
uid strings, ``truncated`` / ``longest`` / ``shortest`` the stored per-row lengths (no token),
``score`` / ``best`` / ``worst`` the score column. A ``text`` search decodes the responses of
the rows the other criteria kept, :data:`SEARCH_BLOCK` rows at a time, and stops once it has
``limit`` matches. A page reads nothing until it is shown, and then only its rows.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from zarr_skip.errors import ConfigError, ConfigTypeError, RowIndexError
from zarr_skip.format import args
from zarr_skip.views._rows import RolloutReader
from zarr_skip.views.rollouts import RolloutList

__all__ = ["CRITERIA", "PAGE_ROWS", "SEARCH_BLOCK", "find", "find_rows", "page"]

#: rows of a page (and shown by a search) unless told otherwise
PAGE_ROWS = 20
#: what :func:`find` can be asked
CRITERIA = ("uid", "score", "truncated", "text", "regex", "case", "longest", "shortest", "best", "worst")
#: rows whose responses a text search decodes at a time
SEARCH_BLOCK = 256


def _score_mask(scores: np.ndarray, score: Any) -> np.ndarray:
    if isinstance(score, tuple):
        if len(score) != 2:
            raise ConfigError(f"score: a value or a (low, high) pair, got {score!r}")
        lo, hi = score
        ok = np.isfinite(scores)
        if lo is not None:
            ok &= scores >= float(lo)
        if hi is not None:
            ok &= scores <= float(hi)
        return np.asarray(ok, dtype=bool)
    return np.asarray(np.isclose(scores, float(score), rtol=1e-6, atol=1e-9), dtype=bool)


def _uid_mask(uids: np.ndarray, uid: Any) -> np.ndarray:
    wanted = [str(u) for u in uid] if isinstance(uid, (list, tuple, set, frozenset, np.ndarray)) else [str(uid)]
    return np.isin(uids, np.array(wanted, dtype=object))


def _matcher(text: str, regex: bool, case: bool) -> re.Pattern[str]:
    flags = 0 if case else re.IGNORECASE
    try:
        return re.compile(text if regex else re.escape(text), flags)
    except re.error as exc:
        raise ConfigError(f"text: not a regular expression: {text!r} ({exc})") from None


def _search(
    reader: RolloutReader, rows: np.ndarray, pattern: re.Pattern[str], limit: int | None
) -> tuple[np.ndarray, bool]:
    """Rows whose decoded response matches, in order; and whether the search stopped early."""
    if reader.decoder is None:
        raise ConfigError(
            f"step {reader.view.step}: a text search needs a tokenizer to decode the responses; pass tokenizer="
        )
    found: list[int] = []
    for start in range(0, len(rows), SEARCH_BLOCK):
        block = rows[start : start + SEARCH_BLOCK]
        for row, text in zip(block.tolist(), reader.response_texts(block), strict=True):
            if pattern.search(text):
                found.append(row)
                if limit is not None and len(found) >= limit:
                    return np.array(found, dtype=np.int64), start + SEARCH_BLOCK < len(rows) or row != int(rows[-1])
    return np.array(found, dtype=np.int64), False


def find_rows(
    reader: RolloutReader,
    *,
    uid: Any = None,
    score: Any = None,
    truncated: bool | None = None,
    text: str | None = None,
    regex: bool = False,
    case: bool = False,
    longest: int | None = None,
    shortest: int | None = None,
    best: int | None = None,
    worst: int | None = None,
    limit: int | None = PAGE_ROWS,
) -> tuple[np.ndarray, int | None]:
    """The rows meeting every criterion given, and how many matched in all (``None`` when a
    text search stopped at ``limit`` before looking at every row).

    Parameters
    ----------
    uid : a uid, or several (rows of those GRPO groups).
    score : a value (equal within 1e-6), or a ``(low, high)`` pair, inclusive (``None`` for
        an open end).
    truncated : ``True`` only responses that reached the maximum length, ``False`` only those
        that did not.
    text : a substring of the decoded response (``regex``: a regular expression; ``case``:
        case-sensitive); needs a tokenizer.
    longest, shortest, best, worst : the ``k`` longest / shortest / highest / lowest scored
        rows, in that order (one of them at most); else rows come in step order.
    limit : rows returned at most (``None``: all).
    """
    order_by = {k: v for k, v in (("longest", longest), ("shortest", shortest), ("best", best), ("worst", worst))}
    chosen = {k: v for k, v in order_by.items() if v is not None}
    if len(chosen) > 1:
        raise ConfigError(f"find: one of longest, shortest, best, worst at a time (got {', '.join(chosen)})")
    if limit is not None and limit < 0:
        raise ConfigError(f"limit: expected a non-negative number or None, got {limit}")
    rows = np.arange(len(reader), dtype=np.int64)
    if uid is not None:
        rows = rows[_uid_mask(reader.uids()[rows], uid)]
    lengths = reader.lengths() if truncated is not None or longest is not None or shortest is not None else None
    if truncated is not None:
        if reader.max_length is None:
            raise ConfigError(
                f"step {reader.view.step}: the maximum response length is unknown; "
                "pass max_length= to find truncated rows"
            )
        assert lengths is not None
        hit = lengths[rows] >= reader.max_length
        rows = rows[hit if truncated else ~hit]
    scores = reader.scores() if score is not None or best is not None or worst is not None else None
    if score is not None:
        assert scores is not None
        rows = rows[_score_mask(scores[rows], score)]
    if chosen:
        ((how, k),) = chosen.items()
        if k < 0:
            raise ConfigError(f"{how}: expected a non-negative number, got {k}")
        key = lengths if how in ("longest", "shortest") else scores
        assert key is not None
        values = key[rows].astype(np.float64)
        if how in ("longest", "best"):
            values = -values
        values = np.where(np.isnan(values), np.inf, values)  # unscored rows last
        rows = rows[np.argsort(values, kind="stable")][:k]
    if text is not None:
        found, stopped = _search(reader, rows, _matcher(text, regex, case), limit)
        return found, None if stopped else len(found)
    total = len(rows)
    return (rows if limit is None else rows[:limit]), total


def _describe(criteria: dict[str, Any]) -> str:
    """``truncated=True, text="\\boxed"``: strings in quotes as typed (not repr-escaped)."""
    return ", ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v!r}" for k, v in criteria.items() if v is not None)


def check_criteria(criteria: dict[str, Any], where: str) -> dict[str, Any]:
    """The criteria of :func:`find_rows`, each of the type it takes (see there)."""
    out = dict(criteria)
    for name in ("longest", "shortest", "best", "worst"):
        out[name] = args.maybe_count(out.get(name), name, where=where)
    for name in ("truncated",):
        out[name] = args.maybe_flag(out.get(name), name, where)
    for name in ("regex", "case"):
        if name in out:
            out[name] = args.flag(out[name], name, where)
    text = out.get("text")
    if text is not None and not isinstance(text, str):
        raise ConfigTypeError(f"{where}: text: expected a str to search for, got {type(text).__name__} {text!r:.40}")
    out["score"] = _score(out.get("score"), where)
    uid = out.get("uid")
    uids = uid if isinstance(uid, (list, tuple, set, frozenset, np.ndarray)) else [uid]
    if uid is not None and not all(isinstance(u, (str, int, np.integer)) for u in uids):
        raise ConfigTypeError(f"{where}: uid: expected a uid (str) or a list of them, got {uid!r:.60}")
    return {k: v for k, v in out.items() if k in criteria or v is not None}


def _score(score: Any, where: str) -> Any:
    """``score``: None, a number, or a ``(low, high)`` pair of numbers or None."""

    def number(v: Any, ok_none: bool) -> bool:
        return (v is None and ok_none) or (isinstance(v, (int, float, np.number)) and not isinstance(v, bool))

    if score is None or number(score, False):
        return score
    if isinstance(score, (tuple, list)) and len(score) == 2 and all(number(v, True) for v in score):
        return tuple(score)
    raise ConfigTypeError(f"{where}: score: expected a number or a (low, high) pair (None: open), got {score!r:.60}")


def find(reader: RolloutReader, *, limit: int | None = PAGE_ROWS, **criteria: Any) -> RolloutList:
    """:func:`find_rows` as a list to show (see there for the criteria)."""
    unknown = sorted(set(criteria) - set(CRITERIA))
    if unknown:
        raise ConfigTypeError(f"find: unknown criteria {', '.join(unknown)} (known: {', '.join(CRITERIA)})")
    limit = args.maybe_count(limit, "limit", where=f"step {reader.view.step}: find")
    rows, total = find_rows(reader, limit=limit, **check_criteria(criteria, f"step {reader.view.step}: find"))
    what = _describe({k: v for k, v in criteria.items() if k not in ("regex", "case")}) or "all rows"
    title = f"step {reader.view.step}: rows with {what}"
    if total is None:
        note = f"the first {len(rows)} matches (the search stopped there; limit=None finds all)"
    elif total > len(rows):
        note = f"{total} rows match; showing the first {len(rows)} (limit=None shows all)"
    else:
        note = f"{total} row{'s' if total != 1 else ''} match"
    return RolloutList(reader, rows, title, note)


def page(reader: RolloutReader, k: int = 0, size: int = PAGE_ROWS) -> RolloutList:
    """Page ``k`` (from 0; negative counts from the end) of the step, ``size`` rows a page."""
    size = args.count(size, "size", low=1, where=f"step {reader.view.step}: page")
    n = len(reader)
    pages = max(1, math.ceil(n / size))
    i = k + pages if k < 0 else k
    if not 0 <= i < pages:
        raise RowIndexError(
            f"step {reader.view.step}: page {k} out of range: {pages} pages of {size} rows "
            "(k: from 0, negative from the end)"
        )
    start, stop = i * size, min(n, (i + 1) * size)
    title = f"step {reader.view.step}: page {i} of {pages} (rows {start}–{max(start, stop - 1)} of {n})"
    note = f"next: .page({i + 1})" if i + 1 < pages else "last page"
    return RolloutList(reader, np.arange(start, stop, dtype=np.int64), title, note)
