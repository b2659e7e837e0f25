"""A small per-process memo of decoded chunks, bounded in bytes (least recently used out first).

Random reads of rows (a map-style dataset's items) decode the same small chunks again and
again: the lengths of jagged columns, the codes and entries of dictionary-encoded ones, the
dense per-row columns. A :class:`ChunkMemo` handed to :func:`zarr_skip.store.reads.read_rounds`
keeps those it decoded (chunks decoding to at most ``max_chunk_bytes``) up to ``max_bytes`` in
all, so a later read copies their rows from it instead of fetching and decoding them again.

A chunk is known by its full path, its place in its file, its stored size and the crc32c its
mini-batch's record names (chunks of records without one are not kept): a step written again
lies under another run's path, so a stale chunk is never served. Its arrays are read-only and
a read copies its rows out of them, so nothing a caller holds aliases them. Reads that must see
the stored bytes (``verify``, the lazy views) do not use a memo.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from zarr_skip.errors import ConfigError

#: the bytes a memo holds at most by default
MEMO_BYTES = 16 << 20
#: chunks decoding to at most this many bytes are kept by default
MEMO_CHUNK_BYTES = 64 << 10


class ChunkMemo:
    """Decoded chunks by key, at most ``max_bytes`` in all, each at most ``max_chunk_bytes``."""

    __slots__ = ("_held", "_lock", "hits", "max_bytes", "max_chunk_bytes", "misses", "nbytes")

    def __init__(self, max_bytes: int = MEMO_BYTES, max_chunk_bytes: int = MEMO_CHUNK_BYTES) -> None:
        if max_bytes < 0 or max_chunk_bytes < 0:
            raise ConfigError(f"ChunkMemo({max_bytes}, {max_chunk_bytes}): sizes must not be negative")
        self.max_bytes, self.max_chunk_bytes = int(max_bytes), int(max_chunk_bytes)
        self._held: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # a dataset read from several threads at once
        self.nbytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._held)

    def get(self, key: Hashable) -> np.ndarray | None:
        """The chunk kept under ``key`` (read-only), or None."""
        with self._lock:
            found = self._held.get(key)
            if found is None:
                self.misses += 1
                return None
            self._held.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: Hashable, chunk: np.ndarray) -> None:
        """Keep ``chunk`` (made read-only) under ``key``, dropping the least recently used ones
        beyond ``max_bytes``; a chunk larger than ``max_chunk_bytes`` is not kept."""
        if chunk.nbytes > self.max_chunk_bytes or chunk.nbytes > self.max_bytes:
            return
        chunk.flags.writeable = False
        with self._lock:
            old = self._held.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._held[key] = chunk
            self.nbytes += chunk.nbytes
            while self.nbytes > self.max_bytes:
                _, dropped = self._held.popitem(last=False)
                self.nbytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self.nbytes = 0

    def __repr__(self) -> str:
        return f"<ChunkMemo {len(self._held)} chunks, {self.nbytes} of {self.max_bytes} bytes>"
