"""Reading rollouts for display: the chosen rows of the columns a view draws, nothing else.

verl's columns are recognised by name: ``responses`` and ``prompts`` (jagged token rows, or
padded ones with ``response_mask`` / ``attention_mask`` saying which tokens are real),
``old_log_probs``, a score column (the first of
:data:`~zarr_skip.views.measures.SCORE_COLUMNS` present; token-level ones sum per row),
``advantages``, ``uid``, ``data_source`` and ``raw_prompt`` (chat messages).

:meth:`RolloutReader.read` reads the chosen rows of each of those columns with one indexed
read per column (``col[rows]``: the chunks holding those rows, and the lengths of the
mini-batches holding them); the whole-step questions (every row's length, score or uid, used
to find rows) are separate methods and read one column each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ColumnNotFoundError, ConfigError, RowIndexError
from zarr_skip.format.specs import nested_rows
from zarr_skip.views.limits import TOKENS_SHOWN
from zarr_skip.views.measures import SCORE_COLUMNS, response_lengths, row_scores
from zarr_skip.views.text import chat_messages, decode_ids, token_ids, valid_lengths
from zarr_skip.views.tokenizers import Decoder

if TYPE_CHECKING:
    from zarr_skip.lazy import LazyColumn, StepView

__all__ = ["SCORE_COLUMNS", "Decoder", "Rollout", "RolloutReader"]

#: columns tried, in order, for a row's advantage (token-level ones average over the response)
ADVANTAGE_COLUMNS = ("advantage", "advantages")
#: columns tried, in order, for the response tokens' log-probs
LOGPROB_COLUMNS = ("old_log_probs", "rollout_log_probs", "log_probs")


@dataclass(frozen=True, slots=True, eq=False)
class Rollout:
    """One row of a step, as the views draw it.

    Attributes
    ----------
    step, row : where it is.
    response_ids : the response's token ids (padding removed).
    length : response tokens.
    max_length : the response length limit, when known (``truncated`` needs it).
    response_text : the decoded response, or ``None`` without a tokenizer.
    response_tokens : each response token as text, of the first :data:`~zarr_skip.views.limits.TOKENS_SHOWN`
        (``None`` unless asked for, or without a tokenizer).
    log_probs : the response tokens' log-probs (as many as tokens), or ``None``.
    prompt_messages : ``raw_prompt`` as ``(role, content)`` pairs, when stored.
    prompt_text : the decoded prompt, or ``None``.
    prompt_ids : the prompt's token ids (padding removed), or ``None``.
    uid, data_source : the GRPO group id and dataset, when stored.
    score, advantage : per row, when a column holds them.
    """

    step: int
    row: int
    response_ids: np.ndarray
    length: int
    max_length: int | None = None
    response_text: str | None = None
    response_tokens: tuple[str, ...] | None = None
    log_probs: np.ndarray | None = None
    prompt_messages: tuple[tuple[str, str], ...] | None = None
    prompt_text: str | None = None
    prompt_ids: np.ndarray | None = None
    uid: str | None = None
    data_source: str | None = None
    score: float | None = None
    advantage: float | None = None

    @property
    def truncated(self) -> bool:
        """The response reached the length limit (``False`` when the limit is unknown)."""
        return self.max_length is not None and self.length >= self.max_length


def _first(view: StepView, names: Sequence[str]) -> str | None:
    return next((n for n in names if n in view), None)


def _floats(value: Any) -> np.ndarray:
    """A numeric torch tensor or numpy array as float64 numpy (bf16 and float8 included)."""
    if hasattr(value, "detach"):
        import torch

        out: np.ndarray = value.detach().to(torch.float64).numpy()
        return out
    return np.asarray(value, dtype=np.float64)


def _ints(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value).astype(np.int64, copy=False)


def _contiguous(rows: np.ndarray) -> bool:
    return len(rows) > 0 and bool(np.all(np.diff(rows) == 1))


def take(col: LazyColumn, rows: np.ndarray) -> list[Any]:
    """Rows ``rows`` of ``col``, one value per row (a range is read as a slice)."""
    if len(rows) == 0:
        return []
    values = col[int(rows[0]) : int(rows[-1]) + 1] if _contiguous(rows) else col[rows]
    if col.spec.kind == "nested":
        return nested_rows(values)
    return list(values)


def _messages(value: Any) -> tuple[tuple[str, str], ...] | None:
    """``raw_prompt`` as ``(role, content)`` pairs; ``None`` when there are none."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    found = tuple((m.role or "?", m.content) for m in chat_messages(value))
    return found or None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class RolloutReader:
    """Reads rollouts of one step for display.

    Parameters
    ----------
    view : the step.
    decoder : turns token ids into text; ``None`` shows ids.
    max_length : the response length limit; default: the padded width of ``responses``.
    skip_special_tokens : passed to the decoder.
    """

    def __init__(
        self,
        view: StepView,
        decoder: Decoder | None = None,
        max_length: int | None = None,
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        if "responses" not in view:
            raise ColumnNotFoundError(
                f"step {view.step}: no 'responses' column to show (columns: {', '.join(view.columns)})"
            )
        self.view = view
        self.decoder = decoder
        self.skip_special_tokens = skip_special_tokens
        self.padded = not view["responses"].spec.jagged
        width = int(view["responses"].spec.shape[0]) if self.padded and view["responses"].spec.shape else None
        self.max_length = max_length if max_length is not None else width
        self.score_column = _first(view, SCORE_COLUMNS)
        self.advantage_column = _first(view, ADVANTAGE_COLUMNS)
        self.logprob_column = _first(view, LOGPROB_COLUMNS)

    def __len__(self) -> int:
        return len(self.view)

    # -- whole-step questions (one column each) ---------------------------------------------

    def lengths(self) -> np.ndarray:
        """Every row's response length: the stored lengths of a jagged column (no token read),
        or the padded mask's non-zero entries."""
        return response_lengths(self.view)

    def scores(self) -> np.ndarray:
        """Every row's score (a token-level column summed per row); ``KeyError`` when no column
        holds scores."""
        if self.score_column is None:
            raise ColumnNotFoundError(
                f"step {self.view.step}: no score column (looked for {', '.join(SCORE_COLUMNS)}; "
                f"columns: {', '.join(self.view.columns)})"
            )
        return row_scores(self.view, self.score_column)

    def uids(self) -> np.ndarray:
        """Every row's uid, as strings; ``KeyError`` without a ``uid`` column."""
        if "uid" not in self.view:
            raise ColumnNotFoundError(
                f"step {self.view.step}: no 'uid' column (columns: {', '.join(self.view.columns)})"
            )
        return np.array([str(u) for u in self.view["uid"][:]], dtype=object)

    # -- chosen rows ---------------------------------------------------------------------------

    def response_texts(self, rows: np.ndarray) -> list[str]:
        """The decoded responses of ``rows`` (reads the responses, and a padded batch's mask)."""
        if self.decoder is None:
            raise ConfigError(f"step {self.view.step}: no tokenizer to decode the responses; pass tokenizer=")
        return decode_ids(self.decoder, token_ids(self.view, "responses", rows), self.skip_special_tokens)

    def read(self, rows: Sequence[int] | np.ndarray, *, tokens: bool = False, text: bool = True) -> list[Rollout]:
        """The rollouts of ``rows`` (in that order); ``tokens`` also splits each response into
        its tokens' texts, ``text`` decodes (when a decoder is known)."""
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = len(self.view)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise RowIndexError(f"step {self.view.step}: rows out of range for {n} rows: {idx.tolist()[:10]}")
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]  # read in row order; hand back in the order asked for
        cols = self._read_columns(sorted_idx)
        out: list[Rollout | None] = [None] * len(idx)
        for k, (pos, row) in enumerate(zip(order.tolist(), sorted_idx.tolist(), strict=True)):
            out[pos] = self._rollout(int(row), {name: values[k] for name, values in cols.items()}, tokens, text)
        return [r for r in out if r is not None]

    def _read_columns(self, idx: np.ndarray) -> dict[str, list[Any]]:
        names = ["responses", "prompts", "raw_prompt", "uid", "data_source"]
        names += [c for c in (self.logprob_column, self.score_column, self.advantage_column) if c]
        if self.padded:
            names += self._mask_columns(prompts=True)
        return {name: take(self.view[name], idx) for name in dict.fromkeys(names) if name in self.view}

    def _mask_columns(self, *, prompts: bool) -> list[str]:
        """The masks a padded batch's real tokens are found with: ``response_mask`` for the
        response (else ``attention_mask``), ``attention_mask`` for a left-padded prompt."""
        out = ["response_mask"] if "response_mask" in self.view else ["attention_mask"]
        if prompts and "prompts" in self.view:
            out.append("attention_mask")
        return out

    def _response_length(self, values: dict[str, Any]) -> int:
        response = values["responses"]
        if not self.padded:
            return int(response.shape[0]) if hasattr(response, "shape") else len(response)
        if "response_mask" in values:  # up to its last token: a multi-turn response's tool tokens count
            return int(valid_lengths(_ints(values["response_mask"]).reshape(-1))[0])
        if "attention_mask" in values:
            width = int(np.asarray(response.shape)[0])
            return int(valid_lengths(_ints(values["attention_mask"]).reshape(-1)[-width:])[0])
        return int(response.shape[0])

    def _prompt_ids(self, values: dict[str, Any]) -> np.ndarray | None:
        if "prompts" not in values:
            return None
        ids = _ints(values["prompts"]).reshape(-1)
        if self.padded and "attention_mask" in values:
            mask = _ints(values["attention_mask"]).reshape(-1)[: len(ids)].astype(bool)
            ids = ids[mask]  # left padding
        return ids

    def _rollout(self, row: int, values: dict[str, Any], tokens: bool, text: bool) -> Rollout:
        length = self._response_length(values)
        ids = _ints(values["responses"]).reshape(-1)[:length]
        log_probs = None
        if self.logprob_column:
            log_probs = _floats(values[self.logprob_column]).reshape(-1)[:length]
        score = advantage = None
        if self.score_column:
            score = float(_floats(values[self.score_column]).sum())
        if self.advantage_column:
            adv = _floats(values[self.advantage_column]).reshape(-1)
            adv = adv[:length] if adv.size > 1 else adv
            advantage = float(adv.mean()) if adv.size else None
        prompt_ids = self._prompt_ids(values)
        messages = _messages(values.get("raw_prompt"))
        decoder = self.decoder if text else None
        skip = self.skip_special_tokens
        return Rollout(
            step=self.view.step,
            row=row,
            response_ids=ids,
            length=length,
            max_length=self.max_length,
            response_text=decoder.decode(ids.tolist(), skip_special_tokens=skip) if decoder else None,
            # the tokens a view draws (TOKENS_SHOWN): splitting 900k tokens would take seconds
            response_tokens=tuple(decoder.tokens(ids[:TOKENS_SHOWN].tolist())) if decoder and tokens else None,
            log_probs=log_probs,
            prompt_messages=messages,
            prompt_text=(  # the messages say it better when stored
                decoder.decode(prompt_ids.tolist(), skip_special_tokens=skip)
                if decoder and prompt_ids is not None and messages is None
                else None
            ),
            prompt_ids=prompt_ids,
            uid=_text(values.get("uid")),
            data_source=_text(values.get("data_source")),
            score=score,
            advantage=advantage,
        )
