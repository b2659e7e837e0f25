"""Blosc frames of small zstd blocks decoded through zstandard (``zarr_skip/format/zstd_blocks.py``):
the same bytes as blosc alone gives, for every frame blosc makes, the frames of some blocks a
read of a few rows gathers, blocks blosc stored uncompressed, and a short last block; other
frames left to blosc; damaged ones refused. Speed: ``benchmarks/block_decode.py``."""

from __future__ import annotations

import pickle
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import torch
from helpers import FINGERPRINT, block_values

import zarr_skip as zs
from zarr_skip.errors import ChecksumError
from zarr_skip.format import blosc_frames, chunks, zstd_blocks

SHUFFLES = {
    "noshuffle": numcodecs.Blosc.NOSHUFFLE,
    "shuffle": numcodecs.Blosc.SHUFFLE,
    "bit": numcodecs.Blosc.BITSHUFFLE,
}


def _codecs(shuffle: str, block: int) -> tuple[numcodecs.Blosc, zstd_blocks.Blosc]:
    args = {"cname": "zstd", "clevel": 1, "shuffle": SHUFFLES[shuffle], "blocksize": block}
    return numcodecs.Blosc(**args), zstd_blocks.Blosc(**args)


@pytest.mark.parametrize("kind", ["tokens", "logprobs", "lengths", "mixed"])
@pytest.mark.parametrize("block", [4096, 8192, 16384])
@pytest.mark.parametrize("shuffle", ["shuffle", "noshuffle", "bit"])
def test_small_zstd_blocks_decode_to_what_blosc_gives(kind: str, block: int, shuffle: str) -> None:
    data = block_values(kind, (zstd_blocks.MIN_BLOCKS + 1) * block // 2 + 7)  # over MIN_BLOCKS, the last one short
    plain, ours = _codecs(shuffle, block)
    frame = bytes(plain.encode(data))
    found = zstd_blocks.small_block_streams(frame)
    assert found is not None
    head, streams = found
    assert head == blosc_frames.parse_header(frame) and len(streams) == head.blocks > zstd_blocks.MIN_BLOCKS
    if kind == "mixed":  # some blocks stored as they are, some compressed
        assert {len(s) == head.block_bytes(k) for k, s in enumerate(streams)} == {True, False}
    want = data.view(np.uint8).tobytes()
    assert bytes(plain.decode(frame)) == want
    assert bytes(ours.decode(frame)) == want
    out = np.empty_like(data)
    assert ours.decode(frame, out=out) is out and out.tobytes() == want


def test_the_frames_of_many_blocks_a_read_gathers_decode_to_their_blocks() -> None:
    data = block_values("tokens", 40 * 2048 + 300)
    plain, ours = _codecs("shuffle", 8192)
    frame = bytes(plain.encode(data))
    head, starts = blosc_frames.parse_header(frame), blosc_frames.block_starts(frame)
    assert head is not None and starts is not None
    ends = (*starts[1:], len(frame))
    raw = data.view(np.uint8)
    many = list(range(0, 40, 2))  # 20 blocks
    for pick, through in ((many, True), ([*many[:-1], 40], True), ([2, 5, 9], False), ([8, 9], False)):
        gathered = blosc_frames.gathered_frame(head, pick, [frame[starts[k] : ends[k]] for k in pick])
        assert (zstd_blocks.small_block_streams(gathered) is not None) is through  # a few: blosc's
        want = b"".join(raw[k * 8192 : (k + 1) * 8192].tobytes() for k in pick)
        assert bytes(ours.decode(gathered)) == bytes(plain.decode(gathered)) == want


@pytest.mark.parametrize("kind", ["tokens", "mixed"])
def test_some_blocks_decode_from_their_bodies_as_their_gathered_frame_does(kind: str) -> None:
    """``decode_blocks``: the blocks a read of some rows fetched, decoded from their stored
    bodies into the caller's buffer, as blosc decodes the frame gathered from them; blocks it
    leaves to blosc (a few, larger, a length field off) are left untouched, and a stream that
    does not decompress to its block is a ValueError."""
    data = block_values(kind, 40 * 2048 + 300)  # 41 blocks of 8 KiB (u4; u8: 81), the last one short
    plain, ours = _codecs("shuffle", 8192)
    frame = bytes(plain.encode(data))
    head, starts = blosc_frames.parse_header(frame), blosc_frames.block_starts(frame)
    assert head is not None and starts is not None
    bodies = [np.frombuffer(frame, np.uint8)[a:b] for a, b in zip(starts, (*starts[1:], len(frame)), strict=True)]
    for pick, through in (([k for k in range(head.blocks) if k % 3], True), ([1, 3, 4], False)):
        want = bytes(plain.decode(blosc_frames.gathered_frame(head, pick, [bodies[k] for k in pick])))
        out = np.zeros(head.gathered_bytes(pick), np.uint8)
        assert zstd_blocks.decode_blocks(ours, head, pick, [bodies[k] for k in pick], out) is through
        assert out.tobytes() == (want if through else bytes(len(want)))
    many = list(range(zstd_blocks.MIN_BLOCKS))
    out = np.zeros(head.gathered_bytes(many), np.uint8)
    cut = [bodies[k] for k in many]
    cut[3] = cut[3][:-1]  # its length field no longer its length: left to blosc
    assert not zstd_blocks.decode_blocks(ours, head, many, cut, out)
    whole = [bodies[k] for k in many]
    for other in (
        head._replace(flags=head.flags & 0x1F),  # blosclz streams
        head._replace(flags=head.flags & ~blosc_frames.DONT_SPLIT),  # blocks split by byte
        head._replace(flags=head.flags | blosc_frames.MEMCPYED),  # stored as one copy
        head._replace(version=3),
    ):
        assert not zstd_blocks.decode_blocks(ours, other, many, whole, out)
    assert not out.any()
    if kind == "tokens":  # every block compressed: one swapped for another's stream of another size
        last = head.blocks - 1
        swapped = [*(bodies[k] for k in many[:-1]), bodies[last]]
        with pytest.raises(ValueError):
            zstd_blocks.decode_blocks(ours, head, many, swapped, out)


def test_other_frames_are_left_to_blosc() -> None:
    data = block_values("tokens", 64 << 10)
    frames = {
        "one block per chunk": numcodecs.Blosc("zstd", 1, 1, 0).encode(data[: 128 << 10 // 4]),
        "32 KiB blocks": numcodecs.Blosc("zstd", 1, 1, 32 << 10).encode(data),
        "lz4": numcodecs.Blosc("lz4", 5, 1, 8192).encode(data),
        "stored uncompressed": numcodecs.Blosc("zstd", 0, 1, 8192).encode(data),
        "one small block": numcodecs.Blosc("zstd", 1, 1, 8192).encode(data[:1000]),
        "a few small blocks": numcodecs.Blosc("zstd", 1, 1, 8192).encode(data[: 2048 * (zstd_blocks.MIN_BLOCKS - 1)]),
    }
    for what, frame in frames.items():
        assert zstd_blocks.small_block_streams(bytes(frame)) is None, what
        assert bytes(zstd_blocks.Blosc("zstd", 1, 1, 8192).decode(frame)) == bytes(numcodecs.Blosc().decode(frame))
    frame = bytearray(numcodecs.Blosc("zstd", 1, 1, 8192).encode(data))
    starts = blosc_frames.block_starts(bytes(frame))
    assert starts is not None
    frame[starts[3] : starts[3] + 4] = (1 << 20).to_bytes(4, "little")  # a stream's length field off
    assert zstd_blocks.small_block_streams(bytes(frame)) is None
    assert zstd_blocks.small_block_streams(bytes(frame[:-10])) is None  # cut short


def test_a_damaged_stream_is_refused_not_decoded() -> None:
    data = block_values("tokens", 20 * 2048)
    plain, ours = _codecs("shuffle", 8192)
    frame = bytearray(plain.encode(data))
    starts = blosc_frames.block_starts(bytes(frame))
    assert starts is not None
    frame[starts[2] + 4 : starts[2] + 8] = b"\0\0\0\0"  # block 2's zstd magic
    with pytest.raises(ValueError, match="zstd block"):
        ours.decode(bytes(frame))
    with pytest.raises(RuntimeError):
        plain.decode(bytes(frame))
    body = chunks.with_crc(bytes(frame))  # its own crc32c holds: the codec must catch it
    codec = chunks.Compression("blosc-zstd", 1, "shuffle", 8192)
    with pytest.raises(ChecksumError, match="does not decode"):
        chunks.decode_into(body, np.empty_like(data), codec, stored_size=len(body), where="x")


def test_a_zstd_frame_claiming_more_than_its_block_is_refused_naming_the_block() -> None:
    import zstandard

    data = block_values("tokens", 20 * 2048)  # 20 blocks of 8 KiB: decoded through zstandard
    plain, ours = _codecs("shuffle", 8192)
    frame = bytes(plain.encode(data))
    head, starts = blosc_frames.parse_header(frame), blosc_frames.block_starts(frame)
    assert head is not None and starts is not None and head.blocks >= zstd_blocks.MIN_BLOCKS
    bodies = [frame[a:b] for a, b in zip(starts, (*starts[1:], len(frame)), strict=True)]
    big = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))  # claims 64 MiB in 2 KiB
    bodies[1] = len(big).to_bytes(4, "little") + big
    with pytest.raises(ValueError, match=f"block 1: a zstd frame of {64 << 20} bytes for a block of 8192"):
        ours.decode(blosc_frames.gathered_frame(head, range(head.blocks), bodies))


def test_the_codec_encodes_and_describes_itself_as_numcodecs_blosc() -> None:
    codec = chunks.Compression("blosc-zstd", 1, "shuffle", 8192).codec()
    assert isinstance(codec, zstd_blocks.Blosc)
    plain = numcodecs.Blosc("zstd", 1, numcodecs.Blosc.SHUFFLE, 8192)
    data = block_values("tokens", 5000)
    assert bytes(codec.encode(data)) == bytes(plain.encode(data))
    assert codec.get_config() == plain.get_config()
    again = pickle.loads(pickle.dumps(codec))
    assert isinstance(again, zstd_blocks.Blosc) and bytes(again.decode(plain.encode(data))) == data.tobytes()


def test_whole_reads_in_small_blocks_decode_through_zstandard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 3000, 64)
    offsets = torch.zeros(65, dtype=torch.int64)
    offsets[1:] = torch.from_numpy(lengths).cumsum(0)
    values = torch.from_numpy(rng.integers(0, 151936, int(offsets[-1])))
    col = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    cache = zs.open_cache(tmp_path / "c", FINGERPRINT, compression=zs.Compression("auto", blocksize=8 << 10))
    cache.write(1, {"responses": col})
    calls: list[int] = []
    real = zstd_blocks.decompressed

    def spy(head: blosc_frames.Header, streams: list[memoryview]) -> list[object]:
        calls.append(len(streams))
        return real(head, streams)

    monkeypatch.setattr(zstd_blocks, "decompressed", spy)
    view = zs.open_cache(tmp_path / "c").load(1)
    rows = np.array([3, 17, 40, 63])
    got = view["responses"][rows].unbind()
    assert not calls  # the few blocks holding them: blosc's
    assert all(torch.equal(a, col.unbind()[int(r)]) for a, r in zip(got, rows, strict=True))
    whole = zs.open_cache(tmp_path / "c").load(1)["responses"][:]
    assert sum(calls) >= int(offsets[-1]) * 4 // (8 << 10)  # every block of the column
    assert torch.equal(whole.values(), col.values())
