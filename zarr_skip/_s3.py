"""Object storage (S3) support: opening a Zarr store and exclusive key creation.

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

import asyncio
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urlsplit

from zarr.storage import ObjectStore

from .errors import AtomicityError, ConfigError, ReadOnlyCacheError, StorageError

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
    "create_if_absent",
    "is_s3_url",
    "open_s3_store",
    "parse_s3_url",
    "probe_conditional_put",
    "s3_config_from_storage_options",
]

Backend = Literal["auto", "obstore", "fsspec"]

#: Keys ``obstore.store.S3Config`` accepts (passed through unchanged when given).
_OBSTORE_S3_KEYS = frozenset(
    {
        "access_key_id",
        "aws_endpoint_url_s3",
        "checksum_algorithm",
        "conditional_put",
        "container_credentials_relative_uri",
        "container_credentials_full_uri",
        "container_authorization_token_file",
        "copy_if_not_exists",
        "default_region",
        "disable_tagging",
        "disable_bulk_delete",
        "endpoint",
        "imdsv1_fallback",
        "metadata_endpoint",
        "region",
        "request_payer",
        "role_arn",
        "role_session_name",
        "s3_express",
        "secret_access_key",
        "server_side_encryption",
        "session_token",
        "skip_signature",
        "sse_bucket_key_enabled",
        "sse_customer_key_base64",
        "sse_kms_key_id",
        "sts_endpoint",
        "unsigned_payload",
        "virtual_hosted_style_request",
        "web_identity_token_file",
    }
)

#: Aliases (s3fs, boto3, environment-variable style) -> S3Config key.
_ALIASES: dict[str, str] = {
    "key": "access_key_id",
    "access_key": "access_key_id",
    "aws_access_key_id": "access_key_id",
    "secret": "secret_access_key",
    "secret_key": "secret_access_key",
    "aws_secret_access_key": "secret_access_key",
    "token": "session_token",
    "aws_session_token": "session_token",
    "endpoint_url": "endpoint",
    "aws_endpoint_url": "endpoint",
    "aws_endpoint": "endpoint",
    "region_name": "region",
    "aws_region": "region",
    "aws_default_region": "default_region",
    "requester_pays": "request_payer",
}

#: s3fs options with no obstore meaning that are dropped silently.
_IGNORED_FSSPEC_KEYS = frozenset(
    {
        "asynchronous",
        "loop",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "skip_instance_cache",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "version_aware",
        "cache_regions",
        "max_concurrency",
        "fixed_upload_size",
        "s3_additional_kwargs",
        "session",
        "username",
        "password",
        "use_ssl",
        "retries",
    }
)

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


class ForkCheckedObjectStore(ObjectStore):  # type: ignore[type-arg]
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
        return super().list_dir(prefix)

    async def getsize(self, key: str) -> int:
        _obstore_guard()
        return await super().getsize(key)

    async def getsize_prefix(self, prefix: str) -> int:
        _obstore_guard()
        return await super().getsize_prefix(prefix)


# --------------------------------------------------------------------------- URLs


@dataclass(frozen=True)
class S3Location:
    """A parsed ``s3://bucket/prefix`` URL.

    Attributes
    ----------
    bucket : str
        Bucket name.
    prefix : str
        Key prefix inside the bucket, without leading or trailing ``/``
        (empty for the bucket root).
    """

    bucket: str
    prefix: str

    @property
    def fsspec_path(self) -> str:
        """``bucket/prefix`` as s3fs spells paths."""
        return f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket


def is_s3_url(location: object) -> bool:
    """Whether ``location`` is a string naming an S3 URL (``s3://`` or ``s3a://``).

    Parameters
    ----------
    location : object
        Anything; only strings can be S3 URLs.

    Returns
    -------
    bool
    """
    return isinstance(location, str) and location.lower().startswith(
        ("s3://", "s3a://")
    )


def parse_s3_url(url: str) -> S3Location:
    """Split ``s3://bucket/some/prefix`` into bucket and prefix.

    Parameters
    ----------
    url : str
        ``s3://`` or ``s3a://`` URL. Redundant slashes in the prefix are removed.

    Returns
    -------
    S3Location

    Raises
    ------
    ConfigError
        Not an S3 URL, no bucket, or a prefix with ``.``/``..`` segments, a query
        or a fragment.
    """
    if not is_s3_url(url):
        raise ConfigError(f"not an s3:// URL: {url!r}")
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ConfigError(f"S3 URL must not have a query or fragment: {url!r}")
    bucket = parts.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise ConfigError(
            f"S3 URL needs a plain bucket name (s3://bucket/prefix): {url!r}"
        )
    segments = [s for s in parts.path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ConfigError(f"S3 prefix must not contain '.' or '..' segments: {url!r}")
    return S3Location(bucket, "/".join(segments))


# ---------------------------------------------------------------- storage options


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def s3_config_from_storage_options(
    storage_options: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """Translate s3fs/boto-style storage options into obstore ``S3Store`` arguments.

    Accepted (besides every ``obstore.store.S3Config`` key, passed through):
    ``key``/``aws_access_key_id``, ``secret``/``aws_secret_access_key``,
    ``token``/``aws_session_token``, ``endpoint_url``, ``region``/``region_name``,
    ``anon``, ``profile``, ``requester_pays``, ``client_kwargs`` (``endpoint_url``,
    ``region_name``, ``aws_access_key_id``, ...), ``config_kwargs``
    (``{"s3": {"addressing_style": "path"|"virtual"}}``), ``client_options`` and
    ``retry_config`` (obstore's, passed through).

    Parameters
    ----------
    storage_options : mapping or None
        Options as a user would give them to s3fs.

    Returns
    -------
    config : dict
        ``S3Config`` keyword arguments.
    extra : dict
        ``client_options`` / ``retry_config`` keyword arguments for ``S3Store``.
    profile : str or None
        AWS profile name to read credentials from, if one was named.

    Raises
    ------
    ConfigError
        Conflicting values for one setting.
    """
    opts = dict(storage_options or {})
    config: dict[str, Any] = {}
    extra: dict[str, Any] = {}

    def put(name: str, value: Any, origin: str) -> None:
        if value is None:
            return
        if name in config and config[name] != value:
            raise ConfigError(
                f"storage_options give two values for {name!r} (second from {origin!r})"
            )
        config[name] = value

    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    config_kwargs = dict(opts.pop("config_kwargs", None) or {})
    profile = opts.pop("profile", None) or opts.pop("profile_name", None)
    anon = opts.pop("anon", None)
    for name in ("client_options", "retry_config"):
        if name in opts:
            extra[name] = dict(opts.pop(name) or {})

    for source, origin in ((opts, "storage_options"), (client_kwargs, "client_kwargs")):
        for raw_key, value in source.items():
            key = raw_key.lower()
            name = _ALIASES.get(key, key)
            if name in _OBSTORE_S3_KEYS:
                put(name, value, f"{origin}.{raw_key}")
            elif raw_key in _IGNORED_FSSPEC_KEYS or origin == "client_kwargs":
                logger.debug(
                    "storage option %s.%s has no obstore meaning; ignored",
                    origin,
                    raw_key,
                )
            else:
                logger.warning("unknown S3 storage option %r ignored", raw_key)

    if anon is not None and _truthy(anon):
        config["skip_signature"] = True
    style = ((config_kwargs.get("s3") or {}).get("addressing_style") or "").lower()
    if style == "virtual":
        config.setdefault("virtual_hosted_style_request", True)
    elif style == "path":
        config.setdefault("virtual_hosted_style_request", False)
    for key in ("request_payer", "skip_signature", "virtual_hosted_style_request"):
        if key in config and isinstance(config[key], str):
            config[key] = _truthy(config[key])

    endpoint = (
        config.get("endpoint")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    if endpoint and str(endpoint).lower().startswith("http://"):
        extra.setdefault("client_options", {}).setdefault("allow_http", True)
    if "endpoint" in config and "virtual_hosted_style_request" not in config:
        # Custom endpoints (MinIO, SeaweedFS, Ceph, ...) are nearly always path-style.
        config["virtual_hosted_style_request"] = False
    return config, extra, profile


class _BotocoreCredentials:
    """obstore credential provider backed by botocore's credential chain.

    Used for named AWS profiles (SSO, ``credential_process``, ``~/.aws/credentials``),
    which obstore cannot read on its own. Picklable: the botocore session is made
    lazily in each process.

    Parameters
    ----------
    profile : str or None
        AWS profile; None for botocore's default chain.
    ttl : float
        Seconds each handed-out credential is declared valid.
    """

    def __init__(self, profile: str | None, ttl: float = 900.0) -> None:
        self.profile = profile
        self.ttl = ttl
        self._creds: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"profile": self.profile, "ttl": self.ttl}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.profile = state["profile"]
        self.ttl = state["ttl"]
        self._creds = None

    def _session(self) -> Any:
        import botocore.session

        return botocore.session.Session(profile=self.profile)

    def region(self) -> str | None:
        """Region configured for the profile, if any."""
        try:
            return self._session().get_config_variable("region")
        except Exception:  # noqa: BLE001 - region is only a default
            return None

    def available(self) -> bool:
        """Whether botocore finds credentials for the profile."""
        try:
            self._creds = self._session().get_credentials()
        except Exception as exc:  # noqa: BLE001
            logger.debug("botocore credential lookup failed: %s", exc)
            self._creds = None
        return self._creds is not None

    def __call__(self) -> dict[str, Any]:
        if self._creds is None and not self.available():
            raise PermissionError(
                f"no AWS credentials found for profile {self.profile!r}"
            )
        frozen = self._creds.get_frozen_credentials()
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + timedelta(seconds=self.ttl),
        }


def _wants_botocore(config: Mapping[str, Any], profile: str | None) -> bool:
    if profile:
        return True
    if "access_key_id" in config or config.get("skip_signature"):
        return False
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get(
        "AWS_WEB_IDENTITY_TOKEN_FILE"
    ):
        return False  # obstore reads these itself
    if os.environ.get("AWS_PROFILE"):
        return True
    home = Path(os.environ.get("HOME", "~")).expanduser()
    files = [
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials",
        os.environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config",
    ]
    return any(Path(f).is_file() for f in files)


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
        raise ConfigError(
            f"backend must be 'auto', 'obstore' or 'fsspec', not {backend!r}"
        )
    if backend == "auto":
        try:
            import obstore  # noqa: F401
        except ImportError:
            backend = "fsspec"
        else:
            backend = "obstore"
    if backend == "obstore":
        return _open_obstore(loc, storage_options, read_only)
    return _open_fsspec(loc, storage_options, read_only)


def _open_obstore(
    loc: S3Location, storage_options: Mapping[str, Any] | None, read_only: bool
) -> Store:
    try:
        from obstore.store import S3Store
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("the obstore backend needs 'pip install obstore'") from exc
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
                raise ConfigError(
                    "AWS profiles need botocore ('pip install botocore')"
                ) from None
    if "region" not in config and not (
        os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    ):
        config.setdefault("region", "us-east-1")
    try:
        inner = S3Store(
            loc.bucket,
            prefix=loc.prefix or None,
            config=cast("S3Config", config),
            **extra,
            **kwargs,
        )
    except Exception as exc:
        raise ConfigError(
            f"cannot configure S3 store for s3://{loc.fsspec_path}: {exc}"
        ) from exc
    logger.debug(
        "opened obstore S3Store for s3://%s (read_only=%s)", loc.fsspec_path, read_only
    )
    return ForkCheckedObjectStore(inner, read_only=read_only)


def _open_fsspec(
    loc: S3Location, storage_options: Mapping[str, Any] | None, read_only: bool
) -> Store:
    try:
        import s3fs
        from zarr.storage import FsspecStore
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("the fsspec backend needs 'pip install s3fs'") from exc
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
        raise ConfigError(
            f"cannot configure s3fs for s3://{loc.fsspec_path}: {exc}"
        ) from exc
    logger.debug(
        "opened s3fs FsspecStore for s3://%s (read_only=%s)", loc.fsspec_path, read_only
    )
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


# -------------------------------------------------------------- exclusive create


def _first_line(exc: BaseException | None) -> str:
    """First line of an exception message (obstore appends a long debug dump)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
    raise TypeError(
        f"create_if_absent supports zarr ObjectStore and FsspecStore over s3fs, not {store!r}"
    )


async def _resolve_after_exists(
    store: Store, key: str, data: bytes, ambiguous: bool
) -> bool:
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
            raise ReadOnlyCacheError(
                f"server refused creating {key!r}: {_first_line(exc)}"
            ) from exc
        except oe.NotSupportedError as exc:
            raise AtomicityError(
                f"the object store does not support conditional PUT (creating {key!r}): {exc}"
            ) from exc
        except (oe.InvalidPathError, oe.UnknownConfigurationKeyError, ValueError):
            raise
        except (oe.BaseError, OSError, TimeoutError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise StorageError(
                    f"bucket missing while creating {key!r}: {exc}"
                ) from exc
            msg = str(exc)
            if "501" in msg or "NotImplemented" in msg:
                raise AtomicityError(
                    f"the object store does not support conditional PUT (creating {key!r}): {exc}"
                ) from exc
            last = exc
            ambiguous = True
            logger.warning(
                "conditional PUT of %r failed (attempt %d/%d): %s",
                key,
                attempt + 1,
                _CREATE_ATTEMPTS,
                _first_line(exc),
            )
            await asyncio.sleep(_CREATE_BACKOFF * 2**attempt)
        else:
            return True
    raise StorageError(
        f"conditional PUT of {key!r} kept failing: {_first_line(last)}"
    ) from last


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


async def _create_s3fs(
    store: Store, fs: Any, bucket: str, s3key: str, data: bytes, *, key: str
) -> bool:
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
            await client.put_object(
                Bucket=bucket, Key=s3key, Body=data, IfNoneMatch="*"
            )
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
                raise ReadOnlyCacheError(
                    f"server refused creating {key!r}: {_first_line(exc)}"
                ) from exc
            if code == "NotImplemented" or status == 501:
                raise AtomicityError(
                    f"the object store does not support conditional PUT (creating {key!r}): {exc}"
                ) from exc
            if code == "NoSuchBucket":
                raise StorageError(
                    f"bucket {bucket!r} missing while creating {key!r}"
                ) from exc
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
        logger.warning(
            "conditional PUT of %r failed (attempt %d/%d): %s",
            key,
            attempt + 1,
            _CREATE_ATTEMPTS,
            _first_line(last),
        )
        await asyncio.sleep(_CREATE_BACKOFF * 2**attempt)
    raise StorageError(
        f"conditional PUT of {key!r} kept failing: {_first_line(last)}"
    ) from last


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
            logger.warning(
                "conditional PUT probe: refused create still changed %r", key
            )
            return False
        return True
    finally:
        try:
            await store.delete(key)
        except Exception as exc:  # noqa: BLE001 - cleanup only
            logger.warning("could not delete probe key %r: %s", key, exc)
