"""The chunks of a batch's arrays, compressed in the pool while the writer claims its place.

The writer hands every encoded column to :meth:`ChunkJobs.add` as soon as the batch is encoded,
so the pool compresses while the step is taken over and a mini-batch index claimed (metadata
reads and exclusive creates); the writer then takes each array's chunks
(:meth:`ChunkJobs.take`) as it stores them. Nothing is stored here: a write that fails before
storing leaves only work to cancel (:meth:`ChunkJobs.cancel`).
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from zarr_skip.format import chunks
from zarr_skip.format.specs import EncodedColumn, StoredArray
from zarr_skip.store.storage import Storage


@dataclass(slots=True)
class ArrayChunks:
    """One array's rows per chunk, its codec and the jobs encoding its chunks (in order)."""

    per: int
    codec: chunks.Compression
    jobs: list[Future[bytes]]


class ChunkJobs:
    """Chunk encoding of the arrays of one batch, in ``storage``'s pool."""

    def __init__(self, storage: Storage, compression: chunks.Compression, chunk_bytes: int) -> None:
        self._storage = storage
        self._compression = compression
        self._chunk_bytes = chunk_bytes
        self._arrays: dict[tuple[str, str], ArrayChunks] = {}

    def add(self, column: EncodedColumn) -> None:
        """Start encoding the chunks of every array of ``column``."""
        for name, arr in column.arrays.items():
            self._arrays[column.spec.name, name] = self._start(arr)

    def take(self, column: str, name: str, arr: StoredArray) -> ArrayChunks:
        """The chunks of array ``name`` of ``column``, started now if they were not (or were
        taken before: a writer that retries with another index encodes them again)."""
        started = self._arrays.pop((column, name), None)
        return started if started is not None else self._start(arr)

    def cancel(self) -> None:
        """Drop the chunks not taken (those the pool has not started are never encoded)."""
        for started in self._arrays.values():
            for job in started.jobs:
                job.cancel()
        self._arrays.clear()

    def _start(self, arr: StoredArray) -> ArrayChunks:
        per, rows, codec = chunking(arr, self._compression, self._chunk_bytes)
        return ArrayChunks(per, codec, [self._storage.submit(encode_chunk, arr, r, codec) for r in rows])


def chunking(
    arr: StoredArray, compression: chunks.Compression, chunk_bytes: int
) -> tuple[int, list[slice], chunks.Compression]:
    """How ``arr`` is stored: rows per chunk, each chunk's rows, and the codec."""
    row_bytes = arr.dtype.itemsize * math.prod(arr.shape[1:])
    per = chunks.chunk_rows(arr.shape[0], row_bytes, chunk_bytes)
    count = chunks.chunk_count(arr.shape[0], per) if arr.size else 0
    return per, [slice(i * per, (i + 1) * per) for i in range(count)], compression.for_dtype(arr.dtype)


def encode_chunk(arr: Any, rows: slice, codec: chunks.Compression) -> bytes:
    """Rows ``rows`` of ``arr`` as the chunk the writer stores (slicing a Narrowed array narrows
    those rows: done in the pool, chunk by chunk)."""
    return chunks.encode(chunks.full_chunk(arr[rows], rows.stop - rows.start), codec)
