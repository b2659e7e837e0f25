"""zarr_skip vs verl's on-disk rollout dumps, measured side by side in one run.

Usage::

    python -m benchmarks.bench --preset medium --reps 5 --out benchmarks/results
    python -m benchmarks.bench --preset small,medium --reps 2 --baseline-only

Baselines (what verl does today):

* ``torch.save`` of the jagged TransferQueue payload (``tq_batch.pt``),
* ``pickle.dump`` of the padded ``DataProto`` (``gen_batch.dp``; pickling goes through
  ``DataProto.__getstate__``, which ``torch.save``s the tensor batch into a buffer first).

Contenders: ``zarr_skip`` writing / reading the same two shapes through its public API.

Every measurement runs in a fresh Python subprocess (one per format and operation; the
repetitions run inside it), so peak RSS is that of the operation alone: the kernel's
high-water mark is reset right before the timed call (``/proc/self/clear_refs``) and read right
after it.  Read-side figures drop the page cache for the files first (``cold``) or read them
once untimed before measuring (``warm``).  See benchmarks/README.md for what each metric means.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import load
from .formats import FORMATS, OPS
from .machine import REPO_ROOT, command_line, machine_info, physical_limits
from .report import markdown, score, verdict_line
from .runners import Runner, bench_preset, log
from .worker import worker_main, zygote_main

# torch logs a one-off "is_fx_tracing" warning when tensordict imports torch._dynamo
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--preset", default="medium", help="small, medium, large, or a comma-separated list (default medium)"
    )
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median)")
    ap.add_argument(
        "--out", default=str(REPO_ROOT / "benchmarks" / "results"), help="directory for <preset>.md and <preset>.json"
    )
    ap.add_argument(
        "--workdir", default=None, help="scratch directory (default: a temp dir inside --out, i.e. same disk)"
    )
    ap.add_argument("--baseline-only", action="store_true", help="only torch.save / pickle (no zarr_skip import)")
    ap.add_argument(
        "--cold",
        choices=("auto", "drop_caches", "fadvise"),
        default="auto",
        help="how to drop the page cache: auto = drop_caches when root, else fadvise",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--status-steps", type=int, default=1000, help="steps written for the status() benchmark (0 = skip)"
    )
    ap.add_argument("--dd-mib", type=int, default=1024, help="size of the dd test (0 = skip)")
    ap.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip the untimed zarr_skip round-trip check"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-worker timeout (s)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument(
        "--isolation",
        choices=("fork", "spawn"),
        default="fork",
        help="fresh process per measurement: fork from a pre-imported zygote "
        "(default) or spawn a new interpreter (slower, ~3 s of imports each)",
    )
    ap.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="do not run the untimed small warm-up operation in each process",
    )
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of: " + ", ".join(OPS))
    ap.add_argument(
        "--formats", default=None, help="comma-separated subset of the formats (default all): " + ", ".join(FORMATS)
    )
    load.add_arguments(ap)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--zygote-zarr", action="store_true", help=argparse.SUPPRESS)
    return ap


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Parse the lists of ``args`` in place and refuse unknown names; the presets to run."""
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if args.formats:
        args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        unknown = [f for f in args.formats if f not in FORMATS]
        if unknown:
            ap.error(f"unknown formats {unknown}; choose from {list(FORMATS)}")
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        ap.error(f"unknown ops {bad}; choose from {list(OPS)}")

    from zarr_skip.synthetic import PRESETS

    names = [p.strip() for p in args.preset.split(",") if p.strip()]
    for n in names:
        if n not in PRESETS:
            ap.error(f"unknown preset {n!r}; choose from {sorted(PRESETS)}")
    if not args.baseline_only:
        try:
            import zarr_skip as zs

            zs.open_cache  # noqa: B018
        except Exception as e:  # noqa: BLE001 - any import failure means: not usable yet
            ap.error(f"zarr_skip does not import ({type(e).__name__}: {e}); use --baseline-only")

    return names


def _workdir(args: argparse.Namespace, out_dir: Path) -> Path:
    if not args.workdir:
        return Path(tempfile.mkdtemp(prefix=".bench-tmp-", dir=out_dir))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="bench-", dir=workdir))


def _run_preset(
    name: str, args: argparse.Namespace, before: load.LoadMonitor, runner: Runner, ctx: dict[str, Any]
) -> int:
    """Measure one preset, write its report and say its targets' verdicts; the exit code so far."""
    mon = load.monitor_from(args)
    mon.before = before.before
    mon.start()
    try:
        result = bench_preset(name, args, ctx["workdir"], runner)
    finally:
        result_load = mon.stop()
    result["load"] = result_load
    log(load.line(result_load))
    exit_code = load.exit_code(result_load, args.require_quiet)
    score(result, args.baseline_only)
    run = {k: ctx[k] for k in ("started", "command", "machine", "limits")} | {"result": result}
    md = markdown(run)
    out_dir = ctx["out_dir"]
    (out_dir / f"{name}.json").write_text(json.dumps(run, indent=2, default=str) + "\n")
    (out_dir / f"{name}.md").write_text(md)
    print(md)
    for t in result["targets"]:
        print(verdict_line(t))
        if t["verdict"].startswith("FAIL"):
            exit_code = max(exit_code, 1)
    log(f"wrote {out_dir / (name + '.md')} and {out_dir / (name + '.json')}")
    return exit_code


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    if args.zygote:
        return zygote_main(args.zygote_zarr)
    names = _check(ap, args)
    # the load before anything of ours runs (the dd test below raises the load average)
    before = load.guard(args)
    if before is None:
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = _workdir(args, out_dir)
    command = command_line("bench", argv)
    ctx: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "out_dir": out_dir,
    }
    ctx |= {"workdir": workdir, "machine": machine_info(workdir), "limits": None}
    if ctx["machine"]["disk"].get("fstype") in ("tmpfs", "ramfs"):
        log(f"WARNING: work dir {workdir} is on {ctx['machine']['disk']['fstype']}: this measures RAM")
    exit_code = 0
    runner = Runner(args.isolation, not args.baseline_only, workdir / "workers.log", args.timeout)
    try:
        if args.dd_mib > 0:
            log(f"physical limits: dd {args.dd_mib} MiB + memcpy ...")
            limits = physical_limits(workdir, args.dd_mib, args.cold)
            log("physical limits: " + ", ".join(f"{k} {v:.1f}" for k, v in limits.items() if isinstance(v, float)))
            ctx["limits"] = limits
        for name in names:
            exit_code = max(exit_code, _run_preset(name, args, before, runner, ctx))
    finally:
        runner.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept scratch directory {workdir}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
