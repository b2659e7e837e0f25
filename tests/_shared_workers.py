"""Writer processes for the S3 and FUSE tests (``tests/test_shared.py``).

Importable by ``spawn`` / ``forkserver`` children. The mini-batches, the crash writer and the
checker are those of :mod:`_workers`; what is added here is what a shared store needs:

* S3 locations travel to a child as URL + ``storage_options`` and the child opens its own
  store (obstore's runtime must not cross a ``fork()``);
* :func:`timed_append_writer` is :func:`_workers.append_writer` plus a start barrier (all
  writers hit the same claims at once), ``claim_settle``, and a per-write record of who got
  which index when, and of every double claim the writer noticed (to report a protocol
  failure with its timing, not just "a mini-batch is missing").
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from _workers import check_complete_steps, crash_writer, minibatch

import zarr_skip as zs
from zarr_skip.store import writer as _writer
from zarr_skip.store._s3 import is_s3_url, open_s3_store
from zarr_skip.store.storage import Storage

__all__ = ["check_location", "open_location", "s3_crash_writer", "timed_append_writer"]


def open_location(location: str, storage_options: Mapping[str, Any] | None = None) -> Any:
    """What ``open_cache`` gets for ``location``: an S3 store built here, or the path itself."""
    if is_s3_url(location):
        return open_s3_store(location, dict(storage_options or {}))
    return location


def s3_crash_writer(url: str, storage_options: dict, fingerprint: dict, run: str, steps: int, ready: Any) -> None:
    """:func:`_workers.crash_writer` on a store this process opens from URL + options."""
    crash_writer(open_location(url, storage_options), fingerprint, run, steps, ready)


def check_location(location: str, storage_options: dict | None, fingerprint: dict) -> tuple[int, int]:
    """:func:`_workers.check_complete_steps` on a path or an S3 URL."""
    return check_complete_steps(open_location(location, storage_options), fingerprint)


class _Events(logging.Handler):
    """Collects the writer's warnings (double claims, failed heartbeats) with their time."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.events: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append((record.created, record.getMessage()))


def _trace_claims(log: list[tuple[Any, ...]]) -> None:
    """Record every exclusive create and every claim re-check of this process (diagnostics)."""
    create, holds = Storage.create_if_absent, _writer._holds

    def traced_create(self: Storage, key: str, data: bytes) -> bool:
        t0 = time.time()
        won = create(self, key, data)
        log.append(("create", key, won, t0, time.time()))
        return won

    def traced_holds(storage: Storage, key: str, claim: dict[str, Any]) -> bool:
        t0 = time.time()
        ok = holds(storage, key, claim)
        log.append(("holds", key, ok, t0, time.time()))
        return ok

    Storage.create_if_absent = traced_create  # type: ignore[method-assign]
    _writer._holds = traced_holds


def timed_append_writer(
    location: str,
    storage_options: dict | None,
    fingerprint: dict,
    run: str,
    steps: int,
    expected: int,
    out: Any,
    start: Any,
    claim_settle: float = 0.0,
    trace: bool = False,
) -> None:
    """One of several writers of one run: append mini-batches to every step until all are full.

    Puts ``{"pid", "written": [(step, index, token, t_start, t_end)], "events", "trace"}`` on
    ``out`` (or ``{"pid", "error"}``). ``start`` is a barrier passed by every writer once its
    cache is open, so that the claims race from the first step on.
    """
    events = _Events()
    logging.getLogger("zarr_skip").addHandler(events)
    log: list[tuple[Any, ...]] = []
    if trace:
        _trace_claims(log)
    me = f"{os.getpid()}"
    written: list[tuple[int, int, str, float, float]] = []
    try:
        cache = zs.open_cache(
            location, fingerprint, run_id=run, storage_options=storage_options, claim_settle=claim_settle
        )
        start.wait(120)
        for step in range(steps):
            k = 0
            while True:
                token = f"{me}-{k}"
                t0 = time.time()
                try:
                    info = cache.write(step, minibatch(run, step, token, rows=8, width=16), expected=expected)
                except zs.StepCompleteError:
                    break
                written.append((step, info.index, token, t0, time.time()))
                k += 1
    except BaseException as exc:
        out.put(
            {
                "pid": me,
                "error": f"{type(exc).__name__}: {exc}",
                "written": written,
                "events": events.events,
                "trace": log,
            }
        )
        raise
    out.put({"pid": me, "written": written, "events": events.events, "trace": log})
