"""Exactly one writer is told ``step_complete=True``: 8 writer processes of one run fill each
step together (each writes one of its 8 mini-batches, all starting at once), many steps over."""

from __future__ import annotations

import multiprocessing as mp
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _once_workers import round_writer

import zarr_skip as zs

WRITERS = 8

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # real processes racing


@pytest.fixture(scope="module")
def ctx() -> Any:
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "zarr", "zarr_skip", "_workers", "_shared_workers", "_once_workers"])
    return context


def _race(ctx: Any, location: str, storage_options: dict | None, fingerprint: dict, rounds: int) -> list[Any]:
    out = ctx.Queue()
    start = ctx.Barrier(WRITERS)
    procs = [
        ctx.Process(
            target=round_writer,
            args=(location, storage_options, fingerprint, "one-run", rounds, WRITERS, start, out),
        )
        for _ in range(WRITERS)
    ]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.exitcode is None:
                p.kill()
                p.join()
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, errors
    return [g for r in reports for g in r["got"]]


def _assert_once(got: list[Any], rounds: int) -> None:
    told = Counter(step for step, _, complete in got if complete)
    assert len(got) == rounds * WRITERS
    for step in range(rounds):
        indices = sorted(i for s, i, _ in got if s == step)
        assert indices == list(range(WRITERS)), f"step {step}: indices {indices}"
    wrong = {step: told[step] for step in range(rounds) if told[step] != 1}
    assert not wrong, f"writers told step_complete=True, by step (want exactly 1 each): {wrong}"


def test_one_writer_of_eight_is_told_the_step_completed_local(ctx: Any, tmp_path: Path, fingerprint: dict) -> None:
    rounds = 24
    location = str(tmp_path / "cache")
    _assert_once(_race(ctx, location, None, fingerprint, rounds), rounds)
    cache = zs.open_cache(location, fingerprint, read_only=True)
    assert cache.steps() == list(range(rounds))


@pytest.mark.s3
def test_one_writer_of_eight_is_told_the_step_completed_s3(ctx: Any, s3_server: Any, fingerprint: dict) -> None:
    rounds = 12
    url = s3_server.s3_url(f"t-{uuid.uuid4().hex[:12]}")
    _assert_once(_race(ctx, url, s3_server.storage_options, fingerprint, rounds), rounds)
