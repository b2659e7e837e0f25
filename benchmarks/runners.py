"""The timed runs: one preset's measurements, each in a fresh process.

:class:`Runner` starts the process of each measurement (forked from a pre-imported zygote, or
a new interpreter) and collects its result; :func:`bench_preset` schedules every operation of
every format for ``--reps`` repetitions, interleaved so that drifts of the machine hit
baselines and zarr_skip alike, then the untimed round-trip checks and the ``status()``
benchmark; :func:`summarize` turns the repetitions of one measurement into medians.

The ratios, targets and information floor are added afterwards by
:func:`benchmarks.report.score`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .formats import FORMATS, OPS, READ_OPS, WRITE_OPS, in_memory_sizes
from .machine import REPO_ROOT
from .measure import disk_usage
from .worker import RESULT_MARK


def log(msg: str) -> None:
    """Progress on stderr (stdout carries the report)."""
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- one process per measurement


class Runner:
    """Runs each measurement in a fresh process.

    ``fork`` (default): a zygote process imports torch / tensordict / numpy / zarr_skip once and
    forks one child per measurement (nothing heavy has run in the zygote: no thread pools, no
    allocations to reuse), which saves the ~3 s import per measurement.  ``spawn``: a brand-new
    ``python -m benchmarks.bench --worker`` per measurement.
    """

    def __init__(self, mode: str, zarr_too: bool, log_path: Path, timeout: float) -> None:
        self.mode, self.timeout = mode, timeout
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else [])
        )
        self.env.setdefault("NO_COLOR", "1")
        self.log = open(log_path, "a")  # noqa: SIM115 - closed in close()
        self.zygote: subprocess.Popen | None = None
        self._pending = b""  # bytes read from the zygote's stdout, not yet a whole line
        self.zarr_too = zarr_too

    def _start_zygote(self) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "benchmarks.bench", "--zygote"]
        if self.zarr_too:
            cmd.append("--zygote-zarr")
        return subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
            start_new_session=True,
        )

    def run(self, spec: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        timeout = timeout or self.timeout
        if self.mode == "spawn":
            return self._spawn(spec, timeout)
        if self.zygote is None or self.zygote.poll() is not None:
            self.zygote = self._start_zygote()
            self._pending = b""
        z = self.zygote
        assert z.stdin is not None and z.stdout is not None
        z.stdin.write(json.dumps(spec) + "\n")
        z.stdin.flush()
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(z.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        result: dict[str, Any] | None = None
        try:
            while True:
                # lines are split here from raw reads of the pipe: a buffered readline() could
                # take two lines at once and leave the second in its buffer, unseen by select()
                while b"\n" not in self._pending:
                    left = deadline - time.monotonic()
                    if left <= 0 or not sel.select(left):
                        self._restart_zygote()  # kills the zygote's process group (its child too)
                        return {"error": f"timeout after {timeout:.0f} s"}
                    chunk = os.read(z.stdout.fileno(), 1 << 16)
                    if not chunk:
                        z.wait()
                        self._close_pipes(z)
                        self.zygote = None
                        return {"error": f"zygote exited ({z.poll()}); see {self.log.name}"}
                    self._pending += chunk
                raw, _, self._pending = self._pending.partition(b"\n")
                line = raw.decode()
                if line.startswith(RESULT_MARK):
                    result = json.loads(line[len(RESULT_MARK) :])
                elif line.startswith("BENCH_DONE "):
                    status = int(line.split()[1])
                    if result is None:
                        return {"error": f"worker died (wait status {status}); see {self.log.name}"}
                    return result
        finally:
            sel.close()

    def _restart_zygote(self) -> None:
        if self.zygote is not None:
            try:
                os.killpg(self.zygote.pid, 9)  # the zygote's own session: zygote + its child
            except ProcessLookupError:
                pass
            self.zygote.wait()
            self._close_pipes(self.zygote)
            self.zygote = None

    @staticmethod
    def _close_pipes(proc: subprocess.Popen) -> None:
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()

    def _spawn(self, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "benchmarks.bench", "--worker", json.dumps(spec)]
        try:
            proc = subprocess.run(
                cmd,
                cwd=REPO_ROOT,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=self.log,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timeout after {timeout:.0f} s"}
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])
        return {"error": f"worker exited with {proc.returncode}; see {self.log.name}"}

    def close(self) -> None:
        if self.zygote is not None and self.zygote.poll() is None:
            assert self.zygote.stdin is not None
            self.zygote.stdin.close()
            try:
                self.zygote.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._restart_zygote()
        if self.zygote is not None:
            self._close_pipes(self.zygote)
        self.zygote = None
        self.log.close()


# --------------------------------------------------------------------------- one preset


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the per-repetition results of one measurement."""
    errors = [r["error"] for r in samples if "error" in r]
    good = [r for r in samples if "sample" in r]
    if errors and not good:
        return {"error": errors[0]}
    t = [r["sample"] for r in good]
    out: dict[str, Any] = {
        "samples": t,
        "median_s": statistics.median(t),
        "min_s": min(t),
        "max_s": max(t),
        "peak_rss": [r.get("peak_rss") for r in good],
        "peak_rss_bytes": statistics.median([r.get("peak_rss") or 0 for r in good]),
    }
    for k in ("cold_method", "rss_method", "n_steps", "n_complete"):
        if k in good[-1]:
            out[k] = good[-1][k]
    if errors:
        out["errors"] = errors
    return out


def bench_preset(name: str, args: argparse.Namespace, workdir: Path, runner: Runner) -> dict[str, Any]:
    """Every measurement of preset ``name`` (before :func:`benchmarks.report.score` adds its verdict)."""
    from zarr_skip.synthetic import PRESETS

    preset = PRESETS[name]
    pdict = {"rows": preset.rows, "max_prompt": preset.max_prompt, "max_response": preset.max_response, "n": preset.n}
    wanted = getattr(args, "formats", None) or list(FORMATS)
    formats = [f for f, (_s, base) in FORMATS.items() if (base or not args.baseline_only) and f in wanted]
    ops = [o for o in OPS if o in args.ops]
    if "write" not in ops:
        ops.insert(0, "write")  # reads need its artifact

    mem = in_memory_sizes(preset, args.seed)  # for context / throughput

    out: dict[str, Any] = {
        "preset": name,
        "params": pdict,
        "reps": args.reps,
        "seed": args.seed,
        "isolation": args.isolation,
        "in_memory": mem,
        "formats": {},
        "loadavg_start": os.getloadavg(),
    }
    scratch = workdir / "scratch"
    common = {"preset": pdict, "seed": args.seed, "cold": args.cold, "scratch": str(scratch), "warmup": args.warmup}
    samples: dict[str, dict[str, list]] = {f: {op: [] for op in ops} for f in formats}
    artifact: dict[str, Path | None] = {f: None for f in formats}
    disk: dict[str, dict[str, int]] = {}

    def order(rep: int) -> list[str]:  # rotate so no format always runs first / after another
        k = rep % len(formats)
        return formats[k:] + formats[:k]

    # Interleaved: every repetition runs every format back to back, so slow drifts of the
    # machine (other load, writeback, memory reclaim) hit baseline and zarr_skip alike.
    for phase in (WRITE_OPS, READ_OPS):
        for rep in range(args.reps):
            for op in (o for o in ops if o in phase):
                for fmt in order(rep):
                    fdir = workdir / name / fmt
                    spec = dict(common, format=fmt, op=op, rep=rep)
                    if op in WRITE_OPS:
                        d = fdir / op / f"rep{rep}"
                        spec["dir"] = str(d)
                    elif artifact[fmt] is None:
                        samples[fmt][op].append({"error": "no artifact (write failed)"})
                        continue
                    else:
                        spec["artifact"] = str(artifact[fmt])
                    r = runner.run(spec)
                    samples[fmt][op].append(r)
                    if op == "write" and "sample" in r:
                        # the last successful write is what reads read; earlier ones stay until the
                        # preset is done: nothing is deleted while writes are timed (see
                        # benchmarks/README.md, "Deletions and file creation")
                        artifact[fmt] = d
                        disk[fmt] = disk_usage(d)
                    msg = (
                        f"{r['sample'] * 1e3:9.1f} ms"
                        if "sample" in r
                        else "ERROR " + str(r.get("error")).strip().splitlines()[-1][:160]
                    )
                    log(f"[{name}] rep {rep + 1}/{args.reps} {op:12s} {fmt:18s} {msg}")

    for fmt in formats:
        out["formats"][fmt] = _summary(name, fmt, ops, samples[fmt], artifact[fmt], disk.get(fmt), args, runner, common)
    shutil.rmtree(workdir / name, ignore_errors=True)
    if not args.baseline_only and args.status_steps > 0:
        out["status"] = _status(name, args, workdir / name / "status", runner)
    shutil.rmtree(workdir / name, ignore_errors=True)

    out["loadavg_end"] = os.getloadavg()
    return out


def _summary(
    name: str,
    fmt: str,
    ops: list[str],
    samples: dict[str, list[Any]],
    artifact: Path | None,
    disk: dict[str, int] | None,
    args: argparse.Namespace,
    runner: Runner,
    common: dict[str, Any],
) -> dict[str, Any]:
    """One format's figures per operation, and its untimed round-trip check."""
    res: dict[str, Any] = {}
    for op in ops:
        res[op] = summarize(samples[op])
        if op == "write" and disk is not None:
            res[op]["disk"] = disk
    if args.verify and not FORMATS[fmt][1] and artifact is not None:
        v = runner.run(dict(common, format=fmt, op="verify", artifact=str(artifact)))
        res["write"]["verify"] = v.get("verify", {"ok": False, "error": v.get("error")})
        log(f"[{name}] {fmt:18s} round trip {res['write']['verify']}")
    return res


def _status(name: str, args: argparse.Namespace, sdir: Path, runner: Runner) -> dict[str, Any]:
    """``open_cache`` + ``status()`` over ``args.status_steps`` tiny steps, cold and warm."""
    tdict = {"rows": 8, "max_prompt": 32, "max_response": 64, "n": 8}
    log(f"[{name}] status: writing {args.status_steps} tiny steps ...")
    setup = runner.run(
        {"op": "status_setup", "preset": tdict, "seed": args.seed, "dir": str(sdir), "steps": args.status_steps},
        timeout=args.timeout * 4,
    )
    st: dict[str, Any] = {"setup": setup, "steps": args.status_steps, "preset": tdict}
    if "error" in setup:
        log(f"[{name}] status setup ERROR {setup['error'].strip().splitlines()[-1][:200]}")
    else:
        for op in ("status_cold", "status_warm"):
            spec = {"op": op, "preset": tdict, "seed": args.seed, "dir": str(sdir), "cold": args.cold}
            r = st[op] = summarize([runner.run(spec) for _ in range(args.reps)])
            shown = (
                r["error"].strip().splitlines()[-1][:200] if "error" in r else f"median {r['median_s'] * 1e3:.1f} ms"
            )
            log(f"[{name}] {op}: {shown}")
    shutil.rmtree(sdir, ignore_errors=True)
    return st
