"""Cached rollouts as training data: torch datasets over the rows of complete steps.

>>> from torch.utils.data import DataLoader
>>> from zarr_skip.data import RolloutIterableDataset, collate_rollouts
>>> ds = RolloutIterableDataset("runs/cache", columns=["responses", "score"], shuffle=True)  # doctest: +SKIP
>>> loader = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=collate_rollouts)  # doctest: +SKIP

:class:`RolloutDataset` is map-style (random access by row), :class:`RolloutIterableDataset`
reads in blocks and splits the rows across ranks and workers; both pickle without open handles.
See docs/training.md.
"""

from __future__ import annotations

from zarr_skip.data._iterable import RolloutIterableDataset
from zarr_skip.data._map import RolloutDataset
from zarr_skip.data.collate import RolloutBatch, collate_rollouts

__all__ = ["RolloutBatch", "RolloutDataset", "RolloutIterableDataset", "collate_rollouts"]
