"""gc: dead data goes, live writers and complete steps (outside retention) stay.

Over the ``location`` fixture (memory, a directory, S3); the temp files of killed writers are
a local directory's (``.partial`` files of its atomic writes), so those tests stay on one."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import _fixture_batch as fx
import pytest
from helpers import Keys, assert_equal, make_batch

import zarr_skip as zs
from zarr_skip.format import layout
from zarr_skip.store.storage import Storage

FIXTURES = Path(__file__).parent / "fixtures"


def age_records(location: Any, seconds: float) -> None:
    """Make every writer record look like another host's, silent for ``seconds``."""
    keys = Keys(location)
    for meta in [k for k in keys.list() if k.endswith("zarr.json")]:
        doc = json.loads(keys.read(meta))
        attrs = doc.get("attributes", {})
        for key in ("zarr_skip.part", "zarr_skip.run"):
            if key in attrs:
                rec = attrs[key]
                rec["host"] = "elsewhere"
                for field in ("heartbeat", "created"):
                    if field in rec:
                        rec[field] -= seconds
                rec.pop("checksum", None)
                if key == "zarr_skip.part" and rec.get("state") == "complete":
                    from zarr_skip.format.layout import doc_checksum

                    rec["checksum"] = doc_checksum(rec)
        keys.write(meta, json.dumps(doc).encode())


def _cache(location: Any, fingerprint: dict) -> zs.Cache:
    c = zs.open_cache(location, fingerprint, lease=30)
    for step in (1, 2, 3, 4):
        c.write(step, make_batch(3, seed=step))
    c.write(5, make_batch(3), expected=3)  # left partial
    return c


@pytest.fixture
def cache(location: Any, fingerprint: dict) -> zs.Cache:
    return _cache(location, fingerprint)


@pytest.fixture
def on_disk(tmp_path: Path, fingerprint: dict) -> zs.Cache:
    return _cache(tmp_path, fingerprint)


def test_abandoned_vs_writing(cache: zs.Cache, location: Any) -> None:
    assert cache.status()[-1].state == "writing"  # this process is alive
    age_records(location, 10)
    assert cache.status()[-1].state == "writing"  # heartbeat within the lease
    age_records(location, 60)
    assert cache.status()[-1].state == "abandoned"


def test_gc_dry_run_then_real(on_disk: zs.Cache, tmp_path: Path) -> None:
    cache = on_disk
    age_records(tmp_path, 120)
    partial = tmp_path / cache.experiment / "2" / "zarr.0123abcd.partial"
    partial.write_bytes(b"x")
    old = time.time() - 3600
    os.utime(partial, (old, old))
    report = cache.gc(dry_run=True)
    assert report.dry_run
    assert sorted(r.reason.split(":")[0] for r in report.removed) == ["abandoned", "temp file of a killed writer"]
    assert partial.exists() and [i.step for i in cache.status()] == [1, 2, 3, 4, 5]
    report = cache.gc()
    assert not partial.exists()
    assert [i.step for i in cache.status()] == [1, 2, 3, 4]


def test_gc_keeps_live_writers_and_fresh_temp_files(on_disk: zs.Cache, tmp_path: Path) -> None:
    cache = on_disk
    fresh = tmp_path / cache.experiment / "5" / "zarr.feedbeef.partial"
    fresh.write_bytes(b"x")
    report = cache.gc()
    assert report.removed == () and report.kept_writing == (5,)
    assert fresh.exists()


def test_retention_keep_last_and_pin(cache: zs.Cache) -> None:
    report = cache.gc(keep_last=2, pin=[1], dry_run=True)
    assert sorted(r.step for r in report.removed) == [2]
    cache.gc(keep_last=2, pin=[1])
    assert cache.steps() == [1, 3, 4]
    with pytest.raises(zs.ConfigError, match="keep_last"):
        cache.gc(keep_last=-1)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"pin": ["1"]}, "pin: expected an int, got str '1'"),  # a pin of "1" kept nothing
        ({"pin": 1.0}, "pin: expected a step"),
        ({"pin": [-1]}, "pin: expected non-negative ints"),
        ({"partial_age": "0"}, "partial_age: expected seconds as a number"),
        ({"partial_age": -1}, "partial_age: must be a finite number of seconds >= 0"),
        ({"partial_age": float("nan")}, "partial_age: must be a finite number"),
    ],
)
def test_bad_pins_and_ages_are_refused_before_anything_is_removed(
    cache: zs.Cache, kwargs: dict[str, Any], error: str
) -> None:
    with pytest.raises(zs.ConfigError, match=error):
        cache.gc(keep_last=1, **kwargs)
    assert cache.steps() == [1, 2, 3, 4]
    cache.gc(keep_last=1, pin=1)  # one step, as an int
    assert cache.steps() == [1, 4]


def test_gc_removes_displaced_runs_leftovers(location: Any, fingerprint: dict) -> None:
    old = zs.open_cache(location, fingerprint)
    new = zs.open_cache(location, fingerprint)
    new.write(7, make_batch(2), expected=2)
    # a displaced writer that kept going leaves a mini-batch the owner does not count
    keys = Keys(location)
    run_dir = f"{new.experiment}/7/{old.run_id}"
    keys.write(f"{run_dir}/0/w-gone/scores/c.0", b"chunk")  # its mini-batch's data, no record yet
    keys.write(
        f"{run_dir}/zarr.json",
        json.dumps(
            {
                "zarr_format": 3,
                "node_type": "group",
                "attributes": {
                    "zarr_skip.run": {
                        "run": old.run_id,
                        "started": 1.0,
                        "created": 1.0,
                        "expected": 2,
                        "host": "elsewhere",
                        "pid": 1,
                    }
                },
            }
        ).encode(),
    )
    info = new.status()[0]
    assert info.stale_runs == (old.run_id,) and info.run == new.run_id
    report = new.gc()
    assert [r.path.rsplit("/", 1)[-1] for r in report.removed] == [old.run_id]
    assert keys.list(run_dir) == []


def test_gc_removes_an_unfinished_replacement_once_its_writer_is_gone(location: Any, fingerprint: dict) -> None:
    """A run that began overwriting a complete step and died: the step it was replacing stays
    complete and readable; gc keeps the replacement while its writer may live (between its
    mini-batches, too) and removes it once it is silent for longer than the lease."""
    old = zs.open_cache(location, fingerprint, lease=30)
    first = make_batch(3, seed=1)
    old.write(7, first)
    new = zs.open_cache(location, fingerprint, lease=30)
    new.write(7, make_batch(2, seed=2), expected=2, overwrite=True)
    assert new.gc().removed == ()  # its process lives, between mini-batches
    age_records(location, 600)  # as if the replacing process had died on another host
    info = new.info(7)
    assert info.complete and info.run == old.run_id and info.stale_runs == (new.run_id,)
    report = new.gc()
    assert [r.path.rsplit("/", 1)[-1] for r in report.removed] == [new.run_id]
    assert "unfinished replacement" in report.removed[0].reason
    assert Keys(location).list(f"{new.experiment}/7/{new.run_id}") == []
    assert_equal(zs.open_cache(location).load(7).to_dict(), first)


def test_gc_removes_a_data_file_that_its_complete_minibatch_does_not_name(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    info = cache.write(3, make_batch(4))
    keys = Keys(location)
    # a writer wrote for this index while claiming it, lost the claim, and was killed before
    # removing its file: no record will ever name it
    stray = f"{info.path}/w-killed-writer.zip"
    keys.write(stray, b"PK torn")
    before = keys.list()
    dry = cache.gc(dry_run=True)
    assert [(r.path, r.reason, r.step) for r in dry.removed] == [
        (stray, "data file of a writer that lost its claim", 3)
    ]
    assert keys.list() == before
    assert [r.path for r in cache.gc().removed] == [stray]
    assert keys.list() == [k for k in before if k != stray]
    assert_equal(cache.load(3).to_dict(), make_batch(4))


def test_gc_needs_a_writable_handle(cache: zs.Cache, location: Any) -> None:
    with pytest.raises(zs.ReadOnlyCacheError):
        zs.open_cache(location).gc()
    assert zs.open_cache(location).gc(dry_run=True).dry_run


def test_gc_never_deletes_a_step_whose_records_it_cannot_read(
    cache: zs.Cache, location: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Through a stale shared-filesystem mount a complete step can look damaged: keep it."""
    age_records(location, 120)
    keys = Keys(location)
    (run,) = keys.dirs(f"{cache.experiment}/2")
    record = f"{run}/0/zarr.json"
    good = keys.read(record)
    keys.write(record, good[: len(good) // 2])  # what a stale FUSE view returned
    report = cache.gc()
    assert all(r.step != 2 for r in report.removed)
    assert "step 2 has unreadable or missing records; nothing of it is removed" in caplog.text
    keys.write(record, good)
    assert 2 in cache.steps()


def test_gc_waits_before_removing_a_step_whose_only_run_is_not_recorded_yet(on_disk: zs.Cache, tmp_path: Path) -> None:
    """A brand-new run makes its directory before its record lands: its step is not removed
    as abandoned at once (it was, with the claim the new writer was making), only once old."""
    cache = on_disk
    fresh = tmp_path / cache.experiment / "9" / "r-new" / "0"
    fresh.mkdir(parents=True)
    assert cache.gc().removed == ()
    assert fresh.is_dir()
    old = time.time() - 3600
    for d in (fresh, fresh.parent, fresh.parent.parent):
        os.utime(d, (old, old))
    report = cache.gc()
    assert [(r.step, r.reason.split(":")[0]) for r in report.removed if r.step == 9] == [(9, "abandoned")]
    assert not fresh.parent.parent.exists()


def test_gc_keeps_a_complete_step_whose_run_record_is_lost(cache: zs.Cache, location: Any) -> None:
    """A run writes its record before anything else, and a step is deleted summary first: a
    complete step whose summary names a run whose record is gone lost that record (deleted, or
    left out of a copy). It still reads; gc removed it whole as "no recorded run (crashed
    creation)" once older than the lease, and verify called it abandoned."""
    keys = Keys(location)
    (run,) = keys.dirs(f"{cache.experiment}/2")
    want = cache.load(2).to_dict()
    keys.delete(f"{run}/zarr.json")
    age_records(location, 3600)
    report = cache.gc(partial_age=0.0)
    assert all(r.step != 2 for r in report.removed), report.removed
    assert_equal(cache.load(2).to_dict(), want)
    (problem,) = [p for p in cache.verify().problems if p.step == 2]
    assert problem.error.startswith(f"run record missing: the step's summary names run {run.rpartition('/')[2]}")
    assert problem.path.endswith(f"{run}/zarr.json") and problem.kind == "metadata"


def test_a_step_is_deleted_summary_first(on_disk: zs.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deletion interrupted half-way leaves no summary naming a run whose record is gone (which
    gc keeps as damage): what is left has no summary, and gc removes it once old, as strays."""
    cache = on_disk
    step = tmp_path / cache.experiment / "2"
    (run,) = [d for d in step.iterdir() if d.is_dir()]

    def interrupted(self: Any, prefix: str) -> None:
        (tmp_path / prefix / run.name / "zarr.json").unlink()  # some of the tree went
        raise OSError("interrupted")

    monkeypatch.setattr(Storage, "delete_prefix", interrupted)
    with pytest.raises(OSError, match="interrupted"):
        cache.delete(2)
    monkeypatch.undo()
    assert not (step / "zarr.json").exists() and (run / "0").is_dir()
    report = cache.gc(partial_age=0.0)
    assert [(r.step, r.reason) for r in report.removed if r.step == 2] == [
        (2, "abandoned: no recorded run (crashed creation)")
    ]
    assert not step.exists()


def test_gc_keeps_a_step_whose_run_record_contradicts_its_summary(tmp_path: Path) -> None:
    """Mini-batch records of format 2 do not say what their run expects: a run record edited to
    expect more made the complete step look abandoned (or, expecting fewer, its last
    mini-batches surplus), and gc removed them. The summary says what the run expected."""
    root = tmp_path / "format2"
    shutil.copytree(FIXTURES / "format2", root)
    (record,) = root.glob("*/0/*/zarr.json")
    for expected in (3, 1):
        key = str(record.relative_to(root))
        Keys(root).edit(key, layout.RUN_ATTR, lambda run, n=expected: run.update(expected=n))
        cache = zs.open_cache(root, fx.FINGERPRINT)
        assert cache.gc(partial_age=0.0).removed == ()
        (problem,) = [p for p in cache.verify().problems if p.kind == "misplaced"]
        assert f"run rfixture expects {expected} mini-batches, the step's summary 2" in problem.error
        assert len(cache.load(0)) == 12


def test_a_replaced_runs_leftover_is_removed_though_a_stale_summary_names_it(tmp_path: Path, fingerprint: dict) -> None:
    """A run that replaced a complete step (``overwrite``) and could not store its summary, then
    had its removal of the old run cut short, leaves a summary naming the old run, whose
    directory holds no record: a leftover once the new run has completed the step, not damage
    that keeps the step whole."""
    old = zs.open_cache(tmp_path, fingerprint, run_id="r-old")
    old.write(2, make_batch(3, seed=1))
    step = tmp_path / old.experiment / "2"
    shutil.copytree(step, tmp_path / "saved")
    new = zs.open_cache(tmp_path, fingerprint, run_id="r-new")
    new.write(2, make_batch(3, seed=2), overwrite=True)
    want = new.load(2).to_dict()
    shutil.copy(tmp_path / "saved" / "zarr.json", step / "zarr.json")  # the old run's summary
    shutil.copytree(tmp_path / "saved" / "r-old", step / "r-old", ignore=shutil.ignore_patterns("zarr.json"))
    shutil.copy(tmp_path / "saved" / "r-old" / "0" / "zarr.json", step / "r-old" / "0" / "zarr.json")
    report = new.gc(partial_age=0.0)
    assert [(r.path.rpartition("/")[2], r.reason) for r in report.removed] == [
        ("r-old", "not a recorded run (crashed creation)")
    ]
    assert_equal(zs.open_cache(tmp_path).load(2).to_dict(), want)
