"""Chunk bytes and array metadata (pure: no store, no torch).

Every array is chunked along rows only. A chunk is encoded exactly as zarr v3's codec chain
``bytes(little) -> zstd | blosc | nothing -> crc32c`` would encode it, so ``zarr.open_array`` reads
what we write; we encode and decode ourselves to check each chunk's presence, size and checksum
(zarr silently returns fill values for a missing chunk) and to decode straight into the output.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeGuard, get_args

import google_crc32c
import numcodecs
import numpy as np

from zarr_skip.errors import ChecksumError, ConfigError, MissingDataError
from zarr_skip.format import blosc_frames, lz4_blocks, zstd_blocks

#: raw bytes per chunk aimed for; a column smaller than this is one chunk per mini-batch, a
#: larger one a shard (one file) of such chunks
DEFAULT_CHUNK_BYTES = 512 << 10

#: blosc block size of ``auto`` (at most; a smaller chunk is one block): zstd's entropy tables
#: pay off over large blocks (blosc's own choice at level 1 is far smaller and costs 2-4% of the
#: size and 20% of the speed)
AUTO_BLOCK_BYTES = 1 << 20


#: blosc's ``MIN_BUFFERSIZE``: the smallest block size it keeps (it raises a smaller one to it)
#: and the smallest buffer it compresses (it stores a smaller one as it is)
MIN_BLOCK_BYTES = 128
#: a block size a cache is written with is a multiple of this, the widest item size stored
#: (complex128): blosc rounds a block size down to a multiple of the item size
BLOCK_ALIGN = 16

#: the compressions a cache may be written with (``auto`` picks per array)
CompressionName = Literal["auto", "zstd", "blosc-zstd", "lz4", "none"]
#: blosc's byte shuffling
Shuffle = Literal["noshuffle", "shuffle", "bitshuffle"]
_SHUFFLES: dict[str, int] = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_BLOSC = {"blosc-zstd": "zstd", "lz4": "lz4"}  # our name -> blosc's cname
_NAMES: tuple[CompressionName, ...] = get_args(CompressionName)


def is_compression_name(name: object) -> TypeGuard[CompressionName]:
    """Whether ``name`` is one of the compression names."""
    return isinstance(name, str) and name in _NAMES


def crc32c(data: bytes | memoryview | np.ndarray) -> int:
    """The crc32c of ``data`` (google-crc32c takes bytes or a contiguous array, not a memoryview)."""
    return int(google_crc32c.value(data if isinstance(data, (bytes, np.ndarray)) else np.frombuffer(data, np.uint8)))


@dataclass(frozen=True, slots=True)
class Compression:
    """How chunks are compressed.

    ``auto`` (the default) picks per array: blosc with byte-shuffling and zstd level 1 in blocks
    of up to 1 MiB (a default 512 KiB chunk is one block) for every type wider than a byte (token
    ids, log-probs, lengths), plain zstd level 1 for bytes (masks, strings). Shuffling puts the
    bytes of equal significance together, which made token ids 20% smaller and twice as fast to
    compress as plain zstd, and log-probs 6% smaller than blosc-lz4 with bit-shuffling (see
    ``benchmarks/README.md``). Explicit choices:
    ``zstd`` (level -7..22), ``blosc-zstd`` (level 0..9), ``lz4`` (blosc-lz4, level 0..9), both
    blosc ones with ``shuffle`` and ``blocksize`` (bytes, 0 = blosc's choice; a cache is written
    only with one blosc keeps: :meth:`writable`), or ``none``.
    ``auto`` with a ``blocksize`` stores the token ids (integer values of jagged columns) in
    blosc-zstd blocks of that size, which reads of a few rows fetch and decode alone: for caches
    sampled row by row (data loaders), at the cost of slower whole reads (:func:`array_codec`).
    ``lz4`` with a ``blocksize`` stores every array in lz4 blocks of that size, which zarr_skip
    writes itself (:mod:`~zarr_skip.format.lz4_blocks`; blosc would make them 64 KiB or more):
    the fastest reads of a few rows and whole reads as fast as the default, for ~1.25x its
    bytes (``benchmarks/README.md``).
    """

    name: CompressionName = "auto"
    level: int = 1
    shuffle: Shuffle = "shuffle"
    blocksize: int = 0

    def __post_init__(self) -> None:
        if self.name not in _NAMES:
            raise ConfigError(f"compression: expected one of {', '.join(map(repr, _NAMES))}, got {self.name!r}")
        if isinstance(self.level, bool) or not isinstance(self.level, int):
            raise ConfigError(f"level: expected an int, got {self.level!r}")
        if self.name == "zstd" and not -7 <= self.level <= 22:
            raise ConfigError(f"level: zstd levels run from -7 to 22, got {self.level}")
        if self.name in _BLOSC and not 0 <= self.level <= 9:
            raise ConfigError(f"level: blosc levels run from 0 to 9, got {self.level}")
        if self.shuffle not in _SHUFFLES:
            raise ConfigError(f"shuffle: expected one of {sorted(_SHUFFLES)}, got {self.shuffle!r}")
        if isinstance(self.blocksize, bool) or not isinstance(self.blocksize, int) or self.blocksize < 0:
            raise ConfigError(f"blocksize: expected a byte count >= 0, got {self.blocksize!r}")

    @property
    def is_blosc(self) -> bool:
        """Whether chunks are blosc frames (``blosc-zstd``, ``lz4``): blocks with a table."""
        return self.name in _BLOSC

    def for_dtype(self, dtype: np.dtype) -> Compression:
        """The concrete codec for an array of ``dtype`` (resolves ``auto``)."""
        if self.name != "auto":
            return self
        if dtype.itemsize > 1:
            return Compression("blosc-zstd", self.level, "shuffle", AUTO_BLOCK_BYTES)
        return Compression("zstd", self.level)

    def codec(self) -> numcodecs.abc.Codec | None:
        """The numcodecs codec (one per setting, shared: codecs keep no state between calls)."""
        return _codec(self)

    def _make_codec(self) -> numcodecs.abc.Codec | None:
        if self.name == "zstd":
            return numcodecs.Zstd(level=self.level)
        if self.name in _BLOSC:
            # numcodecs' Blosc; small zstd blocks decoded by zstandard, small lz4 blocks written here
            kind = lz4_blocks.Blosc if self.name == "lz4" and self.blocksize else zstd_blocks.Blosc
            return kind(
                cname=_BLOSC[self.name],
                clevel=self.level,
                shuffle=_SHUFFLES[self.shuffle],
                blocksize=self.blocksize,
            )
        if self.name == "none":
            return None
        raise ConfigError("compression: resolve 'auto' with for_dtype() first")

    def zarr_codecs(self, dtype: np.dtype) -> list[dict[str, Any]]:
        """The zarr v3 ``codecs`` list describing how chunks of ``dtype`` are encoded."""
        chain: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if self.name == "zstd":
            chain.append({"name": "zstd", "configuration": {"level": self.level, "checksum": False}})
        elif self.name in _BLOSC:
            chain.append(
                {
                    "name": "blosc",
                    "configuration": {
                        "typesize": dtype.itemsize,
                        "cname": _BLOSC[self.name],
                        "clevel": self.level,
                        "shuffle": self.shuffle,
                        "blocksize": self.blocksize,
                    },
                }
            )
        chain.append({"name": "crc32c"})
        return chain

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "level": self.level, "shuffle": self.shuffle}
        if self.blocksize:
            doc["blocksize"] = self.blocksize
        return doc

    @classmethod
    def parse(cls, value: str | Compression | None, level: int | None = None) -> Compression:
        """``"auto"``, ``"zstd"``, ``"zstd:3"``, ``"blosc-zstd"``, ``"lz4"``, ``"none"`` or ``None``;
        or a :class:`Compression` to write with (see :meth:`writable`)."""
        if isinstance(value, Compression):
            return value.writable()
        if value is None:
            return cls("none", 0)
        name, _, lvl = str(value).partition(":")
        if not is_compression_name(name):
            raise ConfigError(f"compression: expected one of {', '.join(map(repr, _NAMES))}, got {name!r}")
        if lvl:
            try:
                level = int(lvl)
            except ValueError:
                raise ConfigError(f"compression: bad level in {value!r}") from None
        default = {"auto": 1, "zstd": 3, "blosc-zstd": 1, "lz4": 5, "none": 0}.get(name, 0)
        return cls(name, default if level is None else level)

    def writable(self) -> Compression:
        """This setting, once sure that chunks written with it are what it says.

        A ``blocksize`` is one blosc keeps for every array: from :data:`MIN_BLOCK_BYTES` on, a
        multiple of :data:`BLOCK_ALIGN` (blosc raises a smaller one and rounds one down to a
        multiple of the item size, so a record's block size would not be the frames'). blosc-lz4
        does not keep one (it makes blocks of at least 64 KiB, split by byte): zarr_skip writes
        lz4 frames of such blocks itself (:mod:`zarr_skip.format.lz4_blocks`), byte-shuffled or
        not, so lz4 with a ``blocksize`` takes no bit shuffle. Records of caches already
        written keep theirs (they are read with the constructor).

        Raises
        ------
        ConfigError
            A ``blocksize`` blosc would change, ``lz4`` with one and a bit shuffle, or ``zstd``
            and ``none`` with one.
        """
        if self.blocksize and not self.is_blosc and self.name != "auto":
            raise ConfigError(f"blocksize: {self.name} has no blocks (blosc-zstd, lz4 and auto do); leave it at 0")
        if self.blocksize and (self.blocksize < MIN_BLOCK_BYTES or self.blocksize % BLOCK_ALIGN):
            raise ConfigError(
                f"blocksize: blosc does not keep a block size of {self.blocksize} bytes (it raises one below "
                f"{MIN_BLOCK_BYTES} and rounds one down to a multiple of each array's item size); use 0 "
                f"(blosc's choice) or a multiple of {BLOCK_ALIGN} from {MIN_BLOCK_BYTES} on, such as 8 << 10"
            )
        if self.name == "lz4" and self.blocksize and self.shuffle == "bitshuffle":
            raise ConfigError(
                f"shuffle: lz4 in blocks of {self.blocksize} bytes is written byte-shuffled or not "
                "('shuffle' or 'noshuffle'); for a bit shuffle leave blocksize at 0 (blosc's own blocks)"
            )
        return self


@functools.lru_cache(maxsize=64)
def _codec(compression: Compression) -> numcodecs.abc.Codec | None:
    return compression._make_codec()


#: raw bytes per chunk aimed for in the integer values of a jagged column compressed with blosc
#: (token ids). Smaller chunks were tried: on a quiet machine (realistic medium step, 4
#: mini-batches, 7 reps, ``benchmarks/few_rows.py --values-chunk`` of edbb65f), 64 KiB chunks left the cold
#: read of 64 random rows as it was (15.2-15.3 ms against 14.4-15.0 ms at 512 KiB: it is bound by
#: opening the step and the records, not by the chunks it decodes) while the whole column's read
#: went from 13.6-14.1 ms to 17.6-20.8 ms and the step took 1.2% more bytes, so the values keep
#: the default chunk size; the knob stays for arrays where a few rows do cost their chunks
VALUES_CHUNK_BYTES = DEFAULT_CHUNK_BYTES

#: how many times :data:`VALUES_CHUNK_BYTES` (or a smaller ``chunk_bytes``) those values
#: aim for when stored in smaller blosc blocks (``Compression("auto", blocksize=...)``): a read
#: of a few rows fetches and decodes their blocks alone, so a chunk's size sets only what each
#: chunk a read touches costs (a request, a header and table checked, a codec call: ~0.2 ms of
#: Python in all) and how many threads decode a whole column. On a quiet machine (realistic step
#: in 4 mini-batches, blocks of 8 KiB, cold, ratio of 64 random rows of ``responses`` to the
#: whole column, medians of alternated runs), chunks of 2 MiB instead of 512 KiB took the
#: medium step from 0.516 to 0.458 (64 rows in 10.3 ms, was 11.4; the whole column 22.5 ms,
#: was 22.2) and the large one from 0.151 to 0.137; 8 MiB took the large one to 0.118 but
#: leaves a mini-batch of the medium step one chunk, decoded by one thread when read whole.
#: Bytes and write times did not change beyond noise
BLOCKED_VALUES_CHUNKS = 4


#: blosc block size of ``auto`` for the integer values of a jagged column (token ids). Smaller
#: blocks let a read of a few rows fetch and decode only the blocks holding them
#: (:mod:`zarr_skip.store.blockreads`), but each block decodes on its own, which costs: on the
#: realistic medium step's responses (loaded machine, one thread, 512 KiB chunks), blocks of
#: 1 MiB / 128 / 64 / 32 / 16 KiB stored 0.353 / 0.367 / 0.367 / 0.369 / 0.376 of the raw bytes
#: and decoded a chunk in 0.41 / 0.60 / 0.69 / 0.88 / 1.1 ms, so that 64 random rows of 1024
#: decode in 6.2 / 6.2 / 4.6 / 3.8 / 3.0 ms and the whole column in 6.2 / 8.9 / 10.3 / 13.2 /
#: 16.6 ms. Through the reader (CPU time of all threads, warm, 4 mini-batches), 32 KiB blocks
#: took 64 random rows from 10 to 9 ms on the medium step and from 29 to 13 ms on the large one
#: (4096 rows), but the whole column from 13 to 21 ms and from 98 to 157 ms, for 1.4% more
#: bytes. Reading whole steps is what a cache is for, so the values keep one block per chunk;
#: the knob (or an explicit codec's ``blocksize``) stays for caches read mostly a few rows at a
#: time (``Compression("auto", blocksize=...)``; ``benchmarks/few_rows.py`` compares them)
VALUES_BLOCK_BYTES = AUTO_BLOCK_BYTES


def array_codec(name: str, compression: Compression, dtype: np.dtype) -> Compression:
    """The codec array ``name`` of ``dtype`` is stored with: ``compression`` resolved for
    ``dtype``; under ``auto``, the integer values of a jagged column (token ids) in blocks of
    ``compression.blocksize`` when given (``Compression("auto", blocksize=32 << 10)``: a cache
    read mostly a few rows at a time), else :data:`VALUES_BLOCK_BYTES`. An explicit codec is
    kept as given."""
    return _array_codec(name == "values", compression, dtype, VALUES_BLOCK_BYTES)


@functools.lru_cache(maxsize=256)  # a write asks for each of its arrays' codec several times
def _array_codec(values: bool, compression: Compression, dtype: np.dtype, values_block: int) -> Compression:
    codec = compression.for_dtype(dtype)
    if compression.name == "auto" and values and codec.name in _BLOSC and dtype.kind in "iu":
        return replace(codec, blocksize=compression.blocksize or values_block)
    return codec


def block_index(blob: bytes | memoryview, blocksize: int) -> tuple[list[int], list[int]]:
    """Of a stored chunk (a blosc frame and its crc32c) of several blocks of ``blocksize`` bytes
    (its codec's, which readers count blocks in) that decode alone: where each block begins in
    it, and the crc32c of its header and table, then of each block (what a record keeps so that
    a reader can fetch, check and decode some blocks alone); two empty lists for any other chunk
    (read whole), such as a frame whose blocks blosc made of another size."""
    body = memoryview(blob)[:-4]
    starts = blosc_frames.block_starts(body)
    head = blosc_frames.parse_header(body)
    if starts is None or head is None or head.blocksize != blocksize:
        return [], []
    cuts = (0, *starts, len(body))
    return list(starts), [crc32c(body[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]


def chunk_target(name: str, codec: Compression, dtype: np.dtype, chunk_bytes: int) -> int:
    """Raw bytes per chunk aimed for in array ``name`` of ``dtype`` stored with ``codec``:
    ``chunk_bytes``, at most :data:`VALUES_CHUNK_BYTES` for the integer values of a jagged
    column in a blosc codec (token ids: a few rows read little; floats, text and JSON lose more
    in small chunks and keep ``chunk_bytes``), :data:`BLOCKED_VALUES_CHUNKS` times that when
    they are stored in smaller blosc blocks (read by the block)."""
    if name == "values" and codec.name in _BLOSC and dtype.kind in "iu":
        target = min(chunk_bytes, VALUES_CHUNK_BYTES)
        return target * BLOCKED_VALUES_CHUNKS if 0 < codec.blocksize < target else target
    return chunk_bytes


def chunk_rows(rows: int, row_bytes: int, target: int = DEFAULT_CHUNK_BYTES) -> int:
    """Rows per chunk: all rows when small, else about ``target`` raw bytes per chunk."""
    if rows == 0:
        return 1
    per = max(1, target // max(1, row_bytes))
    return min(rows, per)


def chunk_count(rows: int, per_chunk: int) -> int:
    return math.ceil(rows / per_chunk) if rows else 0


def first_rows(lengths: np.ndarray, per_chunk: int) -> list[int]:
    """For each chunk of a jagged column's values, the row its first value belongs to.

    ``lengths`` are the rows' value counts; chunk ``k`` starts at value ``k * per_chunk``.
    Stored with the values of a multi-chunk column, so that a reader knows which chunks hold
    some rows' values before it has read their lengths (see :func:`chunks_of_rows`).
    """
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    count = chunk_count(int(ends[-1]) if len(ends) else 0, per_chunk)
    starts = np.arange(count, dtype=np.int64) * per_chunk
    return [int(r) for r in np.searchsorted(ends, starts, side="right")]


def chunks_of_rows(first: Sequence[int], start: int, stop: int) -> range:
    """The chunks that may hold values of rows ``start:stop``, given each
    chunk's :func:`first_rows`: chunk ``k`` holds values of rows ``first[k] .. first[k+1]``
    at most, so this is every chunk whose span meets ``start .. stop-1`` (sometimes one chunk
    more than the values need, when a row starts exactly at a chunk's end; none for no rows)."""
    if start >= stop or not first:
        return range(0)
    lo = bisect.bisect_left(first, start, 1) - 1  # the first chunk whose next one starts at a row >= start
    hi = bisect.bisect_right(first, stop - 1)  # the chunks whose first row is < stop
    return range(lo, max(lo, hi))


def full_chunk(data: np.ndarray, rows: int) -> np.ndarray:
    """``data`` padded with zero rows to ``rows``: zarr stores every chunk at the full chunk
    shape, the last one of an array included (its rows beyond the array are fill values)."""
    if data.shape[0] == rows:
        return data
    out = np.zeros((rows, *data.shape[1:]), dtype=data.dtype)
    out[: data.shape[0]] = data
    return out


def encode(data: np.ndarray, compression: Compression) -> bytes:
    """Encode one chunk: little-endian bytes, compressed, with the crc32c appended."""
    raw = np.ascontiguousarray(data)
    codec = compression.codec()
    body = raw.tobytes() if codec is None else bytes(codec.encode(raw))
    return with_crc(body)


def with_crc(body: bytes) -> bytes:
    """``body`` with its crc32c appended (zarr's ``crc32c`` codec): a chunk or shard index as stored."""
    return body + np.uint32(crc32c(body)).tobytes()


def trailer(blob: bytes) -> int:
    """The crc32c a chunk ends with (of the bytes before it)."""
    return int.from_bytes(blob[-4:], "little")


def _checked_body(blob: bytes | None, stored_size: int, where: str, crc: int | None) -> memoryview:
    if blob is None:
        raise MissingDataError(f"{where}: chunk is missing")
    if len(blob) > stored_size:
        raise MissingDataError(f"{where}: chunk holds more than the {stored_size} bytes written (replaced?)")
    if len(blob) != stored_size:
        raise MissingDataError(f"{where}: chunk has {len(blob)} bytes, {stored_size} were written (truncated?)")
    body = memoryview(blob)[:-4]
    found = trailer(blob)
    if crc32c(body) != found:
        raise ChecksumError(f"{where}: checksum mismatch (stored {found:#010x})")
    if crc is not None and found != crc:
        raise ChecksumError(
            f"{where}: holds another chunk than the one its mini-batch recorded (crc32c {found:#010x}, "
            f"recorded {crc:#010x}): it was moved or swapped from elsewhere"
        )
    return body


_ZSTD_MAGIC = 0xFD2FB528


def decoded_size(body: bytes | memoryview, compression: Compression) -> int | None:
    """The bytes a chunk's body decodes to, from its header (None when it does not say).

    Decoding into a buffer larger than the chunk leaves the rest untouched without an error
    (zstd and blosc both), so a record lying about a chunk's rows must be caught here.
    """
    if compression.name == "none":
        return len(body)
    head = bytes(body[:18])
    if compression.name in _BLOSC:  # blosc 1 header: version, versionlz, flags, typesize, nbytes
        return int.from_bytes(head[4:8], "little") if len(head) >= 8 else None
    if len(head) < 5 or int.from_bytes(head[:4], "little") != _ZSTD_MAGIC:
        return None
    fhd = head[4]
    single, fcs_flag, dict_flag = (fhd >> 5) & 1, fhd >> 6, fhd & 3
    start = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if not width or len(head) < start + width:
        return None
    value = int.from_bytes(head[start : start + width], "little")
    return value + 256 if width == 2 else value


def decode_into(
    blob: bytes | None,
    out: np.ndarray,
    compression: Compression,
    *,
    stored_size: int,
    where: str,
    crc: int | None = None,
) -> np.ndarray:
    """Decode one chunk holding exactly ``out``'s rows into ``out`` (contiguous, stored dtype).

    ``crc``: the chunk's crc32c as its mini-batch's record names it (None for records of
    older writers): a chunk whose own checksum holds but which is not that one was moved or
    swapped here from another place.

    Raises
    ------
    MissingDataError
        The chunk is absent or its size differs from the size recorded at write time.
    ChecksumError
        Its crc32c does not match, is not the recorded one, or it does not decode to ``out``'s size.
    """
    body = _checked_body(blob, stored_size, where, crc)
    codec = compression.codec()
    size = decoded_size(body, compression)
    if size is not None and size != out.nbytes:
        raise ChecksumError(f"{where}: chunk decodes to {size} bytes, its record says {out.nbytes}")
    try:
        if codec is None:
            np.copyto(out.reshape(-1), np.frombuffer(body, dtype=out.dtype))
        elif size is None:  # the header does not say: decode apart and compare
            raw = np.frombuffer(codec.decode(body), dtype=np.uint8)
            if raw.nbytes != out.nbytes:
                raise ChecksumError(f"{where}: chunk decodes to {raw.nbytes} bytes, its record says {out.nbytes}")
            np.copyto(out.reshape(-1).view(np.uint8), raw)
        else:
            codec.decode(body, out=out)
    except (ValueError, RuntimeError) as exc:
        raise ChecksumError(f"{where}: chunk does not decode ({exc})") from None
    return out


def decode_rows(
    blob: bytes | None,
    dtype: np.dtype,
    trailing: tuple[int, ...],
    rows: int,
    compression: Compression,
    *,
    stored_size: int,
    where: str,
    crc: int | None = None,
    chunk: int | None = None,
) -> np.ndarray:
    """Decode the last chunk of an array: its first ``rows`` rows, whether it was stored at the
    full chunk shape of ``chunk`` rows (as zarr does) or cut at the array's end (zarr_skip 0.1)."""
    body = _checked_body(blob, stored_size, where, crc)
    codec = compression.codec()
    try:
        raw = body if codec is None else codec.decode(body)
        flat = np.frombuffer(raw, dtype=dtype)
    except (ValueError, RuntimeError) as exc:
        raise ChecksumError(f"{where}: chunk does not decode ({exc})") from None
    per_row = dtype.itemsize * math.prod(trailing)
    if per_row and (flat.nbytes % per_row or flat.nbytes // per_row < rows):
        raise ChecksumError(f"{where}: chunk decodes to {flat.nbytes} bytes, not {rows} rows of {per_row}")
    if per_row and chunk is not None and flat.nbytes // per_row not in (rows, chunk):
        raise ChecksumError(f"{where}: chunk holds {flat.nbytes // per_row} rows, its record says {rows} of {chunk}")
    return flat.reshape(-1, *trailing)[:rows]


def narrow_view(region: np.ndarray, narrow: np.dtype) -> np.ndarray:
    """View of the back of ``region`` (a contiguous array of a wider integer type) that holds
    ``region.size`` values of the ``narrow`` type; call :func:`widen_in_place` once filled.

    Decoding a narrowed chunk there and widening it forward needs no buffer of its own.
    """
    flat = region.reshape(-1).view(np.uint8)
    n = region.size
    return flat[n * (region.dtype.itemsize - narrow.itemsize) :].view(narrow)


def widen_in_place(region: np.ndarray, narrow: np.ndarray) -> None:
    """Widen ``narrow`` (the view :func:`narrow_view` gave) into ``region``, front to back.

    Each step converts as many values as fit before the unread ones: half of what is left
    when the width doubles, so ~log2(n) numpy copies whose source and target never overlap
    (numpy buffers the last few values itself).
    """
    out = region.reshape(-1)
    n, wide, thin = out.size, out.dtype.itemsize, narrow.dtype.itemsize
    start = 0
    while start < n:
        step = max(1, (wide - thin) * (n - start) // wide)
        np.copyto(out[start : start + step], narrow[start : start + step], casting="safe")
        start += step


def array_metadata(
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dtype: np.dtype,
    compression: Compression,
    separator: str = "/",
    *,
    shard: int = 1,
    dimension_names: Sequence[str] | None = None,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The zarr v3 ``zarr.json`` document of an array we write.

    ``dimension_names`` and ``attributes`` describe the array to other zarr tools (see
    :mod:`zarr_skip.format.describe`).

    ``shard > 1``: the array's chunks are stored back to back in one file (zarr's
    ``sharding_indexed`` codec, the index of ``(offset, nbytes)`` pairs at the end), so an array
    of many chunks costs one file to write and one to open, and any chunk is one ranged read.
    """
    codecs = compression.zarr_codecs(dtype)
    grid = list(chunks)
    if shard > 1:
        grid[0] = chunks[0] * shard
        codecs = [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": list(chunks),
                    "codecs": codecs,
                    "index_codecs": _INDEX_CODECS,
                    "index_location": "end",
                },
            }
        ]
    doc: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": _zarr_dtype(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
        "fill_value": False if dtype.kind == "b" else 0,
        "codecs": codecs,
        "attributes": dict(attributes or {}),
    }
    if dimension_names is not None:
        doc["dimension_names"] = list(dimension_names)
    return doc


_INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]


def shard_index(sizes: Sequence[int]) -> bytes:
    """The index ending a shard whose chunks of ``sizes`` bytes lie back to back from offset 0:
    an ``(offset, nbytes)`` pair of little-endian uint64 per chunk, then its crc32c."""
    pairs = np.zeros((len(sizes), 2), dtype="<u8")
    pairs[:, 1] = sizes
    np.cumsum(pairs[:-1, 1], out=pairs[1:, 0])
    return with_crc(pairs.tobytes())


def _zarr_dtype(dtype: np.dtype) -> str:
    if dtype.kind == "b":
        return "bool"
    return dtype_name(dtype.newbyteorder("="))


@functools.lru_cache(maxsize=64)
def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name`` (``uint32``), kept: numpy computes it anew each time, in Python (~3 us, two
    per array a write stores)."""
    return dtype.name
