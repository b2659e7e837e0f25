"""Names and keys of the on-disk layout (pure: no I/O).

The layout, documented in ``docs/format.md``::

    zarr.json                               root group: {"zarr_skip": {"format", "version"}}
    {experiment}/zarr.json                  {"zarr_skip.experiment": {"name", "fingerprint"}}
    {experiment}/{step}/zarr.json           step group {"zarr_skip.complete": summary}, once complete
    {experiment}/{step}/{run}/zarr.json     {"zarr_skip.run": {"run", "started", "expected"}}
    {experiment}/{step}/{run}/{i}/zarr.json {"zarr_skip.part": {... "state": "writing"|"complete"}}
                                            (complete: then "zarr_skip.seal", the crc32c of the bytes before it)
    {experiment}/{step}/{run}/{i}/{column}  arrays (a group of arrays for multi-array columns)
    {experiment}/{step}/{run}/complete/zarr.json  {"zarr_skip.completion": {"writer", "token"}}
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Any

from zarr_skip.errors import ConfigError

FORMAT_NAME = "zarr_skip"
#: 2: arrays of several chunks are shards, chunk keys ``c.N``, every chunk full-shape; version 1
#: caches are read, and marked 2 by the first write (zarr_skip 0.1 would not read those steps).
#: 3: jagged columns whose rows repeat may be dictionary-encoded (``codes`` plus the distinct
#: rows), which a version 2 reader would misread; older caches are read and marked 3 likewise
#: 4: a mini-batch's arrays are packed in one data file (a ZIP of stored members beside its
#: record, ``{i}/w-{writer}.zip``), which a version 3 reader would find no arrays in
FORMAT_VERSION = 4

ROOT_ATTR = "zarr_skip"
EXPERIMENT_ATTR = "zarr_skip.experiment"
STEP_ATTR = "zarr_skip.complete"
RUN_ATTR = "zarr_skip.run"
#: beside a complete mini-batch record: the crc32c of the ``zarr.json`` bytes before it
SEAL_ATTR = "zarr_skip.seal"
PART_ATTR = "zarr_skip.part"
COMPLETION_ATTR = "zarr_skip.completion"
#: the attribute of a packed data file's root group: the mini-batch it was written for
DATA_ATTR = "zarr_skip.data"
#: the ``container`` a completion record names for a packed mini-batch (format 4): its data
#: file is a ZIP whose members are the zarr keys of its data group
CONTAINER = "zip"

#: the group below a run's directory that one writer creates exclusively when it sees the
#: step complete: that writer alone reports ``step_complete`` and writes the summary
COMPLETION = "complete"
#: what an experiment records about its data beyond the fingerprint (the trainer's tokenizer and
#: model paths, ...): one object on the experiment group, merged on each update
INFO_ATTR = "zarr_skip.info"

METADATA = "zarr.json"

#: fingerprint keys that give verl's readable directory names
VERL_KEYS = (
    "experiment_name",
    "project_name",
    "gen_batch_size",
    "n",
    "max_prompt_length",
    "max_response_length",
)

# \Z, not $: "$" also matches before a trailing newline ("r1\n" would pass)
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*\Z")
_RUN_ID = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,127}\Z")
_STEP = re.compile(r"^(0|[1-9][0-9]*)\Z")
#: a temp file a writer leaves beside a key until it renames it, ``{name}.{hex}.partial`` (a
#: uuid4's hex; zarr's atomic writes name theirs alike): a run or an experiment named
#: ``sweep.partial`` is not one
_TEMP = re.compile(r"\.[0-9a-f]{8,}\.partial\Z")


def is_temp(key: str) -> bool:
    """Whether the last segment of ``key`` is a writer's temp file, not a run or experiment
    whose name ends in ``.partial``."""
    return _TEMP.search(key.rpartition("/")[2]) is not None


def _segment(value: object) -> str:
    """Turn a fingerprint value into a safe path segment (no '/', no leading dot)."""
    text = re.sub(r"[^A-Za-z0-9._=+-]", "-", str(value)).strip(".-") or "x"
    return text


def experiment_name(fingerprint: Mapping[str, Any]) -> str:
    """The experiment group's path for a fingerprint.

    A verl fingerprint gives verl's own names, ``{experiment}_{project}/GBS{gbs}_N{n}_in{p}_out{r}``,
    followed by ``/{role}`` when it has one. Any other fingerprint is named by a stable hash of
    its canonical JSON, ``fp-{12 hex}``. Other keys of a verl fingerprint are kept in the
    attributes and checked on open, but do not change the name.
    """
    if not isinstance(fingerprint, Mapping) or not fingerprint:
        raise ConfigError("fingerprint: expected a non-empty mapping of settings")
    if all(key in fingerprint for key in VERL_KEYS):
        f = fingerprint
        parts = [
            _segment(f"{f['experiment_name']}_{f['project_name']}"),
            _segment(f"GBS{f['gen_batch_size']}_N{f['n']}_in{f['max_prompt_length']}_out{f['max_response_length']}"),
        ]
        if fingerprint.get("role"):
            parts.append(_segment(fingerprint["role"]))
        return "/".join(parts)
    digest = hashlib.sha256(canonical_json(fingerprint).encode()).hexdigest()[:12]
    return f"fp-{digest}"


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal text."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"fingerprint: values must be JSON-able ({exc})") from None


def doc_checksum(doc: Mapping[str, Any]) -> str:
    """crc32c of a metadata document's canonical JSON, its own ``checksum`` field left out."""
    import google_crc32c

    body = {k: v for k, v in doc.items() if k != "checksum"}
    # a parsed or built document holds no circles (a RecursionError is the callers' to report)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True, check_circular=False)
    return f"{int(google_crc32c.value(text.encode())):08x}"


_HEX8 = re.compile(rb"[0-9a-f]{8}")


_SEAL_HEAD = b',"' + SEAL_ATTR.encode() + b'":"'
#: the bytes a sealed ``zarr.json`` ends with: the seal attribute, its 8 hex digits, the braces
_SEAL_BYTES = len(_SEAL_HEAD) + 8 + len(b'"}}')


def seal(group: bytes) -> bytes:
    """``group``, the bytes of a group's ``zarr.json`` ending with its ``attributes`` (as
    ``catalog.group_doc`` writes it), with :data:`SEAL_ATTR` added last to them: the crc32c of
    every byte before it, which :func:`seal_holds` checks as the records in it are read (in
    place of encoding each again for :func:`doc_checksum`)."""
    import google_crc32c

    if not group.endswith(b"}}"):
        raise ValueError("a zarr.json whose attributes come last")
    body = group[:-2]
    return body + _SEAL_HEAD + f"{int(google_crc32c.value(body)):08x}".encode() + b'"}}'


def seal_holds(blob: bytes) -> bool:
    """Whether ``blob`` (a ``zarr.json`` as read) ends with the seal :func:`seal` adds and its
    bytes before it are the ones sealed: the records in it are as their writer stored them,
    checksums and all (their check without encoding them again: ~0.5 ms for a record of 40 KB).
    False for a ``zarr.json`` written otherwise (earlier builds, another program): the caller
    then checks each record's ``checksum`` on its parsed form."""
    if type(blob) is not bytes or len(blob) < _SEAL_BYTES:
        return False
    tail = blob[-_SEAL_BYTES:]
    digits = tail[len(_SEAL_HEAD) : -3]
    if not tail.startswith(_SEAL_HEAD) or not tail.endswith(b'"}}') or not _HEX8.fullmatch(digits):
        return False
    import google_crc32c

    return int(google_crc32c.value(blob[:-_SEAL_BYTES])) == int(digits, 16)


def normalize_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint as stored: a plain JSON round trip, so comparisons are exact."""
    out: dict[str, Any] = json.loads(canonical_json(dict(fingerprint)))  # a dict's JSON: a dict
    return out


def check_experiment_name(name: str) -> str:
    """Validate a user-given experiment path (segments separated by '/')."""
    if not isinstance(name, str):
        raise ConfigError(f"experiment: expected a str, got {type(name).__name__}")
    segments = name.split("/")
    if not name or not all(_SEGMENT.match(s) for s in segments) or any(is_step_name(s) for s in segments):
        raise ConfigError(
            f"experiment: {name!r} is not a valid experiment path (segments of letters, digits, "
            "'._=+-', not starting with a dot, not all digits)"
        )
    return name


def is_step_name(name: str) -> bool:
    """True for the group names of steps: non-negative decimal integers without leading zeros."""
    return bool(_STEP.match(name))


def step_name(step: int) -> str:
    """The group name of a step; steps are non-negative integers."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"step: expected a non-negative int, got {step!r}")
    return str(step)


def check_run_id(run_id: str) -> str:
    """Validate a user-given run id (a letter, then letters, digits and '._-')."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ConfigError(
            f"run_id: {run_id!r} is not valid (start with a letter; letters, digits, '._-'; at most 128 characters)"
        )
    return run_id


def new_run_id(now: float | None = None) -> str:
    """A fresh run id: ``r`` + UTC time + random hex, e.g. ``r20261129T140501-3fa9c2d1``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"r{stamp}-{secrets.token_hex(4)}"


def new_writer_id() -> str:
    """A token unique to one writer (handle) of a run: host, pid and random hex."""
    return f"{_segment(socket.gethostname())}-{os.getpid()}-{secrets.token_hex(6)}"


#: characters that no name of ours may hold: path separators and NUL
_FORBIDDEN = ("/", "\\", "\x00")


def _has_forbidden(text: str) -> bool:
    return "\\" in text or "\x00" in text or "/" in text


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be one segment of a key (None when it can).

    A segment is a non-empty string without ``/``, ``\\`` or NUL that is not ``.`` or
    ``..``: joined to the cache root it names something inside the cache, on every backend.
    """
    if type(name) is str and name and name not in (".", "..") and not _has_forbidden(name):
        return None  # the common case, checked at C speed
    if not isinstance(name, str):
        return f"expected a str, got {type(name).__name__}"
    if not name:
        return "empty"
    if name in (".", ".."):
        return f"{name!r} would leave its directory"
    bad = [c for c in _FORBIDDEN if c in name]
    if bad:
        return f"holds {bad[0]!r} (a path separator or NUL)"
    return None


def column_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a column name (None when it can): a key segment (see
    :func:`name_problem`) that does not start with a dot and is not ``zarr.json``."""
    problem = name_problem(name)
    if problem is None and isinstance(name, str):
        if name.startswith("."):
            problem = "starts with a dot"
        elif name == METADATA:
            problem = f"{METADATA!r} is the name of zarr's metadata documents"
        elif not name.isascii():
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                problem = "holds a lone surrogate, which UTF-8 (every key's encoding) cannot store"
    return problem


def key_problem(key: object) -> str | None:
    """Why ``key`` (segments joined by ``/``) would not stay inside the cache (None when it
    stays): absolute, an empty, ``.`` or ``..`` segment, a backslash or NUL."""
    if not isinstance(key, str):
        return f"expected a str, got {type(key).__name__}"
    if key.startswith("/"):
        return "absolute"
    if not key:
        return None  # the root itself
    segments = key.split("/")
    if "\\" not in key and "\x00" not in key and "" not in segments and "." not in segments and ".." not in segments:
        return None  # the common case, checked at C speed
    for segment in segments:
        problem = name_problem(segment)
        if problem is not None:
            return f"segment {segment!r}: {problem}"
    return None


def join(*parts: str) -> str:
    """Join key parts with '/', skipping empty ones."""
    if all(p and p[0] != "/" and p[-1] != "/" for p in parts):  # the common case: nothing to strip
        return "/".join(parts)
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def meta_key(path: str) -> str:
    """The key of a node's ``zarr.json``."""
    return join(path, METADATA)


#: separator of chunk keys in arrays we write: ``c.0`` (``.``) saves a ``c/`` directory per array
#: on file systems, where creating a directory costs as much as writing a small chunk
CHUNK_SEPARATOR = "."


def chunk_key(array_path: str, index: int, ndim: int, separator: str = "/") -> str:
    """Key of chunk ``index`` along axis 0 of an array chunked only along rows (zarr's default
    chunk key encoding with ``separator``)."""
    return join(array_path, separator.join(["c", str(index)] + ["0"] * (ndim - 1)))
