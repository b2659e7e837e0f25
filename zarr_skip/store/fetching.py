"""Fetching the stored bytes of chunks: those lying back to back in one file (the chunks of a
packed mini-batch's arrays, of a shard) in one ranged read per run of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zarr_skip.store.storage import Storage

#: the most bytes fetched by one ranged read of adjacent chunks
MAX_RUN_BYTES = 8 << 20


@dataclass(slots=True)
class _Run:
    """One read: ``length`` bytes of ``key`` from ``start`` (the whole key when ``whole``),
    holding items ``(index, offset in the run, size)``."""

    key: str
    start: int
    length: int
    items: list[tuple[int, int, int]]
    whole: bool = False


def fetch_chunks(storage: Storage, items: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The stored bytes of chunk ``item[1]`` of array ``item[0]`` for each item (None where
    absent; fewer bytes where the file is cut short): chunks lying back to back in one file
    are fetched together, one ranged read (a ``pread``, or a ranged GET) per run of them."""
    runs: list[_Run] = []
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for n, item in enumerate(items):
        a, c = item[0], item[1]
        span = a.span(c)
        if span is None:
            runs.append(_Run(a.key(c), 0, 0, [(n, 0, -1)], whole=True))
        else:
            spans.setdefault(a.key(c), []).append((span[0], span[1], n))
    for key, found in spans.items():
        found.sort()
        last: _Run | None = None
        for start, length, n in found:
            if last is not None and last.start + last.length == start and last.length < MAX_RUN_BYTES:
                last.items.append((n, last.length, length))
                last.length += length
            else:
                last = _Run(key, start, length, [(n, 0, length)])
                runs.append(last)
    out: list[Any] = [None] * len(items)
    if not runs:
        return out
    blobs = storage.map_get(
        runs, lambda r: r.key, lambda r, blob: blob, lambda r: None if r.whole else (r.start, r.length)
    )
    for run, blob in zip(runs, blobs, strict=True):
        view = None if blob is None else memoryview(blob)
        for n, at, size in run.items:
            out[n] = None if view is None else (blob if size < 0 else view[at : at + size])
    return out
