"""Exclusive key creation on S3: the one primitive the cache's claims need from object storage.

On S3 it is a conditional ``PUT`` with ``If-None-Match: *`` (:func:`create_if_absent`), sent
through obstore. Some S3 look-alikes silently ignore that header; :func:`probe_conditional_put`
checks a server once. zarr's own ``ObjectStore.set_if_not_exists`` swallows the "already
exists" answer, so it cannot tell a caller whether it won.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from zarr.storage import ObjectStore

from zarr_skip.errors import AtomicityError, ReadOnlyCacheError, StorageError
from zarr_skip.store._s3_errors import has_status

if TYPE_CHECKING:
    from zarr.abc.store import Store

logger = logging.getLogger(__name__)

__all__ = ["create_if_absent", "probe_conditional_put"]

#: Attempts of one conditional PUT on errors that may be transient (5xx, 409
#: ConditionalRequestConflict, connection resets). obstore retries connection failures
#: itself (10 times), so this stays small.
_CREATE_ATTEMPTS = 3
_CREATE_BACKOFF = 0.2


def _first_line(exc: BaseException | None) -> str:
    """First line of an exception message (obstore appends a long debug dump)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def _back_off(key: str, attempt: int, exc: BaseException | None) -> None:
    """Log a failed conditional PUT of ``key`` and wait before the next attempt (doubling)."""
    logger.warning(
        "conditional PUT of %r failed (attempt %d/%d): %s",
        key,
        attempt + 1,
        _CREATE_ATTEMPTS,
        _first_line(exc),
    )
    await asyncio.sleep(_CREATE_BACKOFF * 2**attempt)


def _gave_up(key: str, where: str | None, last: BaseException | None) -> StorageError:
    """The error once every attempt to create ``key`` (at ``where``, its place for a user:
    bucket and prefix too) failed."""
    return StorageError(f"conditional PUT of {where or repr(key)} kept failing: {_first_line(last)}")


def _check_writable(store: Store) -> None:
    if getattr(store, "read_only", False):
        raise ReadOnlyCacheError(f"store {store} is read-only")


async def _stored_bytes(store: Store, key: str) -> bytes | None:
    from zarr.core.buffer import default_buffer_prototype

    buf = await store.get(key, default_buffer_prototype())
    return None if buf is None else buf.to_bytes()


async def create_if_absent(store: Store, key: str, data: bytes, where: str | None = None) -> bool:
    """Create ``key`` holding ``data`` only if it does not exist yet.

    One conditional ``PUT`` (``If-None-Match: *``): the server decides
    atomically, so of many concurrent callers (threads, processes, hosts) exactly
    one gets True — provided the server enforces the header (check once with
    :func:`probe_conditional_put`).

    Transient failures (5xx, 409 ``ConditionalRequestConflict``, dropped
    connections) are retried a few times. If an earlier attempt of this call
    failed in a way that may have stored the object anyway, and a retry then finds
    the key present holding exactly ``data``, the call reports True (the object is
    ours). Callers whose ``data`` could be byte-identical to another writer's should
    therefore make it unique (for example, include a random token).

    Parameters
    ----------
    store : zarr.abc.store.Store
        A ``zarr.storage.ObjectStore`` (any obstore backend), e.g. from
        :func:`~zarr_skip.store._s3.open_s3_store`.
    key : str
        Key relative to the store root (``"a/b/zarr.json"``).
    data : bytes
        Content of the new object (sent in a single PUT).
    where : str, optional
        The key as a user finds it (``s3://bucket/prefix/key``), for the error that says the
        PUT kept failing.

    Returns
    -------
    bool
        True if this call created the key, False if it already existed.

    Raises
    ------
    ReadOnlyCacheError
        The store is read-only, or the server refuses the write (permissions).
    AtomicityError
        The server does not support conditional PUT (answers "not implemented").
    StorageError
        The write kept failing.
    TypeError
        A store type without an atomic create.
    """
    _check_writable(store)
    if not isinstance(store, ObjectStore):
        raise TypeError(f"create_if_absent needs a zarr ObjectStore (obstore), not {store!r}")
    return await _create_obstore(store, key, bytes(data), where)


async def _resolve_after_exists(store: Store, key: str, data: bytes, ambiguous: bool) -> bool:
    """The key exists: ours only if an earlier attempt may have written it."""
    if not ambiguous:
        return False
    stored = await _stored_bytes(store, key)
    if stored == data:
        logger.warning(
            "conditional PUT of %r: an earlier attempt failed ambiguously and the key now "
            "holds our data; treating it as created by this call",
            key,
        )
        return True
    return False


async def _create_obstore(store: ObjectStore[Any], key: str, data: bytes, where: str | None) -> bool:
    import obstore as obs
    from obstore import exceptions as oe

    inner = store.store  # through the fork check of ForkCheckedObjectStore
    ambiguous = False
    last: BaseException | None = None
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            await obs.put_async(inner, key, data, mode="create", use_multipart=False)
        except oe.AlreadyExistsError:
            return await _resolve_after_exists(store, key, data, ambiguous)
        except oe.PreconditionError:
            # Some servers answer 412 that object_store does not map to AlreadyExists.
            return await _resolve_after_exists(store, key, data, ambiguous)
        except (
            oe.PermissionDeniedError,
            oe.UnauthenticatedError,
            PermissionError,
        ) as exc:
            raise ReadOnlyCacheError(f"server refused creating {key!r}: {_first_line(exc)}") from exc
        except oe.NotSupportedError as exc:
            raise AtomicityError(
                f"the object store does not support conditional PUT (creating {key!r}): {exc}"
            ) from exc
        except (oe.InvalidPathError, oe.UnknownConfigurationKeyError, ValueError):
            raise
        except (oe.BaseError, OSError, TimeoutError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise StorageError(f"bucket missing while creating {key!r}: {exc}") from exc
            msg = str(exc)
            if has_status(msg, 501) or "<Code>NotImplemented</Code>" in msg:  # not a key's "501"
                raise AtomicityError(
                    f"the object store does not support conditional PUT (creating {key!r}): {exc}"
                ) from exc
            last = exc
            ambiguous = True
            await _back_off(key, attempt, exc)
        else:
            return True
    raise _gave_up(key, where, last) from last


async def probe_conditional_put(store: Store, prefix: str) -> bool:
    """Check that the server enforces ``If-None-Match: *`` on PUT.

    Creates a fresh probe key under ``prefix`` twice in create mode: the first
    must succeed and the second must be refused. The probe key is deleted
    afterwards.

    Parameters
    ----------
    store : zarr.abc.store.Store
        A writable store accepted by :func:`create_if_absent`.
    prefix : str
        Key prefix (relative to the store root) to put the probe under, e.g. the
        cache's own directory; ``""`` for the store root.

    Returns
    -------
    bool
        True if the server refused the second create (exclusive creation works);
        False if it silently overwrote, rejected the header as unsupported, or
        claimed a brand-new key already existed.

    Raises
    ------
    ReadOnlyCacheError
        The store is read-only or the server refuses writes.
    StorageError
        The server kept failing.
    """
    _check_writable(store)
    prefix = prefix.strip("/")
    name = f".zarr_skip_probe-{uuid.uuid4().hex}"
    key = f"{prefix}/{name}" if prefix else name
    try:
        try:
            first = await create_if_absent(store, key, b"first")
            if not first:
                logger.warning(
                    "conditional PUT probe: a brand-new key %r was reported existing",
                    key,
                )
                return False
            second = await create_if_absent(store, key, b"second")
        except AtomicityError as exc:
            logger.warning("conditional PUT probe: %s", exc)
            return False
        if second:
            logger.warning(
                "the S3 server ignores 'If-None-Match: *' (a second exclusive create of %r "
                "succeeded): concurrent writers are unsafe on it",
                key,
            )
            return False
        stored = await _stored_bytes(store, key)
        if stored != b"first":
            logger.warning("conditional PUT probe: refused create still changed %r", key)
            return False
        return True
    finally:
        try:
            await store.delete(key)
        except Exception as exc:  # noqa: BLE001 - cleanup only
            logger.warning("could not delete probe key %r: %s", key, exc)
