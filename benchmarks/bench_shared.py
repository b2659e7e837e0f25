"""zarr_skip on a shared file system (a FUSE mount of SeaweedFS) and on S3, against local disk.

Usage::

    python -m benchmarks.bench_shared --preset medium --reps 5 --out benchmarks/results

The realistic step of ``--preset`` is written as ``--minibatches`` (default 4) mini-batches of
equal rows (``cache.write(step, part, expected=4)``, as a trainer with
``parameter_sync_step=4`` writes it), into a fresh cache per repetition, then read back
(``open_cache`` + ``load(step).to_dict()``), on three backends of one throw-away SeaweedFS
server (``weed mini`` through ``tests/_s3server.py``, loopback, no added latency):

* ``local``: a directory on the local disk (the work dir);
* ``fuse``: a directory on a ``weed mount`` of the server's filer (``tests/_fuse.py``): what a
  cache on a network file system sees; left out, with the reason, where FUSE is unavailable
  (``/dev/fuse``, ``fusermount3`` from the Debian package ``fuse3``);
* ``s3``: ``s3://bucket/...`` through the server's S3 gateway (obstore client).

Repetition 0 warms everything up and counts, per mini-batch write and for the read, what
each backend is asked to do (untimed, so that counting never slows a timed repetition):

* files and directories created (``local``, ``fuse``: the tree walked before and after);
* keys stored (``s3``: the prefix listed before and after);
* requests the server received, from its Prometheus counters (``-metricsPort``): S3 requests
  by type (GET, PUT, HEAD, LIST, DELETE, ...) and, for the FUSE mount, the filer's store
  operations (``SeaweedFS_filerStore_request_total``, what the mount's metadata calls become).

Repetitions 1..N are timed only: each mini-batch write (``open_cache`` untimed before the
first), the whole step's write, and the read after ``posix_fadvise(DONTNEED)`` of the step's
files (``local``, ``fuse``: the kernel's page cache; the mount's own chunk cache and the
server's volumes stay warm). The backends run in a rotated order. Nothing is deleted until
the end. Runs as any user who may mount FUSE (root not needed; see benchmarks/README.md).

On the file systems (``local``, ``fuse``) each timed repetition also writes, beside the cache,
one plain file of a mini-batch's data file's size per mini-batch (create, write, close, from
Python: no zarr_skip): the floor (:func:`floor_write`), what the file system asks for the bytes
alone. A mini-batch write on the mount cannot cost less than the local one plus the difference
of the two floors; the report gives that bound against local disk.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import socket
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.formats import fingerprint
from benchmarks.machine import REPO_ROOT, command_line, machine_info
from benchmarks.measure import drop_cache, spread
from benchmarks.servers import test_helper

logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)

STEP = 1
BACKENDS = ("local", "fuse", "s3")
#: seconds waited (in the counting repetition only) before reading the server's counters
SETTLE_S = 0.3
_METRIC = re.compile(r"^(SeaweedFS_s3_request_total|SeaweedFS_filerStore_request_total)\{([^}]*)\}\s+([0-9.e+]+)$")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- pure helpers


def split_rows(mapping: Mapping[str, Any], parts: int) -> list[dict[str, Any]]:
    """The step's rows in ``parts`` consecutive mini-batches of (nearly) equal size."""
    import torch

    n = len(next(iter(mapping.values())))
    bounds = [n * i // parts for i in range(parts + 1)]
    out: list[dict[str, Any]] = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        mb: dict[str, Any] = {}
        for k, v in mapping.items():
            if isinstance(v, torch.Tensor) and v.is_nested:
                nt: Any = v
                off = nt.offsets()
                vals = nt.values()[int(off[a]) : int(off[b])]
                mb[k] = torch.nested.nested_tensor_from_jagged(vals, off[a : b + 1] - off[a])
            else:
                mb[k] = v[a:b]
        out.append(mb)
    return out


def parse_metrics(text: str) -> Counter[str]:
    """Request counters of a SeaweedFS ``/metrics`` page, as ``"s3 PUT"`` / ``"filer insert"``."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        kind = "s3" if m.group(1).startswith("SeaweedFS_s3") else "filer"
        counts[f"{kind} {labels.get('type', '?')}"] += int(float(m.group(3)))
    return counts


def delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    """What changed between two counter readings (only what grew)."""
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] > before.get(k, 0)}


# --------------------------------------------------------------------------- the backends


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """The SeaweedFS server, its FUSE mount (when possible) and its request counters."""

    def __init__(self, srv: Any, metrics_port: int, mount: Path | None, fuse_reason: str | None) -> None:
        self.srv, self.metrics_port, self.mount, self.fuse_reason = srv, metrics_port, mount, fuse_reason

    def counters(self) -> Counter[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode())

    def location(self, backend: str, work: Path, rep: int) -> str:
        if backend == "local":
            return str(work / "local" / f"rep{rep}")
        if backend == "fuse":
            assert self.mount is not None
            return str(self.mount / "fuse" / f"rep{rep}")
        return str(self.srv.s3_url(f"s3/rep{rep}"))

    def options(self, backend: str) -> dict[str, Any] | None:
        return dict(self.srv.storage_options) if backend == "s3" else None


@contextlib.contextmanager
def started(work: Path, want_fuse: bool) -> Iterator[Server]:
    """Start the server (with its metrics port) and, if ``want_fuse`` and possible, one mount."""
    s3server = test_helper("_s3server", "seaweedfs")
    port = _free_port()
    extra = [f"-metricsPort={port}", "-metricsIp=127.0.0.1"]
    with s3server.seaweedfs(work / "seaweedfs", extra_args=extra) as srv, contextlib.ExitStack() as stack:
        reason: str | None = "not asked for (--backends)"
        mount: Path | None = None
        if want_fuse:
            fuse = test_helper("_fuse", "seaweedfs_mounts")
            reason = fuse.fuse_unavailable_reason()
            if reason is None:
                try:
                    mount = stack.enter_context(fuse.seaweedfs_mounts(srv, work / "fuse", n=1)).mountpoints[0]
                except fuse.FuseError as e:  # reported; local and S3 still run
                    reason = f"mount failed: {str(e).splitlines()[0]}"
        if reason:
            log(f"FUSE left out: {reason}")
        yield Server(srv, port, mount, reason)


def _tree(path: str) -> tuple[int, int]:
    """Files and directories under ``path`` (0, 0 when it does not exist)."""
    files = dirs = 0
    for _root, dnames, fnames in os.walk(path):
        files += len(fnames)
        dirs += len(dnames)
    return files, dirs


def _keys(server: Server, loc: str) -> int:
    """Keys stored under an ``s3://bucket/prefix`` location."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(server.srv.bucket, **server.srv.obstore_options)
    prefix = loc.split("/", 3)[3]
    return sum(len(batch) for batch in obstore.list(store, prefix=prefix + "/"))


def _stored(server: Server, backend: str, loc: str) -> dict[str, int]:
    if backend == "s3":
        return {"keys": _keys(server, loc)}
    files, dirs = _tree(loc)
    return {"files": files, "dirs": dirs}


def _read(loc: str, fp: Mapping[str, Any], opts: Mapping[str, Any] | None) -> Any:
    import zarr_skip as zs

    return zs.open_cache(loc, fp, storage_options=opts).load(STEP).to_dict()


def one_rep(server: Server, backend: str, loc: str, parts: Sequence[Mapping[str, Any]], fp: Mapping[str, Any],
            count: bool) -> dict[str, Any]:  # fmt: skip
    """Write the mini-batches into a fresh cache at ``loc``, then read the step back.

    With ``count`` (the warm-up repetition), what each write and the read made the backend do;
    without, only the times."""
    import zarr_skip as zs

    opts = server.options(backend)
    cache = zs.open_cache(loc, fp, storage_options=opts)  # untimed: a trainer opens once
    out: dict[str, Any] = {"minibatch_s": [], "counts": []}
    before = (_stored(server, backend, loc), server.counters()) if count else None
    for mb in parts:
        os.sync()
        t0 = time.perf_counter()
        cache.write(STEP, dict(mb), expected=len(parts))
        out["minibatch_s"].append(time.perf_counter() - t0)
        if before is not None:
            time.sleep(SETTLE_S)  # let the mount's and gateway's last requests land in this count
            after = (_stored(server, backend, loc), server.counters())
            made = {k: after[0][k] - before[0].get(k, 0) for k in after[0]}
            out["counts"].append({**made, "requests": delta(after[1], before[1])})
            before = after
    out["write_s"] = sum(out["minibatch_s"])
    if backend != "s3" and not count:
        out["floor_s"] = floor_write(loc, _data_file_bytes(loc), len(parts))
    if backend != "s3":
        drop_cache([Path(loc)], "fadvise")  # the kernel's page cache only, on both file systems
    c0 = server.counters() if count else None
    t0 = time.perf_counter()
    got = _read(loc, fp, opts)
    out["read_s"] = time.perf_counter() - t0
    if c0 is not None:
        time.sleep(SETTLE_S)
        out["read_requests"] = delta(server.counters(), c0)
    out["columns"] = sorted(got)
    return out


def floor_write(loc: str, nbytes: int, count: int) -> list[float]:
    """Seconds to create, write and close a plain file of ``nbytes`` random bytes, ``count``
    times (fresh names in a directory beside ``loc``): the file system's cost of a mini-batch's
    data file without zarr_skip."""
    where = Path(loc + "-floor")
    where.mkdir(parents=True, exist_ok=True)
    blob = memoryview(os.urandom(nbytes))
    out = []
    for i in range(count):
        os.sync()
        t0 = time.perf_counter()
        fd = os.open(where / f"{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            done = 0
            while done < nbytes:
                done += os.write(fd, blob[done:])
        finally:
            os.close(fd)
        out.append(time.perf_counter() - t0)
    return out


def _data_file_bytes(loc: str) -> int:
    """The mean size of the data files (``*.zip``) under ``loc``."""
    sizes = [f.stat().st_size for f in Path(loc).rglob("*.zip")]
    return int(statistics.mean(sizes)) if sizes else 0


def _rotated(names: Sequence[str], rep: int) -> list[str]:
    k = rep % len(names)
    return [*names[k:], *names[:k]]


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every repetition on every backend; repetition 0 counts and is not timed."""
    from zarr_skip.synthetic import PRESETS, as_mapping, jagged_payload

    preset = PRESETS[args.preset]
    fp = fingerprint(preset)
    parts = split_rows(as_mapping(jagged_payload(preset, args.seed, step=STEP, payload="realistic")), args.minibatches)
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    res: dict[str, Any] = {"preset": args.preset, "rows": preset.rows, "minibatches": args.minibatches,
                           "reps": args.reps, "backends": {}, "counts": {}}  # fmt: skip
    with started(work, "fuse" in wanted) as server:
        res["fuse_left_out"] = server.fuse_reason if "fuse" in wanted and server.mount is None else None
        names = [b for b in wanted if b != "fuse" or server.mount is not None]
        res["backends"] = {b: {"minibatch_s": [], "write_s": [], "read_s": [], "floor_s": []} for b in names}
        res["seaweedfs"] = weed_version()
        for rep in range(args.reps + 1):
            for b in _rotated(names, rep):
                r = one_rep(server, b, server.location(b, work, rep), parts, fp, count=rep == 0)
                if rep == 0:
                    res["counts"][b] = {"minibatches": r["counts"], "read": r.get("read_requests", {})}
                    continue
                for k in ("write_s", "read_s"):
                    res["backends"][b][k].append(r[k])
                res["backends"][b]["minibatch_s"].append(r["minibatch_s"])
                res["backends"][b]["floor_s"] += r.get("floor_s", [])
                log(f"[shared] rep {rep}/{args.reps} {b:5s} write {r['write_s'] * 1e3:7.1f} ms  "
                    f"read {r['read_s'] * 1e3:7.1f} ms")  # fmt: skip
    return res


def weed_version() -> str:
    import subprocess

    weed = test_helper("_s3server", "find_weed").find_weed()
    try:
        out = subprocess.run([weed, "version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError, TypeError):
        return "?"
    return next((ln.strip() for ln in out.stdout.splitlines() if ln.startswith("version")), "?")


# --------------------------------------------------------------------------- the report


def _stats(v: Sequence[float]) -> dict[str, float]:
    return dict(zip(("min", "median", "max"), spread(v), strict=True))


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """min / median / max of the step's write, a mini-batch's write and the read; ratios to local."""
    out: dict[str, Any] = {}
    for b, v in res["backends"].items():
        per_mb = [t for rep in v["minibatch_s"] for t in rep]
        out[b] = {"write": _stats(v["write_s"]), "minibatch": _stats(per_mb), "read": _stats(v["read_s"])}
        if v.get("floor_s"):
            out[b]["floor"] = _stats(v["floor_s"])
    loc = out.get("local")
    for b in out:
        out[b]["vs_local"] = {
            m: out[b][m]["median"] / loc[m]["median"] if loc else None for m in ("write", "minibatch", "read")
        }
        if loc and "floor" in out[b] and "floor" in loc:  # the least a mini-batch write can cost here
            bound = loc["minibatch"]["median"] + out[b]["floor"]["median"] - loc["floor"]["median"]
            out[b]["minibatch_bound"] = {"s": bound, "vs_local": bound / loc["minibatch"]["median"]}
    return out


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x < 10 else f"{x * 1e3:.0f}"


def count_cells(mbs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Per count: the first mini-batch's (it creates the cache) and the mean of the others'."""
    flat = [{**{k: v for k, v in mb.items() if k != "requests"}, **mb.get("requests", {})} for mb in mbs]
    order = {"files": 0, "dirs": 1, "keys": 2}  # then the S3 requests, then the filer's operations
    keys = sorted({k for mb in flat for k in mb}, key=lambda k: (order.get(k, 3 if k.startswith("s3") else 4), k))
    out = {}
    for k in keys:
        rest = [mb.get(k, 0) for mb in flat[1:]]
        out[k] = _num(flat[0].get(k, 0)) + (f" / {_num(statistics.mean(rest))}" if rest else "")
    return out


def _num(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _floor_lines(s: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The floor's row of the timing table and the bound it sets (nothing without floors)."""
    floors = [b for b in names if "floor" in s[b]]
    if not floors:
        return []
    cells = [
        f"{_ms(s[b]['floor']['min'])} / **{_ms(s[b]['floor']['median'])}** / {_ms(s[b]['floor']['max'])}"
        if b in floors
        else "-"
        for b in names
    ]
    row = "| floor: one plain file of a data file's size (create, write, close) | " + " | ".join(cells) + " |"
    bounds = [
        f"{b}: {_ms(s[b]['minibatch_bound']['s'])} ms, {s[b]['minibatch_bound']['vs_local']:.2f}x local"
        for b in floors
        if b != "local" and "minibatch_bound" in s[b]
    ]
    lines = [row + " - |" * (len(names) - 1)]
    if bounds:
        lines += [
            "",
            "The least a mini-batch write can take (local disk's, plus what the file system adds to "
            "writing its data file's bytes alone: the floors' difference): " + "; ".join(bounds) + ".",
        ]
    return lines


def report(res: dict[str, Any]) -> str:
    s = res["summary"]
    names = list(res["backends"])
    lines = [
        f"# zarr_skip on a FUSE mount and on S3 vs local disk: the realistic `{res['preset']}` step "
        f"in {res['minibatches']} mini-batches",
        "",
        load.line(res.get("load")),
        "",
        f"Run {res['started']} (git {res['machine'].get('git_commit')}), command: `{res['command']}`. "
        f"SeaweedFS {res.get('seaweedfs')} (`weed mini`, loopback, no added latency); FUSE: `weed mount` of its "
        f"filer; S3: its gateway, obstore client. {res['reps']} timed repetitions after an untimed one that warms "
        "up and counts; backends in rotated order; a fresh cache each repetition (the first mini-batch creates "
        "it); reads after `posix_fadvise(DONTNEED)` of the files (the mount's cache and the server stay warm). "
        "Times in ms as min / **median** / max.",
        "",
    ]
    if res.get("fuse_left_out"):
        lines += [f"FUSE left out: {res['fuse_left_out']}.", ""]
    lines += ["| operation | " + " | ".join(names) + " | " + " | ".join(f"{b} / local" for b in names if b != "local")
              + " |", "|---|" + "---|" * (2 * len(names) - 1)]  # fmt: skip
    labels = {"write": f"write the step ({res['minibatches']} mini-batches)", "minibatch": "write one mini-batch",
              "read": "read the step (open + load + to_dict)"}  # fmt: skip
    for m, label in labels.items():
        cells = [f"{_ms(s[b][m]['min'])} / **{_ms(s[b][m]['median'])}** / {_ms(s[b][m]['max'])}" for b in names]
        cells += [f"{s[b]['vs_local'][m]:.1f}" for b in names if b != "local" and s[b]["vs_local"][m] is not None]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += _floor_lines(s, names)
    lines += ["", "What a mini-batch write made each backend do in the counting repetition (the first mini-batch, "
              "which also creates the cache / the mean of the others), and the read of the whole step:", "",
              "| backend | per mini-batch write | read of the step |", "|---|---|---|"]  # fmt: skip
    for b, c in res["counts"].items():
        per = ", ".join(f"{k} {v}" for k, v in count_cells(c["minibatches"]).items())
        read = ", ".join(f"{k} {v}" for k, v in c["read"].items())
        lines.append(f"| {b} | {per} | {read or '-'} |")
    lines += [
        "",
        "`files` / `dirs`: created in the cache's tree; `keys`: stored under the cache's S3 prefix; `s3 TYPE`: "
        "requests the S3 gateway answered; `filer TYPE`: the filer's store operations (a FUSE mount's metadata "
        "calls, and the gateway's own lookups), both from the server's Prometheus counters.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_shared",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--preset", default="medium", help="small, medium or large (default medium)")
    ap.add_argument("--minibatches", type=int, default=4, help="mini-batches per step (default 4)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (default 5)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="subset of " + ",".join(BACKENDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="shared_<preset>.md/.json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.minibatches < 1:
        ap.error("--reps and --minibatches must be >= 1")
    if "local" not in args.backends.split(","):
        ap.error("--backends must hold local (the ratios are against it)")
    mon = load.guard(args)
    if mon is None:
        return 2
    run = load.run_monitored(mon, args.out, ".bench-tmp-shared-", lambda work: measure(args, work), keep=args.keep)
    res, record = run.result, run.record
    command = command_line("bench_shared", argv)
    res.update(started=run.started, load=record, machine=machine_info(args.out), command=command)
    res["summary"] = summarize(res)
    load.publish(args.out, f"shared_{args.preset}", res, report(res))
    log(f"wrote {args.out / f'shared_{args.preset}.md'}")
    return load.exit_code(record, args.require_quiet)


if __name__ == "__main__":
    sys.exit(main())
