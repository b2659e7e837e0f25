"""Direct file I/O for caches on a local or mounted filesystem (the fast path of storage.py).

Same semantics as zarr's ``LocalStore`` (every write is a temp file renamed into place, so a
reader never sees half a file; an exclusive create is a hard link, which fails if the target
exists), without an event-loop round trip and a thread hop per key: metadata operations run
in the caller's thread, chunk batches in a small thread pool.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0


def workers() -> int:
    """Threads of the pool: one per usable core (at most 8).

    More threads than cores made a write 5x slower on a 2-core machine: a thread preempted by
    the OS while it holds the GIL stalls every other one for a scheduler tick.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def pool() -> ThreadPoolExecutor:
    """The shared I/O and codec pool (made anew in a forked child)."""
    global _POOL, _POOL_PID
    if _POOL is None or _POOL_PID != os.getpid():
        _POOL = ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="zarr-skip")
        _POOL_PID = os.getpid()
    return _POOL


def submit(fn: Callable[..., T], *args: object) -> Future[T]:
    """Run ``fn(*args)`` on the pool. Tasks run in submission order, so a task may wait for
    the result of one submitted before it, never for one submitted after it."""
    return pool().submit(fn, *args)


def parallel(fn: Callable[[T], object], items: Sequence[T]) -> list:
    """``[fn(x) for x in items]`` on the pool (in the caller's thread when there is one item)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    return list(pool().map(fn, items))


def read(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _temp(path: Path) -> Path:
    return path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")


def write(path: Path, data: bytes) -> int:
    """Write ``data`` to ``path`` atomically (temp file, then rename)."""
    try:
        tmp = _temp(path)
        f = open(tmp, "wb")  # noqa: SIM115 - closed below, before the rename
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp(path)
        f = open(tmp, "wb")  # noqa: SIM115
    try:
        with f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(data)


def read_range(path: Path, start: int, length: int) -> bytes | None:
    """``length`` bytes of ``path`` from ``start`` (fewer at the end of the file; None if absent)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        return os.pread(fd, length, start)
    finally:
        os.close(fd)


def will_need(path: Path, start: int, length: int) -> None:
    """Ask the kernel to start reading ``length`` bytes of ``path`` from ``start`` into the
    page cache now (``posix_fadvise(WILLNEED)``); returns at once. A missing file is left to
    the read that follows to report."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)
    except OSError:  # pragma: no cover - a filesystem without read-ahead
        pass
    finally:
        os.close(fd)


def write_fresh(path: Path, data: bytes | Sequence[bytes]) -> int:
    """Write a file in a directory only this writer uses and nobody reads before it says so.

    No temp file and rename: a writer's data group is read only after its completion record
    names every chunk with its size and checksum, so a torn write is caught, never trusted.
    ``data`` may come in pieces (the chunks of a shard), written one after the other.
    """
    pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    with open(path, "wb") as f:
        for piece in pieces:
            f.write(piece)
    return sum(len(p) for p in pieces)


def make_dirs(paths: Sequence[Path]) -> None:
    """Create the directories of ``paths`` (parents first), once each."""
    for d in sorted({p.parent for p in paths}, key=lambda d: len(d.parts)):
        d.mkdir(parents=True, exist_ok=True)


def create(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data`` unless it exists (hard link of a complete temp file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def list_dir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def list_files(path: Path, root: Path) -> list[str]:
    """Every file below ``path``, as keys relative to ``root``."""
    out = []
    for dirpath, _, files in os.walk(path):
        rel = os.path.relpath(dirpath, root)
        out += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in files]
    return sorted(out)


def delete_tree(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=False)
    else:
        path.unlink(missing_ok=True)
