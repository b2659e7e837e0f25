"""What an object store's client raises, as the StorageError a user can act on (pure).

obstore raises its own classes (``GenericError`` for an unreachable endpoint or a server gone
mid-write, ``PermissionDeniedError`` / ``UnauthenticatedError`` for a refused secret,
``UnknownConfigurationKeyError``), botocore (AWS profiles) its own; :func:`backend_error` turns each
into :class:`~zarr_skip.errors.StorageAccessError`, :class:`~zarr_skip.errors.StorageConnectionError`
or :class:`~zarr_skip.errors.StorageError`, with the cause and what to check.
"""

from __future__ import annotations

import re

from zarr_skip.errors import ConfigError, StorageAccessError, StorageConnectionError, StorageError, ZarrSkipError

__all__ = ["MISSING_EXTRA", "backend_error", "has_status"]

#: what to install for s3:// locations
MISSING_EXTRA = "pip install 'zarr-skip[s3]'"

_CLIENTS = ("obstore", "botocore", "urllib3")
_ACCESS = ("PermissionDenied", "Unauthenticated", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")
_CONNECT = (
    "error sending request",
    "connect",
    "Connection refused",
    "dns error",
    "timed out",
    "Timeout",
    "unreachable",
    "reset by peer",
)


#: an HTTP status as the clients write it: obstore's "status code: 403" and "status: 403",
#: botocore's "An error occurred (403)"
_STATUS = re.compile(r"(?:\bstatus(?: code)?:? |An error occurred \()(\d{3})\b")
#: what of a message names a place, not a cause: URLs, paths and keys (which hold experiment
#: names, run ids and step numbers), and the client's retry settings ("retry_timeout: 1s")
_PLACES = re.compile(r"\S+://\S+|\bpath:? \"?[^\s\",]+\"?|\burl: \S+|\bretry_timeout: \S+")


def has_status(text: str, status: int) -> bool:
    """Whether a client's message ``text`` says the server answered HTTP ``status`` (not a
    number that happens to be in a port, a key such as ``exp/501/...``, or a time)."""
    return str(status) in _STATUS.findall(text)


def _causes(text: str) -> str:
    """``text`` without the places it names (see :data:`_PLACES`): what is left to classify."""
    return _PLACES.sub(" ", text)


def backend_error(exc: BaseException, where: str) -> Exception | None:
    """The typed error for ``exc`` raised by an object-store client at ``where``, or None when
    ``exc`` does not come from one (or is already typed)."""
    if isinstance(exc, ZarrSkipError):
        return None
    kind = type(exc)
    if not any(c.__module__.split(".")[0] in _CLIENTS for c in kind.__mro__):
        return None
    full = " ".join(str(exc).split())
    text = full[:400]
    name = kind.__name__
    if name == "UnknownConfigurationKeyError":
        return ConfigError(f"{where}: the S3 client refuses an option ({text}); check storage_options")
    causes = _causes(full)
    if any(k in name or k in causes for k in _ACCESS) or has_status(full, 403):
        return StorageAccessError(
            f"{where}: the server refused the credentials ({name}: {text}); check key and secret "
            "(storage_options key/secret, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and that "
            "they may use this bucket"
        )
    if "NoSuchBucket" in causes:
        return StorageError(f"{where}: the bucket does not exist or is not visible ({name}: {text}); check the URL")
    if any(k.lower() in causes.lower() for k in _CONNECT):
        return StorageConnectionError(
            f"{where}: cannot reach the S3 endpoint ({name}: {text}); check endpoint_url in "
            "storage_options (or AWS_ENDPOINT_URL), that the server runs, and the network"
        )
    return StorageError(f"{where}: the object store failed ({name}: {text})")
