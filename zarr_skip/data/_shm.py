"""Shared-memory buffers that a DataLoader worker lends the main process and reuses once returned.

A worker's batch goes to the main process in shared memory. New shared memory costs: each page
the worker writes first is a page fault that allocates and zeroes it, and the memory is given
back when the main process drops the batch, so every batch pays again (an 8-step medium epoch
of padded batches through two workers took ~2x the time of the same batches made in ordinary
memory). So a worker keeps a few buffers (:class:`Lender`, one per process) and writes each
batch into one that is free:

* a buffer is a ``memfd`` (Linux) mapped in the worker, with a one-byte flag before the data;
* pickling a batch in its buffer (:class:`Lent`) sets the flag and names the buffer: the
  worker's pid, the descriptor's number and the memfd's inode; the main process opens it through
  ``/proc/{pid}/fd/{fd}`` and maps it (:func:`_reopen`) under tensors whose last reference, when
  it dies, clears the flag (:class:`_Borrowed`: the mapping outlives every tensor, view and array
  made from it, since each holds it). Where ``/proc`` cannot reach the worker's descriptors (no
  ``/proc``, or a worker that is not dumpable) the descriptor itself is sent
  (``multiprocessing``'s ``DupFd``: a connection to the worker per batch, which its busy thread
  answers only when it lets go of the GIL, so the main process waited ~4 ms a batch);
* a buffer is free when its flag is clear and the worker holds no tensor of it either (a batch
  made but not yet pickled by the queue's feeder thread).

A buffer the main process keeps is simply not reused; with :data:`MAX_BUFFERS` lent out the
worker makes its batch in new shared memory as torch does. Where ``memfd_create`` does not
exist, every batch is new shared memory. A reused buffer does not read as zeros, which the
caller is told (:meth:`Lender.take`), so a zero padding is written there.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import DupFd
from typing import Any, cast

import numpy as np
import torch

__all__ = ["Lender", "Lent", "lend", "lender", "open_through_proc", "reachable"]

#: bytes before a buffer's data: the flag (byte 0), padded to the batch's alignment
HEADER = 64
#: buffers a worker keeps; beyond them a batch goes in new shared memory
MAX_BUFFERS = 8
#: a new buffer holds at least this much, and a quarter more than the batch that made it
MIN_BYTES = 1 << 20


@dataclass(slots=True)
class _Buffer:
    fd: int
    mapping: mmap.mmap
    capacity: int
    address: int
    flag: np.ndarray
    inode: int
    held: weakref.ref[np.ndarray] | None = None
    fresh: bool = True

    def free(self) -> bool:
        """Neither this process nor the one it was lent to holds the buffer's data."""
        return (self.held is None or self.held() is None) and not self.flag[0]

    def owns(self, address: int) -> bool:
        return self.address <= address < self.address + self.capacity


class Lender:
    """The buffers of one process (see the module docstring)."""

    def __init__(self) -> None:
        self.buffers: list[_Buffer] = []
        self.pid = os.getpid()
        #: whether another process of this user can open this one's descriptors through /proc
        self.reachable = reachable()

    def take(self, nbytes: int) -> tuple[torch.UntypedStorage, bool]:
        """Shared memory for a batch of ``nbytes``, and whether it reads as zeros."""
        buf = self._free(nbytes)
        if buf is None:
            return _new_shared(nbytes), True
        data = np.frombuffer(buf.mapping, dtype=np.uint8, count=nbytes, offset=HEADER)
        buf.held = weakref.ref(data)
        zeros, buf.fresh = buf.fresh, False
        return torch.from_numpy(data).untyped_storage(), zeros

    def _free(self, nbytes: int) -> _Buffer | None:
        free = [b for b in self.buffers if b.free()]
        fits = [b for b in free if b.capacity >= nbytes]
        if fits:
            return min(fits, key=lambda b: b.capacity)
        if not hasattr(os, "memfd_create"):
            return None
        if len(self.buffers) >= MAX_BUFFERS:
            if not free:
                return None
            self._drop(min(free, key=lambda b: b.capacity))  # too small: make room for a larger one
        capacity = max(MIN_BYTES, nbytes + nbytes // 4)
        fd = os.memfd_create("zarr_skip-batch", os.MFD_CLOEXEC)
        os.ftruncate(fd, HEADER + capacity)
        mapping = mmap.mmap(fd, HEADER + capacity)
        address = np.frombuffer(mapping, dtype=np.uint8, offset=HEADER).ctypes.data
        flag = np.frombuffer(mapping, dtype=np.uint8, count=1)
        buf = _Buffer(fd, mapping, capacity, address, flag, os.fstat(fd).st_ino)
        self.buffers.append(buf)
        return buf

    def _drop(self, buf: _Buffer) -> None:
        self.buffers.remove(buf)
        del buf.flag  # the mapping's last export, before it is closed
        buf.mapping.close()
        os.close(buf.fd)

    def lend(self, storage: torch.UntypedStorage) -> Lent | None:
        """What pickles ``storage`` when it lies in one of the buffers (else None): the buffer
        is marked as lent until the receiving process drops what it rebuilt."""
        address = storage.data_ptr()
        for buf in tuple(self.buffers):  # a copy: the queue's feeder thread pickles while the worker takes
            if buf.owns(address):
                buf.flag[0] = 1
                pid = self.pid if self.reachable else None
                return Lent(buf.fd, address - buf.address, storage.nbytes(), pid, buf.inode)
        return None


@dataclass(frozen=True, slots=True)
class Lent:
    """A lent buffer's data, ``nbytes`` at ``offset``, as it pickles: where the receiving process
    opens the buffer (``pid``'s descriptor ``fd``, of ``inode``), or the descriptor itself
    when ``pid`` is None."""

    fd: int
    offset: int
    nbytes: int
    pid: int | None = None
    inode: int = 0

    def __reduce__(self) -> tuple[Any, ...]:
        if self.pid is None:
            return (_borrow, (DupFd(self.fd), HEADER + self.offset, self.nbytes))
        return (_reopen, (self.pid, self.fd, self.inode, HEADER + self.offset, self.nbytes))


def reachable() -> bool:
    """Whether this process's descriptors can be opened by another process of its user through
    ``/proc/{pid}/fd`` (Linux; a process that is not dumpable refuses it)."""
    if not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return bool(prctl(3, 0, 0, 0, 0) == 1)  # PR_GET_DUMPABLE


class _Borrowed(mmap.mmap):
    """A lent buffer mapped in the receiving process: dropped (once every tensor made from it is
    gone), it clears the flag that lets the worker reuse the buffer."""

    def __del__(self) -> None:
        if not self.closed:
            self[0:1] = b"\0"


def _borrow(fd: Any, offset: int, nbytes: int) -> torch.Tensor:
    """The bytes of a lent buffer sent as a descriptor, as a uint8 tensor over this process's
    mapping of it."""
    return _mapped(fd.detach(), offset, nbytes)


def _reopen(pid: int, fd: int, inode: int, offset: int, nbytes: int) -> torch.Tensor:
    """The bytes of a lent buffer that process ``pid`` holds as descriptor ``fd``, opened
    through ``/proc``, as a uint8 tensor over this process's mapping of it."""
    handle = open_through_proc(pid, fd, inode, f"the shared batch buffer of DataLoader worker {pid}")
    return _mapped(handle, offset, nbytes)


def open_through_proc(pid: int, fd: int, inode: int, what: str) -> int:
    """Descriptor ``fd`` of process ``pid`` (``what``: a memfd of ``inode``), opened through
    ``/proc`` for reading and writing; OSError naming ``what`` and the path otherwise."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        handle = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open {what} at {path}: {exc.strerror}") from exc
    if os.fstat(handle).st_ino != inode:
        os.close(handle)
        raise OSError(errno.ESTALE, f"{path} is not {what} (another inode)")
    return handle


def _mapped(handle: int, offset: int, nbytes: int) -> torch.Tensor:
    """``nbytes`` at ``offset`` of the buffer open as ``handle`` (closed here), mapped."""
    try:
        mapping = _Borrowed(handle, offset + nbytes)
    finally:
        os.close(handle)
    return torch.from_numpy(np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=offset))


def _new_shared(nbytes: int) -> torch.UntypedStorage:
    """New shared memory, as torch's ``default_collate`` makes a worker's batch."""
    make = torch.UntypedStorage._new_shared  # untyped in torch
    return cast(Callable[[int], torch.UntypedStorage], make)(nbytes)


#: the process whose buffers :data:`_LENDER` holds (a forked worker makes its own)
_PID = 0
_LENDER: Lender | None = None


def lender() -> Lender:
    """This process's buffers (new in each worker: a forked one does not share its parent's)."""
    global _PID, _LENDER
    if _LENDER is None or _PID != os.getpid():
        _PID, _LENDER = os.getpid(), Lender()
    return _LENDER


def lend(storage: torch.UntypedStorage) -> Lent | None:
    """What pickles ``storage`` when it lies in a buffer of this process (see :meth:`Lender.lend`)."""
    return _LENDER.lend(storage) if _LENDER is not None and _PID == os.getpid() else None
