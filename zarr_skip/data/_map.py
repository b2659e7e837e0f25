"""A map-style torch dataset over the rows of cached steps."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch.utils.data import Dataset

from zarr_skip.data._source import RolloutSource

__all__ = ["RolloutDataset"]


class RolloutDataset(Dataset[dict[str, Any]]):
    """The rows of the complete steps of a cache as a map-style ``torch.utils.data.Dataset``.

    ``len(ds)`` is the number of rows; ``ds[i]`` is a dict with ``step``, ``minibatch``, ``row``
    (the row within its step) and the columns: a jagged column as a 1-D tensor of that row, dense
    rows as tensors, per-row objects (strings, JSON) as Python values. Rows are counted step after
    step, mini-batch after mini-batch. Each item reads that row of each column (the chunks it lies
    in); the steps' views are loaded once per process.

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
        i = int(index) + (self._len if index < 0 else 0)
        if not 0 <= i < self._len:
            where = self.source.location
            raise IndexError(f"RolloutDataset: index {index} out of range for {self._len} rows at {where}")
        k = bisect.bisect_right(self._starts, i) - 1
        block = self._blocks[k]
        return self.source.item(block, block.start + i - self._starts[k])

    def __repr__(self) -> str:
        return f"<RolloutDataset {self.source.location} steps={self.source.steps} rows={self._len}>"
