"""Reading some blocks of a chunk: the rows a read wants of a chunk made of several blosc blocks.

Blosc compresses a chunk block by block, each block on its own (see
:mod:`zarr_skip.format.blosc_frames`). When the chunks of an array are several blocks (a blosc
codec whose ``blocksize`` is below the chunk's size: the integer values of jagged columns when
:data:`chunks.VALUES_BLOCK_BYTES` is set below the chunk size, or an explicit codec), the
record of a packed mini-batch (format 4) keeps, for each such chunk, where each block begins
and the crc32c of the chunk's header and table and of each block (``blocks`` and
``block_crc32c``, checked by :func:`records.check_column`). A read of some rows of such a chunk
then fetches only its header and table and the blocks holding those rows (pieces at most
:data:`GAP_BYTES` apart as one range, farther on an object store, with the other chunks of the read:
:func:`fetching.fetch_chunks`) and decodes those blocks alone. (Values chunks fetched whole
ahead of their rows' lengths, as a read of a few rows from an object store does to wait for one
round of requests instead of two, are decoded whole.)

What a partial read guarantees: every byte it hands to blosc has the crc32c the record names
for it (the header and table, and each block read), and the header agrees with the record
(block size, count and starts, decoded size, element size); a block that is missing, cut short,
altered or moved is a MissingDataError or ChecksumError, as a whole chunk would be. It does not
read, so does not check, the chunk's other blocks nor its trailing crc32c of the whole chunk:
``verify`` and whole-chunk reads do. Chunks whose record has no block index (formats 2 and 3,
records of older writers, chunks of one block or stored uncompressed) and reads needing more
than :data:`MAX_SHARE` of a chunk's blocks read the whole chunk.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ChecksumError, MissingDataError
from zarr_skip.format import blosc_frames, chunks, records, zstd_blocks

if TYPE_CHECKING:
    from zarr_skip.store.reads import ArrayPart

#: a read needing more than this share of a chunk's blocks reads the whole chunk (one read, one
#: decode call, and the checksum of the whole chunk)
MAX_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Piece:
    """A byte range of a data file, fetched as :func:`fetching.fetch_chunks` fetches a chunk."""

    file: str
    start: int
    length: int
    #: the most bytes read between this piece and a neighbour of another chunk: the gap its
    #: plan merged pieces at (:func:`plan`; :func:`fetching.fetch_chunks` reads no more than
    #: its own limit on local files)
    max_hole: int

    def key(self, _chunk: int) -> str:
        return self.file

    def span(self, _chunk: int) -> tuple[int, int]:
        return (self.start, self.length)


#: pieces of a chunk at most this many bytes apart are fetched as one range (reading the bytes
#: between costs less than another request); an object store's reads step over far more
#: (:attr:`Storage.hole_bytes`)
GAP_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """What a read of some rows of chunk ``chunk`` of ``array`` fetches (``pieces``), and where
    in them (``cuts``: piece, offset, length) lie the chunk's header and table, then each of the
    blocks ``blocks``."""

    array: ArrayPart
    chunk: int
    blocks: tuple[int, ...]
    pieces: tuple[Piece, ...]
    cuts: tuple[tuple[int, int, int], ...]
    #: rows per block when each block holds whole rows (:func:`decode` then gives the rows of
    #: the blocks alone, back to back: :meth:`moved` says where), else 0 (the chunk's rows)
    per: int

    @property
    def nbytes(self) -> int:
        """The bytes its blocks decode to (at most)."""
        return len(self.blocks) * self.array.compression.blocksize

    def moved(self, src: slice | np.ndarray) -> slice | np.ndarray:
        """Rows ``src`` of the chunk (a slice of rows in consecutive blocks of the plan, or an
        array of rows in its blocks) as rows of what :func:`decode` gives."""
        if not self.per:
            return src
        if isinstance(src, slice):
            if src.start >= src.stop:
                return slice(0, 0)
            block = src.start // self.per
            shift = (block - bisect.bisect_left(self.blocks, block)) * self.per
            return slice(src.start - shift, src.stop - shift)
        rows = np.asarray(src, dtype=np.int64)
        block = rows // self.per
        moved: np.ndarray = rows - (block - np.searchsorted(np.asarray(self.blocks), block)) * self.per
        return moved


def plan(
    a: ArrayPart, c: int, src: slice | np.ndarray | tuple[tuple[int, int], ...], gap: int | None = None
) -> BlockPlan | None:
    """The blocks of chunk ``c`` of ``a`` holding its rows ``src`` (a slice, an array of row
    numbers in the chunk, or ``(start, stop)`` runs of them), when its record indexes its
    blocks and they are few enough; None to read the whole chunk. Its pieces are at least
    ``gap`` bytes apart (None: :data:`GAP_BYTES`), and may be read with others as close."""
    gap = GAP_BYTES if gap is None else gap
    starts = None if a.file is None or a.blocks is None else a.blocks[c]
    block = a.compression.blocksize
    row = a.chunk_bytes // a.chunk
    if not starts or block <= 0 or not 0 < row <= block or -(-a.chunk_bytes // block) != len(starts):
        return None
    if isinstance(src, slice):
        if src.start >= src.stop:
            return None
        needed: Sequence[int] = range(src.start * row // block, (src.stop * row - 1) // block + 1)
    elif isinstance(src, tuple):  # runs of rows: (start, stop) pairs, a few: no numpy calls
        needed = sorted({k for lo, hi in src if lo < hi for k in range(lo * row // block, (hi * row - 1) // block + 1)})
    else:
        rows = np.asarray(src, dtype=np.int64)
        hit = np.bincount(rows * row // block, minlength=len(starts)) > 0
        if block % row:  # a row may end in the next block
            hit |= np.bincount((rows * row + row - 1) // block, minlength=len(starts)) > 0
        needed = np.flatnonzero(hit).tolist()
    if not needed or len(needed) > MAX_SHARE * len(starts):
        return None
    base = a.offset + a.starts[c]
    ends = (*starts[1:], a.sizes[c] - records.CRC_BYTES)
    wanted = [(base, starts[0])] + [(base + starts[k], ends[k] - starts[k]) for k in needed]
    spans: list[list[int]] = []  # [start, end] of each piece
    cuts = []
    for start, length in wanted:  # rising: merged with the last piece when close to it
        if spans and start - spans[-1][1] <= gap:
            spans[-1][1] = start + length
        else:
            spans.append([start, start + length])
        cuts.append((len(spans) - 1, start - spans[-1][0], length))
    pieces = tuple(Piece(a.file, lo, hi - lo, gap) for lo, hi in spans)  # type: ignore[arg-type]  # a.file is set (above)
    return BlockPlan(a, c, tuple(int(k) for k in needed), pieces, tuple(cuts), 0 if block % row else block // row)


def decode(p: BlockPlan, blobs: Sequence[Any], where: str) -> np.ndarray:
    """The rows of the blocks of ``p`` (of chunk ``p.chunk`` of ``p.array``, of its stored
    dtype) decoded from ``blobs`` (the bytes of ``p.pieces``): when each block holds whole rows
    (``p.per``), those of its blocks back to back (a chunk's row ``r`` is row
    ``p.moved(r)``), else all the chunk's rows, those of other blocks undefined.

    Raises
    ------
    MissingDataError
        A piece is absent or shorter than its record says (the data file was cut short).
    ChecksumError
        A piece's crc32c is not the one its record names, the header disagrees with the
        record, or a block does not decode to its size.
    """
    a, c = p.array, p.chunk
    for piece, blob in zip(p.pieces, blobs, strict=True):
        if blob is None:
            raise MissingDataError(f"{where}: chunk is missing")
        if len(blob) != piece.length:
            raise MissingDataError(
                f"{where}: bytes {piece.start}..{piece.start + piece.length} of the data file are cut "
                f"at {len(blob)} (truncated?)"
            )
    items = [np.frombuffer(blobs[i], np.uint8, n, at) for i, at, n in p.cuts]  # no copies
    sums = a.block_crcs[c]  # type: ignore[index]  # set with a.blocks (records.check_column)
    recorded = (sums[0], *(sums[k + 1] for k in p.blocks))
    for k, item, crc in zip((-1, *p.blocks), items, recorded, strict=True):
        if chunks.crc32c(item) != crc:
            raise ChecksumError(
                f"{where}: {'header' if k < 0 else f'block {k}'}: checksum mismatch (recorded {crc:#010x})"
            )
    head = _checked_header(a, c, items[0], where)
    # the blocks in one frame, decoded in one call: a call per block cost a codec context each
    # (~10 us of the ~35 an 8 KiB zstd block costs)
    blocks = np.empty(head.gathered_bytes(p.blocks), dtype=np.uint8)
    codec: Any = a.compression.codec()
    try:
        if not zstd_blocks.decode_blocks(codec, head, p.blocks, items[1:], blocks):
            codec.decode(blosc_frames.gathered_frame(head, p.blocks, items[1:]), out=blocks)
    except (ValueError, RuntimeError) as exc:
        raise ChecksumError(f"{where}: blocks {list(p.blocks)} do not decode ({exc})") from None
    if p.per:  # whole rows: taken from here (putting them in a chunk first cost ~8% more)
        return blocks.view(a.dtype).reshape(-1, *a.shape[1:])
    out = np.empty((a.chunk, *a.shape[1:]), dtype=a.dtype)  # each run of consecutive blocks in its place
    flat = out.reshape(-1).view(np.uint8)
    size = head.blocksize
    at = 0
    for first, count in _runs(p.blocks):
        n = min(count * size, len(blocks) - at)
        flat[first * size : first * size + n] = blocks[at : at + n]
        at += n
    return out


def _runs(blocks: Sequence[int]) -> list[tuple[int, int]]:
    """``blocks`` (rising) as runs of consecutive ones: ``(first, count)`` each."""
    runs: list[tuple[int, int]] = []
    for k in blocks:
        if runs and runs[-1][0] + runs[-1][1] == k:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((k, 1))
    return runs


def _checked_header(a: ArrayPart, c: int, piece: Any, where: str) -> blosc_frames.Header:
    """The header of chunk ``c`` of ``a`` (its checksum already checked), once it agrees with
    the record: a frame of the chunk's decoded size in blocks of the codec's size, each one
    stream, of the array's element size, whose table is the record's block starts."""
    head = blosc_frames.parse_header(piece)
    starts = a.blocks[c]  # type: ignore[index]
    fits = (
        head is not None
        and head.one_stream_per_block
        and head.typesize == a.dtype.itemsize
        and head.nbytes == a.chunk_bytes
        and head.blocksize == a.compression.blocksize
        and head.blocks == len(starts)
        and head.cbytes == a.sizes[c] - records.CRC_BYTES
        and len(piece) == blosc_frames.table_bytes(len(starts))
        and struct.unpack_from(f"<{len(starts)}I", piece, blosc_frames.HEADER_BYTES) == tuple(starts)
    )
    if not fits or head is None:
        raise ChecksumError(f"{where}: the chunk's header does not match the blocks its record names")
    return head
