"""Blosc frames of small lz4 blocks written by zarr_skip (``zarr_skip/format/lz4_blocks.py``):
what blosc, numcodecs and plain zarr decode, block by block as a few-row read takes them."""

from __future__ import annotations

from pathlib import Path

import numcodecs
import numpy as np
import pytest
import torch
import zarr
from helpers import FINGERPRINT, block_values

import zarr_skip as zs
from zarr_skip.format import blosc_frames, lz4_blocks


@pytest.mark.parametrize("kind", ["tokens", "logprobs", "mask", "noise", "lengths"])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("extra", [0, 300])  # whole blocks, or a short last one
def test_frames_of_small_lz4_blocks_decode_with_blosc_block_by_block(kind: str, shuffle: bool, extra: int) -> None:
    data = block_values(kind, 20 * 8192 // np.dtype(block_values(kind, 1).dtype).itemsize + extra)
    frame = lz4_blocks.frame(data, 8192, shuffle)
    head, starts = blosc_frames.parse_header(frame), blosc_frames.block_starts(frame)
    assert head is not None and starts is not None  # one stream per block: indexed, read block by block
    assert (head.blocksize, head.compressor, head.typesize, head.nbytes) == (
        8192,
        lz4_blocks.LZ4,
        data.itemsize,
        data.nbytes,
    )
    assert bool(head.flags & blosc_frames.SHUFFLE) is shuffle
    assert bytes(numcodecs.Blosc().decode(frame)) == data.tobytes()
    ends = (*starts[1:], len(frame))
    stored = [b - a - 4 == head.block_bytes(k) for k, (a, b) in enumerate(zip(starts, ends, strict=True))]
    if kind == "noise" or (kind == "tokens" and shuffle):  # lz4 makes none smaller / every one smaller
        assert stored == [kind == "noise"] * head.blocks
    raw = data.view(np.uint8)
    pick = [1, 2, head.blocks - 1]
    gathered = blosc_frames.gathered_frame(head, pick, [frame[starts[k] : ends[k]] for k in pick])
    assert bytes(numcodecs.Blosc().decode(gathered)) == b"".join(raw[k * 8192 : (k + 1) * 8192].tobytes() for k in pick)


def test_the_codec_writes_its_blocks_only_where_they_hold_and_leaves_the_rest_to_blosc() -> None:
    tokens = block_values("tokens", 8 * 2048)
    ours = zs.Compression("lz4", 5, "shuffle", 8192).codec()
    assert isinstance(ours, lz4_blocks.Blosc)
    frame = bytes(ours.encode(tokens))
    assert frame == lz4_blocks.frame(tokens, 8192, True) and bytes(ours.decode(frame)) == tokens.tobytes()
    for data, codec in (
        (tokens[:2048], ours),  # one block: blosc's own frame
        (tokens, lz4_blocks.Blosc("lz4", 0, numcodecs.Blosc.SHUFFLE, 8192)),  # level 0: stored as one copy
        (tokens, lz4_blocks.Blosc("lz4", 5, numcodecs.Blosc.BITSHUFFLE, 8192)),  # bit-shuffled
        (np.frombuffer(bytes(range(24)) * 3000, dtype="V24"), lz4_blocks.Blosc("lz4", 5, 1, 8192)),  # 8192 % 24
    ):
        got = bytes(codec.encode(data))
        assert got == bytes(numcodecs.Blosc.encode(codec, data))
        assert bytes(numcodecs.Blosc().decode(got)) == data.tobytes()


def test_plain_zarr_reads_token_ids_written_in_lz4_blocks(tmp_path: Path) -> None:
    offsets = torch.arange(0, 256 * 500 + 1, 500)
    values = torch.randint(0, 151936, (256 * 500,), generator=torch.Generator().manual_seed(0))
    batch = {"responses": torch.nested.nested_tensor_from_jagged(values, offsets)}
    cache = zs.open_cache(tmp_path, FINGERPRINT, compression=zs.Compression("lz4", 5, "shuffle", 8 << 10))
    info = cache.write(1, batch)
    part = zs.open_cache(tmp_path).load(1)._parts[0]
    array = part.arrays["responses"]["values"]
    assert array.blocks is not None and min(len(s) for s in array.blocks) > 1
    (data_file,) = (tmp_path / info.path).glob("*.zip")
    with zarr.storage.ZipStore(data_file, mode="r") as zipped:
        stored = zarr.open_group(zipped, mode="r")["responses/values"][:]
    assert np.array_equal(stored, values.numpy())
