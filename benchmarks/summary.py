"""The performance table, built from the results of one ``make bench`` run, quiet runs only.

``python -m benchmarks.summary [--out benchmarks/results] [--preset medium]`` (also the end of
``benchmarks.suite``) reads the JSON results of ``bench.py`` (``medium.json``),
``bench_peers.py`` (``peers_medium.json``), ``bench_shared.py`` (``shared_medium.json``) and
``write_floor.py`` (``realistic/write_floor_medium.json``) and prints one markdown table: per
row the contender's and the reference's min / median / max and the ratio of the medians, and
the run it comes from. A row whose run was BUSY (its ``load`` record, :mod:`benchmarks.load`)
or has no load record shows no figures, only why: the table never mixes in figures from a
loaded machine. The row layout is the one of benchmarks/README.md's performance table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.machine import REPO_ROOT
from benchmarks.measure import spread, spread_text

#: (label, source, contender, reference) of each row; a source's keys are read by :func:`_samples`
Row = tuple[str, str, tuple[str, ...], tuple[str, ...] | None]
ROWS: list[Row] = [
    ("realistic step, write vs the plain dump", "bench", ("zarr_skip_realistic", "write"),
     ("plain_dump_realistic", "write")),
    ("realistic step, cold read vs the plain dump", "bench", ("zarr_skip_realistic", "read_cold"),
     ("plain_dump_realistic", "read_cold")),
    ("realistic step, write vs verl's `tq_batch.pt`", "bench", ("zarr_skip_realistic", "write"),
     ("tq_batch_realistic", "write")),
    ("realistic step, cold read vs `tq_batch.pt`", "bench", ("zarr_skip_realistic", "read_cold"),
     ("tq_batch_realistic", "read_cold")),
    ("jagged step, write vs `torch.save`", "bench", ("zarr_skip_jagged", "write"), ("torch_save_jagged", "write")),
    ("jagged step, cold read vs `torch.save`", "bench", ("zarr_skip_jagged", "read_cold"),
     ("torch_save_jagged", "read_cold")),
    ("jagged step, one column, cold", "bench", ("zarr_skip_jagged", "column_cold"),
     ("torch_save_jagged", "column_cold")),
    ("jagged step, first 64 rows, cold", "bench", ("zarr_skip_jagged", "rows64_cold"),
     ("torch_save_jagged", "rows64_cold")),
    ("padded step, write vs pickle", "bench", ("zarr_skip_padded", "write"), ("pickle_padded", "write")),
    ("padded step, cold read vs pickle", "bench", ("zarr_skip_padded", "read_cold"), ("pickle_padded", "read_cold")),
    ("write, parts: the write vs the plain dump (write_floor)", "write_floor", ("write",), ("dump",)),
    ("peers: parquet write vs zarr_skip", "peers", ("parquet", "write"), ("zarr_skip", "write")),
    ("peers: parquet cold read vs zarr_skip", "peers", ("parquet", "read"), ("zarr_skip", "read")),
    ("peers: parquet one column vs zarr_skip", "peers", ("parquet", "column"), ("zarr_skip", "column")),
    ("peers: parquet 64 random rows vs zarr_skip", "peers", ("parquet", "rows64"), ("zarr_skip", "rows64")),
    ("peers: Lance write vs zarr_skip", "peers", ("lance", "write"), ("zarr_skip", "write")),
    ("peers: Lance cold read vs zarr_skip", "peers", ("lance", "read"), ("zarr_skip", "read")),
    ("peers: Lance one column vs zarr_skip", "peers", ("lance", "column"), ("zarr_skip", "column")),
    ("peers: Lance `take()` of 64 random rows vs zarr_skip `col[rows]`", "peers", ("lance", "rows64"),
     ("zarr_skip", "rows64")),
    ("4 mini-batches on the FUSE mount vs local disk: write", "shared", ("fuse", "write_s"), ("local", "write_s")),
    ("the same: read", "shared", ("fuse", "read_s"), ("local", "read_s")),
    ("4 mini-batches on S3 vs local disk: write", "shared", ("s3", "write_s"), ("local", "write_s")),
    ("the same: read", "shared", ("s3", "read_s"), ("local", "read_s")),
]  # fmt: skip
SOURCES = {
    "bench": "{preset}.json",
    "peers": "peers_{preset}.json",
    "shared": "shared_{preset}.json",
    "write_floor": "realistic/write_floor_{preset}.json",
}


def _samples(source: str, res: Mapping[str, Any], key: Sequence[str]) -> list[float] | None:
    """The samples (seconds) ``key`` names in the results ``res`` of ``source``."""
    try:
        if source == "bench":
            got = res["result"]["formats"][key[0]][key[1]]["samples"]
        elif source == "peers":
            got = res["samples_s"][key[0]][key[1]]
        elif source == "shared":
            got = res["backends"][key[0]][key[1]]
        else:
            got = res["samples_s"][key[0]]
    except (KeyError, TypeError):
        return None
    return [float(x) for x in got] or None


def load_record(source: str, res: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The load record of a run (``bench.py`` keeps it with the preset's result)."""
    rec = res.get("result", {}).get("load") if source == "bench" else res.get("load")
    return rec if isinstance(rec, Mapping) and "busy" in rec else None


def _mmm(v: Sequence[float]) -> str:
    return spread_text(v, scale=1e3)


def _median(v: Sequence[float]) -> float:
    return spread(v)[1]


def table(results: Mapping[str, Mapping[str, Any] | None], preset: str = "medium") -> list[str]:
    """The performance table's lines from the loaded results of each source (None: missing)."""
    names = {k: v.format(preset=preset) for k, v in SOURCES.items()}
    lines = [
        "| what | contender, ms: min / **median** / max | reference, ms: min / **median** / max | ratio | run |",
        "|---|---|---|---|---|",
    ]
    for label, source, key, ref in ROWS:
        res = results.get(source)
        if res is None:
            lines.append(f"| {label} | | | | no result ({names[source]}) |")
            continue
        rec = load_record(source, res)
        if rec is None or rec["busy"]:
            why = "BUSY run: not shown" if rec else "no load record: not shown"
            lines.append(f"| {label} | | | | {why} ({names[source]}) |")
            continue
        a, b = _samples(source, res, key), _samples(source, res, ref) if ref else None
        if a is None or (ref and b is None):
            lines.append(f"| {label} | | | | not measured ({names[source]}) |")
            continue
        ratio = f"{_median(a) / _median(b):.2f}" if b else ""
        lines.append(f"| {label} | {_mmm(a)} | {_mmm(b) if b else ''} | {ratio} | quiet ({names[source]}) |")
    return lines


def read_results(out: Path, preset: str = "medium") -> dict[str, dict[str, Any] | None]:
    """Each source's JSON in ``out`` (None where there is none)."""
    found: dict[str, dict[str, Any] | None] = {}
    for source, name in SOURCES.items():
        path = out / name.format(preset=preset)
        found[source] = json.loads(path.read_text()) if path.is_file() else None
    return found


def suite_markdown(res: Mapping[str, Any], out: Path) -> str:
    """``suite.md``: the parts of a suite run, then the performance table of its results."""
    before = res["before"]
    other = before.get("other_cpu")
    lines = [
        "# `make bench`" + (" (quick)" if res.get("quick") else ""),
        "",
        f"Started {res['started']}; load before: load average "
        + "/".join(f"{x:.1f}" for x in before["loadavg"])
        + (f", other processes {other:.0%} of the CPU" if other is not None else "")
        + ".",
        "",
        "| part | exit | seconds | command |",
        "|---|---|---|---|",
    ]
    for p in res["parts"]:
        lines.append(f"| {p['part']} | {p['exit']} | {p['seconds']:.0f} | `{p['command']}` |")
    total = sum(p["seconds"] for p in res["parts"])
    lines += ["", f"Total: {total / 60:.1f} min.", "", "## Performance table (quiet runs only)", ""]
    preset = "small" if res.get("quick") else "medium"
    lines += [f"The `{preset}` step; ratio = contender / reference (medians of the same run).", ""]
    lines += table(read_results(out, preset), preset)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="results directory")
    ap.add_argument("--preset", default="medium")
    args = ap.parse_args(argv)
    print("\n".join(table(read_results(args.out, args.preset), args.preset)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
