"""Object storage (S3): ``s3://bucket/prefix`` opened as zarr's ``ObjectStore`` over obstore.

One client stack: ``zarr.storage.ObjectStore`` over ``obstore.store.S3Store`` (Rust
``object_store``; independent of any asyncio loop, picklable). Options are translated from the
s3fs / boto spellings users pass by :mod:`._s3_config`; exclusive creation ("create this key
only if absent and say truthfully whether I did", a conditional ``PUT``) is :mod:`._s3_claims`.

obstore's runtime does not survive ``fork()``: a child forked after its parent used it hangs on
its first request. :class:`ForkCheckedObjectStore` raises a :class:`~zarr_skip.errors.StorageError`
instead; the check sits in one place, the ``store`` attribute through which every request of
zarr's ``ObjectStore`` (and of :mod:`._s3_claims`) reaches obstore.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pickle
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any, cast

from zarr.storage import ObjectStore

from zarr_skip.errors import ConfigError, MissingExtraError, StorageAccessError, StorageError
from zarr_skip.store._s3_config import (
    S3Location,
    _BotocoreCredentials,
    _wants_botocore,
    is_s3_url,
    parse_s3_url,
    s3_config_from_storage_options,
)
from zarr_skip.store._s3_errors import MISSING_EXTRA

if TYPE_CHECKING:
    from obstore.store import S3Config, S3Store

logger = logging.getLogger(__name__)

__all__ = [
    "ForkCheckedObjectStore",
    "S3Location",
    "is_s3_url",
    "open_s3_store",
    "parse_s3_url",
    "s3_config_from_storage_options",
]


# ------------------------------------------------------------------ fork guard

#: Process id in which an obstore-backed store of ours was first used (None: not yet).
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


class ForkCheckedObjectStore(ObjectStore["S3Store"]):
    """``zarr.storage.ObjectStore`` that fails fast in a forked child.

    Every request reaches obstore through the ``store`` attribute, which checks first that this
    process was not ``fork()``ed after its parent used obstore (it would hang) and raises
    :class:`~zarr_skip.errors.StorageError` if it was. Otherwise an ``ObjectStore`` (and an
    instance of it) that pickles for ``spawn`` workers and lists an emptied directory.
    """

    _inner: S3Store

    @property
    def store(self) -> S3Store:
        """The obstore store, once this process is known to be safe to use it from."""
        _obstore_guard()
        return self._inner

    @store.setter
    def store(self, value: S3Store) -> None:
        self._inner = value

    def __str__(self) -> str:
        return f"object_store://{self._inner}"  # a name, not a request: no fork check

    def __getstate__(self) -> dict[Any, Any]:
        state = self.__dict__.copy()
        state["_inner"] = pickle.dumps(self._inner)
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        self.__dict__.update(state, _inner=pickle.loads(state["_inner"]))

    def list_dir(self, prefix: str) -> AsyncGenerator[str, None]:
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


# ---------------------------------------------------------------------- opening


def open_s3_store(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    read_only: bool = False,
) -> ForkCheckedObjectStore:
    """Open ``s3://bucket/prefix`` as a Zarr store rooted at the prefix.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix`` (``s3a://`` also accepted).
    storage_options : mapping, optional
        Connection settings, s3fs-style (``key``, ``secret``, ``token``, ``endpoint_url``,
        ``client_kwargs={"region_name": ..., "endpoint_url": ...}``, ``anon``, ``profile``) or
        boto-style (``aws_access_key_id``, ...), or obstore ``S3Config`` keys (see
        :func:`~zarr_skip.store._s3_config.s3_config_from_storage_options`). Missing settings
        come from the environment (``AWS_*`` variables) and, for profiles, from ``~/.aws``. An
        ``http://`` endpoint enables plain HTTP; a custom endpoint defaults to path-style
        addressing.
    read_only : bool
        Open the store read-only (zarr refuses writes through it).

    Returns
    -------
    ForkCheckedObjectStore
        A ``zarr.storage.ObjectStore``; keys are relative to the prefix.

    Raises
    ------
    ConfigError
        Bad URL, an option that is unknown or conflicts with another, or obstore (the ``s3``
        extra) not installed.
    StorageAccessError
        A custom endpoint with no credentials anywhere (and not ``anon=True``).
    """
    loc = parse_s3_url(url)
    try:
        from obstore.store import S3Store
    except ImportError as exc:
        raise MissingExtraError(f"{url}: s3:// locations need the S3 client: {MISSING_EXTRA}") from exc
    config, extra, profile = s3_config_from_storage_options(storage_options)
    provider = _credential_provider(config, profile)
    if "region" not in config and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        config.setdefault("region", "us-east-1")
    endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and not provider and not _has_credentials(config):
        # obstore would ask the cloud's instance-metadata address (169.254.169.254) for
        # credentials, which a server at an endpoint the user named never needs
        raise StorageAccessError(
            f"s3://{loc.fsspec_path} at {endpoint}: no credentials: give key and secret in "
            "storage_options (or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or an AWS profile), "
            "or anon=True for a public bucket"
        )
    key = None if provider else _settings_key(loc, config, extra)
    inner = _MADE.get(key) if key is not None else None
    if inner is None:
        try:
            inner = S3Store(loc.bucket, prefix=loc.prefix or None, config=cast("S3Config", config), **extra, **provider)
        except Exception as exc:
            raise ConfigError(f"cannot configure S3 store for s3://{loc.fsspec_path}: {exc}") from exc
        if key is not None:
            _MADE.put(key, inner)
    logger.debug("opened obstore S3Store for s3://%s (read_only=%s)", loc.fsspec_path, read_only)
    return ForkCheckedObjectStore(inner, read_only=read_only)


def _settings_key(loc: S3Location, config: Mapping[str, Any], extra: Mapping[str, Any]) -> str | None:
    """What makes an S3 store: its bucket, prefix, settings and the ``AWS_*`` environment it
    reads, as text; None when a setting is not plain data (such as a credential provider of
    the caller's): such a store is never shared. (Stores of an AWS profile are not shared
    either: the caller leaves ``provider`` out.)"""
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    try:
        return json.dumps([loc.bucket, loc.prefix, config, extra, env], sort_keys=True)
    except (TypeError, ValueError):
        return None


class _MadeStores:
    """The S3 stores this process made, by their settings (at most :data:`MADE_STORES`):
    making one costs ~9 ms of CPU (its HTTP client), and a cache opened again on the same
    settings reuses it with its open connections. Forgotten in a forked child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: OrderedDict[str, S3Store] = OrderedDict()
        self._pid = os.getpid()

    def get(self, key: str) -> S3Store | None:
        with self._lock:
            if self._pid != os.getpid():
                self._stores.clear()
                self._pid = os.getpid()
            found = self._stores.get(key)
            if found is not None:
                self._stores.move_to_end(key)
            return found

    def put(self, key: str, store: S3Store) -> None:
        with self._lock:
            self._stores[key] = store
            while len(self._stores) > MADE_STORES:
                self._stores.popitem(last=False)


#: S3 stores kept for reuse in one process (the least recently opened forgotten first)
MADE_STORES = 16
_MADE = _MadeStores()


def _credential_provider(config: dict[str, Any], profile: str | None) -> dict[str, Any]:
    """``{"credential_provider": ...}`` backed by botocore for a named AWS profile (or the
    ``~/.aws`` files), filling ``config``'s region from it; ``{}`` when obstore finds the
    credentials itself."""
    if not _wants_botocore(config, profile):
        return {}
    if importlib.util.find_spec("botocore") is None:
        if profile:
            raise ConfigError(f"storage_options profile={profile!r}: AWS profiles need botocore: {MISSING_EXTRA}")
        return {}
    provider = _BotocoreCredentials(profile)
    if not provider.available():
        if profile:
            raise ConfigError(f"storage_options profile={profile!r}: no AWS credentials found for it")
        return {}
    if "region" not in config and not os.environ.get("AWS_REGION"):
        region = provider.region()
        if region:
            config["region"] = region
    return {"credential_provider": provider}


#: environment variables through which obstore finds credentials without asking the instance
_CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _has_credentials(config: Mapping[str, Any]) -> bool:
    """Whether obstore gets credentials without probing the instance-metadata address: given,
    unsigned, from the environment, or a metadata endpoint the user chose."""
    keys = ("access_key_id", "skip_signature", "metadata_endpoint", "web_identity_token_file", "role_arn")
    if any(config.get(k) for k in keys) or any(k.startswith("container_") for k in config):
        return True
    if any(os.environ.get(k) for k in _CREDENTIAL_ENV) or os.environ.get("AWS_EC2_METADATA_DISABLED") == "false":
        return True
    return bool(os.environ.get("AWS_METADATA_ENDPOINT"))
