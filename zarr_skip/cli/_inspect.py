"""``zarr-skip ls``, ``show`` and ``verify``: read-only commands."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zarr_skip.cli._format import age, clip, human_bytes, render_rows, table
from zarr_skip.views.display import ratio_text as ratio

if TYPE_CHECKING:
    from zarr_skip.cli._context import Context
    from zarr_skip.format.state import StepInfo
    from zarr_skip.maintenance import VerifyReport

__all__ = ["cmd_ls", "cmd_show", "cmd_verify"]


def step_doc(info: StepInfo, now: float) -> dict[str, Any]:
    """A step's :class:`~zarr_skip.StepInfo` as JSON."""
    return {
        "step": info.step,
        "state": info.state,
        "done": info.done,
        "expected": info.expected,
        "rows": info.rows,
        "nbytes": info.nbytes,
        "nbytes_stored": info.nbytes_stored,
        "raw_nbytes": info.nbytes,  # deprecated: nbytes (docs/deprecations.md)
        "ratio": round(info.ratio, 3),
        "run": info.run,
        "updated": info.updated,
        "age_seconds": round(now - info.updated, 3) if info.updated else None,
        "stale_runs": list(info.stale_runs),
    }


def _states(infos: list[StepInfo]) -> str:
    counts: dict[str, int] = {}
    for i in infos:
        counts[i.state] = counts.get(i.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in counts.items())


def cmd_ls(ctx: Context) -> int:
    """Experiments and their steps: state, mini-batches, rows, bytes, ratio, age."""
    import json

    now = time.time()
    found = ctx.experiments()
    docs = []
    for name, fp in found.items():
        infos = ctx.open(name).status()
        docs.append({"name": name, "fingerprint": fp, "steps": [step_doc(i, now) for i in infos]})
        stored = sum(i.nbytes_stored for i in infos)
        ctx.say(
            f"{name}: {len(infos)} step(s){' (' + _states(infos) + ')' if infos else ''}, {human_bytes(stored)} stored"
        )
        ctx.say(f"  fingerprint: {json.dumps(fp, sort_keys=True)}")
        rows = [
            (
                i.step,
                i.state,
                f"{i.done}/{i.expected}",
                i.rows,
                human_bytes(i.nbytes_stored),
                ratio(i.nbytes, i.nbytes_stored),
                age(i.updated, now),
            )
            for i in infos
        ]
        if rows:
            text = table(
                rows, ("step", "state", "mini-batches", "rows", "stored", "ratio", "age"), right=(0, 2, 3, 4, 5, 6)
            )
            ctx.say("\n".join("  " + line for line in text.splitlines()))
        ctx.say()
    if not found:
        ctx.note(f"no zarr_skip experiments at {ctx.args.location}")
    if ctx.json:
        ctx.emit({"location": str(ctx.args.location), "experiments": docs})
    return 0


def cmd_show(ctx: Context) -> int:
    """A step's columns (kind, dtype, shape, stored and raw bytes) and first rows."""
    import json

    from zarr_skip.cli._context import UsageError

    if ctx.args.rows < 0:
        raise UsageError(f"--rows {ctx.args.rows}: expected a number of rows >= 0")
    name, _ = ctx.one_experiment()
    cache = ctx.open(name)
    step = ctx.one_step(cache)
    if ctx.args.text or ctx.args.uid is not None or ctx.args.row is not None or ctx.args.tokenizer is not None:
        from zarr_skip.cli._text import cmd_show_text

        return cmd_show_text(ctx, name, cache, step)
    info = cache.info(step)
    view = cache.load(step)
    n = ctx.args.rows
    columns = [_column_doc(view, col_name, n) for col_name in view.columns]
    if ctx.json:
        ctx.emit(
            {
                "experiment": name,
                "step": step,
                "state": info.state,
                "rows": len(view),
                "minibatches": len(view.minibatch_info),
                "run": info.run,
                "batch_type": view.batch_type,
                "nbytes": view.nbytes,
                "nbytes_stored": view.nbytes_stored,
                "raw_nbytes": view.nbytes,  # deprecated: nbytes
                "meta_info": view.meta_info,
                "columns": columns,
            }
        )
        return 0
    ctx.say(
        f"step {step} of {name}: {info.state}, {len(view.minibatch_info)} mini-batch(es), {len(view)} rows, "
        f"{human_bytes(view.nbytes_stored)} stored (raw {human_bytes(view.nbytes)}, "
        f"{ratio(view.nbytes, view.nbytes_stored)}), run {info.run}, batch type {view.batch_type}"
    )
    ctx.say(f"meta_info: {clip(json.dumps(view.meta_info, ensure_ascii=False, default=repr), 200)}")
    ctx.say()
    rows = [
        (
            c["name"],
            c["kind"],
            c["dtype"],
            c["shape"],
            c["section"] or "-",
            human_bytes(c["nbytes_stored"]),
            human_bytes(c["nbytes"]),
        )
        for c in columns
    ]
    ctx.say(table(rows, ("column", "kind", "dtype", "shape", "section", "stored", "raw"), right=(5, 6)))
    if n and len(view):
        ctx.say()
        ctx.say(f"first {min(n, len(view))} row(s):")
        for c in columns:
            kind = c["kind"] if c["dtype"] == c["kind"] else f"{c['kind']} {c['dtype']}"
            ctx.say(f"{c['name']} ({kind}):")
            for i, text in enumerate(c["head"]):
                ctx.say(f"  {i:>3}  {text}")
    return 0


def _column_doc(view: Any, col_name: str, n: int) -> dict[str, Any]:
    """What ``show`` says of one column: its kind, dtype, shape, sizes and first ``n`` rows."""
    col = view[col_name]
    spec = col.spec
    return {
        "name": col_name,
        "kind": spec.kind,
        "dtype": spec.dtype,
        "shape": list(spec.shape),
        "container": spec.container,
        "section": spec.section,
        "nbytes": col.nbytes,
        "nbytes_stored": col.nbytes_stored,
        "raw_nbytes": col.nbytes,  # deprecated: nbytes
        "head": render_rows(col, n),
    }


def _check_steps_exist(cache: Any, name: str, steps: list[int]) -> None:
    """StepNotFoundError (exit 2, as ``show``) for steps the experiment does not have at all."""
    from zarr_skip.errors import StepNotFoundError

    have = {i.step for i in cache.status(steps)}
    missing = [s for s in steps if s not in have]
    if missing:
        complete = cache.steps()
        near = ", ".join(map(str, complete[:20])) + (" ..." if len(complete) > 20 else "")
        raise StepNotFoundError(
            f"step(s) {', '.join(map(str, missing))} not found in experiment {name!r} at {cache.location} "
            f"(complete steps: {near or 'none'}); nothing verified"
        )


def _verify_doc(name: str, report: VerifyReport) -> dict[str, Any]:
    """What ``verify --json`` says of one experiment."""
    return {
        "name": name,
        "ok": report.ok,
        "steps": list(report.steps),
        "chunks": report.chunks,
        "nbytes_stored": report.nbytes_stored,
        "problems": [
            {
                "step": p.step,
                "minibatch": p.minibatch,
                "column": p.column,
                "path": p.path,
                "kind": p.kind,
                "error": p.error,
            }
            for p in report.problems
        ],
        "unbound": list(report.unbound),
    }


def _unbound_line(steps: Sequence[int]) -> str:
    """What ``verify`` could not check in ``steps``, whose records do not name their place."""
    return (
        f"unbound: step(s) {', '.join(map(str, steps))} written by an older zarr_skip (format 1 or 2), "
        "whose records do not name their place: a chunk or record moved or swapped between "
        "mini-batches there goes unnoticed"
    )


def cmd_verify(ctx: Context) -> int:
    """Read every chunk; exit 1 and list the problems when anything is broken."""
    from zarr_skip.cli._context import parse_steps

    steps = parse_steps(ctx.args.steps, complete=ctx.complete_steps) or None
    found = ctx.experiments()
    if steps is not None and len(found) > 1:
        found = dict([ctx.one_experiment()])
    if not found:
        from zarr_skip.cli._context import UsageError

        raise UsageError(f"no zarr_skip experiments at {ctx.args.location}")
    docs, bad = [], 0
    with ctx.quiet("zarr_skip.maintenance"):  # problems are listed below; no duplicate warnings
        for name in found:
            cache = ctx.open(name)
            if steps is not None:
                _check_steps_exist(cache, name, steps)
            with ctx.bar(f"verify {name}", "chunk") as bar:
                report = cache.verify(steps, progress=bar.callback())
            bad += len(report.problems)
            docs.append(_verify_doc(name, report))
            status = "ok" if report.ok else f"{len(report.problems)} problem(s)"
            ctx.say(
                f"{name}: {len(report.steps)} step(s), {report.chunks} chunk(s), "
                f"{human_bytes(report.nbytes_stored)} checked: {status}"
            )
            for p in report.problems:
                ctx.say(f"  BROKEN {p}")
            if report.unbound:
                ctx.say(f"  {_unbound_line(report.unbound)}")
    if ctx.json:
        ctx.emit({"location": str(ctx.args.location), "ok": bad == 0, "experiments": docs})
    return 1 if bad else 0
