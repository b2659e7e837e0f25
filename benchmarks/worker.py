"""What runs inside the fresh process of one measurement.

The process imports everything first (:func:`_preimport`), runs the format's operations once
on a small batch (the untimed warm-up), then times one operation: a write, a cold or warm
read, or ``status()`` of a cache of many small steps.  It prints its result as one JSON line
after :data:`RESULT_MARK`, which :class:`benchmarks.runners.Runner` reads.

Two ways in, both through ``python -m benchmarks.bench``: ``--worker SPEC`` runs one
measurement in a new interpreter (:func:`worker_main`); ``--zygote`` imports once and forks a
child per spec read from stdin (:func:`zygote_main`).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .formats import FORMAT_CLASSES, FORMATS, STEP, WRITE_OPS, fingerprint, verify_roundtrip
from .measure import PeakRSS, disk_usage, drop_cache, fsync_tree, iter_files

RESULT_MARK = "BENCH_RESULT "
#: the warm-up's batch: small, yet with arrays above ``chunkjobs.INLINE_BYTES`` (16 KiB), so a
#: zarr_skip write takes the pool path a real step takes and starts the pool's threads (a
#: smaller one left them to the timed write: ~1-2 ms of a small step's first write)
WARMUP_PRESET = {"rows": 32, "max_prompt": 128, "max_response": 512, "n": 8}


def _preimport(zarr_too: bool) -> None:
    """Import everything an operation may need, so import cost is never measured
    (unpickling gen_batch.dp imports torch + zarr_skip.synthetic, tq_batch.pt tensordict)."""
    import numpy  # noqa: F401
    import tensordict  # noqa: F401
    import torch  # noqa: F401

    import zarr_skip.synthetic  # noqa: F401

    if zarr_too:
        import zarr  # noqa: F401

        import zarr_skip  # noqa: F401


def _warm_files(d: Path) -> None:
    """Read every file once (untimed, no Python objects built): fills the page cache.

    The buffer stays below glibc's mmap threshold (128 KiB) so that freeing it does not raise
    the threshold and change how the measured operation allocates."""
    buf = bytearray(64 * 2**10)
    for f in iter_files(d):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def _warmup_process(fmt_name: str, scratch: Path) -> None:
    """Run the format's operations once on a small batch in a scratch directory, so one-time
    lazy initialisation (thread pools, event loops, lazy imports, codec setup) is not measured:
    the measured operation then costs what it costs in a long-running trainer.

    The scratch directory is left for the runner to remove after the measurements: deleting
    files just before a timed write makes its file creations slower (benchmarks/README.md,
    "Deletions and file creation")."""
    from zarr_skip.synthetic import Preset

    f = FORMAT_CLASSES[fmt_name](Preset(**WARMUP_PRESET))
    d = scratch / f"warmup-{os.getpid()}"
    d.mkdir(parents=True)
    data = f.make(1)
    f.write(f.prepare_write(d), d, data)
    for fn in (f.read, f.column, f.rows64):
        fn(d)
    gc.collect()


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One repetition of one operation (runs in a fresh process)."""
    from zarr_skip.synthetic import Preset

    preset = Preset(**spec["preset"])
    op = spec["op"]
    out: dict[str, Any] = {"op": op, "format": spec.get("format"), "pid": os.getpid()}
    if op == "status_setup":
        return _status_setup(spec, preset, out)
    if op in ("status_cold", "status_warm"):
        return _status_read(spec, preset, out)
    fmt_name = spec["format"]
    fmt = FORMAT_CLASSES[fmt_name](preset)
    if spec.get("warmup", True):
        _warmup_process(fmt_name, Path(spec["scratch"]))
    if op == "verify":
        return dict(out, verify=verify_roundtrip(fmt, Path(spec["artifact"]), spec["seed"]))
    rss = PeakRSS()
    out["rss_method"] = rss.method
    if op in WRITE_OPS:
        return _write(spec, fmt, rss, out)
    return _read(spec, fmt, rss, out)


def _status_setup(spec: dict[str, Any], preset: Any, out: dict[str, Any]) -> dict[str, Any]:
    import zarr_skip as zs
    from zarr_skip.synthetic import padded_batch

    seed = spec["seed"]
    base = Path(spec["dir"])
    cache = zs.open_cache(str(base), fingerprint=fingerprint(preset))
    t_write = 0.0
    for s in range(1, spec["steps"] + 1):
        dp = padded_batch(preset, seed, step=s)
        t0 = time.perf_counter()
        cache.write(s, dp)
        t_write += time.perf_counter() - t0
    out["write_per_step_s"] = t_write / spec["steps"]
    out["disk"] = disk_usage(base)
    return out


def _status_read(spec: dict[str, Any], preset: Any, out: dict[str, Any]) -> dict[str, Any]:
    import zarr_skip as zs

    base = Path(spec["dir"])
    zs.open_cache(str(base), fingerprint=fingerprint(preset)).status()  # process warm-up
    if spec["op"] == "status_cold":
        out["cold_method"] = drop_cache([base], spec["cold"])
    rss = PeakRSS()
    rss.start()
    t0 = time.perf_counter()
    st = zs.open_cache(str(base), fingerprint=fingerprint(preset)).status()
    out["sample"] = time.perf_counter() - t0
    out["peak_rss"] = rss.stop()
    out["rss_method"] = rss.method
    out["n_steps"] = len(st)
    out["n_complete"] = sum(1 for s in st if getattr(s, "complete", False))
    return out


def _write(spec: dict[str, Any], fmt: Any, rss: PeakRSS, out: dict[str, Any]) -> dict[str, Any]:
    op, seed = spec["op"], spec["seed"]
    d = Path(spec["dir"])
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    data = fmt.make(seed)
    ctx = fmt.prepare_write(d)  # untimed per-run setup (zarr_skip: open_cache)
    step = STEP
    if op == "write_next":  # the first step written untimed; the next one measured
        fmt.write(ctx, d, data)
        step = STEP + 1
        fmt.prepare_step(d, step)
    os.sync()  # earlier writeback must not land in this measurement
    rss.start()
    t0 = time.perf_counter()
    fmt.write(ctx, d, data, step)
    if op == "write_fsync":
        fsync_tree(d)
    out["sample"] = time.perf_counter() - t0
    out["peak_rss"] = rss.stop()
    return out


def _read(spec: dict[str, Any], fmt: Any, rss: PeakRSS, out: dict[str, Any]) -> dict[str, Any]:
    d = Path(spec["artifact"])
    kind, temp = spec["op"].rsplit("_", 1)
    fn: Callable[[Path], Any] = {"read": fmt.read, "column": fmt.column, "rows64": fmt.rows64}[kind]
    if temp == "warm":
        _warm_files(d)
    else:
        out["cold_method"] = drop_cache([d], spec["cold"])
    rss.start()
    t0 = time.perf_counter()
    res = fn(d)
    out["sample"] = time.perf_counter() - t0
    out["peak_rss"] = rss.stop()
    del res
    return out


def _run_worker_safe(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        return run_worker(spec)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which records it
        import traceback

        return {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}


def zygote_main(zarr_too: bool) -> int:
    """Import once, then fork one child per JSON spec read from stdin."""
    import threading

    _preimport(zarr_too)
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(line)
        if threading.active_count() != 1:  # forking a threaded process is unsafe
            print(RESULT_MARK + json.dumps({"error": "zygote has threads; use --isolation spawn"}), flush=True)
            print("BENCH_DONE 1", flush=True)
            continue
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                res = _run_worker_safe(spec)
                print(RESULT_MARK + json.dumps(res), flush=True)
            except BaseException:  # noqa: BLE001 - the child must reach os._exit
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)  # only then report: the pipe is never written by two
        print(f"BENCH_DONE {status}", flush=True)
    return 0


def worker_main(spec_json: str) -> int:
    """``--worker SPEC``: run one measurement in this new interpreter and print its result."""
    spec = json.loads(spec_json)
    _preimport(not FORMATS.get(spec.get("format"), ("", True))[1] or spec["op"].startswith("status"))
    print(RESULT_MARK + json.dumps(_run_worker_safe(spec)), flush=True)
    return 0
