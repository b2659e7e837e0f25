"""zarr_skip vs verl's on-disk rollout dumps, measured side by side in one run.

Usage::

    python -m benchmarks.bench --preset medium --reps 5 --out benchmarks/results
    python -m benchmarks.bench --preset small,medium --reps 2 --baseline-only

Baselines (what verl does today):

* ``torch.save`` of the jagged TransferQueue payload (``tq_batch.pt``),
* ``pickle.dump`` of the padded ``DataProto`` (``gen_batch.dp``; pickling goes through
  ``DataProto.__getstate__``, which ``torch.save``s the tensor batch into a buffer first).

Contenders: ``zarr_skip`` writing / reading the same two shapes through its public API.

Every measurement runs in a fresh Python subprocess (one per format and operation; the
repetitions run inside it), so peak RSS is that of the operation alone: the kernel's
high-water mark is reset right before the timed call (``/proc/self/clear_refs``) and read right
after it.  Read-side figures drop the page cache for the files first (``cold``) or read them
once untimed before measuring (``warm``).  See benchmarks/README.md for what each metric means.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import pickle
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT_MARK = "BENCH_RESULT "
STEP = 1

WRITE_OPS = ("write", "write_fsync")
READ_OPS = ("read_cold", "read_warm", "column_cold", "column_warm", "rows64_cold", "rows64_warm")
OPS = WRITE_OPS + READ_OPS
OP_LABEL = {
    "write": "write",
    "write_fsync": "write + fsync",
    "read_cold": "full read, cold",
    "read_warm": "full read, warm",
    "column_cold": "one column (responses), cold",
    "column_warm": "one column (responses), warm",
    "rows64_cold": "64 rows of responses, cold",
    "rows64_warm": "64 rows of responses, warm",
}
# format name -> (shape, is baseline)
FORMATS = {
    "torch_save_jagged": ("jagged", True),
    "zarr_skip_jagged": ("jagged", False),
    "pickle_padded": ("padded", True),
    "zarr_skip_padded": ("padded", False),
}
BASELINE_OF = {"zarr_skip_jagged": "torch_save_jagged", "zarr_skip_padded": "pickle_padded"}
FORMAT_LABEL = {
    "torch_save_jagged": "torch.save jagged (tq_batch.pt)",
    "zarr_skip_jagged": "zarr_skip jagged",
    "pickle_padded": "pickle padded (gen_batch.dp)",
    "zarr_skip_padded": "zarr_skip padded",
}

# (shape, metric, max ratio zarr_skip / baseline)
TARGETS: dict[str, list[tuple[str, str, float]]] = {
    "small": [("jagged", "write", 2.0), ("jagged", "read_cold", 2.0)],
    "medium": [
        ("jagged", "write", 0.8),
        ("jagged", "read_cold", 0.8),
        ("jagged", "bytes", 0.20),
        ("jagged", "column_cold", 0.20),
        ("jagged", "rows64_cold", 0.10),
        ("padded", "write", 0.4),
        ("padded", "read_cold", 0.3),
        ("padded", "bytes", 0.10),
    ],
    "large": [
        ("jagged", "write", 0.5),
        ("jagged", "read_cold", 0.5),
        ("jagged", "bytes", 0.20),
        ("jagged", "column_cold", 0.15),
        ("jagged", "rows64_cold", 0.03),
    ],
}
STATUS_TARGET_S = 1.0


# torch logs a one-off "is_fx_tracing" warning when tensordict imports torch._dynamo
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- file helpers


def iter_files(root: Path):
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            yield Path(dirpath) / f


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every directory (so new entries are durable)."""
    dirs = []
    for dirpath, _d, files in os.walk(root):
        dirs.append(dirpath)
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for d in dirs:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def disk_usage(root: Path) -> dict[str, int]:
    files = dirs = apparent = allocated = 0
    for dirpath, dnames, fnames in os.walk(root):
        dirs += len(dnames)
        for f in fnames:
            st = os.lstat(os.path.join(dirpath, f))
            files += 1
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return {"files": files, "dirs": dirs, "bytes_apparent": apparent, "bytes_allocated": allocated}


def drop_cache(paths: list[Path], method: str) -> str:
    """Evict ``paths`` (files or directory trees) from the page cache; returns what was done.

    ``drop_caches``: ``sync; echo 3 > /proc/sys/vm/drop_caches`` (root only; evicts the whole
    page cache incl. library code), then also ``fadvise`` below.  ``fadvise``:
    ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file (after ``sync``, since dirty pages
    cannot be dropped).
    """
    os.sync()
    done = "fadvise"
    if method in ("auto", "drop_caches") and os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as fh:
                fh.write("3\n")
            done = "drop_caches+fadvise"
        except OSError:
            if method == "drop_caches":
                raise
    files: list[Path] = []
    for p in paths:
        files.extend(iter_files(p) if p.is_dir() else [p])
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return done


# --------------------------------------------------------------------------- peak RSS


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakRSS:
    """Peak resident memory of a code region, in bytes above the RSS at its start.

    Uses the kernel high-water mark (VmHWM) after resetting it with ``/proc/self/clear_refs``
    (Linux >= 4.0).  Fallback: ``ru_maxrss`` (only meaningful when the region sets a new
    process-wide peak).
    """

    def __init__(self) -> None:
        self.method = "clear_refs"
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.method = "ru_maxrss"

    def start(self) -> None:
        gc.collect()
        if self.method == "clear_refs":
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.rss0 = (_proc_status_kib("VmRSS") or 0) * 1024
        else:
            self.rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def stop(self) -> int:
        if self.method == "clear_refs":
            peak = (_proc_status_kib("VmHWM") or 0) * 1024
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, peak - self.rss0)


# --------------------------------------------------------------------------- formats


def fingerprint(preset) -> dict[str, Any]:
    return {
        "experiment_name": "bench",
        "project_name": "zarr_skip_benchmarks",
        "gen_batch_size": preset.rows // preset.n,
        "n": preset.n,
        "max_prompt_length": preset.max_prompt,
        "max_response_length": preset.max_response,
    }


def nested_head(nt, k: int):
    """First ``k`` rows of a jagged NestedTensor (``nt[:k]`` is not supported on dim 0)."""
    import torch

    off = nt.offsets()
    k = min(k, len(off) - 1)
    return torch.nested.nested_tensor_from_jagged(nt.values()[: int(off[k])], off[: k + 1])


class Format:
    """One storage format: how to build its input and run each operation."""

    shape = ""

    def __init__(self, preset) -> None:
        self.preset = preset

    def make(self, seed: int):
        from zarr_skip.synthetic import jagged_payload, padded_batch

        if self.shape == "jagged":
            return jagged_payload(self.preset, seed, step=STEP)
        return padded_batch(self.preset, seed, step=STEP)

    def prepare_write(self, d: Path) -> Any:  # untimed per-run setup
        return None

    def write(self, ctx: Any, d: Path, data: Any) -> None:
        raise NotImplementedError

    def read(self, d: Path) -> Any:
        raise NotImplementedError

    def column(self, d: Path) -> Any:
        raise NotImplementedError

    def rows64(self, d: Path) -> Any:
        raise NotImplementedError


class TorchSaveJagged(Format):
    shape = "jagged"

    def write(self, ctx, d, data):
        import torch

        torch.save(data, d / "tq_batch.pt")

    def read(self, d):
        import torch

        return torch.load(d / "tq_batch.pt", weights_only=False)

    def column(self, d):
        return self.read(d)["tensordict"]["responses"]

    def rows64(self, d):
        return nested_head(self.read(d)["tensordict"]["responses"], 64)


class PicklePadded(Format):
    shape = "padded"

    def write(self, ctx, d, data):
        with open(d / "gen_batch.dp", "wb") as f:  # verl DataProto.save_to_disk
            pickle.dump(data, f)

    def read(self, d):
        with open(d / "gen_batch.dp", "rb") as f:  # verl DataProto.load_from_disk
            return pickle.load(f)

    def column(self, d):
        return self.read(d).batch["responses"]

    def rows64(self, d):
        return self.read(d).batch["responses"][:64]


class ZarrSkip(Format):
    """zarr_skip through its public API (/work/spec/API.md). Reads include ``open_cache``."""

    def prepare_write(self, d):
        import zarr_skip as zs

        return zs.open_cache(str(d), fingerprint=fingerprint(self.preset))

    def _batch(self, data):
        if self.shape == "jagged":
            from zarr_skip.synthetic import as_mapping

            return as_mapping(data)  # timed: converting the TQ payload is part of the job
        return data

    def write(self, ctx, d, data):
        ctx.write(STEP, self._batch(data))

    def _view(self, d):
        import zarr_skip as zs

        return zs.open_cache(str(d), fingerprint=fingerprint(self.preset)).load(STEP)

    def read(self, d):
        return self._view(d).to_dict()

    def column(self, d):
        return self._view(d)["responses"][:]

    def rows64(self, d):
        return self._view(d)["responses"][:64]


class ZarrSkipJagged(ZarrSkip):
    shape = "jagged"


class ZarrSkipPadded(ZarrSkip):
    shape = "padded"


FORMAT_CLASSES: dict[str, type[Format]] = {
    "torch_save_jagged": TorchSaveJagged,
    "zarr_skip_jagged": ZarrSkipJagged,
    "pickle_padded": PicklePadded,
    "zarr_skip_padded": ZarrSkipPadded,
}


# --------------------------------------------------------------------------- verification


def _same(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype:
            return False
        if a.is_nested:
            if not b.is_nested:
                return False
            ao, bo = a.offsets(), b.offsets()  # type: ignore[attr-defined]
            return bool(torch.equal(a.values(), b.values()) and torch.equal(ao.long(), bo.long()))
        return bool(not b.is_nested and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, np.ndarray):
        a = a.tolist()
    if isinstance(b, np.ndarray):
        b = b.tolist()
    try:
        return list(a) == list(b)
    except TypeError:
        return a == b


def verify_roundtrip(fmt: Format, d: Path, seed: int) -> dict[str, Any]:
    """Untimed: does ``load(step).to_dict()`` give back what was written?"""
    from zarr_skip.synthetic import as_mapping

    data = fmt.make(seed)
    if fmt.shape == "jagged":
        expected = as_mapping(data)
    else:
        expected = {**data.batch, **data.non_tensor_batch}
    got = fmt.read(d)
    missing = sorted(set(expected) - set(got))
    mismatched = sorted(k for k in expected if k in got and not _same(expected[k], got[k]))
    extra = sorted(set(got) - set(expected))
    return {"ok": not missing and not mismatched, "missing": missing, "mismatched": mismatched, "extra": extra}


# --------------------------------------------------------------------------- worker

WARMUP_PRESET = {"rows": 8, "max_prompt": 32, "max_response": 64, "n": 8}


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
    """Run the format's operations once on a tiny batch in a scratch directory, so one-time
    lazy initialisation (thread pools, event loops, lazy imports, codec setup) is not measured:
    the measured operation then costs what it costs in a long-running trainer."""
    from zarr_skip.synthetic import Preset

    f = FORMAT_CLASSES[fmt_name](Preset(**WARMUP_PRESET))
    d = scratch / f"warmup-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    try:
        data = f.make(1)
        f.write(f.prepare_write(d), d, data)
        for fn in (f.read, f.column, f.rows64):
            fn(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    gc.collect()


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One repetition of one operation (runs in a fresh process)."""
    from zarr_skip.synthetic import Preset

    preset = Preset(**spec["preset"])
    op, seed = spec["op"], spec["seed"]
    out: dict[str, Any] = {"op": op, "format": spec.get("format"), "pid": os.getpid()}

    if op == "status_setup":
        import zarr_skip as zs
        from zarr_skip.synthetic import padded_batch

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

    if op in ("status_cold", "status_warm"):
        import zarr_skip as zs

        base = Path(spec["dir"])
        zs.open_cache(str(base), fingerprint=fingerprint(preset)).status()  # process warm-up
        if op == "status_cold":
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

    fmt_name = spec["format"]
    fmt = FORMAT_CLASSES[fmt_name](preset)
    if spec.get("warmup", True):
        _warmup_process(fmt_name, Path(spec["scratch"]))

    if op == "verify":
        return dict(out, verify=verify_roundtrip(fmt, Path(spec["artifact"]), seed))

    rss = PeakRSS()
    out["rss_method"] = rss.method
    if op in WRITE_OPS:
        d = Path(spec["dir"])
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        data = fmt.make(seed)
        ctx = fmt.prepare_write(d)  # untimed per-run setup (zarr_skip: open_cache)
        os.sync()  # earlier writeback must not land in this measurement
        rss.start()
        t0 = time.perf_counter()
        fmt.write(ctx, d, data)
        if op == "write_fsync":
            fsync_tree(d)
        out["sample"] = time.perf_counter() - t0
        out["peak_rss"] = rss.stop()
        return out

    d = Path(spec["artifact"])
    kind, temp = op.rsplit("_", 1)
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
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self._restart_zygote()  # kills the zygote's process group (its child too)
                    return {"error": f"timeout after {timeout:.0f} s"}
                line = z.stdout.readline()
                if not line:
                    self.zygote = None
                    return {"error": f"zygote exited ({z.poll()}); see {self.log.name}"}
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
            self.zygote = None

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
        self.zygote = None
        self.log.close()


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


# --------------------------------------------------------------------------- physical limits


def physical_limits(workdir: Path, mib: int, cold: str) -> dict[str, Any]:
    import numpy as np

    res: dict[str, Any] = {}
    f = workdir / "dd.bin"
    count = max(1, mib // 4)
    nbytes = count * 4 * 2**20
    try:
        t0 = time.perf_counter()
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={f}", "bs=4M", f"count={count}", "conv=fdatasync", "status=none"],
            check=True,
            capture_output=True,
        )
        res["dd_write_MBps"] = nbytes / (time.perf_counter() - t0) / 1e6
        res["dd_write_cmd"] = f"dd if=/dev/zero bs=4M count={count} conv=fdatasync"
        for flags in (["iflag=direct"], []):
            drop_cache([f], cold)
            t0 = time.perf_counter()
            p = subprocess.run(
                ["dd", f"if={f}", "of=/dev/null", "bs=4M", "status=none", *flags], capture_output=True, check=False
            )
            if p.returncode == 0:
                res["dd_read_MBps"] = nbytes / (time.perf_counter() - t0) / 1e6
                cmd = " ".join(["dd of=/dev/null bs=4M", *flags])
                res["dd_read_cmd"] = cmd + " (cache dropped)"
                break
    except (OSError, subprocess.CalledProcessError) as e:
        res["dd_error"] = str(e)
    finally:
        f.unlink(missing_ok=True)
    n = 512 * 2**20
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    res["memcpy_GBps"] = n / best / 1e9
    res["memcpy_note"] = "np.copyto of 512 MiB, best of 5, bytes copied / s"
    return res


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- machine


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def machine_info(workdir: Path) -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    cpuinfo = _read("/proc/cpuinfo") or ""
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            info["cpu_model"] = line.split(":", 1)[1].strip()
            break
    meminfo = _read("/proc/meminfo") or ""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            info["ram_GiB"] = round(int(line.split()[1]) / 2**20, 1)
    # filesystem holding the work dir: longest mount point that prefixes it
    real = os.path.realpath(workdir)
    best = ("", "?", "?")
    for line in (_read("/proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mp = parts[1]
            if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
                best = (mp, parts[0], parts[2])
    info["disk"] = {"workdir": real, "mount": best[0], "device": best[1], "fstype": best[2]}
    dev = os.path.basename(best[1])
    for cand in (dev, dev.rstrip("0123456789"), dev.split("p")[0] if "nvme" in dev else dev):
        if cand and os.path.isdir(f"/sys/block/{cand}"):
            info["disk"]["rotational"] = _read(f"/sys/block/{cand}/queue/rotational") == "1"
            info["disk"]["model"] = _read(f"/sys/block/{cand}/device/model")
            size = _read(f"/sys/block/{cand}/size")
            if size:
                info["disk"]["size_GB"] = round(int(size) * 512 / 1e9, 1)
            break
    versions: dict[str, str | None] = {}
    for mod in ("torch", "numpy", "zarr", "numcodecs", "tensordict", "zarr_skip"):
        try:
            m = __import__(mod)
            versions[mod] = getattr(m, "__version__", "unknown")
        except Exception as e:  # noqa: BLE001 - zarr_skip may not import yet
            versions[mod] = f"unavailable ({type(e).__name__})"
    info["versions"] = versions
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    try:
        p = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        info["git_commit"] = p.stdout.strip() if p.returncode == 0 else None
        d = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "zarr_skip", "benchmarks"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        info["git_dirty"] = bool(d.stdout.strip()) if d.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


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
    from zarr_skip.synthetic import PRESETS, jagged_payload, padded_batch

    preset = PRESETS[name]
    pdict = {"rows": preset.rows, "max_prompt": preset.max_prompt, "max_response": preset.max_response, "n": preset.n}
    formats = [f for f, (_s, base) in FORMATS.items() if base or not args.baseline_only]
    ops = [o for o in OPS if o in args.ops]
    if "write" not in ops:
        ops.insert(0, "write")  # reads need its artifact

    # in-memory sizes (for context / throughput)
    import torch

    dp = padded_batch(preset, args.seed, step=STEP)
    pl = jagged_payload(preset, args.seed, step=STEP)
    td = pl["tensordict"]
    mem = {
        "padded_tensor_bytes": sum(t.numel() * t.element_size() for t in dp.batch.values()),
        "jagged_tensor_bytes": sum(
            (t.values().numel() * t.values().element_size() if t.is_nested else t.numel() * t.element_size())
            for t in (td.get(k) for k in td.keys())  # noqa: SIM118 - a TensorDict iterates rows
            if isinstance(t, torch.Tensor)
        ),
        "response_tokens": int(dp.batch["response_mask"].sum()),
        "prompt_tokens": int(dp.batch["attention_mask"][:, : preset.max_prompt].sum()),
    }
    del dp, pl, td

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
                    if op in WRITE_OPS:
                        if op == "write" and "sample" in r:
                            old = artifact[fmt]
                            if old is not None:
                                shutil.rmtree(old, ignore_errors=True)
                            artifact[fmt] = d  # the last successful write is what reads read
                            disk[fmt] = disk_usage(d)
                        else:
                            shutil.rmtree(d, ignore_errors=True)
                    msg = (
                        f"{r['sample'] * 1e3:9.1f} ms"
                        if "sample" in r
                        else "ERROR " + str(r.get("error")).strip().splitlines()[-1][:160]
                    )
                    log(f"[{name}] rep {rep + 1}/{args.reps} {op:12s} {fmt:18s} {msg}")

    for fmt in formats:
        res: dict[str, Any] = {}
        for op in ops:
            res[op] = summarize(samples[fmt][op])
            if op == "write" and fmt in disk:
                res[op]["disk"] = disk[fmt]
        if args.verify and not FORMATS[fmt][1] and artifact[fmt] is not None:
            v = runner.run(dict(common, format=fmt, op="verify", artifact=str(artifact[fmt])))
            res["write"]["verify"] = v.get("verify", {"ok": False, "error": v.get("error")})
            log(f"[{name}] {fmt:18s} round trip {res['write']['verify']}")
        out["formats"][fmt] = res
    shutil.rmtree(workdir / name, ignore_errors=True)

    if not args.baseline_only and args.status_steps > 0:
        tdict = {"rows": 8, "max_prompt": 32, "max_response": 64, "n": 8}
        sdir = workdir / name / "status"
        log(f"[{name}] status: writing {args.status_steps} tiny steps ...")
        setup = runner.run(
            {"op": "status_setup", "preset": tdict, "seed": args.seed, "dir": str(sdir), "steps": args.status_steps},
            timeout=args.timeout * 4,
        )
        st: dict[str, Any] = {"setup": setup, "steps": args.status_steps, "preset": tdict}
        if "error" not in setup:
            for op in ("status_cold", "status_warm"):
                st[op] = summarize(
                    [
                        runner.run({"op": op, "preset": tdict, "seed": args.seed, "dir": str(sdir), "cold": args.cold})
                        for _ in range(args.reps)
                    ]
                )
                r = st[op]
                log(
                    f"[{name}] {op}: "
                    + (
                        r["error"].strip().splitlines()[-1][:200]
                        if "error" in r
                        else f"median {r['median_s'] * 1e3:.1f} ms"
                    )
                )
        else:
            log(f"[{name}] status setup ERROR {setup['error'].strip().splitlines()[-1][:200]}")
        out["status"] = st
        shutil.rmtree(sdir, ignore_errors=True)
    shutil.rmtree(workdir / name, ignore_errors=True)

    out["loadavg_end"] = os.getloadavg()
    out["ratios"] = ratios(out)
    out["targets"] = check_targets(name, out, args.baseline_only)
    from .floor import jagged_floor

    floor = jagged_floor(preset, args.seed, STEP)  # untimed, after every measurement
    base = _metric(out["formats"].get("torch_save_jagged", {}), "bytes")
    floor["ratio"] = floor["bytes"] / base if base else None
    out["floor"] = floor
    return out


def _metric(res: dict[str, Any], metric: str) -> float | None:
    if metric in ("bytes", "files"):
        disk = res.get("write", {}).get("disk")
        if not disk:
            return None
        return float(disk["bytes_allocated"] if metric == "bytes" else disk["files"])
    if metric.startswith("rss:"):
        return res.get(metric[4:], {}).get("peak_rss_bytes")
    return res.get(metric, {}).get("median_s")


METRICS = list(OPS) + ["bytes", "files"]


def ratios(out: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    r: dict[str, dict[str, float | None]] = {}
    for zs_fmt, base_fmt in BASELINE_OF.items():
        if zs_fmt not in out["formats"] or base_fmt not in out["formats"]:
            continue
        shape = FORMATS[zs_fmt][0]
        r[shape] = {}
        for m in METRICS + [f"rss:{op}" for op in OPS]:
            a = _metric(out["formats"][zs_fmt], m)
            b = _metric(out["formats"][base_fmt], m)
            r[shape][m] = (a / b) if (a is not None and b) else None
    return r


def check_targets(name: str, out: dict[str, Any], baseline_only: bool) -> list[dict[str, Any]]:
    res = []
    for shape, metric, limit in TARGETS.get(name, []):
        val = out["ratios"].get(shape, {}).get(metric)
        if baseline_only:
            verdict = "SKIP"
        elif val is None:
            verdict = "FAIL (no value)"
        else:
            verdict = "PASS" if val <= limit else "FAIL"
        res.append({"target": f"{name} {shape} {metric} ratio <= {limit}", "value": val, "verdict": verdict})
    status = out.get("status")
    st = (status or {}).get("status_cold", {}).get("median_s")
    label = f"status() of {(status or {}).get('steps', 1000)} steps, cold, < {STATUS_TARGET_S} s"
    if baseline_only or status is None:
        res.append({"target": label, "value": None, "verdict": "SKIP"})
    else:
        res.append(
            {
                "target": label,
                "value": st,
                "verdict": "FAIL (no value)" if st is None else ("PASS" if st < STATUS_TARGET_S else "FAIL"),
            }
        )
    return res


# --------------------------------------------------------------------------- reporting


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.1f} ms" if x < 10 else f"{x:.2f} s"


def _fmt_b(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= k:
            return f"{x / k:.1f} {unit}"
    return f"{x:.0f} B"


def _fmt_r(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.4f}" if abs(x) < 0.1 else f"{x:.3f}"


def _cell(res: dict[str, Any] | None, metric: str) -> str:
    if res is None:
        return "-"
    if metric in ("bytes", "files"):
        if "error" in res.get("write", {}):
            return "error"
        v = _metric(res, metric)
        return _fmt_b(v) if metric == "bytes" else ("n/a" if v is None else f"{v:.0f}")
    if metric.startswith("rss:"):
        r = res.get(metric[4:], {})
        return "error" if "error" in r else _fmt_b(r.get("peak_rss_bytes"))
    r = res.get(metric, {})
    if "error" in r:
        return "error"
    return _fmt_s(r.get("median_s")) + (" *" if _noisy(r) else "")


def _noisy(r: dict[str, Any]) -> bool:
    """Spread (max - min) over the repetitions larger than half the median."""
    med = r.get("median_s")
    return bool(med and len(r.get("samples", [])) > 1 and (r["max_s"] - r["min_s"]) > 0.5 * med)


def markdown(run: dict[str, Any]) -> str:
    m = run["machine"]
    lines = [f"# zarr_skip benchmark: preset `{run['result']['preset']}`", ""]
    git = (m.get("git_commit") or "no commit") + (" + local changes" if m.get("git_dirty") else "")
    lines.append(f"Run {run['started']} (git {git}), command: `{run['command']}`")
    lines += ["", "## Machine", ""]
    d = m.get("disk", {})
    lines.append(
        f"- CPU: {m.get('cpu_model')} ({m.get('cpu_count')} cores, affinity "
        f"{m.get('cpu_affinity')}, torch threads {m.get('torch_threads')})"
    )
    lines.append(f"- RAM: {m.get('ram_GiB')} GiB")
    lines.append(
        f"- Disk: {d.get('device')} ({d.get('fstype')}, model {d.get('model')}, "
        f"rotational {d.get('rotational')}, size {d.get('size_GB')} GB), "
        f"work dir {d.get('workdir')}"
    )
    lines.append(
        f"- Kernel {m.get('kernel')}, Python {m.get('python')}, "
        + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    )
    lim = run.get("limits") or {}
    if lim:
        lines.append(
            f"- Physical limits: dd write {lim.get('dd_write_MBps', float('nan')):.0f} MB/s "
            f"({lim.get('dd_write_cmd')}), dd read {lim.get('dd_read_MBps', float('nan')):.0f} "
            f"MB/s ({lim.get('dd_read_cmd')}), memcpy {lim.get('memcpy_GBps', float('nan')):.1f} "
            f"GB/s ({lim.get('memcpy_note')})"
        )
    res = run["result"]
    p, mem = res["params"], res["in_memory"]
    lines += ["", "## Data", ""]
    lines.append(
        f"- {p['rows']} rows (n={p['n']}), max_prompt {p['max_prompt']}, "
        f"max_response {p['max_response']}, seed {res['seed']}, {res['reps']} reps "
        f"(medians)"
    )
    lines.append(
        f"- {mem['prompt_tokens']} prompt + {mem['response_tokens']} response tokens; "
        f"tensors in memory: padded {_fmt_b(mem['padded_tensor_bytes'])}, jagged "
        f"{_fmt_b(mem['jagged_tensor_bytes'])}"
    )
    lines.append(
        f"- cold = page cache dropped before each rep "
        f"({_cold_method(res)}); warm = files read once untimed first; zarr_skip reads "
        f"include `open_cache()`; peak RSS = high-water mark above the RSS at the start "
        f"of the operation (median over reps); each rep runs in a fresh process "
        f"({res.get('isolation')}) after an untimed tiny warm-up of the same format"
    )

    F = res["formats"]
    lines += ["", "## Results", ""]
    hdr = ["metric"]
    cols: list[tuple[str, str | None]] = []
    for base, zs_ in (("torch_save_jagged", "zarr_skip_jagged"), ("pickle_padded", "zarr_skip_padded")):
        cols.append((base, None))
        hdr.append(FORMAT_LABEL[base])
        if zs_ in F:
            cols.append((zs_, None))
            cols.append((zs_, "ratio"))
            hdr += [FORMAT_LABEL[zs_], "ratio"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "---|" * len(hdr))
    measured = [o for o in OPS if any(o in rr for rr in F.values())]
    rows = [(OP_LABEL[o], o) for o in measured] + [("bytes on disk (allocated)", "bytes"), ("file count", "files")]
    rows += [(f"peak RSS: {OP_LABEL[o]}", f"rss:{o}") for o in measured]
    for label, metric in rows:
        cells = [label]
        for fmt, kind in cols:
            if kind == "ratio":
                cells.append(_fmt_r(res["ratios"].get(FORMATS[fmt][0], {}).get(metric)))
            else:
                cells.append(_cell(F.get(fmt), metric))
        lines.append("| " + " | ".join(cells) + " |")

    la0, la1 = res.get("loadavg_start"), res.get("loadavg_end")
    note = (
        "`*`: the spread over repetitions (max - min) exceeds half the median: noisy. "
        f"Load average (1/5/15 min) at start {_fmt_la(la0)}, at end {_fmt_la(la1)} on "
        f"{m.get('cpu_count')} cores."
    )
    lines += ["", note]
    errors = [(f, op, r["error"]) for f, rr in F.items() for op, r in rr.items() if "error" in r]
    ver = [(f, rr["write"]["verify"]) for f, rr in F.items() if "verify" in rr.get("write", {})]
    if ver:
        lines += ["", "Round trip (`load(step).to_dict()` equals what was written):", ""]
        lines += [f"- {FORMAT_LABEL[f]}: {v}" for f, v in ver]
    st = res.get("status")
    if st:
        lines += ["", "## status()", ""]
        if "error" in st.get("setup", {}):
            lines.append(f"- setup failed: {st['setup']['error'].splitlines()[-1]}")
        else:
            lines.append(
                f"- {st['steps']} tiny steps ({st['preset']}), write "
                f"{_fmt_s(st['setup'].get('write_per_step_s'))} per step, "
                f"{st['setup']['disk']['files']} files, "
                f"{_fmt_b(st['setup']['disk']['bytes_allocated'])}"
            )
            for op in ("status_cold", "status_warm"):
                r = st.get(op, {})
                if "error" in r:
                    lines.append(f"- {op}: error {r['error'].splitlines()[-1]}")
                else:
                    lines.append(
                        f"- {op} (open_cache + status()): {_fmt_s(r.get('median_s'))}, "
                        f"{r.get('n_steps')} steps listed, {r.get('n_complete')} complete"
                        f", peak RSS +{_fmt_b(r.get('peak_rss_bytes'))}"
                    )
    fl = res.get("floor")
    if fl:
        top = sorted(fl["parts"].items(), key=lambda kv: -kv[1])[:3]
        lines += [
            "",
            "## Information floor (jagged)",
            "",
            f"No lossless format can store this step in fewer than {_fmt_b(fl['bytes'])}"
            f" (ratio {_fmt_r(fl.get('ratio'))} to torch.save): its values are drawn "
            "independently at random (see `benchmarks/floor.py`). Largest parts: "
            + ", ".join(f"{k} {_fmt_b(v)}" for k, v in top)
            + ".",
        ]
    if res["targets"]:
        lines += ["", "## Targets", "", "| target | value | verdict |", "|---|---|---|"]
        for t in res["targets"]:
            v = t["value"]
            vs = "n/a" if v is None else (_fmt_r(v) if "ratio" in t["target"] else _fmt_s(v))
            lines.append(f"| {t['target']} | {vs} | {t['verdict']} |")
    if errors:
        lines += ["", "## Errors", ""]
        for f, op, e in errors:
            lines.append(f"- {f} {op}: `{e.strip().splitlines()[-1][:300]}`")
    return "\n".join(lines) + "\n"


def _fmt_la(la: Any) -> str:
    return "n/a" if not la else "/".join(f"{x:.1f}" for x in la)


def _cold_method(res: dict[str, Any]) -> str:
    for rr in res["formats"].values():
        for r in rr.values():
            if r.get("cold_method"):
                return r["cold_method"]
    return "n/a"


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--preset", default="medium", help="small, medium, large, or a comma-separated list (default medium)"
    )
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median)")
    ap.add_argument(
        "--out", default=str(REPO_ROOT / "benchmarks" / "results"), help="directory for <preset>.md and <preset>.json"
    )
    ap.add_argument(
        "--workdir", default=None, help="scratch directory (default: a temp dir inside --out, i.e. same disk)"
    )
    ap.add_argument("--baseline-only", action="store_true", help="only torch.save / pickle (no zarr_skip import)")
    ap.add_argument(
        "--cold",
        choices=("auto", "drop_caches", "fadvise"),
        default="auto",
        help="how to drop the page cache: auto = drop_caches when root, else fadvise",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--status-steps", type=int, default=1000, help="steps written for the status() benchmark (0 = skip)"
    )
    ap.add_argument("--dd-mib", type=int, default=1024, help="size of the dd test (0 = skip)")
    ap.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip the untimed zarr_skip round-trip check"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-worker timeout (s)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument(
        "--isolation",
        choices=("fork", "spawn"),
        default="fork",
        help="fresh process per measurement: fork from a pre-imported zygote "
        "(default) or spawn a new interpreter (slower, ~3 s of imports each)",
    )
    ap.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="do not run the untimed tiny warm-up operation in each process",
    )
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of: " + ", ".join(OPS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--zygote-zarr", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        _preimport(not FORMATS.get(spec.get("format"), ("", True))[1] or spec["op"].startswith("status"))
        print(RESULT_MARK + json.dumps(_run_worker_safe(spec)), flush=True)
        return 0
    if args.zygote:
        return zygote_main(args.zygote_zarr)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        ap.error(f"unknown ops {bad}; choose from {list(OPS)}")

    from zarr_skip.synthetic import PRESETS

    names = [p.strip() for p in args.preset.split(",") if p.strip()]
    for n in names:
        if n not in PRESETS:
            ap.error(f"unknown preset {n!r}; choose from {sorted(PRESETS)}")
    if not args.baseline_only:
        try:
            import zarr_skip as zs

            zs.open_cache  # noqa: B018
        except Exception as e:  # noqa: BLE001 - any import failure means: not usable yet
            ap.error(f"zarr_skip does not import ({type(e).__name__}: {e}); use --baseline-only")

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=workdir))
    else:
        workdir = Path(tempfile.mkdtemp(prefix=".bench-tmp-", dir=out_dir))
    started = datetime.now(UTC).isoformat(timespec="seconds")
    command = "python -m benchmarks.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    machine = machine_info(workdir)
    if machine["disk"].get("fstype") in ("tmpfs", "ramfs"):
        log(f"WARNING: work dir {workdir} is on {machine['disk']['fstype']}: this measures RAM")
    exit_code = 0
    runner = Runner(args.isolation, not args.baseline_only, workdir / "workers.log", args.timeout)
    try:
        limits = None
        if args.dd_mib > 0:
            log(f"physical limits: dd {args.dd_mib} MiB + memcpy ...")
            limits = physical_limits(workdir, args.dd_mib, args.cold)
            log("physical limits: " + ", ".join(f"{k} {v:.1f}" for k, v in limits.items() if isinstance(v, float)))
        for name in names:
            result = bench_preset(name, args, workdir, runner)
            run = {"started": started, "command": command, "machine": machine, "limits": limits, "result": result}
            md = markdown(run)
            (out_dir / f"{name}.json").write_text(json.dumps(run, indent=2, default=str) + "\n")
            (out_dir / f"{name}.md").write_text(md)
            print(md)
            for t in result["targets"]:
                v = t["value"]
                vs = "n/a" if v is None else _fmt_r(v)
                print(f"{t['verdict']:16s} {t['target']} (value {vs})")
                if t["verdict"].startswith("FAIL"):
                    exit_code = 1
            log(f"wrote {out_dir / (name + '.md')} and {out_dir / (name + '.json')}")
    finally:
        runner.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept scratch directory {workdir}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
