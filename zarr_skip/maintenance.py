"""Checking and cleaning a cache: ``verify`` reads every chunk, ``gc`` removes what is dead."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ConfigError, CorruptCacheError, MetadataError, OutsideCacheError
from zarr_skip.format import checks, chunks, layout, records
from zarr_skip.format.state import ABANDONED, COMPLETE, WRITING, PartRecord, owner, writer_alive
from zarr_skip.store.catalog import list_steps, scan_steps, summary_problem
from zarr_skip.store.reads import ArrayPart, Part, checked_entries
from zarr_skip.store.storage import Storage, parse_json

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
        where = f"step {self.step}" if self.step >= 0 else "experiment"
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
    #: steps holding records of older writers, which do not name their place: a chunk or
    #: record of theirs moved or swapped could not be told apart (not a problem by itself)
    unbound: tuple[int, ...] = ()

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
    """Read every chunk of complete steps and check presence, size, crc32c and place.

    Besides each chunk's own checksum, a chunk must be the one its mini-batch's record names
    (its crc32c there), every record must lie where it says it belongs (experiment, step, run,
    index), a step's summary must agree with its records, and a jagged column's lengths must
    add to its stored values. Records of older writers, which do not name their place, are
    listed in ``unbound``.

    Parameters
    ----------
    step : one step, several, or None for every complete step.
    progress : called as ``progress(checked, total)`` with the number of chunks checked after
        each mini-batch and the number to check (for bars).
    """
    storage = cache.storage
    problems: list[Problem] = [
        Problem(-1, None, None, path, why, "experiment") for path, why in cache.damaged_experiments().items()
    ]
    exp = cache._exp() if not problems else cache.experiment or ""  # noqa: SLF001 - same package
    all_steps = list_steps(storage, exp) if exp else []
    wanted = all_steps if step is None else checks.check_steps([step] if isinstance(step, int) else step) or []
    checked: list[int] = []
    unbound: list[int] = []
    todo: list[tuple[int, PartRecord, Part]] = []
    for scan in scan_steps(storage, exp, wanted) if exp else []:
        info = scan.info(time.time(), cache.lease)
        if scan.step not in all_steps:
            problems.append(Problem(scan.step, None, None, exp, "no such step", "missing"))
            continue
        problems += [Problem(scan.step, None, None, path, why, "misplaced") for path, why in scan.misplaced]
        lost = scan.missing if scan.summary is not None and not info.complete else []
        for run, name in scan.broken + lost:
            if run == info.run:
                path = storage.key_path(layout.meta_key(layout.join(scan.path, run, name)))
                problems.append(
                    Problem(scan.step, _int(name), None, path, "metadata missing or unreadable", "metadata")
                )
        summary_path = storage.key_path(layout.meta_key(scan.path))
        if not info.complete:
            if step is not None or (scan.summary is not None and not lost):
                problems.append(
                    Problem(scan.step, None, None, storage.key_path(scan.path), f"step is {info.state}", "incomplete")
                )
            continue
        why = summary_problem(scan, info.run)
        if why is not None:
            problems.append(Problem(scan.step, None, None, summary_path, why, "summary"))
        checked.append(scan.step)
        for rec in sorted((p for p in scan.parts if p.run == info.run and p.complete), key=lambda p: p.index):
            path = layout.join(scan.path, rec.run, str(rec.index))
            try:
                part = Part.from_doc(scan.step, path, rec.doc, exp)
                part.check_columns()  # a reader checks a column when it first uses it
            except MetadataError as exc:
                problems.append(Problem(scan.step, rec.index, None, storage.key_path(path), str(exc), "metadata"))
                continue
            if not records.bound(rec.doc) and scan.step not in unbound:
                unbound.append(scan.step)
            todo.append((scan.step, rec, part))
    n_chunks, n_bytes = _check_chunks(storage, todo, problems, progress)
    for p in problems:
        logger.warning("verify: %s", p)
    return VerifyReport(tuple(checked), n_chunks, n_bytes, tuple(problems), tuple(unbound))


def _check_chunks(
    storage: Storage,
    todo: Sequence[tuple[int, PartRecord, Part]],
    problems: list[Problem],
    progress: Callable[[int, int], Any] | None,
) -> tuple[int, int]:
    """Read and check every chunk of ``todo``'s mini-batches; returns chunks and bytes read."""
    # which recorded chunk has which crc32c and size: a chunk found in the wrong place is named
    owners = {
        (crc, size): f"{arr.where}, chunk {i}"
        for _, _, part in todo
        for arrays in part.arrays.values()
        for arr in arrays.values()
        for i, (crc, size) in enumerate(zip(arr.crcs or (), arr.sizes, strict=False))
    }
    n_chunks = n_bytes = 0
    total = sum(len(arr.sizes) for _, _, part in todo for arrays in part.arrays.values() for arr in arrays.values())
    if progress is not None:
        progress(0, total)
    for step, rec, part in todo:
        for name, arrays in part.arrays.items():
            try:
                decoded: dict[str, list[np.ndarray] | None] = {"lengths": [], "codes": []}  # None: unreadable
                docs = storage.get_many(layout.meta_key(arr.path) for arr in arrays.values())
                for (aname, arr), doc in zip(arrays.items(), docs, strict=True):
                    why = _zarr_metadata_problem(arr, doc, storage.key_path(layout.meta_key(arr.path)))
                    if why is not None:
                        path = storage.key_path(layout.meta_key(arr.path))
                        problems.append(Problem(step, rec.index, name, path, why, "zarr metadata"))
                    keys = [arr.key(i) for i in range(len(arr.sizes))]
                    if arr.shard:
                        shard = storage.get(keys[0])
                        spans = [arr.span(i) or (0, 0) for i in range(len(arr.sizes))]
                        blobs = [None if shard is None else shard[a : a + n] for a, n in spans]
                        if shard is not None and shard[sum(arr.sizes) :] != chunks.shard_index(arr.sizes):
                            problems.append(
                                Problem(
                                    step,
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
                        where = f"{arr.where}, chunk {i}"
                        try:
                            rows = _decode(arr, i, n, blob, where)
                            got = decoded.get(aname)
                            if got is not None:
                                got.append(rows)
                        except CorruptCacheError as exc:
                            error = str(exc)
                            if blob is not None and len(blob) >= 4:
                                found = owners.get((chunks.trailer(blob), len(blob)))
                                if found is not None and found != where:
                                    error += f"; it is {found}"
                            problems.append(
                                Problem(step, rec.index, name, storage.key_path(key), error, type(exc).__name__)
                            )
                            decoded[aname] = None
                        n_chunks += 1
                        n_bytes += len(blob or b"")
                lengths, codes = decoded["lengths"], decoded["codes"]
                if "lengths" in arrays and "values" in arrays and lengths is not None and codes is not None:
                    try:
                        checked_entries(arrays, _cat(codes) if "codes" in arrays else None, _cat(lengths))
                    except MetadataError as exc:
                        path = storage.key_path(arrays["lengths"].path)
                        problems.append(Problem(step, rec.index, name, path, str(exc), "MetadataError"))
            except OutsideCacheError as exc:  # a link or a key that leads out of the cache
                problems.append(Problem(step, rec.index, name, part.path, str(exc), "OutsideCacheError"))
        if progress is not None:
            progress(n_chunks, max(total, n_chunks))
    return n_chunks, n_bytes


def _cat(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


#: what a plain zarr reader takes from an array's zarr.json to read its chunks
_ZARR_KEYS = ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "codecs")


def _zarr_metadata_problem(arr: ArrayPart, blob: bytes | None, where: str) -> str | None:
    """Why an array's ``zarr.json`` would make plain zarr misread its chunks (zarr_skip reads
    them by the record alone), or None when it says what the record does."""
    try:
        doc = parse_json(blob, where)
    except MetadataError as exc:
        return str(exc)
    if doc is None:
        return f"{where}: missing (plain zarr readers cannot open the array)"
    if arr.compression.name == "auto":  # a record too old to name each array's codec
        return None
    grid = (arr.chunk, *(max(1, d) for d in arr.shape[1:]))
    shard = len(arr.sizes) if arr.shard else 1
    want = chunks.array_metadata(arr.shape, grid, arr.dtype, arr.compression, arr.separator, shard=shard)
    wrong = [k for k in _ZARR_KEYS if doc.get(k) != want[k]]
    return f"{where}: {', '.join(wrong)} differ from the mini-batch's record (zarr would misread it)" if wrong else None


def _decode(arr: ArrayPart, i: int, n: int, blob: bytes | None, where: str) -> np.ndarray:
    """Chunk ``i`` of ``arr`` decoded and checked (its first ``n`` rows)."""
    size, crc = arr.sizes[i], arr.crc(i)
    if n < arr.chunk:
        return chunks.decode_rows(
            blob, arr.dtype, arr.shape[1:], n, arr.compression, stored_size=size, where=where, crc=crc, chunk=arr.chunk
        )
    if blob is None or len(blob) != size:  # before allocating what the record says it holds
        chunks.decode_rows(blob, arr.dtype, arr.shape[1:], 0, arr.compression, stored_size=size, where=where)
    try:
        out = np.empty((n, *arr.shape[1:]), dtype=arr.dtype)
    except MemoryError:
        raise MetadataError(f"{where}: the record's shape {arr.shape} cannot be allocated") from None
    return chunks.decode_into(blob, out, arr.compression, stored_size=size, where=where, crc=crc)


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
