"""Fixtures only (helpers live in helpers.py): one ``location`` fixture runs a test over every backend."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import FINGERPRINT, CountingStore, make_batch

logging.getLogger("zarr_skip").setLevel(logging.DEBUG)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server (SeaweedFS) on loopback for the whole session."""
    from _s3server import seaweedfs_fixture_server

    with seaweedfs_fixture_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(params=["memory", "local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Where a cache lives: a zarr MemoryStore, a local directory, an s3:// URL on SeaweedFS.

    Tests open it as users do: ``zs.open_cache(location, ...)``; for S3 the location is a
    store object built from the URL and the server's credentials.
    """
    if request.param == "memory":
        return CountingStore()
    if request.param == "local":
        return tmp_path / "cache"
    server = request.getfixturevalue("s3_server")
    from zarr_skip.store._s3 import open_s3_store

    return open_s3_store(server.s3_url(f"t-{uuid.uuid4().hex[:12]}"), server.storage_options)


@pytest.fixture
def fingerprint() -> dict[str, Any]:
    return dict(FINGERPRINT)


@pytest.fixture
def chunk_jobs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``ChunkJobs`` made while the test runs (a write makes one), in order."""
    from zarr_skip.store import chunkjobs

    made: list[Any] = []
    init = chunkjobs.ChunkJobs.__init__

    def traced_init(self: chunkjobs.ChunkJobs, *args: Any) -> None:
        init(self, *args)
        made.append(self)

    monkeypatch.setattr(chunkjobs.ChunkJobs, "__init__", traced_init)
    return made


@pytest.fixture
def batch() -> dict[str, Any]:
    return make_batch()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fuse: needs FUSE mounts")
