"""Issue 15, points 1, 2, 6 and 7: what a reader trusts comes from records bound to their
place, every number in a record is checked before use, and damaged metadata is a typed error.

Moving, swapping and editing keys (step and mini-batch 'directories', run and mini-batch
records, members of data files, step summaries, the experiment record) runs over the
``location`` fixture (memory, a directory, S3) through ``helpers.Keys``: a copy tool or another
program can do that to any backend. The forged chunks, crafted or oversized numbers and deep
JSON stay on a local directory: what they check is the reading of a record's bytes once
fetched, the same code whatever the backend, so more backends would add cases and no coverage."""

from __future__ import annotations

import json
import re
import shutil
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import CountingStore, KeyRegion, Keys, assert_equal, concat, make_batch

import zarr_skip as zs
from zarr_skip.format import block_tables, chunks, layout, records
from zarr_skip.format.records import Place
from zarr_skip.store.catalog import group_doc
from zarr_skip.store.storage import Storage

EXP = "exp_proj/GBS4_N2_in8_out16"


def _write_three(location: Any, fingerprint: dict) -> dict[int, dict[str, Any]]:
    """Steps 1..3 of two mini-batches of 6 rows each (so same-size chunks abound)."""
    cache = zs.open_cache(location, fingerprint, chunk_bytes=48)
    written = {}
    for step in (1, 2, 3):
        batches = [make_batch(6, seed=10 * step + i, offset=100 * step + 6 * i) for i in range(2)]
        for b in batches:
            cache.write(step, b, expected=2)
        written[step] = concat(batches)
    return written


@pytest.fixture
def three(tmp_path: Path, fingerprint: dict) -> tuple[Path, dict[int, dict[str, Any]]]:
    """The three steps on a local directory, for the tests of what a record's bytes say."""
    return tmp_path, _write_three(tmp_path, fingerprint)


@pytest.fixture
def keyed(location: Any, fingerprint: dict) -> tuple[Keys, dict[int, dict[str, Any]]]:
    """The three steps on every backend, moved and edited through their keys."""
    written = _write_three(location, fingerprint)
    return Keys(location), written


def _run(keys: Keys, step: int) -> str:
    """The run 'directory' of ``step`` (its one run)."""
    (run,) = keys.dirs(f"{EXP}/{step}")
    return run


def _record(keys: Keys, step: int, index: int) -> str:
    return f"{_run(keys, step)}/{index}/zarr.json"


def _chunk(keys: Keys, step: int, index: int, column: str) -> KeyRegion:
    """The chunk member of ``column`` in mini-batch ``index``'s data file."""
    return keys.region(f"{_run(keys, step)}/{index}", column)


def _swap_bytes(a: KeyRegion, b: KeyRegion) -> None:
    """Swap two chunk members of one size between (or within) data files."""
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


def _edit(path: Path, attr: str, fn: Any) -> None:
    doc = json.loads(path.read_text())
    fn(doc["attributes"][attr])
    doc["attributes"][attr]["checksum"] = layout.doc_checksum(doc["attributes"][attr])
    path.write_text(json.dumps(doc))


def _record_path(root: Path, step: int, index: int) -> Path:
    """A mini-batch record's file, for the local tests."""
    (run,) = [d for d in (root / EXP / str(step)).iterdir() if d.is_dir()]
    return run / str(index) / "zarr.json"


# -- point 1: moved and swapped files -----------------------------------------------------------


def test_swapped_step_directories_are_refused_naming_both_places(keyed: Any, location: Any) -> None:
    keys, written = keyed
    keys.swap(f"{EXP}/1", f"{EXP}/2")
    cache = zs.open_cache(location)
    with pytest.raises(zs.MetadataError, match=r"belongs to experiment '.*', step 2,.* but lies at .*step 1"):
        cache.load(1)
    assert_equal(cache.load(3).to_dict(), written[3])  # the rest still loads
    kinds = {(p.step, p.kind) for p in cache.verify().problems}
    assert {(1, "misplaced"), (2, "misplaced")} <= kinds


@pytest.mark.parametrize("other", [(1, 1), (2, 0)], ids=["same step", "another step"])
def test_swapped_same_size_chunks_are_a_checksum_error(keyed: Any, location: Any, other: tuple[int, int]) -> None:
    keys, _ = keyed
    a, b = _chunk(keys, 1, 0, "input_ids"), _chunk(keys, *other, "input_ids")
    assert a.length == b.length and a.read_bytes() != b.read_bytes()
    _swap_bytes(a, b)
    cache = zs.open_cache(location)
    where = re.escape(str(a))
    with pytest.raises(zs.ChecksumError, match=rf"step 1, mini-batch 0, column 'input_ids'.*{where}.*another chunk"):
        cache.load(1)["input_ids"][:]
    with pytest.raises(zs.ChecksumError):
        cache.load(other[0])["input_ids"][:]
    problems = [p for p in cache.verify().problems if p.path == str(a)]
    # one per chunk of the shard; verify names where the chunk found there belongs
    assert problems and all(p.kind == "ChecksumError" for p in problems)
    assert all(f"it is step {other[0]}, mini-batch {other[1]}, column 'input_ids', chunk" in p.error for p in problems)


def test_swapped_minibatch_records_and_directories(keyed: Any, location: Any) -> None:
    keys, _ = keyed
    keys.swap(f"{_run(keys, 1)}/0", f"{_run(keys, 1)}/1")
    cache = zs.open_cache(location)
    with pytest.raises(zs.MetadataError, match=r"mini-batch 1 but lies at .*mini-batch 0"):
        cache.load(1)
    assert "misplaced" in {p.kind for p in cache.verify(1).problems}


def test_a_run_record_swapped_with_one_expecting_another_count(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(1, make_batch(4, seed=1), expected=1)
    for i in range(2):
        cache.write(2, make_batch(4, seed=2 + i), expected=2)
    keys = Keys(location)
    a, b = f"{_run(keys, 1)}/zarr.json", f"{_run(keys, 2)}/zarr.json"
    keys.swap(a, b)
    assert not zs.open_cache(location).verify().ok
    for step in (1, 2):  # without summaries the run records decide: step 2 would "complete" at 1 of 2
        keys.write(f"{EXP}/{step}/zarr.json", b'{"zarr_format":3,"node_type":"group"}')
    with pytest.raises(zs.MetadataError, match=r"belongs to .*step 1, .*but lies at .*step 2"):
        zs.open_cache(location).load(2)
    # even with the place fields edited away and checksums recomputed, the count disagrees
    for key in (a, b):
        keys.edit(key, layout.RUN_ATTR, lambda r: r.pop("step"))
    with pytest.raises(zs.MetadataError, match=r"written for 2 mini-batches, its run's record says 1"):
        zs.open_cache(location).load(2)
    assert not zs.open_cache(location).verify().ok


def _copy_store(src: Any, dst: Any) -> None:
    s, d = Storage(src if not isinstance(src, Path) else zs.open_cache(src).storage.store), Storage(dst)
    for key in s.list_prefix(""):
        blob = s.get(key)
        assert blob is not None
        d.set(key, blob)


def test_a_whole_cache_moved_elsewhere_reads_and_verifies_clean(
    location: Any, fingerprint: dict, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Places are relative to the cache root: another path, bucket or prefix is fine."""
    cache = zs.open_cache(location, fingerprint, chunk_bytes=48)
    batches = [make_batch(6, seed=i) for i in range(2)]
    for b in batches:
        cache.write(4, b, expected=2)
    if isinstance(location, Path):
        moved: Any = tmp_path / "elsewhere" / "cache"
        shutil.copytree(location, moved)
        shutil.rmtree(location)
    elif isinstance(location, CountingStore):
        moved = CountingStore()
        _copy_store(location, moved)
    else:
        from zarr_skip.store._s3 import open_s3_store

        server = request.getfixturevalue("s3_server")
        moved = open_s3_store(server.s3_url(f"t-{uuid.uuid4().hex[:12]}/deeper/prefix"), server.storage_options)
        _copy_store(location, moved)
    reopened = zs.open_cache(moved)
    assert_equal(reopened.load(4).to_dict(), concat(batches))
    report = reopened.verify()
    assert report.ok and report.steps == (4,) and report.unbound == ()


def test_records_of_older_writers_read_as_before_and_verify_calls_them_unbound(keyed: Any, location: Any) -> None:
    keys, written = keyed
    for i in range(2):  # what zarr_skip 0.2 wrote: no place, no crc32c per chunk
        keys.edit(
            _record(keys, 2, i),
            layout.PART_ATTR,
            lambda r: (
                [r.pop(k) for k in ("experiment", "step", "expected")]
                + [a.pop("crc32c") for c in r["columns"].values() for a in c["arrays"].values()]
            ),
        )
    cache = zs.open_cache(location)
    assert_equal(cache.load(2).to_dict(), written[2])
    report = cache.verify()
    assert report.ok and report.unbound == (2,)


def test_a_step_summary_is_checked_against_its_records(keyed: Any, location: Any) -> None:
    keys, written = keyed
    step_doc = f"{EXP}/2/zarr.json"
    keys.edit(step_doc, layout.STEP_ATTR, lambda s: s.update(rows=s["rows"] + 1))
    cache = zs.open_cache(location)
    assert_equal(cache.load(2).to_dict(), written[2])  # the records decide
    (problem,) = cache.verify().problems
    assert problem.kind == "summary" and "rows=13" in problem.error and problem.path == keys.path(step_doc)
    doc = json.loads(keys.read(step_doc))
    doc["attributes"][layout.STEP_ATTR]["rows"] = 12  # right again, but the checksum is not
    keys.write(step_doc, json.dumps(doc).encode())
    (problem,) = zs.open_cache(location).verify().problems
    assert "checksum mismatch" in problem.error


@pytest.mark.parametrize("damage", ["swapped", "deleted"])
def test_array_metadata_plain_zarr_would_misread_is_reported(keyed: Any, location: Any, damage: str) -> None:
    """zarr_skip reads chunks by its records; a plain zarr reader by the arrays' zarr.json."""
    keys, written = keyed
    a = keys.member(f"{_run(keys, 1)}/0", "input_ids/zarr.json")
    doc = a.read_bytes()
    if damage == "swapped":  # another array's document: another stored dtype, the same length
        theirs = doc.replace(b'"data_type":"uint', b'"data_type":"int', 1)
        assert theirs != doc
        a.write_bytes(theirs.replace(b"}", b" }", 1))
    else:
        a.write_bytes(b" " * len(doc))
    cache = zs.open_cache(location)
    assert_equal(cache.load(1).to_dict(), written[1])
    found = {(p.column, p.kind) for p in cache.verify().problems}
    assert ("input_ids", "zarr metadata") in found


# -- point 2: every number read from a record is checked -----------------------------------------


def _forge(root: Path, step: int, index: int, column: str, name: str, forge: Any) -> None:
    """Replace a column's one-chunk array ``name`` with another valid chunk holding
    ``forge(rows)`` and update its record to match (size, crc32c, nbytes, checksum)."""
    path = _record_path(root, step, index)
    doc = json.loads(path.read_text())
    arr = doc["attributes"][layout.PART_ATTR]["columns"][column]["arrays"][name]
    data = np.zeros(arr["chunk"], dtype=np.dtype(arr["dtype"]))
    data[: arr["shape"][0]] = forge(arr["shape"][0])
    blob = chunks.encode(data, chunks.Compression(**arr["codec"]))
    file = path.parent / doc["attributes"][layout.PART_ATTR]["data"]
    offset = file.stat().st_size
    with open(file, "ab") as f:  # the forged chunk after the data file's end, the record moved to it
        f.write(blob)

    def update(rec: dict[str, Any]) -> None:
        rec["nbytes"] += len(blob) - arr["sizes"][0]
        rec["data_nbytes"] = offset + len(blob)
        arr["sizes"], arr["crc32c"], arr["offset"] = [len(blob)], [chunks.trailer(blob)], offset

    update(doc["attributes"][layout.PART_ATTR])
    doc["attributes"][layout.PART_ATTR]["checksum"] = layout.doc_checksum(doc["attributes"][layout.PART_ATTR])
    path.write_text(json.dumps(doc))


FORGED = {"too few": lambda n: [1] * n, "too many": lambda n: [60] + [0] * (n - 1)}


@pytest.mark.parametrize("column", ["tags", "responses", "uid"])  # uid: dictionary-encoded (3 of 6 distinct)
@pytest.mark.parametrize("lengths", list(FORGED))
def test_lengths_that_do_not_add_to_the_stored_values_are_refused(
    tmp_path: Path, fingerprint: dict, column: str, lengths: str
) -> None:
    cache = zs.open_cache(tmp_path, fingerprint)
    cache.write(1, make_batch(6, seed=3))
    _forge(tmp_path, 1, 0, column, "lengths", FORGED[lengths])
    view = zs.open_cache(tmp_path).load(1)
    for read in (lambda: view[column][:], lambda: view[column][2], lambda: view[column][[1, 4]], view.to_dict):
        with pytest.raises(zs.MetadataError, match=rf"step 1, mini-batch 0, column '{column}'.*lengths add to"):
            read()
    problems = zs.open_cache(tmp_path).verify().problems  # and the ZIP's member is not the recorded one
    (problem,) = [p for p in problems if p.kind != "ChecksumError" or "chunk member" not in p.error]
    assert problem.kind == "MetadataError" and "lengths add to" in problem.error


def test_dictionary_codes_outside_the_entries_are_refused(tmp_path: Path, fingerprint: dict) -> None:
    cache = zs.open_cache(tmp_path, fingerprint)
    cache.write(1, make_batch(6, seed=3))
    assert "codes" in cache.load(1)._parts[0].arrays["uid"]
    _forge(tmp_path, 1, 0, "uid", "codes", lambda n: [0, 1, 2, 3, 0, 1])  # 3 entries stored
    view = zs.open_cache(tmp_path).load(1)
    for read in (lambda: view["uid"][:], lambda: view["uid"][2], lambda: view["uid"].lengths(), view.to_dict):
        with pytest.raises(zs.MetadataError, match=r"step 1, mini-batch 0, column 'uid'.*codes outside the 3"):
            read()
    problems = zs.open_cache(tmp_path).verify().problems
    (problem,) = [p for p in problems if p.kind != "ChecksumError" or "chunk member" not in p.error]
    assert "codes outside" in problem.error


def test_negative_lengths_are_refused() -> None:
    with pytest.raises(zs.MetadataError, match="negative row lengths"):
        records.check_lengths(np.array([3, -1, 4]), 6, "step 1, mini-batch 0, column 'x'")
    with pytest.raises(zs.MetadataError, match="add to 7 values but 6"):
        records.check_lengths(np.array([3, 0, 4]), 6, "here")
    assert records.check_lengths(np.array([2, 0, 4]), 6, "here").tolist() == [2, 0, 4]


def _part(**over: Any) -> dict[str, Any]:
    """A valid complete record of one 4-row tensor column in one chunk of 20 bytes."""
    arr = {"dtype": "<u2", "shape": [4, 3], "chunk": 4, "raw": 24, "sizes": [20], "crc32c": [7]}
    doc = {"experiment": "e", "step": 1, "index": 0, "expected": 1, "rows": 4, "nbytes": 20}
    doc["columns"] = {"x": {"arrays": {"data": arr}}}
    for key, value in over.items():
        target = arr if key in arr else doc
        target[key] = value
    return doc


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"shape": [5, 3]}, "5 rows stored, the record says 4"),
        ({"shape": [-4, 3]}, "shape must be an int >= 0"),
        ({"shape": [4, 10**12]}, "cannot hold"),
        ({"shape": [4] + [1] * 40}, "shape must be a list of 1 to 32"),
        ({"chunk": 0}, "chunk must be an int >= 1"),
        ({"chunk": 2}, "1 chunk sizes for 4 rows in chunks of 2"),
        ({"sizes": [20, 20]}, "2 chunk sizes"),
        ({"sizes": [-20]}, "chunk size must be an int >= 5"),
        ({"raw": 25}, "raw 25 is not the size"),
        ({"crc32c": [1 << 40]}, "crc32c must list one 32-bit value"),
        ({"nbytes": 21}, "nbytes 21 is not the 20 bytes"),
        ({"rows": 3}, "4 rows stored, the record says 3"),
        ({"index": 1}, "index 1 is not below expected 1"),
        ({"expected": 2_000_000}, "expected must be an int in 1 .. 65536"),
        ({"index": True}, "index must be an int"),
        ({"dtype": "O"}, "cannot be stored"),
        ({"dtype": "nonsense"}, "bad dtype"),
        ({"columns": []}, "columns must be a mapping"),
    ],
)
def test_a_record_is_checked_before_use(over: dict[str, Any], match: str) -> None:
    records.check_part(_part(), "rec")
    with pytest.raises(zs.MetadataError, match=match) as exc:
        records.check_part(_part(**over), "path/to/zarr.json")
    assert "path/to/zarr.json" in str(exc.value)


def test_check_place_compares_only_what_both_name() -> None:
    doc = {"experiment": "e", "step": 2, "run": "r1", "index": 1}
    records.check_place(doc, Place("e", 2, "r1", 1), "w")
    records.check_place({"run": "r1", "index": 1}, Place("e", 2, "r1", 1), "w")  # an older record
    with pytest.raises(zs.MetadataError, match=r"belongs to experiment 'e', step 2 but lies at .*step 3"):
        records.check_place(doc, Place("e", 3), "w")
    with pytest.raises(zs.MetadataError, match=r"belongs to .*mini-batch 1 but lies at .*mini-batch 0"):
        records.check_place(doc, Place(None, None, "r1", 0), "w")


def test_a_huge_shape_in_a_record_is_a_metadata_error_not_a_memory_error(three: Any) -> None:
    root, _ = three
    for rows in (10**12, 10**17):

        def huge(rec: dict[str, Any], rows: int = rows) -> None:
            arr = rec["columns"]["scores"]["arrays"]["data"]
            arr["shape"], arr["chunk"] = [rows], rows
            rec["rows"] = rows
            for c in rec["columns"].values():
                for name, a in c["arrays"].items():
                    if name in ("data", "lengths"):
                        a["shape"][0] = rows

        _edit(_record_path(root, 1, 0), layout.PART_ATTR, huge)
        view = zs.open_cache(root)
        with pytest.raises(zs.MetadataError):
            view.load(1)["scores"][:]
        assert not view.verify(1).ok


def _crafted_values(root: Path, fn: Any) -> zs.Cache:
    """The cache at ``root`` with ``fn`` applied to a record's ``responses/values`` entry
    (checksum recomputed)."""
    _edit(_record_path(root, 1, 0), layout.PART_ATTR, lambda rec: fn(rec["columns"]["responses"]["arrays"]["values"]))
    return zs.open_cache(root)


@pytest.mark.parametrize("form", ["table", "lists"])
def test_a_block_index_of_no_blocks_but_a_checksum_is_a_metadata_error(three: Any, form: str) -> None:
    def crafted(a: dict[str, Any]) -> None:
        starts, crcs = [[] for _ in a["sizes"]], [[1] for _ in a["sizes"]]
        if form == "table":
            a["block_table"] = block_tables.to_json(starts, crcs)
        else:
            a["blocks"], a["block_crc32c"] = starts, crcs

    message = "block_table lists 0 starts and [0-9]+ checksums" if form == "table" else "block_crc32c must list"
    cache = _crafted_values(three[0], crafted)
    with pytest.raises(zs.MetadataError, match=f"responses/values: {message}"):
        cache.load(1)["responses"][:]
    (problem,) = cache.verify().problems
    assert problem.kind == "metadata" and re.search(f"responses/values: {message}", problem.error)


def test_a_values_shape_beyond_a_float_is_a_metadata_error(three: Any) -> None:
    """The chunk count of a shape is counted in ints: 10**400 values (a float cannot hold it)
    are refused like any shape its chunk sizes do not fit, not an OverflowError."""

    def crafted(a: dict[str, Any]) -> None:
        a["shape"][0] = 10**400

    cache = _crafted_values(three[0], crafted)
    with pytest.raises(zs.MetadataError, match=r"responses/values: \d+ chunk sizes for 1000000000"):
        cache.load(1)["responses"][:]
    assert not cache.verify().ok


@pytest.mark.parametrize(
    ("attr", "key", "value"),
    [
        (layout.RUN_ATTR, "started", 10**400),
        (layout.RUN_ATTR, "created", 10**400),
        (layout.PART_ATTR, "heartbeat", 10**400),
        (layout.STEP_ATTR, "completed", 10**400),
        (layout.STEP_ATTR, "completed", "yesterday"),
    ],
)
def test_a_time_no_float_holds_is_damage_not_an_untyped_error(
    three: Any, fingerprint: dict, attr: str, key: str, value: Any
) -> None:
    """A record's time (checksum recomputed) that is no number of seconds a float holds reads
    as a damaged record: status, load, verify and gc go on or raise typed errors, and verify
    reports it."""
    root, written = three
    step = root / EXP / "1"
    (run,) = [d for d in step.iterdir() if d.is_dir()]
    path = {layout.RUN_ATTR: run / "zarr.json", layout.STEP_ATTR: step / "zarr.json"}.get(attr)
    _edit(path or _record_path(root, 1, 0), attr, lambda rec: rec.update({key: value}))
    cache = zs.open_cache(root, fingerprint)
    assert [i.complete for i in cache.status()] == [True, True, True]
    try:
        assert_equal(cache.load(1).to_dict(), written[1])
    except zs.MissingDataError:  # a mini-batch record unreadable: the step lost it
        assert attr == layout.PART_ATTR
    assert not cache.verify().ok
    cache.gc(dry_run=True)


def test_a_summary_expecting_two_million_minibatches_builds_no_keys(fingerprint: dict) -> None:
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint)
    cache.write(1, make_batch(4, seed=1))
    storage = Storage(store)
    key = layout.meta_key(layout.join(EXP, "1"))
    doc = json.loads(storage.get(key) or b"")
    summary = doc["attributes"][layout.STEP_ATTR]
    summary["expected"] = 2_000_000
    summary["checksum"] = layout.doc_checksum(summary)
    storage.set(key, json.dumps(doc).encode())
    store.reads.clear()
    tracemalloc.start()
    try:
        reader = zs.open_cache(store)
        assert len(reader.load(1)) == 4 and [i.expected for i in reader.status()] == [1]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # two million keys would be over 100 MB of strings; neither built nor read
    assert peak < 16 * 2**20 and sum(store.reads.values()) < 50
    (problem,) = reader.verify().problems
    assert problem.kind == "summary" and "expected must be an int in 1 .. 65536" in problem.error


def test_expected_beyond_the_bound_is_refused_before_writing(tmp_path: Path, fingerprint: dict) -> None:
    cache = zs.open_cache(tmp_path, fingerprint)
    with pytest.raises(zs.ConfigError, match="expected"):
        cache.write(1, make_batch(2), expected=records.MAX_EXPECTED + 1)
    assert not (tmp_path / EXP / "1").exists()


# -- point 6: deep or huge metadata ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["root", "record", "meta_info"])
def test_deeply_nested_json_is_a_metadata_error(three: Any, where: str) -> None:
    root, _ = three
    deep = "[" * 200_000 + "]" * 200_000
    if where == "root":
        (root / "zarr.json").write_text(deep)
        with pytest.raises(zs.MetadataError, match="too deeply nested"):
            zs.open_cache(root)
        return
    path = _record_path(root, 1, 0)
    text = path.read_text()
    if where == "record":
        path.write_text(text.replace('"zarr_format"', f'"x":{deep},"zarr_format"', 1))
    else:
        _edit(path, layout.PART_ATTR, lambda r: r.update(meta_info=json.loads("[" * 900 + "]" * 900)))
        path.write_text(path.read_text().replace("[" * 900, "[" * 100_000).replace("]" * 900, "]" * 100_000))
    with pytest.raises(zs.CorruptCacheError):
        zs.open_cache(root).load(1)
    assert not zs.open_cache(root).verify().ok


@pytest.mark.parametrize("where", ["root", "experiment"])
def test_a_number_longer_than_python_parses_is_a_metadata_error(three: Any, fingerprint: dict, where: str) -> None:
    """An int of more than 4300 digits is valid JSON that ``json.loads`` refuses with a plain
    ValueError: it is damage, reported as such naming the file, never an untyped error."""
    root, _ = three
    path = root / "zarr.json" if where == "root" else root / EXP / "zarr.json"
    path.write_text(path.read_text().replace("{", '{"x":' + "7" * 5000 + ",", 1))
    for opening in (lambda: zs.open_cache(root).load(1), lambda: zs.open_cache(root, fingerprint).load(1)):
        with pytest.raises(zs.MetadataError, match=rf"{re.escape(str(path))}: not valid JSON"):
            opening()


# -- point 7: the experiment record ---------------------------------------------------------------


@pytest.mark.parametrize("edit", ["fingerprint value", "attribute name", "deleted"])
def test_a_damaged_experiment_record_is_reported_not_an_empty_cache(
    keyed: Any, location: Any, fingerprint: dict, edit: str
) -> None:
    keys, _ = keyed
    key = f"{EXP}/zarr.json"
    text = keys.read(key)
    if edit == "fingerprint value":
        keys.write(key, text.replace(b'"max_prompt_length":8', b'"max_prompt_length":9'))
    elif edit == "attribute name":
        keys.write(key, text.replace(b'"zarr_skip.experiment"', b'"zarr_skip.experimenu"'))
    else:
        keys.delete(key)
    assert json.loads(keys.read(key) if keys.exists(key) else "{}") is not None  # still valid JSON
    path = keys.path(key)
    cache = zs.open_cache(location)
    with pytest.raises(zs.MetadataError, match=rf"{re.escape(path)}.*(checksum mismatch|no experiment record)"):
        cache.load(1)
    (problem,) = cache.verify().problems
    assert problem.kind == "experiment" and path in problem.error
    if edit == "fingerprint value":
        with pytest.raises(zs.MetadataError, match="experiment record checksum mismatch"):
            zs.open_cache(location, fingerprint)


def test_a_column_s_entries_are_checked_when_it_is_first_used(three: Any, monkeypatch: Any) -> None:
    """A record's columns are checked one by one, each before its first use: a crafted entry
    of one column (checksum recomputed) leaves the other columns readable and exact, and makes
    that column, and verify, a MetadataError naming it."""
    root, written = three

    def crafted(rec: dict[str, Any]) -> None:
        rec["columns"]["scores"]["arrays"]["data"]["chunk"] = 0

    _edit(_record_path(root, 1, 0), layout.PART_ATTR, crafted)
    checked: list[str] = []
    real = records.check_column
    monkeypatch.setattr(records, "check_column", lambda doc, name, at: checked.append(name) or real(doc, name, at))
    view = zs.open_cache(root).load(1)
    assert checked == []  # loading a step checks its records' frames, not their columns
    assert list(view["uid"][:]) == list(written[1]["uid"])
    assert set(checked) == {"uid"}
    with pytest.raises(zs.MetadataError, match=r"step 1, mini-batch 0: .*scores/data: chunk must be an int >= 1"):
        view["scores"]
    report = zs.open_cache(root).verify(1)
    assert [p.minibatch for p in report.problems] == [0] and "scores/data" in report.problems[0].error


# -- a mini-batch record checked on the bytes it was read from ------------------------------------


def test_a_record_is_checked_on_its_bytes_not_encoded_again(three: Any, monkeypatch: Any) -> None:
    root, written = three
    blob = _record_path(root, 2, 0).read_bytes()
    doc = json.loads(blob)["attributes"][layout.PART_ATTR]
    assert blob == layout.seal(group_doc({layout.PART_ATTR: doc}))  # what the writer stores
    assert layout.seal_holds(blob)

    encoded: list[Any] = []  # the small step and experiment records are encoded as before
    monkeypatch.setattr(layout, "doc_checksum", lambda d, f=layout.doc_checksum: encoded.append(d) or f(d))
    assert_equal(zs.open_cache(root).load(2).to_dict(), written[2])
    assert encoded and not [d for d in encoded if "columns" in d]


def test_records_are_sealed_on_every_backend(keyed: Any, location: Any, monkeypatch: Any) -> None:
    keys, written = keyed
    assert all(layout.seal_holds(keys.read(_record(keys, step, i))) for step in (1, 2, 3) for i in range(2))
    encoded: list[Any] = []
    monkeypatch.setattr(layout, "doc_checksum", lambda d, f=layout.doc_checksum: encoded.append(d) or f(d))
    assert_equal(zs.open_cache(location).load(3).to_dict(), written[3])
    assert not [d for d in encoded if "columns" in d]


def test_a_record_edited_in_place_is_refused(three: Any) -> None:
    root, _ = three
    path = _record_path(root, 2, 1)
    blob = path.read_bytes()
    assert blob.count(b'"rows":6,') == 1
    path.write_bytes(blob.replace(b'"rows":6,', b'"rows":5,'))  # same layout, same length
    with pytest.raises(zs.MetadataError, match=rf"mini-batch 1: metadata checksum mismatch at .*{EXP}/2/"):
        zs.open_cache(root).load(2)


def test_a_record_in_another_layout_is_checked_as_parsed(three: Any, monkeypatch: Any) -> None:
    """Records of earlier builds (keys in the order written) and records re-saved by another
    program read as before: their parsed form is encoded and checked."""
    root, written = three
    path = _record_path(root, 2, 0)
    doc = json.loads(path.read_bytes())
    path.write_text(json.dumps(doc, indent=1))
    assert not layout.seal_holds(path.read_bytes())
    encoded: list[Any] = []
    monkeypatch.setattr(layout, "doc_checksum", lambda d, f=layout.doc_checksum: encoded.append(d) or f(d))
    assert_equal(zs.open_cache(root).load(2).to_dict(), written[2])
    assert [d["index"] for d in encoded if "columns" in d] == [0]


@pytest.mark.parametrize(
    "case", ["sealed", "spaced", "flipped", "seal flipped", "not hex", "cut", "not bytes", "empty"]
)
def test_seal_holds_only_for_the_bytes_seal_wrote(case: str) -> None:
    doc = {"rows": 3, "meta_info": {"a": "x"}, "columns": {"b": 1, "a": 2}}
    blob: Any = layout.seal(group_doc({layout.PART_ATTR: doc}))
    assert json.loads(blob)["attributes"] == {layout.PART_ATTR: doc, layout.SEAL_ATTR: blob[-11:-3].decode()}
    assert list(json.loads(blob)["attributes"][layout.PART_ATTR]["columns"]) == ["b", "a"]  # the order written
    at = blob.index(b'"x"') + 1
    blob = {
        "sealed": blob,
        "spaced": json.dumps(json.loads(blob)).encode(),
        "flipped": blob[:at] + b"y" + blob[at + 1 :],
        "seal flipped": blob[:-4] + (b"0" if blob[-4:-3] != b"0" else b"1") + blob[-3:],
        "not hex": blob[:-11] + b"0000000g" + blob[-3:],
        "cut": blob[:-1],
        "not bytes": bytearray(blob),
        "empty": b"",
    }[case]
    assert layout.seal_holds(blob) is (case == "sealed")


def test_verify_checks_the_checksum_of_a_sealed_record(three: Any) -> None:
    """A record sealed with a stale checksum (a writer's bug, or a forger who sealed it again)
    loads on its seal; verify() encodes every record and reports it."""
    root, _ = three
    path = _record_path(root, 3, 0)
    doc = json.loads(path.read_bytes())["attributes"][layout.PART_ATTR]
    doc["meta_info"] = {"edited": True}
    path.write_bytes(layout.seal(group_doc({layout.PART_ATTR: doc})))
    cache = zs.open_cache(root)
    assert cache.load(3).meta_info == {"edited": True}
    (problem,) = cache.verify().problems
    assert problem.kind == "metadata" and "checksum mismatch" in problem.error and problem.path == str(path.parent)


def test_seal_takes_only_a_zarr_json_whose_attributes_come_last() -> None:
    with pytest.raises(ValueError, match="attributes come last"):
        layout.seal(b'{"attributes":{},"zarr_format":3}')
