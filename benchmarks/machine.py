"""What a benchmark report records about the machine it ran on.

:func:`machine_info`: CPU, RAM, the disk and filesystem under the work dir, kernel, library
versions and the git commit; :func:`physical_limits`: what ``dd`` and ``memcpy`` reach on it,
the ceiling any format's throughput sits under.  :mod:`benchmarks.bench_s3` uses
:func:`machine_info` too.  :data:`REPO_ROOT` is the checkout: where the git commit is read
from and where the measurement processes start.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .measure import drop_cache

REPO_ROOT = Path(__file__).resolve().parents[1]


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces a run of ``python -m benchmarks.<script>`` with ``argv``
    (None: this process's own arguments), as a report records it."""
    return f"python -m benchmarks.{script} " + " ".join(sys.argv[1:] if argv is None else argv)


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
