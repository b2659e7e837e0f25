"""Writers for tests/test_complete_once.py (importable by forkserver children)."""

from __future__ import annotations

from typing import Any

from _shared_workers import open_location
from _workers import minibatch

import zarr_skip as zs


def round_writer(
    location: str,
    storage_options: dict | None,
    fingerprint: dict,
    run: str,
    rounds: int,
    writers: int,
    start: Any,
    out: Any,
) -> None:
    """One of ``writers`` writers of one run: in each round (a step), wait for all, then write
    one mini-batch of ``writers`` expected; put ``(step, index, step_complete)`` for every write."""
    got: list[tuple[int, int, bool]] = []
    try:
        cache = zs.open_cache(open_location(location, storage_options), fingerprint, run_id=run)
        for step in range(rounds):
            start.wait(120)
            info = cache.write(step, minibatch(run, step, "x", rows=2, width=4), expected=writers)
            got.append((step, info.index, info.step_complete))
    except BaseException as exc:
        out.put({"error": f"{type(exc).__name__}: {exc}", "got": got})
        raise
    out.put({"got": got})
