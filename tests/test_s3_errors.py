"""S3 failures a user can meet are StorageError subclasses naming the cause and what to check,
against the real S3 server of the session (SeaweedFS on loopback); an endpoint without
credentials fails at once, without a request to the cloud's instance-metadata address."""

from __future__ import annotations

import socket
import uuid
from datetime import timedelta
from typing import Any

import pytest
from helpers import make_batch

import zarr_skip as zs
from zarr_skip.store._s3_errors import backend_error

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

#: obstore retries failed requests for minutes by default; these tests want the failure now
FAST = {"retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=2)}}


def _url(server: Any) -> str:
    return server.s3_url(f"t-{uuid.uuid4().hex[:12]}")


def test_a_wrong_secret_is_a_storage_access_error(s3_server: Any, fingerprint: dict) -> None:
    opts = dict(s3_server.storage_options, secret="not-the-secret", **FAST)
    url = _url(s3_server)
    zs.open_cache(url, fingerprint, storage_options=s3_server.storage_options).write(1, make_batch(2))
    with pytest.raises(zs.StorageAccessError, match="refused the credentials") as exc:
        zs.open_cache(url, fingerprint, storage_options=opts)
    assert isinstance(exc.value, zs.StorageError) and isinstance(exc.value, OSError)
    with pytest.raises(zs.StorageAccessError, match="check key and secret"):
        zs.open_cache(url, storage_options=opts)


def test_an_unreachable_endpoint_is_a_storage_connection_error(s3_server: Any, fingerprint: dict) -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused, no one else binds it
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        opts = dict(s3_server.storage_options, endpoint_url=f"http://127.0.0.1:{port}", **FAST)
        with pytest.raises(zs.StorageConnectionError, match="endpoint_url"):
            zs.open_cache(_url(s3_server), fingerprint, storage_options=opts)


def test_an_endpoint_without_credentials_fails_at_once(
    s3_server: Any, fingerprint: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws
    connects: list[Any] = []
    real = socket.socket.connect

    def spy(self: socket.socket, address: Any) -> Any:
        connects.append(address)
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", spy)
    opts = {"endpoint_url": s3_server.endpoint_url}
    with pytest.raises(zs.StorageAccessError, match="no credentials"):
        zs.open_cache(_url(s3_server), fingerprint, storage_options=opts)
    assert not any("169.254.169.254" in str(a) for a in connects)


def test_client_errors_map_to_the_tree() -> None:
    import obstore.exceptions as oe

    assert isinstance(backend_error(oe.PermissionDeniedError("403 Forbidden"), "s3://b"), zs.StorageAccessError)
    err = backend_error(oe.GenericError("error sending request: tcp connect error: Connection refused"), "s3://b")
    assert isinstance(err, zs.StorageConnectionError)
    assert isinstance(backend_error(oe.GenericError("server went away"), "s3://b"), zs.StorageError)
    assert isinstance(backend_error(oe.UnknownConfigurationKeyError("bogus"), "s3://b"), zs.ConfigError)
    assert backend_error(ValueError("not a client's"), "s3://b") is None
    # a 403 is a status, not the digits of a port or a time (an endpoint on port 40307 was
    # taken for refused credentials)
    refused = [
        "GET http://127.0.0.1:40307/b/k in 107.1µs - error sending request: Connection refused",
        "GET http://127.0.0.1:9000/b/k in 403.2µs - error sending request: Connection refused",
    ]
    for text in refused:
        assert isinstance(backend_error(oe.GenericError(text), "s3://b"), zs.StorageConnectionError), text
    for text in ("Client error with status 403 Forbidden: <Error>", "An error occurred (403) when calling HeadObject"):
        assert isinstance(backend_error(oe.GenericError(text), "s3://b"), zs.StorageAccessError), text


def test_a_transient_failure_naming_step_501_is_retried_not_taken_for_no_conditional_put(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed conditional PUT whose message holds the key (``exp/501/...``) is retried: only an
    HTTP 501 says the server cannot create exclusively."""
    import obstore
    import obstore.exceptions as oe
    from obstore.store import MemoryStore
    from zarr.core.sync import sync
    from zarr.storage import ObjectStore

    from zarr_skip.store import _s3_claims

    real, calls = obstore.put_async, []

    async def flaky(store: Any, key: str, data: Any, **kw: Any) -> Any:
        calls.append(key)
        if len(calls) == 1:
            raise oe.GenericError(f"PUT http://127.0.0.1:9000/b/{key}: error sending request: connection reset")
        return await real(store, key, data, **kw)

    monkeypatch.setattr(obstore, "put_async", flaky)
    monkeypatch.setattr(_s3_claims, "_CREATE_BACKOFF", 0.0)
    store = ObjectStore(MemoryStore())
    key = "exp/501/r1/0/zarr.json"
    assert sync(_s3_claims.create_if_absent(store, key, b"ours")) is True
    assert calls == [key, key]
    for answer in ("Server error with status 501 Not Implemented", "NotImplemented: conditional put"):
        calls.clear()

        async def unsupported(store: Any, key: str, data: Any, answer: str = answer, **kw: Any) -> Any:
            calls.append(key)
            raise oe.GenericError(answer)

        monkeypatch.setattr(obstore, "put_async", unsupported)
        with pytest.raises(zs.AtomicityError, match="does not support conditional PUT"):
            sync(_s3_claims.create_if_absent(store, "exp/7/r1/0/zarr.json", b"ours"))
        assert len(calls) == 1  # not retried
