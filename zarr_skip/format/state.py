"""What a step's metadata says about it, and which step to load (pure: no I/O).

A step may hold mini-batches of several runs. Its owner is the run that started last of those
that completed it, else the run that started last: a run replacing a complete step
(``overwrite``) owns it once it completes it, and until then readers see the step it replaces.
Only the owner's mini-batches count. The step is ``complete`` when the owner has a complete
mini-batch at every index ``0 .. expected-1``; otherwise it is ``writing`` while some writer of
the owner is alive (its process exists on this host, or its heartbeat is younger than the
lease elsewhere) and ``abandoned`` when none is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeGuard, get_args

from zarr_skip._deprecation import warn_renamed
from zarr_skip.errors import ConfigError

#: the states of a step
StepState = Literal["complete", "writing", "abandoned"]
COMPLETE: Final = "complete"
WRITING: Final = "writing"
ABANDONED: Final = "abandoned"
#: what :func:`resolve` does with a step that is not complete
ResolveAction = Literal["cache", "repeat"]
#: the inode of the machine's own PID namespace (Linux's PROC_PID_INIT_INO)
_INIT_PID_NAMESPACE = 0xEFFFFFFC


def host_name() -> str:
    """Who can judge this process's writers by their pids: the machine's name, with the PID
    namespace when it is not the machine's own (a container). Containers that share the
    machine's name (Kubernetes ``hostNetwork``, ``docker --network host``) do not see each
    other's pids, so a live writer in one would read as dead in the other, and its step as
    abandoned (which ``gc`` removes); with the namespace in the name they judge each other
    by heartbeats, as writers on other hosts."""
    name = socket.gethostname()
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux, or no /proc: pids are the machine's
        return name
    return name if namespace == _INIT_PID_NAMESPACE else f"{name} (pid namespace {namespace})"


#: the ``host`` this process's records carry (see :func:`host_name`)
HOST = host_name()


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run's record in one step: who, when the run started, how many mini-batches it expects."""

    run: str
    started: float
    created: float
    expected: int
    host: str = ""
    pid: int = 0

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunRecord:
        return cls(
            run=str(doc["run"]),
            started=float(doc["started"]),
            created=float(doc.get("created", doc["started"])),
            expected=int(doc["expected"]),
            host=str(doc.get("host", "")),
            pid=int(doc.get("pid", 0)),
        )


@dataclass(frozen=True, slots=True)
class PartRecord:
    """One mini-batch as its metadata describes it (``doc`` is the whole attribute)."""

    run: str
    index: int
    state: str
    host: str
    pid: int
    heartbeat: float
    rows: int = 0
    nbytes: int = 0
    raw_nbytes: int = 0
    doc: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: ``doc``'s checksum already checked on the bytes it was read from (:func:`layout.seal_holds`)
    sealed: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, sealed: bool = False) -> PartRecord:
        return cls(
            run=str(doc["run"]),
            index=int(doc["index"]),
            state=str(doc["state"]),
            host=str(doc.get("host", "")),
            pid=int(doc.get("pid", 0)),
            heartbeat=float(doc.get("heartbeat", 0.0)),
            rows=int(doc.get("rows", 0)),
            nbytes=int(doc.get("nbytes", 0)),
            raw_nbytes=int(doc.get("raw_nbytes", 0)),
            doc=doc,
            sealed=sealed,
        )

    @property
    def complete(self) -> bool:
        return self.state == COMPLETE


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The state of one step, computed from metadata alone.

    Attributes
    ----------
    step : the global step.
    state : ``complete``, ``writing`` or ``abandoned``.
    complete : ``state == "complete"``.
    expected : mini-batches the owning run expects.
    done : complete mini-batches of the owning run.
    rows : rows of those mini-batches.
    nbytes_stored : stored (compressed) bytes of those mini-batches.
    nbytes : their logical (decoded) bytes, as numpy's and zarr's ``nbytes``; 0 in records of
        writers too old to count them.
    run : the owning run.
    updated : last write or heartbeat seen (seconds since the epoch).
    stale_runs : the other runs whose records are still stored: older runs' leftovers, or a
        newer run replacing the complete step (``overwrite``) that has not completed it.
    """

    step: int
    state: StepState
    complete: bool
    expected: int
    done: int
    rows: int
    nbytes_stored: int
    nbytes: int = 0
    run: str = ""
    updated: float = 0.0
    stale_runs: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """Compression ratio (logical / stored bytes); 0 when nothing is stored."""
        return self.nbytes / self.nbytes_stored if self.nbytes_stored else 0.0

    @property
    def raw_nbytes(self) -> int:
        """Deprecated: :attr:`nbytes` (the logical size)."""
        warn_renamed("StepInfo.raw_nbytes", "StepInfo.nbytes (the logical size; nbytes_stored is the stored one)")
        return self.nbytes


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_alive(host: str, pid: int, heartbeat: float, now: float, lease: float) -> bool:
    """Whether a writer may still be at work: its process on this host, else a fresh heartbeat."""
    if host == HOST and pid:
        return pid_alive(pid) and now - heartbeat <= max(lease, 0) * 10
    return now - heartbeat <= lease


def latest(runs: Iterable[RunRecord]) -> RunRecord | None:
    """The run that started last (ties broken by run id): no older run may write the step."""
    return max(runs, key=lambda r: (r.started, r.run), default=None)


def completed(run: RunRecord, parts: Iterable[PartRecord]) -> bool:
    """Whether ``run`` has a complete mini-batch at every index ``0 .. run.expected-1``."""
    done = {p.index for p in parts if p.run == run.run and p.complete and 0 <= p.index < run.expected}
    return len(done) == run.expected


def owner(runs: Sequence[RunRecord], parts: Sequence[PartRecord]) -> RunRecord | None:
    """The run whose mini-batches the step holds: the latest of the runs that completed it,
    else the latest run. A newer run replacing a complete step owns it once it completes it."""
    return latest(r for r in runs if completed(r, parts)) or latest(runs)


def alive(run: RunRecord, parts: Sequence[PartRecord], now: float, lease: float) -> bool:
    """Whether some writer of ``run``, not complete in the step, may still be at work: one of
    its unfinished mini-batches has a live writer, or (between mini-batches) the run's first
    writer lives, or its last activity elsewhere is younger than the lease."""
    mine = [p for p in parts if p.run == run.run and 0 <= p.index < run.expected]
    updated = max([run.created, *(p.heartbeat for p in mine)])
    writing = [p for p in mine if not p.complete]
    return any(writer_alive(p.host, p.pid, p.heartbeat, now, lease) for p in writing) or writer_alive(
        run.host, run.pid, updated, now, lease
    )


def step_info(
    step: int,
    runs: Sequence[RunRecord],
    parts: Sequence[PartRecord],
    *,
    now: float,
    lease: float,
) -> StepInfo:
    """Derive a step's :class:`StepInfo` from its run and part records."""
    own = owner(runs, parts)
    if own is None:
        return StepInfo(step, ABANDONED, False, expected=0, done=0, rows=0, nbytes_stored=0)
    mine = [p for p in parts if p.run == own.run and 0 <= p.index < own.expected]
    complete = {p.index: p for p in mine if p.complete}
    rows = sum(p.rows for p in complete.values())
    nbytes = sum(p.nbytes for p in complete.values())
    raw = sum(p.raw_nbytes for p in complete.values())
    updated = max([own.created, *(p.heartbeat for p in mine)])
    stale = tuple(sorted(r.run for r in runs if r.run != own.run))
    state: StepState
    if len(complete) == own.expected:
        state = COMPLETE
    else:
        state = WRITING if alive(own, parts, now, lease) else ABANDONED
    return StepInfo(
        step,
        state,
        state == COMPLETE,
        expected=own.expected,
        done=len(complete),
        rows=rows,
        nbytes_stored=nbytes,
        nbytes=raw,
        run=own.run,
        updated=updated,
        stale_runs=stale,
    )


def summary_info(step: int, summary: Mapping[str, Any]) -> StepInfo:
    """The :class:`StepInfo` a complete step's summary attribute records."""
    return StepInfo(  # the stored keys keep their format's names (nbytes: stored)
        step,
        COMPLETE,
        True,
        expected=int(summary["expected"]),
        done=int(summary["expected"]),
        rows=int(summary["rows"]),
        nbytes_stored=int(summary["nbytes"]),
        nbytes=int(summary.get("raw_nbytes", 0)),
        run=str(summary["run"]),
        updated=float(summary.get("completed", 0.0)),
    )


ACTIONS: tuple[ResolveAction, ...] = get_args(ResolveAction)


def is_action(action: object) -> TypeGuard[ResolveAction]:
    """Whether ``action`` is one of :data:`ACTIONS`."""
    return isinstance(action, str) and action in ACTIONS


def check_action(action: object) -> ResolveAction:
    """``action`` if it is one of :data:`ACTIONS`, else :class:`ConfigError`."""
    if not is_action(action):
        raise ConfigError(f"action: expected 'cache' or 'repeat', got {action!r}")
    return action


def resolve(step: int, action: ResolveAction, complete_steps: Iterable[int]) -> int | None:
    """The step to load for ``step`` under ``action`` (verl's semantics).

    ``cache``: the step itself if complete, else None. ``repeat``: the step if complete, else
    the largest complete smaller step, else the smallest complete larger one, else None.
    """
    check_action(action)  # also at run time: callers may pass any string
    done = set(complete_steps)
    if step in done:
        return step
    if action == "cache":
        return None
    smaller = [s for s in done if s < step]
    if smaller:
        return max(smaller)
    larger = [s for s in done if s > step]
    return min(larger) if larger else None
