"""Reads of a few rows of a chunk of several blosc blocks fetch and decode only the blocks
holding them (``zarr_skip/store/blockreads.py``), give exactly what the whole-chunk path gives
(and chosen rows copied as runs what they give gathered value by value), and turn a damaged
block, a lying block index or a cut data file into a typed error."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FINGERPRINT, CountingStore, Keys
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.storage import MemoryStore

import zarr_skip as zs
from zarr_skip.errors import ChecksumError, MetadataError, MissingDataError
from zarr_skip.format import block_tables, blosc_frames, chunks, layout, zstd_blocks
from zarr_skip.store import blockreads, fetching, reads, storage

#: small blocks and chunks, so that small batches make chunks of several blocks
BLOCK = 1024
CHUNK_BYTES = 8 << 10


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "VALUES_BLOCK_BYTES", BLOCK)


class Spy:
    """Counts the chunks, blocks and bytes read through the block path."""

    def __init__(self) -> None:
        self.chunks = self.blocks = self.fetched = 0

    def __call__(self, p: blockreads.BlockPlan, blobs: Any, where: str) -> np.ndarray:
        self.chunks += 1
        self.blocks += len(p.blocks)
        self.fetched += sum(len(b) for b in blobs if b is not None)
        return _decode(p, blobs, where)


_decode = blockreads.decode


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    found = Spy()
    monkeypatch.setattr(blockreads, "decode", found)
    yield found


def _batch(lengths: list[int], vocab: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    values = torch.randint(0, vocab, (int(offsets[-1]),), generator=g)
    return {
        "responses": torch.nested.nested_tensor_from_jagged(values, offsets=offsets),
        "old_log_probs": torch.nested.nested_tensor_from_jagged(torch.randn(int(offsets[-1]), generator=g), offsets),
    }


def _write(location: Any, batches: list[dict[str, Any]], codec: Any = "auto") -> zs.StepView:
    cache = zs.open_cache(location, FINGERPRINT, chunk_bytes=CHUNK_BYTES, compression=codec)
    for b in batches:
        cache.write(1, b, expected=len(batches))
    return zs.open_cache(location).load(1)


def _rows(batches: list[dict[str, Any]], name: str) -> list[torch.Tensor]:
    return [row for b in batches for row in b[name].unbind()]


def _same(got: Any, want: list[torch.Tensor]) -> None:
    rows = got.unbind()
    assert len(rows) == len(want)
    for a, b in zip(rows, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _long_rows(rows: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 400, rows).tolist()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.lists(st.integers(0, 700), min_size=1, max_size=30), min_size=1, max_size=3),
    vocab=st.sampled_from([3000, 151936]),
    data=st.data(),
)
def test_rows_read_by_blocks_are_the_rows_written(
    small_blocks: None, monkeypatch: pytest.MonkeyPatch, parts: list[list[int]], vocab: int, data: st.DataObject
) -> None:
    batches = [_batch(lengths, vocab, seed) for seed, lengths in enumerate(parts)]
    view = _write(MemoryStore(), batches)
    want = _rows(batches, "responses")
    n = len(want)
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=12))
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start, n))
    # the block path, then every chunk whole; rows copied as runs, then value by value
    for share, runs in ((blockreads.MAX_SHARE, reads.MAX_RUNS), (0.0, reads.MAX_RUNS), (blockreads.MAX_SHARE, 0)):
        monkeypatch.setattr(blockreads, "MAX_SHARE", share)
        monkeypatch.setattr(reads, "MAX_RUNS", runs)
        col = view["responses"]
        _same(col[np.array(idx, dtype=np.int64)], [want[i] for i in idx])
        _same(col[start:stop], want[start:stop])
        assert torch.equal(col[start] if start < n else want[0], want[start] if start < n else want[0])
        _same(view["old_log_probs"][np.array(idx, dtype=np.int64)], [_rows(batches, "old_log_probs")[i] for i in idx])


def test_a_few_rows_fetch_and_decode_only_their_blocks(
    small_blocks: None, spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blockreads, "GAP_BYTES", 0)  # blocks of 1 KiB: no bytes read between them
    store = CountingStore()
    batches = [_batch(_long_rows(256, i), 151936, i) for i in range(4)]
    view = _write(store, batches)
    col = view["responses"]
    values = [p.arrays["responses"]["values"] for p in view._parts]
    per_chunk = CHUNK_BYTES * chunks.BLOCKED_VALUES_CHUNKS // BLOCK  # token ids in blocks: larger chunks
    assert all(a.blocks is not None and all(len(s) == per_chunk for s in a.blocks) for a in values)
    stored = sum(sum(a.sizes) for a in values)
    store.bytes_read.clear()
    idx = np.sort(np.random.default_rng(0).choice(1024, 64, replace=False))
    _same(col[idx], [_rows(batches, "responses")[i] for i in idx])
    fetched = sum(n for key, n in store.bytes_read.items() if "/responses/values/" in key)
    blocks = sum(len(s) for a in values for s in a.blocks or ())
    # 64 rows of ~1 KiB in blocks of 1 KiB: at most three blocks each, of about 1000
    assert spy.chunks > 0 and spy.blocks <= 3 * 64 and spy.blocks < 0.25 * blocks
    assert spy.fetched <= fetched < 0.15 * stored  # (a chunk needing more than half its blocks is read whole)
    store.bytes_read.clear()
    col[:]  # the whole column reads every chunk whole
    assert sum(n for key, n in store.bytes_read.items() if "/responses/values/" in key) > 0.99 * stored
    assert spy.blocks <= 3 * 64


def test_the_default_codec_keeps_one_block_per_chunk_and_no_block_index() -> None:
    view = _write(MemoryStore(), [_batch(_long_rows(64, 0), 151936, 0)])
    a = view._parts[0].arrays["responses"]["values"]
    assert a.compression.blocksize == chunks.AUTO_BLOCK_BYTES and a.blocks is None


def test_an_explicit_codec_of_small_blocks_reads_by_blocks(spy: Spy) -> None:
    codec = chunks.Compression("blosc-zstd", 1, "shuffle", 2048)
    batches = [_batch(_long_rows(64, 0), 151936, 0)]
    view = _write(MemoryStore(), batches, codec)
    assert view._parts[0].arrays["old_log_probs"]["values"].blocks is not None  # floats too
    col = view["old_log_probs"]
    col.lengths()  # else a few rows fetch their chunks whole with their lengths (one round trip)
    _same(col[[3, 40]], [_rows(batches, "old_log_probs")[i] for i in (3, 40)])
    assert spy.chunks > 0


def test_auto_with_a_blocksize_stores_the_token_ids_in_such_blocks(spy: Spy) -> None:
    """The per-cache setting: ``Compression("auto", blocksize=...)`` (no module knob)."""
    batches = [_batch(_long_rows(64, 0), 151936, 0)]
    view = _write(MemoryStore(), batches, zs.Compression("auto", blocksize=BLOCK))
    values = view._parts[0].arrays["responses"]["values"]
    assert values.compression.blocksize == BLOCK and values.blocks is not None
    # only the token ids: log-probs keep auto's blocks
    assert view._parts[0].arrays["old_log_probs"]["values"].compression.blocksize == chunks.AUTO_BLOCK_BYTES
    col = view["responses"]
    col.lengths()
    _same(col[[3, 40]], [_rows(batches, "responses")[i] for i in (3, 40)])
    assert spy.chunks > 0 and spy.blocks <= 6


def test_frames_whose_blocks_blosc_sized_otherwise_keep_no_block_index_and_read_whole(
    spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # blosc rounds a block size down to a multiple of the item size (1001 -> 1000 bytes of
    # uint32 token ids): the record's block size would not be the frames', and a few rows
    # counted in it would be read from the wrong blocks (refused now, see test_chunks)
    monkeypatch.setattr(chunks.Compression, "writable", lambda self: self)
    batches = [_batch(_long_rows(64, 0), 151936, 0)]
    store = MemoryStore()
    view = _write(store, batches, zs.Compression("auto", blocksize=1001))
    values = view._parts[0].arrays["responses"]["values"]
    assert values.compression.blocksize == 1001 and values.blocks is not None
    assert all(starts == () for starts in values.blocks)  # no chunk indexed: each read whole
    col = view["responses"]
    col.lengths()
    _same(col[[3, 40]], [_rows(batches, "responses")[i] for i in (3, 40)])
    assert spy.chunks == 0
    assert zs.open_cache(store).verify().ok


@pytest.mark.parametrize(("width", "per"), [(4, BLOCK // 8), (3, 0)])
def test_rows_of_trailing_values_read_by_blocks(monkeypatch: pytest.MonkeyPatch, width: int, per: int) -> None:
    """Values of several numbers each, stored as uint16 (rows of 8 bytes: whole rows per
    block, read from the blocks alone; of 6 bytes: rows across two blocks, read in place in
    their chunk)."""
    pers: list[int] = []
    real = blockreads.decode

    def decode(p: blockreads.BlockPlan, blobs: Any, where: str) -> np.ndarray:
        pers.append(p.per)
        return real(p, blobs, where)

    monkeypatch.setattr(blockreads, "decode", decode)
    g = torch.Generator().manual_seed(width)
    batches = []
    for lengths in (_long_rows(96, width), _long_rows(80, width + 1)):
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor(lengths).cumsum(0)
        values = torch.randint(0, 5000, (int(offsets[-1]), width), generator=g, dtype=torch.int32)
        batches.append({"points": torch.nested.nested_tensor_from_jagged(values, offsets=offsets)})
    view = _write(MemoryStore(), batches, zs.Compression("blosc-zstd", 1, "shuffle", BLOCK))
    col = view["points"]
    assert view._parts[0].arrays["points"]["values"].dtype == np.uint16
    col.lengths()
    want = _rows(batches, "points")
    idx = np.sort(np.random.default_rng(width).choice(len(want), 12, replace=False))
    _same(col[idx], [want[i] for i in idx])
    _same(col[40:43], want[40:43])
    assert pers and set(pers) == {per}


def test_a_few_rows_read_by_blocks_on_every_backend(location: Any, spy: Spy) -> None:
    """Memory, local disk (preads of the data file) and S3 (ranged GETs) alike."""
    batches = [_batch(_long_rows(128, i), 151936, i) for i in range(2)]
    _write(location, batches, zs.Compression("auto", blocksize=BLOCK))
    col = _column(location)
    values = [p.arrays["responses"]["values"] for p in zs.open_cache(location).load(1)._parts]
    blocks = sum(len(s) for a in values for s in a.blocks or ())
    idx = np.sort(np.random.default_rng(3).choice(256, 16, replace=False))
    _same(col[idx], [_rows(batches, "responses")[i] for i in idx])
    assert 0 < spy.blocks <= 3 * 16 < blocks // 4


def test_a_few_rows_on_an_object_store_fetch_each_data_file_in_one_request(
    location: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object store's request costs a round trip: the pieces of a data file a read of a
    few rows needs come in one ranged GET, stepping over the blocks between them
    (``Storage.hole_bytes``), where local files and memory read them apart."""
    from pathlib import Path

    from zarr_skip.store.storage import Storage

    monkeypatch.setattr(blockreads, "GAP_BYTES", 0)  # local files and memory: no bytes between pieces
    monkeypatch.setattr(fetching, "MAX_HOLE_BYTES", 0)
    batches = [_batch(_long_rows(128, i), 151936, i) for i in range(2)]
    _write(location, batches, zs.Compression("auto", blocksize=BLOCK))
    asked: list[list[tuple[str, list[tuple[int, int]]]]] = []
    real = Storage.get_spans
    monkeypatch.setattr(Storage, "get_spans", lambda self, r, **k: asked.append(r) or real(self, r, **k))
    col = zs.open_cache(location).load(1)["responses"]
    idx = np.sort(np.random.default_rng(5).choice(256, 16, replace=False))
    _same(col[idx], [_rows(batches, "responses")[i] for i in idx])
    spans = [len(s) for requests in asked for _, s in requests]
    if isinstance(location, (CountingStore, Path)):
        assert col._storage.hole_bytes is None and max(spans) > 1
    else:
        assert col._storage.hole_bytes == storage.REMOTE_HOLE_BYTES and spans == [1, 1]


def _damaged(codec: Any = "auto") -> tuple[Any, Keys, Any, zs.StepView, list[torch.Tensor]]:
    """A cache of one mini-batch of short rows (several per block): its location, keys, the
    mini-batch, the step and the rows written."""
    location = MemoryStore()
    batches = [_batch(np.random.default_rng(1).integers(20, 100, 300).tolist(), 151936, 0)]
    view = _write(location, batches, codec)
    return location, Keys(location), view._parts[0], view, _rows(batches, "responses")


def _column(location: Any) -> Any:
    """``responses`` of step 1, its lengths read (so that a read of a few rows fetches their
    blocks, not their chunks whole with the lengths)."""
    col = zs.open_cache(location).load(1)["responses"]
    col.lengths()
    return col


def _row_of_block(view: zs.StepView, k: int) -> int:
    """A row whose values all lie in block ``k`` of chunk 0 of ``responses``."""
    a = view._parts[0].arrays["responses"]["values"]
    lengths = view["responses"].lengths()
    ends = np.cumsum(lengths) * a.dtype.itemsize
    starts = ends - lengths * a.dtype.itemsize
    for r, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if e > s and s // BLOCK == k == (e - 1) // BLOCK and e <= a.chunk_bytes:
            return r
    raise AssertionError(f"no row within block {k}")


@pytest.mark.parametrize("codec", ["auto", zs.Compression("lz4", 1, "shuffle", BLOCK)])  # zstd's blocks, lz4's
def test_a_damaged_block_is_a_checksum_error(small_blocks: None, codec: Any) -> None:
    location, keys, part, view, want = _damaged(codec)
    a = part.arrays["responses"]["values"]
    assert a.compression.name == ("lz4" if codec != "auto" else "blosc-zstd") and a.blocks is not None
    row = _row_of_block(view, 2)
    region = keys.region(part.path, "responses/values")
    blob = bytearray(region.read_bytes())
    blob[a.blocks[0][2] + 3] ^= 0xFF
    region.write_bytes(bytes(blob))
    col = _column(location)
    with pytest.raises(ChecksumError, match="block 2: checksum mismatch"):
        col[np.array([row])]
    other = _row_of_block(view, 5)
    _same(col[np.array([other])], [want[other]])  # a block not read is not checked
    with pytest.raises(ChecksumError):
        col[:]


@pytest.mark.parametrize("decoder", ["blosc", "zstandard"])
def test_a_block_forged_with_its_checksum_that_does_not_decode_is_a_checksum_error(
    small_blocks: None, monkeypatch: pytest.MonkeyPatch, decoder: str
) -> None:
    """Block 2's zstd stream broken (its length kept) and its recorded crc32c made to match:
    every byte read has the checksum its record names, and the block still does not decode,
    whether blosc or zstandard decodes the blocks read (here 2 and 5)."""
    calls: list[int] = []
    decompressed = zstd_blocks.decompressed
    monkeypatch.setattr(zstd_blocks, "decompressed", lambda h, s: calls.append(len(s)) or decompressed(h, s))
    monkeypatch.setattr(zstd_blocks, "MIN_BLOCKS", 2 if decoder == "zstandard" else 10**9)
    location, keys, part, view, want = _damaged()
    a = part.arrays["responses"]["values"]
    rows = np.array([_row_of_block(view, 2), _row_of_block(view, 5)])
    region = keys.region(part.path, "responses/values")
    blob = bytearray(region.read_bytes())
    start, end = a.blocks[0][2], a.blocks[0][3]
    blob[start + 4 : start + 8] = bytes(4)  # the stream's zstd magic, after its length
    region.write_bytes(bytes(blob))
    _forge(keys, part, lambda e: e["block_crc32c"][0].__setitem__(3, chunks.crc32c(bytes(blob[start:end]))))
    col = _column(location)
    with pytest.raises(ChecksumError, match=r"blocks \[2, 5\] do not decode"):
        col[rows]
    assert calls == ([2] if decoder == "zstandard" else [])
    _same(col[rows[1:]], [want[rows[1]]])  # block 5 alone decodes


def test_a_forged_table_in_the_data_file_is_a_checksum_error(small_blocks: None) -> None:
    location, keys, part, view, _ = _damaged()
    region = keys.region(part.path, "responses/values")
    blob = bytearray(region.read_bytes())
    blob[blosc_frames.HEADER_BYTES + 4] ^= 0x01  # the start of block 1
    region.write_bytes(bytes(blob))
    with pytest.raises(ChecksumError, match="header: checksum mismatch"):
        _column(location)[np.array([_row_of_block(view, 3)])]


def _as_lists(a: dict[str, Any]) -> None:
    """An array entry's ``block_table`` as the ``blocks`` and ``block_crc32c`` lists of lists
    earlier builds wrote."""
    starts, crcs = block_tables.from_json(a.pop("block_table"), a["sizes"], "test")
    a["blocks"], a["block_crc32c"] = [list(x) for x in starts], [list(x) for x in crcs]


def _forge(keys: Keys, part: Any, fn: Any, form: str = "table") -> None:
    """``fn`` applied to the ``responses/values`` entry of ``part``'s record, its block index
    as lists (``form``: kept so, as earlier builds wrote it, or packed again as a table), and
    its checksum recomputed."""

    def edit(record: dict[str, Any]) -> None:
        a = record["columns"]["responses"]["arrays"]["values"]
        _as_lists(a)
        fn(a)
        if form == "table":
            a["block_table"] = block_tables.to_json(a.pop("blocks"), a.pop("block_crc32c"))

    keys.edit(f"{part.path}/zarr.json", layout.PART_ATTR, edit)


def test_lying_block_starts_in_the_record_are_typed_errors(small_blocks: None) -> None:
    location, keys, part, view, _ = _damaged()
    original = json.loads(keys.read(f"{part.path}/zarr.json"))
    row = _row_of_block(view, 3)

    def shift(a: dict[str, Any]) -> None:  # still rising and inside the chunk, but wrong
        a["blocks"][0][3] += 1

    _forge(keys, part, shift)
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        _column(location)[np.array([row])]

    def forge_crcs(a: dict[str, Any]) -> None:  # and the checksums of the pieces it names
        whole = keys.region(part.path, "responses/values").read_bytes()
        cuts = [0, *a["blocks"][0], len(whole) - 4]
        a["block_crc32c"][0] = [chunks.crc32c(whole[x:y]) for x, y in zip(cuts, cuts[1:], strict=False)]

    _forge(keys, part, forge_crcs)
    with pytest.raises(ChecksumError, match="header does not match"):
        _column(location)[np.array([row])]

    for bad in ([0, 1], "x", [[10**12] * 8]):
        keys.write(f"{part.path}/zarr.json", json.dumps(original).encode())
        _forge(keys, part, lambda a, bad=bad: a.__setitem__("blocks", bad), "lists")
        with pytest.raises(MetadataError, match="block"):
            _column(location)[np.array([row])]


def test_block_tables_of_other_types_or_out_of_order_are_metadata_errors(small_blocks: None) -> None:
    """Each chunk's block starts and checksums are ints (not bools, not floats); the starts
    begin right after the header and table, rise, and end before the chunk's crc32c."""
    location, keys, part, view, _ = _damaged()
    original = keys.read(f"{part.path}/zarr.json")
    rows = np.array([_row_of_block(view, 3)])

    def swapped(a: dict[str, Any]) -> None:
        starts = a["blocks"][0]
        starts[2], starts[3] = starts[3], starts[2]

    cases: list[tuple[Any, str, tuple[str, ...]]] = [
        (swapped, "blocks must begin after its header, rise", ("table", "lists")),
        (lambda a: a["blocks"][0].__setitem__(0, 0), "blocks must begin after its header", ("table", "lists")),
        (lambda a: a["blocks"][0].__setitem__(-1, a["sizes"][0] - 2), "end before its checksum", ("table", "lists")),
        (lambda a: a["blocks"][0].__setitem__(2, float(a["blocks"][0][2])), "must be lists of ints", ("lists",)),
        (lambda a: a["block_crc32c"][0].__setitem__(1, True), "must be lists of ints", ("lists",)),
    ]
    for forge, message, forms in cases:
        for form in forms:
            keys.write(f"{part.path}/zarr.json", original)
            _forge(keys, part, forge, form)
            with pytest.raises(MetadataError, match=f"responses/values: .*{message}"):
                _column(location)[rows]


@pytest.mark.parametrize(
    ("forge", "message"),
    [
        (lambda t: t.__setitem__("starts", t["starts"][:-1]), "block_table starts is not base64"),
        (lambda t: t.__setitem__("starts", _less(t["starts"])), "block_table lists [0-9]+ starts and [0-9]+ checksums"),
        (lambda t: t.__setitem__("starts", "AAA="), "block_table starts is not a whole number of uint32 values"),
        (lambda t: t.__setitem__("crc32c", [1, 2]), "block_table crc32c must be a base64 string"),
        (lambda t: t.__setitem__("counts", t["counts"] + [0]), "block_table counts must list one int"),
        (
            lambda t: t.__setitem__("counts", [True] * len(t["counts"])),
            "block_table counts must list one int per chunk",
        ),
        (lambda t: t.__setitem__("counts", [-1] * len(t["counts"])), "block_table counts must not be negative"),
        (lambda t: t.__setitem__("counts", [0] * len(t["counts"])), "block_table lists [0-9]+ starts"),
        (lambda t: t.pop("crc32c"), "block_table must hold counts, starts and crc32c"),
        (lambda t: t.__setitem__("more", 1), "block_table must hold counts, starts and crc32c"),
    ],
)
def test_a_block_table_that_does_not_decode_or_add_up_is_a_metadata_error(
    small_blocks: None, forge: Any, message: str
) -> None:
    location, keys, part, view, _ = _damaged()
    keys.edit(f"{part.path}/zarr.json", layout.PART_ATTR, lambda r: forge(_values(r)["block_table"]))
    with pytest.raises(MetadataError, match=f"responses/values: {message}"):
        _column(location)[np.array([_row_of_block(view, 3)])]


def test_a_record_with_both_a_block_table_and_lists_is_a_metadata_error(small_blocks: None) -> None:
    location, keys, part, view, _ = _damaged()
    table = _values(json.loads(keys.read(f"{part.path}/zarr.json"))["attributes"][layout.PART_ATTR])["block_table"]
    _forge(keys, part, lambda a: a.__setitem__("block_table", table), "lists")
    with pytest.raises(MetadataError, match="responses/values: both a block_table and blocks lists"):
        _column(location)[np.array([_row_of_block(view, 3)])]


def test_block_lists_of_earlier_builds_still_read_a_few_rows_by_their_blocks(small_blocks: None, spy: Spy) -> None:
    location, keys, part, view, want = _damaged()
    _forge(keys, part, lambda a: None, "lists")
    record = json.loads(keys.read(f"{part.path}/zarr.json"))["attributes"][layout.PART_ATTR]
    assert "block_table" not in _values(record) and _values(record)["blocks"][0]
    row = _row_of_block(view, 3)
    _same(_column(location)[np.array([row])], [want[row]])
    assert spy.chunks == 1 and spy.blocks == 1


def _less(packed: str) -> str:
    """A block table's base64 entry with its last value left out."""
    return base64.b64encode(base64.b64decode(packed)[:-4]).decode()


def _values(record: dict[str, Any]) -> dict[str, Any]:
    return record["columns"]["responses"]["arrays"]["values"]


def test_a_cut_data_file_is_a_missing_data_error(small_blocks: None) -> None:
    location, keys, part, view, want = _damaged()
    col = zs.open_cache(location).load(1)["responses"]
    region = keys.region(part.path, "responses/values")
    keys.splice(region.key, region.offset, region.length, region.read_bytes()[: 5 * BLOCK // 2])
    with pytest.raises(MissingDataError, match="truncated"):
        col[np.array([_row_of_block(view, 6)])]
    row = _row_of_block(view, 1)  # its block lies before the cut, whole (and checked)
    _same(_column(location)[np.array([row])], [want[row]])
    with pytest.raises(MissingDataError):
        _column(location)[:]


def test_pieces_of_the_wrong_size_are_refused(small_blocks: None) -> None:
    location, keys, part, view, _ = _damaged()
    a = part.arrays["responses"]["values"]
    p = blockreads.plan(a, 0, np.array([0]))
    assert p is not None and p.blocks == (0,) and len(p.pieces) == 1  # the header and block 0: one range
    whole = keys.region(part.path, "responses/values").read_bytes()
    blobs = [whole[x.start - a.offset : x.start - a.offset + x.length] for x in p.pieces]
    assert np.array_equal(blockreads.decode(p, blobs, "here")[:5], view["responses"][0][:5].numpy())
    with pytest.raises(MissingDataError, match="here: bytes .* are cut"):
        blockreads.decode(p, [blobs[0][:-1]], "here")
    with pytest.raises(MissingDataError, match="missing"):
        blockreads.decode(p, [None], "here")


def test_blocks_close_together_are_one_range_and_far_ones_two(
    small_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, part, _, _ = _damaged()
    a = part.arrays["responses"]["values"]
    rows = np.array([0, 7 * BLOCK // a.dtype.itemsize])  # in blocks 0 and 7
    p = blockreads.plan(a, 0, rows)
    assert p is not None and p.blocks == (0, 7) and len(p.pieces) == 1
    monkeypatch.setattr(blockreads, "GAP_BYTES", 0)
    p = blockreads.plan(a, 0, rows)
    assert p is not None and len(p.pieces) == 2 and sum(x.length for x in p.pieces) < a.sizes[0] / 2


def test_verify_checks_the_block_index_against_the_chunk(small_blocks: None) -> None:
    location, keys, part, _, _ = _damaged()
    assert zs.open_cache(location).verify().ok

    def wrong_crc(a: dict[str, Any]) -> None:
        a["block_crc32c"][0][2] ^= 1

    _forge(keys, part, wrong_crc)
    report = zs.open_cache(location).verify()
    assert not report.ok and "block starts or checksums do not match" in str(report)


def test_a_few_chosen_rows_are_copied_as_runs_not_value_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [_batch(_long_rows(256, i), 151936, i) for i in range(2)]
    view = _write(MemoryStore(), batches)

    original = reads.Batch.index

    def refuse(self: reads.Batch, parts: Any, *args: Any) -> Any:
        if parts[0].path.endswith("values"):
            raise AssertionError("read value by value")
        return original(self, parts, *args)

    monkeypatch.setattr(reads.Batch, "index", refuse)
    idx = np.array([500, 3, 3, 300, 0])
    _same(view["responses"][idx], [_rows(batches, "responses")[i] for i in idx])
