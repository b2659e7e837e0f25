"""One record per rollout: decoded text, lengths, scores and the step's per-row columns.

What the CLI prints (``zarr-skip show --text``) and what exports write (parquet, JSONL): for
chosen rows of a step, read lazily (only those rows of the columns needed), as columns
(:func:`rollout_columns`, one list per field) or records (:func:`rollouts`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ColumnNotFoundError, GroupNotFoundError
from zarr_skip.views.text import Rows, chat_messages, decode_ids, row_index, token_ids
from zarr_skip.views.tokenizers import Decoder, tokenizer_for

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = [
    "FIELDS",
    "json_text",
    "max_response_length",
    "per_row_columns",
    "rollout_columns",
    "rollouts",
    "rows_of_uid",
    "select",
]

#: the fields every record has, in order (values None where the step has no such column)
FIELDS = (
    "step",
    "row",
    "uid",
    "data_source",
    "prompt",
    "response",
    "messages",
    "prompt_length",
    "response_length",
    "truncated",
    "score",
    "reward",
    "acc",
    "advantage",
)
#: columns that a record shows in its own fields (not repeated among the other columns)
_OWN = {"uid", "data_source", "raw_prompt", "score", "acc"}
#: per-token columns whose row sum (scores, rewards) or mean (advantages) is the row's value
_TOKEN_SUMS = {"score": "token_level_scores", "reward": "token_level_rewards"}


def max_response_length(view: StepView) -> int | None:
    """The longest response the rollout allowed: the experiment's ``max_response_length``, else
    the width of a padded ``responses`` column (None when unknown)."""
    fp = getattr(view.cache, "fingerprint", None) or {}
    value = fp.get("max_response_length")
    if isinstance(value, int) and value > 0:
        return value
    if "responses" in view and not view["responses"].spec.jagged and view["responses"].spec.shape:
        return int(view["responses"].spec.shape[0])
    return None


def per_row_columns(view: StepView) -> list[str]:
    """Columns holding one scalar, string or JSON value per row (not token sequences)."""
    out = []
    for name, spec in view.schema.items():
        scalar = spec.kind in ("tensor", "ndarray") and spec.shape == ()
        if scalar or spec.kind in ("str", "json"):
            out.append(name)
    return out


def rows_of_uid(view: StepView, uid: str) -> np.ndarray:
    """The rows whose ``uid`` is ``uid`` (a GRPO group), reading the ``uid`` column only."""
    if "uid" not in view:
        raise ColumnNotFoundError(f"step {view.step}: no 'uid' column (columns: {', '.join(view)})")
    uids = np.asarray(_python(view["uid"][:]), dtype=object)
    found = np.flatnonzero(uids == uid)
    if not found.size:
        sample = ", ".join(dict.fromkeys(str(u) for u in uids[:5]))
        raise GroupNotFoundError(f"step {view.step}: no rows with uid {uid!r} (uids such as {sample})")
    return found


def _python(values: Any) -> list[Any]:
    """Rows of a column read as Python values (tensors and arrays to numbers, lists as they are)."""
    if hasattr(values, "tolist") and not (isinstance(values, np.ndarray) and values.dtype == object):
        return list(values.tolist())
    return list(values)


def _json_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def rollout_columns(
    view: StepView,
    rows: Rows = None,
    tokenizer: Any = None,
    *,
    decoder: Decoder | None = None,
    skip_special_tokens: bool = True,
    extra: bool = True,
) -> dict[str, list[Any]]:
    """The records of ``rows`` as columns: :data:`FIELDS`, then (with ``extra``) every other
    per-row column (:func:`per_row_columns`) under its own name.

    Text fields are None without a tokenizer (``tokenizer``, else ``decoder``, else the one the
    experiment recorded); ``prompt_ids`` and ``response_ids`` then hold the ids instead.
    ``truncated`` is whether the response reached :func:`max_response_length`.
    """
    n = len(view)
    idx = row_index(rows, n, f"step {view.step}: ")
    numbers = np.arange(n)[idx]
    count = len(numbers)
    dec = decoder if decoder is not None and tokenizer is None else tokenizer_for(view, tokenizer)
    out: dict[str, list[Any]] = {f: [None] * count for f in FIELDS}
    out["step"] = [view.step] * count
    out["row"] = numbers.tolist()
    for name in ("uid", "data_source", "score", "acc"):
        if name in view and name in per_row_columns(view):
            out[name] = [_json_value(v) for v in _python(view[name][idx])]
    if "raw_prompt" in view:
        out["messages"] = [[m._asdict() for m in chat_messages(v)] for v in _python(view["raw_prompt"][idx])]
    limit = max_response_length(view)
    for field, column in (("prompt", "prompts"), ("response", "responses")):
        if column not in view:
            continue
        ids = token_ids(view, column, idx)
        out[f"{field}_length"] = [len(r) for r in ids]
        if dec is not None:
            out[field] = decode_ids(dec, ids, skip_special_tokens)
        else:
            out[f"{field}_ids"] = [r.tolist() for r in ids]
    if limit is not None and "responses" in view:
        out["truncated"] = [length >= limit for length in out["response_length"]]
    for field, column in _TOKEN_SUMS.items():
        if column in view and out[field][:1] in ([], [None]):  # a per-row column of that name wins
            out[field] = [float(np.sum(r)) for r in token_ids(view, column, idx)]
    if "advantages" in view:
        out["advantage"] = [float(np.mean(r)) if len(r) else 0.0 for r in token_ids(view, "advantages", idx)]
    if extra:
        for name in per_row_columns(view):
            if name not in _OWN and name not in out:
                out[name] = [_json_value(v) for v in _python(view[name][idx])]
    return out


def rollouts(view: StepView, rows: Rows = None, tokenizer: Any = None, **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`rollout_columns` as one dict per row."""
    cols = rollout_columns(view, rows, tokenizer, **kwargs)
    names = list(cols)
    return [dict(zip(names, values, strict=True)) for values in zip(*cols.values(), strict=True)]


def json_text(value: Any) -> str:
    """A JSON value as compact text (for a table cell)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def select(view: StepView, *, rows: int | None = None, uid: str | None = None) -> Sequence[int] | slice:
    """The CLI's choice of rows: the group of ``uid``, else the first ``rows``."""
    if uid is not None:
        return rows_of_uid(view, uid).tolist()
    return slice(0, max(0, rows if rows is not None else len(view)))
