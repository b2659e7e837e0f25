"""Heartbeats of the mini-batches being written: one thread per process refreshes them all.

A writer's claim record carries a ``heartbeat`` time; other processes take a mini-batch whose
heartbeat is older than the lease for abandoned. While a write is in progress its claim is
refreshed every ``interval`` seconds by a single daemon thread, started with the first write of
the process (a thread started per write cost ~1.5-3 ms of the write itself, while the pool was
busy compressing). :class:`Heartbeat` is the context manager a write holds; when it exits, no
refresh of its claim is running or will run, so the completion record written next is never
overwritten by a late heartbeat.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zarr_skip.errors import ZarrSkipError
from zarr_skip.format import layout
from zarr_skip.store.catalog import group_doc
from zarr_skip.store.storage import Storage

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Claim:
    storage: Storage
    key: str
    doc: dict[str, Any]
    interval: float
    holds: Callable[[Storage, str, dict[str, Any]], bool]
    due: float


class _Beater:
    """The process's heartbeat thread and the claims it refreshes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._claims: dict[int, _Claim] = {}
        self._busy: int | None = None  # the claim being refreshed now (outside the lock)
        self._thread: threading.Thread | None = None
        self._next = 0

    def add(self, claim: _Claim) -> int:
        with self._cond:
            self._next += 1
            self._claims[self._next] = claim
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="zarr-skip-heartbeat", daemon=True)
                self._thread.start()
            else:
                self._cond.notify_all()
            return self._next

    def remove(self, token: int) -> None:
        with self._cond:
            self._claims.pop(token, None)
            while self._busy == token:
                self._cond.wait()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    due = [(c.due, t) for t, c in self._claims.items()]
                    if due and min(due)[0] <= now:
                        token = min(due)[1]
                        claim = self._claims[token]
                        claim.due = now + claim.interval
                        self._busy = token
                        break
                    self._cond.wait(min(due)[0] - now if due else None)
            keep = True
            try:
                keep = _refresh(claim)
            except Exception:  # pragma: no cover - a bug: the thread must go on for the others
                logger.exception("heartbeat of %s failed", claim.key)
            finally:
                with self._cond:
                    self._busy = None
                    if not keep:
                        self._claims.pop(token, None)
                    self._cond.notify_all()


def _refresh(claim: _Claim) -> bool:
    """Rewrite the claim with the time now; False when it must not be refreshed any more."""
    if not claim.holds(claim.storage, claim.key, claim.doc):
        logger.warning("heartbeat of %s stopped: the record names another writer", claim.key)
        return False
    doc = dict(claim.doc, heartbeat=time.time())
    try:
        claim.storage.set(claim.key, group_doc({layout.PART_ATTR: doc}))
    except (OSError, ZarrSkipError) as exc:  # the write itself will report the failure
        logger.warning("heartbeat of %s failed: %s", claim.key, exc)
    return True


_BEATER = _Beater()


def _after_fork() -> None:  # pragma: no cover - runs in forked children
    # the parent's thread is not in the child, and its lock may have been held at the fork
    global _BEATER
    _BEATER = _Beater()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Heartbeat:
    """Refreshes the claim ``doc`` at ``key`` every ``interval`` seconds while held, as long
    as ``holds(storage, key, doc)`` says the record is still this writer's."""

    def __init__(
        self,
        storage: Storage,
        key: str,
        doc: dict[str, Any],
        interval: float,
        holds: Callable[[Storage, str, dict[str, Any]], bool],
    ) -> None:
        self._claim = _Claim(storage, key, doc, interval, holds, 0.0)
        self._beater = _BEATER
        self._token: int | None = None

    def __enter__(self) -> Heartbeat:
        self._claim.due = time.monotonic() + self._claim.interval
        self._beater = _BEATER
        self._token = self._beater.add(self._claim)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            self._beater.remove(self._token)
            self._token = None
