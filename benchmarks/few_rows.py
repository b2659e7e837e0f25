"""Reading a few rows against reading the whole column, cold: the trade-off of block sizes and codecs.

Usage::

    python -m benchmarks.few_rows --presets medium,large --reps 7 --out benchmarks/results

For each preset the realistic step of ``zarr_skip.synthetic`` is written in 4 mini-batches (as
verl's ``parameter_sync_step=4`` does) once per setting of :data:`SETTINGS`:

* ``default``: ``compression="auto"`` (token ids in blosc-zstd-1, one block per 512 KiB chunk);
* ``auto-32k``, ``auto-8k``: ``Compression("auto", blocksize=...)``: token ids in blocks of 32
  or 8 KiB that a read of a few rows fetches and decodes alone (:mod:`zarr_skip.store.blockreads`);
* ``lz4``: ``Compression("lz4", 5)``: every array wider than a byte in blosc-lz4, which decodes
  several times faster than zstd but stores more bytes. Its blocks are blosc's own: blosc makes
  lz4 blocks of at least 64 KiB (a block size asked is multiplied by the type's size), split by
  byte, so reads decode lz4 chunks whole (runs before 2026-12-04 timed ``lz4-32k`` and
  ``lz4-8k`` of blosc's making, whose blocks were 128 and 64 KiB);
* ``lz4-8k``: ``Compression("lz4", 5, "shuffle", 8 << 10)``: every array in lz4 blocks of 8 KiB
  that zarr_skip writes itself (:mod:`zarr_skip.format.lz4_blocks`), read block by block.

Then, ``--reps`` times, settings in a rotated order: the step's files are evicted from the page
cache (``posix_fadvise(DONTNEED)``), the cache opened, and ``--rows`` random rows of
``responses`` read (new rows each repetition, the same for every setting); the same for the
whole column. The report gives min / median / max, the ratio of the medians (few / whole), the
step's stored bytes against the information floor (:mod:`benchmarks.floor`), and the machine's
load before and during the run (:mod:`benchmarks.load`). Settings are read back and compared
with the step written, untimed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import zarr_skip as zs
from benchmarks import load
from benchmarks.machine import REPO_ROOT, command_line
from benchmarks.measure import spread_text
from zarr_skip.synthetic import as_mapping, jagged_payload

FINGERPRINT = {"bench": "few_rows"}
COLUMN = "responses"
#: the settings compared: name -> what open_cache's ``compression`` takes
SETTINGS: dict[str, Any] = {
    "default": "auto",
    "auto-32k": zs.Compression("auto", blocksize=32 << 10),
    "auto-8k": zs.Compression("auto", blocksize=8 << 10),
    "lz4": zs.Compression("lz4", 5),
    "lz4-8k": zs.Compression("lz4", 5, "shuffle", 8 << 10),
}


def _rows(value: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a column of the mapping (nested tensors rebuilt from their rows)."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        offsets = value.offsets()
        a, b = int(offsets[start]), int(offsets[stop])
        return torch.nested.nested_tensor_from_jagged(value.values()[a:b], offsets[start : stop + 1] - a)
    return value[start:stop]


def write_step(root: Path, batch: dict[str, Any], minibatches: int, compression: Any = "auto") -> int:
    """``batch`` written as step 1 of a new cache at ``root`` in ``minibatches`` mini-batches."""
    rows = len(batch[COLUMN].offsets()) - 1
    cache = zs.open_cache(root, FINGERPRINT, compression=compression)
    per = rows // minibatches
    for i in range(minibatches):
        part = {k: _rows(v, i * per, (i + 1) * per) for k, v in batch.items()}
        cache.write(1, part, expected=minibatches)
    return rows


def evict(root: Path) -> None:
    """Drop ``root``'s files from the page cache."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cold(root: Path, rows: np.ndarray | None) -> float:
    """Seconds to open the cache and read ``rows`` of its column (``None``: all), the files
    evicted first."""
    evict(root)
    start = time.perf_counter()
    col = zs.open_cache(root).load(1)[COLUMN]
    col[:] if rows is None else col[rows]
    return time.perf_counter() - start


def _check(root: Path, batch: dict[str, Any], picks: np.ndarray) -> None:
    got = zs.open_cache(root).load(1)[COLUMN][picks].unbind()
    want = batch[COLUMN].unbind()
    if not all(torch.equal(a, want[int(i)]) for a, i in zip(got, picks, strict=True)):
        raise RuntimeError(f"{root}: rows read differ from the rows written")


def measure(preset: str, reps: int, rows: int, work: Path) -> dict[str, Any]:
    """Every sample of every setting for one preset; a warm-up round first, not kept."""
    from benchmarks.floor import jagged_floor

    batch = as_mapping(jagged_payload(preset, 0, payload="realistic"))
    roots = {name: work / preset / name for name in SETTINGS}
    n = 0
    for name, root in roots.items():
        n = write_step(root, batch, 4, SETTINGS[name])
    rng = np.random.default_rng(0)
    samples: dict[str, dict[str, list[float]]] = {name: {"rows": [], "whole": []} for name in SETTINGS}
    names = list(SETTINGS)
    for rep in range(reps + 1):
        picks = np.sort(rng.choice(n, rows, replace=False))
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            few, whole = cold(roots[name], picks), cold(roots[name], None)
            if rep:
                samples[name]["rows"].append(few)
                samples[name]["whole"].append(whole)
        if rep == 0:
            for name in names:
                _check(roots[name], batch, picks)
    floor = jagged_floor(preset, 0, 1, payload="realistic")["bytes"]
    stored = {}
    for name, root in roots.items():
        view = zs.open_cache(root).load(1)
        stored[name] = {"step": view.nbytes_stored, "column": view[COLUMN].nbytes_stored}
    return {"rows": n, "samples_s": samples, "nbytes_stored": stored, "floor_bytes": floor}


def _mmm(values: list[float]) -> str:
    return spread_text(values, scale=1e3)


def report(res: dict[str, Any]) -> str:
    lines = [
        "# A few rows against the whole column, cold: block sizes and codecs",
        "",
        load.line(res.get("load")),
        "",
        f"Run {res['started']}, command: `{res['command']}`. Realistic step in 4 mini-batches; "
        f"{res['reps']} repetitions after a warm-up, settings interleaved; times in ms as min / **median** / max, "
        f"each with the cache opened and the step's files evicted first (`posix_fadvise`).",
        "",
        f"| preset | setting | {res['rows']} random rows of `{COLUMN}` | whole column | ratio | "
        "column stored | step stored / floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for preset, r in res["presets"].items():
        for name in SETTINGS:
            s, b = r["samples_s"][name], r["nbytes_stored"][name]
            ratio = statistics.median(s["rows"]) / statistics.median(s["whole"])
            lines.append(
                f"| {preset} | {name} | {_mmm(s['rows'])} | {_mmm(s['whole'])} | {ratio:.2f} | "
                f"{b['column'] / 2**20:.2f} MiB | {b['step'] / r['floor_bytes']:.3f} |"
            )
    lines += ["", "Settings: " + "; ".join(f"`{k}` = {v!r}" for k, v in SETTINGS.items()) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.few_rows", description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="medium,large", help="comma-separated presets (default medium,large)")
    ap.add_argument("--reps", type=int, default=7, help="repetitions after the warm-up (default 7)")
    ap.add_argument("--rows", type=int, default=64, help="random rows read (default 64)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="few_rows.md/.json")
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    mon = load.guard(args)
    if mon is None:
        return 2
    run = load.run_monitored(
        mon,
        args.out,
        ".bench-tmp-rows-",
        lambda work: {p: measure(p, args.reps, args.rows, work) for p in args.presets.split(",") if p},
    )
    res = {
        "started": run.started,
        "command": command_line("few_rows", argv),
        "reps": args.reps,
        "rows": args.rows,
        "presets": run.result,
        "load": run.record,
    }
    load.publish(args.out, "few_rows", res, report(res))
    return load.exit_code(run.record, args.require_quiet)


if __name__ == "__main__":
    sys.exit(main())
