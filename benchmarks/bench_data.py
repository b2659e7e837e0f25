"""Cached rollouts as training data: the torch datasets and the Ray reader against their baselines.

Usage::

    python -m benchmarks.bench_data --preset medium --out benchmarks/results   # writes data.md / data.json

* iterable: one epoch of ``RolloutIterableDataset`` over ``--steps`` steps through
  ``DataLoader(num_workers=2, batch_size=64, collate_fn=collate_rollouts)`` against
  ``load(step).to_dict()`` of the same steps (target: within 1.5x); the peak memory growth of
  the epoch in one process (what each worker holds) and of the baseline, each in a fresh
  process, against one step's decoded size (target: under 2x); and the same epoch with the
  batches cut by the dataset (``RolloutIterableDataset(batch_size=64)``,
  ``DataLoader(batch_size=None)``); ``--reps`` rounds, the measurements interleaved in each;
* map: ``--items`` random ``RolloutDataset[i]``: time per item and bytes read per item
  (``rchar`` of ``/proc/self/io``) against one row's decoded size; and ``--loader-rows`` random
  rows through ``DataLoader(RolloutDataset, batch_size=64, shuffle=True (seeded),
  num_workers=2, collate_fn=collate_rollouts)`` (batches read by ``__getitems__``), time per row
  against the iterable epoch's;
* ray: ``read_rollouts(...).count()`` and a ``groupby("step")`` mean on a local Ray cluster of
  two CPUs, against ``cache.table()`` and pandas.

Each step is written by zarr_skip from the same synthetic rows (``zarr_skip.synthetic``'s
presets, as benchmarks/bench.py builds them) in ``--minibatches`` mini-batches.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import load
from benchmarks.formats import fingerprint
from benchmarks.machine import REPO_ROOT, machine_info
from benchmarks.measure import spread

TARGETS = {"iterable_ratio": 1.5, "iterable_memory": 2.0}
#: presets of this benchmark beyond zarr_skip.synthetic's (a tiny one for the test)
EXTRA_PRESETS = {"tiny": {"rows": 32, "max_prompt": 64, "max_response": 128, "n": 4}}
MEAN_COLUMN = "response_len"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def preset_of(name: str) -> Any:
    from zarr_skip.synthetic import Preset, get_preset

    return Preset(**EXTRA_PRESETS[name]) if name in EXTRA_PRESETS else get_preset(name)


def write_steps(where: Path, preset_name: str, steps: int, minibatches: int) -> None:
    """Steps 1..steps, each the same rows written by zarr_skip in ``minibatches`` mini-batches."""
    import torch

    import zarr_skip as zs
    from zarr_skip.synthetic import as_mapping, jagged_payload

    preset = preset_of(preset_name)
    mapping = as_mapping(jagged_payload(preset))
    rows = preset.rows
    cuts = [rows * k // minibatches for k in range(minibatches + 1)]
    parts = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        part = {}
        for name, value in mapping.items():
            if isinstance(value, torch.Tensor) and value.is_nested:
                part[name] = torch.nested.as_nested_tensor(list(value.unbind())[a:b], layout=torch.jagged)
            else:
                part[name] = value[a:b]
        parts.append(part)
    cache = zs.open_cache(str(where), fingerprint(preset))
    for step in range(1, steps + 1):
        for part in parts:
            cache.write(step, part, expected=minibatches)


def decoded_nbytes(value: Any) -> int:
    """The decoded size of a column as ``to_dict`` returns it (objects as their JSON text)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        t = value.values() if value.is_nested else value
        return int(t.numel() * t.element_size())
    if isinstance(value, np.ndarray) and value.dtype != object:
        return int(value.nbytes)
    return sum(len(json.dumps(v, default=str)) for v in list(value))


def rss(field: str = "VmRSS") -> int:
    """This process's resident size (``VmRSS``) or its peak since the last :func:`reset_peak`
    (``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    """Start the peak resident size (``VmHWM``) anew from the current one (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


# -- the measurements, each in a fresh process ---------------------------------------------------


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    import zarr_skip as zs
    from zarr_skip.data import RolloutDataset, RolloutIterableDataset, collate_rollouts

    where, how = spec["dir"], spec["how"]
    cache = zs.open_cache(where)
    steps = cache.steps()
    if how in ("to_dict", "map"):  # read here: imports, pools and codecs warmed up before the baseline
        first = cache.load(steps[0])
        for name in first.columns:
            first[name][0]
        del first
    # The DataLoader runs start as a training script does: its main process has read no column,
    # so a one-time cost of reading (a first NestedTensor dispatch imported sympy) falls on
    # every worker it forks, each epoch, and is measured.
    rows_total = sum(len(cache.load(s)) for s in steps) if how == "loader_floor" else 0
    base = rss()
    reset_peak()
    t0 = time.perf_counter()
    if how == "to_dict":  # rows counted by the views: len() of a NestedTensor would import torch's dispatch
        rows = 0
        for s in steps:
            view = cache.load(s)
            view.to_dict()
            rows += len(view)
    elif how in ("iterable", "iterable_inline"):
        ds = RolloutIterableDataset(where)
        workers = 0 if how == "iterable_inline" else 2
        loader = DataLoader(ds, batch_size=64, num_workers=workers, collate_fn=collate_rollouts)
        rows = sum(len(batch["row"]) for batch in loader)
    elif how == "iterable_batched":  # the dataset cuts the batches (no items)
        ds = RolloutIterableDataset(where, batch_size=64)
        loader = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=collate_rollouts)
        rows = sum(len(batch["row"]) for batch in loader)
    elif how in ("later_epoch", "later_epoch_batched"):  # epoch 2 of persistent workers
        return _later_epoch(where, batched=how == "later_epoch_batched")
    elif how == "loader_floor":  # the DataLoader alone: as many batches, of one 64-row tensor each
        rows = sum(len(batch["row"]) for batch in DataLoader(_Empty(rows_total), batch_size=None, num_workers=2))
    elif how == "map_loader":  # random rows, a batch's indices read together (__getitems__)
        import itertools

        import torch

        ds_map = RolloutDataset(where)
        generator = torch.Generator().manual_seed(0)
        loader = DataLoader(
            ds_map, batch_size=64, shuffle=True, generator=generator, num_workers=2, collate_fn=collate_rollouts
        )
        batches = itertools.islice(loader, -(-spec["loader_rows"] // 64))
        rows = sum(len(batch["row"]) for batch in batches)
    else:  # map
        import numpy as np

        ds = RolloutDataset(where)
        idx = np.random.default_rng(0).integers(0, len(ds), spec["items"])
        ds[0]  # the step views loaded (as after the first batch of an epoch)
        t0, read0 = time.perf_counter(), rchar()
        for i in idx:
            ds[int(i)]
        rows = len(idx)
        return {"s": time.perf_counter() - t0, "rows": rows, "bytes_read": rchar() - read0}
    seconds = time.perf_counter() - t0
    peak = rss("VmHWM")
    return {"s": seconds, "rows": rows, "peak_growth": max(0, peak - base)}


def _later_epoch(where: str, *, batched: bool) -> dict[str, Any]:
    """The second epoch of a DataLoader with ``persistent_workers=True`` (the first one untimed):
    what each epoch after the first costs a training run of several, its workers started and
    their memory in use."""
    from torch.utils.data import DataLoader

    from zarr_skip.data import RolloutIterableDataset, collate_rollouts

    if batched:
        ds = RolloutIterableDataset(where, batch_size=64)
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, collate_fn=collate_rollouts)
    else:
        ds = RolloutIterableDataset(where)
        loader = DataLoader(ds, batch_size=64, num_workers=2, persistent_workers=True, collate_fn=collate_rollouts)
    sum(len(batch["row"]) for batch in loader)
    ds.set_epoch(1)
    t0 = time.perf_counter()
    rows = sum(len(batch["row"]) for batch in loader)
    return {"s": time.perf_counter() - t0, "rows": rows}


class _Empty:
    """A map-style dataset of the batches of 64 of ``rows`` rows, each only its ``row`` tensor:
    what a DataLoader costs without reading."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return -(-self.rows // 64)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        return {"row": torch.arange(64 * i, min(self.rows, 64 * i + 64))}


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_data", "--worker", json.dumps(spec)],
        capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=3600,
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.splitlines()[-1])


def step_sizes(where: Path) -> dict[str, int]:
    import zarr_skip as zs

    view = zs.open_cache(str(where)).load(1)
    decoded = sum(decoded_nbytes(v) for v in view.to_dict().values())
    return {"rows": len(view), "step_decoded": decoded, "row_decoded": decoded // len(view)}


def bench_torch(where: Path, parts: set[str], items: int, reps: int, loader_rows: int = 1536) -> dict[str, Any]:
    out: dict[str, Any] = {}
    epoch = (
        "to_dict",
        "iterable",
        "iterable_batched",
        "later_epoch",
        "later_epoch_batched",
        "loader_floor",
        "iterable_inline",
    )
    hows = [h for h in epoch if "iterable" in parts] + (["map", "map_loader"] if "map" in parts else [])
    runs: dict[str, list[dict[str, Any]]] = {how: [] for how in hows}
    for _ in range(reps):  # interleaved: a change of the machine's pace falls on every one alike
        for how in hows:
            runs[how].append(run_worker({"dir": str(where), "how": how, "items": items, "loader_rows": loader_rows}))
    for how, samples in runs.items():
        best = min(samples, key=lambda r: r["s"])
        # "samples": each round's time, in round order (the ratios per round pair them up)
        out[how] = {**best, "s": statistics.median(r["s"] for r in samples), "samples": [r["s"] for r in samples]}
        log(f"{how}: {out[how]}")
    return out


def per_round(t: Mapping[str, Any], how: str, against: str = "to_dict") -> tuple[float, float, float]:
    """min / median / max of ``how``'s time over ``against``'s in the same round: each round ran
    both within seconds, so a change of the machine's pace between rounds cancels out."""
    return spread([a / b for a, b in zip(t[how]["samples"], t[against]["samples"], strict=True)])


def bench_ray(where: Path, reps: int) -> dict[str, Any]:
    import ray

    import zarr_skip as zs
    from zarr_skip.integrations.ray import read_rollouts

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        cases = {
            "ray_count": lambda: read_rollouts(str(where), columns=[MEAN_COLUMN]).count(),
            "table_count": lambda: len(zs.open_cache(str(where)).table(columns=[MEAN_COLUMN])),
            "ray_groupby": lambda: (
                read_rollouts(str(where), columns=[MEAN_COLUMN])
                .groupby("step", num_partitions=1)
                .mean(MEAN_COLUMN)
                .to_pandas()
            ),
            "table_groupby": lambda: (
                zs.open_cache(str(where)).table(columns=[MEAN_COLUMN]).groupby("step")[MEAN_COLUMN].mean()
            ),
        }
        out: dict[str, Any] = {}
        for name, fn in cases.items():
            fn()  # warm-up (Ray starts its workers)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[name] = sorted(times)[len(times) // 2]
            log(f"{name}: {out[name]:.3f} s")
        return out
    finally:
        ray.shutdown()


def targets(res: dict[str, Any]) -> dict[str, Any]:
    t = res.get("torch", {})
    sizes = res["sizes"]
    out: dict[str, Any] = {}
    if "iterable" in t and "to_dict" in t:
        memory = t["iterable_inline"]["peak_growth"] / sizes["step_decoded"]
        out["iterable_memory"] = {"value": memory, "target": TARGETS["iterable_memory"], "met": memory < 2.0}
    for how in ("iterable", "iterable_batched", "later_epoch", "later_epoch_batched"):
        if how in t and "to_dict" in t:
            ratio = t[how]["s"] / t["to_dict"]["s"]
            out[f"{how}_ratio"] = {
                "value": ratio,
                "target": TARGETS["iterable_ratio"],
                "met": ratio <= 1.5,
                "per_round": per_round(t, how),
            }
    if "loader_floor" in t and "to_dict" in t:
        out["loader_floor_ratio"] = t["loader_floor"]["s"] / t["to_dict"]["s"]
    if "map" in t:
        m = t["map"]
        out["map_item_ms"] = 1000 * m["s"] / m["rows"]
        out["map_bytes_per_item_vs_row"] = m["bytes_read"] / m["rows"] / max(1, sizes["row_decoded"])
    if "map_loader" in t:
        out["map_loader_row_ms"] = 1000 * t["map_loader"]["s"] / t["map_loader"]["rows"]
        if "iterable" in t:  # against a row of the iterable epoch (both through two workers)
            out["map_loader_vs_iterable"] = out["map_loader_row_ms"] / (
                1000 * t["iterable"]["s"] / t["iterable"]["rows"]
            )
    return out


def _secs(m: Mapping[str, Any]) -> str:
    """A measurement's time: its median in bold, between its min and max over the rounds."""
    lo, mid, hi = spread(m["samples"])
    return f"{lo:.3f} / **{mid:.3f}** / {hi:.3f} s"


def _ratio(r: Mapping[str, Any]) -> str:
    """A ratio of medians, and the min / median / max of the same ratio round by round."""
    lo, mid, hi = r["per_round"]
    return f"**{r['value']:.2f}x** (per round {lo:.2f} / {mid:.2f} / {hi:.2f})"


def report(res: dict[str, Any]) -> str:
    s, t, tg = res["sizes"], res.get("torch", {}), res["targets"]
    lines = [
        "# Cached rollouts as training data",
        "",
        load.line(res.get("load")),
        "",
        f"{res['date']}, git {res['git'][:10]}; `{res['command']}`",
        f"{res['steps']} steps of preset {res['preset']} ({s['rows']} rows, {res['minibatches']} mini-batches each);"
        f" one step decoded {s['step_decoded'] / 2**20:.1f} MiB, one row {s['row_decoded'] / 1024:.1f} KiB.",
        "",
        f"Times are min / **median** / max over {res['reps']} rounds (each round runs every measurement once, "
        "in turn); a ratio is of the medians, then min / median / max of the same ratio within each round.",
        "",
        "| measurement | value | against |",
        "|---|---|---|",
    ]
    if "iterable_ratio" in tg:
        lines += [
            f"| epoch, RolloutIterableDataset, DataLoader(num_workers=2) | {_secs(t['iterable'])} "
            f"| load(step).to_dict(): {_secs(t['to_dict'])}; {_ratio(tg['iterable_ratio'])}; target 1.5x |",
            f"| the same, batches cut by the dataset (batch_size=64; DataLoader(batch_size=None)) "
            f"| {_secs(t['iterable_batched'])} | {_ratio(tg['iterable_batched_ratio'])} to_dict; target 1.5x |",
            f"| a later epoch, the same two through persistent workers (persistent_workers=True): items "
            f"| {_secs(t['later_epoch'])} | {_ratio(tg['later_epoch_ratio'])} to_dict |",
            f"| batches, a later epoch through persistent workers | {_secs(t['later_epoch_batched'])} "
            f"| {_ratio(tg['later_epoch_batched_ratio'])} to_dict |",
            f"| the DataLoader alone: as many batches, each one 64-row tensor, nothing read "
            f"| {_secs(t['loader_floor'])} | {tg['loader_floor_ratio']:.2f}x to_dict |",
            f"| peak memory growth of the epoch in one process | {t['iterable_inline']['peak_growth'] / 2**20:.1f} MiB "
            f"| {tg['iterable_memory']['value']:.2f}x one step decoded (target < 2x); "
            f"to_dict: {t['to_dict']['peak_growth'] / 2**20:.1f} MiB |",
        ]
    if "map_item_ms" in tg:
        m = t["map"]
        lines.append(
            f"| {m['rows']} random RolloutDataset[i] | {tg['map_item_ms']:.2f} ms an item, "
            f"{m['bytes_read'] / m['rows'] / 1024:.1f} KiB read an item | "
            f"{tg['map_bytes_per_item_vs_row']:.1f}x one row's decoded size |"
        )
    if "map_loader_row_ms" in tg:
        ml = t["map_loader"]
        against = (
            f"epoch of RolloutIterableDataset: {tg['map_loader_vs_iterable']:.1f}x its time a row"
            if "map_loader_vs_iterable" in tg
            else ""
        )
        lines.append(
            f"| {ml['rows']} random rows, RolloutDataset through DataLoader(batch_size=64, shuffle=True, "
            f"num_workers=2) | {tg['map_loader_row_ms']:.2f} ms a row ({ml['s']:.2f} s) | {against} |"
        )
    if "ray" in res:
        r = res["ray"]
        lines += [
            f"| read_rollouts().count() | {r['ray_count']:.3f} s | len(cache.table()): {r['table_count']:.3f} s |",
            f"| read_rollouts().groupby('step').mean | {r['ray_groupby']:.3f} s "
            f"| cache.table().groupby('step').mean: {r['table_groupby']:.3f} s |",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="iterable,map,ray", help="comma-separated subset to run")
    ap.add_argument("--preset", default="medium", help="small, medium, large (or tiny)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--loader-rows", type=int, default=1536, help="random rows read through a DataLoader")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    load.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    mon = load.guard(args)
    if mon is None:
        return 2
    parts = set(args.parts.split(","))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=".bench-tmp-data-", dir=out_dir))
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT).stdout.strip()
    res: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": git,
        "command": "python -m benchmarks.bench_data " + " ".join(argv if argv is not None else sys.argv[1:]),
        "preset": args.preset,
        "steps": args.steps,
        "minibatches": args.minibatches,
        "reps": args.reps,
        "machine": machine_info(workdir),
    }
    mon.start()
    try:
        where = workdir / "cache"
        t0 = time.perf_counter()
        write_steps(where, args.preset, args.steps, args.minibatches)
        log(f"{args.steps} {args.preset} steps written in {time.perf_counter() - t0:.1f} s")
        res["sizes"] = step_sizes(where)
        res["torch"] = bench_torch(where, parts, args.items, args.reps, args.loader_rows)
        if "ray" in parts:
            res["ray"] = bench_ray(where, args.reps)
    finally:
        res["load"] = mon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    res["targets"] = targets(res)
    text = report(res)
    (out_dir / "data.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    (out_dir / "data.md").write_text(text)
    print(text)
    return load.exit_code(res["load"], args.require_quiet)


if __name__ == "__main__":
    sys.exit(main())
