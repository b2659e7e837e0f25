"""Reading every row of a column in blocks of whole chunks, each chunk once (iterating it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from zarr_skip.format.restore import restore
from zarr_skip.format.specs import ColumnSpec, nested_rows
from zarr_skip.store.reads import ArrayPart, read_range
from zarr_skip.store.storage import Storage


def chunk_blocks(parts: Sequence[ArrayPart], per_block: int) -> list[tuple[int, int]]:
    """Ranges of ``per_block`` whole chunks, in order, of arrays concatenated along axis 0:
    reading them one after the other reads each chunk once."""
    starts: list[int] = []
    base = 0
    for a in parts:
        starts += range(base, base + a.rows, max(1, a.chunk))
        base += a.rows
    firsts = starts[::per_block]
    return list(zip(firsts, [*firsts[1:], base][: len(firsts)], strict=True))


class BlocksAhead:
    """:func:`read_range` of each of ``ranges`` in turn, the next one read (by a helper thread,
    through the pool) while the caller works on the current one. The first read starts at once;
    iterate it once, or :meth:`close` it."""

    def __init__(
        self,
        storage: Storage,
        parts: Sequence[ArrayPart],
        ranges: Sequence[tuple[int, int]],
        dtype: np.dtype,
        trailing: tuple[int, ...],
    ) -> None:
        self._read = partial(read_range, storage, parts, dtype=dtype, trailing=trailing)
        self._ranges = list(ranges)
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="zarr-skip-ahead")
        self._pending: list[Future[np.ndarray]] = [self._submit(0)] if self._ranges else []

    def _submit(self, i: int) -> Future[np.ndarray]:
        start, stop = self._ranges[i]
        return self._ahead.submit(self._read, start=start, stop=stop)

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            for i in range(len(self._ranges)):
                got = self._pending.pop().result()
                if i + 1 < len(self._ranges):
                    self._pending.append(self._submit(i + 1))
                yield got
        finally:  # also when the caller stops early: nothing is left reading
            self.close()

    def close(self) -> None:
        for f in self._pending:
            f.cancel()
        self._ahead.shutdown(wait=True)


def row_blocks(
    storage: Storage, parts: Sequence[ArrayPart], dtype: np.dtype, trailing: tuple[int, ...], per_block: int
) -> Iterator[np.ndarray]:
    """Every row of ``parts``, ``per_block`` chunks at a time."""
    return iter(BlocksAhead(storage, parts, chunk_blocks(parts, per_block), dtype, trailing))


def value_blocks(
    storage: Storage,
    values: Sequence[ArrayPart],
    lengths: Callable[[], np.ndarray],
    dtype: np.dtype,
    trailing: tuple[int, ...],
    per_block: int,
) -> Iterator[tuple[int, int, np.ndarray]]:
    """The values of every row of a jagged column (``lengths()`` gives the rows' lengths; it
    is called while the first block is fetched), ``per_block`` chunks at a time: ``(first,
    last, values of rows first..last-1)``. A row whose values straddle two blocks comes with
    the later block."""
    end = sum(a.rows for a in values)
    ranges = [*chunk_blocks(values, per_block), (end, end)]  # the last: rows without values
    ahead = BlocksAhead(storage, values, ranges, dtype, trailing)
    offsets = np.zeros(0, dtype=np.int64)
    try:
        lens = lengths()
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
    except BaseException:
        ahead.close()
        raise
    first, held = 0, np.empty((0, *trailing), dtype)  # the values of row first read so far (from the last block)
    for (start, stop), got in zip(ranges, ahead, strict=True):
        last = int(np.searchsorted(offsets, stop, side="right")) - 1  # rows first..last-1 are read whole
        if len(held) and last > first:  # the row begun in the last block: joined (the rest are views)
            end = int(offsets[first + 1]) - start
            yield first, first + 1, np.concatenate([held, got[:end]])
            first, held, got = first + 1, held[:0], got[end:]
        elif len(held):  # a row longer than the block: still being read
            held = np.concatenate([held, got])
            continue
        cut = int(offsets[last] - offsets[first])
        yield first, last, got[:cut]
        first, held = last, got[cut:]


def iter_rows(
    storage: Storage,
    spec: ColumnSpec,
    parts: Sequence[Mapping[str, ArrayPart]],
    lengths: Callable[[], np.ndarray] | None,
    per_block: int,
    allow_pickle: bool = False,
    plain: np.ndarray | None = None,
) -> Iterator[Any]:
    """The rows of a column stored as ``parts`` (one mapping of arrays per mini-batch; for a
    jagged column, ``lengths`` reads its lengths), as indexing it by one row gives them."""
    if lengths is None:
        data = [p["data"] for p in parts]
        for block in row_blocks(storage, data, spec.storage_dtype, spec.storage_shape, per_block):
            yield from rows_of(restore(spec, {"data": block}))
        return
    values = [p["values"] for p in parts]
    lens: np.ndarray | None = None
    for first, last, vals in value_blocks(storage, values, lengths, spec.storage_dtype, spec.storage_shape, per_block):
        lens = lengths() if lens is None else lens  # read once, by value_blocks
        arrays = {"values": vals, "lengths": lens[first:last]}
        mask = None if plain is None else plain[first:last]
        yield from rows_of(restore(spec, arrays, allow_pickle=allow_pickle, plain=mask))


def rows_of(value: Any) -> Iterable[Any]:
    """The rows of a column's value, as indexing the column by one row gives them."""
    rows: Iterable[Any] = value  # an array, list or tensor: iterating it gives its rows
    if getattr(value, "is_nested", False):  # views of its values, split (unbind() is ~5x slower)
        rows = nested_rows(value)
    return rows
