"""Pure planning of an epoch: which rows each rank and DataLoader worker reads, in what order.

No I/O: the blocks (contiguous rows of one mini-batch) are known beforehand. The blocks are put in
one order per epoch (shuffled from ``seed`` and the epoch, the same on every rank), the rows of
that order are cut into one run per rank and DataLoader worker (:func:`row_span`: runs of equal
size, or of whole batches), and a worker reads its run block by block. So every row belongs to
exactly one worker of one rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from zarr_skip.data._source import Block
from zarr_skip.errors import ConfigError
from zarr_skip.format import args

__all__ = ["buffers", "check_rank", "resolve_rank", "row_span", "shard_blocks", "shuffled"]


def shuffled(count: int, seed: int, *key: int) -> np.ndarray:
    """A permutation of ``range(count)`` fixed by ``seed`` and ``key`` (epoch, shard, ...)."""
    return np.random.default_rng([int(seed), *map(int, key)]).permutation(count)


def row_span(
    total: int, world_size: int, rank: int, workers: int, worker: int, batch_size: int | None = None
) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of an epoch's order of ``total`` rows that DataLoader worker
    ``worker`` of ``workers`` on rank ``rank`` of ``world_size`` reads.

    Without ``batch_size``, the rows are cut into one equal run per rank and worker (runs differ
    by at most one row). With it, each rank's equal share is cut among its workers in whole
    batches (the rank's last batch, which may be short, goes to its last worker): the workers
    then yield exactly the batches one process cuts from the rank's rows, with no short batch
    at the end of each worker's run (what ``len()`` says, and what torch checks it against).
    """
    shards, shard = world_size * workers, rank * workers + worker
    if not 0 <= shard < shards:
        raise ConfigError(f"shard {shard} of {shards}: the shard must lie in [0, {shards})")
    if batch_size is None:
        return total * shard // shards, total * (shard + 1) // shards
    lo, hi = total * rank // world_size, total * (rank + 1) // world_size
    batches = -(-(hi - lo) // batch_size)
    first, last = batches * worker // workers, batches * (worker + 1) // workers
    return lo + first * batch_size, min(hi, lo + last * batch_size)


def shard_blocks(
    blocks: Sequence[Block], span: tuple[int, int], *, shuffle: bool = False, seed: int = 0, epoch: int = 0
) -> list[Block]:
    """The pieces of ``blocks`` holding rows ``span`` (:func:`row_span`) of this epoch's order
    of the blocks, in that order."""
    lo, hi = span
    order = shuffled(len(blocks), seed, epoch) if shuffle else np.arange(len(blocks))
    out = []
    pos = 0
    for k in order:
        b = blocks[int(k)]
        first, last = max(lo, pos), min(hi, pos + b.rows)
        if first < last:
            out.append(Block(b.step, b.minibatch, b.start + first - pos, b.start + last - pos))
        pos += b.rows
        if pos >= hi:
            break
    return out


def buffers(pieces: Sequence[Block], size: int) -> Iterator[list[Block]]:
    """``pieces`` in groups of ``size`` (what is held in memory at once)."""
    if size < 1:
        raise ConfigError(f"buffer_blocks={size}: hold at least one block")
    for k in range(0, len(pieces), size):
        yield list(pieces[k : k + size])


def check_rank(rank: int, world_size: int, given: tuple[int | None, int | None]) -> None:
    """ConfigError when ``torch.distributed`` is initialised now with another rank or world size
    than a dataset resolved when it was made (``given``: the arguments it was made with): made
    before ``init_process_group``, it would give every rank every row."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    now = (dist.get_rank() if given[0] is None else given[0], dist.get_world_size() if given[1] is None else given[1])
    if now != (rank, world_size):
        raise ConfigError(
            f"the dataset was made for rank {rank} of {world_size}, but torch.distributed says this process is "
            f"rank {now[0]} of {now[1]}: make the dataset after init_process_group (or pass rank= and world_size=), "
            "or every rank reads the same rows"
        )


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments when given, else ``torch.distributed``'s when it is
    initialised, else one process."""
    rank = args.maybe_count(rank, "rank")
    world_size = args.maybe_count(world_size, "world_size", low=1)
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if not rank < world_size:
        raise ConfigError(f"rank={rank}, world_size={world_size}: need world_size >= 1 and 0 <= rank < world_size")
    return rank, world_size
