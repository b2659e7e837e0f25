"""Decoded text of a stored step: token-id columns as strings, chat prompts as messages.

Everything here reads lazily through a :class:`~zarr_skip.StepView`: only the rows asked for
(and, for padded columns, the same rows of their mask) are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from zarr_skip.errors import ColumnNotFoundError, ConfigTypeError, TokenizerNotFoundError
from zarr_skip.format import args
from zarr_skip.format.specs import nested_rows
from zarr_skip.views.tokenizers import (
    ATTR_MODEL,
    ATTR_TOKENIZER,
    Decoder,
    _attributes_of,
    recorded_tokenizer_path,
    tokenizer_for,
)

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = [
    "Message",
    "Rows",
    "chat_messages",
    "chat_rows",
    "decode_column",
    "decode_ids",
    "mask_of",
    "mask_tokens",
    "padded_mask",
    "require_tokenizer",
    "row_index",
    "strip_padding",
    "token_ids",
    "valid_lengths",
    "valid_tokens",
]

#: which rows to read: one row, a slice, row numbers, or None for all
Rows = int | slice | Sequence[int] | np.ndarray | None

#: the mask whose first columns mark a padded token column's valid tokens (for every other
#: per-token column, such as old_log_probs or advantages, the response mask)
_MASKS = {"prompts": "attention_mask"}
#: the token-id columns whose padding is the pad id when no mask says where it is
_ID_COLUMNS = ("prompts", "responses", "input_ids")


class Message(NamedTuple):
    """One chat message: a ``(role, content)`` pair."""

    role: str
    content: str


def row_index(rows: Rows, n: int, where: str = "") -> slice | np.ndarray:
    """``rows`` as a slice of step 1 or an array of row numbers in ``[0, n)``.

    Raises RowIndexError for a row out of range (negative rows count from the end), and
    ConfigTypeError for a selection that is not rows (:func:`zarr_skip.format.args.rows`).
    """
    rows = args.rows(rows, n, "rows", where.rstrip(": "))
    if rows is None:
        return slice(0, n)
    if isinstance(rows, slice):
        start, stop, stride = rows.indices(n)
        return slice(start, max(start, stop)) if stride == 1 else np.arange(start, stop, stride)
    return np.asarray([rows] if isinstance(rows, int) else rows, dtype=np.int64)


def _as_rows(value: Any) -> list[np.ndarray]:
    """A column's rows (NestedTensor, tensor, array or list of them) as 1-d arrays (a dtype
    numpy lacks, bf16 or fp8, as float32)."""
    if hasattr(value, "is_nested") and value.is_nested:
        return [_numpy(t) for t in nested_rows(value)]
    if hasattr(value, "numpy") and hasattr(value, "dim"):  # torch.Tensor
        return list(_numpy(value)) if value.dim() == 2 else [_numpy(value)]
    if isinstance(value, np.ndarray) and value.dtype != object:
        return list(value) if value.ndim == 2 else [value]
    return [np.asarray(v) for v in value]


def _numpy(tensor: Any) -> np.ndarray:
    """A tensor as numpy; bf16 and fp8, which numpy has not, as float32 (exact)."""
    try:
        return np.asarray(tensor.numpy())
    except TypeError:  # "Got unsupported ScalarType BFloat16"
        return np.asarray(tensor.float().numpy())


def valid_lengths(mask: np.ndarray) -> np.ndarray:
    """Per row of a right-padded mask (rows, width): its tokens up to and including its last
    non-zero entry (0 for none). A multi-turn response's ``response_mask`` is 0 on the tool's
    tokens inside it: they are the response's tokens all the same, as verl counts them."""
    found = np.asarray(mask) != 0
    if found.ndim == 1:
        found = found[None, :]
    width = found.shape[1]
    last = width - np.argmax(found[:, ::-1], axis=1) if width else np.zeros(len(found), dtype=np.int64)
    return np.where(found.any(axis=1), last, 0).astype(np.int64)


def valid_tokens(mask: np.ndarray) -> np.ndarray:
    """The positions of :func:`valid_lengths`: True up to each row's last non-zero entry."""
    found = np.asarray(mask)
    rows = found if found.ndim == 2 else found[None, :]
    out = np.arange(rows.shape[1])[None, :] < valid_lengths(rows)[:, None]
    return out if found.ndim == 2 else out[0]


def token_ids(view: StepView, column: str, rows: Rows = None) -> list[np.ndarray]:
    """The token ids of ``column`` for ``rows``, padding dropped.

    Jagged columns store no padding. A padded ``prompts`` column is cut to the prompt part of
    its ``attention_mask``, other padded per-token columns (``responses``, ``old_log_probs``,
    ...) to the ``response_mask``; token-id columns without a mask lose the pad id
    (``pad_token_id`` of the step's meta_info) at both ends.
    """
    col = view[column]
    idx = row_index(rows, len(col), f"step {view.step}, column {column!r}: ")
    values = _as_rows(col[idx])
    if col.spec.jagged:
        return values
    width = len(values[0]) if values else 0
    found = padded_mask(view, column, width)
    if found is not None:
        masks = _as_rows(view[found[0]][idx])
        if masks and len(masks[0]) >= width:  # an attention mask covers prompt then response
            cut = [m[len(m) - width :] if found[1] else m[:width] for m in masks]
            return [v[mask_tokens(column, m)] for v, m in zip(values, cut, strict=True)]
    return strip_padding(view, column, values)


def mask_tokens(column: str, mask: np.ndarray) -> np.ndarray:
    """Which entries of padded ``column`` count, by its mask (:func:`padded_mask`): the
    response's token ids up to the mask's last non-zero entry (:func:`valid_tokens`: a
    multi-turn response's tool tokens are its tokens), a left-padded prompt's and any per-token
    value's (log-probs, advantages: what the loss sees) where the mask is non-zero."""
    return valid_tokens(mask) if column == "responses" else np.asarray(mask).astype(bool)


def padded_mask(view: StepView, column: str, width: int) -> tuple[str, bool] | None:
    """``(mask, tail)``: the mask of the padded ``column`` (``width`` wide) and whether its last
    ``width`` entries (not its first) mark the valid tokens; None without one. That is
    :func:`mask_of`, else, for the response's columns of a step with no ``response_mask``
    (verl's rollout output), the response's part of ``attention_mask``: its last entries."""
    name = mask_of(view, column)
    if name is not None:
        return name, False
    if column in _MASKS or "response_mask" in view or "attention_mask" not in view:
        return None
    spec = view["attention_mask"].spec
    return ("attention_mask", True) if not spec.jagged and len(spec.shape) == 1 and spec.shape[0] >= width else None


def strip_padding(view: StepView, column: str, rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Rows of a padded token-id column without a mask, the pad id (``pad_token_id`` of the
    step's meta_info) dropped at both ends; other columns' rows as they are."""
    pad = view.meta_info.get("pad_token_id")
    if isinstance(pad, int) and column in _ID_COLUMNS:
        return [_strip(v, pad) for v in rows]
    return list(rows)


def mask_of(view: StepView, column: str) -> str | None:
    """The padded mask column that marks the valid tokens of the padded ``column`` (see
    :func:`token_ids`), or None when the step has none."""
    name = _MASKS.get(column, "response_mask")
    if name == column or name not in view:
        return None
    spec = view[name].spec
    return name if not spec.jagged and spec.shape else None


def _strip(ids: np.ndarray, pad: int) -> np.ndarray:
    keep = np.flatnonzero(ids != pad)
    return ids[keep[0] : keep[-1] + 1] if keep.size else ids[:0]


def require_tokenizer(view: StepView, tokenizer: Any = None) -> Decoder:
    """The tokenizer to decode ``view`` with (see :func:`tokenizer_for`), or a clear error."""
    found = tokenizer_for(view, tokenizer)
    if found is not None:
        return found
    attrs = _attributes_of(view)
    recorded = attrs.get(ATTR_TOKENIZER) or attrs.get(ATTR_MODEL)
    if not recorded:
        why = "none is recorded in the experiment's attributes"
    elif recorded_tokenizer_path(attrs) is None:
        why = f"the recorded tokenizer {recorded!r} is not on this machine"
    else:
        why = f"the recorded tokenizer {recorded!r} does not load"
    raise TokenizerNotFoundError(
        f"step {view.step}: no tokenizer to decode with ({why}); pass tokenizer=PATH (a tokenizer.json or a "
        "model directory), a tokenizers.Tokenizer or a transformers tokenizer (on the CLI: --tokenizer PATH)"
    )


def decode_ids(decoder: Decoder, rows: Sequence[np.ndarray], skip_special_tokens: bool = True) -> list[str]:
    """Each row of ids decoded, in one batch when the decoder has ``decode_batch``."""
    batch = [r.tolist() for r in rows]
    decode_batch = getattr(decoder, "decode_batch", None)
    if callable(decode_batch):
        return list(decode_batch(batch, skip_special_tokens=skip_special_tokens))
    return [decoder.decode(r, skip_special_tokens=skip_special_tokens) for r in batch]


def decode_column(
    view: StepView,
    column: str = "responses",
    rows: Rows = None,
    tokenizer: Any = None,
    *,
    skip_special_tokens: bool = True,
) -> list[str]:
    """:meth:`zarr_skip.StepView.text`: ``column``'s rows decoded, reading those rows only."""
    where = f"step {view.step}"
    spec = view[args.column(column, view.columns, "column", where)].spec
    if spec.kind not in ("nested", "tensor", "ndarray", "rows") or not _integer(spec.dtype):
        raise ConfigTypeError(
            f"{where}: column {column!r} holds {spec.kind} rows of {spec.dtype}, not token ids "
            "(text decodes integer token ids: 'responses', 'prompts', 'input_ids')"
        )
    skip_special_tokens = args.flag(skip_special_tokens, "skip_special_tokens", where)
    decoder = require_tokenizer(view, tokenizer)  # before any read: a missing one fails fast
    return decode_ids(decoder, token_ids(view, column, rows), skip_special_tokens)


def _integer(dtype: str) -> bool:
    """Whether a logical dtype (a torch or numpy name) holds integers (token ids)."""
    try:
        return np.dtype(dtype).kind in "iu"
    except TypeError:
        return False  # bfloat16 and other torch-only dtypes: floats


def chat_messages(value: Any) -> list[Message]:
    """A chat prompt (verl's ``raw_prompt``: a list of ``{"role", "content"}``) as messages.

    A content given as parts (``[{"type": "text", "text": ...}, ...]``) is joined; a plain
    string is one user message; None is no message.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [Message("user", value)]
    if isinstance(value, dict):
        value = [value]
    out = []
    for m in list(value):
        if isinstance(m, dict):
            out.append(Message(str(m.get("role", "")), _content(m.get("content", ""))))
        else:
            out.append(Message("", str(m)))
    return out


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for p in content:
            if isinstance(p, dict):
                parts.append(str(p.get("text", f"<{p.get('type', 'part')}>")))
            else:
                parts.append(str(p))
        return "".join(parts)
    return "" if content is None else str(content)


def chat_rows(view: StepView, rows: Rows = None, column: str = "raw_prompt") -> list[list[Message]]:
    """:meth:`zarr_skip.StepView.messages`: each row's chat prompt, reading those rows only."""
    if column not in view:
        raise ColumnNotFoundError(
            f"step {view.step}: no column {column!r} with chat messages (columns: {', '.join(view)})"
        )
    col = view[column]
    values = col[row_index(rows, len(col), f"step {view.step}, column {column!r}: ")]
    return [chat_messages(v) for v in list(values)]
