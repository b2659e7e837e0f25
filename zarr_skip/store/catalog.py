"""Reading the metadata of steps, runs and mini-batches (attribute documents only, no chunks)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zarr_skip.errors import MetadataError
from zarr_skip.format import layout, records
from zarr_skip.format.records import Place
from zarr_skip.format.state import PartRecord, RunRecord, StepInfo, completed, step_info, summary_info
from zarr_skip.store.storage import Storage, parse_json

logger = logging.getLogger(__name__)


def group_doc(attributes: Mapping[str, Any] | None = None) -> bytes:
    """The ``zarr.json`` bytes of a zarr v3 group with ``attributes``."""
    return json.dumps(
        {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes or {})},
        separators=(",", ":"),
    ).encode()


def attribute(doc: Mapping[str, Any] | None, name: str, where: str) -> dict[str, Any] | None:
    """The attribute ``name`` of a parsed ``zarr.json`` (None when the node has none)."""
    if doc is None:
        return None
    attrs = doc.get("attributes", {})
    value = attrs.get(name) if isinstance(attrs, dict) else None
    if value is not None and not isinstance(value, dict):
        raise MetadataError(f"{where}: attribute {name!r} is not an object")
    return value


@dataclass(slots=True)
class StepScan:
    """Everything the metadata says about one step."""

    step: int
    path: str
    summary: dict[str, Any] | None = None
    runs: list[RunRecord] = field(default_factory=list)
    parts: list[PartRecord] = field(default_factory=list)
    #: names below the step without a run record (crashed creations, debris, object-store ghosts)
    strays: list[str] = field(default_factory=list)
    #: names below the step whose run record exists but cannot be read (damage, or a stale
    #: view through a shared-filesystem mount): never deleted on that evidence
    unreadable: list[str] = field(default_factory=list)
    #: the run the step's summary names, when its directory holds no run record: the record was
    #: lost (deleted, or left out of a copy), for the run wrote it before anything else, and
    #: steps are deleted summary first (:func:`delete_step`): never deleted on that evidence
    unrecorded: list[str] = field(default_factory=list)
    #: (run, name) of mini-batch directories whose record exists but cannot be read
    broken: list[tuple[str, str]] = field(default_factory=list)
    #: (run, name) of mini-batch directories without a record (a crash before the claim landed)
    missing: list[tuple[str, str]] = field(default_factory=list)
    #: records that belong elsewhere (moved or swapped) or contradict their run: (path, why)
    misplaced: list[tuple[str, str]] = field(default_factory=list)
    #: why the summary was ignored (damaged, moved, or not what the records say), if it was
    summary_problem: str | None = None

    @property
    def damaged(self) -> bool:
        """Whether some record of this step cannot be read, or the run record its summary
        names is gone (so nothing here may be deleted)."""
        return bool(self.unreadable or self.unrecorded or self.broken or self.misplaced)

    @property
    def summary_run(self) -> str | None:
        """The run the step's summary names (None: no summary, or one ignored as damaged)."""
        return None if self.summary is None else str(self.summary["run"])

    @property
    def exists(self) -> bool:
        """Whether a run ever recorded itself here (object stores list deleted 'directories')."""
        return bool(self.runs) or self.summary is not None

    def info(self, now: float, lease: float) -> StepInfo:
        return step_info(self.step, self.runs, self.parts, now=now, lease=lease)


def list_steps(storage: Storage, experiment: str) -> list[int]:
    """Step numbers that have a group below the experiment (any state), ascending."""
    return sorted(int(n) for n in storage.list_dir(experiment) if layout.is_step_name(n))


def children(names: Sequence[str]) -> list[str]:
    """The names of a listing that may be records' groups: not the group's own document, not
    a temp file, and not a name no key can hold (a foreign file with a backslash, say: never
    written here, and no key to it is taken, so it blocks nothing)."""
    return [n for n in names if n != layout.METADATA and not layout.is_temp(n) and layout.name_problem(n) is None]


def scan_steps(storage: Storage, experiment: str, steps: Sequence[int]) -> list[StepScan]:
    """Scan the metadata of several steps, with concurrent requests at each level."""
    scans = [StepScan(s, layout.join(experiment, str(s))) for s in steps]
    listings, step_docs = storage.list_and_get([s.path for s in scans], [layout.meta_key(s.path) for s in scans])
    run_paths: list[tuple[StepScan, str, str]] = []
    for scan, names, blob in zip(scans, listings, step_docs, strict=True):
        try:
            scan.summary = _summary(blob, storage.key_path(layout.meta_key(scan.path)), Place(experiment, scan.step))
        except MetadataError as exc:  # only a cache for fast status: the parts decide
            logger.warning("ignoring a damaged step summary: %s", exc)
            scan.summary_problem = str(exc)
        run_paths += [(scan, n, layout.join(scan.path, n)) for n in children(names)]
    part_listings, run_docs = storage.list_and_get(
        [p for _, _, p in run_paths], [layout.meta_key(p) for _, _, p in run_paths]
    )
    part_paths: list[tuple[StepScan, str, str, str]] = []
    for (scan, name, path), blob, names in zip(run_paths, run_docs, part_listings, strict=True):
        where = storage.key_path(layout.meta_key(path))
        try:
            record = run_record(blob, where, Place(experiment, scan.step, name), strict=True)
        except MetadataError as exc:  # it belongs to another step (or experiment, or run)
            scan.misplaced.append((where, str(exc)))
            continue
        if record is None:
            _unrecorded(scan, name, blob).append(name)
            continue
        scan.runs.append(record)
        part_paths += [(scan, name, n, layout.join(path, n)) for n in children(names) if n != layout.COMPLETION]
    part_docs = storage.get_many([layout.meta_key(p) for *_, p in part_paths])
    for (scan, run, name, path), blob in zip(part_paths, part_docs, strict=True):
        where = storage.key_path(layout.meta_key(path))
        here = Place(experiment, scan.step, run, int(name) if layout.is_step_name(name) else -1)
        try:
            part = _part_record(blob, where, here)
        except MetadataError as exc:
            scan.misplaced.append((where, str(exc)))
            continue
        if part is None:
            (scan.missing if blob is None else scan.broken).append((run, name))
            continue
        scan.parts.append(part)
    for scan in scans:
        _check_expected(scan, storage)
        _check_summarized_run(scan, storage)
    return scans


def _unrecorded(scan: StepScan, name: str, blob: bytes | None) -> list[str]:
    """Where a run directory ``name`` without a readable record goes: ``unreadable`` (a record
    is there), ``unrecorded`` (none, but the step's summary names this run), else ``strays``
    (a crashed creation, debris, or an object store's ghost)."""
    if blob is not None:
        return scan.unreadable
    return scan.unrecorded if scan.summary_run == name else scan.strays


def delete_step(storage: Storage, step_path: str) -> None:
    """Delete a step, its summary first: a step interrupted half-deleted then holds no summary
    naming a run whose record is gone, which :func:`scan_steps` takes for damage
    (``StepScan.unrecorded``), and gc removes what is left once old, as any stray."""
    storage.delete(layout.meta_key(step_path))
    storage.delete_prefix(step_path)


def _check_expected(scan: StepScan, storage: Storage) -> None:
    """Parts whose record says their run expects another count than the run's record does
    (a run record swapped with another step's) are refused as misplaced."""
    expected = {r.run: r.expected for r in scan.runs}
    for part in list(scan.parts):
        theirs = part.doc.get("expected")
        if theirs is not None and part.run in expected and theirs != expected[part.run]:
            where = storage.key_path(layout.meta_key(layout.join(scan.path, part.run, str(part.index))))
            scan.misplaced.append(
                (
                    where,
                    f"{where}: mini-batch {part.index} was written for {theirs} mini-batches, its run's "
                    f"record says {expected[part.run]} (the run record was swapped or edited)",
                )
            )
            scan.parts.remove(part)


def _check_summarized_run(scan: StepScan, storage: Storage) -> None:
    """The run the step's summary names must expect what the summary says: a run record that
    does not was edited or swapped (mini-batch records before format 3 do not say what their
    run expects), and the step is kept whole as damaged rather than taken for abandoned. The
    named run's directory without a record is a leftover, not damage, once another run has
    completed the step."""
    summary = scan.summary
    if summary is None:
        return
    if scan.unrecorded and any(completed(r, scan.parts) for r in scan.runs):
        # another run completed the step (its summary not stored, the named run's removal cut
        # short): the named run's directory is a replaced run's leftover, as strays are
        scan.strays += scan.unrecorded
        scan.unrecorded.clear()
    for rec in scan.runs:
        if rec.run == scan.summary_run and rec.expected != summary.get("expected"):
            where = storage.key_path(layout.meta_key(layout.join(scan.path, rec.run)))
            scan.misplaced.append(
                (
                    where,
                    f"{where}: run {rec.run} expects {rec.expected} mini-batches, the step's summary "
                    f"{summary.get('expected')} (the run record was edited or swapped)",
                )
            )


def own_parts(
    storage: Storage, experiment: str, step: int, run: str, expected: int, known: Mapping[int, PartRecord] | None = None
) -> list[PartRecord] | None:
    """The complete mini-batch records ``0 .. expected-1`` of ``run`` in ``step``, read by
    their keys in one round of requests, or None when any is missing, incomplete, unreadable,
    misplaced or written for another count (the writer's check whether its write completed
    the step; the step's other runs are the caller's to check). ``known``: records the caller
    has already read (or written) and checked, by index, not read again."""
    run_path = layout.join(experiment, str(step), run)
    known = known or {}
    wanted = [i for i in range(expected) if i not in known]
    keys = [layout.meta_key(layout.join(run_path, str(i))) for i in wanted]
    found: dict[int, PartRecord | None] = dict(known)
    for i, key, blob in zip(wanted, keys, storage.get_many(keys), strict=True):
        try:
            found[i] = _part_record(blob, storage.key_path(key), Place(experiment, step, run, i))
        except MetadataError:
            return None
    parts = []
    for i in range(expected):
        record = found[i]
        if record is None or not record.complete or record.doc.get("expected", expected) != expected:
            return None
        parts.append(record)
    return parts


def scan_step(storage: Storage, experiment: str, step: int) -> StepScan:
    return scan_steps(storage, experiment, [step])[0]


def summarized_parts(storage: Storage, experiment: str, step: int) -> tuple[str, list[PartRecord]] | None:
    """The owner and complete mini-batches of a step its summary vouches for, in two rounds of
    requests (the step's listing and summary, then its mini-batch records), or None when
    anything is off: no summary, another run beside it, a record missing, incomplete or not
    the one expected. The caller then scans the step (:func:`scan_step`), which says why."""
    return summarized_steps(storage, experiment, [step])[0]


def summarized_steps(
    storage: Storage, experiment: str, steps: Sequence[int]
) -> list[tuple[str, list[PartRecord]] | None]:
    """:func:`summarized_parts` of several steps, in the same two rounds of requests."""
    paths = [layout.join(experiment, str(step)) for step in steps]
    listings, blobs = storage.list_and_get(paths, [layout.meta_key(p) for p in paths])
    owners: list[tuple[str, dict[str, Any], list[str]] | None] = []
    for step, path, names, blob in zip(steps, paths, listings, blobs, strict=True):
        try:
            summary = _summary(blob, storage.key_path(layout.meta_key(path)), Place(experiment, step))
            if summary is None or children(names) != [summary["run"]]:
                owners.append(None)
                continue
            run, expected = str(summary["run"]), int(summary["expected"])  # bounded by _summary
        except (MetadataError, TypeError, ValueError):
            owners.append(None)
            continue
        owners.append((run, summary, [layout.meta_key(layout.join(path, run, str(i))) for i in range(expected)]))
    fetched = iter(storage.get_many([k for o in owners if o is not None for k in o[2]]))
    found: list[tuple[str, list[PartRecord]] | None] = []
    for step, owner in zip(steps, owners, strict=True):
        if owner is None:
            found.append(None)
            continue
        run, summary, keys = owner
        blobs = [next(fetched) for _ in keys]
        found.append(_summarized(storage, Place(experiment, step, run), summary, keys, blobs))
    return found


def _summarized(
    storage: Storage, here: Place, summary: Mapping[str, Any], keys: Sequence[str], blobs: Sequence[bytes | None]
) -> tuple[str, list[PartRecord]] | None:
    """The owner and mini-batch records a step's summary vouches for, or None when any is off:
    missing, incomplete, misplaced, written for another count, or not what the summary says."""
    parts = []
    for i, (key, blob) in enumerate(zip(keys, blobs, strict=True)):
        try:
            record = _part_record(blob, storage.key_path(key), Place(here.experiment, here.step, here.run, i))
        except MetadataError:
            return None
        if record is None or not record.complete or record.doc.get("expected", len(keys)) != len(keys):
            return None
        parts.append(record)
    if _disagrees(summary, parts) is not None:
        return None
    return str(here.run), parts


def _disagrees(summary: Mapping[str, Any], parts: Sequence[PartRecord]) -> str | None:
    """What a step's summary says that its mini-batch records do not (None: it agrees)."""
    for key in ("rows", "nbytes", "raw_nbytes"):
        total = sum(getattr(p, key) for p in parts)
        if key in summary and summary[key] != total:
            return f"the summary says {key}={summary[key]}, its mini-batch records add to {total}"
    return None


def summary_problem(scan: StepScan, run: str) -> str | None:
    """Why the step's summary is wrong about its owner ``run``'s complete mini-batches, if it is."""
    if scan.summary_problem is not None or scan.summary is None:
        return scan.summary_problem
    parts = [p for p in scan.parts if p.run == run and p.complete]
    if scan.summary_run != run or scan.summary.get("expected") != len(parts):
        return f"the summary names run {scan.summary_run} with {scan.summary.get('expected')} mini-batches"
    return _disagrees(scan.summary, parts)


def step_infos(
    storage: Storage, experiment: str, now: float, lease: float, steps: Sequence[int] | None = None
) -> list[StepInfo]:
    """StepInfo of every step: two requests per complete step, a full scan for the others."""
    steps = list_steps(storage, experiment) if steps is None else list(steps)
    paths = [layout.join(experiment, str(s)) for s in steps]
    listings, docs = storage.list_and_get(paths, [layout.meta_key(p) for p in paths])
    infos: dict[int, StepInfo] = {}
    rest = []
    for step, path, names, blob in zip(steps, paths, listings, docs, strict=True):
        try:
            summary = _summary(blob, storage.key_path(layout.meta_key(path)), Place(experiment, step))
        except MetadataError:
            summary = None
        if summary is not None and children(names) == [summary["run"]]:
            infos[step] = summary_info(step, summary)
        else:
            rest.append(step)
    for scan in scan_steps(storage, experiment, rest):
        if scan.exists:
            infos[scan.step] = scan.info(now, lease)
    return [infos[s] for s in steps if s in infos]


def _summary(blob: bytes | None, where: str, here: Place) -> dict[str, Any] | None:
    summary = attribute(parse_json(blob, where), layout.STEP_ATTR, where)
    if summary is None:
        return None
    if not {"run", "expected", "rows", "nbytes"} <= summary.keys():
        raise MetadataError(f"{where}: step summary lacks required fields")
    _check_checksum(summary, where, "step summary")
    records.check_place(summary, here, where)
    records.check_summary(summary, where)
    return summary


def check_experiment(doc: Mapping[str, Any], path: str, where: str) -> None:
    """Refuse an experiment record altered after it was written or moved to another path
    (records of older writers carry no checksum and are not checked)."""
    if "checksum" not in doc:
        return
    _check_checksum(doc, where, "experiment record")
    if doc.get("name") != path:
        raise MetadataError(f"{where}: the experiment record names {doc.get('name')!r:.100} but lies at {path!r}")


def _check_checksum(doc: Mapping[str, Any], where: str, what: str) -> None:
    """Refuse a record whose checksum (written since records are bound) does not match."""
    if "checksum" in doc and doc["checksum"] != layout.doc_checksum(doc):
        raise MetadataError(f"{where}: {what} checksum mismatch (the zarr.json was altered after it was written)")


def run_record(blob: bytes | None, where: str, here: Place | None = None, *, strict: bool = False) -> RunRecord | None:
    """A run's record in a step (None when absent or unreadable, logged).

    ``here``: where the record lies; with ``strict``, a record naming another place raises
    MetadataError (else it reads as unreadable).
    """
    try:
        doc = attribute(parse_json(blob, where), layout.RUN_ATTR, where)
        if doc is None:
            return None
        _check_checksum(doc, where, "run record")
        record = RunRecord.from_json(doc)
        records.count(record.expected, "expected", where, low=1, high=records.MAX_EXPECTED)
    except (MetadataError, KeyError, TypeError, ValueError, OverflowError) as exc:  # Overflow: a time past a float
        logger.warning("ignoring unreadable run record %s: %s", where, exc)
        return None
    if here is not None:
        try:
            records.check_place(doc, here, where)
        except MetadataError as exc:
            if strict:
                raise
            logger.warning("ignoring a misplaced run record: %s", exc)
            return None
    return record


def _part_record(blob: bytes | None, where: str, here: Place) -> PartRecord | None:
    """A mini-batch record (None when absent or unreadable, logged); a record that names
    another place than ``here`` raises MetadataError."""
    try:
        doc = attribute(parse_json(blob, where), layout.PART_ATTR, where)
        record = None if doc is None else PartRecord.from_json(doc, sealed=layout.seal_holds(blob or b""))
    except (MetadataError, KeyError, TypeError, ValueError, OverflowError) as exc:  # Overflow: a time past a float
        logger.warning("ignoring unreadable mini-batch record %s: %s", where, exc)
        return None
    if doc is not None:
        records.check_place(doc, here, where)
    return record


def experiment_info(storage: Storage, experiment: str) -> dict[str, Any]:
    """The experiment's recorded information (:data:`~zarr_skip.format.layout.INFO_ATTR`)."""
    key = layout.meta_key(experiment)
    where = storage.key_path(key)
    return dict(attribute(parse_json(storage.get(key), where), layout.INFO_ATTR, where) or {})


def update_experiment_info(storage: Storage, experiment: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``values`` over the experiment's recorded information; rewrites its group's
    ``zarr.json`` only when that changes it. Returns the information now stored."""
    key = layout.meta_key(experiment)
    where = storage.key_path(key)
    doc = parse_json(storage.get(key), where)
    if doc is None:
        raise MetadataError(f"{where}: the experiment group's metadata is missing")
    attrs = dict(doc.get("attributes") or {})
    info = {**(attribute(doc, layout.INFO_ATTR, where) or {}), **dict(values)}
    if attrs.get(layout.INFO_ATTR) != info:
        storage.set(key, group_doc({**attrs, layout.INFO_ATTR: info}))
        logger.debug("%s: experiment information %s", where, sorted(values))
    return info
