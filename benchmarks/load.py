"""How busy the machine was before and during a benchmark run, and whether that makes it BUSY.

A run taken while other work competes for the cores slows some formats more than others (the
issue's quiet rerun moved the realistic medium write from 0.94x to 1.29x the plain dump), so
every benchmark records the load it ran under and says so in its report:

* **before**: the 1-minute load average (``os.getloadavg``) and the share of the machine's CPU
  time used during a short probe (``probe_s``, default 1 s) when nothing of ours runs yet;
* **during**: a background thread samples ``/proc/stat`` (the machine's CPU time per state) and
  ``/proc/<pid>/stat`` of every process every ``interval_s`` (default 1 s), separating the
  CPU time of our own process tree (this process and its descendants: measurement processes,
  servers it started) from everything else.

"Other processes' share" is the non-idle CPU time (``user + nice + system + irq + softirq +
steal``: steal is time the hypervisor gave to other guests) not used by our process tree,
divided by all the CPU time of all cores in the same interval: 100% means every core busy
with other work. Our tree's time is the sum of ``utime + stime + cutime + cstime`` over its
live processes, so the children it reaped (the forked measurement processes) count too, and
processes of others that start and end between two samples are not missed (they are in the
machine's total). The tree is followed from sample to sample: a process of ours re-parented
to init (the workers of a Ray cluster whose raylet was killed first) stays ours while it
lives, and one that ends unreaped by us loses at most its last interval's time.

The verdict (:func:`verdict`, pure) is BUSY when, with the default :data:`DEFAULT_THRESHOLDS`,

* the load average before the run exceeds ``0.5`` per core (1.0 on 2 cores), or
* other processes used more than ``10%`` of the machine's CPU before the run (the probe) or
  during it (over the whole run), or
* with the page-cache probe (``--require-quiet`` runs it before the run, where the run writes,
  once the CPU is found quiet): ``256 MiB`` written after an ``os.sync()``, as the benchmarks
  time their writes, went in slower than ``300 MB/s`` in one of three rounds. Then the page
  cache is not absorbing writes and they wait on the disk: the uncompressed baselines (a
  300 MB dump) slow down 4x and more while a compressed format writing a quarter of the bytes
  barely does, a flattering ratio that no CPU figure shows. On this VM such stalls come and go
  within minutes with the CPU idle: a 300 MiB write took 55-80 ms most times and 1-3 s (100-300
  MB/s) in others; a large-step run with its dump's write at 1.7 s instead of ~0.1-0.3 s put
  zarr_skip at 0.12x the dump. The probe catches a stall under way when the run starts, not
  one that starts later: the spread of a run's repetitions (``*`` in the reports) shows those.

Everything that reads ``/proc`` is in :class:`LoadMonitor`; parsing and arithmetic are pure
functions, tested without I/O (``tests/test_bench.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: fields of a ``cpu`` line of /proc/stat that are idle time
_IDLE_FIELDS = (3, 4)  # idle, iowait
#: the first 8 fields (user nice system idle iowait irq softirq steal); guest time is already in user
_STAT_FIELDS = 8


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Where a quiet machine ends.

    Attributes
    ----------
    load_per_core : float
        Largest 1-minute load average before the run, per core.
    other_cpu : float
        Largest share (0-1) of the machine's CPU time other processes may use, before the run
        (the probe) or during it.
    page_cache_mb_s : float
        Slowest rate (MB/s) at which the page-cache probe's writes may go in.
    """

    load_per_core: float = 0.5
    other_cpu: float = 0.10
    page_cache_mb_s: float = 300.0


DEFAULT_THRESHOLDS = Thresholds()
#: MiB written per round of the page-cache probe, and its rounds (:func:`probe_page_cache`)
PAGE_CACHE_MIB = 256
PAGE_CACHE_ROUNDS = 3
#: a before-record (JSON) handed down by ``benchmarks.suite``: the load when the suite started,
#: before any of its own runs raised the load average
BEFORE_ENV = "ZARR_SKIP_BENCH_LOAD_BEFORE"


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The machine's CPU time, summed over cores, in clock ticks (``/proc/stat``)."""

    total: int
    busy: int


@dataclass(frozen=True, slots=True)
class ProcTimes:
    """One process from ``/proc/<pid>/stat``: its parent, name and CPU time in clock ticks."""

    pid: int
    ppid: int
    comm: str
    own: int  # utime + stime
    reaped: int  # cutime + cstime: the children it waited for


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One sample: when, the machine's CPU time, and every process."""

    t: float
    cpu: CpuTimes
    procs: Mapping[int, ProcTimes]


@dataclass(frozen=True, slots=True)
class Shares:
    """CPU shares (0-1 of all cores' time) between two snapshots."""

    seconds: float
    ours: float
    others: float
    top_others: tuple[tuple[str, float], ...] = ()  # (name, share), largest first


@dataclass(frozen=True, slots=True)
class LoadVerdict:
    """Quiet or BUSY, and the sentence that says why."""

    busy: bool
    text: str
    reasons: tuple[str, ...] = field(default=())


# --------------------------------------------------------------------------- pure parsing


def parse_proc_stat(text: str) -> CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat``."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            vals = [int(x) for x in parts[1 : 1 + _STAT_FIELDS]]
            idle = sum(vals[i] for i in _IDLE_FIELDS if i < len(vals))
            return CpuTimes(total=sum(vals), busy=sum(vals) - idle)
    raise ValueError("no aggregate 'cpu' line in /proc/stat text")


def parse_pid_stat(text: str) -> ProcTimes:
    """``/proc/<pid>/stat``; the name (in parentheses) may hold spaces and parentheses."""
    head, _, rest = text.rpartition(")")
    pid_s, _, comm = head.partition(" (")
    f = rest.split()
    # after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    return ProcTimes(
        pid=int(pid_s), ppid=int(f[1]), comm=comm, own=int(f[11]) + int(f[12]), reaped=int(f[13]) + int(f[14])
    )


def descendants(roots: Iterable[int], procs: Mapping[int, ProcTimes]) -> set[int]:
    """``roots`` and every live process below them."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    tree, todo = set(roots), list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in tree:
                tree.add(c)
                todo.append(c)
    return tree


def _total(p: ProcTimes) -> int:
    return p.own + p.reaped


def _reaped_by_ours(a: Snapshot, b: Snapshot, mine_b: set[int], gone: set[int]) -> set[int]:
    """Which of ``gone`` (ours at ``a``, ended by ``b``) one of ours reaped, so that their time
    is in its ``cutime`` at ``b``: those whose parent is ours at ``b`` and took in at least what
    they had at ``a``, and those whose parent ended too and was reaped by ours (it waited for
    them: a DataLoader's workers, then the process that ran it). One whose parent lives and
    is not ours (init: a killed Ray raylet's workers) was reaped elsewhere."""
    kids: dict[int, list[int]] = {}
    for pid in gone:
        kids.setdefault(a.procs[pid].ppid, []).append(pid)
    reaped: set[int] = set()

    def take(parent: int) -> None:
        for kid in kids.get(parent, ()):
            reaped.add(kid)
            take(kid)

    for parent, group in kids.items():
        if parent in mine_b and parent in a.procs:
            took = b.procs[parent].reaped - a.procs[parent].reaped
            if took >= sum(_total(a.procs[k]) for k in group):
                take(parent)
    return reaped


def _ours_between(a: Snapshot, b: Snapshot, root: int, mine_a: set[int]) -> tuple[int, set[int]]:
    """Our tree's CPU ticks from ``a`` to ``b``, and our tree at ``b``: ``root``, its
    descendants, and every process of ours at ``a`` that still lives (an orphan re-parented to
    init stays ours), with theirs. An ended process of ours counts through the ``cutime`` of
    the one of ours that reaped it (:func:`_reaped_by_ours`; what it had at ``a``, counted
    before, is taken off); one reaped elsewhere loses at most its time since ``a``."""
    mine_b = descendants([root, *(p for p in mine_a if p in b.procs)], b.procs)
    ticks = 0
    for pid in mine_b:
        before = a.procs.get(pid)
        ticks += max(0, _total(b.procs[pid]) - (_total(before) if before is not None else 0))
    gone = {p for p in mine_a if p not in b.procs}
    ticks -= sum(_total(a.procs[p]) for p in _reaped_by_ours(a, b, mine_b, gone))
    return max(0, ticks), mine_b


def shares_over(samples: Sequence[Snapshot], root: int, top: int = 3) -> tuple[Shares, list[Shares]]:
    """Our tree's and the others' share of the machine's CPU time over ``samples`` (a run),
    and per interval between two of them. Our tree is followed from sample to sample, so its
    processes that end unreaped by it (a killed Ray cluster's workers, re-parented to init)
    still count as ours; the others' named processes are those seen at both ends of an
    interval, the rest "short-lived processes"."""
    mine = descendants([root], samples[0].procs)
    ours_all = others_all = 0
    per_name: dict[str, int] = {}
    steps = []
    for a, b in zip(samples, samples[1:], strict=False):
        total = b.cpu.total - a.cpu.total
        ours, mine_b = _ours_between(a, b, root, mine)
        others = max(0, b.cpu.busy - a.cpu.busy - ours)
        for pid, p in b.procs.items():
            if pid not in mine_b and pid not in mine and pid in a.procs:
                per_name[p.comm] = per_name.get(p.comm, 0) + max(0, p.own - a.procs[pid].own)
        steps.append(_shares(b.t - a.t, total, ours, others, {}, 0))
        mine, ours_all, others_all = mine_b, ours_all + ours, others_all + others
    total = samples[-1].cpu.total - samples[0].cpu.total
    return _shares(samples[-1].t - samples[0].t, total, ours_all, others_all, per_name, top), steps


def _shares(seconds: float, total: int, ours: int, others: int, per_name: Mapping[str, int], top: int) -> Shares:
    if total <= 0:
        return Shares(seconds=seconds, ours=0.0, others=0.0)
    ranked = sorted(((n, v / total) for n, v in per_name.items() if v > 0), key=lambda kv: -kv[1])
    gone = others / total - sum(v for _, v in ranked)  # processes that started or ended in between
    if top and gone >= 0.01:
        ranked = sorted([*ranked[:top], ("short-lived processes", gone)], key=lambda kv: -kv[1])
    return Shares(seconds=seconds, ours=min(1.0, ours / total), others=min(1.0, others / total),
                  top_others=tuple(ranked[:top]))  # fmt: skip


def shares(a: Snapshot, b: Snapshot, root: int, top: int = 3) -> Shares:
    """Our tree's and the others' share of the machine's CPU time from ``a`` to ``b``."""
    return shares_over([a, b], root, top)[0]


# --------------------------------------------------------------------------- pure verdict


def verdict(
    cores: int,
    load_before: float,
    other_before: float | None,
    other_during: float | None,
    top: Iterable[tuple[str, float]] = (),
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    page_cache_mb_s: float | None = None,
) -> LoadVerdict:
    """Quiet or BUSY from the load average before, the others' CPU share before and during,
    and the page-cache probe's rate.

    Parameters
    ----------
    cores : int
        Cores of the machine.
    load_before : float
        1-minute load average just before the run.
    other_before, other_during : float or None
        Other processes' share (0-1) of all cores' CPU time in the probe before the run and
        over the whole run (None: not measured).
    top : iterable of (name, share)
        The busiest other processes, named in the sentence.
    thresholds : Thresholds
        Where quiet ends.
    page_cache_mb_s : float or None
        The page-cache probe's slowest rate before the run (None: not probed).
    """
    reasons = []
    limit = thresholds.load_per_core * cores
    if load_before > limit:
        reasons.append(f"load {load_before:.1f} on {cores} cores before the run (quiet: <= {limit:.1f})")
    for when, share in (("before", other_before), ("during", other_during)):
        if share is not None and share > thresholds.other_cpu:
            reasons.append(
                f"other processes used {share:.0%} CPU {when} the run (quiet: <= {thresholds.other_cpu:.0%})"
            )
    if page_cache_mb_s is not None and page_cache_mb_s < thresholds.page_cache_mb_s:
        reasons.append(
            f"writes went into the page cache at {page_cache_mb_s:.0f} MB/s before the run (quiet: >= "
            f"{thresholds.page_cache_mb_s:.0f}): they wait on the disk, which flatters formats that write fewer bytes"
        )
    named = ", ".join(f"{n} {s:.0%}" for n, s in top)
    facts = f"load {load_before:.1f} on {cores} cores" + "".join(
        f", other processes used {s:.0%} CPU {w}" for w, s in (("before", other_before), ("during", other_during))
        if s is not None
    ) + ("" if page_cache_mb_s is None else f", writes into the page cache {page_cache_mb_s:.0f} MB/s")  # fmt: skip
    if reasons:
        text = "BUSY: " + "; ".join(reasons) + (f" (busiest others: {named})" if named else "")
        return LoadVerdict(busy=True, text=text, reasons=tuple(reasons))
    return LoadVerdict(busy=False, text=f"quiet: {facts}")


# --------------------------------------------------------------------------- reading /proc


def probe_page_cache(where: Path, mib: int = PAGE_CACHE_MIB, rounds: int = PAGE_CACHE_ROUNDS) -> float:
    """The slowest rate (MB/s) at which ``mib`` MiB written to a new file in ``where`` went in,
    over ``rounds`` rounds, each after an ``os.sync()`` as the benchmarks time their writes (on
    this VM the first round can be fast and the next ones wait on the disk). The files are
    removed and synced away before it returns."""
    where.mkdir(parents=True, exist_ok=True)
    piece = bytes(1 << 20)
    rates = []
    for _ in range(rounds):
        fd, name = tempfile.mkstemp(prefix=".page-cache-probe-", dir=where)
        try:
            with open(fd, "wb", closefd=True) as fh:
                os.sync()
                t0 = time.perf_counter()
                for _ in range(mib):
                    fh.write(piece)
                fh.flush()
                rates.append(mib * len(piece) / 1e6 / max(time.perf_counter() - t0, 1e-9))
        finally:
            os.unlink(name)
    os.sync()
    return min(rates)


def read_snapshot(proc: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic) -> Snapshot:
    """The machine's CPU time and every process's, read from ``proc``."""
    cpu = parse_proc_stat((proc / "stat").read_text())
    procs: dict[int, ProcTimes] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as fh:
                p = parse_pid_stat(fh.read())
        except (OSError, ValueError, IndexError):  # the process ended while we looked
            continue
        procs[p.pid] = p
    return Snapshot(t=clock(), cpu=cpu, procs=procs)


class LoadMonitor:
    """Records the load before a run (:meth:`start`) and samples it during it (until :meth:`stop`).

    Parameters
    ----------
    interval_s : float
        Seconds between samples of the background thread.
    probe_s : float
        Seconds of the probe before the run (0: no probe, only the load average).
    thresholds : Thresholds
        Where quiet ends.
    page_cache : (Path, int) or None
        Where the page-cache probe writes and how many MiB a round (None: no probe); it runs
        only when the load and the CPU are found quiet (:func:`probe_page_cache`).
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        probe_s: float = 1.0,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        page_cache: tuple[Path, int] | None = None,
    ) -> None:
        self.interval_s, self.probe_s, self.thresholds = interval_s, probe_s, thresholds
        self.page_cache = page_cache
        self.cores = os.cpu_count() or 1
        self.root = os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[Snapshot] = []
        self.before: dict[str, Any] = {}
        self.result: dict[str, Any] | None = None

    def probe(self) -> dict[str, Any]:
        """The load before the run: load average and the others' share over ``probe_s``."""
        la = os.getloadavg()
        other: float | None = None
        top: tuple[tuple[str, float], ...] = ()
        if self.probe_s > 0:
            a = read_snapshot()
            time.sleep(self.probe_s)
            s = shares(a, read_snapshot(), self.root)
            other, top = s.others, s.top_others
        record: dict[str, Any] = {
            "loadavg": list(la),
            "other_cpu": other,
            "top_others": [list(t) for t in top],
            "probe_s": self.probe_s,
            "taken": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if self.page_cache is not None and not _verdict_of(record, self).busy:  # no use on a busy CPU
            where, mib = self.page_cache
            record["page_cache_mb_s"] = probe_page_cache(where, mib)
            record["page_cache_mib"] = mib
        return record

    def take_before(self) -> dict[str, Any]:
        """The before-record: inherited from ``$ZARR_SKIP_BENCH_LOAD_BEFORE`` or probed now (once)."""
        if not self.before:
            inherited = os.environ.get(BEFORE_ENV)
            self.before = json.loads(inherited) if inherited else self.probe()
        return self.before

    def start(self) -> LoadMonitor:
        """Take (or inherit) the before-record, then sample in a background thread."""
        self.take_before()
        self._samples = [read_snapshot()]
        self._thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples.append(read_snapshot())

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the record of the run (also kept in :attr:`result`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._samples.append(read_snapshot())
        self.result = summarize(self.before, self._samples, self.root, self.cores, os.getloadavg(), self.thresholds)
        return self.result

    def __enter__(self) -> LoadMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def summarize(
    before: Mapping[str, Any],
    samples: list[Snapshot],
    root: int,
    cores: int,
    loadavg_end: Iterable[float],
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> dict[str, Any]:
    """The JSON record of a run: before, during (whole run and per interval), verdict."""
    whole, steps = shares_over(samples, root)
    v = verdict(
        cores,
        before["loadavg"][0],
        before.get("other_cpu"),
        whole.others,
        whole.top_others or (),
        thresholds,
        before.get("page_cache_mb_s"),
    )
    return {
        "cores": cores,
        "thresholds": asdict(thresholds),
        "before": dict(before),
        "during": {
            "seconds": whole.seconds,
            "other_cpu": whole.others,
            "our_cpu": whole.ours,
            "top_others": [list(t) for t in whole.top_others],
            "other_cpu_max_interval": max((s.others for s in steps), default=None),
            "samples": len(samples),
            "loadavg_end": list(loadavg_end),
        },
        "busy": v.busy,
        "verdict": v.text,
    }


# --------------------------------------------------------------------------- command-line glue


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--require-quiet`` and the thresholds, the same in every benchmark script."""
    ap.add_argument(
        "--require-quiet",
        action="store_true",
        help="refuse to start on a busy machine (exit 2), and exit 3 when the machine became busy "
        f"during the run (results still written, marked BUSY). Quiet: load average <= "
        f"{DEFAULT_THRESHOLDS.load_per_core} per core before, other processes <= "
        f"{DEFAULT_THRESHOLDS.other_cpu:.0%}% of the CPU before and during, and writes into the page "
        f"cache >= {DEFAULT_THRESHOLDS.page_cache_mb_s:.0f} MB/s before",  # "%%": help is %-formatted
    )
    ap.add_argument(
        "--page-cache-mib",
        type=int,
        default=None,
        help=f"MiB a round of the page-cache probe writes where the run writes (default {PAGE_CACHE_MIB} "
        "with --require-quiet and in `python -m benchmarks.load`, else no probe; 0: no probe)",
    )
    ap.add_argument("--quiet-load", type=float, default=DEFAULT_THRESHOLDS.load_per_core, help=argparse.SUPPRESS)
    ap.add_argument("--quiet-cpu", type=float, default=DEFAULT_THRESHOLDS.other_cpu, help=argparse.SUPPRESS)
    ap.add_argument(
        "--quiet-page-cache", type=float, default=DEFAULT_THRESHOLDS.page_cache_mb_s, help=argparse.SUPPRESS
    )


def monitor_from(args: argparse.Namespace, probe_by_default: bool = False) -> LoadMonitor:
    """A :class:`LoadMonitor` with the thresholds of the command line; the page-cache probe
    writes where the script writes (``--workdir``, else ``--out``, else here)."""
    mib = args.page_cache_mib
    if mib is None:
        mib = PAGE_CACHE_MIB if probe_by_default or getattr(args, "require_quiet", False) else 0
    where = getattr(args, "workdir", None) or getattr(args, "out", None) or "."
    thresholds = Thresholds(args.quiet_load, args.quiet_cpu, args.quiet_page_cache)
    return LoadMonitor(thresholds=thresholds, page_cache=(Path(where), mib) if mib > 0 else None)


def _verdict_of(before: Mapping[str, Any], mon: LoadMonitor) -> LoadVerdict:
    """The verdict of a before-record alone (nothing measured during the run yet)."""
    top = [(str(n), float(v)) for n, v in before["top_others"]]
    return verdict(
        mon.cores, before["loadavg"][0], before["other_cpu"], None, top, mon.thresholds, before.get("page_cache_mb_s")
    )


class BusyMachineError(RuntimeError):
    """``--require-quiet`` and the machine is busy before the run."""


def refuse_if_busy(mon: LoadMonitor) -> None:
    """Probe the machine before the run; raise :class:`BusyMachineError` if it is busy."""
    v = _verdict_of(mon.take_before(), mon)
    if v.busy:
        raise BusyMachineError(f"--require-quiet: {v.text}; wait until the machine is quiet and run again")


def guard(args: argparse.Namespace) -> LoadMonitor | None:
    """The monitor of a script's run, its before-record taken; None (reason on stderr) when
    ``--require-quiet`` refuses the busy machine: the script then exits 2."""
    mon = monitor_from(args)
    if getattr(args, "require_quiet", False):
        try:
            refuse_if_busy(mon)
        except BusyMachineError as e:
            print(e, file=sys.stderr, flush=True)
            return None
    mon.take_before()
    return mon


def exit_code(record: Mapping[str, Any] | None, require_quiet: bool) -> int:
    """3 when ``--require-quiet`` and the run was BUSY, else 0."""
    return 3 if require_quiet and record is not None and record.get("busy") else 0


@dataclass
class MonitoredRun:
    """What :func:`run_monitored` gives: the measurement's result, when it started (UTC, ISO)
    and the load record of its run."""

    result: Any
    started: str
    record: dict[str, Any] | None


def run_monitored(
    mon: LoadMonitor, out: Path, prefix: str, measure: Callable[[Path], Any], *, keep: bool = False
) -> MonitoredRun:
    """``measure(work)`` under ``mon`` (from :func:`guard`), ``work`` a new directory in ``out``
    (made if needed) named ``prefix...``, removed afterwards unless ``keep``."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=out))
    started = datetime.now(UTC).isoformat(timespec="seconds")
    mon.start()
    try:
        result = measure(work)
    finally:
        record = mon.stop()
        if keep:
            print(f"kept {work}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return MonitoredRun(result, started, record)


def publish(out: Path, stem: str, res: Mapping[str, Any], text: str) -> None:
    """A script's results: ``text`` as ``out/{stem}.md`` (and printed), ``res`` as ``out/{stem}.json``."""
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(text)


def line(record: Mapping[str, Any] | None) -> str:
    """The markdown line a report starts with: the verdict and what it rests on."""
    if not record:
        return "Machine load: not recorded."
    d = record["during"]
    la = "/".join(f"{x:.1f}" for x in record["before"]["loadavg"])
    tail = (
        f" (load average before {la}, after {'/'.join(f'{x:.1f}' for x in d['loadavg_end'])}; our processes used "
        f"{d['our_cpu']:.0%} of the CPU over {d['seconds']:.0f} s, {d['samples']} samples; see benchmarks/load.py)"
    )
    text = str(record["verdict"])
    return (f"**{text}**" if record["busy"] else f"Machine load: {text}") + tail


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.load``: probe the machine now and say whether it is quiet (exit 1 if BUSY)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.load", description=main.__doc__)
    ap.add_argument("--json", action="store_true", help="print the before-record as JSON")
    add_arguments(ap)
    args = ap.parse_args(argv)
    mon = monitor_from(args, probe_by_default=True)
    b = mon.probe()
    if args.json:
        print(json.dumps(b))
        return 0
    v = _verdict_of(b, mon)
    print(v.text)
    return 1 if v.busy else 0


if __name__ == "__main__":
    raise SystemExit(main())
