"""An iterable torch dataset that reads whole blocks and splits them across ranks and workers."""

from __future__ import annotations

import gc
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from zarr_skip.data._batches import Run, Segment, cut, items, join, joins_as_they_are, make_batch, segment, spread
from zarr_skip.data._malloc import keep_freed_memory
from zarr_skip.data._plan import buffers, check_rank, resolve_rank, row_span, shard_blocks, shuffled
from zarr_skip.data._shm import open_through_proc, reachable
from zarr_skip.data._source import Block, RolloutSource
from zarr_skip.data.collate import RowItem, check_jagged
from zarr_skip.format import args

__all__ = ["RolloutIterableDataset", "SharedEpoch"]

logger = logging.getLogger(__name__)

#: rows read at once from one mini-batch (each column as one slice: its chunks once); a block
#: of a whole mini-batch reads all its columns in one batch of reads
BLOCK_ROWS = 256
#: blocks held in memory at once when shuffling (the shuffle buffer); in stored order a block
#: is dropped once its rows are handed on
BUFFER_BLOCKS = 2
#: the largest seed taken (numpy takes any non-negative int: this is that of a uint64)
MAX_SEED = (1 << 64) - 1


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
    before each epoch (as with ``DistributedSampler``); it reaches DataLoader workers, persistent
    ones too (:class:`SharedEpoch`).

    An item's jagged rows are views of its block's decoded values (no per-row copies). An item
    is a dict that knows its block (:class:`~zarr_skip.data.collate.RowItem`), so
    :func:`~zarr_skip.data.collate_rollouts` gathers a batch of untouched items from their
    blocks a column at a time, as the dataset's own batches are; it writes the batch into one
    buffer that a DataLoader worker hands to the main process in one piece (a shared-memory
    buffer the worker reuses once the main process drops the batch: :mod:`zarr_skip.data._shm`).

    With ``batch_size`` the dataset yields batches instead of items: those that
    ``collate_rollouts(..., jagged=jagged, pad_value=pad_value)`` makes of each ``batch_size``
    items in turn (the last one shorter, or dropped with ``drop_last``), gathered column by
    column from the decoded blocks without making the items (:mod:`zarr_skip.data._batches`):
    ``DataLoader(ds, batch_size=None, num_workers=2, collate_fn=collate_rollouts)``. The rank's
    rows go to its DataLoader workers in whole batches, so together they yield the batches one
    process cuts (``len()``), the only short one last.

    A DataLoader worker freezes the objects it inherited from its parent (``gc.freeze``, once a
    process) before it reads, so the garbage collector never walks them there, and keeps the
    memory it frees for its next block (glibc's ``mallopt``; see :func:`_settle_worker`).
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
        batch_size: int | None = None,
        jagged: str = "pad",
        pad_value: float = 0,
        drop_last: bool = False,
    ) -> None:
        self.source = RolloutSource(
            location, experiment=experiment, steps=steps, columns=columns, storage_options=storage_options
        )
        self.shuffle = args.flag(shuffle, "shuffle")
        self.seed = args.count(seed, "seed", high=MAX_SEED)  # numpy seeds from non-negative ints
        self._epoch = SharedEpoch()
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._rank_args = (rank, world_size)
        self.buffer_blocks = args.count(buffer_blocks, "buffer_blocks", low=1)
        self._blocks = self.source.blocks(args.count(block_rows, "block_rows", low=1))
        check_jagged(jagged, pad_value)
        self.batch_size = args.maybe_count(batch_size, "batch_size", low=1)
        self.jagged, self.pad_value = jagged, pad_value
        self.drop_last = args.flag(drop_last, "drop_last")

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration takes (:meth:`set_epoch`)."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order from the next iteration on, in this process and in DataLoader
        workers forked from it, persistent ones too (see :class:`SharedEpoch`)."""
        self._epoch.value = args.count(epoch, "epoch")  # seeds the order with the seed: non-negative

    def __len__(self) -> int:
        """The rows of this rank (over all its workers); with a ``batch_size``, its batches (its
        DataLoader workers share them in whole batches: together they yield exactly these)."""
        lo, hi = row_span(sum(b.rows for b in self._blocks), self.world_size, self.rank, 1, 0)
        rows = hi - lo  # the rank's share, as its workers split it (_plan.row_span)
        if self.batch_size is None:
            return rows
        return rows // self.batch_size if self.drop_last else -(-rows // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is not None:
            _settle_worker()
        check_rank(self.rank, self.world_size, self._rank_args)
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        shard = self.rank * workers + worker  # seeds the shuffle of its buffers
        epoch = self._epoch.at_start(self.shuffle and info is not None)  # one epoch's order throughout
        total = sum(b.rows for b in self._blocks)
        span = row_span(total, self.world_size, self.rank, workers, worker, self.batch_size)
        pieces = shard_blocks(self._blocks, span, shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        if self.batch_size is not None:
            names = self.source.columns
            for runs in cut(self._orders(pieces, shard, epoch), self.batch_size, self.drop_last):
                yield make_batch(runs, names, self.jagged, self.pad_value)
            return
        if not self.shuffle:  # one block at a time
            for block in pieces:
                yield from self._items(block)
            return
        for n, group in enumerate(buffers(pieces, self.buffer_blocks)):
            rows = self._buffer_items(group)
            yield from (rows[int(k)] for k in shuffled(len(rows), self.seed, epoch, shard, n))
            del rows  # before the next buffer is read: one buffer's rows held at a time

    def _segment(self, block: Block) -> Segment:
        """``block``'s rows, each column read as one slice."""
        return segment(block, self.source.read_columns(block))

    def _items(self, block: Block) -> list[RowItem]:
        """The items of ``block``'s rows (:func:`zarr_skip.data._batches.items`)."""
        return items(self._segment(block))

    def _buffer_items(self, group: list[Block]) -> list[RowItem]:
        """The items of a shuffle buffer's blocks, in order: cut from the blocks joined, so that
        a batch of them is gathered from one segment, when joining keeps every column's dtype;
        else from each block."""
        segments = [self._segment(block) for block in group]
        if joins_as_they_are(segments):
            return items(join(segments))
        return [item for seg in segments for item in items(seg)]

    def _orders(self, pieces: list[Block], shard: int, epoch: int) -> Iterator[Run]:
        """Each segment of rows read (a block; with ``shuffle``, a buffer of blocks joined when
        that keeps every column's dtype, as for the items, else each block's stretches of the
        buffer's order) with the order its rows are handed on in: the per-row path's order."""
        if not self.shuffle:
            for block in pieces:
                yield self._segment(block), np.arange(block.rows)
            return
        for n, group in enumerate(buffers(pieces, self.buffer_blocks)):
            segments = [self._segment(block) for block in group]
            order = shuffled(sum(s.rows for s in segments), self.seed, epoch, shard, n)
            if joins_as_they_are(segments):  # as the items are cut: a batch's dtypes are its rows'
                yield join(segments), order
            else:
                yield from spread(segments, order)
            del segments  # before the next buffer is read (a batch's carried rows hold it a little longer)

    def __repr__(self) -> str:
        return (
            f"<RolloutIterableDataset {self.source.location} steps={self.source.steps} "
            f"rank={self.rank}/{self.world_size} shuffle={self.shuffle}>"
        )


#: the process :func:`_settle_worker` settled
_SETTLED_PID = 0


def _settle_worker() -> None:
    """In a DataLoader worker, once per process: move the objects it inherited into the garbage
    collector's permanent generation (``gc.freeze``), and keep the memory it frees for reuse
    (:func:`zarr_skip.data._malloc.keep_freed_memory`).

    Reading makes many small objects, so the collector's full passes run; each one walked every
    object inherited from the parent (all of torch), writing to its header, which copies each of
    those pages into the worker (copy-on-write): an 8-step medium epoch through two workers spent
    ~0.3 s of CPU and ~14k page copies a worker on it. Frozen objects are never walked; the
    worker's own objects are collected as before. Each block's arrays, freed, went back to the
    kernel and the next block faulted them in again (see :mod:`zarr_skip.data._malloc`).
    """
    global _SETTLED_PID
    if _SETTLED_PID != os.getpid():
        _SETTLED_PID = os.getpid()
        gc.freeze()
        keep_freed_memory()


class SharedEpoch:
    """A dataset's epoch, seen alike by the process that sets it and its DataLoader workers.

    ``DataLoader(persistent_workers=True)`` keeps its workers, and their copies of the dataset,
    from one epoch to the next: an epoch kept in the dataset's attributes never reached them,
    and every epoch repeated the first one's order. The epoch is an int64 in shared memory
    instead: a ``memfd`` (Linux) that a forked worker inherits and a worker started with
    ``spawn`` or ``forkserver`` opens through ``/proc/{pid}/fd`` when it unpickles the dataset
    (:func:`~zarr_skip.data._shm.open_through_proc`). Where that cannot be done (no memfd, no
    ``/proc``, a process that is not dumpable, another machine) the epoch travels as its value,
    and a persistent worker warns once when it starts a later epoch (:meth:`at_start`).
    """

    def __init__(self, value: int = 0) -> None:
        self._fd = os.memfd_create("zarr_skip-epoch", os.MFD_CLOEXEC) if hasattr(os, "memfd_create") else -1
        if self._fd >= 0:
            os.ftruncate(self._fd, 8)
        self._map(linked=True)
        self.value = value

    def _map(self, *, linked: bool) -> None:
        # the memfd, or an anonymous shared page (which only a fork shares)
        self._cell = mmap.mmap(self._fd, 8)
        self._linked = linked  # the epoch set in the process that made the dataset
        self._starts = 0  # epochs started in this process

    @property
    def value(self) -> int:
        return int(struct.unpack_from("<q", self._cell)[0])

    @value.setter
    def value(self, epoch: int) -> None:
        struct.pack_into("<q", self._cell, 0, epoch)

    def at_start(self, warn: bool) -> int:
        """The epoch an iteration starting now takes; with ``warn`` (a shuffling DataLoader
        worker), a warning when it cannot be the one set in the main process."""
        self._starts += 1
        if warn and self._starts == 2 and not self._linked:
            logger.warning(
                "RolloutIterableDataset: this DataLoader worker cannot see the epoch of the process "
                "that made the dataset (no /proc to open it through) and is kept between epochs "
                "(persistent_workers=True): each epoch repeats epoch %d's order. Use "
                "persistent_workers=False",
                self.value,
            )
        return self.value

    def __getstate__(self) -> dict[str, int]:
        state = {"value": self.value}
        if self._fd >= 0 and reachable():
            state.update(pid=os.getpid(), fd=self._fd, inode=os.fstat(self._fd).st_ino)
        return state

    def __setstate__(self, state: dict[str, int]) -> None:
        self._fd = -1
        if "fd" in state:
            try:
                self._fd = open_through_proc(state["pid"], state["fd"], state["inode"], "a dataset's epoch")
            except OSError as exc:
                logger.debug("the epoch travels as its value: %s", exc)
        self._map(linked=self._fd >= 0)
        if self._fd < 0:
            self.value = state["value"]

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedEpoch:
        return SharedEpoch(self.value)  # a copy's epoch is its own (pickling links, to reach workers)

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # os.close bound at definition: a dataset held in a reference cycle is collected at
        # interpreter exit, after this module's globals (``os`` among them) are gone
        if getattr(self, "_fd", -1) >= 0:
            _close(self._fd)
