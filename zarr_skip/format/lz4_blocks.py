"""Blosc frames of small lz4 blocks, written here (pure: an array in, a frame's bytes out).

Blosc compresses lz4 in blocks of at least 64 KiB (the size asked times the type's size above
that), each split in one stream per byte of the type: a read of a few rows then decodes whole
chunks. This module writes the frame blosc would write if it kept a smaller block size: a blosc
1 header, the table of block starts, then each block byte-shuffled (or not) and compressed by
lz4 as one stream (flag ``DONT_SPLIT``), stored as it is when lz4 does not make it smaller.
Blosc, numcodecs and zarr decode these frames as any other (tests check it), and the reads of
a few rows fetch and decode their blocks alone (:mod:`zarr_skip.store.blockreads`).

lz4 decodes an 8 KiB block of shuffled token ids several times faster than zstd (no entropy
stage), for more bytes: on the realistic medium step, 64 random rows of ``responses`` read cold
in 0.92x the time of Lance's ``take()`` in lz4 blocks against 1.10-1.14x in zstd ones, for
1.25x the step's bytes (quiet peer runs; ``benchmarks/README.md``).
"""

from __future__ import annotations

from typing import Any

import numcodecs
import numpy as np
from numcodecs import lz4
from numcodecs.compat import ensure_contiguous_ndarray

from zarr_skip.format import blosc_frames, zstd_blocks

#: blosc's code of the lz4 compressor (a header's flags carry it in their top three bits)
LZ4 = 1
#: the version of lz4's format blosc 1 writes in a header
_VERSIONLZ = 1
#: lz4's acceleration: 1, its best ratio, for every level from 1 (the level is recorded as given)
ACCELERATION = 1


def frame(data: np.ndarray, blocksize: int, shuffle: bool) -> bytes:
    """The blosc frame of ``data`` (its bytes, its element size as the type's) in lz4 blocks
    of ``blocksize`` bytes (the last one the rest), byte-shuffled when ``shuffle`` and the
    type is wider than a byte. ``data`` larger than one block, of at most 255 bytes an
    element, and ``blocksize`` a multiple of that size (the caller checks)."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    typesize = data.dtype.itemsize
    shuffled = _shuffled(raw, typesize, blocksize) if shuffle and typesize > 1 else raw
    count = -(-raw.size // blocksize)
    streams: list[Any] = []
    for k in range(count):
        block = shuffled[k * blocksize : (k + 1) * blocksize]
        packed = lz4.compress(block, ACCELERATION)
        streams.append(memoryview(packed)[4:] if len(packed) - 4 < block.size else block)  # 4: lz4's size header
    flags = blosc_frames.DONT_SPLIT | (blosc_frames.SHUFFLE if shuffle else 0) | LZ4 << 5
    head = blosc_frames.Header(2, _VERSIONLZ, flags, typesize, raw.size, blocksize, 0)  # cbytes: the frame's
    return blosc_frames.streams_frame(head, range(count), streams)


def _shuffled(raw: np.ndarray, typesize: int, blocksize: int) -> np.ndarray:
    """``raw`` as blosc's byte shuffle leaves it, block by block: each block's elements' first
    bytes, then their second bytes, ...; the last, shorter block shuffled on its own."""
    out = np.empty_like(raw)
    whole = raw.size // blocksize * blocksize
    per = blocksize // typesize
    out[:whole].reshape(-1, typesize, per)[:] = raw[:whole].reshape(-1, per, typesize).transpose(0, 2, 1)
    rest = raw.size - whole
    if rest:
        n = rest // typesize * typesize  # whole elements (an array's blocks hold no part of one)
        out[whole : whole + n].reshape(typesize, -1)[:] = raw[whole : whole + n].reshape(-1, typesize).T
        out[whole + n :] = raw[whole + n :]
    return out


class Blosc(zstd_blocks.Blosc):
    """numcodecs' Blosc codec of lz4 with a ``blocksize``: a chunk larger than one block is
    written as :func:`frame` writes it (blocks of that size, each one stream), which blosc
    does not; a chunk of one block, level 0 (stored as one copy), a bit shuffle or a block
    size that is not a multiple of the element's, and decoding, as :class:`zstd_blocks.Blosc`
    (blosc's own)."""

    def encode(self, buf: Any) -> Any:
        data = ensure_contiguous_ndarray(buf)
        size = data.dtype.itemsize
        ours = (
            self.cname == "lz4"
            and self.clevel > 0
            and self.shuffle in (numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE)
            and 0 < size <= 255
            and self.blocksize % size == 0
            and data.nbytes > self.blocksize > 0
        )
        return frame(data, self.blocksize, self.shuffle == numcodecs.Blosc.SHUFFLE) if ours else super().encode(buf)
