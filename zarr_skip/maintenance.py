"""Checking and cleaning a cache: ``verify`` reads every chunk, ``gc`` removes what is dead."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ConfigError, CorruptCacheError, MetadataError
from zarr_skip.format import chunks, layout
from zarr_skip.format.state import ABANDONED, COMPLETE, WRITING, owner, writer_alive
from zarr_skip.store.catalog import list_steps, scan_steps
from zarr_skip.store.reads import Part

if TYPE_CHECKING:
    from zarr_skip.cache import Cache

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken thing found by :func:`verify`."""

    step: int
    minibatch: int | None
    column: str | None
    path: str
    error: str
    kind: str

    def __str__(self) -> str:
        where = f"step {self.step}"
        if self.minibatch is not None:
            where += f", mini-batch {self.minibatch}"
        if self.column is not None:
            where += f", column {self.column!r}"
        return f"{where}: {self.kind}: {self.error} ({self.path})"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` checked and what it found broken."""

    steps: tuple[int, ...]
    chunks: int
    nbytes: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class Removal:
    """One thing :func:`gc` removed (or would remove, in a dry run)."""

    path: str
    reason: str
    step: int | None = None


@dataclass(frozen=True, slots=True)
class GcReport:
    removed: tuple[Removal, ...]
    dry_run: bool
    kept_writing: tuple[int, ...] = field(default=())


def verify(
    cache: Cache, step: int | Sequence[int] | None = None, *, progress: Callable[[int, int], Any] | None = None
) -> VerifyReport:
    """Read every chunk of complete steps and check presence, size and crc32c.

    Parameters
    ----------
    step : one step, several, or None for every complete step.
    progress : called as ``progress(checked, total)`` with the number of chunks checked after
        each mini-batch and the number to check (for bars).
    """
    storage = cache.storage
    exp = cache._exp()  # noqa: SLF001 - same package
    all_steps = list_steps(storage, exp) if exp else []
    wanted = all_steps if step is None else ([step] if isinstance(step, int) else list(step))
    problems: list[Problem] = []
    n_chunks = n_bytes = 0
    checked: list[int] = []
    scans = scan_steps(storage, exp, wanted) if exp else []
    total = _planned_chunks(scans, time.time(), cache.lease)
    if progress is not None:
        progress(0, total)
    for scan in scans:
        info = scan.info(time.time(), cache.lease)
        if scan.step not in all_steps:
            problems.append(Problem(scan.step, None, None, exp, "no such step", "missing"))
            continue
        lost = scan.missing if scan.summary is not None and not info.complete else []
        for run, name in scan.broken + lost:
            if run == info.run:
                path = storage.key_path(layout.meta_key(layout.join(scan.path, run, name)))
                problems.append(
                    Problem(scan.step, _int(name), None, path, "metadata missing or unreadable", "metadata")
                )
        if not info.complete:
            if step is not None:
                problems.append(
                    Problem(scan.step, None, None, storage.key_path(scan.path), f"step is {info.state}", "incomplete")
                )
            continue
        checked.append(scan.step)
        for rec in sorted((p for p in scan.parts if p.run == info.run and p.complete), key=lambda p: p.index):
            path = layout.join(scan.path, rec.run, str(rec.index))
            try:
                part = Part.from_doc(scan.step, path, rec.doc)
            except MetadataError as exc:
                problems.append(Problem(scan.step, rec.index, None, storage.key_path(path), str(exc), "metadata"))
                continue
            for name, arrays in part.arrays.items():
                for arr in arrays.values():
                    keys = [arr.key(i) for i in range(len(arr.sizes))]
                    if arr.shard:
                        shard = storage.get(keys[0])
                        spans = [arr.span(i) or (0, 0) for i in range(len(arr.sizes))]
                        blobs = [None if shard is None else shard[a : a + n] for a, n in spans]
                        if shard is not None and shard[sum(arr.sizes) :] != chunks.shard_index(arr.sizes):
                            problems.append(
                                Problem(
                                    scan.step,
                                    rec.index,
                                    name,
                                    storage.key_path(keys[0]),
                                    f"{arr.where}: the shard's index does not match its chunks "
                                    "(zarr would misread them)",
                                    "ChecksumError",
                                )
                            )
                    else:
                        blobs = storage.get_many(keys)
                    for i, (key, blob) in enumerate(zip(keys, blobs, strict=True)):
                        n = min(arr.chunk, arr.rows - i * arr.chunk)
                        size = arr.sizes[i]
                        try:
                            if n < arr.chunk:
                                chunks.decode_rows(
                                    blob,
                                    arr.dtype,
                                    arr.shape[1:],
                                    n,
                                    arr.compression,
                                    stored_size=size,
                                    where=arr.where,
                                )
                            else:
                                out = np.empty((n, *arr.shape[1:]), dtype=arr.dtype)
                                chunks.decode_into(blob, out, arr.compression, stored_size=size, where=arr.where)
                        except CorruptCacheError as exc:
                            kind = type(exc).__name__
                            problems.append(Problem(scan.step, rec.index, name, storage.key_path(key), str(exc), kind))
                        n_chunks += 1
                        n_bytes += len(blob or b"")
            if progress is not None:
                progress(n_chunks, max(total, n_chunks))
    for p in problems:
        logger.warning("verify: %s", p)
    return VerifyReport(tuple(checked), n_chunks, n_bytes, tuple(problems))


def _planned_chunks(scans: Sequence[Any], now: float, lease: float) -> int:
    """How many chunks verifying ``scans`` reads (their complete steps' chunks, from the metadata)."""
    total = 0
    for scan in scans:
        info = scan.info(now, lease)
        if not info.complete:
            continue
        for rec in scan.parts:
            if rec.run != info.run or not rec.complete:
                continue
            try:
                part = Part.from_doc(scan.step, layout.join(scan.path, rec.run, str(rec.index)), rec.doc)
            except MetadataError:  # reported by verify itself
                continue
            total += sum(len(arr.sizes) for arrays in part.arrays.values() for arr in arrays.values())
    return total


def gc(
    cache: Cache,
    *,
    keep_last: int | None = None,
    pin: Iterable[int] = (),
    dry_run: bool = False,
    partial_age: float | None = None,
) -> GcReport:
    """Remove dead data: never a live writer's, never a complete step outside retention.

    Removes (1) mini-batches and run records of runs that no longer own their step, (2)
    abandoned steps (no live writer, not complete), (3) temp files (``*.partial``) older than
    ``partial_age`` seconds (default: the lease), and (4) with ``keep_last=K``, complete steps
    older than the K newest, except ``pin``-ned ones.
    """
    if cache.read_only and not dry_run:
        from zarr_skip.errors import ReadOnlyCacheError

        raise ReadOnlyCacheError(f"{cache.location}: opened read-only; gc needs a writable handle")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0):
        raise ConfigError(f"keep_last: expected a non-negative int, got {keep_last!r}")
    storage = cache.storage
    exp = cache._exp()  # noqa: SLF001
    pinned = set(pin)
    now = time.time()
    age = cache.lease if partial_age is None else partial_age
    removals: list[Removal] = []
    writing: list[int] = []
    steps = list_steps(storage, exp) if exp else []
    scans = scan_steps(storage, exp, steps) if exp else []
    complete = [s.step for s in scans if s.info(now, cache.lease).complete]
    retired: set[int] = set()
    if keep_last is not None:
        retired = set(complete[: len(complete) - keep_last]) - pinned
    for scan in scans:
        info = scan.info(now, cache.lease)
        if scan.damaged and scan.step not in retired:
            # an unreadable record may be a stale view through a shared mount of a complete
            # step: keep everything and let verify() tell what is wrong
            logger.warning("gc: step %d has unreadable records; nothing of it is removed", scan.step)
            continue
        if scan.step in retired:
            removals.append(Removal(scan.path, f"retention: keep_last={keep_last}", scan.step))
            continue
        if info.state == ABANDONED and scan.step not in pinned:
            removals.append(Removal(scan.path, "abandoned: incomplete and no live writer", scan.step))
            continue
        if info.state == WRITING:
            writing.append(scan.step)
        own = owner(scan.runs)
        for rec in scan.runs:
            if own is not None and rec.run != own.run:
                live = [
                    p
                    for p in scan.parts
                    if p.run == rec.run
                    and not p.complete
                    and writer_alive(p.host, p.pid, p.heartbeat, now, cache.lease)
                ]
                if not live:
                    removals.append(
                        Removal(
                            layout.join(scan.path, rec.run),
                            f"leftovers of run {rec.run}, displaced by {own.run}",
                            scan.step,
                        )
                    )
        for stray in scan.strays:
            path = layout.join(scan.path, stray)
            if _mtime_age(cache, path, now) >= age:  # a brand-new run's record may not be visible yet
                removals.append(Removal(path, "not a recorded run (crashed creation)", scan.step))
        if info.state == COMPLETE and own is not None:
            for p in scan.parts:
                if p.run == own.run and (p.index >= info.expected or not p.complete):
                    if not writer_alive(p.host, p.pid, p.heartbeat, now, cache.lease):
                        removals.append(
                            Removal(layout.join(scan.path, p.run, str(p.index)), "surplus mini-batch", scan.step)
                        )
    removing = {r.path for r in removals}
    for key in storage.list_prefix(exp) if exp else []:
        if key.endswith(".partial") and not any(key.startswith(p + "/") for p in removing):
            if _mtime_age(cache, key, now) >= age:
                removals.append(Removal(key, "temp file of a killed writer"))
    for r in removals:
        logger.info("gc%s: %s (%s)", " (dry run)" if dry_run else "", storage.key_path(r.path), r.reason)
        if not dry_run:
            if r.path.endswith(".partial"):
                storage.delete(r.path)
            else:
                storage.delete_prefix(r.path)
    return GcReport(tuple(removals), dry_run, tuple(writing))


def _mtime_age(cache: Cache, key: str, now: float) -> float:
    """Seconds since a temp file was last written (local stores; elsewhere: treat as old)."""
    import os

    from zarr.storage import LocalStore

    store = cache.storage.store
    if isinstance(store, LocalStore):
        try:
            return now - os.stat(os.path.join(str(store.root), key)).st_mtime
        except FileNotFoundError:
            return 0.0
    return float("inf")


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None
