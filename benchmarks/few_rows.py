"""Reading a few rows against reading the whole column, cold, on the realistic steps.

Writes the realistic ``medium`` (or ``large``) step of ``zarr_skip.synthetic`` in 4 mini-batches
(as verl's ``parameter_sync_step=4`` does), then, ``--reps`` times: evicts the cache's files from
the page cache (``posix_fadvise(DONTNEED)``), opens the cache and reads 64 random rows of
``responses``; and the same for the whole column. Prints the medians, their ratio, the stored
bytes, and the files of the step::

    PYTHONPATH=. python benchmarks/few_rows.py --preset medium --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import zarr_skip as zs
from zarr_skip.format import chunks as chunks_module
from zarr_skip.synthetic import as_mapping, jagged_payload

FINGERPRINT = {"bench": "few_rows"}


def _rows(value: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a column of the mapping (nested tensors rebuilt from their rows)."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        offsets = value.offsets()
        a, b = int(offsets[start]), int(offsets[stop])
        return torch.nested.nested_tensor_from_jagged(value.values()[a:b], offsets[start : stop + 1] - a)
    return value[start:stop]


def write_step(root: Path, preset: str, minibatches: int) -> int:
    batch = as_mapping(jagged_payload(preset, 0, payload="realistic"))
    rows = len(batch["responses"].offsets()) - 1
    cache = zs.open_cache(root, FINGERPRINT)
    per = rows // minibatches
    for i in range(minibatches):
        part = {k: _rows(v, i * per, (i + 1) * per) for k, v in batch.items()}
        cache.write(1, part, expected=minibatches)
    return rows


def evict(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(root: Path, read: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        evict(root)
        start = time.perf_counter()
        read(zs.open_cache(root).load(1)["responses"])
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--values-chunk", type=int, default=None, help="KiB per values chunk (the trade-off)")
    parser.add_argument(
        "--values-block", type=int, default=None, help="KiB per blosc block of the values (the trade-off)"
    )
    parser.add_argument("--dir", default=None, help="where to write the cache (a fresh temp dir by default)")
    args = parser.parse_args()
    if args.values_chunk is not None:
        chunks_module.VALUES_CHUNK_BYTES = args.values_chunk << 10
    if args.values_block is not None:
        chunks_module.VALUES_BLOCK_BYTES = args.values_block << 10
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "cache"
        rows = write_step(root, args.preset, args.minibatches)
        rng = np.random.default_rng(0)
        picks = [np.sort(rng.choice(rows, args.rows, replace=False)) for _ in range(args.reps)]
        it = iter(picks)
        few = timed(root, lambda col: col[next(it)], args.reps)
        whole = timed(root, lambda col: col[:], args.reps)
        view = zs.open_cache(root).load(1)
        step = root / zs.open_cache(root).experiment / "1"
        files = [p for p in step.rglob("*") if p.is_file()]
        result = {
            "preset": args.preset,
            "values_chunk_kib": (args.values_chunk or chunks_module.VALUES_CHUNK_BYTES >> 10),
            "values_block_kib": chunks_module.VALUES_BLOCK_BYTES >> 10,
            "rows": rows,
            "minibatches": args.minibatches,
            "reps": args.reps,
            f"rows{args.rows}_s": statistics.median(few),
            "whole_s": statistics.median(whole),
            "ratio": statistics.median(few) / statistics.median(whole),
            "responses_nbytes_stored": view["responses"].nbytes_stored,
            "step_nbytes_stored": view.nbytes_stored,
            "files": len(files),
            "load_avg": os.getloadavg(),
        }
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
