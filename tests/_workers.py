"""Writer processes for the crash and concurrency tests (importable by forkserver children).

Every mini-batch's content is a pure function of (run, step, index or token), so a checker in
another process can tell exactly what a complete step must hold and which run wrote it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

import torch

import zarr_skip as zs

logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


def seed_of(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def minibatch(run: str, step: int, token: str, rows: int = 64, width: int = 256) -> dict[str, Any]:
    """A deterministic mini-batch tagged with who wrote it."""
    g = torch.Generator().manual_seed(seed_of(run, step, token))
    lengths = torch.randint(0, width, (rows,), generator=g)
    offsets = torch.zeros(rows + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return {
        "input_ids": torch.randint(0, 151936, (rows, width), generator=g),
        "log_probs": torch.randn(rows, width, generator=g).bfloat16(),
        "responses": torch.nested.nested_tensor_from_jagged(
            torch.randint(0, 151936, (int(offsets[-1]),), generator=g), offsets=offsets
        ),
        "run": [run] * rows,
        "token": [token] * rows,
        "tags": [{"step": step, "row": i} for i in range(rows)],
    }


def expected_of(step: int) -> int:
    return 1 + step % 4


def crash_writer(location: str, fingerprint: dict, run: str, steps: int, ready: Any) -> None:
    """Write steps 0..steps-1 (skipping complete ones) until killed; ``ready`` is set once the
    first mini-batch is stored, so that a kill lands while this writer writes however slowly a
    loaded machine started it (not before it wrote anything)."""
    cache = zs.open_cache(location, fingerprint, run_id=run, chunk_bytes=32 << 10)
    while True:
        done = set(cache.steps())  # once a round: between steps the writer should be writing
        for step in range(steps):
            if step in done:
                continue
            n = expected_of(step)
            for _ in range(n):
                try:
                    info = cache.write(step, minibatch(run, step, "x"), expected=n)
                except zs.StepCompleteError:
                    break
                finally:
                    ready.set()
                if info.step_complete:
                    break
        time.sleep(0.001)


def overwrite_writer(location: str, fingerprint: dict, run: str, steps: int, ready: Any) -> None:
    """A new run replacing every step 0..steps-1 in turn (``overwrite=True``), then idle until
    killed; ``ready`` is set once its first mini-batch is stored."""
    cache = zs.open_cache(location, fingerprint, run_id=run, chunk_bytes=32 << 10)
    for step in range(steps):
        n = expected_of(step)
        for i in range(n):
            cache.write(step, minibatch(run, step, "x"), expected=n, overwrite=i == 0)
            ready.set()
    time.sleep(600)


def claim_then_hang(location: str, fingerprint: dict, run: str, ready: Any) -> None:
    """Claim mini-batch 0 of step 1 (expected 1) as ``run``, then hang before writing its data
    until killed; ``ready`` is set once the claim stands."""
    from zarr_skip.store import writer

    def hang(*_args: Any, **_kwargs: Any) -> Any:
        ready.set()
        time.sleep(600)

    writer._write_arrays = hang  # type: ignore[assignment]
    zs.open_cache(location, fingerprint, run_id=run).write(1, minibatch(run, 1, "x"))


def append_writer(location: str, fingerprint: dict, run: str, steps: int, expected: int, out: Any) -> None:
    """One of several writers of one run: append mini-batches to every step until all are full."""
    cache = zs.open_cache(location, fingerprint, run_id=run)
    me = f"{os.getpid()}"
    written = []
    for step in range(steps):
        k = 0
        while True:
            token = f"{me}-{k}"
            try:
                info = cache.write(step, minibatch(run, step, token, rows=8, width=16), expected=expected)
            except zs.StepCompleteError:
                break
            written.append((step, info.index, token))
            k += 1
    out.put(written)


def check_complete_steps(location: str, fingerprint: dict) -> tuple[int, int]:
    """Assert every complete step holds exactly one run's mini-batches, bit for bit.

    Returns (complete, incomplete) step counts.
    """
    cache = zs.open_cache(location, fingerprint, read_only=True)
    complete = incomplete = 0
    for info in cache.status():
        if not info.complete:
            incomplete += 1
            continue
        complete += 1
        view = cache.load(info.step)
        assert len(view._parts) == expected_of(info.step) == info.expected
        for mb in view.minibatches:
            runs = set(mb["run"][:])
            assert runs == {info.run}, f"step {info.step}: mixed runs {runs}"
            want = minibatch(info.run, info.step, mb["token"][0])
            got = mb.to_dict()
            for name, value in want.items():
                if isinstance(value, torch.Tensor) and value.is_nested:
                    assert torch.equal(got[name].values(), value.values()), name
                    assert torch.equal(got[name].offsets(), value.offsets()), name
                elif isinstance(value, torch.Tensor):
                    assert torch.equal(
                        got[name].view(torch.int16) if value.dtype == torch.bfloat16 else got[name],
                        value.view(torch.int16) if value.dtype == torch.bfloat16 else value,
                    ), name
                else:
                    assert got[name] == value, name
    return complete, incomplete


def _warm_up() -> None:
    """Build and encode one mini-batch at import, so forkserver children start warm.

    The first jagged NestedTensor of a process loads torch's tracing machinery (seconds);
    without this, kills would land before a child wrote anything.
    """
    from zarr_skip.format.columns import encode_batch

    encode_batch(minibatch("warm", 0, "warm", rows=2, width=2))


_warm_up()
