"""Direct file I/O for caches on a local or mounted filesystem (the fast path of storage.py).

Same semantics as zarr's ``LocalStore`` (every write is a temp file renamed into place, so a
reader never sees half a file; an exclusive create is a hard link, which fails if the target
exists), without an event-loop round trip and a thread hop per key: metadata operations run
in the caller's thread, chunk batches in a small thread pool.

Every key goes through a :class:`Tree`, which keeps it inside the cache root: a key with an
absolute path, a ``..`` or empty segment, a backslash or NUL is refused, and a file opened
through a symbolic link that leads out of the root (a linked data directory) is closed
unread (:class:`~zarr_skip.errors.OutsideCacheError`). The check asks the kernel where the
opened file really is (``/proc/self/fd``), so it costs one ``readlink`` per file and no
race between checking a path and opening it.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from zarr_skip.errors import OutsideCacheError
from zarr_skip.format.layout import key_problem
from zarr_skip.store import _beneath
from zarr_skip.store._gather import GatheredFile

T = TypeVar("T")
R = TypeVar("R")
_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0
_SIDE: ThreadPoolExecutor | None = None
_SIDE_PID = 0
#: threads for requests made beside the pool's work (see :func:`beside`)
_SIDE_THREADS = 4


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


def beside(fn: Callable[..., T], *args: object) -> Future[T]:
    """Run ``fn(*args)`` on a thread beside the pool, never queued behind its work: a
    mini-batch's claim (a few metadata requests) while the pool compresses the chunks of the
    data file that the calling thread writes meanwhile. Made anew in a forked child."""
    global _SIDE, _SIDE_PID
    if _SIDE is None or _SIDE_PID != os.getpid():
        _SIDE = ThreadPoolExecutor(max_workers=_SIDE_THREADS, thread_name_prefix="zarr-skip-claim")
        _SIDE_PID = os.getpid()
    return _SIDE.submit(fn, *args)


def submit(fn: Callable[..., T], *args: object) -> Future[T]:
    """Run ``fn(*args)`` on the pool. Tasks run in submission order, so a task may wait for
    the result of one submitted before it, never for one submitted after it."""
    return pool().submit(fn, *args)


#: :func:`parallel` hands the pool at most this many tasks per thread (each a share of the
#: items): a task costs ~30 us to hand over, more than reading and decoding a small chunk
TASKS_PER_THREAD = 8


def parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]`` on the pool (in the caller's thread when there is one item).

    Many items go in :data:`TASKS_PER_THREAD` tasks per thread, each taking every k-th item
    (interleaved, so that a run of large items is shared out).
    """
    if len(items) <= 1:
        return [fn(x) for x in items]
    k = workers() * TASKS_PER_THREAD
    if len(items) <= k:
        return list(pool().map(fn, items))
    shares = list(pool().map(lambda j: [fn(x) for x in items[j::k]], range(k)))
    out: list[Any] = [None] * len(items)  # placeholders, each replaced by a result below
    for j, share in enumerate(shares):
        out[j::k] = share
    return out


def share_out(fn: Callable[[T], object], items: Sequence[T], mine: Sequence[T] = ()) -> None:
    """``fn(x)`` for every ``x`` of ``mine`` in this thread, and of ``items`` in the pool's
    threads but one and this one (once done with ``mine``): each thread takes the next item
    when free, so that no thread waits while another has two left.

    For work of mixed sizes (decoding chunks): the small items ``mine`` cost less to do than
    to hand to a thread, the large ``items`` go to whoever is free. As many threads as cores
    (see :func:`workers`). The first failure stops every thread and is raised once none runs.
    """
    todo = iter(items)
    lock = threading.Lock()
    stopped = threading.Event()

    def drain() -> None:
        while not stopped.is_set():
            with lock:
                item = next(todo, None)
            if item is None:
                return
            try:
                fn(item)
            except BaseException:
                stopped.set()
                raise

    helpers = [submit(drain) for _ in range(min(len(items), workers() - 1))]
    try:
        for item in mine:
            fn(item)
        drain()
    except BaseException:
        stopped.set()
        raise
    finally:
        wait(helpers)
    for f in helpers:
        f.result()


#: bytes read from a file before asking for its size (records and documents are smaller)
_FIRST_READ = 64 << 10
#: where the kernel tells the real path of an open file (Linux); elsewhere paths are resolved
_FD_LINKS = "/proc/self/fd"
_HAS_FD_LINKS = os.path.isdir(_FD_LINKS)
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` and close it (no file object: no ``fstat`` of its own)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class Tree:
    """The files of a cache root, reached by key; nothing outside the root is read or written.

    Parameters
    ----------
    root : the cache's directory (it may itself be a symbolic link: its target is the root).
    """

    __slots__ = ("_fd", "_fd_pid", "_prefix", "real", "root")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real = os.path.realpath(root)
        self._prefix = os.path.join(root, "")
        self._fd: int | None = None  # the root directory, open, for _beneath (made when first needed)
        self._fd_pid = 0

    # os's functions bound now: at interpreter exit a module-global cache's Tree may be
    # collected after the os module was torn down ("Exception ignored in __del__")
    def __del__(self, _getpid: Callable[[], int] = os.getpid, _close: Callable[[int], None] = os.close) -> None:
        if self._fd is not None and self._fd_pid == _getpid():
            try:
                _close(self._fd)
            except OSError:  # pragma: no cover - closed already
                pass

    def _root_fd(self) -> int | None:
        """The root directory, open (None where it does not exist yet, or openat2 is missing)."""
        if not _beneath.available:
            return None
        if self._fd is None or self._fd_pid != os.getpid():
            try:
                self._fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return None
            self._fd_pid = os.getpid()
        return self._fd

    def _fast(self, key: str, flags: int, mode: int = 0o666) -> int | None:
        """``key`` opened below the root in one call, refusing a way out (None: take the
        portable path; FileNotFoundError: it, or its directory, is missing). Only for a key
        :meth:`_file` accepted."""
        root = self._root_fd()
        return None if root is None or not key else _beneath.open_beneath(root, key, flags, mode)

    def path(self, key: str) -> Path:
        """The file of ``key``; a key that would leave the root is refused."""
        problem = key_problem(key)
        if problem is not None:
            raise OutsideCacheError(f"{self.root}: key {key!r} would leave the cache ({problem})")
        return self.root / key if key else self.root

    def _inside(self, real: str) -> bool:
        return real == self.real or real.startswith(self.real.rstrip(os.sep) + os.sep)

    def _refuse(self, key: str, real: str) -> OutsideCacheError:
        return OutsideCacheError(
            f"{self.root / key}: a symbolic link leads outside the cache root to {real}; refused "
            "(zarr_skip never links files, so the cache was altered)"
        )

    def _file(self, key: str) -> str:
        """:meth:`path` as a string (what every read opens: no Path object per chunk)."""
        problem = key_problem(key)
        if problem is not None:
            raise OutsideCacheError(f"{self.root}: key {key!r} would leave the cache ({problem})")
        return self._prefix + key if key else str(self.root)

    def _check_fd(self, fd: int, key: str, path: Path | str) -> None:
        real = os.readlink(f"{_FD_LINKS}/{fd}") if _HAS_FD_LINKS else os.path.realpath(path)
        if not self._inside(real):
            raise self._refuse(key, real)

    def check_path(self, key: str) -> Path:
        """``path(key)`` after resolving its symbolic links (for what is not opened: a
        directory to create, list or delete)."""
        path = self.path(key)
        real = os.path.realpath(path)
        if not self._inside(real):
            raise self._refuse(key, real)
        return path

    def _open(self, key: str, flags: int) -> int | None:
        """A checked file descriptor of ``key`` opened with ``flags`` (None if absent)."""
        path = self._file(key)
        try:
            fd = self._fast(key, flags)
            if fd is not None:
                return fd
            fd = os.open(path, flags)
        except _MISSING:
            return None
        try:
            self._check_fd(fd, key, path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- reads --------------------------------------------------------------------------------

    def read(self, key: str) -> bytes | None:
        fd = self._open(key, os.O_RDONLY)
        if fd is None:
            return None
        try:
            data = os.pread(fd, _FIRST_READ, 0)  # most records: read whole without asking their size
            if len(data) < _FIRST_READ:
                return data
            size = os.fstat(fd).st_size
            data = os.pread(fd, size + 1, 0)  # one read, and one byte more: did it grow?
            if len(data) <= size:
                return data
            with open(fd, "rb", closefd=False) as f:
                return f.read()
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)

    def read_spans(self, requests: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> list[list[bytes] | None]:
        """For each ``(key, spans)``: ``length`` bytes of ``key`` from each ``(start, length)``
        (fewer at the end of the file; None if the file is absent), in this thread, each file
        opened once. With more than one span, the kernel is first asked to read them all
        (``posix_fadvise(WILLNEED)``), so that cold reads wait for one disk latency, not one each."""
        fds: list[int | None] = []
        try:
            for key, _ in requests:
                fds.append(self._open(key, os.O_RDONLY))
            if sum(len(spans) for _, spans in requests) > 1 and hasattr(os, "posix_fadvise"):
                for fd, (_, spans) in zip(fds, requests, strict=False):
                    for start, length in spans:
                        if fd is not None:
                            _advise(fd, start, length)
            return [_pread_all(fd, spans) for fd, (_, spans) in zip(fds, requests, strict=True)]
        finally:
            for fd in fds:
                if fd is not None:
                    os.close(fd)

    def will_need(self, key: str, start: int, length: int) -> None:
        """Ask the kernel to start reading ``length`` bytes of ``key`` from ``start`` into the
        page cache now (``posix_fadvise(WILLNEED)``); returns at once. A missing file is left
        to the read that follows to report."""
        try:
            fd = self._open(key, os.O_RDONLY)
        except OSError:
            return
        if fd is None:
            return
        try:
            _advise(fd, start, length)
        finally:
            os.close(fd)

    def list_dir(self, key: str) -> list[str]:
        try:
            fd = self._open(key, os.O_RDONLY | os.O_DIRECTORY)
        except NotADirectoryError:
            return []
        if fd is None:
            return []
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def list_files(self, key: str) -> list[str]:
        """Every file below ``key``, as keys relative to the root (links are not followed)."""
        path = self.check_path(key)
        out = []
        for dirpath, _, files in os.walk(path):
            rel = os.path.relpath(dirpath, self.root)
            out += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in files]
        return sorted(out)

    # -- writes -------------------------------------------------------------------------------

    def _temp(self, key: str) -> tuple[Path, int]:
        """A new temp file beside ``key`` (its directory made if missing), checked, open."""
        return self._new(key, f".{uuid.uuid4().hex}.partial")

    def _new(self, key: str, suffix: str = "") -> tuple[Path, int]:
        """The new file ``key + suffix`` (its directory made if missing), checked, open for
        writing; FileExistsError if it exists."""
        path = self.path(key)
        tmp = path.with_name(path.name + suffix)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = self._fast(key + suffix, flags)
        except FileNotFoundError:  # its directory is missing
            try:
                fd = self._fast(key + suffix, flags) if self._mkdir_fast(key.rpartition("/")[0]) else None
            except FileNotFoundError:  # removed again at once: the portable path decides
                fd = None
        if fd is not None:
            return tmp, fd
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileNotFoundError:
            self.make_dirs([key])
            fd = os.open(tmp, flags, 0o666)
        try:
            self._check_fd(fd, key, tmp)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return tmp, fd

    def _mkdir_fast(self, key: str) -> bool:
        """Make the directory ``key`` (and its missing parents) in its parent, opened below the
        root in one call (False when that cannot be done: the caller takes the portable path)."""
        parent, _, name = key.rpartition("/")
        if not name:
            return False
        flags = os.O_RDONLY | os.O_DIRECTORY
        try:
            pfd = self._fast(parent, flags) if parent else self._root_fd()
        except FileNotFoundError:  # the first write to a step makes its directory too
            try:
                pfd = self._fast(parent, flags) if self._mkdir_fast(parent) else None
            except FileNotFoundError:
                return False
        if pfd is None:
            return False
        try:
            os.mkdir(name, 0o777, dir_fd=pfd)
        except FileExistsError:
            pass
        except OSError:
            return False
        finally:
            if parent:
                os.close(pfd)
        return True

    def write(self, key: str, data: bytes) -> int:
        """Write ``data`` to ``key`` atomically (temp file, then rename)."""
        tmp, fd = self._temp(key)
        try:
            _write_all(fd, data)
            os.replace(tmp, self.path(key))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return len(data)

    def publish(self, key: str, write: Callable[[BinaryIO], T], *, fresh: bool = False) -> T:
        """Make the file ``key`` with ``write(file)`` (the file open for writing and seeking, in
        a temp file beside ``key`` that is renamed into place once written: a reader never
        sees a half-written file, a writer killed midway leaves a ``*.partial``).

        ``fresh``: ``key`` is a new name that nobody reads before a later record vouches for
        its size and checksums (a writer's data file): it is created exclusively and written in
        place, without temp file and rename (on a network file system, round trips saved). A
        writer killed midway leaves a torn file under that name, which no record names."""
        tmp, fd = self._new(key) if fresh else self._temp(key)
        try:
            # appends gathered into large writes, zipfile's header patches in memory (_gather)
            with GatheredFile(fd) as f:
                result = write(cast("BinaryIO", f))
            if not fresh:
                os.replace(tmp, self._file(key))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return result

    def make_dirs(self, keys: Sequence[str]) -> None:
        """Create the directories of ``keys`` (parents first), once each. Where a new branch
        starts, its parent is resolved first: no directory is made through a link out."""
        dirs = {self.path(k).parent for k in keys}
        for d in sorted(dirs, key=lambda d: len(d.parts)):
            if d.parent not in dirs and d != self.root:
                real = os.path.realpath(d)
                if not self._inside(real):
                    raise self._refuse(str(d.relative_to(self.root)), real)
            d.mkdir(parents=True, exist_ok=True)

    def make_dir(self, key: str) -> None:
        """Make the directory ``key`` (and its missing parents), below the root."""
        if not self._mkdir_fast(key):
            self.make_dirs([f"{key}/-"])

    def create(self, key: str, data: bytes, *, dir_made: bool = False) -> None:
        """Create ``key`` holding ``data`` unless it exists: a complete temp file renamed with
        ``RENAME_NOREPLACE`` (one call), or where that is refused hard-linked and unlinked.
        Its directory is made first unless ``dir_made``: each key created so is the first of a
        new directory (a run's, a claim's or a completion's record), where a create tried
        first fails."""
        if not dir_made:
            self._mkdir_fast(key.rpartition("/")[0])
        tmp, fd = self._temp(key)
        renamed = False
        try:
            _write_all(fd, data)
            done = _beneath.rename_noreplace(str(tmp), str(self.path(key)))
            renamed = done is True
            if done is None:
                try:
                    os.link(tmp, self.path(key))
                except FileExistsError:
                    pass
        finally:
            if not renamed:
                tmp.unlink(missing_ok=True)

    def delete_tree(self, key: str) -> None:
        path = self.check_path(key)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=False)
        else:
            path.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        self.check_path(key.rpartition("/")[0])
        self.path(key).unlink(missing_ok=True)


def _advise(fd: int, start: int, length: int) -> None:
    """Ask the kernel to start reading ``length`` bytes of ``fd`` from ``start`` (returns at once)."""
    try:
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)
    except OSError:  # pragma: no cover - a filesystem without read-ahead
        pass


def _pread_all(fd: int | None, spans: Sequence[tuple[int, int]]) -> list[bytes] | None:
    """The bytes of each ``(start, length)`` of ``fd`` (None: no file, or a directory)."""
    if fd is None:
        return None
    try:
        return [os.pread(fd, length, start) for start, length in spans]
    except IsADirectoryError:
        return None
