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
from numpy.typing import NDArray

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


#: values of each row put into its first signature (evenly spread, first and last included)
PROBES = 8


def repeated_rows(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Codes and entry rows of a jagged column's equal rows (bit-equal values), or None when
    there are too few repeats to pay (:func:`pays`).

    Returns ``(codes, entries)``: ``entries`` are the rows holding the distinct values (first
    appearances, ascending), ``codes[i]`` the index in ``entries`` of the entry row ``i``
    equals. Vectorised: rows are grouped by a signature (length and :data:`PROBES` of its
    values), then every row is compared with its group's first row. Rows alike at the probes
    but different elsewhere (rare) make the grouping start again from a signature of all of
    their values, so that equal rows still share one entry.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = len(lengths)
    if rows < 2 or not pays(rows, len(np.unique(lengths))):
        return None  # rows of different lengths differ: sampled responses end here, unprobed
    bits = _bits(values)
    off = offsets(lengths)
    has = lengths > 0
    last = np.maximum(lengths - 1, 0)
    sig = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for j in range(PROBES):
        probe = off[:-1] + last * j // (PROBES - 1)
        v = _probe(bits, np.where(has, probe, 0)) if len(bits) else np.zeros(rows, np.uint64)
        sig = (sig ^ np.where(has, v, np.uint64(0))) * np.uint64(0xBF58476D1CE4E5B9)
    grouped = _grouped(bits, off, lengths, sig)
    if grouped is None:
        return None  # rows whose probes differ differ: a finer grouping cannot make it pay
    rep, exact = grouped
    if not exact:  # rows alike at the probes differ elsewhere: group them by all of their values
        grouped = _grouped(bits, off, lengths, sig ^ _content(bits, off, lengths))
        if grouped is None:
            return None
        rep = grouped[0]
    entries, codes = np.unique(rep, return_inverse=True)
    if not pays(rows, len(entries)):
        return None
    return codes.reshape(-1).astype(np.int64), entries


def _grouped(bits: np.ndarray, off: np.ndarray, lengths: np.ndarray, sig: np.ndarray) -> tuple[np.ndarray, bool] | None:
    """Per row, the row it is stored as: the first row of its signature if their values are
    equal, else itself; and whether every row equalled its signature's first row. None when
    the signatures alone show it cannot pay."""
    rows = len(lengths)
    _, first, inverse = np.unique(sig, return_index=True, return_inverse=True)
    if not pays(rows, len(first)):
        return None
    rep = first[inverse.reshape(-1)]  # the first row of the same signature
    rep = np.where(lengths[rep] == lengths, rep, np.arange(rows))
    exact = True
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
            exact = False
    return rep, exact


def _content(bits: np.ndarray, off: NDArray[np.int64], lengths: np.ndarray) -> NDArray[np.uint64]:
    """A signature of each row over all of its values and their positions (wrapping uint64
    arithmetic); equal rows get equal signatures, and the caller still compares the values."""
    total = int(off[-1])
    if not total:
        return np.zeros(len(lengths), np.uint64)
    vals = _probe(bits, np.arange(total)) if bits.ndim > 1 else bits[:total].astype(np.uint64)
    pos = (np.arange(total, dtype=np.int64) - np.repeat(off[:-1], lengths)).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (vals ^ (pos * np.uint64(0x94D049BB133111EB))) * np.uint64(0xD6E8FEB86659FD93)
        mixed ^= mixed >> np.uint64(29)
        sums: NDArray[np.uint64] = np.concatenate([np.zeros(1, np.uint64), np.cumsum(mixed, dtype=np.uint64)])
        return sums[off[1:]] - sums[off[:-1]]


def _bits(values: np.ndarray) -> np.ndarray:
    """Each value (a row of the trailing shape) as one unsigned integer when it fits in 8
    bytes, else as a row of bytes: equal bits compare equal (NaNs, -0.0 included)."""
    flat = np.ascontiguousarray(values).reshape(len(values), int(np.prod(values.shape[1:], dtype=np.int64)))
    width = flat.shape[1] * flat.dtype.itemsize
    raw = flat.view(np.uint8).reshape(len(values), width)
    if width in (1, 2, 4, 8):
        return raw.view(f"<u{width}").reshape(-1)
    return raw


def _probe(bits: np.ndarray, at: NDArray[np.intp]) -> NDArray[np.uint64]:
    picked = bits[at].astype(np.uint64)
    if picked.ndim == 1:
        return picked
    weights = np.arange(1, picked.shape[1] + 1, dtype=np.uint64) * np.uint64(0x100000001B3)
    folded: NDArray[np.uint64] = np.bitwise_xor.reduce(picked * weights, axis=1)  # a ufunc's reduce is typed Any
    return folded


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
