"""The readable views of a step, as :class:`~zarr_skip.StepView` offers them.

``view.rollout(i)``, ``view.group(uid)``, ``view.find(...)`` and ``view.page(k)`` call the
functions here. Each takes ``tokenizer`` (anything with ``decode``; see :func:`decoder`) and
``max_length`` (the response length limit, for the "truncated" badge; default: the padded
width of ``responses``, else the cache fingerprint's ``max_response_length`` when the view
came from a cache that has one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zarr_skip.notebook._rows import Decoder, RolloutReader
from zarr_skip.notebook.finding import PAGE_ROWS
from zarr_skip.notebook.finding import find as _find
from zarr_skip.notebook.finding import page as _page
from zarr_skip.notebook.groups import GroupView
from zarr_skip.notebook.rollouts import RolloutList, RolloutView

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = ["decoder", "find", "group", "page", "reader", "rollout"]


class _Ids:
    """A decoder from an object with ``decode`` only (or ``convert_ids_to_tokens``, as
    ``transformers`` tokenizers have): each token is decoded alone when it has no ``tokens``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def tokens(self, ids: Any) -> list[str]:
        return [self.decode([i], skip_special_tokens=False) for i in ids]


def decoder(tokenizer: Any) -> Decoder | None:
    """A :class:`~zarr_skip.notebook._rows.Decoder` for ``tokenizer``: ``None`` stays ``None``
    (token ids are shown), an object with ``decode`` and ``tokens`` is used as it is, an object
    with ``decode`` only is wrapped."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "decode") and hasattr(tokenizer, "tokens") and callable(tokenizer.tokens):
        return tokenizer
    if hasattr(tokenizer, "decode"):
        return _Ids(tokenizer)
    raise TypeError(f"tokenizer: expected an object with decode(ids), got {type(tokenizer).__name__}")


def reader(view: StepView, tokenizer: Any = None, max_length: int | None = None) -> RolloutReader:
    """The reader the views of ``view`` share."""
    return RolloutReader(view, decoder(tokenizer), max_length)


def rollout(view: StepView, row: int, *, tokenizer: Any = None, max_length: int | None = None) -> RolloutView:
    """Row ``row`` in full: prompt, response, badges, tokens coloured by log-prob."""
    return RolloutView(reader(view, tokenizer, max_length), row)


def group(
    view: StepView, uid: object = None, *, row: int | None = None, tokenizer: Any = None, max_length: int | None = None
) -> GroupView:
    """The GRPO group ``uid`` (or the group of row ``row``), its responses side by side."""
    return GroupView(reader(view, tokenizer, max_length), uid, row=row)


def find(
    view: StepView,
    *,
    tokenizer: Any = None,
    max_length: int | None = None,
    limit: int | None = PAGE_ROWS,
    **criteria: Any,
) -> RolloutList:
    """Rows meeting ``criteria``: see :func:`zarr_skip.notebook.finding.find_rows`."""
    return _find(reader(view, tokenizer, max_length), limit=limit, **criteria)


def page(
    view: StepView, k: int = 0, size: int = PAGE_ROWS, *, tokenizer: Any = None, max_length: int | None = None
) -> RolloutList:
    """Page ``k`` of the step, ``size`` rows a page."""
    return _page(reader(view, tokenizer, max_length), k, size)
