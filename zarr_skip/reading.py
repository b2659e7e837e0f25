"""What views and caches offer their readers: decoded text, chat messages, the rollout views,
recorded attributes (the trainer's tokenizer) and exports for other tools.

:class:`StepReading` is a base of :class:`zarr_skip.StepView`, :class:`CacheReading` of
:class:`zarr_skip.Cache`; what needs the readable wing (text) or the notebook wing (views)
imports it when called (both sit above the lazy views), so that ``import zarr_skip`` loads no
tokenizer, rendering or parquet code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from zarr_skip.errors import ConfigError, ReadOnlyCacheError
from zarr_skip.store.catalog import experiment_info, update_experiment_info

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Iterable, Mapping

    import pandas

    from zarr_skip.cache import Cache
    from zarr_skip.lazy import StepView
    from zarr_skip.store.storage import Storage
    from zarr_skip.views.export import ExportReport
    from zarr_skip.views.groups import GroupView
    from zarr_skip.views.rollouts import RolloutList, RolloutView
    from zarr_skip.views.text import Message
    from zarr_skip.views.training import TrainingExport

__all__ = ["CacheReading", "StepReading"]

#: the export options that only choose training records (format "sft" or "dpo")
_TRAINING_DEFAULTS: dict[str, object] = {
    "score": "score",
    "min_score": None,
    "best_of": 1,
    "pairs": 1,
    "token_ids": False,
}


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
        (:func:`zarr_skip.views.tokenizers.tokenizer_for`). Padding is dropped.

        Raises
        ------
        TokenizerNotFoundError
            No tokenizer given and none recorded (or the recorded path is not on this machine).
        """
        from zarr_skip.views.text import decode_column

        return decode_column(cast("StepView", self), column, rows, tokenizer, skip_special_tokens=skip_special_tokens)

    def messages(self, rows: int | slice | Sequence[int] | np.ndarray | None = None) -> list[list[Message]]:
        """The chat prompt of each row (its ``raw_prompt``) as ``Message(role, content)`` pairs."""
        from zarr_skip.views.text import chat_rows

        return chat_rows(cast("StepView", self), rows)

    # -- readable views (zarr_skip.views.browse); each reads nothing until it is shown -------

    def rollout(self, row: int, *, tokenizer: Any = None, max_length: int | None = None) -> RolloutView:
        """Row ``row`` drawn in full: the prompt (chat messages), the response, badges and its
        tokens coloured by log-prob."""
        from zarr_skip.views import browse

        return browse.rollout(cast("StepView", self), row, tokenizer=tokenizer, max_length=max_length)

    def group(
        self, uid: object = None, *, row: int | None = None, tokenizer: Any = None, max_length: int | None = None
    ) -> GroupView:
        """The GRPO group ``uid`` (or that of row ``row``): its responses side by side."""
        from zarr_skip.views import browse

        return browse.group(cast("StepView", self), uid, row=row, tokenizer=tokenizer, max_length=max_length)

    def find(
        self, *, tokenizer: Any = None, max_length: int | None = None, limit: int | None = 20, **criteria: Any
    ) -> RolloutList:
        """Rows by ``uid``, ``score``, ``truncated``, ``text``, ``longest`` / ``shortest`` /
        ``best`` / ``worst``: see :func:`zarr_skip.views.finding.find_rows`."""
        from zarr_skip.views import browse

        return browse.find(cast("StepView", self), tokenizer=tokenizer, max_length=max_length, limit=limit, **criteria)

    def page(self, k: int = 0, size: int = 20, *, tokenizer: Any = None, max_length: int | None = None) -> RolloutList:
        """Page ``k`` of the step's rollouts, ``size`` rows a page."""
        from zarr_skip.views import browse

        return browse.page(cast("StepView", self), k, size, tokenizer=tokenizer, max_length=max_length)


class CacheReading:
    """The experiment's recorded attributes and exports (a base of :class:`zarr_skip.Cache`)."""

    _storage: Storage
    experiment: str | None
    location: str
    read_only: bool
    _attributes: dict[str, Any] | None = None

    @property
    def attributes(self) -> dict[str, Any]:
        """What the experiment records beyond its fingerprint (the trainer's ``tokenizer`` and
        ``model`` paths, ...), from its group's attributes: read once, on first use."""
        if self._attributes is None:
            self._attributes = experiment_info(self._storage, self.experiment) if self.experiment else {}
        return dict(self._attributes)

    def set_attributes(self, values: Mapping[str, Any]) -> None:
        """Record ``values`` (JSON-able) in the experiment's attributes, merged over those stored
        (writers recording the same values may race; of different values the last one wins)."""
        if self.read_only or self.experiment is None:
            raise ReadOnlyCacheError(f"{self.location}: opened read-only; pass a fingerprint to open_cache to write")
        self._create()  # opening wrote nothing: like a write, recording creates the experiment
        self._attributes = update_experiment_info(self._storage, self.experiment, values)

    def _create(self) -> None:
        """Create the root and the experiment if opening found them missing (the Cache's)."""
        raise NotImplementedError

    def export(
        self,
        path: str | os.PathLike[str],
        steps: int | Iterable[int] | None = None,
        *,
        format: str | None = None,
        tokenizer: Any = None,
        score: str = "score",
        min_score: float | None = None,
        best_of: int = 1,
        pairs: int | str = 1,
        token_ids: bool = False,
    ) -> ExportReport | TrainingExport:
        """One record per rollout of ``steps`` (default: all complete) as parquet or JSON Lines,
        with decoded text when a tokenizer is known: see
        :func:`zarr_skip.views.export.export_rollouts`.

        ``format="sft"`` or ``"dpo"`` writes training records in TRL's conversational formats
        instead (``.jsonl`` or ``.parquet`` by the suffix), chosen by ``score``, ``min_score``,
        ``best_of`` (SFT) and ``pairs`` (DPO), with the token ids too when ``token_ids``: see
        :func:`zarr_skip.views.training.export_training`.
        """
        if format in ("sft", "dpo"):
            from zarr_skip.views.training import export_training

            return export_training(
                cast("Cache", self),
                path,
                steps,
                format=format,
                tokenizer=tokenizer,
                score=score,
                min_score=min_score,
                best_of=best_of,
                pairs=pairs,
                token_ids=token_ids,
            )
        chosen = {"score": score, "min_score": min_score, "best_of": best_of, "pairs": pairs, "token_ids": token_ids}
        given = [name for name, value in chosen.items() if value != _TRAINING_DEFAULTS[name]]
        if given:
            raise ConfigError(f"{', '.join(given)}: these choose training records; pass format='sft' or 'dpo'")
        from zarr_skip.views.export import export_rollouts

        return export_rollouts(cast("Cache", self), path, steps, format=format, tokenizer=tokenizer)

    def rescore(
        self,
        fn: Callable[[dict[str, Any]], float | Mapping[str, float]],
        *,
        steps: int | Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
        score: str = "score",
        tokenizer: Any = None,
    ) -> pandas.DataFrame:
        """New scores beside the stored ones: ``fn`` called on each rollout (its prompt's chat
        ``messages``, decoded ``response`` and row's ``columns``), as a pandas DataFrame keyed by
        ``step``, ``minibatch``, ``row`` (``pip install 'zarr-skip[pandas]'``): see
        :func:`zarr_skip.views.rescore.rescore_rollouts`."""
        from zarr_skip.views.rescore import rescore_rollouts

        return rescore_rollouts(cast("Cache", self), fn, steps, columns=columns, score=score, tokenizer=tokenizer)
