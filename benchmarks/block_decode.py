"""Small zstd blocks decoded by blosc alone, and through zstandard then blosc (as zarr_skip does).

Usage::

    python -m benchmarks.block_decode --preset medium --reps 7 --out benchmarks/results

The baseline is numcodecs' Blosc alone (:data:`zarr_skip.format.zstd_blocks.SMALL_BLOCK_BYTES`
set to 0); zarr_skip decodes frames of 16 or more zstd blocks of up to 16 KiB through zstandard
(:mod:`zarr_skip.format.zstd_blocks`). Both run in the same process, interleaved round by round,
rotated:

* ``frames``: the token ids (``responses`` values) of the realistic step, in chunks of 2 MiB,
  compressed as the cache does (blosc-zstd level 1, byte shuffle) in blocks of 8, 16 and 32
  KiB and in one block per chunk; MB/s of decoded bytes, one thread.
* ``reads``: the step written in 4 mini-batches with ``Compression("auto", blocksize=8 << 10)``
  (the few-row setting), its view opened once (as a data loader keeps it): ``--rows`` random
  rows of ``responses``, then the whole column, warm, then each again cold (the step's files
  evicted from the page cache before each read); milliseconds of wall time and of the
  process's CPU time (all threads) per read, on every core and pinned to one (a process of its
  own, started with that affinity, as a data loader's worker often is).

The report gives min / median / max and the ratio of the medians (zarr_skip / blosc alone), with
the machine's load before and during the run (:mod:`benchmarks.load`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.machine import REPO_ROOT, command_line
from benchmarks.measure import spread_text

COLUMN = "responses"
BLOCKS = (8 << 10, 16 << 10, 32 << 10, 0)  # 0: one block per chunk
CHUNK_BYTES = 2 << 20
MODES = ("blosc", "zarr_skip")


def _mode(mode: str) -> None:
    from zarr_skip.format import zstd_blocks

    zstd_blocks.SMALL_BLOCK_BYTES = 0 if mode == "blosc" else 16 << 10


def _rounds(reps: int) -> list[tuple[str, ...]]:
    return [MODES if r % 2 == 0 else MODES[::-1] for r in range(reps)]


def measure_frames(values: Any, reps: int, loops: int = 5) -> dict[str, dict[str, list[float]]]:
    """MB/s of each block size and mode, a sample per round (each the best of ``loops``
    decodes of every chunk)."""
    import numcodecs
    import numpy as np

    from zarr_skip.format import zstd_blocks

    raw = np.ascontiguousarray(values, dtype="<u4")
    per = CHUNK_BYTES // 4
    pieces = [raw[i : i + per] for i in range(0, len(raw) - per + 1, per)] or [raw]
    out: dict[str, dict[str, list[float]]] = {}
    for block in BLOCKS:
        codec = zstd_blocks.Blosc("zstd", 1, numcodecs.Blosc.SHUFFLE, block or CHUNK_BYTES)
        frames = [bytes(codec.encode(p)) for p in pieces]
        nbytes = sum(p.nbytes for p in pieces)
        got = out.setdefault(f"{block >> 10} KiB" if block else "one block", {m: [] for m in MODES})
        for order in _rounds(reps):
            for mode in order:
                _mode(mode)
                best = min(_timed(lambda c=codec, fs=frames: [c.decode(f) for f in fs]) for _ in range(loops))
                got[mode].append(nbytes / best / 1e6)
    return out


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


#: the reads timed: (what, page cache), and how many of them a round takes per ``--per-round``
READS = {("rows", "warm"): 1, ("whole", "warm"): 20, ("rows", "cold"): 6, ("whole", "cold"): 20}


def measure_reads(root: Path, reps: int, rows: int, per_round: int) -> dict[str, Any]:
    """Wall and CPU milliseconds per read of ``rows`` random rows and of the whole column,
    warm and cold (the step's files evicted before each read, the view kept open), per mode, a
    sample per round (the mean of its reads)."""
    import numpy as np

    import zarr_skip as zs
    from benchmarks.few_rows import evict

    col = zs.open_cache(root).load(1)[COLUMN]
    rng = np.random.default_rng(0)
    res: dict[str, Any] = {f"{op} {cache}": {m: {"wall": [], "cpu": []} for m in MODES} for op, cache in READS}
    for r, order in enumerate(_rounds(reps + 1)):  # round 0 warms up, not kept
        for mode in order:
            _mode(mode)
            for (op, cache), share in READS.items():
                n = max(1, per_round // share)
                wall = cpu = 0.0
                for _ in range(n):
                    picks = np.sort(rng.choice(len(col), rows, replace=False))
                    if cache == "cold":
                        evict(root)
                    c0, t0 = _cpu(), time.perf_counter()
                    col[picks] if op == "rows" else col[:]  # noqa: B018 - read for its time
                    wall, cpu = wall + time.perf_counter() - t0, cpu + _cpu() - c0
                if r:
                    res[f"{op} {cache}"][mode]["wall"].append(wall / n * 1e3)
                    res[f"{op} {cache}"][mode]["cpu"].append(cpu / n * 1e3)
    return res


def _reads_in_child(root: Path, reps: int, rows: int, per_round: int, one_core: bool) -> dict[str, Any]:
    """:func:`measure_reads` in a process of its own (pinned to one core: every thread of it)."""
    cmd = [sys.executable, "-m", "benchmarks.block_decode", "--reads-of", str(root), "--reps", str(reps)]
    cmd += ["--rows", str(rows), "--per-round", str(per_round)]
    pin = sorted(os.sched_getaffinity(0))[:1] if one_core else None
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        preexec_fn=(lambda: os.sched_setaffinity(0, pin)) if pin else None,  # noqa: PLW1509 - no threads yet
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def measure(preset: str, reps: int, rows: int, per_round: int, work: Path) -> dict[str, Any]:
    import zarr_skip as zs
    from benchmarks.few_rows import write_step
    from zarr_skip.synthetic import as_mapping, jagged_payload

    batch = as_mapping(jagged_payload(preset, 0, payload="realistic"))
    frames = measure_frames(batch[COLUMN].values().numpy(), reps)
    root = work / "cache"
    write_step(root, batch, 4, zs.Compression("auto", blocksize=8 << 10))
    reads = {
        cores: _reads_in_child(root, reps, rows, per_round, cores == "one core") for cores in ("every core", "one core")
    }
    return {"frames_mb_s": frames, "reads_ms": reads, "cores": len(os.sched_getaffinity(0))}


def _mmm(values: list[float], fmt: str = "{:.2f}") -> str:
    return spread_text(values, fmt)


def report(res: dict[str, Any]) -> str:
    lines = [
        "# Small zstd blocks: blosc alone against zstandard then blosc",
        "",
        load.line(res.get("load")),
        "",
        f"Run {res['started']}, command: `{res['command']}`. {res['reps']} rounds, the two interleaved "
        "(rotated); min / **median** / max; ratio = zarr_skip / blosc alone (medians).",
        "",
        "Decoding the token ids of the realistic step in chunks of 2 MiB, one thread (MB/s, higher is faster):",
        "",
        "| blocks | blosc alone | zarr_skip | ratio |",
        "|---|---|---|---|",
    ]
    for block, got in res["frames_mb_s"].items():
        ratio = statistics.median(got["zarr_skip"]) / statistics.median(got["blosc"])
        lines.append(f"| {block} | {_mmm(got['blosc'], '{:.0f}')} | {_mmm(got['zarr_skip'], '{:.0f}')} | {ratio:.2f} |")
    lines += [
        "",
        f"Reads of the step in 8 KiB blocks, its view open, warm or cold (its files evicted before each read); "
        f"ms per read; CPU: all threads of the process; machine of {res['cores']} cores:",
        "",
        "| read | cores | blosc alone: wall | zarr_skip: wall | ratio | blosc alone: CPU | zarr_skip: CPU | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cores, ops in res["reads_ms"].items():
        for key, got in ops.items():
            op, cache = key.split()
            what = f"{res['rows']} random rows, {cache}" if op == "rows" else f"whole column, {cache}"
            cells = []
            for kind in ("wall", "cpu"):
                a, b = got["blosc"][kind], got["zarr_skip"][kind]
                cells.append(f"{_mmm(a)} | {_mmm(b)} | {statistics.median(b) / statistics.median(a):.2f}")
            lines.append(f"| {what} | {cores} | {' | '.join(cells)} |")
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.block_decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="medium", help="small, medium or large (default medium)")
    ap.add_argument("--reps", type=int, default=7, help="rounds after a warm-up (default 7)")
    ap.add_argument("--rows", type=int, default=64, help="random rows a read takes (default 64)")
    ap.add_argument("--per-round", type=int, default=60, help="reads of rows per round (default 60)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="block_decode.md/.json")
    ap.add_argument("--reads-of", type=Path, help=argparse.SUPPRESS)  # the child of _reads_in_child
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.per_round < 1:
        ap.error("--reps and --per-round must be >= 1")
    if args.reads_of is not None:
        print(json.dumps(measure_reads(args.reads_of, args.reps, args.rows, args.per_round)))
        return 0
    mon = load.guard(args)
    if mon is None:
        return 2
    run = load.run_monitored(
        mon,
        args.out,
        ".bench-tmp-blocks-",
        lambda work: measure(args.preset, args.reps, args.rows, args.per_round, work),
    )
    res = run.result
    res.update(
        started=run.started,
        command=command_line("block_decode", argv),
        reps=args.reps,
        rows=args.rows,
        preset=args.preset,
        load=run.record,
    )
    load.publish(args.out, "block_decode", res, report(res))
    return load.exit_code(run.record, args.require_quiet)


if __name__ == "__main__":
    sys.exit(main())
