"""A mini-batch's arrays in one data file: a ZIP of stored (uncompressed) members.

Every zarr key of the mini-batch's data group (its ``zarr.json`` documents, and one chunk or
shard per array) is one member, so ``zarr.storage.ZipStore`` opens the data file as an
ordinary zarr hierarchy. The members are written in order as their values come (a shard's
chunks as the pool encodes them); :func:`write_zip` returns where each member's bytes begin,
which the completion record keeps so that a reader goes straight to the bytes of a chunk.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

#: the extension of a packed data file (``w-{writer}.zip``)
SUFFIX = ".zip"
#: a member whose values may exceed this many bytes is written with ZIP64 sizes
_ZIP64_HINT = 1 << 30
#: every member's time stamp (ZIP's epoch): the bytes depend on the data alone
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a data file: its name (a zarr key inside the data group), a maker of its
    value (bytes, or pieces that may come one by one) and an upper bound of its size hint."""

    name: str
    make: Callable[[], bytes | Iterable[bytes]]
    size_hint: int = 0


def write_zip(out: BinaryIO, members: Sequence[Member]) -> dict[str, tuple[int, int]]:
    """Write ``members`` as a ZIP of stored members to the seekable ``out`` (from its current
    position, expected 0); returns ``(offset, length)`` in ``out`` of each member's bytes."""
    spans: dict[str, tuple[int, int]] = {}
    with zipfile.ZipFile(out, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for member in members:
            info = zipfile.ZipInfo(member.name, _EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            value = member.make()
            pieces: Iterable[bytes] = (value,) if isinstance(value, bytes) else value
            with zf.open(info, "w", force_zip64=member.size_hint > _ZIP64_HINT) as f:
                start = out.tell()
                length = 0
                for piece in pieces:
                    f.write(piece)
                    length += len(piece)
            spans[member.name] = (start, length)
    return spans


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
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"member {info.filename!r} is compressed")
            head = blob[info.header_offset : info.header_offset + 30]
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                raise ValueError(f"member {info.filename!r}: no local header at {info.header_offset}")
            name_len = int.from_bytes(head[26:28], "little")
            extra_len = int.from_bytes(head[28:30], "little")
            found[info.filename] = (info.header_offset + 30 + name_len + extra_len, info.file_size)
    return found
