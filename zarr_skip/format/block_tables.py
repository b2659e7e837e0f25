"""The block index of an array's chunks as a record keeps it (pure: no I/O).

A chunk stored as a blosc frame of several blocks that each decode alone has, in its
record, where each block begins in the chunk and the crc32c of its header and table, then
of each block (:func:`chunks.block_index`), so that a read of a few rows fetches and decodes
only the blocks holding them (:mod:`zarr_skip.store.blockreads`).

A record keeps them in ``block_table``, three entries for all the array's chunks at once::

    {"counts": [blocks of chunk 0, of chunk 1, ...],     # 0: the chunk is read whole
     "starts": base64 of the block starts, uint32 little-endian, chunk after chunk,
     "crc32c": base64 of the crc32c values, uint32 little-endian: per chunk of k > 0 blocks,
               its header's, then its k blocks'}

JSON lists of thousands of ints cost a reader more to parse than the rest of the record (a
record of a large step: 0.5-0.7 ms with the lists, 0.16 ms with the tables as strings), and
their checks; these decode in one call each (then checked chunk by chunk, in C loops).
Records written before ``block_table`` keep the same numbers as two lists of lists,
``blocks`` and ``block_crc32c``, which readers still take (:func:`from_lists`).
"""

from __future__ import annotations

import base64
import binascii
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zarr_skip.errors import MetadataError
from zarr_skip.format import blosc_frames

#: the crc32c trailer every chunk ends with (:data:`records.CRC_BYTES`)
CRC_BYTES = 4
#: a chunk's block starts and checksums: one tuple per chunk (empty: read whole)
PerChunk = tuple[tuple[int, ...], ...]
#: an array's block index: each chunk's block starts, and its checksums
BlockIndex = tuple[PerChunk, PerChunk]


def to_json(starts: Sequence[Sequence[int]], crcs: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The ``block_table`` of an array whose chunk ``c`` has blocks beginning at ``starts[c]``
    and the checksums ``crcs[c]`` (two empty lists: read whole)."""
    return {
        "counts": [len(s) for s in starts],
        "starts": to_base64([x for s in starts for x in s]),
        "crc32c": to_base64([x for c in crcs for x in c]),
    }


def to_base64(values: Sequence[int] | np.ndarray) -> str:
    """``values`` (each in 0 .. 2**32-1) as a record keeps many numbers: base64 of uint32,
    little-endian."""
    return base64.b64encode(np.asarray(values, dtype="<u4").tobytes()).decode("ascii")


def from_base64(value: Any, what: str, where: str) -> np.ndarray:
    """The uint32 values of :func:`to_base64` (as read-only uint32), or MetadataError naming
    ``what`` and ``where`` when ``value`` is not such a string."""
    if not isinstance(value, str):
        raise MetadataError(f"{where}: {what} must be a base64 string")
    try:
        raw = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        raise MetadataError(f"{where}: {what} is not base64") from None
    if len(raw) % 4:
        raise MetadataError(f"{where}: {what} is not a whole number of uint32 values")
    return np.frombuffer(raw, dtype="<u4")


def from_json(table: Any, sizes: Sequence[int], where: str) -> BlockIndex:
    """Each chunk's block starts and checksums from a record's ``block_table``, once they
    add up and every chunk's starts are where its blocks can be (:func:`_check_starts`);
    MetadataError naming ``where`` for the first thing off."""
    if not isinstance(table, Mapping) or set(table) != {"counts", "starts", "crc32c"}:
        raise MetadataError(f"{where}: block_table must hold counts, starts and crc32c")
    counts = table["counts"]
    if not isinstance(counts, list) or len(counts) != len(sizes) or not all_ints(counts):
        raise MetadataError(f"{where}: block_table counts must list one int per chunk")
    if counts and min(counts) < 0:
        raise MetadataError(f"{where}: block_table counts must not be negative")
    starts = from_base64(table["starts"], "block_table starts", where).tolist()
    crcs = from_base64(table["crc32c"], "block_table crc32c", where).tolist()
    if len(starts) != sum(counts) or len(crcs) != sum(counts) + sum(1 for n in counts if n):
        raise MetadataError(
            f"{where}: block_table lists {len(starts)} starts and {len(crcs)} checksums for "
            f"{sum(counts)} blocks (and a header each) of {len(counts)} chunks"
        )
    per_chunk = _split(starts, counts, 0)
    for chunk_starts, size in zip(per_chunk, sizes, strict=True):
        if chunk_starts:
            _check_starts(chunk_starts, size, where)
    return per_chunk, _split(crcs, counts, 1)


def _check_starts(starts: Sequence[int], size: int, where: str) -> None:
    """A chunk's blocks begin after its header and table, rise, and end before its crc32c."""
    ends = [*starts, size - CRC_BYTES]
    if starts[0] != blosc_frames.table_bytes(len(starts)) or not all(map(operator.lt, ends, ends[1:])):
        raise MetadataError(f"{where}: a chunk's blocks must begin after its header, rise, and end before its checksum")


def _split(values: list[int], counts: Sequence[int], extra: int) -> PerChunk:
    """``values`` cut into one tuple per chunk: ``counts[c] + extra`` of them (none for 0)."""
    out, at = [], 0
    for n in counts:
        k = n + extra if n else 0
        out.append(tuple(values[at : at + k]))
        at += k
    return tuple(out)


def from_lists(blocks: Any, sums: Any, sizes: Sequence[int], where: str) -> BlockIndex | None:
    """The same from a record's ``blocks`` and ``block_crc32c`` lists (records written before
    ``block_table``); None when it has neither."""
    if blocks is None and sums is None:
        return None
    if not isinstance(blocks, list) or not isinstance(sums, list) or not len(blocks) == len(sums) == len(sizes):
        raise MetadataError(f"{where}: blocks and block_crc32c must list one entry per chunk")
    for starts, crcs, size in zip(blocks, sums, sizes, strict=True):
        if not isinstance(starts, list) or not isinstance(crcs, list) or not all_ints(starts) or not all_ints(crcs):
            raise MetadataError(f"{where}: each chunk's blocks and block_crc32c must be lists of ints")
        if not starts and not crcs:
            continue
        if not starts or len(crcs) != len(starts) + 1 or min(crcs) < 0 or max(crcs) >> 32:
            raise MetadataError(f"{where}: block_crc32c must list one 32-bit value per block and one for the header")
        _check_starts(starts, size, where)
    return tuple(tuple(s) for s in blocks), tuple(tuple(c) for c in sums)


def all_ints(values: list[Any]) -> bool:
    """Every value an int (not a bool): a loop in C, as records list thousands."""
    return {*map(type, values)} <= {int}


def of_array(a: Mapping[str, Any], sizes: Sequence[int], where: str) -> BlockIndex | None:
    """The block index of a record's array entry ``a`` (checked), in whichever form it keeps
    it; None when it keeps none (its chunks are read whole)."""
    if "block_table" in a:
        if "blocks" in a or "block_crc32c" in a:
            raise MetadataError(f"{where}: both a block_table and blocks lists")
        return from_json(a["block_table"], sizes, where)
    return from_lists(a.get("blocks"), a.get("block_crc32c"), sizes, where)
