"""Checking what a stored record says before anything trusts it (pure: no I/O).

Every record a reader acts on is checked here first:

- its **place**: a record names the experiment, step, run and index it was written for
  (:class:`Place`), all relative to the cache root, so a record, a mini-batch or a whole step
  directory moved or swapped elsewhere is refused naming where it is and where it belongs,
  while a whole cache copied to another path, bucket or prefix reads as before;
- its **numbers**: every length, shape, size and count is a non-negative int in sane bounds
  and consistent with the others (chunk counts with shapes, stored sizes with the compression
  bound, byte totals with their sums) before an array is allocated or a key is built;
- the **lengths** of jagged columns (read from chunks): non-negative, summing to the values
  the mini-batch's record says it stored, and the running sums its record keeps (``value_ends``,
  :func:`value_ends`, which a read of a few rows takes instead of reading them) when it does.

A violation is a :class:`~zarr_skip.errors.MetadataError` naming the file. Records of
format versions 1 and 2 (zarr_skip 0.1 and 0.2) lack the place fields: they are read as
before and reported *unbound* by ``verify()``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from zarr_skip.errors import MetadataError
from zarr_skip.format import block_tables
from zarr_skip.format.block_tables import BlockIndex, all_ints

#: the most mini-batches one step may expect (verl's ``parameter_sync_step`` is a few)
MAX_EXPECTED = 1 << 16
#: the most columns one mini-batch may hold
MAX_COLUMNS = 1 << 16
#: the most dimensions a stored array may have
MAX_NDIM = 32
#: the most uncompressed bytes one stored chunk byte may stand for: zstd's densest block (a
#: run-length block of 128 KiB in 4 bytes) is 32768:1; blosc adds headers, so this is loose
MAX_RATIO = 1 << 16
#: bytes a chunk may decode to beyond ``MAX_RATIO * size`` (headers of tiny chunks)
RATIO_SLACK = 1 << 16
#: times (seconds since the epoch) a record may hold lie strictly between -MAX_TIME and MAX_TIME
MAX_TIME = 1e300
#: the crc32c trailer every chunk ends with
CRC_BYTES = block_tables.CRC_BYTES


@dataclass(frozen=True, slots=True)
class Place:
    """Where a record belongs, relative to the cache root (``None``: not part of this kind
    of record, or not recorded by an older writer)."""

    experiment: str | None = None
    step: int | None = None
    run: str | None = None
    index: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("experiment", self.experiment), ("step", self.step)) if v is not None}

    def __str__(self) -> str:
        parts = [f"experiment {self.experiment!r}"] if self.experiment is not None else []
        parts += [f"step {self.step}"] if self.step is not None else []
        parts += [f"run {self.run}"] if self.run is not None else []
        parts += [f"mini-batch {self.index}"] if self.index is not None else []
        return ", ".join(parts) or "nowhere"


def bound(doc: Mapping[str, Any]) -> bool:
    """Whether a record names its place (written by this version: ``experiment`` and ``step``)."""
    return "experiment" in doc and "step" in doc


def check_place(doc: Mapping[str, Any], here: Place, where: str) -> None:
    """Refuse a record that names another place than ``here`` (fields it lacks are not checked).

    Raises
    ------
    MetadataError
        Naming the file, where it is and where it belongs.
    """
    theirs = Place(
        doc.get("experiment") if here.experiment is not None else None,
        doc.get("step") if here.step is not None else None,
        doc.get("run") if here.run is not None else None,
        doc.get("index") if here.index is not None else None,
    )
    mine = Place(
        here.experiment if "experiment" in doc else None,
        here.step if "step" in doc else None,
        here.run if "run" in doc else None,
        here.index if "index" in doc else None,
    )
    if theirs != mine:
        raise MetadataError(
            f"{where}: this record belongs to {theirs} but lies at {mine}: it was moved or swapped "
            "(restore it to its place, or delete the step)"
        )


def count(value: Any, what: str, where: str, *, low: int = 0, high: int | None = None) -> int:
    """``value`` as an int in ``low .. high``, else MetadataError naming ``what`` and the file."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        limit = f"in {low} .. {high}" if high is not None else f">= {low}"
        raise MetadataError(f"{where}: {what} must be an int {limit}, got {value!r:.80}")
    return value


def check_summary(summary: Mapping[str, Any], where: str) -> None:
    """The numbers of a step's summary."""
    count(summary.get("expected"), "expected", where, low=1, high=MAX_EXPECTED)
    for key in ("rows", "nbytes"):
        count(summary.get(key), key, where)
    count(summary.get("raw_nbytes", 0), "raw_nbytes", where)
    completed = summary.get("completed", 0.0)
    if isinstance(completed, bool) or not isinstance(completed, (int, float)) or not -MAX_TIME < completed < MAX_TIME:
        raise MetadataError(f"{where}: the summary's completed must be a time in seconds, got {completed!r:.40}")
    if not isinstance(summary.get("run"), str):
        raise MetadataError(f"{where}: the summary's run must be a string")


def check_part(doc: Mapping[str, Any], where: str) -> None:
    """Every count, shape and size of a complete mini-batch record, before any is used:
    :func:`check_frame`, and :func:`check_column` and :func:`value_ends` of every column.

    Raises
    ------
    MetadataError
        Naming the file and the first value that is out of bounds or inconsistent.
    """
    _check_header(doc, where)
    for name in doc["columns"]:
        check_column(doc, name, where)
        value_ends(doc, name, where)
    _check_total(doc, where)


def check_frame(doc: Mapping[str, Any], where: str) -> None:
    """What a record says of the whole mini-batch (index, rows, the columns' mapping and the
    stored bytes they add to), before any of it is used; each column's own entries are left to
    :func:`check_column`, run before that column is used (a reader asking for a few columns of
    many steps checks only those)."""
    _check_header(doc, where)
    _check_total(doc, where)


def _check_header(doc: Mapping[str, Any], where: str) -> None:
    count(doc.get("index"), "index", where, high=MAX_EXPECTED - 1)
    if "expected" in doc:
        expected = count(doc["expected"], "expected", where, low=1, high=MAX_EXPECTED)
        if doc["index"] >= expected:
            raise MetadataError(f"{where}: index {doc['index']} is not below expected {expected}")
    count(doc.get("rows"), "rows", where)
    columns = doc.get("columns")
    if not isinstance(columns, Mapping) or len(columns) > MAX_COLUMNS:
        raise MetadataError(f"{where}: columns must be a mapping of at most {MAX_COLUMNS} columns")
    for name, entry in columns.items():
        arrays = entry.get("arrays") if isinstance(entry, Mapping) else None
        if not isinstance(arrays, Mapping) or not arrays:
            raise MetadataError(f"{where}: column {name!r} lists no arrays")


def _check_total(doc: Mapping[str, Any], where: str) -> None:
    """``nbytes``: what the chunks' sizes of every column add to."""
    stored = 0
    for name, entry in doc["columns"].items():
        for aname, array in entry["arrays"].items():
            if not isinstance(array, Mapping):
                raise MetadataError(f"{where}, {name}/{aname}: not an object")
            sizes = array.get("sizes")
            if not isinstance(sizes, list) or not all(type(s) is int for s in sizes):
                raise MetadataError(f"{where}, {name}/{aname}: sizes must be a list of ints")
            stored += sum(sizes)
    if count(doc.get("nbytes"), "nbytes", where) != stored and bound(doc):
        raise MetadataError(f"{where}: nbytes {doc['nbytes']} is not the {stored} bytes its chunks' sizes add to")
    if "container" in doc:
        check_packed(doc, where)


#: bytes of a shard's index per chunk (an offset and a length, uint64 each), and its crc32c
SHARD_INDEX_BYTES = 16
#: the names a record's ``container`` may have (format 4: ``zip``, one data file per mini-batch)
CONTAINERS = ("zip",)


def check_packed(doc: Mapping[str, Any], where: str) -> None:
    """Where the chunks of a packed mini-batch lie in its data file: every array's ``offset``
    an int, its chunks (and a shard's index after them) inside the file's ``data_nbytes``,
    and no two arrays' bytes overlapping, before any offset is used."""
    if doc["container"] not in CONTAINERS:
        raise MetadataError(f"{where}: unknown container {doc['container']!r:.40} (written by a newer zarr_skip?)")
    size = count(doc.get("data_nbytes"), "data_nbytes", where)
    spans = []
    for name, entry in doc["columns"].items():
        for aname, array in entry["arrays"].items():
            sizes = array["sizes"]  # ints, checked by _check_total
            if not sizes:
                continue
            offset = count(array.get("offset"), f"{name}/{aname} offset", where)
            n = len(sizes)
            end = offset + sum(sizes) + (SHARD_INDEX_BYTES * n + CRC_BYTES if array.get("shard") is True else 0)
            if min(sizes) < 0 or end > size:
                raise MetadataError(
                    f"{where}, {name}/{aname}: chunks at bytes {offset}..{end} lie outside "
                    f"the data file of {size} bytes"
                )
            spans.append((offset, end, f"{name}/{aname}"))
    spans.sort()
    for (_, end, first), (start, _, second) in pairwise(spans):
        if start < end:
            raise MetadataError(f"{where}: the bytes of {first} and {second} overlap in the data file")


def check_column(doc: Mapping[str, Any], name: str, where: str) -> dict[str, BlockIndex | None]:
    """Every count, shape and size of one column of a record :func:`check_frame` passed; of
    each of its arrays, the block index it keeps (:mod:`~zarr_skip.format.block_tables`;
    None: its chunks are read whole)."""
    arrays = doc["columns"][name]["arrays"]
    rows = doc["rows"]
    per_row = ("data", "codes") if "codes" in arrays else ("data", "lengths")  # a dictionary's lengths: entries
    indexes = {
        aname: _check_array(array, rows if aname in per_row else None, f"{where}, {name}/{aname}")
        for aname, array in arrays.items()
    }
    if "lengths" in arrays and "values" not in arrays:
        raise MetadataError(f"{where}: column {name!r} has lengths but no values")
    if "codes" in arrays:
        _check_entries(arrays, rows, f"{where}, {name}")
    return indexes


def value_ends(doc: Mapping[str, Any], name: str, where: str) -> np.ndarray | None:
    """Where each row's values end in a jagged column of a record :func:`check_column` passed
    (``value_ends`` of its lengths entry: the lengths' running sums, so that a read of a few
    rows finds their values without reading the lengths; see :func:`ends_of`), as int64;
    None when it keeps none. One per row, never falling, the last the values stored."""
    arrays = doc["columns"][name]["arrays"]
    lengths = arrays.get("lengths")
    if not isinstance(lengths, Mapping) or "value_ends" not in lengths:
        return None
    where = f"{where}, {name}/lengths"
    if "codes" in arrays:  # (check_column saw the values)
        raise MetadataError(f"{where}: value_ends belong to a plain jagged column (lengths and values)")
    ends = block_tables.from_base64(lengths["value_ends"], "value_ends", where).astype(np.int64)
    rows, values = lengths["shape"][0], arrays["values"]["shape"][0]
    if len(ends) != rows or (rows and int(ends[-1]) != values) or (rows == 0 and values):
        raise MetadataError(f"{where}: value_ends must hold one end per row, the last the {values} values stored")
    if rows > 1 and bool((ends[1:] < ends[:-1]).any()):
        raise MetadataError(f"{where}: value_ends must not fall (a row's length is never negative)")
    return ends


def ends_of(lengths: np.ndarray) -> str:
    """The ``value_ends`` a record keeps of a mini-batch's ``lengths`` of a jagged column
    (their running sums, base64 of uint32): write them only when the values stored are
    fewer than ``2**32`` (:data:`MAX_VALUE_ENDS`)."""
    return block_tables.to_base64(np.cumsum(lengths, dtype=np.int64))


#: a record keeps ``value_ends`` only of a mini-batch storing fewer values in a column than this
MAX_VALUE_ENDS = 1 << 32


def check_ends_agree(lengths: np.ndarray, ends: np.ndarray | None, where: str) -> None:
    """A mini-batch's stored ``lengths`` are the ones its record's ``value_ends`` say."""
    if ends is not None and not np.array_equal(np.cumsum(lengths, dtype=np.int64), ends):
        raise MetadataError(
            f"{where}: the stored row lengths disagree with the record's value_ends (the lengths chunk or the "
            "record was altered)"
        )


def _check_entries(arrays: Mapping[str, Any], rows: int, where: str) -> None:
    """A dictionary's entries are distinct rows of its mini-batch, so there are at most
    ``rows`` of them (checked before the lengths that count them are read and widened: a
    small, very compressible lengths chunk must not make a reader allocate gigabytes)."""
    lengths = arrays.get("lengths")
    if not isinstance(lengths, Mapping) or "values" not in arrays:
        raise MetadataError(f"{where}: a dictionary-encoded column needs lengths and values")
    entries = lengths["shape"][0]
    if entries > rows:
        raise MetadataError(
            f"{where}/lengths: {entries} dictionary entries recorded for {rows} rows (a dictionary holds "
            "at most one entry per row: the record was altered)"
        )


def _check_array(a: Any, rows: int | None, where: str) -> BlockIndex | None:
    """Check one array entry of a manifest; the block index it keeps, if any."""
    if not isinstance(a, Mapping):
        raise MetadataError(f"{where}: not an object")
    try:
        dtype = parse_dtype(a["dtype"])
    except (KeyError, TypeError, ValueError):
        raise MetadataError(f"{where}: bad dtype {a.get('dtype')!r:.80}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise MetadataError(f"{where}: dtype {dtype} cannot be stored")
    shape = a.get("shape")
    if not isinstance(shape, list) or not 1 <= len(shape) <= MAX_NDIM:
        raise MetadataError(f"{where}: shape must be a list of 1 to {MAX_NDIM} ints")
    dims = shape if all_ints(shape) and min(shape) >= 0 else [count(d, "shape", where) for d in shape]
    if rows is not None and dims[0] != rows:
        raise MetadataError(f"{where}: {dims[0]} rows stored, the record says {rows}")
    chunk = count(a.get("chunk"), "chunk", where, low=1)
    sizes = a.get("sizes")
    if not isinstance(sizes, list):
        raise MetadataError(f"{where}: sizes must be a list")
    n_chunks = -(-dims[0] // chunk) if math.prod(dims) else 0  # exact for any int (no float)
    if len(sizes) != n_chunks:
        raise MetadataError(f"{where}: {len(sizes)} chunk sizes for {dims[0]} rows in chunks of {chunk}")
    chunk_raw = chunk * math.prod(dims[1:]) * dtype.itemsize
    if not all_ints(sizes) or (sizes and (min(sizes) <= CRC_BYTES or chunk_raw > MAX_RATIO * min(sizes) + RATIO_SLACK)):
        for s in sizes:  # which one, and why
            count(s, "chunk size", where, low=CRC_BYTES + 1)
            if chunk_raw > MAX_RATIO * s + RATIO_SLACK:
                raise MetadataError(f"{where}: a chunk of {s} bytes cannot hold {chunk_raw} bytes of values")
    if "raw" in a and count(a["raw"], "raw", where) != math.prod(dims) * dtype.itemsize:
        raise MetadataError(f"{where}: raw {a['raw']} is not the size of shape {dims} of {dtype}")
    crcs = a.get("crc32c")
    if crcs is not None and (
        not isinstance(crcs, list)
        or len(crcs) != n_chunks
        or not all_ints(crcs)
        or (crcs and (min(crcs) < 0 or max(crcs) >> 32))
    ):
        raise MetadataError(f"{where}: crc32c must list one 32-bit value per chunk")
    first = a.get("first_rows")
    if first is not None:
        if not isinstance(first, list) or len(first) != n_chunks:
            raise MetadataError(f"{where}: first_rows must list one row per chunk")
        if any(b < a_ for a_, b in pairwise(count(r, "first_rows", where) for r in first)):
            raise MetadataError(f"{where}: first_rows must not decrease")
    return block_tables.of_array(a, sizes, where)


@functools.lru_cache(maxsize=256)
def _dtype_of(name: str) -> np.dtype:
    return np.dtype(name)


def parse_dtype(name: Any) -> np.dtype:
    """``np.dtype(name)``, parsed once per name (a record names a dozen, thousands of steps)."""
    return _dtype_of(name) if type(name) is str else np.dtype(name)


def check_lengths(lengths: np.ndarray, values: int, where: str) -> np.ndarray:
    """A mini-batch's lengths of a jagged column: non-negative, summing to its ``values``.

    Raises
    ------
    MetadataError
        Naming the mini-batch and column (``where``) and what is wrong.
    """
    if lengths.size and int(lengths.min()) < 0:
        raise MetadataError(f"{where}: negative row lengths stored (the lengths chunk was altered)")
    total = int(lengths.sum(dtype=np.int64)) if lengths.size else 0
    if total != values:
        raise MetadataError(
            f"{where}: the row lengths add to {total} values but {values} are stored (the lengths chunk was altered)"
        )
    return lengths


def check_codes(codes: np.ndarray, entries: int, where: str) -> np.ndarray:
    """A dictionary-encoded mini-batch's codes: each the index of one of its ``entries``."""
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= entries):
        raise MetadataError(f"{where}: codes outside the {entries} dictionary entries stored (the codes were altered)")
    return codes


def split_lengths(
    lengths: np.ndarray,
    rows: Sequence[int],
    values: Sequence[int],
    where: Sequence[str],
    ends: Sequence[np.ndarray | None],
) -> None:
    """:func:`check_lengths` and :func:`check_ends_agree` of each mini-batch of lengths
    concatenated across mini-batches."""
    start = 0
    for n, v, w, e in zip(rows, values, where, ends, strict=True):
        check_lengths(lengths[start : start + n], v, w)
        check_ends_agree(lengths[start : start + n], e, w)
        start += n
