"""``zarr-skip report``: one self-contained HTML file of a cache (see :mod:`zarr_skip.notebook.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from zarr_skip.cli._context import UsageError, parse_steps
from zarr_skip.cli._format import human_bytes
from zarr_skip.notebook.report import ROWS, write_report

if TYPE_CHECKING:
    from zarr_skip.cli._context import Context

__all__ = ["ROWS", "cmd_report"]


def cmd_report(ctx: Context) -> int:
    """Write the report of one experiment's steps to ``--output``."""
    if ctx.args.rows < 1:
        raise UsageError(f"--rows {ctx.args.rows}: expected a positive number of rollouts per step")
    out = Path(ctx.args.output)
    if out.is_dir():
        raise UsageError(f"-o {out}: a directory; name the HTML file to write")
    if not out.parent.is_dir():
        raise UsageError(f"-o {out}: the directory {out.parent} does not exist")
    name, _ = ctx.one_experiment()
    cache = ctx.open(name)
    complete = cache.steps()
    steps = parse_steps(ctx.args.steps, complete=lambda: complete) or None
    if steps is not None:
        missing = [s for s in steps if s not in complete]
        if missing:
            near = ", ".join(map(str, complete[-20:])) or "none"
            raise UsageError(f"step(s) {', '.join(map(str, missing))}: not complete steps of {name} (complete: {near})")
    from zarr_skip.views.tokenizers import tokenizer_for

    tokenizer = tokenizer_for(cache, ctx.tokenizer())  # --tokenizer wins over the recorded one
    if tokenizer is None:
        ctx.note("note: no tokenizer given or recorded: the report shows token ids (pass --tokenizer PATH)")
    path = write_report(
        cache,
        out,
        steps,
        tokenizer=tokenizer,
        rows=ctx.args.rows,
        plots=ctx.args.plots,
        tokens=ctx.args.tokens,
        script=ctx.args.script,
    )
    size = path.stat().st_size
    shown = steps if steps is not None else complete[-1:]
    if ctx.json:
        ctx.emit(
            {
                "location": str(ctx.args.location),
                "experiment": name,
                "output": str(path),
                "steps": shown,
                "bytes": size,
                "decoded": tokenizer is not None,
            }
        )
    ctx.say(f"wrote {path} ({human_bytes(size)}): {len(complete)} step(s) in the table, rollouts of {shown or 'none'}")
    return 0
