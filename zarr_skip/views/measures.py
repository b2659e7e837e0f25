"""What plots and views measure per row: response lengths and scores, from the fewest reads.

Response lengths of a jagged column come from its stored per-row lengths (no token is read); a
padded batch's lengths need its ``response_mask``, read a block of rows at a time. Scores come
from a score column: itself per row, or the sum (or mean) of a token-level row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ColumnNotFoundError, ConfigError, ConfigTypeError
from zarr_skip.views.text import valid_lengths

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = ["LENGTH_COLUMNS", "SCORE_COLUMNS", "by_row", "lengths_and_width", "pick", "response_lengths", "row_scores"]

#: columns tried, in order, for response lengths when none is named
LENGTH_COLUMNS = ("responses", "response_mask")
#: columns tried, in order, for a row's score when none is named, by every view (signals,
#: report, plots, rollouts, ``find``): per-row values first, then token-level ones summed per
#: row (``rm_scores``: what verl's agent loop returns when it computes the rewards itself)
SCORE_COLUMNS = (
    "score",
    "scores",
    "reward",
    "rewards",
    "acc",
    "token_level_scores",
    "token_level_rewards",
    "rm_scores",
)
_BLOCK = 4096  # rows of a padded mask read at a time


def _numpy(value: Any) -> np.ndarray:
    """A numeric torch tensor or numpy array as float64 numpy (bf16 and float8 included)."""
    if hasattr(value, "detach"):
        import torch

        t = value.detach()
        if t.is_complex():
            raise ConfigTypeError("complex values cannot be plotted")
        out: np.ndarray = t.to(torch.float64).numpy()
        return out
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise ConfigTypeError(f"values of dtype {arr.dtype} cannot be plotted")
    return arr.astype(np.float64)


def by_row(data: np.ndarray) -> np.ndarray:
    """``data`` (rows first) as one flat row a row: ``reshape(rows, -1)``, which numpy cannot
    do of no rows (a step, or a mini-batch, of none; token rows all empty)."""
    return data.reshape(len(data), int(np.prod(data.shape[1:], dtype=np.int64)))


def pick(view: StepView, column: str | None, candidates: Sequence[str], what: str) -> str:
    if column is not None:
        view[column]  # KeyError naming the columns when absent
        return column
    for name in candidates:
        if name in view:
            return name
    raise ColumnNotFoundError(
        f"step {view.step}: no {what} column (looked for {', '.join(candidates)}; "
        f"columns: {', '.join(view.columns)}); name one with column="
    )


def lengths_and_width(view: StepView, column: str | None) -> tuple[np.ndarray, int | None]:
    """Per-row response lengths and, for a padded column, its width (the max length)."""
    name = pick(view, column, LENGTH_COLUMNS, "response")
    col = view[name]
    if col.spec.jagged:
        if col.spec.kind not in ("nested", "rows"):
            raise ConfigTypeError(f"column {name!r} holds {col.spec.kind} rows, not tokens")
        return col.lengths().astype(np.int64), None
    if column is None and name == "responses" and "response_mask" in view:
        return lengths_and_width(view, "response_mask")
    if len(col.spec.shape) != 1:
        raise ConfigTypeError(f"column {name!r}: a padded response column has one axis per row, got {col.spec.shape}")
    width = int(col.spec.shape[0])
    if column is None and name == "responses" and _covers(view, "attention_mask", width):
        return _mask_lengths(view["attention_mask"], width), width  # verl's rollout without a response_mask
    if not name.endswith("mask"):
        raise ConfigTypeError(f"column {name!r} is padded: name its mask (column='response_mask') to count tokens")
    return _mask_lengths(col, width), width


def _covers(view: StepView, mask: str, width: int) -> bool:
    """``mask`` is a padded mask of one axis whose last ``width`` entries can be the response's."""
    if mask not in view:
        return False
    spec = view[mask].spec
    return not spec.jagged and len(spec.shape) == 1 and spec.shape[0] >= width


def _mask_lengths(col: Any, width: int) -> np.ndarray:
    """Per row, the entries up to the last non-zero one among the last ``width`` of padded mask
    ``col`` (:func:`~zarr_skip.views.text.valid_lengths`: a multi-turn response's tool tokens count)."""
    out = np.empty(len(col), dtype=np.int64)
    for start in range(0, len(col), _BLOCK):  # a block of rows at a time bounds the memory used
        block = col[start : start + _BLOCK][:, -width:] if width else col[start : start + _BLOCK][:, :0]
        out[start : start + len(block)] = valid_lengths(np.asarray(block))
    return out


def response_lengths(view: StepView, column: str | None = None) -> np.ndarray:
    """Per-row response lengths of a step.

    Parameters
    ----------
    view : the step.
    column : a jagged column (its stored lengths, no token read) or a padded mask (its
        entries per row up to its last non-zero one). Default: ``responses`` when jagged,
        else ``response_mask``, else the response's part (the last entries) of
        ``attention_mask``.
    """
    return lengths_and_width(view, column)[0]


def row_scores(view: StepView, column: str | None = None, reduce: str = "sum") -> np.ndarray:
    """One number per row of a numeric column: itself, or the sum (or mean) of its row.

    Token-level columns (verl's ``token_level_scores``, padded or jagged) reduce over each
    row: ``sum`` gives the sequence reward; ``mean`` averages a row's stored elements (for a
    padded column, padding included).
    """
    if reduce not in ("sum", "mean"):
        raise ConfigError(f"reduce: expected 'sum' or 'mean', got {reduce!r}")
    name = pick(view, column, SCORE_COLUMNS, "score")
    col = view[name]
    kind = col.spec.kind
    if kind in ("tensor", "ndarray"):
        data = by_row(_numpy(col[:]))
        reduced: np.ndarray = data.sum(axis=1) if reduce == "sum" else data.mean(axis=1)
        return reduced
    if kind not in ("nested", "rows"):
        raise ConfigTypeError(f"column {name!r} holds {kind} rows, not numbers")
    lengths = col.lengths().astype(np.int64)
    value = col[:]
    if kind == "nested":
        values = _numpy(value.values())
    else:
        values = np.concatenate([_numpy(r) for r in value]) if len(value) else np.empty(0)
    values = by_row(values).sum(axis=1)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    sums = np.bincount(owner, weights=values, minlength=len(lengths))
    if reduce == "sum":
        return sums
    return np.where(lengths > 0, sums / np.maximum(lengths, 1), np.nan)
