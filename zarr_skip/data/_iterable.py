"""An iterable torch dataset that reads whole blocks and splits them across ranks and workers."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from zarr_skip.data._plan import buffers, resolve_rank, shard_blocks, shuffled
from zarr_skip.data._source import RolloutSource

__all__ = ["RolloutIterableDataset"]

#: rows read at once from one mini-batch (each column as one slice: its chunks once); a block
#: of a whole mini-batch reads all its columns in one batch of reads
BLOCK_ROWS = 256
#: blocks held in memory at once when shuffling (the shuffle buffer); in stored order a block
#: is dropped once its rows are handed on
BUFFER_BLOCKS = 2


class RolloutIterableDataset(IterableDataset[dict[str, Any]]):
    """The rows of cached steps as a ``torch.utils.data.IterableDataset``, read block by block.

    Items are those of :class:`RolloutDataset`. Each epoch the rows are split across the ranks
    (``rank`` / ``world_size``, else ``torch.distributed``'s when initialised, else one process)
    and across the DataLoader workers of each rank, so every row comes exactly once per epoch;
    the shares differ by at most one row.

    Rows are read in blocks of at most ``block_rows`` contiguous rows of one mini-batch (each
    column as one slice, so each chunk is fetched once per block; a mini-batch of at most
    ``block_rows`` rows is one block, so each of its chunks is fetched and decoded once an
    epoch). In stored order one block is held at a time; with ``shuffle``, ``buffer_blocks`` at a
    time: memory holds a few blocks, never whole steps. With ``shuffle`` the order of the blocks
    is shuffled from ``seed`` and the epoch (the same on every rank), and the rows of each buffer
    among themselves; the same ``seed`` and epoch give the same order. Call :meth:`set_epoch`
    before each epoch (as with ``DistributedSampler``).

    An item's jagged rows are views of its block's decoded values (no per-row copies), and
    :func:`~zarr_skip.data.collate_rollouts` writes a batch into one buffer that a DataLoader
    worker hands to the main process in one piece. A DataLoader worker freezes the objects it
    inherited from its parent (``gc.freeze``, once a process) before it reads, so the garbage
    collector never walks them there (see :func:`_freeze_inherited`).
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        experiment: str | None = None,
        steps: int | Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        block_rows: int = BLOCK_ROWS,
        buffer_blocks: int = BUFFER_BLOCKS,
    ) -> None:
        self.source = RolloutSource(
            location, experiment=experiment, steps=steps, columns=columns, storage_options=storage_options
        )
        self.shuffle = shuffle
        self.seed = int(seed)
        self.epoch = 0
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.buffer_blocks = int(buffer_blocks)
        self._blocks = self.source.blocks(block_rows)
        next(buffers([], self.buffer_blocks), None)  # checks buffer_blocks now, not in a worker

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order from the next iteration on."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """The rows of this rank (over all its workers)."""
        total = sum(b.rows for b in self._blocks)
        return total * (self.rank + 1) // self.world_size - total * self.rank // self.world_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is not None:
            _freeze_inherited()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        shards, shard = self.world_size * workers, self.rank * workers + worker
        pieces = shard_blocks(self._blocks, shards, shard, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
        if not self.shuffle:  # one block at a time
            for block in pieces:
                yield from self.source.read(block)
            return
        for n, group in enumerate(buffers(pieces, self.buffer_blocks)):
            items = [item for block in group for item in self.source.read(block)]
            yield from (items[int(k)] for k in shuffled(len(items), self.seed, self.epoch, shard, n))
            del items  # before the next buffer is read: one buffer's rows held at a time

    def __repr__(self) -> str:
        return (
            f"<RolloutIterableDataset {self.source.location} steps={self.source.steps} "
            f"rank={self.rank}/{self.world_size} shuffle={self.shuffle}>"
        )


#: the process whose inherited objects :func:`_freeze_inherited` froze
_FROZEN_PID = 0


def _freeze_inherited() -> None:
    """In a forked DataLoader worker: move the objects it inherited into the garbage collector's
    permanent generation (``gc.freeze``), once per process.

    Reading makes many small objects, so the collector's full passes run; each one walked every
    object inherited from the parent (all of torch), writing to its header, which copies each of
    those pages into the worker (copy-on-write): an 8-step medium epoch through two workers spent
    ~0.3 s of CPU and ~14k page copies a worker on it. Frozen objects are never walked; the
    worker's own objects are collected as before.
    """
    global _FROZEN_PID
    if _FROZEN_PID != os.getpid():
        _FROZEN_PID = os.getpid()
        gc.freeze()
