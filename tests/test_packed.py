"""Packed mini-batches (format 4): one data file per mini-batch, few files, few requests, few
system calls per write, every offset bounded before use, every column kind exact."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _fixture_batch as fx
import pytest
import zarr
from helpers import assert_equal, make_batch
from zarr.storage import MemoryStore

import zarr_skip as zs
from zarr_skip.format import layout, records
from zarr_skip.store import packed

ROOT = Path(__file__).parent.parent


class SetCountingStore(MemoryStore):
    """A MemoryStore that counts the keys stored (what an object store sees as PUTs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored: Counter[str] = Counter()

    async def set(self, key: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.stored[key] += 1
        await super().set(key, value, *args, **kwargs)

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        self.stored[key] += 1
        await super().set_if_not_exists(key, value)


def test_every_column_kind_round_trips_through_one_data_file(tmp_path: Path) -> None:
    for location in (tmp_path / "c", MemoryStore()):
        cache = zs.open_cache(location, fx.FINGERPRINT, chunk_bytes=fx.CHUNK_BYTES)
        for i in range(2):
            cache.write(3, fx.batch(3, i), expected=2)
        view = zs.open_cache(location).load(3)
        for i, part in enumerate(view.minibatches):
            assert_equal(part.to_dict(), fx.batch(3, i), f"{location}, mini-batch {i}")
        assert {p.arrays["uid"]["codes"].file for p in view._parts} == {
            layout.join(p.path, p.arrays["uid"]["codes"].file.rpartition("/")[2]) for p in view._parts
        }
        assert zs.open_cache(location).verify().ok


def test_a_step_is_two_files_per_minibatch_and_three_more(tmp_path: Path, fingerprint: dict[str, Any]) -> None:
    cache = zs.open_cache(tmp_path, fingerprint)
    for i in range(4):
        cache.write(1, make_batch(64, seed=i), expected=4)
    step = tmp_path / cache.experiment / "1"
    files = [p for p in step.rglob("*") if p.is_file()]
    dirs = [step, *(p for p in step.rglob("*") if p.is_dir())]
    assert len(files) == 2 * 4 + 3  # a record and a data file each; step, run and completion records
    assert len(dirs) == 4 + 3  # each mini-batch's, the step's, the run's, the completion's
    for part in cache.load(1)._parts:
        here = sorted(p.name for p in (tmp_path / part.path).iterdir())
        assert len(here) == 2 and here[1] == layout.METADATA and here[0].endswith(packed.SUFFIX)


def test_a_minibatch_stores_three_keys_through_a_zarr_store(fingerprint: dict[str, Any]) -> None:
    store = SetCountingStore()
    cache = zs.open_cache(store, fingerprint)
    stored = []
    for i in range(4):
        store.stored.clear()
        cache.write(1, make_batch(64, seed=i), expected=4)
        stored.append(sum(store.stored.values()))
        assert [k for k in store.stored if k.endswith(packed.SUFFIX)], "the data file is one key"
    # the first also records the run in the step, the last completes it (marker, then the step's
    # group with the summary: the group is written once, at completion, not also when the step starts)
    assert stored[1:3] == [3, 3] and stored[0] == 4 + 3 and stored[3] == 5  # the first: root, 2 experiment groups
    store.stored.clear()
    cache.write(2, make_batch(8), expected=1)  # parameter_sync_step == 1: the whole step at once
    assert sum(store.stored.values()) == 6
    assert max(store.stored.values()) <= 2  # a key is written at most twice (claim, then completion)
    assert store.stored[f"{cache._exp()}/2/zarr.json"] == 1


class GetCountingStore(MemoryStore):
    """A MemoryStore that counts the GETs of each key (what an object store sees)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.got: Counter[str] = Counter()

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.got[key] += 1
        return await super().get(key, *args, **kwargs)


def test_a_whole_minibatch_is_one_ranged_read_of_its_data_file(tmp_path: Path, fingerprint: dict[str, Any]) -> None:
    """Its arrays' chunks lie between ZIP headers and zarr.json members: one GET (from an
    object store) or one pread (a local file) steps over those holes."""
    store = GetCountingStore()
    for location in (store, tmp_path / "c"):
        cache = zs.open_cache(location, fingerprint)
        for i in range(3):
            cache.write(1, make_batch(64, seed=i), expected=3)
    store.got.clear()
    view = zs.open_cache(store, fingerprint).load(1)  # opened read-only, a copy of the store would count
    assert_equal(view.minibatches[1].to_dict(), make_batch(64, seed=1))
    data = {k: n for k, n in store.got.items() if k.endswith(packed.SUFFIX)}
    assert len(data) == 1 and set(data.values()) == {1}, data
    store.got.clear()
    view.to_dict()
    assert len([k for k in store.got if k.endswith(packed.SUFFIX)]) == 3
    assert all(n == 1 for k, n in store.got.items() if k.endswith(packed.SUFFIX))
    from zarr_skip.store import _localfs

    reads: list[str] = []  # one entry per pread (a span of a key read through an open file)
    original = _localfs.Tree.read_spans

    def counted(tree: Any, requests: Any) -> Any:
        reads.extend(key for key, spans in requests for _ in spans)
        return original(tree, requests)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_localfs.Tree, "read_spans", counted)
        local = zs.open_cache(tmp_path / "c").load(1)
        assert_equal(local.minibatches[2].to_dict(), make_batch(64, seed=2))
    assert len([k for k in reads if k.endswith(packed.SUFFIX)]) == 1, reads


class InFlightStore(MemoryStore):
    """A MemoryStore that notes, for every get, the listings in flight when it began (an
    object store's latency made visible: what overlaps is one round trip, not two)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listing: set[str] = set()
        self.gets: list[tuple[str, frozenset[str]]] = []

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.gets.append((key, frozenset(self.listing)))
        await asyncio.sleep(0.002)
        return await super().get(key, *args, **kwargs)

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        self.listing.add(prefix)
        try:
            await asyncio.sleep(0.002)
            async for name in super().list_dir(prefix):
                yield name
        finally:
            self.listing.discard(prefix)


def test_the_ownership_check_and_the_claim_check_are_one_round_of_requests(fingerprint: dict[str, Any]) -> None:
    store = InFlightStore()
    cache = zs.open_cache(store, fingerprint)
    info = cache.write(1, make_batch(8), expected=2)
    record = f"{info.path}/zarr.json"
    step = info.path.rsplit("/", 2)[0]
    # read back after its claim, then before the completion with the step's listing in flight
    assert any(step in listing for key, listing in store.gets if key == record), store.gets


@pytest.mark.parametrize("token", [None, True], ids=["no token", "token"])
def test_a_write_reads_each_record_of_its_step_once(fingerprint: dict[str, Any], token: bool | None) -> None:
    """The last of four mini-batches, by another writer of the run: the step is scanned once,
    also when a token is checked first (the SkipManager's writes), and the completion check
    does not read again the records that scan found complete, nor the record the write just
    stored. By the handle that wrote the three others: none of their records is read again."""
    for same_handle in (True, False):
        store = GetCountingStore()
        cache = zs.open_cache(store, fingerprint, run_id="the-run")
        infos = [cache.write(1, make_batch(8, seed=i), expected=4, token=token) for i in range(3)]
        writer = cache if same_handle else zs.open_cache(store, fingerprint, run_id="the-run")
        store.got.clear()
        last = writer.write(1, make_batch(8, seed=3), expected=4, token=token)
        assert last.step_complete
        reads = 0 if same_handle else 1
        assert [store.got[f"{info.path}/zarr.json"] for info in infos] == [reads] * 3, store.got
        run = last.path.rsplit("/", 1)[0]
        assert store.got[f"{run}/zarr.json"] == reads, store.got  # the run's record: one scan, or none
        # the new record: read back after its claim and before its completion, not after it
        assert store.got[f"{last.path}/zarr.json"] == 2, store.got


def _strace() -> str | None:
    return shutil.which("strace")


@pytest.mark.skipif(_strace() is None, reason="strace is not installed")
def test_a_minibatch_write_makes_at_most_24_file_system_calls(tmp_path: Path) -> None:
    """Counted as on NFS every one is a round trip: ``strace -f -e trace=%file,mkdir``, between
    two markers around the write of each of four mini-batches of a step; without a token and
    with one (the SkipManager's writes: the token's scan is the write's scan), in one process
    (strace's seccomp filter stops it only at the calls counted)."""
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from conftest import FINGERPRINT, make_batch
        import zarr_skip as zs
        batches = [make_batch(256, seed=i) for i in range(4)]
        for token in (None, True):
            cache = zs.open_cache({str(tmp_path)!r} + "/c-%s" % token, dict(FINGERPRINT))
            cache.write(0, make_batch(256, seed=9), expected=1)
            for i, batch in enumerate(batches):
                os.access("/MARK-start-%s-%d" % (token, i), os.F_OK)
                cache.write(1, batch, expected=4, token=token)
                os.access("/MARK-end-%s-%d" % (token, i), os.F_OK)
        """
    )
    out = tmp_path / "trace"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [str(_strace()), "-f", "-qq", "--seccomp-bpf", "-e", "trace=%file,mkdir", "-o", str(out)]
    subprocess.run([*cmd, sys.executable, "-c", script], check=True, env=env, timeout=300, capture_output=True)
    lines = out.read_text().splitlines()
    for token in (None, True):
        counts = []
        for i in range(4):
            start = next(n for n, line in enumerate(lines) if f"/MARK-start-{token}-{i}" in line)
            end = next(n for n, line in enumerate(lines) if f"/MARK-end-{token}-{i}" in line)
            counts.append(sum(1 for line in lines[start + 1 : end] if "resumed>" not in line))
        # the first 24 (it scans the step), the middle ones 12-13 and the last 20 (it completes
        # the step): they go on from the first one's scan without listing the step (StepMemo)
        assert max(counts) <= 24, (token, counts)
        assert counts[1] <= 13 and counts[2] <= 13 and counts[3] <= 20, (token, counts)


def _record(root: Path) -> tuple[Path, dict[str, Any]]:
    (path,) = [p for p in root.rglob("zarr.json") if layout.PART_ATTR in p.read_text()]
    return path, json.loads(path.read_text())


def _edit(path: Path, doc: dict[str, Any], edit: Any) -> None:
    part = doc["attributes"][layout.PART_ATTR]
    edit(part)
    part["checksum"] = layout.doc_checksum(part)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda p: p.update(data_nbytes=10), "lie outside the data file of 10 bytes"),
        (lambda p: p.update(data_nbytes=-1), "data_nbytes must be an int >= 0"),
        (lambda p: p.update(container="tar"), "unknown container 'tar'"),
        (lambda p: p["columns"]["uid"]["arrays"]["values"].update(offset=-3), "offset must be an int >= 0"),
        (lambda p: p["columns"]["uid"]["arrays"]["values"].update(offset="9"), "offset must be an int >= 0"),
        (lambda p: p["columns"]["uid"]["arrays"]["values"].update(offset=10**15), "lie outside the data file"),
        (
            lambda p: p["columns"]["uid"]["arrays"]["values"].update(
                offset=p["columns"]["input_ids"]["arrays"]["data"]["offset"]
            ),
            "overlap in the data file",
        ),
    ],
    ids=["short file", "negative size", "container", "negative", "not an int", "past the end", "overlap"],
)
def test_every_offset_is_bounded_before_use(tmp_path: Path, fingerprint: dict[str, Any], edit: Any, match: str) -> None:
    cache = zs.open_cache(tmp_path, fingerprint)
    cache.write(1, make_batch(6))
    path, doc = _record(tmp_path)
    _edit(path, doc, edit)
    with pytest.raises(zs.MetadataError, match=match):
        zs.open_cache(tmp_path).load(1)
    (problem,) = zs.open_cache(tmp_path).verify().problems
    assert match.split(" ")[0] in problem.error


def test_the_data_file_is_a_zip_of_stored_members_plain_zarr_opens(tmp_path: Path, fingerprint: dict[str, Any]) -> None:
    cache = zs.open_cache(tmp_path, fingerprint)
    info = cache.write(1, make_batch(9))
    (part,) = cache.load(1)._parts
    (data_file,) = (tmp_path / info.path).glob("*.zip")
    members = packed.members_of(data_file.read_bytes())  # refuses compressed members
    for name, arrays in part.arrays.items():
        for aname, array in arrays.items():
            inner = array.path[len(array.file or "") + 1 :]
            key = layout.chunk_key(inner, 0, len(array.shape), array.separator)
            assert members[key][0] == array.offset, f"{name}/{aname}"
    with zarr.storage.ZipStore(data_file, mode="r") as zipped:
        group = zarr.open_group(zipped, mode="r")
        place = group.attrs[layout.DATA_ATTR]
        assert (place["step"], place["index"], place["run"]) == (1, 0, cache.run_id)
        assert sorted(group.keys()) == sorted(part.arrays)


def test_records_name_where_each_chunk_lies_and_old_readers_are_refused(
    tmp_path: Path, fingerprint: dict[str, Any]
) -> None:
    cache = zs.open_cache(tmp_path, fingerprint, chunk_bytes=64)
    cache.write(1, make_batch(40))
    _, doc = _record(tmp_path)
    rec = doc["attributes"][layout.PART_ATTR]
    assert rec["container"] == "zip" and rec["data"].endswith(".zip")
    records.check_part(rec, "here")  # bounded and consistent
    assert json.loads((tmp_path / "zarr.json").read_text())["attributes"]["zarr_skip"]["version"] == 4
    arrays = rec["columns"]["responses"]["arrays"]
    assert arrays["values"]["shard"] and arrays["values"]["offset"] > 0


def _zipfile_bytes(members: list[packed.Member]) -> bytes:
    """The same members written by ``zipfile`` itself (what packed.write_zip replaced)."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for member in members:
            info = zipfile.ZipInfo(member.name, (1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            value = member.make()
            with zf.open(info, "w", force_zip64=member.size_hint > packed._ZIP64_HINT) as f:
                for piece in (value,) if isinstance(value, bytes) else value:
                    f.write(piece)
    return buf.getvalue()


def _members(big_hint: int = 0) -> list[packed.Member]:
    return [
        packed.Member("zarr.json", lambda: b'{"zarr_format":3}'),
        packed.Member("empty", lambda: b""),
        packed.Member("tokens/c/0", lambda: iter([b"ab" * 100, b"", b"xyz" * 30]), 300),
        packed.Member("réponses/zarr.json", lambda: b"{}"),  # a UTF-8 name, flagged
        packed.Member("logp/c/0", lambda: (bytes([i]) * 60 for i in range(9)), big_hint),
        packed.Member("mask/c/0", lambda: b"\x01" * 7),  # past 2 GiB with the lowered limits
    ]


@pytest.mark.parametrize("big_hint", [0, (1 << 30) + 1])
def test_the_data_file_is_byte_for_byte_what_zipfile_writes(big_hint: int) -> None:
    import zipfile

    members = _members(big_hint)
    blob, spans = packed.zip_bytes(members)
    assert blob == _zipfile_bytes(members)
    with zipfile.ZipFile(__import__("io").BytesIO(blob)) as zf:
        assert zf.testzip() is None  # every CRC right
        for m in members:
            value = m.make()
            data = value if isinstance(value, bytes) else b"".join(value)
            assert zf.read(m.name) == data
            start, length = spans[m.name]
            assert blob[start : start + length] == data
    assert packed.members_of(blob) == spans


def test_zip64_records_are_written_as_zipfile_writes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets, sizes and counts beyond ZIP's 32/16-bit fields (a data file over 2 GiB, a
    member over 2 GiB, over 65535 members), with the limits lowered in both writers."""
    import zipfile

    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 500)
    monkeypatch.setattr(packed, "_ZIP64_LIMIT", 500)
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 3)
    monkeypatch.setattr(packed, "_COUNT_LIMIT", 3)
    members = _members((1 << 30) + 1)  # its last member's size is above the lowered limit
    blob, spans = packed.zip_bytes(members)
    assert blob == _zipfile_bytes(members)
    assert b"PK\x06\x06" in blob and b"PK\x06\x07" in blob
    with zipfile.ZipFile(__import__("io").BytesIO(blob)) as zf:
        assert zf.testzip() is None
        assert zf.read("logp/c/0") == b"".join(bytes([i]) * 60 for i in range(9))


def test_a_member_larger_than_its_size_hint_allowed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed, "_ZIP64_LIMIT", 500)
    with pytest.raises(RuntimeError, match="'logp/c/0': 540 bytes"):
        packed.zip_bytes(_members(0))
