"""Writing one mini-batch of a step: take the step over, claim an index, store, mark complete.

The protocol (``docs/format.md`` has the long version):

1. Scan the step's metadata. A complete step (or a damaged one its summary says is
   complete) is refused (``StepCompleteError``) unless ``overwrite``: it then stays, and
   readers see it, until this run completes the step (step 6 removes it); a run overwriting
   a step it completed itself deletes it first. A step a newer run has recorded itself in
   is refused (``DisplacedWriterError``). A handle whose last write went to this step goes
   on from the scan that write left (:class:`StepMemo`), without a request.
2. Record this run in the step (``{step}/{run}/zarr.json``, created exclusively), then delete the
   leftovers of older runs that did not complete the step, logging what goes. The step's own
   group (``{step}/zarr.json``) is not written here: it is written once, with the summary,
   when the step completes (step 6).
3. Claim the lowest free index ``i < expected`` by creating ``{step}/{run}/{i}/zarr.json``
   exclusively with a writer token (read back: the token that stays wins). Where a create
   stands at once (an object store's conditional PUT), on a thread beside step 4: the claim's
   requests overlap the data's. The data file is the writer's own name, which no reader opens
   before a complete record names it; a writer that lost the index removes it and claims the
   next free index before writing again. On a directory (maybe a shared mount, where two
   creators can both read back their own record for a while) the claim comes first, so that
   the data's time lets the re-check of step 5 see the other one.
4. Write every array's metadata and chunks into the data file; the process's heartbeat thread
   refreshes the claim while that takes long (``heartbeats.py``).
5. Check the run still owns the step, then rewrite the mini-batch's ``zarr.json`` once with
   ``state: complete`` and the manifest (columns, chunk sizes, rows, bytes). This is the only
   completion marker: a writer killed before it leaves an incomplete mini-batch.
6. When indices ``0 .. expected-1`` are all complete, create ``{step}/{run}/complete``
   exclusively: of the writers that see the step complete at once, the one whose create
   stands is told ``step_complete=True``, and removes the older runs (the step it replaced).
   Each writes the step's group with its summary attribute meanwhile (a cache for fast
   status; its content is the same whichever writer writes it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from zarr_skip._deprecation import warn_renamed
from zarr_skip.errors import ConfigError, DisplacedWriterError, StepCompleteError, StorageError, ZarrSkipError
from zarr_skip.format import block_tables, chunks, layout, records
from zarr_skip.format.describe import describe_array
from zarr_skip.format.specs import ColumnSpec, EncodedBatch, Narrowed, StoredArray, check_same_schema
from zarr_skip.format.state import HOST, PartRecord, RunRecord, completed, latest
from zarr_skip.store import _localfs, packed
from zarr_skip.store.catalog import (
    StepScan,
    children,
    delete_step,
    group_doc,
    own_parts,
    run_record,
    scan_step,
)
from zarr_skip.store.chunkjobs import ChunkJobs, Job
from zarr_skip.store.heartbeats import Heartbeat
from zarr_skip.store.packed import Member
from zarr_skip.store.storage import Storage, parse_json

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunContext:
    """Who writes: the run (shared by every writer of one training run) and this writer."""

    run: str
    started: float
    writer: str


@dataclass(frozen=True, slots=True)
class MinibatchInfo:
    """What :meth:`Cache.write` stored: one mini-batch of a step.

    Attributes
    ----------
    step, index : the step and the mini-batch's index in it.
    run : the run that wrote it.
    rows : its rows.
    nbytes_stored : its stored (compressed) bytes.
    nbytes : its logical (decoded) bytes, as numpy's and zarr's ``nbytes``.
    step_complete : whether this write completed the step.
    path : the mini-batch's group below the cache root.
    """

    step: int
    index: int
    run: str
    rows: int
    nbytes_stored: int
    nbytes: int
    step_complete: bool
    path: str

    @property
    def raw_nbytes(self) -> int:
        """Deprecated: :attr:`nbytes` (the logical size)."""
        warn_renamed("MinibatchInfo.raw_nbytes", "MinibatchInfo.nbytes (the logical size)")
        return self.nbytes


#: the old name of :class:`MinibatchInfo` (``zarr_skip.PartInfo`` warns)
PartInfo = MinibatchInfo


class StepMemo:
    """What a cache handle knows of the step it wrote last: the step's scan as its last
    successful write left it (this run's records, and the mini-batch it stored).

    The next write of the same handle to the same step (same ``expected``, no ``overwrite``)
    goes on from it instead of scanning or listing the step again: a step of ``n`` mini-batches
    written by one handle is scanned once, not ``n`` times (three rounds of requests each, on a
    shared file system or an object store). What the scan would have found since is found
    anyway: another writer's claim by the exclusive create of the next index, a newer run (or
    this run's record removed) by the owner check before the completion record
    (:func:`_check_owner`), which then removes what the write stored. A write that fails, and
    the handle's :meth:`Cache.delete <zarr_skip.Cache.delete>`, forget it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[str, int, int] | None = None
        self._scan: StepScan | None = None

    def take(self, key: tuple[str, int, int]) -> StepScan | None:
        """The scan left for ``key`` (experiment, step, expected), if any; forgotten either way."""
        with self._lock:
            scan = self._scan if self._key == key else None
            self._key = self._scan = None
        return scan

    def forget(self) -> None:
        with self._lock:
            self._key = self._scan = None

    def keep(self, key: tuple[str, int, int], scan: StepScan) -> None:
        with self._lock:
            self._key, self._scan = key, scan


def write_part(
    storage: Storage,
    experiment: str,
    step: int,
    batch: EncodedBatch,
    *,
    ctx: RunContext,
    expected: int,
    overwrite: bool,
    compression: chunks.Compression,
    lease: float,
    jobs: ChunkJobs,
    token: str | None = None,
    memo: StepMemo | None = None,
) -> MinibatchInfo:
    """Store one mini-batch of ``step`` (see the module docstring for the protocol); its
    chunks come from ``jobs`` (the caller cancels what is left of them).

    ``token``: recorded in the claim (and so in the complete record); a complete mini-batch of
    this run with the same token is returned instead of storing the batch again (a retry of a
    write whose outcome was lost: :func:`written_with`).

    ``memo``: the handle's :class:`StepMemo`, which this write goes on from and leaves the step in.
    """
    if isinstance(expected, bool) or not isinstance(expected, int) or not 1 <= expected <= records.MAX_EXPECTED:
        raise ConfigError(f"expected: must be an int in 1 .. {records.MAX_EXPECTED}, got {expected!r}")
    step_path = layout.join(experiment, layout.step_name(step))
    key = (experiment, step, expected)
    kept = None if memo is None or overwrite else _continued(storage, step_path, ctx, memo.take(key), token)
    scan = kept or _take_over(storage, experiment, step, step_path, ctx, expected, overwrite, token)
    if isinstance(scan, MinibatchInfo):
        return scan
    _check_schema(scan, ctx, batch, step)
    place = records.Place(experiment, step)
    run_path = layout.join(step_path, ctx.run)
    # indices with unreadable records are left to the exclusive create to decide
    taken = {p.index for p in scan.parts if p.run == ctx.run}
    interval = max(lease / 4, 0.05)
    # the first try's claim goes beside the data file where a create stands at once; on a file
    # system (a shared mount, maybe) the data's time is part of the claim's settling, as before
    speculate = storage.creates_stand_at_once
    while True:
        if speculate:
            speculate = False
            index = _first_free(storage, place, run_path, taken, expected)
            _make_dir(storage, step_path, ctx, layout.join(run_path, str(index)))
            claiming = _localfs.beside(_claim, storage, place, run_path, index, ctx, expected, token, interval)
        else:  # claim first, then write (each index lost costs only its claim)
            index, claiming = _claim_next(storage, place, run_path, taken, ctx, expected, token, interval)
        taken.add(index)
        done = _attempt(storage, place, run_path, index, batch, claiming, ctx, compression, jobs)
        if done is not None:
            break
    part_path = layout.join(run_path, str(index))
    nbytes, raw = done["nbytes"], done["raw_nbytes"]
    logger.debug("stored step %d, mini-batch %d (%d rows, %d bytes) at %s", step, index, batch.rows, nbytes, part_path)
    known = {p.index: p for p in scan.parts if p.run == ctx.run and p.complete}
    known[index] = PartRecord.from_json(done)
    complete = _maybe_complete(storage, experiment, step, step_path, ctx, expected, known)
    if memo is not None and not complete:
        scan.parts = [p for p in scan.parts if p.run == ctx.run and p.index != index] + [known[index]]
        memo.keep(key, scan)
    return MinibatchInfo(step, index, ctx.run, batch.rows, nbytes, raw, complete, part_path)


def _completed(
    claim: dict[str, Any],
    batch: EncodedBatch,
    compression: chunks.Compression,
    manifest: dict[str, Any],
    sizes: tuple[int, int, int],
) -> dict[str, Any]:
    """The completion record of ``claim``: the mini-batch's manifest, its stored, logical and
    data-file ``sizes``, and the record's checksum."""
    nbytes, raw, size = sizes
    now = time.time()
    done = dict(
        claim,
        state="complete",
        heartbeat=now,
        completed=now,
        rows=batch.rows,
        nbytes=nbytes,
        raw_nbytes=raw,
        batch_type=batch.batch_type,
        meta_info=batch.meta_info,
        compression=compression.to_json(),
        columns=manifest,
        container=layout.CONTAINER,
        data_nbytes=size,
    )
    done["checksum"] = layout.doc_checksum(done)
    return done


def _continued(
    storage: Storage, step_path: str, ctx: RunContext, scan: StepScan | None, token: str | None
) -> StepScan | None:
    """``scan``, the step as this handle's last write left it (:class:`StepMemo`), unless this
    write must scan the step: a token this handle has already stored. A newer run, or this
    run's record gone, is found by the owner check before the completion record."""
    if scan is None or (token is not None and any(p.doc.get("token") == token for p in scan.parts)):
        return None
    return scan


def _check_schema(scan: StepScan, ctx: RunContext, batch: EncodedBatch, step: int) -> None:
    """SchemaMismatchError unless ``batch`` has the columns of this run's first stored mini-batch."""
    own = [p for p in scan.parts if p.run == ctx.run and p.complete]
    if own:
        first = min(own, key=lambda p: p.index)
        theirs = [ColumnSpec.from_json(n, d) for n, d in first.doc["columns"].items()]
        check_same_schema(
            [c.spec for c in batch.columns], theirs, f"step {step}, new mini-batch vs mini-batch {first.index}"
        )


def written_with(
    storage: Storage, experiment: str, step: int, ctx: RunContext, token: str, expected: int
) -> tuple[MinibatchInfo | None, StepScan | None]:
    """The complete mini-batch of ``step`` this run stored with ``token``, if there is one (the
    step's completion is finished on the way, as the lost write would have), and the step's
    scan for the write to go on from (None when this deleted something). An unfinished
    mini-batch this writer left with the token (an earlier attempt that failed before
    completing, and could not clean up) is deleted, so that the retry may take its index."""
    scan = scan_step(storage, experiment, step)
    step_path = layout.join(experiment, layout.step_name(step))
    deleted = False
    for p in scan.parts:
        if p.run != ctx.run or p.doc.get("token") != token:
            continue
        path = layout.join(step_path, ctx.run, str(p.index))
        if p.complete:
            logger.info("step %d: mini-batch %d was stored with this write's token; not stored again", step, p.index)
            complete = _maybe_complete(storage, experiment, step, step_path, ctx, expected)
            return MinibatchInfo(step, p.index, p.run, p.rows, p.nbytes, p.raw_nbytes, complete, path), scan
        if p.doc.get("writer") == ctx.writer:
            logger.info("step %d: deleting mini-batch %d, left unfinished by an earlier attempt", step, p.index)
            storage.delete_prefix(path)
            deleted = True
    return None, None if deleted else scan


def _holds(storage: Storage, key: str, claim: dict[str, Any]) -> bool:
    """Whether the record at ``key`` is still this writer's claim."""
    try:
        blob = storage.get(key)
    except (OSError, ZarrSkipError):
        return False
    return _is_claim(blob, key, claim)


def _is_claim(blob: bytes | None, key: str, claim: dict[str, Any]) -> bool:
    """Whether ``blob``, the record read at ``key``, is this writer's claim."""
    try:
        doc = parse_json(blob, key)
    except ZarrSkipError:
        return False
    rec = (doc or {}).get("attributes", {}).get(layout.PART_ATTR) or {}
    return bool(rec.get("writer") == claim["writer"] and rec.get("data") == claim["data"])


def _take_over(
    storage: Storage,
    experiment: str,
    step: int,
    step_path: str,
    ctx: RunContext,
    expected: int,
    overwrite: bool,
    token: str | None,
) -> StepScan | MinibatchInfo:
    """The step scanned and taken over by this run (see the module docstring, steps 1 and 2),
    or the mini-batch this run already stored with ``token`` (:func:`written_with`)."""
    scan = None
    if token is not None:
        earlier, scan = written_with(storage, experiment, step, ctx, token, expected)
        if earlier is not None:
            return earlier
    scan = scan_step(storage, experiment, step) if scan is None else scan
    newest = latest(scan.runs)
    if newest is not None and newest.run != ctx.run and (newest.started, newest.run) > (ctx.started, ctx.run):
        raise DisplacedWriterError(
            f"step {step}: run {newest.run} started after this run ({ctx.run}) and owns the step "
            f"at {storage.key_path(step_path)}; this run's mini-batches would not count"
        )
    scan = _replacing(storage, experiment, step, step_path, ctx, overwrite, scan)
    mine = next((r for r in scan.runs if r.run == ctx.run), None)
    if mine is None:
        scan = _record_run(storage, experiment, step, step_path, ctx, expected, scan)
        mine = next((r for r in scan.runs if r.run == ctx.run), None)
    if mine is not None and mine.expected != expected:
        raise ConfigError(
            f"expected: step {step} was started by this run with expected={mine.expected}, "
            f"this write says expected={expected}"
        )
    # only recorded, older runs are removed: a directory without a readable record may be a
    # run being created right now, or a stale view through a shared mount (gc handles debris);
    # a complete run stays until this run completes the step (it replaces it then), and so
    # does the run the summary names, which completed it once (damaged: see _complete_by_summary)
    stale_runs = [r for r in scan.runs if r.run not in (ctx.run, scan.summary_run) and not completed(r, scan.parts)]
    for stale in stale_runs:
        n_parts = sum(1 for p in scan.parts if p.run == stale.run)
        logger.warning(
            "step %d: discarding %d mini-batch(es) left by run %s at %s",
            step,
            n_parts,
            stale.run,
            storage.key_path(layout.join(step_path, stale.run)),
        )
        storage.delete_prefix(layout.join(step_path, stale.run))
    # what is left of the step for this write: this run's records
    scan.runs = [r for r in scan.runs if r.run == ctx.run]
    scan.parts = [p for p in scan.parts if p.run == ctx.run]
    return scan


def _replacing(
    storage: Storage, experiment: str, step: int, step_path: str, ctx: RunContext, overwrite: bool, scan: StepScan
) -> StepScan:
    """``scan``, once a complete step is cleared for this run to write: refused without
    ``overwrite``; kept while a new run replaces it (readers see it until this run completes
    the step, which then removes it: :func:`_maybe_complete`); deleted first when this run
    completed it itself (a run cannot hold two versions of a step). A step this run is
    already replacing goes on."""
    info = scan.info(time.time(), 0.0)
    mine = any(r.run == ctx.run for r in scan.runs)
    done_by, how = (
        (info.run, f"{info.done} mini-batches of run {info.run}") if info.complete else _complete_by_summary(scan)
    )
    if done_by is None or (mine and done_by != ctx.run):
        return scan
    if not overwrite:
        raise StepCompleteError(
            f"step {step} is complete ({how}) at {storage.key_path(step_path)}; pass overwrite=True to replace it"
        )
    if done_by != ctx.run:
        logger.warning(
            "overwrite: step %d (run %s) at %s is replaced once this run (%s) completes it",
            step,
            done_by,
            storage.key_path(step_path),
            ctx.run,
        )
        return scan
    logger.warning("overwrite: deleting step %d, completed by this run, at %s", step, storage.key_path(step_path))
    delete_step(storage, step_path)
    return scan_step(storage, experiment, step)


def _complete_by_summary(scan: StepScan) -> tuple[str | None, str]:
    """The run the summary of a damaged step names, and what it says: such a step reads (the
    summary names its mini-batches), though its records no longer show it complete (a lost or
    edited run record, an unreadable record), so a write takes it for complete, not for an
    empty step to fill; (None, "") for any other step."""
    if scan.summary is None or not scan.damaged:
        return None, ""
    run, expected = scan.summary_run, scan.summary["expected"]
    return run, f"its summary: {expected} mini-batches of run {run}; damaged, see `zarr-skip verify`"


def _record_run(
    storage: Storage,
    experiment: str,
    step: int,
    step_path: str,
    ctx: RunContext,
    expected: int,
    scan: StepScan,
) -> StepScan:
    """Create this run's record in the step (exclusively); the step scanned again if another
    writer of the run created it first."""
    record = {
        **records.Place(experiment, step).to_json(),
        "run": ctx.run,
        "started": ctx.started,
        "created": time.time(),
        "expected": expected,
        "host": HOST,
        "pid": os.getpid(),
        "writer": ctx.writer,
    }
    record["checksum"] = layout.doc_checksum(record)
    run_key = layout.meta_key(layout.join(step_path, ctx.run))
    if storage.create_if_absent(run_key, group_doc({layout.RUN_ATTR: record})):
        scan.runs.append(RunRecord.from_json(record))
        return scan
    return scan_step(storage, experiment, step)


#: a claim that stands: its record and the heartbeat refreshing it (entered)
Held = tuple[dict[str, Any], Heartbeat]


def _first_free(storage: Storage, place: records.Place, run_path: str, taken: set[int], expected: int) -> int:
    """The lowest index below ``expected`` not in ``taken``; StepCompleteError when none is left."""
    index = next((i for i in range(expected) if i not in taken), None)
    if index is None:
        raise StepCompleteError(
            f"step {place.step}: all {expected} mini-batches of run {run_path.rpartition('/')[2]} are written or "
            f"claimed at {storage.key_path(run_path)}: other writers of the run are writing them, or a write of "
            "the run was killed and its claim holds the index (delete the step, or let gc remove it once no "
            "writer of the run lives)"
        )
    return index


def _claim(
    storage: Storage,
    place: records.Place,
    run_path: str,
    index: int,
    ctx: RunContext,
    expected: int,
    token: str | None,
    interval: float,
) -> Held | None:
    """Claim mini-batch ``index`` (its directory made) by the exclusive create of its record,
    and start refreshing it every ``interval`` seconds; None when another writer holds it."""
    now = time.time()
    claim = {
        **place.to_json(),  # the record names its place: moved elsewhere, it is refused
        "expected": expected,
        "run": ctx.run,
        "index": index,
        "writer": ctx.writer,
        "data": data_name(ctx),
        "host": HOST,
        "pid": os.getpid(),
        "started": now,
        "heartbeat": now,
        "state": "writing",
        **({} if token is None else {"token": token}),
    }
    key = layout.meta_key(layout.join(run_path, str(index)))
    if not storage.create_if_absent(key, group_doc({layout.PART_ATTR: claim}), dir_made=True):
        return None
    return claim, Heartbeat(storage, key, claim, interval, _holds).__enter__()


def _claim_next(
    storage: Storage,
    place: records.Place,
    run_path: str,
    taken: set[int],
    ctx: RunContext,
    expected: int,
    token: str | None,
    interval: float,
) -> tuple[int, Future[Held | None]]:
    """Claim the lowest free index, trying each in turn (``taken`` grows with those held by
    others); the index and its claim (a finished future). StepCompleteError when none is left;
    a claim the store refused removes this run's record if nothing else of it is there."""
    step_path = run_path.rpartition("/")[0]
    while True:
        index = _first_free(storage, place, run_path, taken, expected)
        claimed: Future[Held | None] = Future()
        _make_dir(storage, step_path, ctx, layout.join(run_path, str(index)))
        try:
            held = _claim(storage, place, run_path, index, ctx, expected, token, interval)
        except BaseException:  # disk full: no 'writing' run left behind
            _forget_run_if_empty(storage, step_path, ctx.run)
            raise
        if held is not None:
            claimed.set_result(held)
            return index, claimed
        taken.add(index)


def _make_dir(storage: Storage, step_path: str, ctx: RunContext, part_path: str) -> None:
    """Make a mini-batch's directory, before its claim and its data file are created in it
    (a refused one, disk full, leaves no 'writing' run behind)."""
    try:
        storage.make_dir(part_path)
    except BaseException:
        _forget_run_if_empty(storage, step_path, ctx.run)
        raise


def data_name(ctx: RunContext) -> str:
    """The name of ``ctx``'s data file in a mini-batch it writes: the writer's own."""
    return f"w-{ctx.writer}{packed.SUFFIX}"


def _attempt(
    storage: Storage,
    place: records.Place,
    run_path: str,
    index: int,
    batch: EncodedBatch,
    claiming: Future[Held | None],
    ctx: RunContext,
    compression: chunks.Compression,
    jobs: ChunkJobs,
) -> dict[str, Any] | None:
    """Store ``batch`` as mini-batch ``index`` of the run (steps 3 to 5 of the protocol) and
    return its completion record; None when another writer holds the index (this data file
    discarded). The data file is written while ``claiming`` runs: on a shared file system or
    an object store the claim's round trips go beside the data's, not before them. The data
    file is this writer's own name, which no record names before this writer's completion
    record: until then no reader opens it, whatever the claim's outcome. A failure leaves
    nothing of the attempt behind (and this run's record only if something else of it is)."""
    step_path = run_path.rpartition("/")[0]
    part_path = layout.join(run_path, str(index))
    record_key, data_path = layout.meta_key(part_path), layout.join(part_path, data_name(ctx))
    where = f"step {place.step}, mini-batch {index}"
    held: Held | None = None
    try:
        try:
            here = dict(place.to_json(), run=ctx.run, index=index, writer=ctx.writer)
            manifest, nbytes, raw, size = _write_arrays(storage, data_path, batch, jobs, here)
        finally:
            held = _decided(claiming)  # the claim's own failure (disk full) goes up from here
        if held is None:  # another writer of the run holds the index (this one's scan is older)
            logger.info("%s: claimed by another writer of the run; trying the next index", where)
            _discard(storage, data_path)
            return None
        if not _check_owner(storage, step_path, ctx, where, record_key, held[0]):
            # both "won" the exclusive create (seen on shared FUSE mounts) and the record
            # names the other one: give the index up, our data is our own
            logger.warning("%s: claimed by another writer at the same time; retrying", where)
            _discard(storage, data_path)
            return None
        done = _completed(held[0], batch, compression, manifest, (nbytes, raw, size))
        storage.set(record_key, layout.seal(group_doc({layout.PART_ATTR: done})))
    except BaseException:
        held = held or _settled(claiming)  # interrupted while waiting: the claim may still stand
        _discard(storage, part_path if held is not None and _holds(storage, record_key, held[0]) else data_path)
        _forget_run_if_empty(storage, step_path, ctx.run)
        raise
    return done


def _decided(claiming: Future[Held | None]) -> Held | None:
    """The claim once it is decided, its heartbeat stopped (None: lost; its failure raised)."""
    held = claiming.result()
    if held is not None:
        held[1].__exit__()
    return held


def _settled(claiming: Future[Held | None]) -> Held | None:
    """:func:`_decided`, None when the claim failed (the write's own failure is what goes up)."""
    try:
        return _decided(claiming)
    except BaseException:  # noqa: BLE001
        return None


def _write_arrays(
    storage: Storage,
    data_key: str,
    batch: EncodedBatch,
    jobs: ChunkJobs,
    place: dict[str, Any],
) -> tuple[dict[str, Any], int, int, int]:
    """Write every array's metadata and chunks into the mini-batch's one data file (a ZIP of
    stored members, :mod:`zarr_skip.store.packed`); return the manifest, the stored and raw
    bytes of the chunks, and the data file's size.

    The chunks come from ``jobs`` (encoded in the pool since the batch was encoded) and are
    written as they come; an array of several chunks is one member, a shard. The manifest
    says where each array's chunk 0 lies in the file (``offset``): its chunks follow back to
    back (``sizes``).
    """
    manifest: dict[str, Any] = {}
    members = [Member(layout.METADATA, partial(group_doc, {layout.DATA_ATTR: place}))]
    chunk_members: list[tuple[str, dict[str, Any]]] = []  # (member, its manifest entry)
    sep = layout.CHUNK_SEPARATOR
    for col in batch.columns:
        entry = dict(col.spec.to_json(), nbytes=col.nbytes, arrays={})  # its logical size
        multi = len(col.arrays) > 1
        if multi:
            members.append(Member(layout.meta_key(col.spec.name), group_doc))
        for aname, arr in col.arrays.items():
            apath = layout.join(col.spec.name, aname) if multi else col.spec.name
            taken = jobs.take(col.spec.name, aname, arr)
            per, codec, count = taken.per, taken.codec, len(taken.jobs)
            shape_chunks = (per, *(max(1, d) for d in arr.shape[1:]))
            about = describe_array(
                col.spec, aname, arr.ndim, chunks.dtype_name(arr.dtype), dictionary="codes" in col.arrays
            )
            meta = chunks.array_metadata(
                arr.shape,
                shape_chunks,
                arr.dtype,
                codec,
                sep,
                shard=count,
                dimension_names=about.dimension_names,
                attributes=about.attributes,
            )
            doc = json.dumps(meta, separators=(",", ":")).encode()
            members.append(Member(layout.meta_key(apath), partial(bytes, doc)))
            array: dict[str, Any] = {
                "dtype": arr.dtype.str,
                "shape": list(arr.shape),
                "chunk": per,
                "raw": int(arr.nbytes),
                "codec": codec.to_json(),
                "separator": sep,
                **({"shard": True} if count > 1 else {}),
                "sizes": [],  # filled as the chunks are written
                "crc32c": [],  # their crc32c: a reader trusts a chunk only if it is this one
                **({"blocks": [], "block_crc32c": []} if _blocky(codec, per, arr) else {}),
            }
            if count:
                key = layout.chunk_key(apath, 0, arr.ndim, sep)  # the only chunk, or the shard
                members.append(Member(key, partial(_take, taken.jobs, array, count > 1), int(arr.nbytes)))
                chunk_members.append((key, array))
            entry["arrays"][aname] = array
        if "values" in col.arrays and "lengths" in col.arrays:
            _index_rows(entry["arrays"], col.arrays)
        manifest[col.spec.name] = entry
    # fresh: the file's name is this writer's, in the index it claimed, and no reader opens it
    # before the completion record names its size and every chunk's checksum (a torn file of a
    # killed writer is never trusted): written in place, without temp file and rename
    spans, size = storage.publish_zip(data_key, members, fresh=True)
    for key, array in chunk_members:
        array["offset"] = spans[key][0]
        if "blocks" in array:
            array["block_table"] = block_tables.to_json(array.pop("blocks"), array.pop("block_crc32c"))
    nbytes = sum(sum(arr["sizes"]) for entry in manifest.values() for arr in entry["arrays"].values())
    raw = sum(col.nbytes for col in batch.columns)  # the logical size, as numpy's nbytes
    return manifest, nbytes, raw, size


def _index_rows(entries: dict[str, Any], arrays: Mapping[str, StoredArray]) -> None:
    """Where a jagged column's rows lie in its values, kept in its record (``entries``: the
    record entries of its arrays): each values chunk's first row (of values in several
    chunks), and each row's end (``value_ends``, of a plain column whose values a read can
    take in part: several chunks, or blocks), so that a read of a few rows goes to their
    values without reading their lengths first."""
    lengths, values = arrays["lengths"], entries["values"]
    plain = lengths.source if isinstance(lengths, Narrowed) else lengths
    several = values.get("shard") is True  # a shard of its chunks: more than one
    if several:
        values["first_rows"] = chunks.first_rows(plain, values["chunk"])
    fits = arrays["values"].shape[0] < records.MAX_VALUE_ENDS
    if (several or "blocks" in values) and "codes" not in arrays and fits:
        entries["lengths"]["value_ends"] = records.ends_of(plain)


def _take(jobs: list[Job], array: dict[str, Any], shard: bool) -> bytes | Iterator[bytes]:
    """The encoded chunk to write, or a shard's pieces as they are encoded: its chunks in
    order, then its index (each chunk noted in ``array``, its record entry)."""
    if not shard:
        blob = jobs.pop().result()
        _note(array, blob)
        return blob
    queue = deque(jobs)
    jobs.clear()
    return _shard_pieces(queue, array)


def _shard_pieces(jobs: deque[Job], array: dict[str, Any]) -> Iterator[bytes]:
    while jobs:
        blob = jobs.popleft().result()  # let go of each chunk once written
        _note(array, blob)
        yield blob
    yield chunks.shard_index(array["sizes"])


def _blocky(codec: chunks.Compression, per: int, arr: StoredArray) -> bool:
    """Whether the chunks of ``arr`` may be blosc frames of several blocks (whose places and
    checksums the record then keeps, see :func:`chunks.block_index`)."""
    chunk_bytes = per * arr.dtype.itemsize * math.prod(arr.shape[1:])
    return codec.is_blosc and 0 < codec.blocksize < chunk_bytes


def _note(array: dict[str, Any], blob: bytes) -> None:
    """Record the next chunk of an array: its size, its crc32c, and (when the record keeps
    them) where its blocks begin and their checksums."""
    array["sizes"].append(len(blob))
    array["crc32c"].append(chunks.trailer(blob))
    if "blocks" in array:
        starts, crcs = chunks.block_index(blob, array["codec"].get("blocksize", 0))
        array["blocks"].append(starts)
        array["block_crc32c"].append(crcs)


def _check_owner(
    storage: Storage, step_path: str, ctx: RunContext, where: str, record_key: str, claim: dict[str, Any]
) -> bool:
    """Raise DisplacedWriterError if this run's record is gone or a newer run recorded itself;
    return whether the record at ``record_key`` is still this writer's claim. The step's
    listing and the record are read in one round of requests (on an object store, one round
    trip where two followed each other)."""
    try:
        (names,), (blob,) = storage.list_and_get([step_path], [record_key])
    except (OSError, ZarrSkipError):  # the record unreadable: not held (a listing error recurs below)
        names, blob = storage.list_dir(step_path), None
    newer, _ = _other_runs(storage, step_path, ctx, names)
    if newer == "":
        raise DisplacedWriterError(
            f"{where}: this run's record was removed from the step while this run was writing "
            f"(by a newer run, or the step deleted) at {storage.key_path(step_path)}"
        )
    if newer is not None:
        raise DisplacedWriterError(f"{where}: run {newer} took the step over while this run ({ctx.run}) was writing")
    return _is_claim(blob, record_key, claim)


def _other_runs(
    storage: Storage, step_path: str, ctx: RunContext, listing: list[str] | None = None
) -> tuple[str | None, list[str]]:
    """A run recorded in the step that started after this one (``""`` when this run's own
    record is gone) or None, and (when there is none) the runs recorded that started before
    it; their records are read only when the step holds other names than this run's.
    ``listing``: the step's names, when just listed."""
    listed = storage.list_dir(step_path) if listing is None else listing
    names = children(listed)
    if ctx.run not in names:
        return "", []
    others = [n for n in names if n != ctx.run]
    blobs = storage.get_many([layout.meta_key(layout.join(step_path, n)) for n in others])
    older = []
    for name, blob in zip(others, blobs, strict=True):
        rec = run_record(blob, storage.key_path(layout.meta_key(layout.join(step_path, name))))
        if rec is not None and (rec.started, rec.run) > (ctx.started, ctx.run):
            return rec.run, []
        if rec is not None:
            older.append(rec.run)
    return None, older


def _maybe_complete(
    storage: Storage,
    experiment: str,
    step: int,
    step_path: str,
    ctx: RunContext,
    expected: int,
    known: Mapping[int, PartRecord] | None = None,
) -> bool:
    """Whether this write completed the step (and this writer is the one to say so).

    The run's mini-batch records are read by their keys, without listing the step (but for
    those in ``known``: complete records this write has read or written, which stay so); only
    when all are complete is the step listed for a newer run (which would own it instead, or
    has removed this run's records). The writer told so removes the older runs' records: the
    complete step this run replaced (``overwrite``), which readers saw until now."""
    parts = own_parts(storage, experiment, step, ctx.run, expected, known)
    if parts is None:
        return False
    newer, older = _other_runs(storage, step_path, ctx)
    if newer is not None:  # or this run's record gone
        return False
    # every writer that sees the step complete gets here; the one whose exclusive create of
    # the completion group stands is told so, the others are not. The summary is the same
    # whoever writes it: written while the completion group is created, not after it
    mark = {"writer": ctx.writer, "token": secrets.token_hex(8), "completed": time.time()}
    token_key = layout.meta_key(layout.join(step_path, ctx.run, layout.COMPLETION))
    marking = _localfs.beside(storage.create_if_absent, token_key, group_doc({layout.COMPLETION_ATTR: mark}))
    try:
        rows = _write_summary(storage, records.Place(experiment, step), step_path, ctx.run, expected, parts)
    finally:
        told = marking.result()
    if told:
        logger.info("step %d complete: %d mini-batches, %d rows (run %s)", step, expected, rows, ctx.run)
        _remove_replaced(storage, step, step_path, ctx.run, older)
    return told


def _remove_replaced(storage: Storage, step: int, step_path: str, run: str, older: list[str]) -> None:
    """Remove the runs ``older`` than ``run``, which has completed the step: the step it
    replaced (``overwrite``), or leftovers of displaced runs. A failure is logged, not raised:
    the step is stored, and ``gc`` removes what is left."""
    for old in older:
        logger.info("step %d: removing run %s, replaced by this run (%s)", step, old, run)
        try:
            storage.delete_prefix(layout.join(step_path, old))
        except (OSError, ZarrSkipError) as exc:
            logger.warning("step %d: run %s, replaced, is left for gc: %s", step, old, exc)


def _write_summary(
    storage: Storage, place: records.Place, step_path: str, run: str, expected: int, parts: list[PartRecord]
) -> int:
    """Store the complete step's summary (a cache: status reads the records without it, so a
    failure is logged, not raised); return its rows."""
    summary = {
        **place.to_json(),
        "run": run,
        "expected": expected,
        "rows": sum(p.rows for p in parts),
        "nbytes": sum(p.nbytes for p in parts),
        "raw_nbytes": sum(p.raw_nbytes for p in parts),
        "completed": max(p.doc.get("completed", 0.0) for p in parts),
    }
    summary["checksum"] = layout.doc_checksum(summary)
    try:
        storage.set(layout.meta_key(step_path), group_doc({layout.STEP_ATTR: summary}))
    except StorageError as exc:
        logger.warning(
            "step %d is complete, but its summary could not be stored (status reads its records): %s", place.step, exc
        )
    return int(summary["rows"])


def _discard(storage: Storage, part_path: str) -> None:
    """Remove a mini-batch directory (what of it is there), or a data file and its directory
    if nothing else is there (no other writer's claim)."""
    try:
        if part_path.endswith(packed.SUFFIX):
            storage.delete(part_path)
            storage.remove_empty_dir(part_path.rpartition("/")[0])
        else:
            storage.delete_prefix(part_path)
    except Exception as exc:  # noqa: BLE001 - best effort; gc removes what stays behind
        logger.warning("could not remove the unfinished mini-batch %s: %s", part_path, exc)


def _forget_run_if_empty(storage: Storage, step_path: str, run: str) -> None:
    """After a failed write, remove this run's record from the step if nothing else of the
    run is there (no mini-batch, complete or claimed), and the step if it is then empty: a
    refused first write must not leave a step that reads as ``writing``."""
    run_path = layout.join(step_path, run)
    try:
        if any(n != layout.METADATA and not layout.is_temp(n) for n in storage.list_dir(run_path)):
            return
        storage.delete_prefix(run_path)
        if not any(n != layout.METADATA and not layout.is_temp(n) for n in storage.list_dir(step_path)):
            storage.delete_prefix(step_path)
    except Exception as exc:  # noqa: BLE001 - best effort, like _discard; gc removes what stays
        logger.warning("could not remove the record of run %s at %s: %s", run, step_path, exc)
