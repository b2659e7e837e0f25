"""The chunks of a batch's arrays, compressed in the pool while the batch is still being encoded
and while the writer claims its place.

The writer hands each column to :meth:`ChunkJobs.add` as soon as it is encoded (tensors first).
A large array (token ids, log-probs) is compressed at once by one of the pool's threads,
:data:`EARLY_CHUNKS` full chunks per blosc call (:func:`encode_chunks`): one call releases the
interpreter lock once for all of them, so it runs beside the encoding of the per-row objects
(Python, holding the lock) instead of waiting behind it, where a call per chunk would wait for
the lock after every chunk; one thread, so that the encoding keeps its core. When the batch is
encoded, :meth:`ChunkJobs.spread` starts every other chunk and shares what is left of the
large arrays out to every thread, :data:`GROUP_CHUNKS` chunks per call, while the step is
taken over and a mini-batch index claimed (metadata reads and exclusive creates); the writer
then takes each array's chunks (:meth:`ChunkJobs.take`) as it stores them. A small array
(:data:`INLINE_BYTES`) never goes to the pool: the writer compresses it when it stores it
(:class:`Inline`), which costs less than the hand-over. Nothing is stored
here: a write that fails before storing leaves only work to cancel (:meth:`ChunkJobs.cancel`).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np
from numcodecs import blosc

from zarr_skip.format import chunks
from zarr_skip.format.blosc_frames import split_frame
from zarr_skip.format.specs import EncodedColumn, StoredArray
from zarr_skip.store import _localfs
from zarr_skip.store.storage import Storage

#: an array of at least this many full chunks in a blosc codec is compressed early, and this
#: many chunks are compressed per call once the batch is encoded (see the module docstring)
GROUP_CHUNKS = 4
#: chunks per call while the batch is being encoded: few calls (each waits for the lock once
#: after it), and not so many that the last one, started late, outlasts the encoding by far
EARLY_CHUNKS = 8
#: the largest chunk compressed with others (so that a call stays far below blosc's 2 GiB)
_MAX_CHUNK_BYTES = 64 << 20
#: an array of at most this many bytes is compressed by the writing thread when it stores it:
#: handing it to the pool costs more (a future, a thread's turn at the interpreter lock while
#: the writer wants it) than compressing it (~15 us). A small step's 31 arrays hold 28 such.
INLINE_BYTES = 16 << 10


class Job(Protocol):
    """A chunk being encoded: a :class:`Future`, or :class:`Inline` work."""

    def result(self) -> bytes: ...

    def cancel(self) -> bool: ...


class Inline:
    """A chunk encoded in the thread asking for its result (a small array's, see
    :data:`INLINE_BYTES`); cancelling it drops the work."""

    __slots__ = ("_args",)

    def __init__(self, arr: StoredArray, rows: slice, codec: chunks.Compression) -> None:
        self._args: tuple[StoredArray, slice, chunks.Compression] | None = (arr, rows, codec)

    def result(self) -> bytes:
        if self._args is None:
            raise CancelledError()
        return encode_chunk(*self._args)

    def cancel(self) -> bool:
        self._args = None
        return True


@dataclass(slots=True)
class ArrayChunks:
    """One array's rows per chunk, its codec and the jobs encoding its chunks (in order)."""

    per: int
    codec: chunks.Compression
    jobs: list[Job]


@dataclass(slots=True)
class _Large:
    """The full chunks of a large array, compressed from ``next`` on (the jobs, in order)."""

    arr: StoredArray
    per: int
    codec: chunks.Compression
    jobs: list[Future[bytes]]
    next: int = 0


class ChunkJobs:
    """Chunk encoding of the arrays of one batch, in ``storage``'s pool."""

    def __init__(self, storage: Storage, compression: chunks.Compression, chunk_bytes: int) -> None:
        self._storage = storage
        self._compression = compression
        self._chunk_bytes = chunk_bytes
        self._arrays: dict[tuple[str, str], ArrayChunks] = {}
        self._later: list[tuple[tuple[str, str], StoredArray]] = []  # started by spread()
        #: the rows per chunk aimed for, by array (see :func:`chunks.chunk_target`)
        self._tails: list[tuple[ArrayChunks, StoredArray, slice]] = []  # the same
        self._large: deque[_Large] = deque()  # with chunks not yet taken by a thread
        self._lock = threading.Lock()
        self._threads = 0  # pool threads compressing large arrays
        self._spread = False

    def add(self, column: EncodedColumn) -> None:
        """Start compressing the large arrays of ``column``; the others wait for :meth:`spread`."""
        for name, arr in column.arrays.items():
            key = (column.spec.name, name)
            if self._spread:
                self._arrays[key] = self._start(arr, name)
                continue
            early = self._start_large(arr, *chunking(arr, self._compression, self._target(name, arr), name))
            if early is None:
                self._later.append((key, arr))
            else:
                self._arrays[key] = early

    def spread(self) -> None:
        """The batch is encoded: start every chunk not started yet, on all the pool's threads."""
        self._spread = True
        self._add_threads()  # the large arrays first: they take longest
        self._start_tails()
        for key, arr in self._later:
            self._arrays[key] = self._start(arr, key[1])
        self._later.clear()

    def take(self, column: str, name: str, arr: StoredArray) -> ArrayChunks:
        """The chunks of array ``name`` of ``column``, started now if they were not (or were
        taken before: a writer that retries with another index encodes them again)."""
        started = self._arrays.pop((column, name), None)
        return started if started is not None else self._start(arr, name)

    def cancel(self) -> None:
        """Drop the chunks not taken (those the pool has not started are never encoded)."""
        with self._lock:
            dropped = [job for large in self._large for job in large.jobs[large.next :]]
            self._large.clear()
        for future in dropped:
            future.cancel()
        for started in self._arrays.values():
            for job in started.jobs:
                job.cancel()
        self._arrays.clear()
        self._later.clear()
        self._tails.clear()

    def _target(self, name: str, arr: StoredArray) -> int:
        codec = chunks.array_codec(name, self._compression, arr.dtype)
        return chunks.chunk_target(name, codec, arr.dtype, self._chunk_bytes)

    def _start(self, arr: StoredArray, name: str) -> ArrayChunks:
        per, rows, codec = chunking(arr, self._compression, self._target(name, arr), name)
        started = self._start_large(arr, per, rows, codec)
        if started is None:
            submit = Inline if arr.nbytes <= INLINE_BYTES else partial(self._storage.submit, encode_chunk)
            started = ArrayChunks(per, codec, [submit(arr, r, codec) for r in rows])
        return started

    def _start_large(
        self, arr: StoredArray, per: int, rows: list[slice], codec: chunks.Compression
    ) -> ArrayChunks | None:
        """A large array's chunks (its :func:`chunking`), compressed by the threads on large
        arrays; None for another array."""
        full = arr.shape[0] // per if arr.size else 0
        if full < GROUP_CHUNKS or not _groupable(arr, per, codec):
            return None
        jobs: list[Future[bytes]] = [Future() for _ in range(full)]
        with self._lock:
            self._large.append(_Large(arr, per, codec, jobs))
        self._add_threads()
        started = ArrayChunks(per, codec, list(jobs))
        # the rows after the last full chunk, zero-padded, are a chunk of their own (started
        # with the other chunks, so that only one thread works while the batch is encoded)
        self._tails += [(started, arr, r) for r in rows[full:]]
        if self._spread:
            self._start_tails()
        return started

    def _start_tails(self) -> None:
        for started, arr, rows in self._tails:
            started.jobs.append(self._storage.submit(encode_chunk, arr, rows, started.codec))
        self._tails.clear()

    def _add_threads(self) -> None:
        """Put pool threads on the large arrays: one before :meth:`spread`, one per core after."""
        with self._lock:
            limit = _localfs.workers() if self._spread else 1
            calls = sum(math.ceil((len(large.jobs) - large.next) / GROUP_CHUNKS) for large in self._large)
            more = max(0, min(limit - self._threads, calls))
            self._threads += more
        for _ in range(more):
            self._storage.submit(self._compress_large)

    def _compress_large(self) -> None:
        while True:
            with self._lock:
                if not self._large:
                    self._threads -= 1
                    return
                large = self._large[0]
                first = large.next
                count = min(GROUP_CHUNKS if self._spread else EARLY_CHUNKS, len(large.jobs) - first)
                large.next += count
                if large.next == len(large.jobs):
                    self._large.popleft()
            _compress(large, first, count)


def _groupable(arr: StoredArray, per: int, codec: chunks.Compression) -> bool:
    """Whether blosc makes one block of each chunk (so that a call over several chunks makes
    the frames of per-chunk calls): blosc, an element size it shuffles by, a chunk no larger
    than the block size asked for and no smaller than blosc compresses, and calls far below
    blosc's limit of 2 GiB per buffer."""
    nbytes = per * arr.dtype.itemsize * math.prod(arr.shape[1:])
    return (
        codec.is_blosc
        and 1 <= arr.dtype.itemsize <= 255
        and chunks.MIN_BLOCK_BYTES <= nbytes <= min(codec.blocksize, _MAX_CHUNK_BYTES)
    )


def _compress(large: _Large, first: int, count: int) -> None:
    """Compress chunks ``first .. first+count-1`` of a large array with one blosc call and
    resolve their jobs; a job cancelled meanwhile drops them (its writer failed)."""
    jobs = large.jobs[first : first + count]
    running = [job for job in jobs if job.set_running_or_notify_cancel()]
    if len(running) < len(jobs):
        for job in running:
            job.set_exception(CancelledError())
        return
    try:
        blobs = encode_chunks(large.arr, first, count, large.per, large.codec)
    except BaseException as exc:
        for job in jobs:
            job.set_exception(exc)
        return
    for job, blob in zip(jobs, blobs, strict=True):
        job.set_result(blob)


def encode_chunks(arr: StoredArray, first: int, count: int, per: int, codec: chunks.Compression) -> list[bytes]:
    """Full chunks ``first .. first+count-1`` of ``arr`` as :func:`encode_chunk` makes them, by
    one blosc call over all their rows (chunk by chunk if blosc framed them otherwise)."""
    rows = slice(first * per, (first + count) * per)
    data = np.ascontiguousarray(arr[rows])
    block = data.nbytes // count
    bc: Any = codec.codec()  # a numcodecs Blosc (only blosc codecs are grouped)
    frame = blosc.compress(data, bc.cname.encode(), bc.clevel, bc.shuffle, block)
    bodies = split_frame(bytes(frame), count, block)
    if bodies is None:  # pragma: no cover - a blosc that frames differently: one call per chunk
        return [encode_chunk(arr, slice(r, r + per), codec) for r in range(rows.start, rows.stop, per)]
    return [chunks.with_crc(body) for body in bodies]


def chunking(
    arr: StoredArray, compression: chunks.Compression, chunk_bytes: int, name: str = ""
) -> tuple[int, list[slice], chunks.Compression]:
    """How array ``name``, ``arr``, is stored: rows per chunk, each chunk's rows, and the codec
    (:func:`chunks.array_codec`)."""
    row_bytes = arr.dtype.itemsize * math.prod(arr.shape[1:])
    per = chunks.chunk_rows(arr.shape[0], row_bytes, chunk_bytes)
    count = chunks.chunk_count(arr.shape[0], per) if arr.size else 0
    codec = chunks.array_codec(name, compression, arr.dtype)
    return per, [slice(i * per, (i + 1) * per) for i in range(count)], codec


def encode_chunk(arr: Any, rows: slice, codec: chunks.Compression) -> bytes:
    """Rows ``rows`` of ``arr`` as the chunk the writer stores (slicing a Narrowed array narrows
    those rows: done in the pool, chunk by chunk)."""
    return chunks.encode(chunks.full_chunk(arr[rows], rows.stop - rows.start), codec)
