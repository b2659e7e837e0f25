"""Dictionary encoding of repeated rows (pure: no store, no torch).

After verl's ``repeat(interleave=True)`` the ``n`` rows of a GRPO group share their prompt
tokens, ``uid``, ``raw_prompt``, ``data_source``, ``reward_model`` and ``extra_info`` (often the
same Python objects). A jagged column whose rows repeat is stored once per distinct row:

* ``codes`` (rows,): per row, the index of its entry;
* ``values`` and ``lengths``: the entries (distinct rows), in order of first appearance, laid
  out as a plain jagged column of ``len(lengths)`` rows.

The writer chooses it per mini-batch and column when it pays (:func:`pays`); readers decode each
entry once and hand repeated rows back as that one object, as ``pickle`` and ``torch.save`` do
for shared objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: a dictionary is used when at most this share of the rows is distinct
MAX_DISTINCT_SHARE = 0.5


def pays(rows: int, distinct: int) -> bool:
    """Whether ``rows`` rows holding ``distinct`` distinct values are worth a dictionary."""
    return rows >= 2 and distinct <= rows * MAX_DISTINCT_SHARE


def blob_codes(blobs: Sequence[bytes]) -> tuple[np.ndarray, list[bytes]]:
    """Per row, the index of its distinct blob, and the distinct blobs in order of first use.

    Rows that are one object cost one dictionary probe each (CPython caches a bytes object's
    hash and compares identity before value); equal rows that are different objects are found
    by value.
    """
    index: dict[bytes, int] = {}
    codes = np.fromiter((index.setdefault(b, len(index)) for b in blobs), dtype=np.int64, count=len(blobs))
    return codes, list(index)


def shared_blobs(rows: Sequence[Any], encode: Any) -> list[bytes]:
    """``encode(row)`` for every row, computed once per distinct object (rows that are the
    same Python object share one bytes object, which :func:`blob_codes` then finds at once)."""
    seen: dict[int, bytes] = {}
    out = []
    for r in rows:
        blob = seen.get(id(r))
        if blob is None:
            blob = seen[id(r)] = encode(r)
        out.append(blob)
    return out


def offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def repeated_rows(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Codes and entry rows of a jagged column's equal rows (bit-equal values), or None when
    there are too few repeats to pay (:func:`pays`).

    Returns ``(codes, entries)``: ``entries`` are the rows holding the distinct values (first
    appearances, ascending), ``codes[i]`` the index in ``entries`` of the entry row ``i``
    equals. Vectorised: rows are grouped by a signature (length and three of its values), then
    every row is compared with its group's first row; a row that differs is an entry itself.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = len(lengths)
    if rows < 2:
        return None
    bits = _bits(values)
    off = offsets(lengths)
    has = lengths > 0
    sig = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for probe in (off[:-1], off[:-1] + lengths // 2, off[1:] - 1):
        v = _probe(bits, np.where(has, probe, 0)) if len(bits) else np.zeros(rows, np.uint64)
        sig = (sig ^ np.where(has, v, np.uint64(0))) * np.uint64(0xBF58476D1CE4E5B9)
    _, first, inverse = np.unique(sig, return_index=True, return_inverse=True)
    if not pays(rows, len(first)):
        return None
    rep = first[inverse.reshape(-1)]  # the first row of the same signature
    rep = np.where(lengths[rep] == lengths, rep, np.arange(rows))
    total = int(off[-1])
    if total:
        # each value against the value at the same place of its row's representative
        where = np.repeat(off[:-1][rep] - off[:-1], lengths)
        where += np.arange(total, dtype=np.int64)
        diff = bits[where] != bits[:total]
        bad_values = np.flatnonzero(diff.any(axis=1) if diff.ndim > 1 else diff)
        if bad_values.size:  # rows that differ from their representative: entries of their own
            bad = np.unique(np.searchsorted(off, bad_values, side="right") - 1)
            rep[bad] = bad
    entries, codes = np.unique(rep, return_inverse=True)
    if not pays(rows, len(entries)):
        return None
    return codes.reshape(-1).astype(np.int64), entries


def _bits(values: np.ndarray) -> np.ndarray:
    """Each value (a row of the trailing shape) as one unsigned integer when it fits in 8
    bytes, else as a row of bytes: equal bits compare equal (NaNs, -0.0 included)."""
    flat = np.ascontiguousarray(values).reshape(len(values), int(np.prod(values.shape[1:], dtype=np.int64)))
    width = flat.shape[1] * flat.dtype.itemsize
    raw = flat.view(np.uint8).reshape(len(values), width)
    if width in (1, 2, 4, 8):
        return raw.view(f"<u{width}").reshape(-1)
    return raw


def _probe(bits: np.ndarray, at: np.ndarray) -> np.ndarray:
    picked = bits[at].astype(np.uint64)
    if picked.ndim == 1:
        return picked
    weights = np.arange(1, picked.shape[1] + 1, dtype=np.uint64) * np.uint64(0x100000001B3)
    return np.bitwise_xor.reduce(picked * weights, axis=1)


def gather_positions(lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Where the values of rows ``rows`` (in that order) of a jagged column lie."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    row_lengths = lengths[rows]
    starts = offsets(lengths)[:-1][rows]
    total = int(row_lengths.sum())
    return np.repeat(starts - offsets(row_lengths)[:-1], row_lengths) + np.arange(total, dtype=np.int64)


def gather_rows(values: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values and lengths of rows ``rows`` (in that order, repeats allowed) of a jagged
    column: a dictionary's entries expanded by their codes, or the entries picked from rows."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return values[gather_positions(lengths, rows)], lengths[np.asarray(rows, dtype=np.int64)]


def expand_objects(entries: Sequence[Any], codes: np.ndarray, container: str) -> Any:
    """Rows ``entries[codes[i]]`` as a list or a 1-d numpy object array (``container``)."""
    rows = [entries[c] for c in codes.tolist()]
    if container == "list":
        return rows
    out = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):  # not out[:] = rows: numpy would broadcast rows that are lists
        out[i] = r
    return out
