"""Reading every row of a column in blocks of whole chunks, each chunk once (iterating it)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from zarr_skip.format.restore import restore
from zarr_skip.format.specs import ColumnSpec
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


def row_blocks(
    storage: Storage, parts: Sequence[ArrayPart], dtype: np.dtype, trailing: tuple[int, ...], per_block: int
) -> Iterator[np.ndarray]:
    """Every row of ``parts``, ``per_block`` chunks at a time."""
    for start, stop in chunk_blocks(parts, per_block):
        yield read_range(storage, parts, start, stop, dtype, trailing)


def value_blocks(
    storage: Storage,
    values: Sequence[ArrayPart],
    offsets: np.ndarray,
    dtype: np.dtype,
    trailing: tuple[int, ...],
    per_block: int,
) -> Iterator[tuple[int, int, np.ndarray]]:
    """The values of every row of a jagged column (row ``i`` holds values ``offsets[i]`` to
    ``offsets[i + 1]``), ``per_block`` chunks at a time: ``(first, last, values of rows
    first..last-1)``. A row whose values straddle two blocks comes with the later block."""
    first, held = 0, np.empty((0, *trailing), dtype)  # the values of rows first.. read so far
    end = int(offsets[-1])
    for start, stop in [*chunk_blocks(values, per_block), (end, end)]:  # the last: rows without values
        got = read_range(storage, values, start, stop, dtype, trailing)
        held = np.concatenate([held, got]) if len(held) else got
        last = int(np.searchsorted(offsets, stop, side="right")) - 1  # rows first..last-1 are held whole
        cut = int(offsets[last] - offsets[first])
        yield first, last, held[:cut]
        first, held = last, held[cut:]


def iter_rows(
    storage: Storage,
    spec: ColumnSpec,
    parts: Sequence[Mapping[str, ArrayPart]],
    lengths: np.ndarray | None,
    per_block: int,
    allow_pickle: bool = False,
    plain: np.ndarray | None = None,
) -> Iterator[Any]:
    """The rows of a column stored as ``parts`` (one mapping of arrays per mini-batch; a
    jagged column's ``lengths`` already read), as indexing it by one row gives them."""
    if lengths is None:
        data = [p["data"] for p in parts]
        for block in row_blocks(storage, data, spec.storage_dtype, spec.storage_shape, per_block):
            yield from rows_of(restore(spec, {"data": block}))
        return
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = [p["values"] for p in parts]
    for first, last, vals in value_blocks(storage, values, offsets, spec.storage_dtype, spec.storage_shape, per_block):
        arrays = {"values": vals, "lengths": lengths[first:last]}
        mask = None if plain is None else plain[first:last]
        yield from rows_of(restore(spec, arrays, allow_pickle=allow_pickle, plain=mask))


def rows_of(value: Any) -> Iterable[Any]:
    """The rows of a column's value, as indexing the column by one row gives them."""
    if getattr(value, "is_nested", False):  # views of its values: split them (unbind() is ~5x slower)
        return value.values().split(value.offsets().diff().tolist())
    return value
