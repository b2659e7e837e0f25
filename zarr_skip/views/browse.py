"""The readable views of a step, as :class:`~zarr_skip.StepView` offers them.

``view.rollout(i)``, ``view.group(uid)``, ``view.find(...)`` and ``view.page(k)`` call the
functions here. Each takes ``tokenizer`` (see :func:`decoder`; by default the one the experiment recorded) and
``max_length`` (the response length limit, for the "truncated" badge; default: the padded
width of ``responses``, else the cache fingerprint's ``max_response_length`` when the view
came from a cache that has one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zarr_skip.format import args
from zarr_skip.views._rows import Decoder, RolloutReader
from zarr_skip.views.finding import PAGE_ROWS
from zarr_skip.views.finding import find as _find
from zarr_skip.views.finding import page as _page
from zarr_skip.views.groups import GroupView
from zarr_skip.views.rollouts import RolloutList, RolloutView

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = ["decoder", "find", "group", "page", "reader", "rollout"]


def decoder(view: Any, tokenizer: Any = None) -> Decoder | None:
    """The decoder the views of ``view`` (a step view or a cache) use: ``tokenizer`` when given
    (a path, a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer or a Decoder), else the one
    the experiment recorded when it is on this machine, else ``None`` (token ids are shown)."""
    from zarr_skip.views.tokenizers import tokenizer_for

    return tokenizer_for(view, tokenizer)


def _max_length(view: StepView, max_length: int | None) -> int | None:
    if max_length is not None:
        return args.count(max_length, "max_length", low=1, where=f"step {view.step}")
    fp = getattr(getattr(view, "cache", None), "fingerprint", None) or {}
    return int(fp["max_response_length"]) if "max_response_length" in fp else None


def reader(view: StepView, tokenizer: Any = None, max_length: int | None = None) -> RolloutReader:
    """The reader the views of ``view`` share."""
    return RolloutReader(view, decoder(view, tokenizer), _max_length(view, max_length))


def rollout(view: StepView, row: int, *, tokenizer: Any = None, max_length: int | None = None) -> RolloutView:
    """Row ``row`` in full: prompt, response, badges, tokens coloured by log-prob."""
    row = args.row(row, len(view), "row", f"step {view.step}")
    return RolloutView(reader(view, tokenizer, max_length), row)


def group(
    view: StepView, uid: object = None, *, row: int | None = None, tokenizer: Any = None, max_length: int | None = None
) -> GroupView:
    """The GRPO group ``uid`` (or the group of row ``row``), its responses side by side."""
    row = None if row is None else args.row(row, len(view), "row", f"step {view.step}")
    return GroupView(reader(view, tokenizer, max_length), uid, row=row)


def find(
    view: StepView,
    *,
    tokenizer: Any = None,
    max_length: int | None = None,
    limit: int | None = PAGE_ROWS,
    **criteria: Any,
) -> RolloutList:
    """Rows meeting ``criteria``: see :func:`zarr_skip.views.finding.find_rows`."""
    return _find(reader(view, tokenizer, max_length), limit=limit, **criteria)


def page(
    view: StepView, k: int = 0, size: int = PAGE_ROWS, *, tokenizer: Any = None, max_length: int | None = None
) -> RolloutList:
    """Page ``k`` of the step, ``size`` rows a page."""
    k, size = args.whole(k, "k", f"step {view.step}"), args.count(size, "size", low=1, where=f"step {view.step}")
    return _page(reader(view, tokenizer, max_length), k, size)
