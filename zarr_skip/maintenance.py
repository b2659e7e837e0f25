"""Checking and cleaning a cache: ``verify`` reads every chunk, ``gc`` removes what is dead."""

from __future__ import annotations

import logging
import os
import time
import zipfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zarr.storage import LocalStore

from zarr_skip._deprecation import warn_renamed
from zarr_skip.errors import (
    ChecksumError,
    ConfigError,
    CorruptCacheError,
    MetadataError,
    OutsideCacheError,
    ReadOnlyCacheError,
)
from zarr_skip.format import args, checks, chunks, layout, records
from zarr_skip.format.state import (
    ABANDONED,
    COMPLETE,
    WRITING,
    PartRecord,
    StepInfo,
    alive,
    owner,
    writer_alive,
)
from zarr_skip.store import packed
from zarr_skip.store.catalog import StepScan, delete_step, list_steps, scan_steps, summary_problem
from zarr_skip.store.reads import ArrayPart, Part, checked_entries
from zarr_skip.store.storage import Storage, parse_json

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
    #: stored bytes read and checked
    nbytes_stored: int
    problems: tuple[Problem, ...]
    #: steps holding records of older writers, which do not name their place: a chunk or
    #: record of theirs moved or swapped could not be told apart (not a problem by itself)
    unbound: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def nbytes(self) -> int:
        """Deprecated: :attr:`nbytes_stored` (the stored bytes checked)."""
        warn_renamed("VerifyReport.nbytes", "VerifyReport.nbytes_stored (the stored bytes checked)")
        return self.nbytes_stored


@dataclass(frozen=True, slots=True)
class Removal:
    """One thing :func:`gc` removed (or would remove, in a dry run)."""

    path: str
    reason: str
    step: int | None = None
    #: a single file (else everything below ``path``)
    file: bool = False


@dataclass(frozen=True, slots=True)
class GcReport:
    removed: tuple[Removal, ...]
    dry_run: bool
    kept_writing: tuple[int, ...] = field(default=())


def verify(
    storage: Storage,
    experiment: str,
    *,
    lease: float,
    steps: Sequence[int] | None = None,
    damaged: Mapping[str, str] | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> VerifyReport:
    """Read every chunk of complete steps and check presence, size, crc32c and place.

    Besides each chunk's own checksum, a chunk must be the one its mini-batch's record names
    (its crc32c there), every record must lie where it says it belongs (experiment, step, run,
    index), a step's summary must agree with its records, and a jagged column's lengths must
    add to its stored values. Records of older writers, which do not name their place, are
    listed in ``unbound``.

    Parameters
    ----------
    storage, experiment : where the experiment's steps are (``""``: none to check).
    lease : seconds without a heartbeat after which a writer counts as gone.
    steps : the steps to check (each must be complete), or None for every complete step.
    damaged : experiment records found damaged beforehand (path -> why), reported first.
    progress : called as ``progress(checked, total)`` with the number of chunks checked after
        each mini-batch and the number to check (for bars).
    """
    problems = [Problem(-1, None, None, path, why, "experiment") for path, why in (damaged or {}).items()]
    all_steps = list_steps(storage, experiment) if experiment else []
    wanted = all_steps if steps is None else checks.check_steps(steps) or []
    checked: list[int] = []
    unbound: list[int] = []
    todo: list[tuple[int, PartRecord, Part]] = []
    now = time.time()
    for scan in scan_steps(storage, experiment, wanted) if experiment else []:
        if scan.step not in all_steps:
            problems.append(Problem(scan.step, None, None, experiment, "no such step", "missing"))
            continue
        found = _check_scan(storage, experiment, scan, scan.info(now, lease), steps is not None, problems)
        if found is None:
            continue
        checked.append(scan.step)
        if any(not records.bound(rec.doc) for _, rec, _ in found):
            unbound.append(scan.step)
        todo += found
    n_chunks, n_bytes = _check_chunks(storage, todo, problems, progress)
    for p in problems:
        logger.warning("verify: %s", p)
    return VerifyReport(tuple(checked), n_chunks, n_bytes, tuple(problems), tuple(unbound))


def _check_scan(
    storage: Storage, exp: str, scan: StepScan, info: StepInfo, asked: bool, problems: list[Problem]
) -> list[tuple[int, PartRecord, Part]] | None:
    """The records of one step checked (problems appended): its complete mini-batches whose
    chunks are to be read, or None when the step is not complete (an incomplete step is a
    problem when it was ``asked`` for, or when its summary said it was complete)."""
    step = scan.step
    problems += [Problem(step, None, None, path, why, "misplaced") for path, why in scan.misplaced]
    problems += [_unrecorded_problem(storage, scan, run) for run in scan.unrecorded]
    lost = scan.missing if scan.summary is not None and not info.complete else []
    for run, name in scan.broken + lost:
        if run == info.run:
            path = storage.key_path(layout.meta_key(layout.join(scan.path, run, name)))
            problems.append(Problem(step, _int(name), None, path, "metadata missing or unreadable", "metadata"))
    if not info.complete:
        if asked or (scan.summary is not None and not lost and not scan.unrecorded):
            problems.append(
                Problem(step, None, None, storage.key_path(scan.path), f"step is {info.state}", "incomplete")
            )
        return None
    why = summary_problem(scan, info.run)
    if why is not None:
        problems.append(Problem(step, None, None, storage.key_path(layout.meta_key(scan.path)), why, "summary"))
    out = []
    for rec in sorted((p for p in scan.parts if p.run == info.run and p.complete), key=lambda p: p.index):
        path = layout.join(scan.path, rec.run, str(rec.index))
        try:
            part = Part.from_doc(step, path, rec.doc, exp)
            part.check_columns()  # a reader checks a column when it first uses it
        except MetadataError as exc:
            problems.append(Problem(step, rec.index, None, storage.key_path(path), str(exc), "metadata"))
            continue
        out.append((step, rec, part))
    return out


def _unrecorded_problem(storage: Storage, scan: StepScan, run: str) -> Problem:
    """A run record that the step's summary names and that is gone."""
    path = storage.key_path(layout.meta_key(layout.join(scan.path, run)))
    why = (
        f"run record missing: the step's summary names run {run}, whose record is gone (deleted, or "
        "left out of a copy); its mini-batches still read, gc removes nothing of this step, and a "
        "write replaces it only with overwrite=True (`zarr-skip rm` deletes it)"
    )
    return Problem(scan.step, None, None, path, why, "metadata")


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
        files: dict[str, _DataFile] = {}  # a packed mini-batch's data file, read once
        for name, arrays in part.arrays.items():
            try:
                got = _check_column(storage, _Where(step, rec.index, name), arrays, owners, problems, files)
            except OutsideCacheError as exc:  # a link or a key that leads out of the cache
                problems.append(Problem(step, rec.index, name, part.path, str(exc), "OutsideCacheError"))
                continue
            n_chunks, n_bytes = n_chunks + got[0], n_bytes + got[1]
        if progress is not None:
            progress(n_chunks, max(total, n_chunks))
    return n_chunks, n_bytes


@dataclass(frozen=True, slots=True)
class _Where:
    """The column a check is about (what its problems name)."""

    step: int
    minibatch: int
    column: str

    def problem(self, path: str, error: str, kind: str) -> Problem:
        return Problem(self.step, self.minibatch, self.column, path, error, kind)


def _check_column(
    storage: Storage,
    at: _Where,
    arrays: Mapping[str, ArrayPart],
    owners: Mapping[tuple[int, int], str],
    problems: list[Problem],
    files: dict[str, _DataFile],
) -> tuple[int, int]:
    """Read and check every chunk of one column of one mini-batch (and that a jagged column's
    lengths add up to its values); returns chunks and bytes read."""
    decoded: dict[str, list[np.ndarray] | None] = {"lengths": [], "codes": []}  # None: unreadable
    n_chunks = n_bytes = 0
    for aname, arr in arrays.items():
        found = _array_bytes(storage, arr, files)
        for path, why, kind in found.problems:
            problems.append(at.problem(path, why, kind))
        for i, (key, blob) in enumerate(zip(found.keys, found.blobs, strict=True)):
            where = f"{arr.where}, chunk {i}"
            try:
                rows = _decode(arr, i, min(arr.chunk, arr.rows - i * arr.chunk), blob, where)
                got = decoded.get(aname)
                if got is not None:
                    got.append(rows)
            except CorruptCacheError as exc:
                error = str(exc)
                if blob is not None and len(blob) >= 4:
                    theirs = owners.get((chunks.trailer(blob), len(blob)))
                    if theirs is not None and theirs != where:
                        error += f"; it is {theirs}"
                problems.append(at.problem(storage.key_path(key), error, type(exc).__name__))
                decoded[aname] = None
            n_chunks += 1
            n_bytes += len(blob or b"")
    lengths, codes = decoded["lengths"], decoded["codes"]
    if "lengths" in arrays and "values" in arrays and lengths is not None and codes is not None:
        try:
            checked_entries(arrays, _cat(codes) if "codes" in arrays else None, _cat(lengths))
        except MetadataError as exc:
            problems.append(at.problem(storage.key_path(arrays["lengths"].path), str(exc), "MetadataError"))
    return n_chunks, n_bytes


@dataclass(slots=True)
class _DataFile:
    """A packed mini-batch's data file as verify reads it: its bytes and its members'
    ``(offset, length)`` (None with ``problem`` when it is absent or not a ZIP)."""

    blob: bytes | None
    members: dict[str, tuple[int, int]] | None
    problem: str | None = None


@dataclass(slots=True)
class _Found:
    """One array's chunks as stored (``blobs``, None where absent), the keys they lie at,
    and what is wrong with its zarr metadata or container: ``(path, why, kind)``."""

    keys: list[str]
    blobs: list[bytes | None]
    problems: list[tuple[str, str, str]]


def _array_bytes(storage: Storage, arr: ArrayPart, files: dict[str, _DataFile]) -> _Found:
    """The stored chunks of ``arr`` and the problems of its zarr metadata."""
    if arr.file is not None:
        return _packed_bytes(storage, arr, files)
    meta = layout.meta_key(arr.path)
    found = _Found([arr.key(i) for i in range(len(arr.sizes))], [], [])
    why = _zarr_metadata_problem(arr, storage.get(meta), storage.key_path(meta))
    if why is not None:
        found.problems.append((storage.key_path(meta), why, "zarr metadata"))
    if not arr.shard:  # a byte more than the record says, at most: a grown file is not read whole
        got = storage.get_spans([(k, [(0, n + 1)]) for k, n in zip(found.keys, arr.sizes, strict=True)])
        found.blobs = [None if g is None else g[0] for g in got]
        return found
    shard = storage.get(found.keys[0])
    spans = [arr.span(i) or (0, 0) for i in range(len(arr.sizes))]
    found.blobs = [None if shard is None else shard[a : a + n] for a, n in spans]
    if shard is not None and shard[sum(arr.sizes) :] != chunks.shard_index(arr.sizes):
        why = f"{arr.where}: the shard's index does not match its chunks (zarr would misread them)"
        found.problems.append((storage.key_path(found.keys[0]), why, "ChecksumError"))
    return found


def _packed_bytes(storage: Storage, arr: ArrayPart, files: dict[str, _DataFile]) -> _Found:
    """:func:`_array_bytes` of an array in a packed mini-batch's data file: its zarr
    metadata and chunk member must be members of the ZIP, the chunks where the record says."""
    file = arr.file or ""
    where = storage.key_path(file)
    if file not in files:
        blob = storage.get(file)
        try:
            files[file] = _DataFile(blob, None if blob is None else packed.members_of(blob))
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            files[file] = _DataFile(blob, None, f"{where}: not a readable ZIP data file ({exc})")
    data = files[file]
    n = len(arr.sizes)
    found = _Found([file] * n, [], [])
    inner = arr.path[len(file) + 1 :]  # the array's path inside the data file
    if data.blob is not None and data.members is not None:
        meta = data.members.get(layout.meta_key(inner))
        doc = None if meta is None else data.blob[meta[0] : meta[0] + meta[1]]
        why = _zarr_metadata_problem(arr, doc, f"{where}: member {layout.meta_key(inner)}")
        if why is not None:
            found.problems.append((where, why, "zarr metadata"))
        member = data.members.get(layout.chunk_key(inner, 0, len(arr.shape), arr.separator)) if n else None
        if n and (member is None or member[0] != arr.offset):
            why = f"{arr.where}: the data file's chunk member is not where the record says (zarr would misread it)"
            found.problems.append((where, why, "ChecksumError"))
    elif data.problem is not None:
        found.problems.append((where, data.problem, "MissingDataError"))
    spans = [arr.span(i) or (0, 0) for i in range(n)]
    found.blobs = [None if data.blob is None else data.blob[a : a + k] for a, k in spans]
    if arr.shard and data.blob is not None:
        end = arr.offset + sum(arr.sizes)
        if data.blob[end : end + records.SHARD_INDEX_BYTES * n + records.CRC_BYTES] != chunks.shard_index(arr.sizes):
            why = f"{arr.where}: the shard's index does not match its chunks (zarr would misread them)"
            found.problems.append((where, why, "ChecksumError"))
    return found


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
    """Chunk ``i`` of ``arr`` decoded and checked (its first ``n`` rows), and its block index
    in the record, when it has one, checked against it (what reads of a few rows trust)."""
    out = _decode_chunk(arr, i, n, blob, where)
    starts = None if arr.blocks is None or arr.block_crcs is None else (arr.blocks[i], arr.block_crcs[i])
    if (
        starts is not None
        and blob is not None
        and chunks.block_index(blob, arr.compression.blocksize) != (list(starts[0]), list(starts[1]))
    ):
        raise ChecksumError(f"{where}: the record's block starts or checksums do not match the chunk")
    return out


def _decode_chunk(arr: ArrayPart, i: int, n: int, blob: bytes | None, where: str) -> np.ndarray:
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


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What :func:`plan_gc` decided: what to remove, and what to remove once old enough."""

    removals: tuple[Removal, ...]
    #: steps some live writer is still writing (kept)
    writing: tuple[int, ...]
    #: names below a step without a run record (or steps without any): a crashed creation, or
    #: a brand-new run whose record is not visible yet, so removed only once older than the
    #: temp-file age
    strays: tuple[Removal, ...]


def plan_gc(
    scans: Sequence[StepScan],
    *,
    now: float,
    lease: float,
    keep_last: int | None = None,
    pins: Iterable[int] = (),
) -> GcPlan:
    """The retention policy of :func:`gc` (pure: no I/O): what of ``scans`` to remove at ``now``.

    Removes (1) mini-batches and run records of runs that no longer own their step and have
    no live writer (older runs displaced by the owner; a newer run that began replacing a
    complete step and died before completing it), (2) abandoned steps (no live writer, not
    complete), (3) surplus and unfinished mini-batches of a complete step's owner without a
    live writer, and (4) with ``keep_last=K``, complete steps older than the K newest, except
    those in ``pins``. A step with unreadable records is kept whole (unless retention retires
    it).
    """
    pinned = set(pins)
    complete = [s.step for s in scans if s.info(now, lease).complete]
    retired = set() if keep_last is None else set(complete[: len(complete) - keep_last]) - pinned
    removals: list[Removal] = []
    strays: list[Removal] = []
    writing: list[int] = []
    for scan in scans:
        info = scan.info(now, lease)
        if scan.step in retired:
            removals.append(Removal(scan.path, f"retention: keep_last={keep_last}", scan.step))
        elif scan.damaged:
            # an unreadable record may be a stale view through a shared mount of a complete
            # step: keep everything and let verify() tell what is wrong
            logger.warning("gc: step %d has unreadable or missing records; nothing of it is removed", scan.step)
        elif info.state == ABANDONED and scan.step not in pinned and not scan.runs:
            # no run record visible: a crashed creation, or a brand-new run's first record not
            # visible yet (its directory exists first): removed only once old, as strays are
            strays.append(Removal(scan.path, "abandoned: no recorded run (crashed creation)", scan.step))
        elif info.state == ABANDONED and scan.step not in pinned:
            removals.append(Removal(scan.path, "abandoned: incomplete and no live writer", scan.step))
        else:
            if info.state == WRITING:
                writing.append(scan.step)
            removals += _dead_runs(scan, info, now, lease)
            strays += [
                Removal(layout.join(scan.path, s), "not a recorded run (crashed creation)", scan.step)
                for s in scan.strays
            ]
    return GcPlan(tuple(removals), tuple(writing), tuple(strays))


def _dead_runs(scan: StepScan, info: StepInfo, now: float, lease: float) -> list[Removal]:
    """A kept step's dead leftovers: runs displaced by its owner without a live writer, a newer
    run's unfinished replacement of the complete step (``overwrite``) once none of its writers
    lives, and the owner's surplus or unfinished mini-batches once the step is complete."""
    own = owner(scan.runs, scan.parts)
    if own is None:
        return []
    out = []
    for rec in scan.runs:
        if rec.run == own.run:
            continue
        if (rec.started, rec.run) > (own.started, own.run):  # replacing the owner's complete step
            if not alive(rec, scan.parts, now, lease):
                why = f"unfinished replacement of run {own.run}'s step by run {rec.run}"
                out.append(Removal(layout.join(scan.path, rec.run), why, scan.step))
        elif not any(
            p.run == rec.run and not p.complete and writer_alive(p.host, p.pid, p.heartbeat, now, lease)
            for p in scan.parts
        ):
            out.append(
                Removal(
                    layout.join(scan.path, rec.run), f"leftovers of run {rec.run}, displaced by {own.run}", scan.step
                )
            )
    if info.state == COMPLETE:
        out += [
            Removal(layout.join(scan.path, p.run, str(p.index)), "surplus mini-batch", scan.step)
            for p in scan.parts
            if p.run == own.run
            and (p.index >= info.expected or not p.complete)
            and not writer_alive(p.host, p.pid, p.heartbeat, now, lease)
        ]
    return out


def gc(
    storage: Storage,
    experiment: str,
    *,
    lease: float,
    keep_last: int | None = None,
    pin: int | Iterable[int] = (),
    dry_run: bool = False,
    partial_age: float | None = None,
    only: Collection[str] | None = None,
) -> GcReport:
    """Remove dead data: never a live writer's, never a complete step outside retention.

    Applies :func:`plan_gc` to the experiment's steps, with the records of runs that never
    recorded themselves and the temp files (``*.partial``) of killed writers older than
    ``partial_age`` seconds (default: the lease); with ``dry_run`` only reports. ``pin``: a
    step or steps kept whatever ``keep_last`` says. ``only``: the paths of an earlier report
    that were shown and confirmed; what the plan finds now beyond them (a step completed
    meanwhile moves retention) is left alone.
    """
    dry_run = args.flag(dry_run, "dry_run")
    if storage.read_only and not dry_run:
        raise ReadOnlyCacheError(f"{storage.where}: opened read-only; gc needs a writable handle")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0):
        raise ConfigError(f"keep_last: expected a non-negative int, got {keep_last!r}")
    pin = checks.check_steps(pin, one=True, what="pin") or []
    now = time.time()
    age = lease if partial_age is None else checks.check_seconds(partial_age, "partial_age", zero=True)
    scans = scan_steps(storage, experiment, list_steps(storage, experiment)) if experiment else []
    plan = plan_gc(scans, now=now, lease=lease, keep_last=keep_last, pins=pin)
    # a brand-new run's record may not be visible yet: strays only once old
    removals = [*plan.removals, *(r for r in plan.strays if _mtime_age(storage, r.path, now) >= age)]
    removing = {r.path for r in removals}
    keys = storage.list_prefix(experiment) if experiment else []
    keys = [k for k in keys if layout.key_problem(k) is None]  # a foreign name no key holds: not ours
    for key in keys:
        if layout.is_temp(key) and not any(key.startswith(p + "/") for p in removing):
            if _mtime_age(storage, key, now) >= age:
                removals.append(Removal(key, "temp file of a killed writer", file=True))
    removals += [r for r in lost_data_files(scans, keys) if not any(r.path.startswith(p + "/") for p in removing)]
    if only is not None:
        removals = [r for r in removals if r.path in only]
    for r in removals:
        logger.info("gc%s: %s (%s)", " (dry run)" if dry_run else "", storage.key_path(r.path), r.reason)
        if not dry_run:
            _remove(storage, experiment, r)
    return GcReport(tuple(removals), dry_run, plan.writing)


def _remove(storage: Storage, experiment: str, r: Removal) -> None:
    """Carry out one removal: a file, a step (summary first: :func:`delete_step`), or a tree."""
    if r.file or layout.is_temp(r.path):
        storage.delete(r.path)
    elif r.step is not None and r.path == layout.join(experiment, layout.step_name(r.step)):
        delete_step(storage, r.path)
    else:
        storage.delete_prefix(r.path)


def lost_data_files(scans: Sequence[StepScan], keys: Iterable[str]) -> list[Removal]:
    """The data files in complete mini-batches that their records do not name (pure: no I/O).

    A writer writes its data file while its claim is being created; one that lost the claim
    to another writer removes its file, unless it was killed first. Once the record that
    stands is complete and names another file, nothing will ever name this one: removed at
    any age."""
    named: dict[str, tuple[str, int]] = {}
    for scan in scans:
        for p in scan.parts:
            if p.complete:
                named[layout.join(scan.path, p.run, str(p.index))] = (str(p.doc.get("data", "")), scan.step)
    out = []
    for key in keys:
        parent, _, name = key.rpartition("/")
        data = named.get(parent)
        if data is not None and name.endswith(packed.SUFFIX) and name != data[0]:
            out.append(Removal(key, "data file of a writer that lost its claim", data[1], file=True))
    return out


def _mtime_age(storage: Storage, key: str, now: float) -> float:
    """Seconds since a temp file was last written (local stores; elsewhere: treat as old)."""
    store = storage.store
    if isinstance(store, LocalStore):
        try:
            return now - os.stat(os.path.join(str(store.root), key)).st_mtime
        except FileNotFoundError:
            return 0.0
    return float("inf")


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None
