"""A retried write never stores its mini-batch twice (issue 26, point 9).

An ambiguous failure is a write that raised although its mini-batch landed complete: on S3, the
server died after the PUT of the complete record, before the writer heard back. Here it is
made twice: on local disk, by failing the call that follows the complete record; on a real
SeaweedFS server, by killing the server (SIGKILL) right after that PUT and starting it again on
the same data. With a token the retry returns the stored mini-batch; without one the same
batch is stored a second time (which the first tests show is what happened before).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import FINGERPRINT, assert_equal, concat, make_batch

import zarr_skip as zs
from zarr_skip.format.writetokens import content_token
from zarr_skip.store import writer
from zarr_skip.store.catalog import scan_step
from zarr_skip.trainer.manager import write_retrying

A, B = make_batch(4, seed=1), make_batch(4, seed=2, offset=4)


def fail_after_complete(cache: zs.Cache, then: Callable[[], None] | None = None, times: int = 1) -> list[str]:
    """Make a write fail after its mini-batch's complete record landed, ``times`` times: the
    record is written, then ``then()`` runs (a server killed: the next request fails by
    itself) or, without it, the next step of the write (finishing the step) raises as a lost
    connection would. Returns the keys of the records that landed before a failure."""
    storage = cache._storage
    real_set, real_complete = storage.set, writer._maybe_complete
    landed: list[str] = []
    left = [times]

    def set_(key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        out = real_set(key, value, *args, **kwargs)
        if left[0] and key.endswith("zarr.json") and b'"state":"complete"' in bytes(value).replace(b" ", b""):
            left[0] -= 1
            landed.append(key)
            if then is not None:
                then()
        return out

    def complete(*args: Any, **kwargs: Any) -> bool:
        if then is None and len(landed) > done[0]:
            done[0] += 1
            raise zs.StorageConnectionError("the connection was reset before the reply (injected)")
        return real_complete(*args, **kwargs)

    done = [0]
    storage.set = set_  # type: ignore[method-assign]
    writer._maybe_complete = complete  # type: ignore[assignment]
    _restore.append(lambda: setattr(writer, "_maybe_complete", real_complete))
    return landed


_restore: list[Callable[[], None]] = []


@pytest.fixture(autouse=True)
def _restored() -> Any:
    yield
    while _restore:
        _restore.pop()()


def _parts(cache: zs.Cache, step: int) -> list[Any]:
    assert cache.experiment is not None
    return [p for p in scan_step(cache._storage, cache.experiment, step).parts if p.complete]


def test_without_a_token_a_retry_stores_the_batch_twice(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    fail_after_complete(cache)
    with pytest.raises(zs.StorageConnectionError):
        cache.write(1, A, expected=2)
    assert len(_parts(cache, 1)) == 1  # it landed
    info = cache.write(1, A, expected=2)  # the retry a caller would make
    assert info.index == 1 and info.step_complete  # the same batch twice: the defect a token fixes


@pytest.mark.parametrize("token", ["rollout/step-1/mb-0", True])
def test_with_a_token_a_retry_returns_the_stored_minibatch(tmp_path: Path, token: str | bool) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    landed = fail_after_complete(cache)
    with pytest.raises(zs.StorageConnectionError):
        cache.write(1, A, expected=2, token=token)
    assert landed
    first = cache.write(1, A, expected=2, token=token)
    assert first.index == 0 and not first.step_complete and first.rows == 4
    assert len(_parts(cache, 1)) == 1
    other = "rollout/step-1/mb-1" if isinstance(token, str) else True
    second = cache.write(1, B, expected=2, token=other)
    assert second.index == 1 and second.step_complete
    assert_equal(zs.open_cache(tmp_path).load(1).to_dict(), concat([A, B]))
    assert [p.doc["token"] for p in sorted(_parts(cache, 1), key=lambda p: p.index)][0] == (
        token if isinstance(token, str) else _content(A)
    )


def _content(batch: dict[str, Any]) -> str:
    from zarr_skip.format.columns import encode_batch

    return content_token(encode_batch(batch, None, allow_pickle=False))


def test_a_retry_of_the_last_minibatch_completes_the_step(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    fail_after_complete(cache)
    with pytest.raises(zs.StorageConnectionError):
        cache.write(1, A, expected=1, token="t")
    assert len(_parts(cache, 1)) == 1  # landed; the step is finished by the retry
    info = cache.write(1, A, expected=1, token="t")  # not StepCompleteError: it is its own
    assert info.index == 0 and info.step_complete
    assert cache.status()[0].complete
    assert_equal(zs.open_cache(tmp_path).load(1).to_dict(), A)


def test_content_tokens_tell_batches_apart(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    assert cache.write(1, A, expected=3, token=True).index == 0
    assert cache.write(1, A, expected=3, token=True).index == 0  # the same content: the same one
    assert cache.write(1, B, expected=3, token=True).index == 1
    assert _content(A) == _content(make_batch(4, seed=1)) != _content(B)
    other = dict(A, scores=np.asarray(A["scores"]) + 1)
    assert _content(other) != _content(A)


def test_a_token_of_another_run_is_not_found(tmp_path: Path) -> None:
    zs.open_cache(tmp_path, FINGERPRINT, run_id="r1").write(1, A, expected=2, token="t")
    later = zs.open_cache(tmp_path, FINGERPRINT, run_id="r2")  # a newer run takes the step over
    info = later.write(1, B, expected=2, token="t")
    assert info.run == "r2" and info.index == 0
    assert [p.run for p in _parts(later, 1)] == ["r2"]


@pytest.mark.parametrize(
    ("token", "error"),
    [
        (False, zs.ConfigTypeError),
        (3, zs.ConfigTypeError),
        ("", zs.ConfigError),
        ("x" * 257, zs.ConfigError),
        ("a\nb", zs.ConfigError),
        (b"t", zs.ConfigTypeError),
    ],
)
def test_bad_tokens_are_refused_before_anything_is_written(tmp_path: Path, token: Any, error: type) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    with pytest.raises(error, match="token"):
        cache.write(1, A, token=token)
    assert cache.status() == []


def test_write_retrying_stores_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    fail_after_complete(cache, times=2)
    info = write_retrying(cache, 1, A, expected=1, token="rollout/step-1")
    assert info.index == 0 and info.step_complete
    assert len(_parts(cache, 1)) == 1
    assert "trying the write again" in caplog.text


def test_write_retrying_gives_up_after_its_retries(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    storage = cache._storage

    def down(*_a: Any, **_k: Any) -> Any:
        raise zs.StorageConnectionError("down (injected)")

    storage.set = down  # type: ignore[method-assign]
    with pytest.raises(zs.StorageConnectionError):
        write_retrying(cache, 1, A, expected=1, token="t")


def test_the_skip_manager_writes_with_a_token(tmp_path: Path) -> None:
    from zarr_skip.trainer import manager

    cache = zs.open_cache(tmp_path, FINGERPRINT)
    rt = type("R", (), {"lock": __import__("threading").Lock(), "cache": lambda self: cache})()
    rt.cfg = type("C", (), {"role": "rollout"})()
    fail_after_complete(cache)
    manager.SkipManager._store(rt, 3, A)
    (part,) = _parts(cache, 3)
    assert part.doc["token"] == "rollout/step-3" and cache.status()[0].complete


# -- a real S3 server killed between the PUT and the reply ------------------------------------


@pytest.mark.s3
@pytest.mark.timeout(300)
def test_s3_server_killed_after_the_put_retry_stores_once(tmp_path: Path) -> None:
    from _s3server import seaweedfs, seaweedfs_unavailable_reason

    reason = seaweedfs_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    with seaweedfs(tmp_path / "s3") as srv:
        url = srv.s3_url(prefix)
        cache = zs.open_cache(url, FINGERPRINT, run_id="run-a", storage_options=dict(srv.storage_options, **_retry()))

        def kill() -> None:
            os.kill(srv.pid, signal.SIGKILL)
            _wait_dead(srv.pid)

        landed = fail_after_complete(cache, then=kill)
        with pytest.raises(zs.StorageError):
            cache.write(1, A, expected=2, token="rollout/step-1/mb-0")
        assert landed  # the PUT of the complete record returned before the kill
    with seaweedfs(tmp_path / "s3") as srv:  # the same data, a new server (new ports)
        url = srv.s3_url(prefix)
        again = zs.open_cache(url, FINGERPRINT, run_id="run-a", storage_options=srv.storage_options)
        info = again.write(1, A, expected=2, token="rollout/step-1/mb-0")
        assert info.index == 0 and not info.step_complete
        assert len(_parts(again, 1)) == 1
        assert again.write(1, B, expected=2, token="rollout/step-1/mb-1").step_complete
        assert_equal(zs.open_cache(url, storage_options=srv.storage_options).load(1).to_dict(), concat([A, B]))


def _retry() -> dict[str, Any]:
    from datetime import timedelta

    return {"retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=2)}}


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.05)
    raise AssertionError(f"weed pid {pid} still alive")


# -- an attempt that failed before completing and could not clean up -------------------------


def fail_mid_data(cache: zs.Cache, then: Callable[[], None] | None = None) -> None:
    """Make the next write fail after its claim and data landed, before its complete record,
    with its clean-up failing too (the store is gone): ``then()`` kills a server, or without it
    both raise as a lost connection would."""
    real_write, real_discard = writer._write_arrays, writer._discard
    armed = [True]

    def write_arrays(*args: Any, **kwargs: Any) -> Any:
        out = real_write(*args, **kwargs)
        if armed[0]:
            armed[0] = False
            if then is not None:
                then()  # the next request (the owner check) fails by itself
            else:
                writer._discard = discard  # type: ignore[assignment]
                raise zs.StorageConnectionError("the connection was reset (injected)")
        return out

    def discard(*_a: Any, **_k: Any) -> None:
        writer._discard = real_discard  # type: ignore[assignment]
        raise zs.StorageConnectionError("the connection was reset during the clean-up (injected)")

    writer._write_arrays = write_arrays  # type: ignore[assignment]
    _restore.append(lambda: setattr(writer, "_write_arrays", real_write))
    _restore.append(lambda: setattr(writer, "_discard", real_discard))


def test_an_unfinished_attempt_of_the_same_token_gives_its_index_back(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    fail_mid_data(cache)
    with pytest.raises(zs.StorageConnectionError):
        cache.write(1, A, expected=2, token="mb-0")
    assert cache.experiment is not None
    (left,) = scan_step(cache._storage, cache.experiment, 1).parts
    assert left.state == "writing" and left.doc["token"] == "mb-0"  # the claim the clean-up left
    assert cache.write(1, A, expected=2, token="mb-0").index == 0
    assert cache.write(1, B, expected=2, token="mb-1").step_complete
    assert_equal(zs.open_cache(tmp_path).load(1).to_dict(), concat([A, B]))


def test_without_a_token_the_unfinished_attempt_keeps_its_index(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT)
    fail_mid_data(cache)
    with pytest.raises(zs.StorageConnectionError):
        cache.write(1, A, expected=2)
    assert cache.write(1, A, expected=2).index == 1  # index 0 stays claimed by the dead attempt
    with pytest.raises(zs.StepCompleteError):
        cache.write(1, B, expected=2)


def test_another_writers_unfinished_claim_is_left_alone(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path, FINGERPRINT, run_id="r1")
    fail_mid_data(cache)
    with pytest.raises(zs.StorageConnectionError):
        cache.write(1, A, expected=2, token="mb-0")
    other = zs.open_cache(tmp_path, FINGERPRINT, run_id="r1")  # same run, another writer
    assert other.write(1, A, expected=2, token="mb-0").index == 1
    assert cache.experiment is not None
    states = sorted((p.index, p.state) for p in scan_step(cache._storage, cache.experiment, 1).parts)
    assert states == [(0, "writing"), (1, "complete")]


def _wait_serving(url: str, options: dict[str, Any], seconds: float = 60.0) -> None:
    """Until a restarted server answers reads of the cache (its filer can answer 500 for a
    moment after the gateway is up): the retry under test needs a server that is back."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            zs.open_cache(url, storage_options=options).status()
            return
        except zs.StorageError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.s3
@pytest.mark.timeout(300)
def test_s3_server_killed_mid_write_and_restarted_retry_from_the_same_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import _s3server
    from _s3server import SeaweedFSError, seaweedfs, seaweedfs_unavailable_reason

    reason = seaweedfs_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    with seaweedfs(tmp_path / "s3") as srv:
        ports = dict(srv.ports)
        options = dict(srv.storage_options, **_retry())
        cache = zs.open_cache(srv.s3_url(prefix), FINGERPRINT, storage_options=options)
        pid = srv.pid
        fail_mid_data(cache, then=lambda: (os.kill(pid, signal.SIGKILL), _wait_dead(pid)))
        with pytest.raises(zs.StorageError):
            cache.write(1, A, expected=2, token="rollout/step-1/mb-0")
    http = [ports[flag] for flag, _ in _s3server._COMPONENTS.values()]
    monkeypatch.setattr(_s3server, "_pick_port_pairs", lambda n, rng: list(http))  # the same ports again
    try:
        again = seaweedfs(tmp_path / "s3")
        srv = again.__enter__()
    except SeaweedFSError as exc:  # a port taken meanwhile: the same handle cannot reach a new one
        pytest.skip(f"SeaweedFS did not restart on its ports: {exc}")
    try:
        assert srv.ports == ports
        _wait_serving(srv.s3_url(prefix), srv.storage_options)
        info = cache.write(1, A, expected=2, token="rollout/step-1/mb-0")  # the same handle retries
        assert info.index == 0
        assert cache.write(1, B, expected=2, token="rollout/step-1/mb-1").step_complete
        reader = zs.open_cache(srv.s3_url(prefix), storage_options=srv.storage_options)
        assert_equal(reader.load(1).to_dict(), concat([A, B]))
    finally:
        again.__exit__(None, None, None)
