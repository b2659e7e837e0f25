"""A map-style torch dataset over the rows of cached steps."""

from __future__ import annotations

import bisect
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, get_worker_info

from zarr_skip.data._iterable import _settle_worker
from zarr_skip.data._source import RolloutSource
from zarr_skip.errors import ConfigTypeError, RowIndexError

__all__ = ["RolloutDataset"]


class RolloutDataset(Dataset[dict[str, Any]]):
    """The rows of the complete steps of a cache as a map-style ``torch.utils.data.Dataset``.

    ``len(ds)`` is the number of rows; ``ds[i]`` is a dict with ``step``, ``minibatch``, ``row``
    (the row within its step) and the columns: a jagged column as a 1-D tensor of that row, dense
    rows as tensors, per-row objects (strings, JSON) as Python values. Rows are counted step after
    step, mini-batch after mini-batch. Each item reads that row of every column (the chunks it
    lies in) in two rounds of requests; the steps' views are loaded once per process.

    ``ds.__getitems__(indices)``, which a ``DataLoader`` with a ``batch_size`` calls with each
    batch's indices, gives ``[ds[i] for i in indices]`` (equal items, in that order) but reads the
    rows of every step of the batch together (:func:`zarr_skip.lazy.read_rows`): every column in
    the same two rounds of requests, each chunk fetched and decoded once a batch, not once an
    item. Rows of one batch that share a stored entry of a dictionary-encoded column (a GRPO
    group's ``raw_prompt``) share its decoded object, as the iterable dataset's items do. Small
    decoded chunks (lengths, codes, dense per-row columns) are kept per process and copied into
    each item (see :class:`~zarr_skip.data._source.RolloutSource`), so random items do not decode
    them again. In a DataLoader worker the objects it inherited are frozen first, as
    :class:`RolloutIterableDataset` does.

    The dataset pickles without open handles, so ``DataLoader(ds, num_workers=N)`` works: each
    worker opens the store itself.

    Parameters
    ----------
    location : a path or an ``s3://bucket/prefix`` URL.
    experiment : the experiment to read (default: the only one stored).
    steps : the steps (default: every complete step).
    columns : the columns of each item (default: every column of the first step).
    storage_options : for URLs: endpoint, credentials, ... (see :func:`zarr_skip.open_cache`).
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        experiment: str | None = None,
        steps: int | Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.source = RolloutSource(
            location, experiment=experiment, steps=steps, columns=columns, storage_options=storage_options
        )
        self._blocks = self.source.blocks()
        self._starts = []
        total = 0
        for b in self._blocks:
            self._starts.append(total)
            total += b.rows
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, Any]:
        _in_worker()
        i = self._resolve(index)
        k = bisect.bisect_right(self._starts, i) - 1
        block = self._blocks[k]
        return self.source.item(block, block.start + i - self._starts[k])

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """``[self[i] for i in indices]``, read together (see the class): the rows of each step
        in stored order, every column of every step in the same two rounds of requests."""
        _in_worker()
        flat = np.array([self._resolve(i) for i in indices], dtype=np.int64)
        starts = np.asarray(self._starts, dtype=np.int64)
        which = np.searchsorted(starts, flat, side="right") - 1
        step_of = np.array([b.step for b in self._blocks], dtype=np.int64)[which]
        row_of = flat - starts[which] + np.array([b.start for b in self._blocks], dtype=np.int64)[which]
        mb_of = np.array([b.minibatch for b in self._blocks], dtype=np.int64)[which]
        places, requests = [], []
        for step in dict.fromkeys(step_of.tolist()):  # steps in the order first asked
            mine = np.flatnonzero(step_of == step)
            mine = mine[np.argsort(row_of[mine], kind="stable")]  # each step's rows in stored order
            places.append(mine.tolist())
            requests.append((step, row_of[mine], mb_of[mine]))
        out: list[dict[str, Any]] = [{}] * len(flat)
        for positions, items in zip(places, self.source.take(requests), strict=True):
            for pos, item in zip(positions, items, strict=True):
                out[pos] = item
        return out

    def _resolve(self, index: Any) -> int:
        """``index`` as a row number in ``[0, len)`` (negative ones counted from the end)."""
        if isinstance(index, (bool, np.bool_)):
            raise ConfigTypeError(f"RolloutDataset: index {index!r} is a bool; index with an int")
        try:
            i = operator.index(index)
        except TypeError:
            raise ConfigTypeError(
                f"RolloutDataset: index {index!r:.40} of type {type(index).__name__}: index with an int"
            ) from None
        j = i + self._len if i < 0 else i
        if not 0 <= j < self._len:
            where = self.source.location
            raise RowIndexError(f"RolloutDataset: index {index} out of range for {self._len} rows at {where}")
        return j

    def __repr__(self) -> str:
        return f"<RolloutDataset {self.source.location} steps={self.source.steps} rows={self._len}>"


def _in_worker() -> None:
    """In a DataLoader worker: settle it, once (see :func:`_settle_worker`)."""
    if get_worker_info() is not None:
        _settle_worker()
