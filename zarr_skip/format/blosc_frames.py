"""One blosc frame of several equal blocks, cut into one frame per block (pure: bytes only).

Blosc compresses a buffer block by block, each block on its own (shuffled, then compressed,
its bytes found through the frame's table of block starts). Compressing the rows of several
chunks in one call, with the chunk's size as the block size, therefore makes the blocks that
per-chunk calls would make; :func:`split_frame` gives each its own header, so that each is the
frame blosc makes for that chunk alone (byte for byte, tests check it), decoded by blosc,
numcodecs and zarr as any other. One call instead of one per chunk releases the interpreter
lock once for all of them.

The same independence lets a reader decode some blocks of a chunk alone: :func:`block_starts`
finds where each block of a frame lies, :func:`parse_header` reads a frame's header back, and
:func:`gathered_frame` makes one frame of some of its blocks (which blosc decodes, in one call,
to those blocks' bytes).

The blosc 1 frame (all fields little-endian)::

    version u1 | versionlz u1 | flags u1 | typesize u1 | nbytes u4 | blocksize u4 | cbytes u4
    then, unless flags has MEMCPYED: u4 start of each block, then the blocks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

_HEADER = struct.Struct("<BBBBIII")
_START = struct.Struct("<I")
#: flags: each block's bytes were byte-shuffled before compression (when the type is wider than
#: a byte): every element's first bytes, then their second bytes, ...
SHUFFLE = 0x01
#: flags: the buffer is stored uncompressed, right after the header
MEMCPYED = 0x02
#: flags: each block is compressed as one stream (not split by byte significance); only then is
#: a frame's last, shorter block the frame blosc makes of those bytes alone
DONT_SPLIT = 0x10
#: the compressor of a frame's streams (the flags' top three bits) when it is zstd: each
#: compressed stream is then one zstd frame
ZSTD = 4
#: bytes of a frame's header
HEADER_BYTES = _HEADER.size


class Header(NamedTuple):
    """The fields of a blosc 1 header."""

    version: int
    versionlz: int
    flags: int
    typesize: int
    nbytes: int
    blocksize: int
    cbytes: int

    @property
    def blocks(self) -> int:
        """How many blocks the frame's bytes are cut into (0 for an empty frame)."""
        return -(-self.nbytes // self.blocksize) if self.blocksize > 0 else 0

    @property
    def one_stream_per_block(self) -> bool:
        """Whether each block of the frame is stored apart, as one stream (so that it decodes
        alone): a blosc 1 frame, not stored as one copy, its blocks not split by byte."""
        return self.version == 2 and not self.flags & MEMCPYED and bool(self.flags & DONT_SPLIT)

    @property
    def compressor(self) -> int:
        """The compressor of the frame's streams (:data:`ZSTD`, ...)."""
        return self.flags >> 5

    def block_bytes(self, k: int) -> int:
        """The bytes block ``k`` decodes to (the last one may be shorter)."""
        return min(self.blocksize, self.nbytes - k * self.blocksize)

    def block_sizes(self, blocks: Iterable[int]) -> list[int]:
        """:meth:`block_bytes` of each of ``blocks`` (one list, not a call per block)."""
        size, nbytes = self.blocksize, self.nbytes
        return [min(size, nbytes - k * size) for k in blocks]

    def gathered(self, blocks: Sequence[int]) -> Header:
        """The header of the frame of blocks ``blocks`` of this frame back to back (as
        :func:`gathered_frame` writes it, but for ``cbytes``: 0, unknown)."""
        total = self.gathered_bytes(blocks)
        return self._replace(nbytes=total, blocksize=self.blocksize if len(blocks) > 1 else total, cbytes=0)

    def gathered_bytes(self, blocks: Sequence[int]) -> int:
        """The bytes blocks ``blocks`` (rising, of this frame) decode to: all but the frame's
        last block are whole (ValueError for blocks that are not rising or not in the frame)."""
        if not blocks or blocks[0] < 0 or blocks[-1] >= self.blocks or list(blocks) != sorted(set(blocks)):
            raise ValueError(f"blocks {list(blocks)!r} of a frame of {self.blocks} blocks")
        return len(blocks) * self.blocksize - (self.blocksize - self.block_bytes(blocks[-1]))


def parse_header(frame: bytes | memoryview) -> Header | None:
    """The header ``frame`` starts with; None when it is too short to hold one."""
    if len(frame) < _HEADER.size:
        return None
    return Header(*_HEADER.unpack_from(frame))


def table_bytes(count: int) -> int:
    """Bytes of a frame's header and table of ``count`` block starts (where its first block begins)."""
    return _HEADER.size + _START.size * count


def block_starts(frame: bytes | memoryview) -> tuple[int, ...] | None:
    """Where each block of ``frame`` begins, when it holds two blocks or more, each one stream
    (so that each decodes alone: :func:`gathered_frame`); None for another frame (one block,
    stored uncompressed, split streams, or a layout this does not know)."""
    head = parse_header(frame)
    if head is None or not head.one_stream_per_block:
        return None
    count = head.blocks
    if count < 2 or head.cbytes != len(frame) or head.cbytes < table_bytes(count):
        return None
    starts = struct.unpack_from(f"<{count}I", frame, _HEADER.size)
    if starts[0] != table_bytes(count) or any(b <= a for a, b in zip(starts, (*starts[1:], head.cbytes), strict=True)):
        return None
    return starts


def gathered_frame(head: Header, blocks: Sequence[int], bodies: Sequence[Any]) -> bytes:
    """One frame of blocks ``blocks`` (rising) of a frame with header ``head`` (of several blocks,
    each one stream: see :func:`block_starts`), whose compressed bytes are ``bodies``: blosc
    decodes it in one call (one context for all of them) to those blocks' bytes back to back.
    Only the frame's last block may be shorter than the others (ValueError for blocks that
    are not rising or not in the frame: :meth:`Header.gathered_bytes`)."""
    return _frame(head, blocks, bodies, [len(body) for body in bodies])


def stored_frame(head: Header, blocks: Sequence[int], streams: Sequence[Any]) -> bytes:
    """The same frame with each block's bytes as blosc's compressor had them (shuffled, when
    ``head`` says so) in ``streams``, stored uncompressed: blosc copies each one (a stream as
    long as its block is stored as it is) and undoes the shuffle, in one call. So streams
    decompressed elsewhere (:mod:`zarr_skip.format.zstd_blocks`) are unshuffled at blosc's
    speed. ValueError for a stream whose length is not its block's."""
    sizes = head.block_sizes(blocks)
    if [len(s) for s in streams] != sizes:
        raise ValueError(f"streams of {[len(s) for s in streams]} bytes for blocks of {sizes} bytes")
    return streams_frame(head, blocks, streams)


def streams_frame(head: Header, blocks: Sequence[int], streams: Sequence[Any]) -> bytes:
    """The frame of blocks ``blocks`` of a frame with header ``head`` whose blocks' streams
    (each block's stored bytes without its length field: compressed, or as long as the block
    when stored as it is) are ``streams``; each gets its length field. Blocks ``range(n)`` of
    a header make that whole frame (:mod:`zarr_skip.format.lz4_blocks` writes its frames so)."""
    pieces = [piece for s in streams for piece in (_START.pack(len(s)), s)]
    return _frame(head, blocks, pieces, [_START.size + len(s) for s in streams])


def _frame(head: Header, blocks: Sequence[int], pieces: Sequence[Any], lengths: Sequence[int]) -> bytes:
    """A frame of blocks ``blocks`` of the frame of ``head``, whose blocks' bytes (``lengths``
    each) are ``pieces`` joined."""
    total = head.gathered_bytes(blocks)
    first = table_bytes(len(blocks))
    starts = list(accumulate(lengths[:-1], initial=first))
    block = head.blocksize if len(blocks) > 1 else total  # blosc refuses a block larger than the frame
    return b"".join(
        [
            _HEADER.pack(head.version, head.versionlz, head.flags, head.typesize, total, block, first + sum(lengths)),
            struct.pack(f"<{len(starts)}I", *starts),
            *pieces,
        ]
    )


def split_frame(frame: bytes, count: int, block: int) -> list[bytes] | None:
    """The frames of the ``count`` blocks of ``block`` bytes each in ``frame``; None when
    ``frame`` is not that (another block size, a block count or layout this does not know)."""
    if len(frame) < _HEADER.size or count < 1:
        return None
    version, versionlz, flags, typesize, nbytes, blocksize, cbytes = _HEADER.unpack_from(frame)
    if version != 2 or blocksize != block or nbytes != block * count or cbytes != len(frame):
        return None
    view = memoryview(frame)
    if flags & MEMCPYED:
        if cbytes != _HEADER.size + nbytes:
            return None
        head = _HEADER.pack(version, versionlz, flags, typesize, block, block, _HEADER.size + block)
        return [head + view[_HEADER.size + k * block : _HEADER.size + (k + 1) * block] for k in range(count)]
    table = _HEADER.size + _START.size * count
    if cbytes < table:
        return None
    starts = [*struct.unpack_from(f"<{count}I", frame, _HEADER.size), cbytes]
    if starts[0] != table or any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        return None
    first = _HEADER.size + _START.size  # a one-block frame's block starts here
    out = []
    for k in range(count):
        body = view[starts[k] : starts[k + 1]]
        head = _HEADER.pack(version, versionlz, flags, typesize, block, block, first + len(body))
        out.append(head + _START.pack(first) + body)
    return out
