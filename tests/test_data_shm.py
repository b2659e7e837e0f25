"""zarr_skip.data._shm: the shared-memory buffers a DataLoader worker reuses once the main
process has dropped the batch in them."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch

import zarr_skip.data._shm as shm
import zarr_skip.data.collate as collate_module
from zarr_skip.data import RolloutBatch, collate_rollouts

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd buffers are Linux's")


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[shm.Lender]:
    """This process as a DataLoader worker, with buffers of its own."""
    monkeypatch.setattr(collate_module, "get_worker_info", lambda: object())
    monkeypatch.setattr(shm, "_LENDER", None)
    yield shm.lender()


def rows(lengths: list[int], fill: int) -> list[dict[str, Any]]:
    return [
        {"ids": torch.full((n,), fill + i, dtype=torch.int64), "x": torch.tensor([float(i)])}
        for i, n in enumerate(lengths)
    ]


def sent(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` pickled as a worker's queue pickles it and rebuilt (here, in the same process)."""
    back: RolloutBatch = ForkingPickler.loads(ForkingPickler.dumps(batch))
    return back


def test_a_dropped_batch_frees_its_buffer_for_the_next(worker: shm.Lender) -> None:
    first = sent(collate_rollouts(rows([9, 9, 9], 10)))
    assert len(worker.buffers) == 1 and worker.buffers[0].flag[0] == 1  # lent
    assert first["ids"].tolist() == [[10] * 9, [11] * 9, [12] * 9]
    del first
    gc.collect()
    assert worker.buffers[0].flag[0] == 0  # returned
    second = collate_rollouts(rows([2, 5], 20))  # in the same, dirty buffer: the zero padding is written
    assert len(worker.buffers) == 1
    back = sent(second)
    assert back["ids"].tolist() == [[20, 20, 0, 0, 0], [21] * 5] and back["ids_len"].tolist() == [2, 5]
    assert back["x"].tolist() == [[0.0], [1.0]]


def test_a_held_batch_is_never_written_over(worker: shm.Lender) -> None:
    held = [sent(collate_rollouts(rows([4, 3], k))) for k in range(3)]  # the main process keeps them
    kept = collate_rollouts(rows([4], 100))  # the worker keeps this one (not sent yet)
    assert len(worker.buffers) == 4
    assert [b["ids"].tolist() for b in held] == [[[k] * 4, [k + 1] * 3 + [0]] for k in range(3)]
    del held
    gc.collect()
    again = [collate_rollouts(rows([4, 3], 7)) for _ in range(3)]
    assert len(worker.buffers) == 4  # the three returned ones again, not the worker's own
    assert kept["ids"].tolist() == [[100] * 4] and all(b["ids"][0].tolist() == [7] * 4 for b in again)


def test_past_the_most_buffers_a_batch_goes_in_new_shared_memory(worker: shm.Lender) -> None:
    held = [sent(collate_rollouts(rows([3], k))) for k in range(shm.MAX_BUFFERS + 3)]
    assert len(worker.buffers) == shm.MAX_BUFFERS
    assert [b["ids"].tolist() for b in held] == [[[k] * 3] for k in range(shm.MAX_BUFFERS + 3)]
    extra = collate_rollouts(rows([3], 0))
    assert shm.lend(extra["ids"].untyped_storage()) is None and extra["ids"].untyped_storage().is_shared()
    del held
    gc.collect()
    big = collate_rollouts(rows([3 << 20], 5))  # larger than any: a free buffer makes room for it
    assert len(worker.buffers) == shm.MAX_BUFFERS and shm.lend(big["ids"].untyped_storage()) is not None
    assert sent(big)["ids"].sum().item() == 5 * (3 << 20)


def test_the_main_process_lends_nothing() -> None:
    batch = collate_rollouts(rows([2, 1], 0))
    assert shm.lend(batch["ids"].untyped_storage()) is None
    assert torch.equal(sent(batch)["ids"], batch["ids"])


def test_a_lent_buffer_is_opened_through_proc_or_sent_as_a_descriptor(
    worker: shm.Lender, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert worker.reachable  # a process of this user, dumpable: /proc serves its descriptors
    batch = collate_rollouts(rows([3, 2], 1))
    lent = shm.lend(batch["ids"].untyped_storage())
    assert lent is not None and lent.pid == os.getpid() and lent.__reduce__()[0] is shm._reopen
    assert sent(batch)["ids"].tolist() == [[1, 1, 1], [2, 2, 0]]
    monkeypatch.setattr(worker, "reachable", False)  # no /proc, or a worker that is not dumpable
    lent = shm.lend(batch["ids"].untyped_storage())
    assert lent is not None and lent.pid is None and lent.__reduce__()[0] is shm._borrow
    assert sent(batch)["ids"].tolist() == [[1, 1, 1], [2, 2, 0]]


def test_a_buffer_that_cannot_be_opened_is_an_error_naming_it(worker: shm.Lender) -> None:
    collate_rollouts(rows([3], 1))
    buf = worker.buffers[0]
    with pytest.raises(OSError, match=f"/proc/{os.getpid()}/fd/{buf.fd} is not the shared batch buffer"):
        shm._reopen(os.getpid(), buf.fd, buf.inode + 1, shm.HEADER, 8)  # another file there
    with pytest.raises(OSError, match=f"cannot open the shared batch buffer of DataLoader worker {os.getpid()}"):
        shm._reopen(os.getpid(), 10_000, buf.inode, shm.HEADER, 8)  # the worker holds no such descriptor
