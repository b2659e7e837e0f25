"""Reading the metadata of steps, runs and mini-batches (attribute documents only, no chunks)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zarr_skip.errors import MetadataError
from zarr_skip.format import layout
from zarr_skip.format.state import PartRecord, RunRecord, StepInfo, step_info, summary_info
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
    #: (run, name) of mini-batch directories whose record exists but cannot be read
    broken: list[tuple[str, str]] = field(default_factory=list)
    #: (run, name) of mini-batch directories without a record (a crash before the claim landed)
    missing: list[tuple[str, str]] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        """Whether some record of this step cannot be read (so nothing here may be deleted)."""
        return bool(self.unreadable or self.broken)

    @property
    def exists(self) -> bool:
        """Whether a run ever recorded itself here (object stores list deleted 'directories')."""
        return bool(self.runs) or self.summary is not None

    def info(self, now: float, lease: float) -> StepInfo:
        return step_info(self.step, self.runs, self.parts, now=now, lease=lease)


def list_steps(storage: Storage, experiment: str) -> list[int]:
    """Step numbers that have a group below the experiment (any state), ascending."""
    return sorted(int(n) for n in storage.list_dir(experiment) if layout.is_step_name(n))


def _children(names: Sequence[str]) -> list[str]:
    return [n for n in names if n != layout.METADATA and not n.endswith(".partial")]


def scan_steps(storage: Storage, experiment: str, steps: Sequence[int]) -> list[StepScan]:
    """Scan the metadata of several steps, with concurrent requests at each level."""
    scans = [StepScan(s, layout.join(experiment, str(s))) for s in steps]
    listings, step_docs = storage.list_and_get([s.path for s in scans], [layout.meta_key(s.path) for s in scans])
    run_paths: list[tuple[StepScan, str, str]] = []
    for scan, names, blob in zip(scans, listings, step_docs, strict=True):
        try:
            scan.summary = _summary(blob, storage.key_path(layout.meta_key(scan.path)))
        except MetadataError as exc:  # only a cache for fast status: the parts decide
            logger.warning("ignoring a damaged step summary: %s", exc)
        run_paths += [(scan, n, layout.join(scan.path, n)) for n in _children(names)]
    part_listings, run_docs = storage.list_and_get(
        [p for _, _, p in run_paths], [layout.meta_key(p) for _, _, p in run_paths]
    )
    part_paths: list[tuple[StepScan, str, str, str]] = []
    for (scan, name, path), blob, names in zip(run_paths, run_docs, part_listings, strict=True):
        record = run_record(blob, storage.key_path(layout.meta_key(path)))
        if record is None or record.run != name:
            (scan.strays if blob is None else scan.unreadable).append(name)
            continue
        scan.runs.append(record)
        part_paths += [(scan, name, n, layout.join(path, n)) for n in _children(names)]
    part_docs = storage.get_many([layout.meta_key(p) for *_, p in part_paths])
    for (scan, run, name, path), blob in zip(part_paths, part_docs, strict=True):
        part = _part_record(blob, storage.key_path(layout.meta_key(path)))
        if part is None or part.run != run or str(part.index) != name:
            (scan.missing if blob is None else scan.broken).append((run, name))
            continue
        scan.parts.append(part)
    return scans


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
    owners: list[tuple[str, list[str]] | None] = []
    for path, names, blob in zip(paths, listings, blobs, strict=True):
        try:
            summary = _summary(blob, storage.key_path(layout.meta_key(path)))
            if summary is None or _children(names) != [summary["run"]]:
                owners.append(None)
                continue
            run, expected = str(summary["run"]), int(summary["expected"])
        except (MetadataError, TypeError, ValueError):
            owners.append(None)
            continue
        owners.append((run, [layout.meta_key(layout.join(path, run, str(i))) for i in range(expected)]))
    records = iter(storage.get_many([k for o in owners if o is not None for k in o[1]]))
    found: list[tuple[str, list[PartRecord]] | None] = []
    for owner in owners:
        if owner is None:
            found.append(None)
            continue
        run, keys = owner
        parts = [_part_record(next(records), storage.key_path(key)) for key in keys]
        whole = all(p is not None and p.run == run and p.index == i and p.complete for i, p in enumerate(parts))
        found.append((run, [p for p in parts if p is not None]) if whole else None)
    return found


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
            summary = _summary(blob, storage.key_path(layout.meta_key(path)))
        except MetadataError:
            summary = None
        if summary is not None and _children(names) == [summary["run"]]:
            infos[step] = summary_info(step, summary)
        else:
            rest.append(step)
    for scan in scan_steps(storage, experiment, rest):
        if scan.exists:
            infos[scan.step] = scan.info(now, lease)
    return [infos[s] for s in steps if s in infos]


def _summary(blob: bytes | None, where: str) -> dict[str, Any] | None:
    summary = attribute(parse_json(blob, where), layout.STEP_ATTR, where)
    if summary is not None and not {"run", "expected", "rows", "nbytes"} <= summary.keys():
        raise MetadataError(f"{where}: step summary lacks required fields")
    return summary


def run_record(blob: bytes | None, where: str) -> RunRecord | None:
    try:
        doc = attribute(parse_json(blob, where), layout.RUN_ATTR, where)
        return None if doc is None else RunRecord.from_json(doc)
    except (MetadataError, KeyError, TypeError, ValueError) as exc:
        logger.warning("ignoring unreadable run record %s: %s", where, exc)
        return None


def _part_record(blob: bytes | None, where: str) -> PartRecord | None:
    try:
        doc = attribute(parse_json(blob, where), layout.PART_ATTR, where)
        return None if doc is None else PartRecord.from_json(doc)
    except (MetadataError, KeyError, TypeError, ValueError) as exc:
        logger.warning("ignoring unreadable mini-batch record %s: %s", where, exc)
        return None


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
