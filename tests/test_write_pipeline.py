"""A write's chunks are compressed while the writer takes its place, and no work outlives it."""

from __future__ import annotations

import errno
import threading
import time
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Keys, assert_equal, concat, make_batch

import zarr_skip as zs
from zarr_skip.errors import StepCompleteError
from zarr_skip.store import _gather, _localfs, chunkjobs, heartbeats, packed, writer
from zarr_skip.store.storage import Storage


def test_compression_starts_before_the_index_is_claimed(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoding = threading.Event()
    encode, claim = chunkjobs.encode_chunk, writer._claim

    def traced_encode(*args: Any) -> bytes:
        encoding.set()
        return encode(*args)

    def waiting_claim(*args: Any, **kwargs: Any) -> Any:
        # the pool is already compressing this batch while the index is being claimed
        assert encoding.wait(60), "no chunk was encoded before the claim"
        return claim(*args, **kwargs)

    monkeypatch.setattr(chunkjobs, "encode_chunk", traced_encode)
    monkeypatch.setattr(writer, "_claim", waiting_claim)
    monkeypatch.setattr(chunkjobs, "INLINE_BYTES", 0)  # every array to the pool, as large ones go
    batch = make_batch(64)
    zs.open_cache(str(tmp_path), fingerprint).write(1, batch)
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(1).to_dict(), batch)


def test_small_arrays_are_compressed_by_the_writing_thread_and_large_ones_in_the_pool(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[int, set[str]] = {}
    encode = chunkjobs.encode_chunk

    def traced_encode(arr: Any, rows: slice, codec: Any) -> bytes:
        threads.setdefault(arr.nbytes, set()).add(threading.current_thread().name)
        return encode(arr, rows, codec)

    monkeypatch.setattr(chunkjobs, "encode_chunk", traced_encode)
    rng = np.random.default_rng(0)
    large = torch.from_numpy(rng.standard_normal((64, 256)))  # 128 KiB
    batch = {"large": large, "small": torch.arange(64), "flag": torch.ones(64, dtype=torch.bool)}
    zs.open_cache(str(tmp_path), fingerprint).write(1, batch)
    me = threading.current_thread().name
    pool = threads.pop(large.numpy().nbytes)
    assert me not in pool and all(n.startswith("zarr-skip") for n in pool), pool
    assert threads and all(names == {me} for names in threads.values()), threads
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(1).to_dict(), batch)


def test_an_inline_chunk_cancelled_is_never_encoded() -> None:
    job = chunkjobs.Inline(np.arange(8), slice(0, 8), zs.Compression("zstd"))
    assert job.result() == job.result()  # encoded when asked, as often as asked
    assert job.cancel()
    with pytest.raises(CancelledError):
        job.result()


def test_a_writer_that_loses_its_claim_encodes_again_and_stores_exactly(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_owner = writer._check_owner
    lost: list[str] = []

    def first_claim_lost(storage: Any, step_path: str, ctx: Any, where: str, key: str, claim: Any) -> bool:
        held = check_owner(storage, step_path, ctx, where, key, claim)
        if not lost:  # as when two writers both won the exclusive create of index 0
            lost.append(key)
            return False
        return held

    encoded: list[int] = []
    encode = chunkjobs.encode_chunk
    monkeypatch.setattr(chunkjobs, "encode_chunk", lambda *a: encoded.append(1) or encode(*a))
    monkeypatch.setattr(writer, "_check_owner", first_claim_lost)
    batch = make_batch(6)
    cache = zs.open_cache(str(tmp_path), fingerprint)
    info = cache.write(1, batch, expected=2)
    assert lost and info.index == 1
    chunks_per_write = len(encoded) // 2
    assert chunks_per_write > 0 and len(encoded) == 2 * chunks_per_write  # every chunk twice
    # the "other writer" of index 0 gives up; another mini-batch completes the step
    cache._storage.delete(lost[0])
    other = make_batch(3, seed=1)
    assert cache.write(1, other, expected=2).index == 0
    view = zs.open_cache(str(tmp_path), fingerprint).load(1)
    assert_equal(view.minibatches[0].to_dict(), other)
    assert_equal(view.minibatches[1].to_dict(), batch)


def test_the_data_file_is_written_while_the_index_is_claimed(
    location: Any, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing = threading.Event()
    publish, claim = Storage.publish_zip, writer._claim
    claimed_on: list[str] = []

    def traced_publish(self: Storage, *args: Any, **kwargs: Any) -> Any:
        writing.set()
        return publish(self, *args, **kwargs)

    def waiting_claim(*args: Any, **kwargs: Any) -> Any:
        # the claim's requests go beside the data file's, not before them
        claimed_on.append(threading.current_thread().name)
        assert writing.wait(30), "the data file was not begun while the index was being claimed"
        return claim(*args, **kwargs)

    monkeypatch.setattr(Storage, "publish_zip", traced_publish)
    monkeypatch.setattr(writer, "_claim", waiting_claim)
    batch = make_batch(64)
    cache = zs.open_cache(location, fingerprint)
    if not cache._storage.creates_stand_at_once:  # a directory, maybe a shared mount: claim first
        with pytest.raises(AssertionError, match="the data file was not begun"):
            monkeypatch.setattr(threading.Event, "wait", lambda self, timeout=None: self.is_set())
            cache.write(1, batch)
        return
    cache.write(1, batch)
    assert claimed_on and threading.current_thread().name not in claimed_on
    assert_equal(zs.open_cache(location, fingerprint).load(1).to_dict(), batch)


def test_a_writer_that_loses_the_index_it_wrote_for_removes_its_file_and_claims_first_next(
    location: Any, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = zs.open_cache(location, fingerprint, run_id="shared-run")
    other = zs.open_cache(location, fingerprint, run_id="shared-run")  # another rank of the run
    me = mine._run.writer
    publish, claim = Storage.publish_zip, writer._claim
    events: list[tuple[str, int]] = []
    theirs, ours = make_batch(3, seed=1), make_batch(5, seed=2)

    def racing_claim(storage: Any, place: Any, run_path: str, index: int, ctx: Any, *rest: Any) -> Any:
        if ctx.writer == me:
            events.append(("claim", index))
            if index == 0:  # the other rank takes index 0 while this writer claims it
                assert other.write(6, theirs, expected=2).index == 0
        return claim(storage, place, run_path, index, ctx, *rest)

    def traced_publish(self: Storage, key: str, *args: Any, **kwargs: Any) -> Any:
        if me in key:
            events.append(("data", int(key.split("/")[-2])))
        return publish(self, key, *args, **kwargs)

    monkeypatch.setattr(writer, "_claim", racing_claim)
    monkeypatch.setattr(Storage, "publish_zip", traced_publish)
    info = mine.write(6, ours, expected=2)
    assert info.index == 1 and info.step_complete
    # index 0 written for beside its claim (a directory: claimed first); index 1 claimed first
    if mine._storage.creates_stand_at_once:
        assert set(events[:2]) == {("claim", 0), ("data", 0)} and events[2:] == [("claim", 1), ("data", 1)]
    else:
        assert events == [("claim", 0), ("claim", 1), ("data", 1)]
    keys = Keys(location)
    assert [k.rsplit("/", 2)[-2] for k in keys.list() if me in k] == ["1"]  # its file for index 0 is gone
    assert_equal(zs.open_cache(location, fingerprint).load(6).to_dict(), concat([theirs, ours]))


def test_a_write_interrupted_while_its_claim_is_pending_leaves_no_claim_behind(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = _localfs.beside

    class Interrupt(BaseException):
        """As KeyboardInterrupt (which pytest takes for its own)."""

    class Interrupted(Future):  # type: ignore[type-arg]
        """The claim's future; the first wait for it is interrupted (Ctrl-C)."""

        def __init__(self, inner: Future) -> None:  # type: ignore[type-arg]
            super().__init__()
            self.inner, self.waited = inner, False

        def result(self, timeout: float | None = None) -> Any:
            if not self.waited:
                self.waited = True
                raise Interrupt
            return self.inner.result(timeout)

    monkeypatch.setattr(_localfs, "beside", lambda *args: Interrupted(beside(*args)))
    monkeypatch.setattr(Storage, "creates_stand_at_once", True)  # as on S3: the claim beside the data
    cache = zs.open_cache(str(tmp_path), fingerprint)
    with pytest.raises(Interrupt):
        cache.write(1, make_batch(8), expected=2)
    monkeypatch.setattr(_localfs, "beside", beside)
    # the claim that stood once the wait was cut short is gone, and nothing refreshes it
    assert not heartbeats._BEATER._claims
    assert not [p for p in tmp_path.rglob("zarr.json") if "zarr_skip.part" in p.read_text()]
    assert zs.open_cache(str(tmp_path)).status() == []
    assert cache.write(1, make_batch(8), expected=1).step_complete


def test_the_step_summary_is_written_while_the_completion_group_is_created(
    location: Any, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary_written = threading.Event()
    create, store = Storage.create_if_absent, Storage.set

    def traced_set(self: Storage, key: str, data: bytes) -> None:
        store(self, key, data)
        if b"zarr_skip.complete" in data:
            summary_written.set()

    def waiting_create(self: Storage, key: str, data: bytes, **kwargs: Any) -> bool:
        if b"zarr_skip.completion" in data:  # one round trip of the two, not one after the other
            assert summary_written.wait(30), "the summary was not written while the step's completion was created"
        return create(self, key, data, **kwargs)

    monkeypatch.setattr(Storage, "set", traced_set)
    monkeypatch.setattr(Storage, "create_if_absent", waiting_create)
    cache = zs.open_cache(location, fingerprint)
    assert [cache.write(2, make_batch(3, seed=i), expected=2).step_complete for i in range(2)] == [False, True]
    (info,) = zs.open_cache(location).status()
    assert (info.complete, info.rows) == (True, 6)


def test_a_refused_write_leaves_no_compression_behind(tmp_path: Path, fingerprint: dict, chunk_jobs: list) -> None:
    cache = zs.open_cache(str(tmp_path), fingerprint)
    cache.write(1, make_batch(6))
    made = chunk_jobs
    del made[:]  # the write above
    with pytest.raises(StepCompleteError):
        cache.write(1, make_batch(4096, seed=1))
    assert len(made) == 1 and not made[0]._arrays  # every job it started was dropped
    assert_equal(cache.load(1).to_dict(), make_batch(6))


def _partial_size(root: Path) -> int:
    """The bytes of the data file being written (in place, under its own name), 0 before it exists."""
    files = [p for p in root.rglob(f"*{packed.SUFFIX}") if p.is_file()]
    return files[0].stat().st_size if files else 0


def test_a_shard_is_written_chunk_by_chunk_as_its_chunks_are_compressed(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the last chunk of the token ids waits until the chunks before it are in the shard's file
    # (the file gathers its writes into pieces of _gather.FLUSH_BYTES: the shard is larger)
    # ~3 bytes a value stored: chunks of ~20 KB, ~2.4 MB in all; the last chunk partial (its own call)
    n = 3 * _gather.FLUSH_BYTES // 2 + 1000
    values = np.random.default_rng(0).integers(0, 151_000, n)
    batch = {"ids": torch.nested.nested_tensor_from_jagged(torch.from_numpy(values), torch.tensor([0, n // 4, n]))}
    cache = zs.open_cache(str(tmp_path), fingerprint, chunk_bytes=32 << 10)
    encode = chunkjobs.encode_chunk
    seen: list[int] = []

    def waiting_encode(arr: Any, rows: slice, codec: Any) -> bytes:
        if arr.shape == values.shape and rows.stop >= len(values):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _partial_size(tmp_path) < _gather.FLUSH_BYTES:
                time.sleep(0.01)
            seen.append(_partial_size(tmp_path))
        return encode(arr, rows, codec)

    monkeypatch.setattr(chunkjobs, "encode_chunk", waiting_encode)
    cache.write(1, batch)
    # the data file held the first chunks before the last was compressed
    assert seen and seen[0] >= _gather.FLUSH_BYTES
    got = zs.open_cache(str(tmp_path), fingerprint).load(1)["ids"][:]
    assert torch.equal(got.values(), torch.from_numpy(values))


def test_a_file_that_fails_stops_the_other_writes_and_none_outlives_the_error(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = zs.open_cache(str(tmp_path), fingerprint)
    cache.write(1, make_batch(8))
    write_zip = packed.write_zip
    calls: list[tuple[float, float]] = []

    def full(name: str) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device", name)

    def failing(out: Any, members: Any) -> Any:
        # the disk fills up at the third chunk member, after some bytes of the data file
        chunked = [i for i, m in enumerate(members) if "/c." in m.name or m.name.startswith("c.")]
        members = list(members)
        bad = members[chunked[2]]
        members[chunked[2]] = packed.Member(bad.name, lambda: full(bad.name), bad.size_hint)
        start = time.monotonic()
        try:
            return write_zip(out, members)
        finally:
            calls.append((start, time.monotonic()))

    monkeypatch.setattr(packed, "write_zip", failing)
    with pytest.raises(zs.StorageError, match="no space left") as err:
        cache.write(2, make_batch(4096, seed=1))
    raised = time.monotonic()
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
    time.sleep(0.2)
    assert all(end <= raised for _, end in calls)  # nothing was still writing
    monkeypatch.undo()
    assert cache.steps() == [1] and not (tmp_path / cache.experiment / "2" / cache.run_id / "0").exists()
    assert not list(tmp_path.rglob("*.partial"))  # the half-written data file went with it
    assert_equal(cache.load(1).to_dict(), make_batch(8))


def test_a_directory_that_cannot_be_made_is_a_typed_error(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = zs.open_cache(str(tmp_path), fingerprint)
    cache.write(1, make_batch(8))
    written: list[str] = []

    def refused(self: _localfs.Tree, keys: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self.path(keys[-1]).parent))

    monkeypatch.setattr(_localfs.Tree, "make_dirs", refused)
    monkeypatch.setattr(_localfs.Tree, "_mkdir_fast", lambda self, key: False)
    monkeypatch.setattr(_localfs.Tree, "publish", lambda self, key, write: written.append(key) or ({}, 0))
    with pytest.raises(zs.ReadOnlyCacheError, match="refuses writes"):
        cache.write(2, make_batch(8, seed=1))
    assert written == []  # nothing was written without its directory
    monkeypatch.undo()
    assert cache.steps() == [1]


def test_the_first_write_reads_what_it_created_without_sleeping(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # time.sleep(0) lets go of the GIL while the pool compresses the batch: ~0.1-4 ms a call
    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    reads: list[str] = []
    read = _localfs.Tree.read
    monkeypatch.setattr(_localfs.Tree, "read", lambda tree, key: reads.append(key) or read(tree, key))
    cache = zs.open_cache(tmp_path / "c", fingerprint)
    reads.clear()
    cache.write(1, make_batch(4))  # creates the root and the experiment
    assert sleeps == []
    # each group it created is read back once (its exclusive create's check), not again
    exp = cache.experiment or ""
    created = ["zarr.json", f"{exp.partition('/')[0]}/zarr.json", f"{exp}/zarr.json"]
    assert [k for k in reads if k in created] == created, reads
