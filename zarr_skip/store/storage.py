"""The thin layer over a zarr Store: open a location, and synchronous, concurrent key I/O.

Only :mod:`zarr_skip.cache`, :mod:`zarr_skip.store.writer`, :mod:`zarr_skip.lazy` and
:mod:`zarr_skip.maintenance` use it; nothing here knows columns or torch.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from zarr.abc.store import RangeByteRequest, Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore

from zarr_skip.errors import (
    AtomicityError,
    ConfigError,
    MetadataError,
    OutsideCacheError,
    ReadOnlyCacheError,
    StorageError,
    ZarrSkipError,
)
from zarr_skip.format import args, layout
from zarr_skip.store import _localfs, packed
from zarr_skip.store._s3_errors import backend_error
from zarr_skip.store.packed import Member

logger = logging.getLogger(__name__)

T = TypeVar("T")
_PROTO = default_buffer_prototype()
#: requests in flight at once; object stores are latency-bound, local disks don't mind
CONCURRENCY = 64
#: on an object store, the most bytes a read of a few rows fetches between two pieces it
#: needs of one data file rather than making two requests (:attr:`Storage.hole_bytes`): a
#: request costs a round trip, and a data file's bytes arrive at hundreds of MB/s. 64 random
#: rows of the medium step in 4 mini-batches (8 KiB blocks) on a local SeaweedFS took 30-35 ms
#: in ~50 ranged GETs of pieces at most 16 KiB apart, 13 ms this way, against 21 ms for the
#: whole column (2026-12-04, benchmarks/README.md)
REMOTE_HOLE_BYTES = 1 << 20


def open_store(
    location: str | os.PathLike[str] | Store,
    *,
    storage_options: Mapping[str, Any] | None = None,
    read_only: bool = False,
) -> Store:
    """A zarr Store for a path, a ``file://`` or ``s3://`` URL, or a Store object.

    Plain paths use zarr's ``LocalStore`` (atomic temp-file + rename writes), never fsspec.
    """
    if isinstance(location, Store):
        if read_only and not location.read_only and hasattr(location, "with_read_only"):
            return location.with_read_only(True)
        return location
    text = os.fspath(location)
    scheme = args.url_scheme(text)
    if scheme is None:
        return LocalStore(Path(text).expanduser(), read_only=read_only)
    if scheme == "file":
        return LocalStore(Path(text.partition("://")[2]).expanduser(), read_only=read_only)
    if scheme in ("s3", "s3a"):
        from zarr_skip.store._s3 import open_s3_store

        return open_s3_store(text, dict(storage_options or {}), read_only)
    if scheme == "memory":
        raise ConfigError(
            f"location: {text!r}: 'memory://' is fsspec's process-global filesystem; pass a "
            "zarr.storage.MemoryStore() object instead"
        )
    raise ConfigError(f"location: {text!r}: unsupported scheme {scheme!r} (use a path, file://, s3:// or a zarr Store)")


def describe(store: Store) -> str:
    """A short human-readable name of the store's location, for messages."""
    if isinstance(store, LocalStore):
        return str(store.root)
    return str(store)


class Storage:
    """Synchronous, concurrent access to the keys of one zarr Store.

    Parameters
    ----------
    store : the zarr Store.
    claim_settle : seconds to wait between writing a claim and reading it back; raise it on
        shared filesystems whose exclusive create is unreliable (see ``docs/format.md``).
    """

    def __init__(self, store: Store, *, claim_settle: float = 0.0) -> None:
        self.store = store
        self.claim_settle = claim_settle
        self._probed = False  # whether check_exclusive_create ran
        self.where = describe(store)
        #: the directory of a LocalStore: its keys are read and written directly (_localfs)
        self.root: Path | None = Path(store.root) if type(store) is LocalStore else None
        self._tree = _localfs.Tree(self.root) if self.root is not None else None

    @property
    def read_only(self) -> bool:
        return bool(self.store.read_only)

    @property
    def creates_stand_at_once(self) -> bool:
        """Whether an exclusive create's outcome is final once read back: an object store's
        conditional PUT, memory. Not a directory, which may be a shared mount where two
        creators both read back their own record for a while (``tests/test_shared.py``)."""
        return not isinstance(self.store, LocalStore)

    @property
    def hole_bytes(self) -> int | None:
        """How many bytes a read of some blocks of chunks (a few rows) steps over rather than
        making another request: :data:`REMOTE_HOLE_BYTES` on an object store, where a request
        costs a round trip; None on local files and in memory (a few KiB there, see
        :mod:`~zarr_skip.store.fetching` and :mod:`~zarr_skip.store.blockreads`)."""
        return None if self._tree is not None or isinstance(self.store, MemoryStore) else REMOTE_HOLE_BYTES

    @property
    def fork_safe(self) -> bool:
        """Whether a ``fork()``ed child may go on reading through this storage: local files
        (their directory descriptor and the pool are made anew in each process), not object
        stores (obstore's runtime does not survive a fork)."""
        return self._tree is not None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return sync(coro)
        except Exception as exc:
            typed = backend_error(exc, self.where)
            if typed is None:
                raise
            raise typed from exc

    # -- reads ------------------------------------------------------------------------------

    async def aget(self, key: str, span: tuple[int, int] | None = None) -> bytes | None:
        """The bytes at ``key`` (None if absent), or ``span = (start, length)`` of them."""
        _contained(key)
        if span is None:
            buf = await self.store.get(key, _PROTO)
        else:
            start, length = span
            try:
                buf = await self.store.get(key, _PROTO, RangeByteRequest(start, start + length))
            except Exception:  # a range past the end: S3 answers 416, stores raise their own
                if not await self.store.exists(key):
                    return None
                return b""  # a truncated object; the caller's size check reports it
        return None if buf is None else buf.to_bytes()

    def get(self, key: str) -> bytes | None:
        if self._tree is not None:
            return self._tree.read(key)
        return self.run(self.aget(key))

    def get_many(self, keys: Iterable[str]) -> list[bytes | None]:
        keys = list(keys)
        if self._tree is not None:  # concurrent: cold metadata reads overlap their disk latency
            return _localfs.parallel(self._tree.read, keys)
        if not keys:
            return []
        return self.run(gather_limited([partial(self.aget, k) for k in keys]))

    def get_spans(
        self, requests: Sequence[tuple[str, Sequence[tuple[int, int]]]], *, serial: bool = False
    ) -> list[list[bytes] | None]:
        """For each ``(key, spans)``: the bytes of each ``(start, length)`` span of ``key``
        (fewer at the end of the object; None when it is absent). Local files: each request
        opens its file once, the requests in the pool, or with ``serial`` in this thread (the
        kernel asked to read every span first: :meth:`_localfs.Tree.read_spans`); other
        stores: every span fetched concurrently (ranged GETs)."""
        if self._tree is not None:
            tree = self._tree
            if serial:
                return tree.read_spans(requests)
            return _localfs.parallel(lambda r: tree.read_spans([r])[0], requests)
        flat = [(key, span) for key, spans in requests for span in spans]
        blobs = iter(self.run(gather_limited([partial(self.aget, k, w) for k, w in flat]))) if flat else iter(())
        got = [[next(blobs) for _ in spans] for _, spans in requests]
        return [None if any(b is None for b in bs) else [b or b"" for b in bs] for bs in got]

    def read_ahead(self, items: Sequence[tuple[str, tuple[int, int] | None]]) -> bool:
        """Say that ``(key, span)`` will be read soon. Local files: the kernel starts reading
        them (no thread, no wait) and True is returned. Other stores: False, and the caller
        fetches them itself, concurrently with what it reads now: one round trip, not two."""
        return self._hint(items)

    def _hint(self, items: Sequence[tuple[str, tuple[int, int] | None]]) -> bool:
        if self._tree is None or not hasattr(os, "posix_fadvise"):
            return False
        for key, span in items:
            start, length = span if span is not None else (0, 0)
            self._tree.will_need(key, start, length)
        return True

    def parallel(self, fn: Callable[[T], Any], items: Sequence[T]) -> list[Any]:
        """``[fn(x) for x in items]`` in the I/O and codec pool (see :func:`_localfs.parallel`)."""
        return _localfs.parallel(fn, items)

    def share_out(self, fn: Callable[[T], object], items: Sequence[T], mine: Sequence[T] = ()) -> None:
        """``fn`` over ``mine`` in this thread, then over ``items`` with the pool's threads (see
        :func:`_localfs.share_out`)."""
        _localfs.share_out(fn, items, mine)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` in the I/O and codec pool (see :func:`_localfs.submit`)."""
        return _localfs.submit(fn, *args)

    def publish_zip(
        self, key: str, members: Sequence[Member], *, fresh: bool = False
    ) -> tuple[dict[str, tuple[int, int]], int]:
        """Store ``members`` as one data file at ``key`` (a ZIP of stored members, see
        :mod:`zarr_skip.store.packed`): on a local disk written as the values come, to a temp
        file renamed into place (``fresh``: to ``key`` itself, created exclusively, see
        :meth:`_localfs.Tree.publish`), to another store as one value (one request). Returns
        each member's ``(offset, length)`` in the file and its size."""
        self._check_writable(key)
        if self._tree is not None:

            def write(f: BinaryIO) -> tuple[dict[str, tuple[int, int]], int]:
                spans = packed.write_zip(f, members)
                return spans, f.tell()

            try:
                return self._tree.publish(key, write, fresh=fresh)
            except OSError as exc:
                raise storage_error(exc, self.key_path(key)) from exc
        blob, spans = packed.zip_bytes(members)
        self.set(key, blob)
        return spans, len(blob)

    def get_json_many(self, keys: Iterable[str]) -> list[dict[str, Any] | None]:
        """Parsed JSON documents (None where absent); a garbled document raises MetadataError."""
        keys = list(keys)
        return [parse_json(blob, self.key_path(k)) for k, blob in zip(keys, self.get_many(keys), strict=True)]

    def list_dir(self, prefix: str) -> list[str]:
        """Names directly below ``prefix`` (keys and 'directories'), sorted."""
        return self.list_dirs([prefix])[0]

    def list_dirs(self, prefixes: Iterable[str]) -> list[list[str]]:
        """:meth:`list_dir` of several prefixes, concurrently."""
        return self.list_and_get(prefixes, [])[0]

    def list_and_get(self, prefixes: Iterable[str], keys: Iterable[str]) -> tuple[list[list[str]], list[bytes | None]]:
        """:meth:`list_dirs` of ``prefixes`` and :meth:`get_many` of ``keys``: from an object
        store in one round of requests; from local files the listings, then the reads."""
        prefixes, keys = list(prefixes), list(keys)
        if self._tree is not None:
            return [self._tree.list_dir(p) for p in prefixes], self.get_many(keys)
        if not prefixes and not keys:
            return [], []

        async def listing(prefix: str) -> list[str]:
            return sorted({name async for name in self.store.list_dir(prefix)})

        async def both() -> tuple[list[list[str]], list[bytes | None]]:
            listings, blobs = await asyncio.gather(
                gather_limited([partial(listing, p) for p in prefixes]),
                gather_limited([partial(self.aget, k) for k in keys]),
            )
            return listings, blobs

        return self.run(both())

    def list_prefix(self, prefix: str) -> list[str]:
        if self._tree is not None:
            return self._tree.list_files(prefix)

        async def collect() -> list[str]:
            return [key async for key in self.store.list_prefix(prefix)]

        return sorted(self.run(collect()))

    def key_path(self, key: str) -> str:
        """The key as a user would find it: a file path for local stores."""
        if self._tree is not None:
            return os.path.join(self._tree.root, key) if key else str(self._tree.root)
        if isinstance(self.store, LocalStore):
            return str(Path(self.store.root) / key)
        return f"{self.where}/{key}"

    # -- writes -----------------------------------------------------------------------------

    def _check_writable(self, key: str) -> None:
        if self.read_only:
            raise ReadOnlyCacheError(f"{self.key_path(key)}: the cache was opened read-only")

    async def aset(self, key: str, data: bytes) -> None:
        _contained(key)
        try:
            await self.store.set(key, _PROTO.buffer.from_bytes(data))
        except OSError as exc:
            raise storage_error(exc, self.key_path(key)) from exc

    def set(self, key: str, data: bytes) -> None:
        self._check_writable(key)
        if self._tree is not None:
            try:
                self._tree.write(key, data)
            except OSError as exc:
                raise storage_error(exc, self.key_path(key)) from exc
            return
        self.run(self.aset(key, data))

    def make_dir(self, prefix: str) -> None:
        """Make the directory ``prefix`` of a local directory's cache (a mini-batch's, before
        its claim and its data file are created in it at once); other stores have none."""
        self._check_writable(prefix)
        if self._tree is not None:
            try:
                self._tree.make_dir(_contained(prefix))
            except OSError as exc:
                raise storage_error(exc, self.key_path(prefix)) from exc

    def create_if_absent(self, key: str, data: bytes, *, dir_made: bool = False) -> bool:
        """Create ``key`` holding ``data`` only if it does not exist; True if this call did.
        ``dir_made``: its directory exists (:meth:`make_dir`), no need to make it.

        ``data`` must be unique to the caller (it carries a writer token): the key is written
        with the store's exclusive create, then read back, and the caller won only if the bytes
        read are its own. That stays correct where the exclusive create is not (a store that
        swallows the "exists" error, a shared mount that lets two creators through and keeps
        the last): whoever's bytes remain is the one winner.
        """
        self._check_writable(key)
        if self._tree is not None:
            try:
                self._tree.create(key, data, dir_made=dir_made)
            except OSError as exc:
                raise storage_error(exc, self.key_path(key)) from exc
            if self.claim_settle:
                time.sleep(self.claim_settle)
            return self._tree.read(key) == data
        if not self._probed:  # at the first create, not at open: readers never pay for it
            self._probed = True
            self.check_exclusive_create("")
        return self.run(self._create_if_absent(key, data))

    async def _create_if_absent(self, key: str, data: bytes) -> bool:
        _contained(key)
        store = self.store
        try:
            if isinstance(store, (LocalStore, MemoryStore)):
                await store.set_if_not_exists(key, _PROTO.buffer.from_bytes(data))
            else:
                from zarr_skip.store._s3_claims import create_if_absent

                if not await create_if_absent(store, key, data, where=self.key_path(key)):
                    return False
        except OSError as exc:
            raise storage_error(exc, self.key_path(key)) from exc
        except (NotImplementedError, TypeError):
            raise AtomicityError(
                f"{self.where}: {type(store).__name__} cannot create keys exclusively, so "
                "concurrent writers would be unsafe; use a LocalStore path, s3:// or MemoryStore"
            ) from None
        if self.claim_settle:
            await asyncio.sleep(self.claim_settle)
        return await self.aget(key) == data

    def check_exclusive_create(self, prefix: str) -> bool:
        """Whether an object store really refuses a second conditional create (a probe of
        three requests; :meth:`create_if_absent` runs it before its first create, so opening
        and reading a cache never writes).

        Local and in-memory stores always do. When a server ignores ``If-None-Match``, the
        claim protocol stays correct through writer-unique data groups and the claim re-check
        (docs/format.md), and a claim settle time is added so that races resolve early.
        """
        if isinstance(self.store, (LocalStore, MemoryStore)) or self.read_only:
            return True
        from zarr_skip.store._s3_claims import probe_conditional_put

        try:
            enforced = self.run(probe_conditional_put(self.store, prefix))
        except (TypeError, NotImplementedError):
            enforced = False
        if not enforced:
            logger.warning(
                "%s ignores conditional creates (If-None-Match): concurrent writers stay correct "
                "but slower (claims now wait %.1f s before checking)",
                self.where,
                max(self.claim_settle, 0.5),
            )
            self.claim_settle = max(self.claim_settle, 0.5)
        return enforced

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key below ``prefix`` (a 'directory')."""
        self._delete(prefix, below=True)

    def remove_empty_dir(self, prefix: str) -> None:
        """Remove the directory ``prefix`` of a local store if it is empty: one ``rmdir``,
        which never takes what another writer has just put in it (then, or where the directory
        is gone or lies outside the root, nothing happens). Other stores have no directories."""
        self._check_writable(prefix)
        store = self.store
        if not isinstance(store, LocalStore):
            return
        root = os.path.realpath(store.root)
        path = os.path.join(root, _contained(prefix))
        if os.path.realpath(path).startswith(root + os.sep):
            try:
                os.rmdir(path)
            except OSError:  # not empty (another writer's claim), gone, or refused: gc decides
                pass

    def delete(self, key: str) -> None:
        self._delete(key, below=False)

    def _delete(self, path: str, *, below: bool) -> None:
        """Delete the key ``path``, or with ``below`` every key below it."""
        self._check_writable(path)
        try:
            if self._tree is not None:
                (self._tree.delete_tree if below else self._tree.delete)(path)
                return
            self.run((self.store.delete_dir if below else self.store.delete)(_contained(path)))
        except OSError as exc:
            raise storage_error(exc, self.key_path(path)) from exc


async def gather_limited(
    factories: list[Callable[[], Awaitable[T]]], limit: int = CONCURRENCY, *, settle: bool = False
) -> list[T]:
    """Run coroutine factories concurrently, at most ``limit`` at a time, results in order.
    ``settle``: on a failure, wait for every other one to end before raising the first."""
    if len(factories) <= 1:
        return [await f() for f in factories]
    sem = asyncio.Semaphore(limit)

    async def bounded(f: Callable[[], Awaitable[T]]) -> T:
        async with sem:
            return await f()

    if not settle:
        return list(await asyncio.gather(*(bounded(f) for f in factories)))
    results = await asyncio.gather(*(bounded(f) for f in factories), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return cast("list[T]", results)


def _contained(key: str) -> str:
    """``key``, refused unless it stays inside the cache (on every backend)."""
    problem = layout.key_problem(key)
    if problem is not None:
        raise OutsideCacheError(f"key {key!r} would leave the cache ({problem})")
    return key


def parse_json(blob: bytes | None, where: str) -> dict[str, Any] | None:
    if blob is None:
        return None
    try:
        doc = json.loads(blob)
    except ValueError as exc:  # bad UTF-8 or JSON, or an int of more digits than Python parses
        raise MetadataError(f"{where}: not valid JSON ({exc})") from None
    except (RecursionError, MemoryError) as exc:  # nesting or size no record of ours has
        raise MetadataError(f"{where}: metadata too deeply nested or too large ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise MetadataError(f"{where}: expected a JSON object")
    return doc


def storage_error(exc: OSError, where: str) -> Exception:
    """Map an OSError from the store to a typed error naming the location."""
    if isinstance(exc, ZarrSkipError):  # already typed (a key or link leading out of the cache)
        return exc
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ReadOnlyCacheError(f"{where}: the location refuses writes ({exc.strerror})")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        err = StorageError(f"{where}: no space left on the device")
    else:
        err = StorageError(f"{where}: write failed ({exc})")
    err.errno = exc.errno
    return err
