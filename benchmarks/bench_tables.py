"""Columns as arrays, caches as tables, and the cost of ``import zarr_skip``, each against its
baseline in the same run (medians).

Usage::

    python -m benchmarks.bench_tables --out benchmarks/results          # writes tables.md / .json

* arrays: on one step (``--array-preset``, warm page cache), ``np.asarray(col)`` against
  ``col[:]`` plus the same conversion done by hand, and ``list(col)`` against ``col[:]`` plus
  splitting it into rows, for a jagged, a dense, a string and a JSON column;
* tables: ``Cache.table`` of the lengths and per-row scalars of ``--steps`` steps
  (``--preset``; each written by zarr_skip, the same rows), against the loop a user
  writes without it (``load(step)`` then each column's ``lengths()`` or ``[:]``, step by step);
  on local disk cold (the cache's files evicted with ``posix_fadvise``, each rep in a fresh
  process) and warm, and on S3 (a SeaweedFS on loopback, ``--s3-steps`` steps of
  ``--s3-preset``), with the rounds of requests each takes;
* imports: ``import zarr_skip`` against ``import zarr``, and ``zarr-skip --help``, each in a
  fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.formats import fingerprint
from benchmarks.machine import REPO_ROOT, machine_info
from benchmarks.measure import drop_cache

TARGETS = {"asarray": 1.2, "list": 1.2, "table_local_s": 2.0, "import": 1.5}
ARRAY_COLUMNS = ("responses", "old_log_probs", "prompt_len", "uid", "tags")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def median_of(fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm-up, untimed
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- arrays ----------------------------------------------------------------------------------


def bench_arrays(workdir: Path, preset_name: str, reps: int) -> dict[str, Any]:
    import numpy as np

    import zarr_skip as zs
    from zarr_skip.synthetic import as_mapping, get_preset, jagged_payload

    preset = get_preset(preset_name)
    cache = zs.open_cache(str(workdir / "arrays"), fingerprint(preset))
    cache.write(1, as_mapping(jagged_payload(preset)))
    col_of = cache.load(1)

    def by_hand(col: Any) -> Any:  # col[:] converted as np.asarray does it
        value = col[:]
        if col.spec.kind == "nested":
            out = np.empty(len(col), dtype=object)
            out[:] = [r.numpy() for r in value.values().split(value.offsets().diff().tolist())]
            return out
        return value.numpy() if col.spec.kind == "tensor" else np.asarray(value, dtype=object)

    def rows(col: Any) -> Any:  # col[:] split into rows as list(col) gives them
        value = col[:]
        return list(value.values().split(value.offsets().diff().tolist()) if col.spec.kind == "nested" else value)

    out: dict[str, Any] = {"preset": preset_name, "rows": len(col_of), "columns": {}}
    for name in ARRAY_COLUMNS:
        col = col_of[name]
        cases = {
            "index": lambda c=col: c[:],
            "asarray": lambda c=col: np.asarray(c),
            "index_convert": lambda c=col: by_hand(c),
            "list": lambda c=col: list(c),
            "index_rows": lambda c=col: rows(c),
        }
        res = {"kind": col.spec.kind, **interleaved(cases, reps)}
        res["asarray_ratio"] = res["asarray"] / res["index_convert"]
        res["list_ratio"] = res["list"] / res["index_rows"]
        out["columns"][name] = res
        log(f"arrays {name:14s} " + " ".join(f"{k} {v:.3g}" for k, v in res.items() if k != "kind"))
    return out


def interleaved(cases: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median seconds of each case, the cases taking turns (so that a change of load on the
    machine hits all of them alike)."""
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(reps + 1):  # rep 0 warms up
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            if rep:
                samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


# -- tables ----------------------------------------------------------------------------------


def table_columns(view: Any) -> list[str]:
    """The lengths and per-row scalars of a step: jagged columns and 1-d tensors."""
    return [n for n in view.columns if view[n].spec.kind in ("nested", "rows") or view[n].spec.shape == ()
            and view[n].spec.kind in ("tensor", "ndarray")]  # fmt: skip


def loop_table(cache: Any, columns: list[str]) -> int:
    """What a user writes without Cache.table: one view per step, each column read alone."""
    rows = 0
    for step in cache.steps():
        view = cache.load(step)
        got = {n: view[n].lengths() if view[n].spec.jagged else view[n][:] for n in columns}
        rows += len(next(iter(got.values())))
    return rows


def write_steps(cache: Any, preset: Any, steps: int) -> None:
    """Steps 1..steps, each written by zarr_skip with the same rows (converted once): a
    record is bound to its place, so copies of one step's files would not read as steps."""
    from zarr_skip.synthetic import as_mapping, jagged_payload

    mapping = as_mapping(jagged_payload(preset))
    for step in range(1, steps + 1):
        cache.write(step, mapping)


def table_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One timed table read in this fresh process (zarr_skip and pandas imported first; torch
    is not needed)."""
    import pandas  # noqa: F401 - imported before timing, as a notebook has

    import zarr_skip as zs

    where = spec["dir"]
    columns = table_columns(zs.open_cache(where).load(1))
    if spec["cold"]:
        drop_cache([Path(where)], "fadvise")
    t0 = time.perf_counter()
    cache = zs.open_cache(where)
    rows = len(cache.table(columns=columns)) if spec["how"] == "table" else loop_table(cache, columns)
    return {"s": time.perf_counter() - t0, "rows": rows, "columns": columns}


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_tables", "--worker", json.dumps(spec)],
        capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=1800,
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.splitlines()[-1])


def bench_tables_local(workdir: Path, preset_name: str, steps: int, reps: int) -> dict[str, Any]:
    import zarr_skip as zs
    from zarr_skip.synthetic import get_preset

    where = workdir / "tables"
    t0 = time.perf_counter()
    write_steps(zs.open_cache(str(where), fingerprint(get_preset(preset_name))), get_preset(preset_name), steps)
    log(f"tables: {steps} {preset_name} steps ready in {time.perf_counter() - t0:.1f} s")
    out: dict[str, Any] = {"preset": preset_name, "steps": steps}
    for cold in (True, False):
        for how in ("table", "loop"):
            samples = []
            for _ in range(reps):
                r = run_worker({"dir": str(where), "preset": preset_name, "cold": cold, "how": how})
                samples.append(r["s"])
                out["rows"], out["columns"] = r["rows"], r["columns"]
            out[f"{how}_{'cold' if cold else 'warm'}"] = statistics.median(samples)
            log(f"tables local {how} {'cold' if cold else 'warm'}: {statistics.median(samples):.3f} s")
    shutil.rmtree(where, ignore_errors=True)
    return out


def bench_tables_s3(workdir: Path, preset_name: str, steps: int, reps: int) -> dict[str, Any]:
    import zarr_skip as zs
    from benchmarks.bench_s3 import load_s3server
    from zarr_skip.store.storage import Storage
    from zarr_skip.synthetic import get_preset

    preset = get_preset(preset_name)
    out: dict[str, Any] = {"preset": preset_name, "steps": steps}
    with load_s3server().seaweedfs(workdir / "seaweedfs") as server:
        url, opts = server.s3_url("bench/tables"), server.storage_options
        t0 = time.perf_counter()
        write_steps(zs.open_cache(url, fingerprint(preset), storage_options=opts), preset, steps)
        log(f"tables s3: {steps} {preset_name} steps ready in {time.perf_counter() - t0:.1f} s")
        rounds: list[int] = []
        real = Storage.run
        Storage.run = lambda self, coro: rounds.append(1) or real(self, coro)  # type: ignore[method-assign]
        try:
            cache = zs.open_cache(url, fingerprint(preset), storage_options=opts)
            columns = table_columns(cache.load(1))
            for how, fn in (
                ("table", lambda: cache.table(columns=columns)),
                ("loop", lambda: loop_table(cache, columns)),
            ):
                out[how] = median_of(fn, reps)
                rounds.clear()
                fn()
                out[f"{how}_rounds"] = len(rounds)
                log(f"tables s3 {how}: {out[how]:.3f} s, {len(rounds)} rounds of requests")
        finally:
            Storage.run = real  # type: ignore[method-assign]
        out["columns"] = columns
    return out


# -- imports ---------------------------------------------------------------------------------


def import_env(environ: dict[str, str], pycache: str) -> dict[str, str]:
    """The environment of the timed imports: bytecode written to and read from ``pycache``
    (``PYTHONPYCACHEPREFIX``), whatever ``environ`` says of it. Each library is then timed as
    an installed one runs, from its compiled bytecode: pip compiles a wheel's modules when it
    installs them, an editable checkout compiles on its first import, and a shell with
    ``PYTHONDONTWRITEBYTECODE=1`` compiles every module of the checkout at every import (zarr
    from its wheel's bytecode, zarr_skip from source: 1.69x on 2026-12-05, 1.23x cached)."""
    env = {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def bench_imports(reps: int) -> dict[str, Any]:
    """Each case's import time in a fresh interpreter, interleaved, after an untimed round
    that compiles every module's bytecode into a temporary prefix (:func:`import_env`)."""
    with tempfile.TemporaryDirectory(prefix="zarr-skip-pycache-") as pycache:
        env = import_env(dict(os.environ), pycache)
        return _time_imports(reps, env)


def _time_imports(reps: int, env: dict[str, str]) -> dict[str, Any]:
    def fresh(code: str) -> float:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        return float(proc.stdout.split()[-1])

    timer = "import time\nt = time.perf_counter()\n{}\nprint(time.perf_counter() - t)"
    cases = {
        "zarr": timer.format("import zarr"),
        "zarr_skip": timer.format("import zarr_skip"),
        "cli_help": timer.format(
            "import contextlib, io; from zarr_skip.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['--help'])"
        ),
        "torch": timer.format("import torch"),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(reps + 1):  # interleaved, so that load on the machine hits every case alike
        for name, code in cases.items():
            took = fresh(code)
            if rep:  # the first round compiles the bytecode
                samples[name].append(took)
    out = {name: statistics.median(s) for name, s in samples.items()}
    out["ratio"] = out["zarr_skip"] / out["zarr"]
    log("imports: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in out.items() if k != "ratio"))
    return out


# -- report ----------------------------------------------------------------------------------


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


def verdict(value: float, target: float) -> str:
    return f"{'PASS' if value <= target else 'FAIL'} ({value:.3g} <= {target})"


def report(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        "# zarr_skip benchmark: arrays, tables, imports",
        "",
        f"Run {res['date']} (git {res['git']}), command: `{res['command']}`; medians of {res['reps']} reps.",
        f"Machine: {m.get('cpu_model', '?')}, {os.cpu_count()} cores, load average at start {res['load']}.",
        "",
        load.line(res.get("load_record")),
    ]
    if "arrays" in res:
        a = res["arrays"]
        lines += ["", f"## Columns as arrays ({a['preset']} step, {a['rows']} rows, warm)", "",
                  "| column | kind | `col[:]` | `np.asarray(col)` | `col[:]` + conversion | ratio | `list(col)` "
                  "| `col[:]` + rows | ratio |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, r in a["columns"].items():
            lines.append(
                f"| {name} | {r['kind']} | {_ms(r['index'])} | {_ms(r['asarray'])} | {_ms(r['index_convert'])} "
                f"| {r['asarray_ratio']:.2f} | {_ms(r['list'])} | {_ms(r['index_rows'])} | {r['list_ratio']:.2f} |"
            )
    for key, where in (("tables_local", "local disk"), ("tables_s3", "S3 (SeaweedFS on loopback)")):
        if key not in res:
            continue
        t = res[key]
        lines += ["", f"## Cache.table on {where}: {t['steps']} {t['preset']} steps", "",
                  f"Columns: {', '.join(t['columns'])} (jagged ones as lengths).", "",
                  "| | `Cache.table` | loop of `load()` | ratio |", "|---|---|---|---|"]  # fmt: skip
        for label in ("cold", "warm") if key == "tables_local" else ("",):
            sfx = f"_{label}" if label else ""
            lines.append(
                f"| {label or 'warm'} | {_ms(t['table' + sfx])} | {_ms(t['loop' + sfx])} "
                f"| {t['table' + sfx] / t['loop' + sfx]:.3f} |"
            )
        if key == "tables_s3":
            lines.append(f"| rounds of requests | {t['table_rounds']} | {t['loop_rounds']} | |")
    if "imports" in res:
        i = res["imports"]
        lines += ["", "## Import time (fresh interpreter each, from bytecode compiled in an untimed first round)", "",
                  "| `import zarr` | `import zarr_skip` | ratio | `zarr-skip --help` | `import torch` |",
                  "|---|---|---|---|---|",
                  f"| {_ms(i['zarr'])} | {_ms(i['zarr_skip'])} | {i['ratio']:.2f} | {_ms(i['cli_help'])} "
                  f"| {_ms(i['torch'])} |"]  # fmt: skip
    lines += ["", "## Targets", ""] + [f"- {k}: {v}" for k, v in res["targets"].items()]
    return "\n".join(lines) + "\n"


def targets(res: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, r in res.get("arrays", {}).get("columns", {}).items():
        out[f"np.asarray({name}) / (col[:] + conversion)"] = verdict(r["asarray_ratio"], TARGETS["asarray"])
        out[f"list({name}) / (col[:] + rows)"] = verdict(r["list_ratio"], TARGETS["list"])
    if "tables_local" in res:
        out["Cache.table local, cold (s)"] = verdict(res["tables_local"]["table_cold"], TARGETS["table_local_s"])
    if "imports" in res:
        out["import zarr_skip / import zarr"] = verdict(res["imports"]["ratio"], TARGETS["import"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="arrays,tables,s3,imports", help="comma-separated subset to run")
    ap.add_argument("--preset", default="medium", help="steps of the local table benchmark")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--s3-preset", default="small", help="steps of the S3 table benchmark")
    ap.add_argument("--s3-steps", type=int, default=1000)
    ap.add_argument("--array-preset", default="medium")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(table_worker(json.loads(args.worker))))
        return 0
    mon = load.guard(args)
    if mon is None:
        return 2
    parts = set(args.parts.split(","))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=".bench-tmp-tables-", dir=out_dir))
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT).stdout.strip()
    res: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": git,
        "command": "python -m benchmarks.bench_tables " + " ".join(argv if argv is not None else sys.argv[1:]),
        "reps": args.reps,
        "load": [round(x, 2) for x in os.getloadavg()],
        "machine": machine_info(workdir),
    }
    mon.start()
    try:
        if "imports" in parts:
            res["imports"] = bench_imports(max(args.reps, 7))
        if "arrays" in parts:
            res["arrays"] = bench_arrays(workdir, args.array_preset, 4 * args.reps)  # cheap: more reps
        if "tables" in parts:
            res["tables_local"] = bench_tables_local(workdir, args.preset, args.steps, args.reps)
        if "s3" in parts:
            res["tables_s3"] = bench_tables_s3(workdir, args.s3_preset, args.s3_steps, args.reps)
    finally:
        res["load_record"] = mon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    res["targets"] = targets(res)
    text = report(res)
    (out_dir / "tables.md").write_text(text)
    (out_dir / "tables.json").write_text(json.dumps(res, indent=1, default=str))
    print(text)
    failed = 1 if any(v.startswith("FAIL") for v in res["targets"].values()) else 0
    return max(failed, load.exit_code(res["load_record"], args.require_quiet))


if __name__ == "__main__":
    raise SystemExit(main())
