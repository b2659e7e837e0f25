"""Where a read of a few rows spends its time, against Lance's ``take()``: phase by phase, cold and warm.

Usage::

    python -m benchmarks.take_phases --preset medium --reps 60 --out benchmarks/results

The peer benchmark (:mod:`benchmarks.bench_peers`) gives one figure per format for 64 random
rows of ``responses``, the open included. This splits that figure for the two formats the
few-row target compares, on the same realistic step written once each:

* ``zarr_skip``: ``Compression("auto", blocksize=8 << 10)`` (bench_peers' ``zarr_skip_8k``),
  timed by phase: ``open_cache``, ``load(1)``, the column (``view["responses"]``), the rows
  (``col[rows]``);
* ``zarr_skip, no codec``: the same read with zstandard's decompression taken out (every zstd
  block's bytes replaced by zeros of its size: the values read are wrong): what any codec, at
  any bytes, could give back. A bound, not a setting;
* ``lance``: ``lance.dataset``, then ``take(rows, columns=["responses"])``.

Each repetition reads new random rows (the same for the three, which run in a rotated order),
each read cold (the page cache dropped first, as bench_peers does: ``--cold``) and then at
once warm (the same rows again). Repetition 0 warms up and is dropped; the rows of the two real
reads are checked against the step's every repetition, untimed. The report gives each phase's
min / median / max, the totals (each repetition's phases added) and each total's median over
Lance's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import load
from benchmarks.bench_peers import check_same_rows, to_arrow
from benchmarks.machine import REPO_ROOT, command_line
from benchmarks.measure import drop_cache, spread_text

COLUMN = "responses"
FINGERPRINT = {"bench": "take_phases"}
#: the reads compared, and the phases each is timed by
PHASES: dict[str, tuple[str, ...]] = {
    "zarr_skip": ("open_cache", "load", "column", "rows"),
    "zarr_skip, no codec": ("open_cache", "load", "column", "rows"),
    "lance": ("dataset", "take"),
}
READS = tuple(PHASES)


@contextmanager
def no_codec() -> Iterator[None]:
    """zstandard's decompression taken out of zarr_skip's reads (the blocks of small zstd
    blocks, :mod:`zarr_skip.format.zstd_blocks`): each block's bytes are zeros of its size."""
    from zarr_skip.format import zstd_blocks

    real = zstd_blocks.decompressed
    zstd_blocks.decompressed = lambda head, streams: [bytes(n) for n in head.block_sizes(range(len(streams)))]
    try:
        yield
    finally:
        zstd_blocks.decompressed = real


def _zarr_skip(root: Path, rows: Sequence[int]) -> tuple[list[float], Any]:
    import zarr_skip as zs

    t0 = time.perf_counter()
    cache = zs.open_cache(root)
    t1 = time.perf_counter()
    view = cache.load(1)
    t2 = time.perf_counter()
    col = view[COLUMN]
    t3 = time.perf_counter()
    got = col[np.asarray(rows)]
    t4 = time.perf_counter()
    return [t1 - t0, t2 - t1, t3 - t2, t4 - t3], got


def _lance(path: Path, rows: Sequence[int]) -> tuple[list[float], Any]:
    import lance

    t0 = time.perf_counter()
    dataset = lance.dataset(str(path))
    t1 = time.perf_counter()
    got = dataset.take(list(rows), columns=[COLUMN])
    t2 = time.perf_counter()
    return [t1 - t0, t2 - t1], got


def _readers(root: Path, path: Path) -> dict[str, Callable[[Sequence[int]], tuple[list[float], Any]]]:
    def bare(rows: Sequence[int]) -> tuple[list[float], Any]:
        with no_codec():
            return _zarr_skip(root, rows)

    return {
        "zarr_skip": lambda rows: _zarr_skip(root, rows),
        "zarr_skip, no codec": bare,
        "lance": lambda rows: _lance(path, rows),
    }


def measure(preset_name: str, reps: int, rows: int, work: Path, cold: str, seed: int) -> dict[str, Any]:
    """Every phase of every read, cold and warm, ``reps`` times after a warm-up."""
    import lance

    import zarr_skip as zs
    from zarr_skip.synthetic import PRESETS, as_mapping, jagged_payload

    preset = PRESETS[preset_name]
    mapping = as_mapping(jagged_payload(preset, seed, step=1, payload="realistic"))
    root, path = work / "zarr_skip", work / "step.lance"
    zs.open_cache(root, FINGERPRINT, compression=zs.Compression("auto", blocksize=8 << 10)).write(1, dict(mapping))
    lance.write_dataset(to_arrow(mapping), str(path))
    readers = _readers(root, path)
    samples = {r: {s: {p: [] for p in PHASES[r]} for s in ("cold", "warm")} for r in READS}
    rng = np.random.default_rng(seed)
    method = ""
    for rep in range(reps + 1):
        picks = sorted(rng.choice(preset.rows, rows, replace=False).tolist())
        answers = {}
        for read in READS[rep % len(READS) :] + READS[: rep % len(READS)]:
            for state in ("cold", "warm"):
                if state == "cold":
                    method = drop_cache([root, path], cold)
                times, got = readers[read](picks)
                if read != "zarr_skip, no codec":
                    answers[f"{read} {state}"] = got
                for phase, t in zip(PHASES[read], times, strict=True):
                    if rep:
                        samples[read][state][phase].append(t)
        bad = check_same_rows(answers, mapping, picks)
        if bad:
            raise RuntimeError(f"rep {rep}: rows of {COLUMN} differ from the step's in {bad}")
    return {"preset": preset_name, "rows": rows, "reps": reps, "samples_s": samples, "cold_method": method}


def _totals(phases: dict[str, list[float]]) -> list[float]:
    """Each repetition's phases added."""
    return [sum(ts) for ts in zip(*phases.values(), strict=True)]


def report(res: dict[str, Any]) -> str:
    samples = res["samples_s"]
    lines = [
        f"# Where {res['rows']} random rows of `{COLUMN}` go, against Lance's `take()`: the `{res['preset']}` step",
        "",
        load.line(res.get("load")),
        "",
        f"Run {res['started']}, command: `{res['command']}`. {res['reps']} repetitions after a warm-up, the reads in "
        f"a rotated order, each cold ({res['cold_method']}) then warm; times in ms as min / **median** / max. "
        'zarr_skip in `Compression("auto", blocksize=8 << 10)`; its `no codec` read has zstandard\'s '
        "decompression taken out (the values read are wrong: a bound, not a setting).",
        "",
        "| read | phase | cold | warm |",
        "|---|---|---|---|",
    ]
    for read in READS:
        cold, warm = samples[read]["cold"], samples[read]["warm"]
        for phase in PHASES[read]:
            lines.append(f"| {read} | {phase} | {_ms(cold[phase])} | {_ms(warm[phase])} |")
        lines.append(f"| {read} | **total** | {_ms(_totals(cold))} | {_ms(_totals(warm))} |")
    lance = {s: statistics.median(_totals(samples["lance"][s])) for s in ("cold", "warm")}
    ratios = [
        f"{read}: {statistics.median(_totals(samples[read]['cold'])) / lance['cold']:.2f} cold, "
        f"{statistics.median(_totals(samples[read]['warm'])) / lance['warm']:.2f} warm"
        for read in READS[:2]
    ]
    lines += ["", "Medians of the totals over Lance's: " + "; ".join(ratios) + ".", ""]
    return "\n".join(lines)


def _ms(values: list[float]) -> str:
    return spread_text(values, fmt="{:.2f}", scale=1e3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.take_phases",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--preset", default="medium", help="small, medium or large (default medium)")
    ap.add_argument("--reps", type=int, default=60, help="repetitions after the warm-up (default 60)")
    ap.add_argument("--rows", type=int, default=64, help="random rows read (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cold", choices=("auto", "drop_caches", "fadvise"), default="auto", help="as in bench.py")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="take_phases_<preset>.*")
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    mon = load.guard(args)
    if mon is None:
        return 2
    run = load.run_monitored(
        mon,
        args.out,
        ".bench-tmp-take-",
        lambda work: measure(args.preset, args.reps, args.rows, work, args.cold, args.seed),
    )
    res = dict(run.result, started=run.started, command=command_line("take_phases", argv), load=run.record)
    load.publish(args.out, f"take_phases_{args.preset}", res, report(res))
    return load.exit_code(run.record, args.require_quiet)


if __name__ == "__main__":
    sys.exit(main())
