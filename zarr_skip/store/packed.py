"""A mini-batch's arrays in one data file: a ZIP of stored (uncompressed) members.

Every zarr key of the mini-batch's data group (its ``zarr.json`` documents, and one chunk or
shard per array) is one member, so ``zarr.storage.ZipStore`` opens the data file as an
ordinary zarr hierarchy. The members are written in order as their values come (a shard's
chunks as the pool encodes them); :func:`write_zip` returns where each member's bytes begin,
which the completion record keeps so that a reader goes straight to the bytes of a chunk.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

#: the extension of a packed data file (``w-{writer}.zip``)
SUFFIX = ".zip"
#: a member whose values may exceed this many bytes is written with ZIP64 sizes
_ZIP64_HINT = 1 << 30
#: every member's time stamp, ZIP's epoch (1980-01-01 00:00, as a DOS date): the bytes
#: depend on the data alone
_DOSDATE = (1 << 5) | 1
#: sizes and offsets above this get ZIP64 fields (``zipfile.ZIP64_LIMIT``)
_ZIP64_LIMIT = (1 << 31) - 1
#: members above this get ZIP64 end records (``zipfile.ZIP_FILECOUNT_LIMIT``)
_COUNT_LIMIT = (1 << 16) - 1
_FFFF32 = 0xFFFFFFFF
_UTF8_FLAG = 0x800
#: a member's attributes: a regular file, rw-r--r-- (Unix)
_EXTERNAL_ATTR = 0o644 << 16
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_ZIP64_SIZES = struct.Struct("<HHQQ")
_END = struct.Struct("<4s4H2LH")
_END64 = struct.Struct("<4sQ2H2L4Q")
_LOCATOR64 = struct.Struct("<4sLQL")


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a data file: its name (a zarr key inside the data group), a maker of its
    value (bytes, or pieces that may come one by one) and an upper bound of its size hint."""

    name: str
    make: Callable[[], bytes | Iterable[bytes]]
    size_hint: int = 0


def write_zip(out: BinaryIO, members: Sequence[Member]) -> dict[str, tuple[int, int]]:
    """Write ``members`` as a ZIP of stored members to the seekable ``out`` (from its current
    position, expected 0); returns ``(offset, length)`` in ``out`` of each member's bytes.

    The bytes are those ``zipfile.ZipFile`` writes for the same members (a test compares them),
    without its per-member machinery: a member whose value is bytes gets its final local
    header at once; one whose pieces come one by one gets a header patched once they are in
    (with ``GatheredFile``, a patch of gathered bytes costs no system call).
    """
    base = out.tell()
    spans: dict[str, tuple[int, int]] = {}
    entries: list[_Entry] = []
    for member in members:
        name, flags = _encoded(member.name)
        zip64 = member.size_hint > _ZIP64_HINT
        header_offset = out.tell() - base
        value = member.make()
        if isinstance(value, bytes):
            crc, length = zlib.crc32(value), len(value)
            out.write(_local_header(name, flags, crc, length, zip64))
            start = out.tell()
            out.write(value)
        else:
            out.write(_local_header(name, flags, 0, 0, zip64))
            start = out.tell()
            crc = length = 0
            for piece in value:
                out.write(piece)
                crc, length = zlib.crc32(piece, crc), length + len(piece)
            end = out.tell()
            out.seek(base + header_offset)
            out.write(_local_header(name, flags, crc, length, zip64))
            out.seek(end)
        if length > _ZIP64_LIMIT and not zip64:
            raise RuntimeError(f"member {member.name!r}: {length} bytes, more than its size hint allowed")
        spans[member.name] = (start - base, length)
        entries.append(_Entry(name, flags, crc, length, header_offset, zip64))
    _write_directory(out, base, entries)
    return spans


@dataclass(frozen=True, slots=True)
class _Entry:
    """What the central directory says of one member."""

    name: bytes
    flags: int
    crc: int
    size: int
    header_offset: int
    zip64: bool  # its local header has ZIP64 sizes


def _encoded(name: str) -> tuple[bytes, int]:
    """The member's name as stored and its flags (UTF-8 names flagged, as ``zipfile`` does)."""
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), _UTF8_FLAG


def _local_header(name: bytes, flags: int, crc: int, size: int, zip64: bool) -> bytes:
    if zip64:
        extra = _ZIP64_SIZES.pack(1, 16, size, size)
        return _LOCAL.pack(b"PK\x03\x04", 45, 0, flags, 0, 0, _DOSDATE, crc, _FFFF32, _FFFF32, len(name), 20) + (
            name + extra
        )
    return _LOCAL.pack(b"PK\x03\x04", 20, 0, flags, 0, 0, _DOSDATE, crc, size, size, len(name), 0) + name


def _write_directory(out: BinaryIO, base: int, entries: list[_Entry]) -> None:
    """The central directory and the end records (ZIP64 ones where sizes, offsets or the count
    need them), as ``zipfile`` writes them."""
    start_dir = out.tell() - base
    parts = []
    for e in entries:
        big: list[int] = [e.size, e.size] if e.size > _ZIP64_LIMIT else []
        if e.header_offset > _ZIP64_LIMIT:
            big.append(e.header_offset)
        extra = struct.pack("<HH" + "Q" * len(big), 1, 8 * len(big), *big) if big else b""
        version = 45 if big or e.zip64 else 20
        size = _FFFF32 if e.size > _ZIP64_LIMIT else e.size
        offset = _FFFF32 if e.header_offset > _ZIP64_LIMIT else e.header_offset
        fields = (_DOSDATE, e.crc, size, size, len(e.name), len(extra), 0, 0, 0, _EXTERNAL_ATTR, offset)
        parts.append(_CENTRAL.pack(b"PK\x01\x02", version, 3, version, 0, e.flags, 0, 0, *fields) + e.name + extra)
    directory = b"".join(parts)
    out.write(directory)
    count, size, offset = len(entries), len(directory), start_dir
    if count > _COUNT_LIMIT or offset > _ZIP64_LIMIT or size > _ZIP64_LIMIT:
        end64 = offset + size
        out.write(_END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, offset))
        out.write(_LOCATOR64.pack(b"PK\x06\x07", 0, end64, 1))
        count, size, offset = min(count, 0xFFFF), min(size, _FFFF32), min(offset, _FFFF32)
    out.write(_END.pack(b"PK\x05\x06", 0, 0, count, count, size, offset, 0))


def zip_bytes(members: Sequence[Member]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """:func:`write_zip` into memory (for a store that takes one value per key)."""
    buf = io.BytesIO()
    spans = write_zip(buf, members)
    return buf.getvalue(), spans


def members_of(blob: bytes) -> dict[str, tuple[int, int]]:
    """``(offset, length)`` of every member of a data file, as its central directory says
    (for ``verify``: each must be where the record says). Raises ``zipfile.BadZipFile`` or
    ``ValueError`` for a file that is not a ZIP of stored members."""
    found: dict[str, tuple[int, int]] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            infos = zf.infolist()
    except NotImplementedError as exc:  # a version or feature field no data file of ours holds
        raise ValueError(f"not a ZIP of stored members ({exc})") from None
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"member {info.filename!r} is compressed")
        head = blob[info.header_offset : info.header_offset + 30]
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            raise ValueError(f"member {info.filename!r}: no local header at {info.header_offset}")
        name_len = int.from_bytes(head[26:28], "little")
        extra_len = int.from_bytes(head[28:30], "little")
        found[info.filename] = (info.header_offset + 30 + name_len + extra_len, info.file_size)
    return found
