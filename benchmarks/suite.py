"""``make bench``: every benchmark, one after the other, under one record of the machine's load.

Usage::

    python -m benchmarks.suite --require-quiet            # what `make bench` runs
    python -m benchmarks.suite --quick --out /tmp/b       # the smallest preset, 1 repetition: a smoke test

The load is probed once, here, before anything runs (the load average after one of the suite's
own parts says nothing about other work), and handed to every part through
``$ZARR_SKIP_BENCH_LOAD_BEFORE``; each part records the load during its own run
(:mod:`benchmarks.load`). The parts (each a ``python -m benchmarks.<part>`` subprocess):

========================  ==================================================  =======================
part                      what                                                results (in ``--out``)
========================  ==================================================  =======================
``bench``                 zarr_skip vs verl's formats and the plain dump      ``medium.{md,json}``
``bench_peers``           parquet and Lance on the realistic step             ``peers_medium.*``
``bench_shared``          4 mini-batches on a FUSE mount and S3 vs local      ``shared_medium.*``
``write_floor``           what a write cannot avoid, against the plain dump   ``realistic/write_floor_medium.*``
``bench_tables``          columns as arrays, ``Cache.table``, import time     ``tables.*``
``bench_data``            torch datasets, random items, Ray vs ``table()``    ``data.*``
``few_rows``              a few rows vs the whole column: blocks and codecs   ``few_rows.*``
``block_decode``          small zstd blocks: blosc alone vs through zstandard ``block_decode.*``
========================  ==================================================  =======================

Then ``suite.{md,json}``: each part's command, exit code, duration and load verdict, and the
performance table of :mod:`benchmarks.summary` built from this run's results (figures of
quiet runs only). Exit code: the largest of the parts' (0 all fine, 1 a target FAIL, 2 refused
on a busy machine, 3 became busy during a part, 4 a part crashed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.machine import REPO_ROOT


def parts(out: Path, quick: bool) -> list[tuple[str, list[str]]]:
    """The suite's parts and their arguments (``quick``: smallest preset, one repetition)."""
    preset = "small" if quick else "medium"
    if quick:
        return [
            ("bench", ["--preset", preset, "--reps", "1", "--status-steps", "10", "--dd-mib", "8",
                       "--cold", "fadvise", "--out", str(out)]),
            ("bench_peers", ["--preset", preset, "--reps", "1", "--cold", "fadvise", "--out", str(out)]),
            ("bench_shared", ["--preset", preset, "--reps", "1", "--out", str(out)]),
            ("write_floor", ["--preset", preset, "--reps", "1", "--out", str(out / "realistic")]),
            ("bench_tables", ["--parts", "arrays,tables,imports", "--steps", "3", "--preset", preset,
                              "--array-preset", preset, "--reps", "1", "--out", str(out)]),
            ("bench_data", ["--preset", preset, "--steps", "2", "--items", "50", "--reps", "1", "--out", str(out)]),
            ("few_rows", ["--presets", preset, "--reps", "1", "--out", str(out)]),
            ("block_decode", ["--preset", preset, "--reps", "1", "--per-round", "5", "--out", str(out)]),
        ]  # fmt: skip
    return [
        ("bench", ["--preset", preset, "--reps", "5", "--out", str(out)]),
        ("bench_peers", ["--preset", preset, "--reps", "7", "--out", str(out)]),
        ("bench_shared", ["--preset", preset, "--reps", "5", "--out", str(out)]),
        ("write_floor", ["--preset", preset, "--reps", "11", "--out", str(out / "realistic")]),
        ("bench_tables", ["--reps", "3", "--out", str(out)]),  # its S3 loop baseline alone takes ~25 s a rep
        ("bench_data", ["--preset", preset, "--steps", "8", "--reps", "3", "--out", str(out)]),
        ("few_rows", ["--presets", "medium,large", "--reps", "7", "--out", str(out)]),
        ("block_decode", ["--preset", preset, "--reps", "7", "--out", str(out)]),
    ]


def run_part(name: str, argv: list[str], env: dict[str, str], require_quiet: bool) -> dict[str, Any]:
    """Run one part as a subprocess; its exit code and duration."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *argv, *(["--require-quiet"] if require_quiet else [])]
    print(f"== {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    code = subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=False, stdout=subprocess.DEVNULL).returncode
    seconds = time.monotonic() - t0
    print(f"== {name}: exit {code} after {seconds:.0f} s", file=sys.stderr, flush=True)
    return {"part": name, "command": "python " + " ".join(cmd[1:]), "exit": code, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.suite", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="results directory")
    ap.add_argument("--quick", action="store_true", help="smallest preset, 1 repetition (a smoke test)")
    ap.add_argument("--only", default=None, help="comma-separated subset of the parts")
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    mon = load.guard(args)
    if mon is None:
        return 2
    before = mon.take_before()
    env = dict(os.environ, **{load.BEFORE_ENV: json.dumps(before)})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    # the parts judge by the suite's thresholds (the page-cache probe's result they inherit)
    t = mon.thresholds
    flags = {"--quiet-load": t.load_per_core, "--quiet-cpu": t.other_cpu, "--quiet-page-cache": t.page_cache_mb_s}
    extra = [] if t == load.DEFAULT_THRESHOLDS else [str(x) for kv in flags.items() for x in kv]
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only.split(",")) if args.only else None
    started = datetime.now(UTC).isoformat(timespec="seconds")
    runs = [
        run_part(name, [*a, *extra], env, args.require_quiet)
        for name, a in parts(args.out, args.quick)
        if wanted is None or name in wanted
    ]
    from benchmarks.summary import suite_markdown

    res = {"started": started, "quick": args.quick, "before": before, "parts": runs}
    (args.out / "suite.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "suite.md").write_text(suite_markdown(res, args.out))
    print((args.out / "suite.md").read_text())
    codes = [r["exit"] for r in runs]
    return max([c if c in (0, 1, 2, 3) else 4 for c in codes], default=0)


if __name__ == "__main__":
    sys.exit(main())
