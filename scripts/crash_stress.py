"""Long crash-injection run: writer processes killed with SIGKILL at random moments.

The suite runs 50 kills (tests/test_crash.py); this script runs as many as you ask for, with
the same writer and the same check after every kill: no step ever reads as complete unless
every mini-batch is bit-exact and comes from one run.

    .venv/bin/python scripts/crash_stress.py --kills 1000 --steps 24 [--location DIR]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _workers import check_complete_steps, crash_writer  # noqa: E402

import zarr_skip as zs  # noqa: E402

FINGERPRINT = {
    "experiment_name": "stress",
    "project_name": "zarr_skip",
    "gen_batch_size": 64,
    "n": 8,
    "max_prompt_length": 256,
    "max_response_length": 256,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--max-delay", type=float, default=0.3, help="seconds before a kill, at most")
    parser.add_argument("--location", type=Path, help="cache directory (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # each new run logs the leftovers it discards
    location = str(args.location or Path(tempfile.mkdtemp(prefix="zarr-skip-stress-")) / "cache")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "zarr", "zarr_skip", "_workers"])
    rng = random.Random(args.seed)
    mid_step = 0
    t0 = time.monotonic()
    for kill in range(args.kills):
        ready = ctx.Event()
        proc = ctx.Process(
            target=crash_writer, args=(location, FINGERPRINT, f"run{kill:05d}", args.steps, ready), daemon=True
        )
        proc.start()
        if not ready.wait(60):
            print(f"kill {kill}: writer did not start", file=sys.stderr)
            return 1
        time.sleep(rng.uniform(0.0, args.max_delay))
        proc.kill()
        proc.join(10)
        complete, incomplete = check_complete_steps(location, FINGERPRINT)
        mid_step += incomplete > 0
        if complete == args.steps:
            zs.open_cache(location, FINGERPRINT).gc(keep_last=0)
        if (kill + 1) % 50 == 0:
            print(f"{kill + 1} kills, {mid_step} mid-step, {time.monotonic() - t0:.0f} s: every complete step exact")
    print(f"ok: {args.kills} kills ({mid_step} while a step was being written), no wrong complete step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
