"""Several writer processes sharing one cache on object storage (S3) and on FUSE mounts.

Everything runs against the session's SeaweedFS server (``s3_server`` in conftest): its S3
gateway, and two ``weed mount`` FUSE mounts of its filer, which behave like two hosts sharing a
network file system.

Writer processes come from a ``forkserver``: obstore (the S3 client) hangs in a process
``fork()``ed after its parent used it, but the fork server is a freshly exec'd interpreter that
never touches S3, so its children start clean (and ``ForkCheckedObjectStore`` would raise, not
hang, if one were not). S3 locations travel to a child as URL + ``storage_options``.

What the FUSE mounts of SeaweedFS 4.48 do to a cache (measured while writing this test: about
70 rounds of 4 writers, 2 per mount, 6 steps x 5 mini-batches, ``claim_settle=0``):

* exclusive create (temp file + hard link) across the two mounts let two writers win the same
  claim once in about 1,700 traced claims (about 300 pairs of creates from the two mounts
  overlapped in time); both read back their own record. The writer's re-check of the claim
  before completion (``writer._holds``) caught it, and the writer-unique data groups kept the
  two writers' chunks apart: in every round every mini-batch was stored exactly once, checked
  through the S3 gateway, which reads the filer directly. ``claim_settle`` is not needed for
  that, so this test uses 0;
* reading through a mount is not reliable once another mount has replaced a file: a record
  rewritten (or created twice) through one mount reads back through the other truncated to the
  length of the version that mount knew (about 20 such reads per round), and a mount can keep
  that view for more than 90 s (also with ``-cacheMetaTtlSec=1``); once, a root group created
  through one mount could not be read through the other while its exclusive create there
  already failed (so ``open_cache`` said "not a zarr_skip cache"). Readers then see a step as
  incomplete, abandoned or unreadable, never with wrong data (records are JSON with
  checksums, chunks carry crc32c), so the mount-side check here only demands that what a
  mount shows as loadable is exact.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _fuse import seaweedfs_mounts_fixture
from _shared_workers import check_location, s3_crash_writer, timed_append_writer
from _workers import expected_of, minibatch

import zarr_skip as zs

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(300)]  # real processes, FUSE

WRITERS = 4
STEPS, EXPECTED = 6, 5  # each writer appends to every step until it is full
RUN = "shared-run"
KILLS, KILL_STEPS = 10, 16  # enough steps that a kill rarely finds them all complete
FUSE_ROUNDS = 2
#: seconds between a claim and its read-back on the FUSE mounts; 0 suffices (see above)
FUSE_CLAIM_SETTLE = 0.0


@pytest.fixture(scope="module")
def ctx() -> Any:
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "zarr", "zarr_skip", "_workers", "_shared_workers"])
    return context


def _url(server: Any) -> str:
    return server.s3_url(f"t-{uuid.uuid4().hex[:12]}")


def _append_concurrently(
    ctx: Any, locations: list[str], storage_options: dict | None, fingerprint: dict, claim_settle: float = 0.0
) -> tuple[list[tuple[int, int, str]], list[str]]:
    """Run one ``timed_append_writer`` per location; (step, index, token) written, and events."""
    out = ctx.Queue()
    start = ctx.Barrier(len(locations))
    procs = [
        ctx.Process(
            target=timed_append_writer,
            args=(loc, storage_options, fingerprint, RUN, STEPS, EXPECTED, out, start, claim_settle),
        )
        for loc in locations
    ]
    for p in procs:
        p.start()
    try:
        results = [_get(out, procs) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.exitcode is None:
                p.kill()
                p.join()
    errors = [f"writer {r['pid']}: {r['error']}" for r in results if "error" in r]
    assert not errors, errors
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    written = [(w[0], w[1], w[2]) for r in results for w in r["written"]]
    t0 = min(w[3] for r in results for w in r["written"])
    events = [f"writer {r['pid']} at +{t - t0:.3f}s: {msg}" for r in results for t, msg in r["events"]]
    return written, events


def _get(out: Any, procs: list[Any], timeout: float = 180) -> dict[str, Any]:
    """The next writer's report; fails (instead of waiting) once every writer died silently."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                pytest.fail(f"writers exited without a report: {[p.exitcode for p in procs]}")
    pytest.fail(f"no writer report within {timeout:.0f} s")


def _assert_each_step_filled_exactly(cache: zs.Cache, written: list[tuple[int, int, str]], events: list[str]) -> None:
    """The assertions of test_crash.py::test_concurrent_writers_of_one_run_fill_each_step_exactly."""
    assert cache.steps() == list(range(STEPS)), events
    assert len(written) == STEPS * EXPECTED, events
    for step in range(STEPS):
        view = cache.load(step)
        stored = [(step, mb.minibatch_info[0].index, mb["token"][0]) for mb in view.minibatches]
        assert sorted(stored) == sorted(w for w in written if w[0] == step), (step, events)
        assert [s[1] for s in stored] == list(range(EXPECTED))
    assert len({(w[0], w[2]) for w in written}) == len(written)  # no mini-batch written twice


def test_concurrent_writers_of_one_run_on_s3(ctx: Any, s3_server: Any, fingerprint: dict) -> None:
    url, options = _url(s3_server), s3_server.storage_options
    written, events = _append_concurrently(ctx, [url] * WRITERS, options, fingerprint)
    cache = zs.open_cache(url, fingerprint, storage_options=options, read_only=True)
    _assert_each_step_filled_exactly(cache, written, events)


def test_sigkill_at_random_points_on_s3(ctx: Any, s3_server: Any, fingerprint: dict) -> None:
    """Writers killed mid-write never leave a wrong complete step; a new run completes all."""
    url, options = _url(s3_server), s3_server.storage_options
    rng = random.Random(4321)
    mid_step = 0
    for kill in range(KILLS):
        ready = ctx.Event()
        proc = ctx.Process(
            target=s3_crash_writer, args=(url, options, fingerprint, f"run{kill:03d}", KILL_STEPS, ready), daemon=True
        )
        proc.start()
        assert ready.wait(60), "the writer stored nothing in 60 s"
        time.sleep(rng.uniform(0.1, 0.8))
        proc.kill()
        proc.join(10)
        assert proc.exitcode == -9, f"kill {kill}: the writer exited by itself (code {proc.exitcode}), see its stderr"
        complete, incomplete = check_location(url, options, fingerprint)
        print(f"kill {kill}: {complete} complete, {incomplete} incomplete steps")
        mid_step += incomplete > 0
        if complete == KILL_STEPS:  # start over so every kill lands during writes
            zs.open_cache(url, fingerprint, storage_options=options).gc(keep_last=0)
    # the property is checked after every kill; this only shows kills landed mid-step, which is the
    # schedule's doing (faster writes land fewer): a tenth is enough to show the test works
    assert mid_step >= max(1, KILLS // 10), f"only {mid_step} of {KILLS} kills landed while a step was being written"
    cache = zs.open_cache(url, fingerprint, storage_options=options, run_id="final")
    for step in range(KILL_STEPS):
        if step not in cache.steps():
            for _ in range(expected_of(step)):
                cache.write(step, minibatch("final", step, "x"), expected=expected_of(step))
    assert cache.steps() == list(range(KILL_STEPS))
    assert check_location(url, options, fingerprint) == (KILL_STEPS, 0)


@pytest.mark.fuse
def test_writers_on_two_fuse_mounts_fill_each_step_exactly(
    ctx: Any, s3_server: Any, fingerprint: dict, tmp_path: Path
) -> None:
    """2 writers per mount, one run, plain local paths (LocalStore) on two mounts of one filer."""
    options = s3_server.storage_options
    with seaweedfs_mounts_fixture(s3_server, tmp_path / "fuse") as mounts:
        a, b = mounts.mountpoints
        for _ in range(FUSE_ROUNDS):
            prefix = f"t-{uuid.uuid4().hex[:12]}"
            url = s3_server.s3_url(prefix)
            # create the cache before the mounts look at it: a root group created through one
            # mount can be invisible through the other for a moment (see the module docstring)
            zs.open_cache(url, fingerprint, storage_options=options)
            locations = [str(m / prefix) for m in (a, b) for _ in range(WRITERS // 2)]
            written, events = _append_concurrently(ctx, locations, None, fingerprint, FUSE_CLAIM_SETTLE)
            print(
                f"FUSE round {prefix}: {sum('same time' in e for e in events)} double claims caught, "
                f"{sum('unreadable' in e for e in events)} torn reads"
            )
            # the filer's own view (through the S3 gateway) is authoritative
            cache = zs.open_cache(url, fingerprint, storage_options=options, read_only=True)
            _assert_each_step_filled_exactly(cache, written, events)
            # a mount may lag, but what it shows as loadable must be exact
            for m in (a, b):
                _assert_loadable_steps_exact(zs.open_cache(str(m / prefix), fingerprint, read_only=True), written)


def _assert_loadable_steps_exact(cache: zs.Cache, written: list[tuple[int, int, str]]) -> None:
    for info in cache.status():
        if not info.complete:
            continue
        try:
            view = cache.load(info.step)
        except (zs.IncompleteStepError, zs.MissingDataError, zs.StepNotFoundError):
            continue  # a stale or torn view through the mount: a miss, not wrong data
        stored = sorted((info.step, mb.minibatch_info[0].index, mb["token"][0]) for mb in view.minibatches)
        assert stored == sorted(w for w in written if w[0] == info.step), info.step
