"""zarr_skip against its peers, parquet and Lance, on the same realistic step in one run.

Usage::

    python -m benchmarks.bench_peers --preset medium --reps 7 --out benchmarks/results

The step is ``as_mapping(jagged_payload(preset, seed, step=1, payload="realistic"))``: jagged
token ids, masks and log-probs (NestedTensors), per-row lengths, strings and per-row objects
(dicts and lists, shared by the rows of a GRPO group). Four formats store it:

* ``zarr_skip``: ``open_cache(dir, fingerprint).write(1, mapping)`` (public API only);
* ``parquet``: one pyarrow Table (jagged tensors as ``list<...>`` columns built from the
  NestedTensor's values and offsets, strings as strings, per-row objects as JSON strings)
  written by ``pyarrow.parquet.write_table`` with zstd level 1, into one file;
* ``lance``: the same Table through ``lance.write_dataset`` (its defaults);
* ``plain_dump``: the plain dump (:mod:`benchmarks.baseline`), for scale;
* ``zarr_skip_lz4`` and ``zarr_skip_none``: zarr_skip written with ``compression="lz4"``
  (blosc-lz4 level 5, shuffled) and ``compression=None``: the trade-off between bytes and the
  speed of a cold read, on the same step in the same run (``benchmarks/README.md``);
* ``zarr_skip_8k``: zarr_skip written with ``Compression("auto", blocksize=8 << 10)`` (token ids
  in 8 KiB blosc blocks, which a read of a few rows fetches and decodes alone): the setting for
  caches read a few rows at a time, beside Lance's ``take()``;
* ``zarr_skip_lz4_8k``: ``Compression("lz4", blocksize=8 << 10)``: every array in 8 KiB lz4
  blocks (:mod:`zarr_skip.format.lz4_blocks`), faster to decode than zstd, for more bytes.

Building the Table is part of the timed write, as the conversion of the TransferQueue payload
is part of zarr_skip's write in ``bench.py``. Operations, each timed (the open included) after
the page cache was dropped for the format's files (``--cold``, as in ``bench.py``):

* ``write``;
* ``read``: everything (zarr_skip ``load(1).to_dict()``, parquet ``read_table``, Lance
  ``to_table()``; the peers give Arrow tables whose JSON strings are not parsed, zarr_skip
  Python objects: in the peers' favour);
* ``column``: ``responses`` alone (zarr_skip ``load(1)["responses"][:]``, parquet and Lance
  with ``columns=["responses"]``);
* ``rows64``: 64 random rows of ``responses`` (new rows each repetition, the same for every
  format): zarr_skip ``col[rows]``, Lance ``take(rows, columns=["responses"])``, parquet the
  row groups that hold the rows (pyarrow has no finer row selection; the default writer puts
  the whole step in one row group) then ``take``; the plain dump loads everything.

Repetition 0 warms every format up (imports, thread pools, Lance's runtime) and is dropped;
each repetition runs the formats in a rotated order, so drifts of the machine hit all of them.
The report gives min / median / max and each peer's median over zarr_skip's, bytes on disk
(allocated) and the number of files. Nothing is deleted until every repetition is done.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.baseline import DEFINITION, plain_dump, plain_load
from benchmarks.formats import fingerprint
from benchmarks.machine import REPO_ROOT, command_line, machine_info
from benchmarks.measure import disk_usage, drop_cache, spread

logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)

STEP = 1
COLUMN = "responses"
ROWS = 64
FORMATS = (
    "zarr_skip",
    "parquet",
    "lance",
    "plain_dump",
    "zarr_skip_lz4",
    "zarr_skip_none",
    "zarr_skip_8k",
    "zarr_skip_lz4_8k",
)
#: zarr_skip with other compressions than the default (name, blosc block bytes: of the token
#: ids under ``auto``, of every array for ``lz4``; 0: the default's, or blosc's own): the bytes /
#: cold-read trade-off, and the few-row settings
VARIANTS: dict[str, tuple[str | None, int]] = {
    "zarr_skip_lz4": ("lz4", 0),
    "zarr_skip_none": (None, 0),
    "zarr_skip_8k": ("auto", 8 << 10),
    "zarr_skip_lz4_8k": ("lz4", 8 << 10),
}
OPS = ("write", "read", "column", "rows64")
OP_LABEL = {
    "write": "write",
    "read": "full read, cold",
    "column": f"one column (`{COLUMN}`), cold",
    "rows64": f"{ROWS} random rows of `{COLUMN}`, cold",
}
PARQUET_FILE = "step.parquet"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- Arrow conversion


def to_arrow(mapping: Mapping[str, Any]) -> Any:
    """The step as one pyarrow Table: jagged tensors as list columns, objects as JSON strings."""
    import pyarrow as pa
    import torch

    cols: dict[str, Any] = {}
    for name, v in mapping.items():
        if isinstance(v, torch.Tensor) and v.is_nested:
            nt: Any = v  # a jagged NestedTensor: values() and offsets()
            offsets = pa.array(nt.offsets().numpy().astype("int32"))
            cols[name] = pa.ListArray.from_arrays(offsets, pa.array(v.values().numpy()))
        elif isinstance(v, torch.Tensor):
            cols[name] = pa.array(v.numpy())
        elif all(isinstance(x, str) for x in v):
            cols[name] = pa.array(v, type=pa.string())
        else:
            cols[name] = pa.array([json.dumps(x) for x in v], type=pa.string())
    return pa.table(cols)


def _row_groups_holding(meta: Any, rows: Sequence[int]) -> tuple[list[int], list[int]]:
    """The row groups of a parquet file that hold ``rows``, and where each row lies in them
    once they are read and concatenated."""
    starts, n = [], 0
    for i in range(meta.num_row_groups):
        starts.append(n)
        n += meta.row_group(i).num_rows
    starts.append(n)
    group_of = [max(i for i in range(meta.num_row_groups) if starts[i] <= r) for r in rows]
    groups = sorted(set(group_of))
    base, at = {}, 0  # first position of each read group in the concatenation
    for g in groups:
        base[g] = at
        at += starts[g + 1] - starts[g]
    return groups, [base[g] + r - starts[g] for g, r in zip(group_of, rows, strict=True)]


# --------------------------------------------------------------------------- the formats


class ZarrSkipPeer:
    """zarr_skip through its public API (``compression`` as ``open_cache`` takes it; with
    ``blocksize``, ``Compression(compression, blocksize=blocksize)``)."""

    def __init__(self, preset: Any, compression: str | None = "auto", blocksize: int = 0) -> None:
        self.fp = fingerprint(preset)
        self.compression = compression
        self.blocksize = blocksize

    def write(self, mapping: Mapping[str, Any], d: Path) -> None:
        import zarr_skip as zs

        compression: Any = self.compression
        if self.blocksize and compression is not None:
            compression = zs.Compression(compression, blocksize=self.blocksize)
        zs.open_cache(str(d), fingerprint=self.fp, compression=compression).write(STEP, dict(mapping))

    def _view(self, d: Path) -> Any:
        import zarr_skip as zs

        return zs.open_cache(str(d), fingerprint=self.fp).load(STEP)

    def read(self, d: Path) -> Any:
        return self._view(d).to_dict()

    def column(self, d: Path) -> Any:
        return self._view(d)[COLUMN][:]

    def rows(self, d: Path, rows: Sequence[int]) -> Any:
        import numpy as np

        return self._view(d)[COLUMN][np.asarray(rows)]


class ParquetPeer:
    """pyarrow parquet, zstd level 1, one file."""

    def write(self, mapping: Mapping[str, Any], d: Path) -> None:
        import pyarrow.parquet as pq

        pq.write_table(to_arrow(mapping), d / PARQUET_FILE, compression="zstd", compression_level=1)

    def read(self, d: Path) -> Any:
        import pyarrow.parquet as pq

        return pq.read_table(d / PARQUET_FILE)

    def column(self, d: Path) -> Any:
        import pyarrow.parquet as pq

        return pq.read_table(d / PARQUET_FILE, columns=[COLUMN])

    def rows(self, d: Path, rows: Sequence[int]) -> Any:
        import pyarrow.parquet as pq

        f = pq.ParquetFile(d / PARQUET_FILE)
        groups, where = _row_groups_holding(f.metadata, rows)
        return f.read_row_groups(groups, columns=[COLUMN]).take(where)


class LancePeer:
    """Lance (pylance), its default settings."""

    def write(self, mapping: Mapping[str, Any], d: Path) -> None:
        import lance

        lance.write_dataset(to_arrow(mapping), str(d / "step.lance"))

    def read(self, d: Path) -> Any:
        import lance

        return lance.dataset(str(d / "step.lance")).to_table()

    def column(self, d: Path) -> Any:
        import lance

        return lance.dataset(str(d / "step.lance")).to_table(columns=[COLUMN])

    def rows(self, d: Path, rows: Sequence[int]) -> Any:
        import lance

        return lance.dataset(str(d / "step.lance")).take(list(rows), columns=[COLUMN])


class PlainDumpPeer:
    """The plain dump (``benchmarks.baseline``): every read loads the whole file."""

    def write(self, mapping: Mapping[str, Any], d: Path) -> None:
        plain_dump(mapping, d)

    def read(self, d: Path) -> Any:
        return plain_load(d)

    def column(self, d: Path) -> Any:
        return plain_load(d)[COLUMN]

    def rows(self, d: Path, rows: Sequence[int]) -> Any:
        parts = plain_load(d)[COLUMN].unbind()
        return [parts[r] for r in rows]


def make_peers(preset: Any, wanted: Sequence[str]) -> dict[str, Any]:
    """The formats to compare; Lance is left out (with the reason logged) when not installed."""
    peers: dict[str, Any] = {"zarr_skip": ZarrSkipPeer(preset), "parquet": ParquetPeer()}
    try:
        import lance  # noqa: F401

        peers["lance"] = LancePeer()
    except ImportError:
        log("lance is not installed (pip install 'zarr-skip[bench]'): left out")
    peers["plain_dump"] = PlainDumpPeer()
    peers.update({name: ZarrSkipPeer(preset, *setting) for name, setting in VARIANTS.items()})
    return {k: v for k, v in peers.items() if k in wanted}


# --------------------------------------------------------------------------- the run


def _read_op(peer: Any, op: str, d: Path, rows: Sequence[int]) -> Any:
    if op == "read":
        return peer.read(d)
    if op == "column":
        return peer.column(d)
    return peer.rows(d, rows)


def _rotated(names: Sequence[str], rep: int) -> list[str]:
    k = rep % len(names)
    return [*names[k:], *names[:k]]


def check_same_rows(got: Mapping[str, Any], mapping: Mapping[str, Any], rows: Sequence[int]) -> list[str]:
    """The formats whose ``rows64`` answer differs from the step's rows (untimed check)."""
    want = [mapping[COLUMN].unbind()[r].tolist() for r in rows]
    bad = []
    for name, res in got.items():
        if hasattr(res, "column"):  # an Arrow table
            values = res.column(COLUMN).to_pylist()
        elif hasattr(res, "is_nested"):
            values = [t.tolist() for t in res.unbind()]
        else:
            values = [t.tolist() for t in res]
        if values != want:
            bad.append(name)
    return bad


def measure(preset_name: str, reps: int, work: Path, cold: str, seed: int, wanted: Sequence[str]) -> dict[str, Any]:
    """Every sample of every format; rep 0 is the warm-up and is not kept."""
    import numpy as np

    from zarr_skip.synthetic import PRESETS, as_mapping, jagged_payload

    preset = PRESETS[preset_name]
    mapping = as_mapping(jagged_payload(preset, seed, step=STEP, payload="realistic"))
    peers = make_peers(preset, wanted)
    names = list(peers)
    samples: dict[str, dict[str, list[float]]] = {f: {op: [] for op in OPS} for f in names}
    dirs: dict[str, Path] = {}
    cold_method = ""
    for rep in range(reps + 1):
        for f in _rotated(names, rep):
            d = work / f / f"rep{rep}"
            d.mkdir(parents=True)
            drop_cache([], "fadvise")  # sync: earlier writeback must not land in this write
            t0 = time.perf_counter()
            peers[f].write(mapping, d)
            t = time.perf_counter() - t0
            if rep:
                samples[f]["write"].append(t)
            dirs[f] = d
        rows = sorted(np.random.default_rng(seed * 1000 + rep).choice(preset.rows, ROWS, replace=False).tolist())
        answers: dict[str, Any] = {}
        for op in OPS[1:]:
            for f in _rotated(names, rep):
                cold_method = drop_cache([dirs[f]], cold)
                t0 = time.perf_counter()
                res = _read_op(peers[f], op, dirs[f], rows)
                t = time.perf_counter() - t0
                if op == "rows64":
                    answers[f] = res
                del res
                if rep:
                    samples[f][op].append(t)
        bad = check_same_rows(answers, mapping, rows)
        if bad:
            raise RuntimeError(f"rep {rep}: {ROWS} rows of {COLUMN} differ from the step's in {bad}")
        del answers
        log(f"[peers {preset_name}] rep {rep}/{reps}" + (" (warm-up, dropped)" if rep == 0 else ""))
    disk = {f: disk_usage(d) for f, d in dirs.items()}
    return {
        "preset": preset_name,
        "rows": preset.rows,
        "reps": reps,
        "seed": seed,
        "formats": names,
        "samples_s": samples,
        "disk": disk,
        "cold_method": cold_method,
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    out = {}
    for mod in ("pyarrow", "lance", "zarr", "torch"):
        try:
            out[mod] = str(__import__(mod).__version__)
        except ImportError:
            out[mod] = "not installed"
    return out


# --------------------------------------------------------------------------- the report


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Min / median / max per format and operation, and each format's median over zarr_skip's."""
    stats: dict[str, dict[str, dict[str, float]]] = {}
    for f, ops in res["samples_s"].items():
        stats[f] = {op: dict(zip(("min", "median", "max"), spread(v), strict=True)) for op, v in ops.items() if v}
        stats[f]["bytes"] = {"value": float(res["disk"][f]["bytes_allocated"])}
        stats[f]["files"] = {"value": float(res["disk"][f]["files"])}
    ratios: dict[str, dict[str, float | None]] = {}
    base = stats.get("zarr_skip")
    for f in stats:
        ratios[f] = {}
        for m in (*OPS, "bytes", "files"):
            key = "value" if m in ("bytes", "files") else "median"
            a, b = stats[f].get(m, {}).get(key), (base or {}).get(m, {}).get(key)
            ratios[f][m] = a / b if a is not None and b else None
    return {"stats": stats, "vs_zarr_skip": ratios}


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x < 10 else f"{x * 1e3:.0f}"


def _mib(x: float) -> str:
    return f"{x / 2**20:.2f} MiB"


def report(res: dict[str, Any]) -> str:
    s = res["summary"]
    names = res["formats"]
    lines = [
        f"# zarr_skip and its peers: the realistic `{res['preset']}` step ({res['rows']} rows)",
        "",
        load.line(res.get("load")),
        "",
        f"Run {res['started']} (git {res['machine'].get('git_commit')}), command: `{res['command']}`. "
        f"{res['reps']} repetitions after a warm-up (dropped), formats interleaved (rotated order); "
        f"times in ms as min / **median** / max; cold = page cache dropped first ({res['cold_method']}); "
        "each read includes opening. Versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()) + ".",
        "",
        "| metric | " + " | ".join(names) + " | " + " | ".join(f"{f} / zarr_skip" for f in names[1:]) + " |",
        "|---|" + "---|" * (2 * len(names) - 1),
    ]
    for m in (*OPS, "bytes", "files"):
        label = OP_LABEL.get(m, {"bytes": "bytes on disk (allocated)", "files": "files"}.get(m, m))
        cells = []
        for f in names:
            st = s["stats"][f].get(m)
            if st is None:
                cells.append("n/a")
            elif "value" in st:
                cells.append(_mib(st["value"]) if m == "bytes" else f"{st['value']:.0f}")
            else:
                cells.append(f"{_ms(st['min'])} / **{_ms(st['median'])}** / {_ms(st['max'])}")
        ratios = [s["vs_zarr_skip"][f].get(m) for f in names[1:]]
        cells += ["n/a" if r is None else f"{r:.2f}" for r in ratios]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"parquet: pyarrow, zstd level 1, one row group; the {ROWS} rows read the row groups that hold them. "
        f"Lance: `lance.write_dataset` defaults, `take()`. Peers' reads give Arrow tables (per-row objects "
        f"stay JSON strings), zarr_skip's Python objects. {DEFINITION}. zarr_skip_lz4 / zarr_skip_none / "
        f'zarr_skip_8k: zarr_skip written with `compression="lz4"` / `None` / '
        f'`Compression("auto", blocksize=8 << 10)`. Ratios > 1: the peer is slower or larger.',
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--preset", default="medium", help="small, medium or large (default medium)")
    ap.add_argument("--reps", type=int, default=7, help="repetitions after the warm-up (default 7)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--formats", default=",".join(FORMATS), help="subset of " + ",".join(FORMATS))
    ap.add_argument("--cold", choices=("auto", "drop_caches", "fadvise"), default="auto", help="as in bench.py")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="peers_<preset>.md/.json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    wanted = [f.strip() for f in args.formats.split(",") if f.strip()]
    if "zarr_skip" not in wanted or set(wanted) - set(FORMATS):
        ap.error(f"--formats: a subset of {FORMATS} that holds zarr_skip (the ratios are against it)")
    mon = load.guard(args)
    if mon is None:
        return 2
    run = load.run_monitored(
        mon,
        args.out,
        ".bench-tmp-peers-",
        lambda work: measure(args.preset, args.reps, work, args.cold, args.seed, wanted),
        keep=args.keep,
    )
    res, record = run.result, run.record
    res.update(
        started=run.started,
        command=command_line("bench_peers", argv),
        machine=machine_info(args.out),
        load=record,
        baseline=DEFINITION,
    )
    res["summary"] = summarize(res)
    load.publish(args.out, f"peers_{args.preset}", res, report(res))
    log(f"wrote {args.out / f'peers_{args.preset}.md'}")
    return load.exit_code(record, args.require_quiet)


if __name__ == "__main__":
    sys.exit(main())
