"""A full disk and a read-only location: clear errors, nothing marked complete, old data intact."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_equal, make_batch
from zarr.storage import LocalStore, MemoryStore

import zarr_skip as zs


def _mount_tmpfs(path: Path, size: str) -> str | None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    return None if done.returncode == 0 else (done.stderr.strip() or "mount failed")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    reason = _mount_tmpfs(mnt, "1m")
    if reason is not None:
        pytest.skip(f"cannot mount a tmpfs here ({reason}); the ENOSPC store wrapper test covers this")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def big_batch() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"noise": torch.randint(0, 2**62, (512, 512), generator=g)}  # ~2 MiB, incompressible


def test_disk_full_on_a_real_tmpfs(small_disk: Path, fingerprint: dict) -> None:
    cache = zs.open_cache(small_disk, fingerprint)
    small = make_batch(4)
    cache.write(1, small)
    with pytest.raises(zs.StorageError, match="no space left") as exc:
        cache.write(2, big_batch())
    assert exc.value.errno == errno.ENOSPC
    reader = zs.open_cache(small_disk)
    assert reader.steps() == [1]
    assert all(i.step == 1 or not i.complete for i in reader.status())
    assert_equal(reader.load(1).to_dict(), small)


class RefusingStore(LocalStore):
    """A LocalStore whose writes of keys ending in ``refused`` fail with ENOSPC once ``armed``:
    its plain writes, or with ``claims`` its exclusive creates."""

    refused = ""
    claims = False
    armed = False

    def _check(self, key: str, exclusive: bool) -> None:
        if self.armed and exclusive == self.claims and key.endswith(self.refused):
            raise OSError(errno.ENOSPC, "No space left on device")

    async def set(self, key: str, value: Any) -> None:
        self._check(key, exclusive=False)
        await super().set(key, value)

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        self._check(key, exclusive=True)
        await super().set_if_not_exists(key, value)


class FullStore(RefusingStore):
    """Refuses the data files (the chunks of a mini-batch) once armed."""

    refused = ".zip"


class NoSummaryStore(RefusingStore):
    """Refuses the step group of step 2, its summary, written last."""

    refused = "/2/zarr.json"
    armed = True


def test_a_summary_that_cannot_be_stored_does_not_fail_a_stored_write(
    tmp_path: Path, fingerprint: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """The mini-batch is stored and the step complete: the write reports that (it raised a
    StorageError, and its retry then found the step complete), and the step reads as ever."""
    cache = zs.open_cache(NoSummaryStore(tmp_path), fingerprint)
    batch = make_batch(4)
    info = cache.write(2, batch)
    assert info.step_complete and "its summary could not be stored" in caplog.text
    fresh = zs.open_cache(tmp_path)
    assert fresh.steps() == [2] and [i.state for i in fresh.status()] == ["complete"]
    assert_equal(fresh.load(2).to_dict()["responses"], batch["responses"])


def test_read_only_location(tmp_path: Path, fingerprint: dict) -> None:
    mnt = tmp_path / "ro"
    reason = _mount_tmpfs(mnt, "4m")
    if reason is not None:
        pytest.skip(f"cannot mount a tmpfs here ({reason})")
    try:
        zs.open_cache(mnt, fingerprint).write(1, make_batch(4))
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(zs.ReadOnlyCacheError, match="refuses writes"):
            zs.open_cache(mnt, fingerprint).write(2, make_batch(4))
        other = zs.open_cache(mnt, dict(fingerprint, n=3))  # opening writes nothing, the first write fails
        with pytest.raises(zs.ReadOnlyCacheError):
            other.write(1, make_batch(4))
        assert zs.open_cache(mnt).steps() == [1]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_store_without_exclusive_create_is_refused_clearly(fingerprint: dict) -> None:
    """fsspec's stores check existence, then write: two writers could both win a claim."""
    import fsspec
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
    from zarr.storage import FsspecStore

    fs = AsyncFileSystemWrapper(fsspec.filesystem("memory"), asynchronous=True)
    store = FsspecStore(fs, path=f"/zs-{id(fs)}")
    cache = zs.open_cache(store, fingerprint)  # opening writes nothing
    with pytest.raises(zs.AtomicityError, match="cannot create keys exclusively"):
        cache.write(1, make_batch(2))


def test_the_conditional_put_probe_waits_for_the_first_create(
    s3_server: Any, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening an existing cache writable and reading it sends no probe (three requests, one
    of them a write); the first write probes once."""
    import uuid

    from zarr_skip.store import _s3_claims

    url = s3_server.s3_url(f"t-{uuid.uuid4().hex[:12]}")
    zs.open_cache(url, fingerprint, storage_options=s3_server.storage_options).write(1, make_batch(2))
    probes: list[str] = []
    real = _s3_claims.probe_conditional_put

    async def counting(store: Any, prefix: str) -> bool:
        probes.append(prefix)
        return await real(store, prefix)

    monkeypatch.setattr(_s3_claims, "probe_conditional_put", counting)
    cache = zs.open_cache(url, fingerprint, storage_options=s3_server.storage_options)
    assert cache.load(1)["responses"][:1] is not None and cache.status()
    assert probes == []
    cache.write(2, make_batch(3))
    cache.write(3, make_batch(3))
    assert probes == [""] and cache.steps() == [1, 2, 3]


def test_a_server_ignoring_conditional_puts_is_detected(
    s3_server: Any, fingerprint: dict, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    from zarr_skip.store import _s3_claims

    async def ignores(store: Any, prefix: str) -> bool:
        return False

    monkeypatch.setattr(_s3_claims, "probe_conditional_put", ignores)
    url = s3_server.s3_url(f"t-{uuid.uuid4().hex[:12]}")
    cache = zs.open_cache(url, fingerprint, storage_options=s3_server.storage_options)
    cache.write(1, make_batch(2))  # the first write probes (opening writes nothing)
    assert "ignores conditional creates" in caplog.text
    assert cache.storage.claim_settle == 0.5
    assert cache.steps() == [1]


def test_gc_on_a_read_only_location_is_a_typed_error(tmp_path: Path, fingerprint: dict) -> None:
    """A killed writer's temp file that gc cannot delete (the location refuses writes) is a
    ReadOnlyCacheError naming it, as every other write refused there, not a bare OSError."""
    mnt = tmp_path / "ro"
    reason = _mount_tmpfs(mnt, "4m")
    if reason is not None:
        pytest.skip(f"cannot mount a tmpfs here ({reason})")
    try:
        cache = zs.open_cache(mnt, fingerprint)
        cache.write(1, make_batch(4))
        temp = mnt / cache.experiment / "1" / "zarr.json.0123456789abcdef.partial"
        temp.write_bytes(b"{")
        os.utime(temp, (0, 0))  # a killed writer's, long ago
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(zs.ReadOnlyCacheError, match=f"{temp}: the location refuses writes"):
            zs.open_cache(mnt, fingerprint).gc()
        assert temp.exists() and zs.open_cache(mnt).steps() == [1]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


class FullClaimStore(RefusingStore):
    """Refuses the claim of mini-batch 0 once armed."""

    refused = "/0/zarr.json"
    claims = True


@pytest.mark.parametrize("refusing", [FullStore, FullClaimStore], ids=["data file", "claim"])
def test_disk_full_through_a_store_leaves_no_writing_step(
    tmp_path: Path, fingerprint: dict, refusing: type[RefusingStore]
) -> None:
    """The store refuses a mini-batch's data file, or its claim (after the run's record was
    stored): the step is not left 'writing' while this process lives, nothing of it stays, and
    the retry writes it. (On a local directory a claim's directory, made before its record,
    stays, and with it the run's record: another writer of the run may be claiming in it.)"""
    root = tmp_path / "cache"
    store = refusing(root)
    cache = zs.open_cache(store, fingerprint)
    cache.write(1, make_batch(4))
    store.armed = True
    with pytest.raises(zs.StorageError, match="no space left"):
        cache.write(2, make_batch(4), expected=2)
    store.armed = False
    states = {i.step: i.state for i in zs.open_cache(root).status()}
    assert states == {1: "complete"}, states
    assert not (root / cache.experiment / "2").exists()  # no debris
    cache.write(2, make_batch(4), expected=1)
    assert cache.steps() == [1, 2]


def test_an_overwrite_that_fails_leaves_the_step_it_would_replace(tmp_path: Path, fingerprint: dict) -> None:
    """A new run's overwrite whose data file the disk refuses: the step it was to replace
    stays whole and readable, and nothing of the failed write is left."""
    root = tmp_path / "cache"
    store = FullStore(root)
    first = make_batch(4, seed=1)
    zs.open_cache(store, fingerprint).write(1, first)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    store.armed = True
    with pytest.raises(zs.StorageError, match="no space left"):
        zs.open_cache(store, fingerprint).write(1, make_batch(4, seed=2), overwrite=True)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    reader = zs.open_cache(root)
    assert [(i.step, i.state) for i in reader.status()] == [(1, "complete")]
    assert_equal(reader.load(1).to_dict(), first)


class KeepingStore(MemoryStore):
    """A MemoryStore whose deletes of keys holding ``refused`` fail once it is set."""

    refused = ""

    async def delete(self, key: str) -> None:
        if self.refused and self.refused in key:
            raise OSError(errno.EIO, "Input/output error")
        await super().delete(key)


def test_a_replaced_run_that_cannot_be_removed_does_not_fail_the_completed_write(
    fingerprint: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """The new run completed the step, then removing the run it replaced failed: the write
    reports the step complete, readers get the new rows, and gc removes the old run later."""
    store = KeepingStore()
    old = zs.open_cache(store, fingerprint)
    old.write(1, make_batch(4, seed=1))
    store.refused = f"/{old.run_id}/"
    second = make_batch(4, seed=2)
    assert zs.open_cache(store, fingerprint).write(1, second, overwrite=True).step_complete
    assert f"run {old.run_id}, replaced, is left for gc" in caplog.text
    reader = zs.open_cache(store, fingerprint)
    assert reader.info(1).stale_runs == (old.run_id,)
    assert_equal(reader.load(1).to_dict(), second)
    store.refused = ""
    assert [r.path.rsplit("/", 1)[-1] for r in reader.gc().removed] == [old.run_id]
    assert reader.info(1).stale_runs == ()
