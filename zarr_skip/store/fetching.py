"""Fetching the stored bytes of chunks: those lying near each other in one file (the chunks of
a packed mini-batch's arrays, of a shard) in one ranged read per run of them.

Between two arrays' chunks a packed data file holds a ZIP local header and often an array's
``zarr.json``: a run steps over holes of up to :data:`MAX_HOLE_BYTES` (a page), so a whole
mini-batch is one ``pread`` or one GET, not one per array, while a hole holding a chunk of
another column, or of rows not asked for, of more than that is not read. (Apache Arrow's read
coalescing makes the same trade: ``CacheOptions``, holes of 8 KiB by default.) The runs of one
file are read through one open file; a small fetch (a read of a few rows) in the calling thread."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zarr_skip.store.storage import Storage

#: the most bytes fetched by one ranged read of nearby chunks
MAX_RUN_BYTES = 8 << 20
#: the most bytes between two chunks read as part of one run
MAX_HOLE_BYTES = 4 << 10
#: a fetch of at most this many bytes (all ranged) is read in the calling thread, each file
#: opened once and the kernel asked to read every range first: handing a few small reads to the
#: pool costs more than reading them (a read of a few rows: ~30 us a task against ~5 us a pread)
SERIAL_FETCH_BYTES = 1 << 20


@dataclass(slots=True)
class _Run:
    """One read: ``length`` bytes of ``key`` from ``start``, holding items ``(index, offset
    in the run, size)``."""

    key: str
    start: int
    length: int
    items: list[tuple[int, int, int]]
    hole: int = 0  # the largest hole after it that it may step over


def fetch_chunks(storage: Storage, items: Sequence[tuple[Any, ...]], hole: int = MAX_HOLE_BYTES) -> list[Any]:
    """The stored bytes of chunk ``item[1]`` of array ``item[0]`` for each item (None where
    absent; fewer bytes where the file is cut short): chunks lying back to back in one file
    are fetched together, one ranged read (a ``pread``, or a ranged GET) per run of them, a
    run stepping over holes of up to ``hole`` bytes (see the module docstring; some blocks of
    a chunk, a :class:`blockreads.Piece`, may say fewer)."""
    ranged: list[list[_Run]] = []  # per file: its runs, rising
    spans: dict[str, list[tuple[int, int, int, int]]] = {}
    for n, item in enumerate(items):
        a, c = item[0], item[1]
        span = a.span(c)
        if span is None:  # a file of its own (formats 2, 3): a byte more than the record says, at
            # most, so that a file grown far past it is refused without being read whole
            spans.setdefault(a.key(c), []).append((0, a.sizes[c] + 1, n, 0))
        else:  # some blocks of a chunk (blockreads.Piece) say how far apart they may be read
            spans.setdefault(a.key(c), []).append((span[0], span[1], n, min(hole, getattr(a, "max_hole", hole))))
    for key, found in spans.items():
        found.sort()
        last: _Run | None = None
        ranged.append([])
        for start, length, n, max_hole in found:
            end = last.start + last.length if last is not None else 0
            if last is not None and end <= start <= end + min(last.hole, max_hole) and last.length < MAX_RUN_BYTES:
                last.items.append((n, start - last.start, length))
                last.length, last.hole = start + length - last.start, max_hole
            else:
                last = _Run(key, start, length, [(n, 0, length)], hole=max_hole)
                ranged[-1].append(last)
    out: list[Any] = [None] * len(items)
    requests = _requests(ranged)
    asked = [(g[0].key, [(r.start, r.length) for r in g]) for g in requests]
    serial = sum(r.length for g in requests for r in g) <= SERIAL_FETCH_BYTES
    for group, got in zip(requests, storage.get_spans(asked, serial=serial) if asked else [], strict=True):
        if got is None:  # the file is absent: its items stay None
            continue
        for run, blob in zip(group, got, strict=True):
            view = memoryview(blob)
            for n, at, size in run.items:
                out[n] = view[at : at + size]
    return out


def _requests(ranged: list[list[_Run]]) -> list[list[_Run]]:
    """The runs of each file in requests of at most :data:`MAX_RUN_BYTES` (each one open file,
    and a large read still shared among the pool's threads)."""
    out: list[list[_Run]] = []
    for runs in ranged:
        size = MAX_RUN_BYTES
        for run in runs:
            if size + run.length > MAX_RUN_BYTES:
                out.append([])
                size = 0
            out[-1].append(run)
            size += run.length
    return out
