"""A write's claim is refreshed while it lasts, by one thread per process, never after it ends."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_equal, make_batch

import zarr_skip as zs
from zarr_skip.format import layout
from zarr_skip.store import chunkjobs, heartbeats
from zarr_skip.store.storage import Storage


def _beat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "zarr-skip-heartbeat"]


def _record(doc: bytes) -> dict[str, Any]:
    return json.loads(doc)["attributes"][layout.PART_ATTR]


def test_a_slow_write_is_refreshed_while_it_lasts_and_its_completion_stays(
    tmp_path: Path, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the write, once it holds its claim, waits for two refreshes (not for a time that a loaded
    # machine may not honour): the property is that they come while it lasts
    refreshed = threading.Event()
    records: list[dict[str, Any]] = []
    set_, take = Storage.set, chunkjobs.ChunkJobs.take

    def traced_set(self: Storage, key: str, value: bytes) -> None:
        if key.endswith(layout.METADATA) and layout.PART_ATTR.encode() in value:
            records.append(_record(value))
            if sum(r["state"] == "writing" for r in records) >= 2:
                refreshed.set()
        set_(self, key, value)

    def slow_take(self: chunkjobs.ChunkJobs, *args: Any) -> Any:
        assert refreshed.wait(30), "no two heartbeats while the write held its claim"
        return take(self, *args)

    monkeypatch.setattr(chunkjobs.ChunkJobs, "take", slow_take)
    monkeypatch.setattr(Storage, "set", traced_set)
    cache = zs.open_cache(str(tmp_path), fingerprint, lease=0.2)  # a heartbeat every 0.05 s
    batch = make_batch(64)
    info = cache.write(1, batch)
    beats = [r["heartbeat"] for r in records if r["state"] == "writing"]
    assert len(beats) >= 2 and beats == sorted(beats)  # refreshed, later each time
    assert records[-1]["state"] == "complete"
    time.sleep(0.3)  # six intervals: a late heartbeat would have overwritten the completion
    assert records[-1]["state"] == "complete"
    key = layout.meta_key(info.path)
    assert _record(cache._storage.get(key))["state"] == "complete"
    assert_equal(zs.open_cache(str(tmp_path), fingerprint).load(1).to_dict(), batch)


def test_writes_share_one_heartbeat_thread(tmp_path: Path, fingerprint: dict) -> None:
    cache = zs.open_cache(str(tmp_path), fingerprint)
    for step in range(4):
        cache.write(step, make_batch(8, seed=step))
    assert len(_beat_threads()) == 1
    # writes in several threads at once still share it
    errors: list[BaseException] = []

    def write(step: int) -> None:
        try:
            zs.open_cache(str(tmp_path), fingerprint).write(step, make_batch(8, seed=step))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=write, args=(10 + i,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors and len(_beat_threads()) == 1
    assert zs.open_cache(str(tmp_path), fingerprint).steps() == [0, 1, 2, 3, 10, 11, 12, 13]


def test_a_heartbeat_stops_when_the_record_names_another_writer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = zs.open_cache(str(tmp_path), {"x": 1}).storage
    asked: list[float] = []
    first = threading.Event()

    def someone_else(storage: Storage, key: str, doc: dict[str, Any]) -> bool:
        asked.append(time.monotonic())
        first.set()
        return False

    with caplog.at_level(logging.WARNING, logger=heartbeats.__name__):
        with heartbeats.Heartbeat(storage, "k/zarr.json", {"writer": "w"}, 0.02, someone_else):
            assert first.wait(30)  # the first refresh comes, whenever the thread gets to run
            time.sleep(0.2)  # ten more intervals
    assert len(asked) == 1  # asked once, then never refreshed again
    assert "names another writer" in caplog.text
    assert storage.get("k/zarr.json") is None  # nothing written for a record it does not hold


def test_leaving_waits_for_a_refresh_in_progress(tmp_path: Path) -> None:
    storage = zs.open_cache(str(tmp_path), {"x": 1}).storage
    inside, release = threading.Event(), threading.Event()
    done: list[str] = []

    def slow_holds(storage: Storage, key: str, doc: dict[str, Any]) -> bool:
        inside.set()
        release.wait(60)
        done.append("refresh")
        return True

    beat = heartbeats.Heartbeat(storage, "k/zarr.json", {"writer": "w"}, 0.01, slow_holds)
    beat.__enter__()
    assert inside.wait(60)
    leaving = threading.Thread(target=lambda: (beat.__exit__(None, None, None), done.append("left")))
    leaving.start()
    time.sleep(0.1)
    assert done == []  # still refreshing: leaving waits
    release.set()
    leaving.join(60)
    assert done == ["refresh", "left"]
