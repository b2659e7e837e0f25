"""The adversarial sweep at size: random damage to a cache, every read checked.

The suite runs a short sweep (tests/test_adversarial.py); this script runs as many damages as
you ask for (``tests/_adversary.py`` has the list: bit flips, truncations and deletions of any
file, swaps of chunks, records, data groups, mini-batch and step directories, records edited
with their checksums recomputed, forged lengths chunks, one-byte edits of the experiment
record, edited block tables and ``first_rows``), each on a fresh copy of the same cache
(``--cache``: ``plain``; ``blocked``, whose token ids reads of a few rows take by the block;
``lz4``, every array in small lz4 blocks; or the checked-in caches of older formats,
``format2`` and ``format3``), read as local files
or (``--as-remote``) through the Store path S3 takes, and prints

- silently wrong reads: a read that returned other data than was written (must be 0);
- the verify detection rate: of the damages that change what a reader gets (a read raises
  or is wrong), the share ``verify()`` reports (must be 100%);
- untyped exceptions: errors outside the ``ZarrSkipError`` tree (must be 0).

With ``--gc``, gc runs after each damage instead (strays removed at any age), and the script
counts the damages after which gc took a read that was right before it (must be 0). With
``--write``, a new run writes every step (two mini-batches, without ``overwrite``) after each
damage, counted the same way: a write replaces or removes no step that read right.

Format 2 records do not name their place: a chunk or record swapped there may read wrong
unnoticed, on steps ``verify()`` lists as unbound. Such trials are counted apart (``excused``)
and do not fail the run; the detection rate counts them as missed.

    .venv/bin/python scripts/adversarial_sweep.py [--corruptions 120] [--seed 0] [--cache blocked] \\
        [--as-remote | --gc | --write]

Exit status 1 when any of the three figures is off (format 2: beyond its excused swaps).
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _adversary import KINDS, sweep, then_sweep  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corruptions", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", choices=KINDS, default="plain", help="the cache to damage (default: plain)")
    parser.add_argument(
        "--as-remote", action="store_true", help="read through the Store path S3 takes (ranged gets across holes)"
    )
    parser.add_argument("--gc", action="store_true", help="run gc after each damage; count the reads it took")
    parser.add_argument(
        "--write", action="store_true", help="a new run writes every step after each damage; count the reads it took"
    )
    parser.add_argument("--verbose", action="store_true", help="print every damage and what it did")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # every damage is logged as it is found; the figures say it all
    start = time.perf_counter()
    if args.gc or args.write:
        return then_figures(args.corruptions, args.seed, args.cache, "gc" if args.gc else "write", start)
    with tempfile.TemporaryDirectory(prefix="zarr-skip-sweep-") as tmp:
        figures = sweep(Path(tmp), args.corruptions, args.seed, args.cache, args.as_remote)
    kinds: collections.Counter[str] = collections.Counter(t.damage.split(" ")[0] for t in figures.trials)
    for t in figures.trials:
        if args.verbose or t.wrong or t.untyped or (t.changed and not t.flagged):
            state = "changed" if t.changed else "unchanged"
            print(f"{t.damage}: {state}, {'flagged' if t.flagged else 'not flagged'}")
            for line in t.wrong + t.untyped:
                print("    " + line.replace("\n", "\n    "))
    print(f"corruptions:            {len(figures.trials)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
    print(f"changed what is read:   {figures.changed}")
    print(f"silently wrong reads:   {figures.wrong}")
    caught = figures.changed - len(figures.missed)
    print(f"verify detection rate:  {figures.detection:.1%} ({caught} of {figures.changed})")
    print(f"untyped exceptions:     {figures.untyped}")
    if figures.excused:
        print(f"excused (format 2):     {len(figures.excused)} swaps on steps verify lists as unbound")
    print(f"time:                   {time.perf_counter() - start:.1f} s")
    return 1 if figures.failed else 0


def then_figures(n: int, seed: int, kind: str, then: str, start: float) -> int:
    """``--gc`` / ``--write``: damage, then gc (strays at any age) or a new run's writes of
    every step (without overwrite), and count the damages after which it took a read that was
    right before it (must be 0)."""
    with tempfile.TemporaryDirectory(prefix="zarr-skip-sweep-") as tmp:
        trials = then_sweep(Path(tmp), n, seed, kind, then)
    lost = [(damage, reads) for damage, reads in trials if reads]
    for damage, reads in lost:
        print(f"{damage}: {then} took {len(reads)} read(s) that were right, such as {reads[0]}")
    print(f"{f'corruptions, then {then}:':<23} {n}")
    print(f"{f'reads taken by {then}:':<23} {len(lost)} corruptions after which {then} took a read that was right")
    print(f"time:                   {time.perf_counter() - start:.1f} s")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
