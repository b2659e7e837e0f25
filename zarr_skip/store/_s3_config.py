"""S3 locations and storage options: parse ``s3://bucket/prefix`` and map s3fs, boto3 and
obstore spellings of credentials and endpoints onto obstore's ``S3Config`` (pure: no I/O)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from zarr_skip.errors import ConfigError

logger = logging.getLogger(__name__)


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
    "username": "access_key_id",  # s3fs's other spelling of key / secret
    "password": "secret_access_key",
}

#: ``s3_additional_kwargs`` (s3fs: extra arguments of every PUT) -> S3Config key
_ADDITIONAL_KWARGS: dict[str, str] = {
    "ServerSideEncryption": "server_side_encryption",
    "SSEKMSKeyId": "sse_kms_key_id",
    "BucketKeyEnabled": "sse_bucket_key_enabled",
    "RequestPayer": "request_payer",
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
        "retries",  # obstore retries by itself: retry_config tunes it
    }
)

#: boto3 client arguments in ``client_kwargs`` with no obstore meaning, dropped silently
_IGNORED_CLIENT_KEYS = frozenset({"api_version", "service_name"})

#: what an unknown option's error lists as understood
_KNOWN = (
    "key, secret, token, endpoint_url, region, anon, profile, requester_pays, use_ssl, "
    "client_kwargs, config_kwargs, s3_additional_kwargs, client_options, retry_config or an "
    "obstore S3Config key"
)


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
    return isinstance(location, str) and location.lower().startswith(("s3://", "s3a://"))


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
        raise ConfigError(f"S3 URL needs a plain bucket name (s3://bucket/prefix): {url!r}")
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
    ``key``/``username``/``aws_access_key_id``, ``secret``/``password``/``aws_secret_access_key``,
    ``token``/``aws_session_token``, ``endpoint_url``, ``region``/``region_name``, ``anon``,
    ``profile``, ``requester_pays``, ``use_ssl`` (False needs an ``http://`` endpoint),
    ``client_kwargs`` (``endpoint_url``, ``region_name``, ``aws_access_key_id``, ...,
    ``verify=False``), ``config_kwargs`` (``{"s3": {"addressing_style": "path"|"virtual"}}``),
    ``s3_additional_kwargs`` (server-side encryption, request payer), ``client_options`` and
    ``retry_config`` (obstore's, passed through); s3fs's caching and tuning options are ignored.

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
        An option with no meaning here (named, with where it was given), or two values for
        one setting.
    """
    opts = dict(storage_options or {})
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    config_kwargs = dict(opts.pop("config_kwargs", None) or {})
    named = opts.pop("profile", None) or opts.pop("profile_name", None)
    profile = None if named is None else str(named)
    anon = opts.pop("anon", None)
    extra: dict[str, Any] = {n: dict(opts.pop(n) or {}) for n in ("client_options", "retry_config") if n in opts}
    config: dict[str, Any] = {}
    _put_additional(config, opts.pop("s3_additional_kwargs", None))
    for origin, source in (("storage_options", opts), ("client_kwargs", client_kwargs)):
        for raw_key, value in source.items():
            _put_option(config, extra, origin, raw_key, value)
    _put_flags(config, anon, config_kwargs)
    _endpoint_defaults(config, extra)
    return config, extra, profile


def _put(config: dict[str, Any], name: str, value: Any, origin: str) -> None:
    """Set S3Config key ``name``, refusing a second, different value for it."""
    if value is None:
        return
    if name in config and config[name] != value:
        raise ConfigError(f"storage_options give two values for {name!r} (the second from {origin!r})")
    config[name] = value


def _put_option(config: dict[str, Any], extra: dict[str, Any], origin: str, raw_key: str, value: Any) -> None:
    """One option of ``origin`` (``storage_options`` or ``client_kwargs``) into ``config``."""
    where = f"{origin}.{raw_key}" if origin == "client_kwargs" else raw_key
    name = _ALIASES.get(raw_key.lower(), raw_key.lower())
    if name in _OBSTORE_S3_KEYS:
        _put(config, name, value, where)
    elif raw_key == "use_ssl":
        if not _truthy(value):
            _put(config, "_no_ssl", True, where)  # checked against the endpoint at the end
    elif raw_key == "verify" and origin == "client_kwargs":
        if isinstance(value, str):
            raise ConfigError(
                f"storage_options {where}={value!r}: a CA bundle path is not supported; install the "
                "certificate in the system store (or SSL_CERT_FILE), or give verify=False"
            )
        if not _truthy(value):
            extra.setdefault("client_options", {}).setdefault("allow_invalid_certificates", True)
    elif raw_key in (_IGNORED_FSSPEC_KEYS if origin == "storage_options" else _IGNORED_CLIENT_KEYS):
        logger.debug("storage option %s has no obstore meaning; ignored", where)
    else:
        raise ConfigError(f"storage_options: unknown S3 option {where!r}; understood: {_KNOWN}")


def _put_additional(config: dict[str, Any], kwargs: Mapping[str, Any] | None) -> None:
    """s3fs's ``s3_additional_kwargs``: the ones obstore applies to every write."""
    for raw_key, value in (kwargs or {}).items():
        name = _ADDITIONAL_KWARGS.get(raw_key)
        if name is None:
            raise ConfigError(
                f"storage_options s3_additional_kwargs.{raw_key}: not supported; understood: "
                f"{', '.join(_ADDITIONAL_KWARGS)}"
            )
        if name == "request_payer":
            value = str(value).lower() == "requester"
        _put(config, name, value, f"s3_additional_kwargs.{raw_key}")


def _put_flags(config: dict[str, Any], anon: Any, config_kwargs: Mapping[str, Any]) -> None:
    """``anon``, the addressing style of ``config_kwargs`` and the boolean keys given as text."""
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


def _endpoint_defaults(config: dict[str, Any], extra: dict[str, Any]) -> None:
    """Plain HTTP for an ``http://`` endpoint, path-style addressing for a custom one."""
    no_ssl = config.pop("_no_ssl", False)
    endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    http = bool(endpoint) and str(endpoint).lower().startswith("http://")
    if no_ssl and not http:
        raise ConfigError(
            f"storage_options use_ssl=False needs an http:// endpoint_url (got {endpoint!r}): give "
            "endpoint_url='http://host:port'"
        )
    if http:
        extra.setdefault("client_options", {}).setdefault("allow_http", True)
    if "endpoint" in config and "virtual_hosted_style_request" not in config:
        # Custom endpoints (MinIO, SeaweedFS, Ceph, ...) are nearly always path-style.
        config["virtual_hosted_style_request"] = False


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
            region = self._session().get_config_variable("region")
        except Exception:  # noqa: BLE001 - region is only a default
            return None
        return None if region is None else str(region)

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
            raise PermissionError(f"no AWS credentials found for profile {self.profile!r}")
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
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return False  # obstore reads these itself
    if os.environ.get("AWS_PROFILE"):
        return True
    home = Path(os.environ.get("HOME", "~")).expanduser()
    files = [
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials",
        os.environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config",
    ]
    return any(Path(f).is_file() for f in files)
