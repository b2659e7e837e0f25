"""Object storage (S3) support: opening a Zarr store (exclusive creation: :mod:`._s3_claims`).

Two store flavours are understood:

* ``zarr.storage.ObjectStore`` over ``obstore.store.S3Store`` (the default of
  :func:`open_s3_store`): Rust ``object_store`` client, independent of any asyncio
  loop, picklable, 2-3x lower per-request latency than s3fs against a local server.
* ``zarr.storage.FsspecStore`` over ``s3fs.S3FileSystem(asynchronous=True)``
  (``backend="fsspec"``, or a store the caller built).

The one primitive the cache needs from a backend is "create this key only if it is
absent and tell me truthfully whether I created it": :func:`create_if_absent`. On S3
it is a conditional ``PUT`` with ``If-None-Match: *``. Some S3 look-alikes silently
ignore that header, so :func:`probe_conditional_put` checks the server once.

zarr's own ``FsspecStore.set_if_not_exists`` is exists-then-set (racy) and
``ObjectStore.set_if_not_exists`` swallows the "already exists" answer, so neither
can tell a caller whether it won.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any, Literal, cast

from zarr.storage import ObjectStore

from zarr_skip.errors import ConfigError, MissingExtraError, StorageAccessError, StorageError
from zarr_skip.store._s3_config import (  # noqa: F401  re-exported
    S3Location,
    _BotocoreCredentials,
    _wants_botocore,
    is_s3_url,
    parse_s3_url,
    s3_config_from_storage_options,
)
from zarr_skip.store._s3_errors import MISSING_EXTRA

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Iterable

    from obstore.store import S3Config
    from zarr.abc.store import ByteRequest, Store
    from zarr.core.buffer import Buffer, BufferPrototype

logger = logging.getLogger(__name__)

__all__ = [
    "Backend",
    "ForkCheckedObjectStore",
    "S3Location",
    "aclose_store",
    "is_s3_url",
    "open_s3_store",
    "parse_s3_url",
    "s3_config_from_storage_options",
]

Backend = Literal["auto", "obstore", "fsspec"]

#: Attempts of one conditional PUT on errors that may be transient (5xx, 409
#: ConditionalRequestConflict, connection resets). The clients retry connection
#: failures themselves (obstore: 10 times), so this stays small.
_CREATE_ATTEMPTS = 3
_CREATE_BACKOFF = 0.2


# ------------------------------------------------------------------ fork guard

#: Process id in which an obstore-backed store of ours was first used (None: not yet).
#: obstore's Rust (tokio) runtime does not survive ``fork()``: any obstore call in a
#: child forked after the parent used obstore hangs for ever, even on a fresh store.
_OBSTORE_PID: int | None = None


def _obstore_guard() -> None:
    """Raise instead of hanging when obstore is used in a forked child."""
    global _OBSTORE_PID
    pid = os.getpid()
    if _OBSTORE_PID is None:
        _OBSTORE_PID = pid
    elif _OBSTORE_PID != pid:
        raise StorageError(
            "this process was fork()ed after its parent used the S3 client (obstore), whose "
            "runtime does not survive fork() and would hang: start worker processes with the "
            "'spawn' or 'forkserver' method, or open the cache only in the child"
        )


class ForkCheckedObjectStore(ObjectStore):
    """``zarr.storage.ObjectStore`` that fails fast in a forked child.

    obstore hangs when used in a process ``fork()``ed after the parent used it;
    every I/O method here first checks for that and raises
    :class:`~zarr_skip.errors.StorageError` instead. Otherwise identical to
    ``ObjectStore`` (and an instance of it); pickles for ``spawn`` workers.
    """

    async def get(
        self,
        key: str,
        prototype: BufferPrototype,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        _obstore_guard()
        return await super().get(key, prototype, byte_range)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        _obstore_guard()
        return await super().get_partial_values(prototype, key_ranges)

    async def exists(self, key: str) -> bool:
        _obstore_guard()
        return await super().exists(key)

    async def set(self, key: str, value: Buffer) -> None:
        _obstore_guard()
        await super().set(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        _obstore_guard()
        await super().set_if_not_exists(key, value)

    async def delete(self, key: str) -> None:
        _obstore_guard()
        await super().delete(key)

    async def delete_dir(self, prefix: str) -> None:
        _obstore_guard()
        await super().delete_dir(prefix)

    def list(self) -> AsyncGenerator[str, None]:
        _obstore_guard()
        return super().list()

    def list_prefix(self, prefix: str) -> AsyncGenerator[str, None]:
        _obstore_guard()
        return super().list_prefix(prefix)

    def list_dir(self, prefix: str) -> AsyncGenerator[str, None]:
        _obstore_guard()
        return self._list_dir(prefix)

    async def _list_dir(self, prefix: str) -> AsyncGenerator[str, None]:
        """Names below ``prefix``; unlike zarr's, survives a listing that names the prefix itself.

        SeaweedFS lists an emptied directory (and S3 "folder" markers list themselves) as an
        object with the directory's own name, which zarr's ``list_dir`` rejects.
        """
        import obstore as obs

        prefix = prefix.rstrip("/")
        res = await obs.list_with_delimiter_async(self.store, prefix or None)
        for path in chain(res["common_prefixes"], (o["path"] for o in res["objects"])):
            path = path.rstrip("/")
            if path == prefix:
                continue
            yield path.removeprefix(prefix + "/") if prefix else path

    async def getsize(self, key: str) -> int:
        _obstore_guard()
        return await super().getsize(key)

    async def getsize_prefix(self, prefix: str) -> int:
        _obstore_guard()
        return await super().getsize_prefix(prefix)


# ---------------------------------------------------------------------- opening


def open_s3_store(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    read_only: bool = False,
    *,
    backend: Backend = "auto",
) -> Store:
    """Open ``s3://bucket/prefix`` as a Zarr store rooted at the prefix.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix`` (``s3a://`` also accepted).
    storage_options : mapping, optional
        Connection settings, s3fs-style (``key``, ``secret``, ``token``,
        ``endpoint_url``, ``client_kwargs={"region_name": ..., "endpoint_url": ...}``,
        ``anon``, ``profile``) or boto-style (``aws_access_key_id``, ...), or
        obstore ``S3Config`` keys. Missing settings come from the environment
        (``AWS_*`` variables) and, for profiles, from ``~/.aws``. An ``http://``
        endpoint enables plain HTTP; a custom endpoint defaults to path-style
        addressing.
    read_only : bool
        Open the store read-only (zarr refuses writes through it).
    backend : {"auto", "obstore", "fsspec"}
        ``"auto"`` uses obstore when importable, else s3fs.

    Returns
    -------
    zarr.abc.store.Store
        :class:`ForkCheckedObjectStore` (a ``zarr.storage.ObjectStore``; obstore
        backend) or
        ``zarr.storage.FsspecStore`` over an asynchronous ``s3fs.S3FileSystem``.
        Keys are relative to the prefix for both. Both work with
        :func:`create_if_absent` and :func:`probe_conditional_put`.

    Raises
    ------
    ConfigError
        Bad URL, conflicting options, or the requested backend is not installed.
    """
    loc = parse_s3_url(url)
    if backend not in ("auto", "obstore", "fsspec"):
        raise ConfigError(f"backend must be 'auto', 'obstore' or 'fsspec', not {backend!r}")
    if backend == "auto":
        try:
            import obstore  # noqa: F401
        except ImportError:
            backend = "fsspec"
        else:
            backend = "obstore"
        if backend == "fsspec":
            try:
                import s3fs  # noqa: F401
            except ImportError:
                raise MissingExtraError(f"{url}: s3:// locations need the S3 client: {MISSING_EXTRA}") from None
    if backend == "obstore":
        return _open_obstore(loc, storage_options, read_only)
    return _open_fsspec(loc, storage_options, read_only)


def _open_obstore(loc: S3Location, storage_options: Mapping[str, Any] | None, read_only: bool) -> Store:
    try:
        from obstore.store import S3Store
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(f"the obstore backend needs the S3 client: {MISSING_EXTRA}") from exc
    config, extra, profile = s3_config_from_storage_options(storage_options)
    kwargs: dict[str, Any] = {}
    if _wants_botocore(config, profile):
        try:
            provider = _BotocoreCredentials(profile)
            if provider.available():
                kwargs["credential_provider"] = provider
                if "region" not in config and not os.environ.get("AWS_REGION"):
                    region = provider.region()
                    if region:
                        config["region"] = region
            elif profile:
                raise ConfigError(f"no AWS credentials found for profile {profile!r}")
        except ImportError:
            if profile:
                raise ConfigError("AWS profiles need botocore ('pip install botocore')") from None
    if "region" not in config and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        config.setdefault("region", "us-east-1")
    endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and not kwargs and not _has_credentials(config):
        # obstore would ask the cloud's instance-metadata address (169.254.169.254) for
        # credentials, which a server at an endpoint the user named never needs
        raise StorageAccessError(
            f"s3://{loc.fsspec_path} at {endpoint}: no credentials: give key and secret in "
            "storage_options (or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or an AWS profile), "
            "or anon=True for a public bucket"
        )
    try:
        inner = S3Store(
            loc.bucket,
            prefix=loc.prefix or None,
            config=cast("S3Config", config),
            **extra,
            **kwargs,
        )
    except Exception as exc:
        raise ConfigError(f"cannot configure S3 store for s3://{loc.fsspec_path}: {exc}") from exc
    logger.debug("opened obstore S3Store for s3://%s (read_only=%s)", loc.fsspec_path, read_only)
    return ForkCheckedObjectStore(inner, read_only=read_only)


#: environment variables through which obstore finds credentials without asking the instance
_CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _has_credentials(config: dict[str, Any]) -> bool:
    """Whether obstore gets credentials without probing the instance-metadata address: given,
    unsigned, from the environment, or a metadata endpoint the user chose."""
    keys = ("access_key_id", "skip_signature", "metadata_endpoint", "web_identity_token_file", "role_arn")
    if any(config.get(k) for k in keys) or any(k.startswith("container_") for k in config):
        return True
    if any(os.environ.get(k) for k in _CREDENTIAL_ENV) or os.environ.get("AWS_EC2_METADATA_DISABLED") == "false":
        return True
    return bool(os.environ.get("AWS_METADATA_ENDPOINT"))


def _open_fsspec(loc: S3Location, storage_options: Mapping[str, Any] | None, read_only: bool) -> Store:
    try:
        import s3fs
        from zarr.storage import FsspecStore
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(f"the fsspec backend needs the S3 client: {MISSING_EXTRA}") from exc
    opts = dict(storage_options or {})
    # Map boto/obstore-style names to s3fs's.
    renames = {
        "aws_access_key_id": "key",
        "access_key_id": "key",
        "aws_secret_access_key": "secret",
        "secret_access_key": "secret",
        "aws_session_token": "token",
        "session_token": "token",
        "endpoint": "endpoint_url",
    }
    for old, new in renames.items():
        if old in opts:
            value = opts.pop(old)
            if new in opts and opts[new] != value:
                raise ConfigError(f"storage_options give both {old!r} and {new!r}")
            opts[new] = value
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    for name in ("region", "region_name"):
        if name in opts:
            client_kwargs.setdefault("region_name", opts.pop(name))
    if client_kwargs:
        opts["client_kwargs"] = client_kwargs
    if opts.get("endpoint_url") or client_kwargs.get("endpoint_url"):
        cfg = dict(opts.pop("config_kwargs", None) or {})
        s3cfg = dict(cfg.get("s3") or {})
        s3cfg.setdefault("addressing_style", "path")
        cfg["s3"] = s3cfg
        opts["config_kwargs"] = cfg
    opts["asynchronous"] = True
    opts.setdefault("skip_instance_cache", True)
    try:
        fs = s3fs.S3FileSystem(**opts)
    except Exception as exc:
        raise ConfigError(f"cannot configure s3fs for s3://{loc.fsspec_path}: {exc}") from exc
    logger.debug("opened s3fs FsspecStore for s3://%s (read_only=%s)", loc.fsspec_path, read_only)
    return FsspecStore(fs, path=loc.fsspec_path, read_only=read_only)


async def aclose_store(store: Store) -> None:
    """Release the network resources of a store from :func:`open_s3_store`.

    ``FsspecStore`` over an asynchronous s3fs keeps an aiohttp session that must be
    closed on the event loop it was used on (zarr's loop: call this through
    ``zarr.core.sync.sync``), or Python warns "Unclosed client session" at exit.
    ObjectStore needs nothing. Also closes the zarr store. Safe to call twice.

    Parameters
    ----------
    store : zarr.abc.store.Store
        Any store; only s3fs-backed ones have something to release.
    """
    fs = getattr(store, "fs", None)
    if fs is not None and type(fs).__module__.split(".")[0] == "s3fs":
        client = getattr(fs, "_s3", None)
        if client is not None:
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                logger.debug("closing s3fs client failed: %s", exc)
            fs._s3 = None
    try:
        store.close()
    except Exception as exc:  # noqa: BLE001
        logger.debug("closing store failed: %s", exc)
