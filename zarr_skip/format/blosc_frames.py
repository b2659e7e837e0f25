"""One blosc frame of several equal blocks, cut into one frame per block (pure: bytes only).

Blosc compresses a buffer block by block, each block on its own (shuffled, then compressed,
its bytes found through the frame's table of block starts). Compressing the rows of several
chunks in one call, with the chunk's size as the block size, therefore makes the blocks that
per-chunk calls would make; :func:`split_frame` gives each its own header, so that each is the
frame blosc makes for that chunk alone (byte for byte, tests check it), decoded by blosc,
numcodecs and zarr as any other. One call instead of one per chunk releases the interpreter
lock once for all of them.

The blosc 1 frame (all fields little-endian)::

    version u1 | versionlz u1 | flags u1 | typesize u1 | nbytes u4 | blocksize u4 | cbytes u4
    then, unless flags has MEMCPYED: u4 start of each block, then the blocks.
"""

from __future__ import annotations

import struct

_HEADER = struct.Struct("<BBBBIII")
_START = struct.Struct("<I")
#: flags: the buffer is stored uncompressed, right after the header
MEMCPYED = 0x02


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
