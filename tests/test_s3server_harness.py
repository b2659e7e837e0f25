"""The SeaweedFS test harness itself: how it picks ports and probes readiness.

CI once failed in ``_wait_ready`` with ``BadStatusLine: GET / HTTP/1.1``: a
probe of a port in the ephemeral range, sent before the server listened, was
given that port as its own source and connected to itself, reading its own
request back.
"""

from __future__ import annotations

import random
import socket
import threading

try:
    from tests import _s3server
except ImportError:  # tests/ imported as rootdir-less modules
    import _s3server  # type: ignore[no-redef]


def test_server_ports_and_their_grpc_pairs_lie_below_the_ephemeral_range() -> None:
    low = _s3server._ephemeral_low()
    ports = _s3server._pick_port_pairs(12, random.Random(7))
    assert len(set(ports)) == 12
    assert all(p >= 1024 and p + _s3server._GRPC_OFFSET < low for p in ports)


def test_a_probe_answered_by_its_own_request_is_not_ready() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def echo() -> None:  # what a self-connected socket reads: the request it sent
            conn, _ = listener.accept()
            with conn:
                conn.sendall(conn.recv(4096))

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        port = listener.getsockname()[1]
        assert _s3server._http_status(f"http://127.0.0.1:{port}/", timeout=5.0) is None
        thread.join(5.0)
