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

from zarr_skip.errors import ColumnNotFoundError, ConfigError, GroupNotFoundError, StepNotFoundError
from zarr_skip.format import checks
from zarr_skip.format.specs import NUMPY_NAMES, torch_dtype
from zarr_skip.views import schema
from zarr_skip.views.text import Rows, chat_messages, decode_ids, row_index, token_ids
from zarr_skip.views.tokenizers import Decoder, tokenizer_for

if TYPE_CHECKING:
    from zarr_skip.cache import Cache
    from zarr_skip.lazy import StepView

__all__ = [
    "chosen_steps",
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
FIELDS = schema.FIELDS


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
    """The rows whose ``uid`` is ``uid``, or (none being) the one uid it begins (a GRPO group),
    reading the ``uid`` column only.

    Raises
    ------
    KeyError
        No ``uid`` column, or no uid is or begins with ``uid``.
    ConfigError
        ``uid`` begins several uids (the message lists them).
    """
    if "uid" not in view:
        raise ColumnNotFoundError(f"step {view.step}: no 'uid' column (columns: {', '.join(view)})")
    uids = np.asarray([str(u) for u in _python(view["uid"][:])], dtype=object)
    found = np.flatnonzero(uids == uid)
    if found.size:
        return found
    begun = list(dict.fromkeys(u for u in uids.tolist() if u.startswith(uid)))
    if len(begun) > 1:
        shown = ", ".join(begun[:10]) + (f" and {len(begun) - 10} more" if len(begun) > 10 else "")
        raise ConfigError(f"step {view.step}: uid prefix {uid!r} begins {len(begun)} uids ({shown}); give more of it")
    if not begun:
        sample = ", ".join(dict.fromkeys(str(u) for u in uids[:5]))
        raise GroupNotFoundError(
            f"step {view.step}: no rows with uid {uid!r} or a uid beginning so (uids such as {sample})"
        )
    return np.flatnonzero(uids == begun[0])


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
    arrays: bool = False,
) -> dict[str, Any]:
    """The records of ``rows`` as columns: the fields of :mod:`zarr_skip.views.schema` (the
    schema :meth:`zarr_skip.Cache.table` shares), then (with ``extra``) every other per-row
    column (:func:`per_row_columns`) under its own name; a computed field whose name a stored
    per-row column takes is ``zs_{name}``.

    Text fields are None without a tokenizer (``tokenizer``, else ``decoder``, else the one the
    experiment recorded); ``prompt_ids`` and ``response_ids`` then hold the ids instead. The
    prompt keeps the chat template's special tokens (the text the model saw); the response
    drops them unless ``skip_special_tokens`` is False. With ``arrays``, stored numeric
    per-row columns are numpy arrays of their own dtype (else lists of Python numbers).
    """
    n = len(view)
    idx = row_index(rows, n, f"step {view.step}: ")
    numbers = np.arange(n)[idx]
    count = len(numbers)
    dec = decoder if decoder is not None and tokenizer is None else tokenizer_for(view, tokenizer)
    per_row = per_row_columns(view)
    stored = {
        name: _stored_values(view, name, idx, arrays) for name in per_row if extra or name in schema.STORED_FIELDS
    }
    computed: dict[str, list[Any]] = {
        "experiment": [getattr(view.cache, "experiment", None)] * count,
        "step": [view.step] * count,
        "minibatch": schema.minibatch_of_rows(view)[idx].tolist(),
        "row": numbers.tolist(),
    }
    computed.update(_text_fields(view, idx, dec, skip_special_tokens))
    lengths = {f: [len(r) for r in token_ids(view, c, idx)] for f, c in schema.LENGTH_FIELDS.items() if c in view}
    limit = max_response_length(view)
    if limit is not None and "response_length" in lengths:
        computed["truncated"] = [length >= limit for length in lengths["response_length"]]
    for field in schema.LENGTH_FIELDS:
        if field not in per_row and field in lengths:
            computed[field] = lengths[field]
    for field in schema.DEFAULT_REDUCTIONS:
        r = schema.default_reduction(field, view.columns)
        if field not in per_row and r is not None:
            computed[field] = _reduced(view, r.column, idx, r.how)
    placed = schema.place_names(computed, stored)
    out: dict[str, Any] = {}
    for field in schema.FIELDS:
        if field in computed:
            out[placed[field]] = computed[field]
        if field in stored:  # a stored column of a field's name keeps its place and values
            out[field] = stored[field]
        elif field not in computed:
            out[field] = [None] * count
    out.update((placed[name], values) for name, values in computed.items() if placed[name] not in out)
    out.update((name, values) for name, values in stored.items() if name not in out)
    return out


def _stored_values(view: StepView, name: str, idx: slice | np.ndarray, arrays: bool) -> Any:
    """The rows ``idx`` of per-row column ``name``: Python values, or (``arrays``) a numpy
    array of the column's dtype for numbers."""
    values = view[name][idx]
    if arrays and view.schema[name].kind in ("tensor", "ndarray"):
        if view.schema[name].kind == "tensor" and view.schema[name].dtype not in NUMPY_NAMES:
            values = values.to(torch_dtype("complex64" if values.is_complex() else "float32"))  # bfloat16, float8
        return np.asarray(values)
    return [_json_value(v) for v in _python(values)]


def _text_fields(view: StepView, idx: slice | np.ndarray, dec: Decoder | None, skip: bool) -> dict[str, list[Any]]:
    """``prompt``, ``response`` (or their ids without a decoder) and ``messages``."""
    out: dict[str, list[Any]] = {}
    if "raw_prompt" in view:
        out["messages"] = [[m._asdict() for m in chat_messages(v)] for v in _python(view["raw_prompt"][idx])]
    for field, column, drop in (("prompt", "prompts", False), ("response", "responses", skip)):
        if column not in view:
            continue
        ids = token_ids(view, column, idx)
        if dec is not None:
            out[field] = decode_ids(dec, ids, drop)
        else:
            out[f"{field}_ids"] = [r.tolist() for r in ids]
    return out


def _reduced(view: StepView, column: str, idx: slice | np.ndarray, how: str) -> list[Any]:
    rows = token_ids(view, column, idx)
    values = np.concatenate([np.asarray(r, dtype=np.float64).reshape(-1) for r in rows]) if rows else np.empty(0)
    reduced: list[Any] = schema.reduce_rows(values, np.array([len(r) for r in rows], dtype=np.int64), how).tolist()
    return reduced


def rollouts(view: StepView, rows: Rows = None, tokenizer: Any = None, **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`rollout_columns` as one dict per row."""
    cols = rollout_columns(view, rows, tokenizer, **kwargs)
    names = list(cols)
    return [dict(zip(names, values, strict=True)) for values in zip(*cols.values(), strict=True)]


def json_text(value: Any) -> str:
    """A JSON value as compact text (for a table cell)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def select(
    view: StepView, *, rows: int | None = None, uid: str | None = None, row: int | None = None
) -> Sequence[int] | slice:
    """The CLI's choice of rows: row ``row``, else the group of ``uid`` (or of the one uid
    beginning so), else the first ``rows``."""
    if row is not None:
        n = len(view)
        if not -n <= row < n:
            raise IndexError(f"step {view.step}: row {row} out of range for {n} rows (0 .. {n - 1})")
        return [row % n]
    if uid is not None:
        found: list[int] = rows_of_uid(view, uid).tolist()
        return found
    return slice(0, max(0, rows if rows is not None else len(view)))


def chosen_steps(cache: Cache, steps: Any, doing: str) -> list[int]:
    """The steps an export or a rescore reads: ``steps`` checked (one or several, each once,
    where first named), or every complete step when None; an empty choice is an error."""
    if steps is None:
        chosen = cache.steps()
        if not chosen:
            where = f"experiment {cache.experiment!r} at {cache.location}"
            raise StepNotFoundError(f"no complete steps to {doing} in {where}")
        return chosen
    asked = checks.check_steps(steps, one=True, unique=True) or []
    if not asked:
        raise ConfigError(f"steps: empty; name the steps to {doing}, or pass steps=None for every complete step")
    return asked
