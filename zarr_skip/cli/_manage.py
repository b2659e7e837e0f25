"""``zarr-skip gc``, ``rm``, ``import`` and ``export``: commands that change something."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from zarr_skip.cli._format import clip, human_bytes, table
from zarr_skip.errors import StepNotFoundError

if TYPE_CHECKING:
    from zarr_skip.cli._context import Context
    from zarr_skip.views.export import ExportFormat

__all__ = ["cmd_export", "cmd_gc", "cmd_import", "cmd_rm"]


def _gc_doc(cache: Any, name: str, report: Any) -> dict[str, Any]:
    return {
        "name": name,
        "removals": [
            {"path": cache.storage.key_path(r.path), "reason": r.reason, "step": r.step} for r in report.removed
        ],
        "kept_writing": list(report.kept_writing),
    }


def _say_gc(ctx: Context, docs: list[dict[str, Any]], done: bool) -> None:
    for doc in docs:
        writing = f"; steps being written, kept: {doc['kept_writing']}" if doc["kept_writing"] else ""
        n = len(doc["removals"])
        ctx.say(f"{doc['name']}: {'removed' if done else 'to remove:'} {n} item(s){writing}")
        for r in doc["removals"]:
            ctx.say(f"  {'removed' if done else 'would remove'} {r['path']}  ({r['reason']})")


def cmd_gc(ctx: Context) -> int:
    """Show what gc would remove, then (confirmed) remove it, and nothing else."""
    from zarr_skip import maintenance
    from zarr_skip.cli._context import UsageError

    a = ctx.args
    found = ctx.experiments()
    if not found:
        raise UsageError(f"no zarr_skip experiments at {a.location}")
    plan: dict[str, dict[str, Any]] = {}
    shown: dict[str, set[str]] = {}  # what the confirmation is about: nothing found later goes
    for name in found:
        cache = ctx.open(name)
        report = cache.gc(keep_last=a.keep_last, pin=a.pin, dry_run=True)
        plan[name], shown[name] = _gc_doc(cache, name, report), {r.path for r in report.removed}
    total = sum(len(d["removals"]) for d in plan.values())
    _say_gc(ctx, list(plan.values()), done=False)
    if a.dry_run or total == 0:
        ctx.say("dry run: nothing removed" if total else "nothing to remove")
        if ctx.json:
            ctx.emit(
                {
                    "location": str(ctx.args.location),
                    "dry_run": True,
                    "removed": False,
                    "experiments": list(plan.values()),
                }
            )
        return 0
    if not ctx.confirm(f"remove {total} item(s)?"):
        ctx.note("nothing removed")
        return 1
    done = []
    todo = [name for name, d in plan.items() if d["removals"]]
    with ctx.bar("gc", "experiment", total=len(todo)) as bar:
        for k, name in enumerate(todo, 1):
            cache = ctx.open(name, fingerprint=found[name])
            report = maintenance.gc(
                cache.storage, cache.experiment, lease=cache.lease, keep_last=a.keep_last, pin=a.pin, only=shown[name]
            )
            done.append(_gc_doc(cache, name, report))
            bar.to(k)
    _say_gc(ctx, done, done=True)
    if ctx.json:
        ctx.emit({"location": str(ctx.args.location), "dry_run": False, "removed": True, "experiments": done})
    return 0


def cmd_rm(ctx: Context) -> int:
    """Remove explicit steps of one experiment (after confirmation)."""
    from zarr_skip.cli._context import parse_steps

    name, fp = ctx.one_experiment()
    cache = ctx.open(name, fingerprint=fp)
    steps = parse_steps(ctx.args.steps, complete=cache.steps) or []
    infos = {i.step: i for i in cache.status()}
    missing = [s for s in steps if s not in infos]
    if missing:
        raise StepNotFoundError(
            f"step(s) {', '.join(map(str, missing))} not found in experiment {name!r}; nothing removed"
        )
    ctx.say(f"{name}: removing {len(steps)} step(s)")
    for s in steps:
        i = infos[s]
        ctx.say(
            f"  step {s}: {i.state}, {i.done}/{i.expected} mini-batches, {i.rows} rows, {human_bytes(i.nbytes_stored)}"
        )
    live = [s for s in steps if infos[s].state == "writing"]
    if live:
        ctx.warn(f"step(s) {live} are being written by a live run; its writes will fail")
    if not ctx.confirm(f"remove {len(steps)} step(s) of {name}?"):
        ctx.note("nothing removed")
        return 1
    with ctx.bar("rm", "step", total=len(steps)) as bar:
        for k, s in enumerate(steps, 1):
            cache.delete(s)
            bar.to(k)
    ctx.say(f"removed step(s) {', '.join(map(str, steps))}")
    if ctx.json:
        ctx.emit({"location": str(ctx.args.location), "experiment": name, "removed": steps})
    return 0


def cmd_import(ctx: Context) -> int:
    """Import legacy verl dump directories; exit 1 when a step failed."""
    from zarr_skip.cli._context import UsageError
    from zarr_skip.legacy.transfer import import_legacy

    a = ctx.args
    with ctx.bar("import", "step") as bar, ctx.quiet("zarr_skip.legacy.transfer"):
        report = import_legacy(
            a.legacy_dir,
            a.location,
            role=a.role,
            overwrite=a.overwrite,
            progress=bar.callback(),
            experiment_name=a.experiment_name,
            project_name=a.project_name,
            expected_minibatches=a.parameter_sync_step,
            allow_pickle=a.allow_pickle or a.trust_pickle,
            coerce_meta=a.coerce_meta,
            storage_options=a.storage_options,
        )
    if not report.steps:
        raise UsageError("; ".join(report.warnings) or f"no legacy steps under {a.legacy_dir}")
    for w in report.warnings:
        ctx.warn(w)
    rows = [
        (
            s.step,
            s.action.upper() if s.action == "failed" else s.action,
            s.minibatches or "-",
            s.rows or "-",
            s.experiment,
            clip(s.reason, 80),
        )
        for s in report.steps
    ]
    ctx.say(table(rows, ("step", "result", "mini-batches", "rows", "experiment", "reason"), right=(0, 2, 3)))
    ctx.say(
        f"imported {len(report.imported)} step(s), skipped {len(report.skipped)}, failed {len(report.failed)} "
        f"into {report.location}"
    )
    for s in report.failed:
        ctx.note(f"failed: step {s.step} ({s.path}): {s.reason}")
    if ctx.json:
        ctx.emit(report.to_json())
    return 0 if report.ok else 1


def _export_records(ctx: Context, cache: Any, steps: list[int]) -> int:
    from pathlib import Path

    from zarr_skip.cli._context import UsageError
    from zarr_skip.views.export import SUFFIXES, export_rollouts, format_of, suffix_of

    a = ctx.args
    out = Path(a.dest)
    if a.format is None and suffix_of(out) is None:
        raise UsageError(
            f"{out}: cannot tell the format from the name; name the file {', '.join(SUFFIXES)}, or pass "
            "--format verl to write verl's dump directory there"
        )
    fmt, _ = format_of(out, a.format)  # a --format the name contradicts: an error naming both
    if out.is_dir():
        raise UsageError(f"{out} is a directory; with --format {fmt} OUT is the file to write")
    if out.exists() and not a.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    with ctx.bar("export", "step", total=len(steps)) as bar:
        report = export_rollouts(
            cache, out, steps, format=cast("ExportFormat", fmt), tokenizer=ctx.tokenizer(), progress=bar.callback()
        )
    text = "decoded text" if report.tokenizer else "token ids (no tokenizer: pass --tokenizer PATH for text)"
    ctx.say(f"{report.rows} rollouts of {len(report.steps)} step(s) -> {report.path} ({report.format}, {text})")
    if ctx.json:
        ctx.emit({"location": str(a.location), "experiment": cache.experiment, **report.to_json()})
    return 0


def _check_verl_out(cache: Any, dest: str) -> None:
    """``--format verl`` writes a directory: OUT named as a file of another format, or an
    existing file, is an error; so is OUT inside the cache."""
    from pathlib import Path

    from zarr_skip.cli._context import UsageError
    from zarr_skip.views.export import SUFFIXES, check_outside, suffix_of

    found = suffix_of(dest)
    if found is not None:
        fmt = SUFFIXES[found][0]
        raise UsageError(
            f"--format verl writes verl's dump directory, but OUT {dest} is named as a {fmt} file ({found}); "
            f"drop --format (or pass --format {fmt}) to write {fmt}, or name a directory"
        )
    if Path(dest).is_file():
        raise UsageError(f"--format verl writes verl's dump directory, but OUT {dest} is a file")
    check_outside(cache, dest)


def cmd_export(ctx: Context) -> int:
    """Write steps of one experiment as parquet / JSON Lines records, or in verl's dump layout."""
    from zarr_skip.cli._context import UsageError, parse_steps
    from zarr_skip.cli._training import check_unused
    from zarr_skip.legacy.transfer import export_steps

    a = ctx.args
    check_unused(a)  # before anything is read
    name, _ = ctx.one_experiment()
    cache = ctx.open(name)
    if a.output is None and len(a.items) < 2:
        raise UsageError(f"export: expected STEP... OUT (or -o OUT), got {' '.join(a.items)}")
    tokens, a.dest = (a.items, a.output) if a.output is not None else (a.items[:-1], a.items[-1])
    steps = parse_steps(tokens, allow_all=True, complete=cache.steps)
    if steps is None:
        steps = cache.steps()
    if a.format in ("sft", "dpo"):
        from zarr_skip.cli._training import export_training_records

        return export_training_records(ctx, cache, steps)
    if a.format != "verl":
        return _export_records(ctx, cache, steps)
    _check_verl_out(cache, a.dest)
    with ctx.bar("export", "step", total=len(steps)) as bar:
        report = export_steps(cache, steps, a.dest, layout=a.layout, overwrite=a.overwrite, progress=bar.callback())
    for s in report.steps:
        ctx.say(f"step {s.step}: {s.reason}, {s.minibatches} file(s), {s.rows} rows -> {s.path}")
    if ctx.json:
        ctx.emit(report.to_json())
    return 0
