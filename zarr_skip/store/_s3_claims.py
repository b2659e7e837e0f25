"""Exclusive key creation on S3: the one primitive the cache's claims need from object storage.

On S3 it is a conditional ``PUT`` with ``If-None-Match: *`` (:func:`create_if_absent`). Some
S3 look-alikes silently ignore that header; :func:`probe_conditional_put` checks a server once.
zarr's own ``FsspecStore.set_if_not_exists`` is exists-then-set (racy) and
``ObjectStore.set_if_not_exists`` swallows the "already exists" answer, so neither can tell a
caller whether it won.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zarr.storage import ObjectStore

from zarr_skip.errors import AtomicityError, ReadOnlyCacheError, StorageError
from zarr_skip.store._s3 import _CREATE_ATTEMPTS, _CREATE_BACKOFF, _obstore_guard

if TYPE_CHECKING:
    from zarr.abc.store import Store

logger = logging.getLogger(__name__)

__all__ = ["create_if_absent", "probe_conditional_put"]


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


def _gave_up(key: str, last: BaseException | None) -> StorageError:
    """The error once every attempt to create ``key`` failed."""
    return StorageError(f"conditional PUT of {key!r} kept failing: {_first_line(last)}")


def _check_writable(store: Store) -> None:
    if getattr(store, "read_only", False):
        raise ReadOnlyCacheError(f"store {store} is read-only")


def _fsspec_s3_target(store: Store, key: str) -> tuple[Any, str, str] | None:
    """(s3fs filesystem, bucket, full key) when ``store`` is an FsspecStore over s3fs."""
    fs = getattr(store, "fs", None)
    if fs is None or type(fs).__module__.split(".")[0] != "s3fs":
        return None
    path = str(getattr(store, "path", "")).strip("/")
    full = f"{path}/{key}" if path else key
    bucket, _, rest = full.partition("/")
    if not rest:
        raise ValueError(f"key {key!r} resolves to a bucket, not an object")
    return fs, bucket, rest


async def _stored_bytes(store: Store, key: str) -> bytes | None:
    from zarr.core.buffer import default_buffer_prototype

    buf = await store.get(key, default_buffer_prototype())
    return None if buf is None else buf.to_bytes()


async def create_if_absent(store: Store, key: str, data: bytes) -> bool:
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
        ``zarr.storage.ObjectStore`` (any obstore backend) or
        ``zarr.storage.FsspecStore`` over s3fs, e.g. from :func:`open_s3_store`.
    key : str
        Key relative to the store root (``"a/b/zarr.json"``).
    data : bytes
        Content of the new object (sent in a single PUT).

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
    data = bytes(data)
    if isinstance(store, ObjectStore):
        _obstore_guard()
        return await _create_obstore(store, key, data)
    target = _fsspec_s3_target(store, key)
    if target is not None:
        return await _create_s3fs(store, *target, data, key=key)
    raise TypeError(f"create_if_absent supports zarr ObjectStore and FsspecStore over s3fs, not {store!r}")


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


async def _create_obstore(store: Store, key: str, data: bytes) -> bool:
    import obstore as obs
    from obstore import exceptions as oe

    inner = store.store  # type: ignore[attr-defined]
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
            if "501" in msg or "NotImplemented" in msg:
                raise AtomicityError(
                    f"the object store does not support conditional PUT (creating {key!r}): {exc}"
                ) from exc
            last = exc
            ambiguous = True
            await _back_off(key, attempt, exc)
        else:
            return True
    raise _gave_up(key, last) from last


def _client_error_info(exc: BaseException) -> tuple[str, int, int] | None:
    """(error code, HTTP status, botocore retry count) of a botocore ClientError."""
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return None
    err = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    return (
        str(err.get("Code", "")),
        int(meta.get("HTTPStatusCode") or 0),
        int(meta.get("RetryAttempts") or 0),
    )


async def _create_s3fs(store: Store, fs: Any, bucket: str, s3key: str, data: bytes, *, key: str) -> bool:
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - s3fs depends on botocore
        raise TypeError("s3fs without botocore") from None
    await fs.set_session()
    client = await fs.get_s3(bucket)
    ambiguous = False
    last: BaseException | None = None
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            await client.put_object(Bucket=bucket, Key=s3key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            code, status, retries = _client_error_info(exc) or ("", 0, 0)
            # botocore retries 5xx/connection errors by itself; a retried PUT that then
            # sees 412 may be seeing its own first attempt.
            ambiguous = ambiguous or retries > 0
            if code in ("PreconditionFailed", "412") or status == 412:
                fs.invalidate_cache(f"{bucket}/{s3key}")
                return await _resolve_after_exists(store, key, data, ambiguous)
            if (
                code
                in (
                    "AccessDenied",
                    "Forbidden",
                    "InvalidAccessKeyId",
                    "SignatureDoesNotMatch",
                )
                or status == 403
            ):
                raise ReadOnlyCacheError(f"server refused creating {key!r}: {_first_line(exc)}") from exc
            if code == "NotImplemented" or status == 501:
                raise AtomicityError(
                    f"the object store does not support conditional PUT (creating {key!r}): {exc}"
                ) from exc
            if code == "NoSuchBucket":
                raise StorageError(f"bucket {bucket!r} missing while creating {key!r}") from exc
            if (
                status
                and status < 500
                and status not in (409, 429)
                and code
                not in (
                    "ConditionalRequestConflict",
                    "SlowDown",
                    "RequestTimeout",
                )
            ):
                raise StorageError(f"conditional PUT of {key!r} failed: {exc}") from exc
            last = exc
        except (TimeoutError, BotoCoreError, OSError) as exc:
            last = exc
        else:
            fs.invalidate_cache(f"{bucket}/{s3key}")
            return True
        ambiguous = True
        await _back_off(key, attempt, last)
    raise _gave_up(key, last) from last


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
