"""Blosc frames of small zstd blocks decoded with zstandard (pure: bytes in, bytes out).

Blosc decodes each block of a frame with a fixed cost besides its bytes: numcodecs' build
decodes an 8 KiB zstd block of shuffled token ids in ~15-18 us, of which ~10 us go to the
block as such (a 512 KiB block decodes at ~1.2 GB/s, 8 KiB ones at ~0.45 GB/s). zstandard
(the zstd library's own Python binding) decompresses the same streams in ~8 us each. So a frame
of many small zstd blocks (:data:`MIN_BLOCKS` or more, of :data:`SMALL_BLOCK_BYTES` or less:
the chunks ``Compression("auto", blocksize=...)`` writes for token ids, read whole, and the
many blocks a read of some rows fetches, :func:`decode_blocks`, which takes them as they were
fetched rather than as their :func:`blosc_frames.gathered_frame`) is decoded here in two
steps: zstandard decompresses every block's stream in one call (without the interpreter
lock), then blosc takes them as a frame of blocks stored uncompressed
(:func:`blosc_frames.stored_frame`), which it copies and unshuffles at its own speed. Other
frames (larger blocks, a few blocks, other compressors, split streams, stored uncompressed)
are decoded by blosc alone, as zarr would.

Every frame is walked as :func:`blosc_frames.block_starts` checks it (blocks in order, inside
the frame, each one stream; the blocks :func:`decode_blocks` takes, by their header's flags and
each block's length field); a frame this walk does not take is left to blosc, which refuses
what it cannot decode. A stream decompressing to another size than its block's is a
ValueError, as blosc's own failure is a RuntimeError.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import numcodecs
import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from zarr_skip.format import blosc_frames

#: frames of blocks of at most this many bytes are decoded through zstandard. On the token ids
#: of the realistic medium step (chunks of 2 MiB, one thread; ``benchmarks/block_decode.py``,
#: quiet), blosc alone decodes blocks of 8 / 16 / 32 KiB at 429 / 610 / 766 MB/s, zstandard then
#: blosc at 606 / 737 / 764 MB/s; one block per chunk, 1435 MB/s either way
SMALL_BLOCK_BYTES = 16 << 10
#: and of at least this many blocks: each call into zstandard costs its code and tables fetched
#: again into a CPU cache a cold read left cold, which a few blocks do not earn back. Reading 64
#: random rows of the large step cold (gathered frames of ~5 blocks) took 1.16x blosc's time
#: through zstandard from 2 blocks on, 1.02x from 16 on (the medium step 1.00-1.03x both ways;
#: medians of 60 alternated reads), while warm reads gain from 2 blocks on
MIN_BLOCKS = 16

_LENGTH = struct.Struct("<i")
#: each thread's decompressor (zstandard's are not shared between threads)
_local = threading.local()


class Blosc(numcodecs.Blosc):  # type: ignore[misc]  # numcodecs is untyped
    """numcodecs' Blosc codec, decoding frames of small zstd blocks through zstandard (see the
    module's docstring); it encodes as numcodecs' does."""

    def decode(self, buf: Any, out: Any = None) -> Any:
        found = small_block_streams(memoryview(ensure_contiguous_ndarray(buf).view(np.uint8)))
        if found is None:
            return super().decode(buf, out)
        head, streams = found
        return super().decode(blosc_frames.stored_frame(head, range(head.blocks), decompressed(head, streams)), out)


def small_block_streams(frame: bytes | memoryview) -> tuple[blosc_frames.Header, list[memoryview]] | None:
    """The header of ``frame`` and the stream of each of its blocks (without its length field),
    when it is a blosc frame of :data:`MIN_BLOCKS` zstd blocks or more, of at most
    :data:`SMALL_BLOCK_BYTES` each, each one stream of the length its field gives; None for any
    other frame (for blosc)."""
    head = blosc_frames.parse_header(frame)
    if head is None or not _small_zstd(head):
        return None
    starts = blosc_frames.block_starts(frame)
    if starts is None or len(starts) < MIN_BLOCKS:
        return None
    view = memoryview(frame)
    streams = _streams([view[start:end] for start, end in zip(starts, (*starts[1:], head.cbytes), strict=True)])
    return None if streams is None else (head, streams)


def decode_blocks(
    codec: numcodecs.Blosc, head: blosc_frames.Header, blocks: Sequence[int], bodies: Sequence[Any], out: Any
) -> bool:
    """Blocks ``blocks`` (rising) of the frame of ``head`` decoded into ``out``, their bytes back
    to back, from ``bodies`` (each block's stored bytes, its length field first), as
    :meth:`Blosc.decode` decodes their :func:`~blosc_frames.gathered_frame`, without building
    that frame and walking it again (a read of some rows' blocks); False, ``out`` untouched,
    for blocks it leaves to blosc (the frames :func:`small_block_streams` leaves). ValueError
    for a stream that does not decompress to its block (as :func:`decompressed`)."""
    if not head.one_stream_per_block or not _small_zstd(head) or len(blocks) < MIN_BLOCKS:
        return False
    streams = _streams([memoryview(body) for body in bodies])
    if streams is None:
        return False
    gathered = head.gathered(blocks)
    frame = blosc_frames.stored_frame(gathered, range(len(blocks)), decompressed(gathered, streams))
    numcodecs.Blosc.decode(codec, frame, out)
    return True


def _small_zstd(head: blosc_frames.Header) -> bool:
    """Whether the frame of ``head`` holds zstd blocks of at most :data:`SMALL_BLOCK_BYTES`."""
    return head.compressor == blosc_frames.ZSTD and 0 < head.blocksize <= SMALL_BLOCK_BYTES


def _streams(bodies: Sequence[memoryview]) -> list[memoryview] | None:
    """The zstd stream of each block's bytes (``bodies``: a length field, then that many
    bytes), or None when a length field is not its block's."""
    streams = []
    for body in bodies:
        if len(body) < _LENGTH.size or _LENGTH.unpack_from(body)[0] != len(body) - _LENGTH.size:
            return None
        streams.append(body[_LENGTH.size :])
    return streams


def decompressed(head: blosc_frames.Header, streams: list[memoryview]) -> list[Any]:
    """Each block's bytes as blosc's compressor had them (shuffled, when ``head`` says so): a
    stream as long as its block was stored as it is, the others are zstd frames, decompressed
    in one call (which lets go of the interpreter lock once for them all: a call per block
    made two threads decoding chunks wait on each other) into buffers of their blocks' sizes
    (a frame claiming another size is not decompressed). ValueError for one that does not
    decompress to its block's size."""
    import zstandard

    sizes = head.block_sizes(range(len(streams)))
    packed = [k for k, (s, n) in enumerate(zip(streams, sizes, strict=True)) if len(s) != n]
    out: list[Any] = list(streams)
    if not packed:
        return out
    decompressor = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    want = np.asarray([sizes[k] for k in packed], dtype=np.uint64).tobytes()
    try:
        for k in packed:
            if (claimed := zstandard.frame_content_size(streams[k])) not in (sizes[k], -1):
                raise ValueError(f"block {k}: a zstd frame of {claimed} bytes for a block of {sizes[k]}")
        got: Any = decompressor.multi_decompress_to_buffer([streams[k] for k in packed], decompressed_sizes=want)
    except zstandard.ZstdError as exc:
        raise ValueError(f"a zstd block does not decompress ({exc})") from None
    for k, data in zip(packed, got, strict=True):
        out[k] = data
    return out
