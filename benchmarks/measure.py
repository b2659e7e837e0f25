"""The measuring instruments: page-cache eviction, fsync, disk usage and peak RSS.

Used inside the measurement processes (:mod:`benchmarks.worker`), and by
:func:`benchmarks.machine.physical_limits` for its cold ``dd`` read.

Notes
-----
Linux only: the page cache is dropped through ``/proc/sys/vm/drop_caches`` (as root) and
``posix_fadvise``, and peak RSS is the kernel's high-water mark ``VmHWM`` after a reset through
``/proc/self/clear_refs``.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def part_sizes(info: Any) -> tuple[int, int]:
    """``(stored, logical)`` bytes of a written mini-batch (``Cache.write``'s ``PartInfo``).

    The one place the benchmarks read zarr_skip's sizes: its names follow numpy's (``nbytes``
    the logical size, ``nbytes_stored`` the stored one); before that rename ``nbytes`` was the
    stored size and ``raw_nbytes`` the logical one."""
    if hasattr(info, "nbytes_stored"):
        return int(info.nbytes_stored), int(info.nbytes)
    return int(info.nbytes), int(info.raw_nbytes)


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


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """min, median and max of ``values`` (how every benchmark reports repeated samples)."""
    return min(values), statistics.median(values), max(values)


def spread_text(values: Sequence[float], fmt: str = "{:.1f}", scale: float = 1.0) -> str:
    """:func:`spread` of ``values`` (each times ``scale``) as the reports show it:
    ``min / **median** / max``, each in ``fmt``."""
    lo, mid, hi = (fmt.format(v * scale) for v in spread(values))
    return f"{lo} / **{mid}** / {hi}"
