"""What a step view reads as text: decoded token ids, chat messages and the rollout views.

:class:`StepReading` is a base of :class:`zarr_skip.StepView`; each method is a thin wrapper
that imports the readable wing (text) or the notebook wing (views) when called (both sit above
the lazy views), so that ``import zarr_skip`` loads no tokenizer or rendering code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from zarr_skip.cache import Cache
    from zarr_skip.lazy import StepView
    from zarr_skip.notebook.groups import GroupView
    from zarr_skip.notebook.rollouts import RolloutList, RolloutView
    from zarr_skip.readable.text import Message

__all__ = ["StepReading"]


class StepReading:
    """Decoded text, chat messages and readable views of a step's rows (a base of
    :class:`zarr_skip.StepView`)."""

    #: the Cache the view was loaded from (None when made directly): its attributes name the
    #: tokenizer that :meth:`text` decodes with by default
    cache: Cache | None = None

    def text(
        self,
        column: str = "responses",
        rows: int | slice | Sequence[int] | np.ndarray | None = None,
        tokenizer: Any = None,
        skip_special_tokens: bool = True,
    ) -> list[str]:
        """Token ids of ``column`` (``"responses"``, ``"prompts"``) decoded, one string per row.

        Only the rows asked for are read: ``rows`` is one row (an int), a slice, a sequence of
        row numbers, or None (all). ``tokenizer`` is a path, a ``tokenizers.Tokenizer``, a
        ``transformers`` tokenizer or a Decoder; by default the one the experiment recorded
        (:func:`zarr_skip.readable.tokenizers.tokenizer_for`). Padding is dropped.

        Raises
        ------
        TokenizerNotFoundError
            No tokenizer given and none recorded (or the recorded path is not on this machine).
        """
        from zarr_skip.readable.text import decode_column

        return decode_column(cast("StepView", self), column, rows, tokenizer, skip_special_tokens=skip_special_tokens)

    def messages(self, rows: int | slice | Sequence[int] | np.ndarray | None = None) -> list[list[Message]]:
        """The chat prompt of each row (its ``raw_prompt``) as ``Message(role, content)`` pairs."""
        from zarr_skip.readable.text import chat_rows

        return chat_rows(cast("StepView", self), rows)

    # -- readable views (zarr_skip.notebook.browse); each reads nothing until it is shown -------

    def rollout(self, row: int, *, tokenizer: Any = None, max_length: int | None = None) -> RolloutView:
        """Row ``row`` drawn in full: the prompt (chat messages), the response, badges and its
        tokens coloured by log-prob."""
        from zarr_skip.notebook import browse

        return browse.rollout(cast("StepView", self), row, tokenizer=tokenizer, max_length=max_length)

    def group(
        self, uid: object = None, *, row: int | None = None, tokenizer: Any = None, max_length: int | None = None
    ) -> GroupView:
        """The GRPO group ``uid`` (or that of row ``row``): its responses side by side."""
        from zarr_skip.notebook import browse

        return browse.group(cast("StepView", self), uid, row=row, tokenizer=tokenizer, max_length=max_length)

    def find(
        self, *, tokenizer: Any = None, max_length: int | None = None, limit: int | None = 20, **criteria: Any
    ) -> RolloutList:
        """Rows by ``uid``, ``score``, ``truncated``, ``text``, ``longest`` / ``shortest`` /
        ``best`` / ``worst``: see :func:`zarr_skip.notebook.finding.find_rows`."""
        from zarr_skip.notebook import browse

        return browse.find(cast("StepView", self), tokenizer=tokenizer, max_length=max_length, limit=limit, **criteria)

    def page(self, k: int = 0, size: int = 20, *, tokenizer: Any = None, max_length: int | None = None) -> RolloutList:
        """Page ``k`` of the step's rollouts, ``size`` rows a page."""
        from zarr_skip.notebook import browse

        return browse.page(cast("StepView", self), k, size, tokenizer=tokenizer, max_length=max_length)
