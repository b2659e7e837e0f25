"""S3 failures a user can meet are StorageError subclasses naming the cause and what to check,
against the real S3 server of the session (SeaweedFS on loopback); an endpoint without
credentials fails at once, without a request to the cloud's instance-metadata address."""

from __future__ import annotations

import http.server
import re
import socket
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from helpers import make_batch

import zarr_skip as zs
from zarr_skip.store._s3_errors import backend_error
from zarr_skip.store.storage import Storage

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
    for answer in (
        "Server error with status 501 Not Implemented",
        "Server returned non-2xx status code: 400 Bad Request: <Error><Code>NotImplemented</Code></Error>",
    ):
        calls.clear()

        async def unsupported(store: Any, key: str, data: Any, answer: str = answer, **kw: Any) -> Any:
            calls.append(key)
            raise oe.GenericError(answer)

        monkeypatch.setattr(obstore, "put_async", unsupported)
        with pytest.raises(zs.AtomicityError, match="does not support conditional PUT"):
            sync(_s3_claims.create_if_absent(store, "exp/7/r1/0/zarr.json", b"ours"))
        assert len(calls) == 1  # not retried


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's ``status`` and an S3 error document."""

    CODES = {403: "AccessDenied", 500: "InternalError", 501: "NotImplemented", 503: "SlowDown"}

    def _answer(self) -> None:
        status = self.server.status  # type: ignore[attr-defined]
        body = f"<Error><Code>{self.CODES[status]}</Code></Error>".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = _answer

    def log_message(self, *args: Any) -> None:
        pass


def test_server_answers_are_told_apart_whatever_the_key_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real S3 client's errors for a server answering 403, 500, 501 or 503, on a key whose
    run id and step hold "403", "501" and "connect" (obstore's messages name the key and its
    retry settings, "retry_timeout: 1s"): refused credentials only for the 403, no conditional
    PUT only for the 501, and a failing server is neither unreachable nor refusing."""
    import obstore
    from obstore.store import S3Store
    from zarr.core.sync import sync
    from zarr.storage import ObjectStore

    from zarr_skip.store import _s3_claims

    monkeypatch.setattr(_s3_claims, "_CREATE_BACKOFF", 0.0)
    key = "exp/501/r-403-connect/0/zarr.json"
    for status in (403, 500, 501, 503):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
        server.status = status  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            store = S3Store(
                "bkt", endpoint=f"http://127.0.0.1:{server.server_address[1]}", access_key_id="k",
                secret_access_key="s", region="us-east-1", client_options={"allow_http": True},
                retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=1)},
            )  # fmt: skip
            with pytest.raises(Exception) as raised:
                obstore.get(store, key)
            err = backend_error(raised.value, "s3://bkt")
            expected = zs.StorageAccessError if status == 403 else zs.StorageError
            assert type(err) is expected, (status, err)
            if status in (501, 503):
                creating = _s3_claims.create_if_absent(ObjectStore(store), key, b"ours")
                with pytest.raises(zs.AtomicityError if status == 501 else zs.StorageError) as failed:
                    sync(creating)
                assert status == 501 or "kept failing" in str(failed.value), failed
            if status == 503:  # through the cache's storage: the error names the bucket too
                storage = Storage(ObjectStore(store))
                storage._probed = True  # the probe of exclusive creates would fail the same way first
                with pytest.raises(zs.StorageError, match=re.escape(f"conditional PUT of {storage.where}/{key} kept")):
                    storage.create_if_absent(key, b"ours")
        finally:
            server.shutdown()
            server.server_close()
