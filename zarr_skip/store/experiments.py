"""Experiment groups: find them, say how a fingerprint differs from theirs, and create the root
and an experiment at the first write (opening a cache never writes)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zarr_skip.errors import (
    AmbiguousExperimentError,
    CacheNotFoundError,
    ExperimentNotFoundError,
    FingerprintMismatchError,
    MetadataError,
)
from zarr_skip.format import layout
from zarr_skip.store.catalog import attribute, check_experiment, group_doc
from zarr_skip.store.storage import Storage, parse_json

__all__ = [
    "check_fingerprint",
    "create_experiment",
    "create_root",
    "differences",
    "find_experiments",
    "match_experiment",
    "nearest",
    "parent_of_experiments",
    "read_created",
    "refuse_inside",
    "root_above",
]

#: how deep experiments may nest below the root (a verl name, its settings, a role)
_DEPTH = 6
#: a stored experiment is "near" a fingerprint when at most this many keys differ
_NEAR = 3


def find_experiments(
    storage: Storage, below: str = "", first: list[str] | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Experiment names stored below ``below`` (the root by default) with their fingerprints,
    found by walking groups until one carries the experiment attribute; and the experiment
    groups found damaged (a record altered or moved, or steps without a record): path -> why.
    ``first``: the listing of ``below``, when the caller read it already."""
    found: dict[str, dict[str, Any]] = {}
    damaged: dict[str, str] = {}
    level = [below]
    for depth in range(_DEPTH):
        listings = [first] if depth == 0 and first is not None else storage.list_dirs(level)
        for parent, names in zip(level, listings, strict=True):
            if parent and parent not in found and any(layout.is_step_name(n) for n in names):
                damaged.setdefault(
                    parent, f"{storage.key_path(layout.meta_key(parent))}: holds steps but no experiment record"
                )
        children = [
            layout.join(parent, n)
            for parent, names in zip(level, listings, strict=True)
            for n in names
            if n != layout.METADATA and not layout.is_temp(n) and not layout.is_step_name(n)
        ]
        if not children:
            break
        docs = storage.get_json_many(layout.meta_key(c) for c in children)
        level = []
        for path, doc in zip(children, docs, strict=True):
            exp = attribute(doc, layout.EXPERIMENT_ATTR, path)
            if exp is not None:
                try:
                    check_experiment(exp, path, storage.key_path(layout.meta_key(path)))
                except MetadataError as exc:
                    damaged[path] = str(exc)
                    continue
                fp = exp.get("fingerprint", {})
                found[path] = dict(fp) if isinstance(fp, Mapping) else {}
            if doc is None or doc.get("node_type") != "array":
                # experiments may nest (a role below its verl name); a group whose record was
                # lost or damaged is walked too, so the steps below it are not hidden
                level.append(path)
    return dict(sorted(found.items())), damaged


def differences(given: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """``key: stored X, given Y`` for every key whose value differs (a missing key is named
    as missing, not as ``None``)."""
    out = []
    for key in sorted(set(given) | set(stored)):
        if key not in stored:
            out.append(f"{key}: not stored, given {given[key]!r}")
        elif key not in given:
            out.append(f"{key}: stored {stored[key]!r}, not given")
        elif given[key] != stored[key]:
            out.append(f"{key}: stored {stored[key]!r}, given {given[key]!r}")
    return out


def nearest(given: Mapping[str, Any], found: Mapping[str, Mapping[str, Any]]) -> str:
    """A sentence naming the stored experiments whose fingerprints differ from ``given`` in
    the fewest keys (at most a few), with those keys; empty when none is near."""
    ranked = sorted((len(d), name, d) for name, fp in found.items() if (d := differences(given, fp)))
    near = [(name, d) for n, name, d in ranked if n <= _NEAR and n == ranked[0][0]]
    if not near:
        return ""
    return "; ".join(f"stored experiment {name!r} differs in {'; '.join(d)}" for name, d in near)


def check_fingerprint(name: str, given: Mapping[str, Any], stored: Mapping[str, Any], location: str) -> None:
    """Raise FingerprintMismatchError naming the differing keys unless the experiment record
    ``stored`` holds the fingerprint ``given``."""
    theirs = stored.get("fingerprint")
    if theirs != given:
        diff = "; ".join(differences(given, theirs if isinstance(theirs, Mapping) else {}))
        raise FingerprintMismatchError(
            f"experiment {name!r} at {location} was written with other settings ({diff}); "
            "use another location or experiment name"
        )


def parent_of_experiments(storage: Storage, name: str, fingerprint: Mapping[str, Any]) -> None:
    """Raise FingerprintMismatchError when the group ``name`` is no experiment but holds some:
    the fingerprint names their parent (it lacks a key of theirs, as the SkipManager's role)."""
    below = find_experiments(storage, name)[0]
    if below:
        near = nearest(fingerprint, below)
        raise FingerprintMismatchError(
            f"{name!r} at {storage.where} is not an experiment but holds experiments {', '.join(below)}: "
            f"the fingerprint names their parent ({near or 'it lacks their keys'}); give the missing "
            "keys (for the SkipManager's data: 'role')"
        )


def read_created(storage: Storage, key: str) -> dict[str, Any]:
    """Read a document this or another writer has just created (shared mounts lag a little)."""
    where = storage.key_path(key)
    for delay in (0.0, 0.05, 0.2, 0.5, 1.0):
        if delay:  # not sleep(0): it lets go of the GIL, and the pool's threads may keep it ~5 ms
            time.sleep(delay)
        doc = parse_json(storage.get(key), where)
        if doc is not None:
            return doc
    raise MetadataError(f"{where}: created by another writer but not readable here yet; retry")


def create_root(storage: Storage) -> dict[str, Any]:
    """Create the root group (unless another writer did) and return its document."""
    attrs = {layout.ROOT_ATTR: {"format": layout.FORMAT_NAME, "version": layout.FORMAT_VERSION}}
    return _created(storage, layout.METADATA, group_doc(attrs))


def _created(storage: Storage, key: str, data: bytes) -> dict[str, Any]:
    """Create ``key`` holding ``data`` unless it exists; the document stored there: ``data``
    when this call's bytes are the ones read back (:meth:`Storage.create_if_absent`), else
    another writer's, read again until it shows."""
    if storage.create_if_absent(key, data):
        doc: dict[str, Any] = json.loads(data)  # a group document: a dict
        return doc
    return read_created(storage, key)


def create_experiment(storage: Storage, name: str, fingerprint: Mapping[str, Any]) -> dict[str, Any] | None:
    """Create the experiment group ``name`` and its parents (unless another writer did);
    the experiment attribute stored there, which may be another writer's."""
    segments = name.split("/")
    for i in range(1, len(segments)):
        storage.create_if_absent(layout.meta_key("/".join(segments[:i])), group_doc())
    key = layout.meta_key(name)
    doc: dict[str, Any] = {"name": name, "fingerprint": dict(fingerprint), "created": time.time()}
    doc["checksum"] = layout.doc_checksum(doc)
    created = _created(storage, key, group_doc({layout.EXPERIMENT_ATTR: doc}))
    stored = attribute(created, layout.EXPERIMENT_ATTR, storage.key_path(key))
    if stored is not None:
        check_experiment(stored, name, storage.key_path(key))
    return stored


def match_experiment(wanted: str, names: Sequence[str], location: str) -> str:
    """The stored experiment that ``wanted`` names (what ``open_cache(experiment=...)`` and the
    CLI's ``-e`` take): the full name, else the one whose last parts it is (``rollout`` for
    ``exp_proj/GBS4_N2_in8_out16/rollout``), else the one name holding it as a whole: not
    inside a longer word or number (``exp1`` is not ``exp10_p``, ``GBS4`` not ``GBS48``), as
    ``rm -e`` must not pick another experiment's steps.

    Raises
    ------
    ExperimentNotFoundError
        No stored name matches (the message lists those stored).
    AmbiguousExperimentError
        Several match (the message lists them).
    """
    if wanted in names:
        return wanted
    whole = re.compile(rf"(?<![A-Za-z0-9]){re.escape(wanted)}(?![A-Za-z0-9])")
    matches = [n for n in names if n.endswith("/" + wanted)] or [n for n in names if whole.search(n)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise AmbiguousExperimentError(
            f"experiment {wanted!r} matches several experiments at {location}: {', '.join(matches)}; "
            "give more of the name"
        )
    raise ExperimentNotFoundError(
        f"experiment {wanted!r} not found at {location} (found: {', '.join(names) or 'none'})"
    )


def root_above(path: str | Path, levels: int = _DEPTH + 2) -> Path | None:
    """The nearest directory above the local ``path`` (up to ``levels`` up) whose root group
    says it is a zarr_skip cache, or None."""
    here = Path(path)
    for parent in list(here.parents)[:levels]:
        try:
            doc = json.loads((parent / layout.METADATA).read_bytes())
        except (OSError, ValueError):
            continue
        attrs = doc.get("attributes") if isinstance(doc, dict) else None
        info = attrs.get(layout.ROOT_ATTR) if isinstance(attrs, dict) else None  # a foreign zarr.json: any JSON
        if isinstance(info, dict) and info.get("format") == layout.FORMAT_NAME:
            return parent
    return None


def refuse_inside(root: Path | None, location: str) -> None:
    """CacheNotFoundError naming the cache's root when the local directory ``root`` (None: not
    local) is a group inside a cache, as opening it read-only found no cache there."""
    above = root_above(root) if root is not None else None
    if above is not None and root is not None:
        inside = root.relative_to(above).as_posix()
        raise CacheNotFoundError(
            f"{location} is inside the cache at {above} ({inside}); open {above}"
            f" (open_cache({str(above)!r}, experiment=NAME) for one of its experiments)"
        )
