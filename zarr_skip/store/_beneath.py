"""Opening a file below a directory in one system call, refusing a way out (Linux ``openat2``);
and giving a complete file a new name only if that name is free, in one call (``renameat2``).

``openat2(root, key, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`` resolves ``key`` below the open
directory ``root`` and fails (``EXDEV``) where a ``..`` or a symbolic link would leave it: the
containment check and the open in one call, where opening and then asking the kernel where the
file is (``readlink`` of ``/proc/self/fd``) takes two. It is the fast path of
:class:`zarr_skip.store._localfs.Tree`: whenever it does not open the file (another kernel, an
absolute link that stays inside), the caller takes the portable path, which
decides as before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(os.uname().machine) if sys.platform == "linux" else None
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _syscall() -> object | None:
    if _SYS_OPENAT2 is None:
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):  # pragma: no cover - no libc to call through
        return None


_CALL = _syscall()
#: whether openat2 is usable here (False after the kernel said it does not know it)
available = _CALL is not None


def open_beneath(root_fd: int, key: str, flags: int, mode: int = 0o666) -> int | None:
    """A descriptor of ``key`` below the directory ``root_fd`` opened with ``flags``, or None
    when this path cannot open it (the caller then opens it the portable way).

    Raises FileNotFoundError when ``key`` (or, to create it, its directory) does not exist:
    ``RESOLVE_BENEATH`` refuses a way out with ``EXDEV``, never with ``ENOENT``, so the
    portable path would find nothing either (on a network file system, one round trip saved).
    """
    global available
    if not available:
        return None
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    path = key.encode("utf-8", "surrogateescape")
    fd = _CALL(_SYS_OPENAT2, root_fd, path, ctypes.byref(how), ctypes.sizeof(how))  # type: ignore[operator]
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err == errno.ENOENT:  # a missing file or directory is missing by either path: no second try
        raise FileNotFoundError(err, os.strerror(err), key)
    if err in (errno.ENOSYS, errno.EPERM):  # pragma: no cover - old kernel, seccomp
        available = False
    return None


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
#: whether renameat2(RENAME_NOREPLACE) is usable here (False after a file system refused it)
_noreplace = sys.platform == "linux" and _CALL is not None


def _renameat2() -> Any:
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except OSError:  # pragma: no cover - no libc to call through
        return None


_RENAMEAT2 = _renameat2() if _noreplace else None


def rename_noreplace(src: str, dst: str) -> bool | None:
    """Rename ``src`` to ``dst`` unless ``dst`` exists: True if renamed, False if ``dst``
    exists (``src`` is left), None where this kernel or file system cannot (the caller then
    links and unlinks, two calls where this is one; on a network file system, round trips).

    Exclusive like ``link``: the kernel (and a FUSE daemon, which gets the flag) refuses an
    existing ``dst``; where a shared mount's create is not exclusive across hosts, neither is
    this, and the caller reads back what stands, as it does after a link."""
    global _noreplace
    if not _noreplace:
        return None
    fn = _RENAMEAT2
    if fn is None:  # pragma: no cover - a libc older than glibc 2.28
        _noreplace = False
        return None
    enc = os.fsencode
    if fn(_AT_FDCWD, enc(src), _AT_FDCWD, enc(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.ENOTSUP):  # not on this file system
        _noreplace = False
        return None
    raise OSError(err, os.strerror(err), dst)
