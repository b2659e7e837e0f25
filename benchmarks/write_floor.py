"""What a zarr_skip write of the realistic step cannot avoid, against the plain dump, in one run.

Usage::

    python -m benchmarks.write_floor --preset medium --reps 9 --out benchmarks/results/realistic

Each repetition times, one after the other on the same machine (medians reported):

* ``dump``: the plain dump of the step's tensors and lists (the speed of an uncompressed
  dump): :func:`benchmarks.baseline.timed_dump`, the definition ``plain_dump_realistic`` in
  ``bench.py`` uses too (``torch.save`` to one file, not fsynced, after an untimed sync);
* ``write``: ``Cache.write`` of the same step (as ``zarr_skip_realistic``);
* ``encode``: ``encode_batch`` alone (narrowing, repeated rows, JSON of the per-row objects);
* ``compress``: every chunk of the encoded step compressed as the writer does, on the writer's
  pool (one thread per core), with nothing else running and no file written;
  ``compress_1thread`` the same in one thread (the CPU work);
* ``files``: creating the step's directories and files in one thread, each file holding the
  bytes a write stored (copied from a reference write), with no encoding, no temp files and no
  records.

Nothing is deleted until every repetition is done (deleting files makes the next file
creations slower on this machine's file system: benchmarks/README.md, "Deletions and file
creation").

All three are CPU work on the same cores (the files' is the kernel's; ``encode`` is Python
holding the interpreter): ``encode + compress + files`` is what the write costs when only the
compression is spread over the cores, and ``encode + compress_1thread + files`` spread
perfectly over them would still take that sum divided by their count (``ideal``); at the
speed-up the machine gives compression in the same run (``compress_1thread / compress``) it
takes that sum divided by the speed-up, taken between 1 and the core count (``achievable``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.baseline import DEFINITION, timed_dump
from benchmarks.formats import FORMAT_CLASSES
from benchmarks.machine import machine_info


def _layout(root: Path) -> tuple[list[str], list[tuple[str, bytes]]]:
    dirs = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir())
    files = [(str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*") if p.is_file()]
    return dirs, files


def _chunk_jobs(encoded: Any, compression: Any) -> list[tuple[Any, slice, Any]]:
    from zarr_skip.format import chunks
    from zarr_skip.store.chunkjobs import chunking

    jobs = []
    for col in encoded.columns:
        for arr in col.arrays.values():
            _, rows, codec = chunking(arr, compression, chunks.DEFAULT_CHUNK_BYTES)
            jobs += [(arr, r, codec) for r in rows]
    return jobs


def _compress(job: tuple[Any, slice, Any]) -> bytes:
    from zarr_skip.store.chunkjobs import encode_chunk

    return encode_chunk(*job)


def measure(preset_name: str, reps: int, work: Path) -> dict[str, Any]:
    from zarr_skip.format import chunks
    from zarr_skip.format.columns import encode_batch
    from zarr_skip.store import _localfs
    from zarr_skip.synthetic import as_mapping
    from zarr_skip.synthetic.rollouts import PRESETS

    fmt = FORMAT_CLASSES["zarr_skip_realistic"](PRESETS[preset_name])
    data = fmt.make(0)
    flat = as_mapping(data)
    ref = work / "reference"
    fmt.write(fmt.prepare_write(ref), ref, data)
    dirs, files = _layout(ref)
    pool = ThreadPoolExecutor(_localfs.workers())
    parts = ("dump", "write", "encode", "compress_1thread", "compress", "files")
    times: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(reps):
        d = Path(tempfile.mkdtemp(dir=work))
        # before each timed part an untimed os.sync(): earlier writeback must not land in it
        times["dump"].append(timed_dump(flat, d))
        ctx = fmt.prepare_write(d / "cache")
        os.sync()
        t = time.perf_counter()
        fmt.write(ctx, d / "cache", data)
        times["write"].append(time.perf_counter() - t)
        t = time.perf_counter()
        encoded = encode_batch(as_mapping(data))
        times["encode"].append(time.perf_counter() - t)
        jobs = _chunk_jobs(encoded, chunks.Compression())
        t = time.perf_counter()
        for job in jobs:
            _compress(job)
        times["compress_1thread"].append(time.perf_counter() - t)
        t = time.perf_counter()
        list(pool.map(_compress, jobs))
        times["compress"].append(time.perf_counter() - t)
        tree = d / "files"
        os.sync()
        t = time.perf_counter()
        os.mkdir(tree)
        for name in dirs:
            os.mkdir(tree / name)
        for name, blob in files:
            fd = os.open(tree / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.write(fd, blob)
            os.close(fd)
        times["files"].append(time.perf_counter() - t)
    pool.shutdown()  # the repetitions' files are removed with ``work``, after the measurements
    med = {k: statistics.median(v) for k, v in times.items()}
    # between 1 (no gain from the pool) and one per core
    speedup = min(max(med["compress_1thread"] / med["compress"], 1.0), float(_localfs.workers()))
    return {
        "preset": preset_name,
        "reps": reps,
        "files": len(files),
        "directories": len(dirs),
        "stored_bytes": sum(len(b) for _, b in files),
        "chunks": len(jobs),
        "samples_s": times,
        "median_s": med,
        "vs_dump": {k: v / med["dump"] for k, v in med.items()},
        "parts_sum_vs_dump": (med["encode"] + med["compress"] + med["files"]) / med["dump"],
        "ideal_vs_dump": (med["encode"] + med["compress_1thread"] + med["files"]) / _localfs.workers() / med["dump"],
        "cores": _localfs.workers(),
        "speedup": speedup,
        "achievable_vs_dump": (med["encode"] + med["compress_1thread"] + med["files"]) / speedup / med["dump"],
        "machine": machine_info(work),
        "loadavg": os.getloadavg(),
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        f"# What a write of the realistic `{r['preset']}` step cannot avoid",
        "",
        load.line(r.get("load")),
        "",
        f"{r['reps']} repetitions (medians, min / max), one run; `python -m benchmarks.write_floor`. The step: "
        f"{r['files']} files in {r['directories']} directories, {r['stored_bytes'] / 2**20:.2f} MiB stored, "
        f"{r['chunks']} chunks. Load average at the end: {'/'.join(f'{x:.1f}' for x in r['loadavg'])}. "
        f"The baseline: {DEFINITION}, in this process.",
        "",
        "| part | median | min | max | / plain dump |",
        "|---|---|---|---|---|",
    ]
    for k, v in r["median_s"].items():
        s = r["samples_s"][k]
        lines.append(
            f"| {k} | {v * 1e3:.1f} ms | {min(s) * 1e3:.1f} ms | {max(s) * 1e3:.1f} ms | {r['vs_dump'][k]:.2f} |"
        )
    lines += [
        "",
        f"encode + compress + files: {r['parts_sum_vs_dump']:.2f} x the dump; all of it spread perfectly "
        f"over {r['cores']} cores (`ideal`): {r['ideal_vs_dump']:.2f} x; at the {r['speedup']:.2f}x speed-up "
        f"the cores gave compression in this run (`achievable`): {r['achievable_vs_dump']:.2f} x. "
        "The write's target: 1.2 x.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="medium")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument(
        "--out", type=Path, default=None, help="directory for write_floor_{preset}.md / .json (created if missing)"
    )
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    mon = load.guard(args)
    if mon is None:
        return 2
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".write-floor-", dir=args.out or None))
    mon.start()
    try:
        r = measure(args.preset, args.reps, work)
    finally:
        record = mon.stop()
        shutil.rmtree(work, ignore_errors=True)
    r["load"] = record
    r["baseline"] = DEFINITION
    text = report(r)
    print(text)
    if args.out:
        (args.out / f"write_floor_{args.preset}.md").write_text(text)
        (args.out / f"write_floor_{args.preset}.json").write_text(json.dumps(r, indent=1, default=str))
    return load.exit_code(record, args.require_quiet)


if __name__ == "__main__":
    sys.exit(main())
