"""Chunks: the codecs we pick, widening in place, and caches written by earlier releases of format 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import torch
import zarr
from helpers import Keys, assert_equal, concat, make_batch, unpack_to_tree, zarr_array

import zarr_skip as zs
from zarr_skip.format import blosc_frames, chunks, layout, lz4_blocks
from zarr_skip.format.chunks import (
    AUTO_BLOCK_BYTES,
    Compression,
    chunks_of_rows,
    decode_rows,
    encode,
    first_rows,
    narrow_view,
    widen_in_place,
)


def _chunk_path(array_dir: Path, i: int, ndim: int) -> Path:
    return array_dir / ".".join(["c", str(i)] + ["0"] * (ndim - 1))


def _unshard(array_dir: Path, array: dict[str, Any]) -> None:
    """Split a shard into one file per chunk, as 0.1 stored them."""
    ndim = len(array["shape"])
    shard = _chunk_path(array_dir, 0, ndim).read_bytes()
    start = 0
    for i, size in enumerate(array["sizes"]):
        _chunk_path(array_dir, i, ndim).write_bytes(shard[start : start + size])
        start += size


def _cut_last_chunk(array_dir: Path, array: dict[str, Any]) -> int:
    """Re-encode an array's last chunk cut at the array's end, as 0.1 did; its new size."""
    last = len(array["sizes"]) - 1
    rows = array["shape"][0] - last * array["chunk"]
    path = _chunk_path(array_dir, last, len(array["shape"]))
    codec = Compression(**array["codec"])
    kept = decode_rows(
        path.read_bytes(),
        np.dtype(array["dtype"]),
        tuple(array["shape"][1:]),
        rows,
        codec,
        stored_size=array["sizes"][last],
        where="test",
    )
    blob = encode(kept, codec)
    path.write_bytes(blob)
    return len(blob)


def _as_zarr_skip_0_1_wrote_it(root: Path) -> int:
    """Rewrite a cache the way zarr_skip 0.1 laid it out: one file per chunk (no shards), chunk
    keys ``c/0`` (not ``c.0``), the last chunk of an array cut at the array's end (not padded to
    the chunk shape) and no ``separator`` in the manifest (its records re-checksummed).
    Returns the chunks moved."""
    assert unpack_to_tree(root)  # written packed (format 4): first as format 3 laid it out
    moved = cut = 0
    # records first (splitting shards and cutting chunks at c.N keys), then arrays (moving keys)
    for meta in sorted(root.rglob("zarr.json"), key=lambda m: json.loads(m.read_text()).get("node_type") == "array"):
        doc = json.loads(meta.read_text())
        part = doc.get("attributes", {}).get(layout.PART_ATTR)
        if part and part.get("state") == "complete":
            data = meta.parent / part["data"]
            for name, column in part["columns"].items():
                for aname, array in column["arrays"].items():
                    assert array.pop("separator") == "."
                    array.pop("crc32c")  # 0.1 recorded no chunk crcs, nor the record's place
                    where = data / name / aname if len(column["arrays"]) > 1 else data / name
                    if array.pop("shard", False):
                        _unshard(where, array)
                    if array["sizes"] and array["shape"][0] % array["chunk"]:
                        array["sizes"][-1] = _cut_last_chunk(where, array)
                        cut += 1
            for key in ("experiment", "step", "expected"):
                part.pop(key)
            part["checksum"] = layout.doc_checksum(part)
        if meta == root / "zarr.json":
            doc["attributes"]["zarr_skip"]["version"] = 1
        if doc.get("node_type") == "array":
            if doc["codecs"][0]["name"] == "sharding_indexed":
                inner = doc["codecs"][0]["configuration"]
                doc["codecs"] = inner["codecs"]
                doc["chunk_grid"]["configuration"]["chunk_shape"] = inner["chunk_shape"]
            doc["chunk_key_encoding"]["configuration"]["separator"] = "/"
            for chunk in meta.parent.glob("c.*"):
                new = meta.parent.joinpath("c", *chunk.name.split(".")[1:])
                new.parent.mkdir(parents=True, exist_ok=True)
                chunk.rename(new)
                moved += 1
        meta.write_text(json.dumps(doc))
    assert cut, "no array had a partial last chunk"
    return moved


@pytest.mark.parametrize(
    "compression",
    [Compression("zstd", 1), Compression("lz4", 5, "bitshuffle"), Compression("zstd", 3)],
    ids=["zstd-1", "lz4-bitshuffle", "zstd-3"],
)
def test_a_cache_in_the_0_1_layout_still_loads(tmp_path: Path, fingerprint: dict, compression: Compression) -> None:
    parts = [make_batch(5, seed=i, offset=10 * i) for i in range(3)]
    cache = zs.open_cache(str(tmp_path), fingerprint, compression=compression, chunk_bytes=24)
    for p in parts:
        cache.write(2, p, expected=3)
    assert _as_zarr_skip_0_1_wrote_it(tmp_path) > 10
    assert not list(tmp_path.rglob("c.*"))
    reopened = zs.open_cache(str(tmp_path), fingerprint)
    assert_equal(reopened.load(2).to_dict(), concat(parts))
    report = reopened.verify()
    assert report.chunks > 10 and report.problems == ()
    # and zarr itself reads the old keys
    (part,) = [p for p in reopened.load(2)._parts if p.index == 1]
    array = zarr.open_group(str(tmp_path), mode="r")[part.arrays["input_ids"]["data"].path]
    assert np.array_equal(array[:], parts[1]["input_ids"].numpy())
    # reading leaves the format version alone; the first write of the new layout raises it
    assert _root_version(tmp_path) == 1
    more = make_batch(4, seed=7)
    reopened.write(3, more)
    assert _root_version(tmp_path) == layout.FORMAT_VERSION == 4
    assert_equal(reopened.load(3).to_dict(), more)
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(2).to_dict(), concat(parts))


def _root_version(root: Path) -> int:
    return json.loads((root / "zarr.json").read_text())["attributes"]["zarr_skip"]["version"]


def test_auto_compression_by_width(tmp_path: Path, fingerprint: dict) -> None:
    auto = Compression.parse("auto")
    wide = auto.for_dtype(np.dtype("u4"))
    assert (wide.name, wide.level, wide.shuffle, wide.blocksize) == ("blosc-zstd", 1, "shuffle", AUTO_BLOCK_BYTES)
    assert auto.for_dtype(np.dtype("f4")) == wide
    assert auto.for_dtype(np.dtype("u1")) == Compression("zstd", 1)
    cache = zs.open_cache(str(tmp_path), fingerprint)
    batch = make_batch(6)
    cache.write(1, batch)
    (part,) = cache.load(1)._parts
    arrays = part.arrays
    assert arrays["old_log_probs"]["data"].compression == wide
    assert arrays["attention_mask"]["data"].compression == Compression("zstd", 1)  # narrowed to u1
    # zarr decodes what the blosc-zstd chain declares
    array = zarr_array(tmp_path, arrays["old_log_probs"]["data"])
    assert array.metadata.codecs[1].to_dict()["configuration"]["blocksize"] == AUTO_BLOCK_BYTES
    assert np.array_equal(array[:], batch["old_log_probs"].numpy())


def test_token_ids_in_small_blocks_aim_for_larger_chunks() -> None:
    """A read of a few rows takes blocks, so chunks of blocks grow; the default's do not."""
    ids, floats = np.dtype("i4"), np.dtype("f4")
    small = Compression("auto", blocksize=8 << 10)
    for chunk_bytes in (chunks.DEFAULT_CHUNK_BYTES, 64 << 10):
        blocked = chunks.array_codec("values", small, ids)
        assert chunks.chunk_target("values", blocked, ids, chunk_bytes) == chunks.BLOCKED_VALUES_CHUNKS * chunk_bytes
        default = chunks.array_codec("values", Compression("auto"), ids)  # one block per chunk
        assert chunks.chunk_target("values", default, ids, chunk_bytes) == chunk_bytes
        # floats and lengths keep chunk_bytes (and no block index: blosc's blocks of them are larger)
        for name, dtype in (("values", floats), ("lengths", ids)):
            codec = chunks.array_codec(name, small, dtype)
            assert chunks.chunk_target(name, codec, dtype, chunk_bytes) == chunk_bytes
    # a blocksize as large as the chunk is one block: nothing to read by the block
    whole = chunks.array_codec("values", Compression("auto", blocksize=chunks.VALUES_CHUNK_BYTES), ids)
    assert chunks.chunk_target("values", whole, ids, 4 << 20) == chunks.VALUES_CHUNK_BYTES


@pytest.mark.parametrize(
    ("value", "level", "error"),
    [
        ("brotli", None, "compression: expected one of"),
        ("blosc-zstd:12", None, "blosc levels run from 0 to 9"),
        ("zstd:30", None, "zstd levels run from -7 to 22"),
        ("zstd:x", None, "bad level in 'zstd:x'"),
        ("zstd", "3", "level: expected an int, got '3'"),
        ("blosc-zstd", 1.5, "level: expected an int, got 1.5"),
        ("zstd", True, "level: expected an int, got True"),
    ],
)
def test_bad_compression_is_refused(tmp_path: Path, fingerprint: dict, value: str, level: Any, error: str) -> None:
    with pytest.raises(zs.ConfigError, match=error):
        zs.open_cache(str(tmp_path), fingerprint, compression=value, level=level)
    assert not (tmp_path / "zarr.json").exists()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("gzip",), "compression: expected one of"),
        (("zstd", "3"), "level: expected an int"),
        (("blosc-zstd", 1, "bytes"), "shuffle: expected one of"),
    ],
)
def test_a_bad_compression_setting_is_a_config_error(args: tuple[Any, ...], error: str) -> None:
    with pytest.raises(zs.ConfigError, match=error):
        Compression(*args)


@pytest.mark.parametrize("level", ["3", 1.5, True])
def test_a_record_whose_codec_level_is_not_an_int_is_malformed(tmp_path: Path, fingerprint: dict, level: Any) -> None:
    zs.open_cache(str(tmp_path), fingerprint).write(1, make_batch(6))
    view = zs.open_cache(str(tmp_path)).load(1)
    part = view._parts[0].path

    def edit(record: dict[str, Any]) -> None:
        record["columns"]["input_ids"]["arrays"]["data"]["codec"]["level"] = level

    Keys(tmp_path).edit(f"{part}/zarr.json", layout.PART_ATTR, edit)
    with pytest.raises(zs.MetadataError, match="column 'input_ids': malformed metadata"):
        zs.open_cache(str(tmp_path)).load(1)["input_ids"][:]


def test_compression_none_stores_chunks_uncompressed(tmp_path: Path, fingerprint: dict) -> None:
    cache = zs.open_cache(str(tmp_path), fingerprint, compression=None)
    assert cache.compression == Compression("none", 0)
    batch = make_batch(6)
    cache.write(1, batch)
    view = zs.open_cache(str(tmp_path)).load(1)
    for name, arrays in view._parts[0].arrays.items():
        assert {a.compression for a in arrays.values()} == {Compression("none", 0)}, name
    assert torch.equal(view["input_ids"][:], batch["input_ids"])


def test_blocksize_must_be_a_byte_count() -> None:
    with pytest.raises(zs.ConfigError, match="blocksize"):
        Compression("blosc-zstd", 1, "shuffle", -1)


@pytest.mark.parametrize("dtype", ["u1", "<u2", "<u4", "<f4", "<i8"])
def test_blosc_lz4_does_not_keep_a_block_size_so_zarr_skip_writes_its_lz4_blocks(dtype: str) -> None:
    # blosc makes lz4 blocks of at least 64 KiB (the size asked times the type's size above
    # that), split by byte; zarr_skip's lz4 codec writes blocks of the size asked, each one
    # stream, which blosc (numcodecs, zarr) decodes as any frame
    values = np.random.default_rng(0).integers(0, 200, 1 << 18).astype(dtype)
    for asked in (8 << 10, 32 << 10):
        blosc = blosc_frames.parse_header(numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, asked).encode(values))
        frame = bytes(Compression("lz4", 5, "shuffle", asked).codec().encode(values))  # type: ignore[union-attr]
        ours = blosc_frames.parse_header(frame)
        zstd = blosc_frames.parse_header(Compression("blosc-zstd", 1, "shuffle", asked).codec().encode(values))  # type: ignore[union-attr]
        assert blosc is not None and ours is not None and zstd is not None
        assert blosc.blocksize == max(64 << 10, asked * values.dtype.itemsize) != asked
        assert not blosc.flags & blosc_frames.DONT_SPLIT
        for head in (ours, zstd):
            assert head.blocksize == asked and head.flags & blosc_frames.DONT_SPLIT
        assert ours.compressor == lz4_blocks.LZ4 and blosc_frames.block_starts(frame) is not None
        assert bytes(numcodecs.Blosc().decode(frame)) == values.tobytes()


def test_a_cache_written_with_an_lz4_blocksize_reads_a_few_rows_by_its_blocks(
    tmp_path: Path, fingerprint: dict
) -> None:
    root = tmp_path / "cache"
    with pytest.raises(zs.ConfigError, match=r"shuffle: lz4 in blocks of 8192 bytes is written byte-shuffled or not"):
        zs.open_cache(str(root), fingerprint, compression=Compression("lz4", 5, "bitshuffle", 8 << 10))
    assert not root.exists()  # refused before anything is created
    batch: dict[str, Any] = make_batch(64, seed=5)
    offsets = torch.arange(0, 64 * 300 + 1, 300)
    batch["responses"] = torch.nested.nested_tensor_from_jagged(torch.randint(0, 151936, (64 * 300,)), offsets)
    codec = Compression("lz4", 5, "shuffle", 1 << 10)
    zs.open_cache(str(root), fingerprint, compression=codec, chunk_bytes=8 << 10).write(1, batch)
    view = zs.open_cache(str(root)).load(1)
    assert_equal(view.to_dict(), batch)
    values = view._parts[0].arrays["responses"]["values"]
    assert values.compression == codec and values.blocks is not None and all(len(s) > 1 for s in values.blocks)
    rows = [3, 40, 41]
    want = [batch["responses"].unbind()[i].tolist() for i in rows]
    assert [r.tolist() for r in view["responses"][rows].unbind()] == want
    assert zs.open_cache(str(root)).verify().ok


@pytest.mark.parametrize(
    ("codec", "error"),
    [
        (Compression("auto", blocksize=1001), "does not keep a block size of 1001"),  # rounded down per item size
        (Compression("blosc-zstd", 1, "shuffle", 8200), "does not keep a block size of 8200"),  # not for 16-byte items
        (Compression("auto", blocksize=100), "does not keep a block size of 100"),  # raised to 128
        (Compression("zstd", 3, blocksize=8192), "zstd has no blocks"),
        (Compression("none", 0, blocksize=4096), "none has no blocks"),
    ],
)
def test_a_cache_is_not_written_with_a_blocksize_blosc_would_change(
    tmp_path: Path, fingerprint: dict, codec: Compression, error: str
) -> None:
    with pytest.raises(zs.ConfigError, match=f"blocksize: .*{error}"):
        zs.open_cache(str(tmp_path / "cache"), fingerprint, compression=codec)
    assert not (tmp_path / "cache").exists()
    for fine in (Compression("auto", blocksize=8 << 10), Compression("blosc-zstd", 1, "shuffle", 144)):
        assert zs.open_cache(str(tmp_path / "ok"), fingerprint, compression=fine).compression == fine


def test_a_cache_written_with_blosc_lz4_frames_and_a_blocksize_still_reads(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # written before blocksizes were refused for lz4 (blosc's own frames of 64 KiB split
    # blocks): its records name one, and read as any
    batch: dict[str, Any] = make_batch(9, seed=3)
    codec = Compression("lz4", 5, "shuffle", 8 << 10)
    with monkeypatch.context() as m:
        m.setattr(lz4_blocks.Blosc, "encode", numcodecs.Blosc.encode)
        zs.open_cache(str(tmp_path), fingerprint, compression=codec, chunk_bytes=64).write(1, batch)
    view = zs.open_cache(str(tmp_path), fingerprint).load(1)
    assert_equal(view.to_dict(), batch)
    assert view._parts[0].arrays["input_ids"]["data"].compression == codec
    assert [r.tolist() for r in view["responses"][[1, 7]].unbind()] == [
        batch["responses"].unbind()[i].tolist() for i in (1, 7)
    ]
    assert zs.open_cache(str(tmp_path)).verify().ok


def test_explicit_blosc_zstd_round_trips(tmp_path: Path, fingerprint: dict) -> None:
    batch: dict[str, Any] = make_batch(7, seed=4)
    cache = zs.open_cache(str(tmp_path), fingerprint, compression="blosc-zstd:3", chunk_bytes=32)
    cache.write(1, batch)
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(1).to_dict(), batch)
    (part,) = cache.load(1)._parts
    assert part.arrays["input_ids"]["data"].compression == Compression("blosc-zstd", 3)


@pytest.mark.parametrize(
    ("narrow", "wide"), [("u1", "i8"), ("u2", "i8"), ("u4", "i8"), ("i4", "i8"), ("i1", "i2"), ("u1", "u4")]
)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 4097])
def test_widening_in_place_is_exact(narrow: str, wide: str, n: int) -> None:
    rng = np.random.default_rng(n)
    info = np.iinfo(narrow)
    values = rng.integers(info.min, info.max, size=n, endpoint=True, dtype=narrow)
    region = np.full(n, -1 if np.dtype(wide).kind == "i" else 7, dtype=wide)
    view = narrow_view(region, np.dtype(narrow))
    assert view.size == n and np.shares_memory(view, region)
    view[:] = values
    widen_in_place(region, view)
    assert np.array_equal(region, values.astype(wide))


def test_chunks_of_rows_holds_every_value_of_the_rows() -> None:
    rng = np.random.default_rng(3)
    for _ in range(400):
        n = int(rng.integers(1, 30))
        lengths = rng.integers(0, 9, n) * (rng.random(n) < 0.7)  # many empty rows
        per = int(rng.integers(1, 12))
        first = first_rows(lengths, per)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        assert len(first) == -(-int(offsets[-1]) // per)
        for start in range(n + 1):
            for stop in range(start, n + 1):
                need = {int(v) // per for v in range(offsets[start], offsets[stop])}
                got = set(chunks_of_rows(first, start, stop))
                assert need <= got and len(got - need) <= 1, (lengths.tolist(), per, start, stop)


def _edit_first_rows(root: Path, edit: Any) -> int:
    """Apply ``edit(first_rows) -> new or None (drop it)`` to every values array of every
    complete record, re-checksummed as a writer would have; the arrays edited."""
    edited = 0
    for meta in root.rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        part = doc.get("attributes", {}).get(layout.PART_ATTR)
        if not part or part.get("state") != "complete":
            continue
        for column in part["columns"].values():
            array = column["arrays"].get("values", {})
            if "first_rows" in array:
                new = edit(array.pop("first_rows"))
                if new is not None:
                    array["first_rows"] = new
                edited += 1
        part["checksum"] = layout.doc_checksum(part)
        meta.write_text(json.dumps(doc))
    return edited


_EDITS = {
    "drop": lambda first: None,  # as written before first_rows existed
    "wrong": lambda first: [0] * (len(first) - 1) + [17],
    "short": lambda first: first[1:],
}


@pytest.mark.parametrize("edit", list(_EDITS))
def test_rows_read_right_whatever_the_chunk_rows_say(tmp_path: Path, fingerprint: dict, edit: str) -> None:
    """``first_rows`` only says which chunks to fetch early: records without it (written before
    it existed) or with wrong values read the same rows; a malformed one is a MetadataError."""
    parts = [make_batch(9, seed=i, offset=10 * i) for i in range(2)]
    cache = zs.open_cache(str(tmp_path), fingerprint, chunk_bytes=16)
    for p in parts:
        cache.write(4, p, expected=2)
    assert _edit_first_rows(tmp_path, _EDITS[edit]) >= 4
    reopened = zs.open_cache(str(tmp_path), fingerprint)
    if edit == "short":
        view = reopened.load(4)  # a column's entries are checked when the column is first used
        assert_equal(view["input_ids"][:], concat(parts)["input_ids"])
        with pytest.raises(zs.MetadataError, match=r"step 4, .*first_rows"):
            view["responses"]
        return
    merged = concat(parts)
    for view in (reopened.load(4), zs.open_cache(_NotLocal(str(tmp_path)), fingerprint).load(4)):
        _check_ranges(view, merged)


class _NotLocal(zarr.storage.LocalStore):
    """The same files through zarr's store API: read as an object store is (chunks fetched
    ahead by us, not hinted to the kernel)."""


def _check_ranges(view: Any, merged: dict[str, Any]) -> None:
    for name in ("responses", "uid", "raw_prompt"):
        for start, stop in [(0, 2), (3, 12), (8, 10), (17, 18), (0, 18), (5, 5)]:
            got = view[name][start:stop]
            if name == "responses":
                want = merged[name].unbind()[start:stop]
                assert [r.tolist() for r in got.unbind()] == [r.tolist() for r in want], (name, start, stop)
            else:
                assert list(got) == list(merged[name][start:stop]), (name, start, stop)


@pytest.mark.parametrize("name", ["auto", "zstd", "blosc-zstd", "lz4", "none"])
def test_only_blosc_codecs_say_their_chunks_are_blosc_frames(name: str) -> None:
    codec = chunks.Compression(name)  # type: ignore[arg-type]
    assert codec.is_blosc == (name in ("blosc-zstd", "lz4"))
    assert chunks.Compression("auto").for_dtype(np.dtype(np.int64)).is_blosc  # token ids: blosc blocks
