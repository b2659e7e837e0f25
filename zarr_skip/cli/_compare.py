"""``zarr-skip compare A B``: two runs' per-step signals side by side.

For each step both runs hold complete (or those of ``--steps``): rows, mean and spread of the
score, accuracy when scores are 0/1, mean response length (split by correct and wrong),
truncation and the share of GRPO groups whose answers all scored the same
(:mod:`zarr_skip.views.signals`); ``--by-source`` adds each data source, ``--json`` gives every
figure for scripts and ``--plot FILE`` draws them (one colour per run).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zarr_skip.cli._context import Context, UsageError, parse_steps
from zarr_skip.views.signals import StepSignals, step_signals

if TYPE_CHECKING:
    from zarr_skip.cache import Cache

__all__ = ["EPILOG", "HELP", "add_arguments", "cmd_compare"]

HELP = "compare two runs step by step: score, accuracy, lengths, truncation, same-score groups"
EPILOG = """\
A and B are caches (paths or s3:// URLs); -e picks the experiment in both (--experiment-b in B).
Steps: those both runs hold complete, or --steps (N, A-B, latest, -K: the K-th latest common one;
of a range A-B, the steps complete in both runs).

examples:
  zarr-skip compare runs/baseline runs/lr_2e-6
  zarr-skip compare runs/a runs/b --steps 10-20 --by-source
  zarr-skip compare runs/a runs/b --json
  zarr-skip compare runs/a runs/b --plot compare.png
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``compare`` (its parser made by :func:`zarr_skip.cli.main.build_parser`)."""
    p.add_argument("location", metavar="A")
    p.add_argument("other", metavar="B")
    p.add_argument("--steps", nargs="+", default=[], metavar="STEP", help="steps to compare (default: common ones)")
    p.add_argument("--experiment-b", metavar="NAME", help="the experiment in B (default: as -e)")
    p.add_argument("--by-source", action="store_true", help="also each data source")
    p.add_argument("--plot", metavar="FILE", help="draw the signals of both runs into FILE (.png, .svg, .pdf)")


def _open(ctx: Context, location: str, experiment: str | None) -> tuple[str, Cache]:
    sub = Context(argparse.Namespace(**{**vars(ctx.args), "location": location, "experiment": experiment}))
    name, _ = sub.one_experiment()
    return name, sub.open(name)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


#: the lines of a step's block: label, and the text of one run's figures
LINES: list[tuple[str, Callable[[StepSignals], str]]] = [
    ("rows", lambda s: str(s.rows)),
    ("score (mean ± std)", lambda s: "-" if s.score_mean is None else f"{s.score_mean:.4g} ± {s.score_std:.3g}"),
    ("accuracy", lambda s: _pct(s.accuracy)),
    ("length: mean", lambda s: _num(s.length_mean)),
    ("length: correct / wrong", lambda s: f"{_num(s.length_correct)} / {_num(s.length_wrong)}" if s.binary else "-"),
    ("truncated", lambda s: _pct(s.truncated)),
    ("same-score groups", lambda s: f"{_pct(s.same_score_groups)} of {s.scored_groups}" if s.scored_groups else "-"),
]


def _block(title: str, a: StepSignals | None, b: StepSignals | None, indent: str) -> list[str]:
    lines = [f"{indent}{title}"]
    for label, text in LINES:
        left = text(a) if a is not None else "(none)"
        right = text(b) if b is not None else "(none)"
        lines.append(f"{indent}  {label:<{24 - len(indent)}} {left:<22} {right}")
    return lines


def _doc(found: list[StepSignals]) -> dict[str, Any]:
    whole = found[0].to_dict()
    whole["sources"] = {s.data_source: s.to_dict() for s in found[1:]}
    return whole


def _listed(steps: list[int], most: int = 20) -> str:
    """``steps`` for a message: the first ``most``, and how many more."""
    more = f" and {len(steps) - most} more" if len(steps) > most else ""
    return ", ".join(map(str, steps[:most])) + more


def _plot(path: Path, caches: list[Cache], steps: list[int]) -> None:
    from zarr_skip.notebook.trends import SIGNALS, matplotlib_module, plot_trend, run_signals

    mpl = matplotlib_module()
    runs = run_signals(caches, steps)
    fig = mpl.figure.Figure(figsize=(12.0, 7.0), layout="constrained")
    for ax, signal in zip(fig.subplots(2, 2).ravel(), SIGNALS, strict=True):
        plot_trend(runs, signal, ax=ax)
    fig.savefig(path, dpi=96)


def _steps(ctx: Context, names: tuple[str, str], a: Cache, b: Cache) -> list[int]:
    """The steps to compare: those of ``--steps`` (a step named alone must be complete in both
    runs; of a range ``A-B``, those that are, the others named on stderr), else the common ones."""
    sa, sb = a.steps(), b.steps()
    common = [s for s in sa if s in set(sb)]
    held = set(common)
    ranges = [t for t in ctx.args.steps if t.partition("-")[0].isdigit() and "-" in t]
    in_ranges = set(parse_steps(ranges) or [])
    asked = parse_steps(ctx.args.steps, complete=lambda: common) or None  # -K: among the common steps
    if asked is not None:
        missing = [s for s in asked if s not in held and s not in in_ranges]
        skipped = [s for s in asked if s not in held and s in in_ranges]
        asked = [s for s in asked if s in held]
        if missing or not asked:
            raise UsageError(
                f"step(s) {_listed(missing or skipped)}: not complete in both runs "
                f"(A {names[0]}: {sa[-20:] or 'none'}; B {names[1]}: {sb[-20:] or 'none'})"
            )
        if skipped:
            left = _listed(skipped)
            ctx.note(f"compare: {len(skipped)} step(s) of the range not complete in both runs, left out: {left}")
        return asked
    if not common:
        raise UsageError(
            f"no step is complete in both runs (A {names[0]}: {sa or 'none'}; B {names[1]}: {sb or 'none'})"
        )
    return common


def cmd_compare(ctx: Context) -> int:
    """Print (or ``--json``, ``--plot``) both runs' signals per common step."""
    args = ctx.args
    plot = Path(args.plot) if args.plot else None
    if plot is not None and not plot.parent.is_dir():
        raise UsageError(f"--plot {plot}: the directory {plot.parent} does not exist")
    name_a, a = _open(ctx, args.location, args.experiment)
    name_b, b = _open(ctx, args.other, args.experiment_b or args.experiment)
    steps = _steps(ctx, (name_a, name_b), a, b)
    from zarr_skip.notebook.trends import run_labels

    labels = run_labels([a, b])
    rows = [(s, step_signals(a.load(s)), step_signals(b.load(s))) for s in steps]
    if plot is not None:
        _plot(plot, [a, b], steps)
    if ctx.json:
        runs = [
            {"label": lab, "location": str(loc), "experiment": name}
            for lab, loc, name in ((labels[0], args.location, name_a), (labels[1], args.other, name_b))
        ]
        doc = {"a": runs[0], "b": runs[1], "steps": [{"step": s, "a": _doc(fa), "b": _doc(fb)} for s, fa, fb in rows]}
        if plot is not None:
            doc["plot"] = str(plot)
        ctx.emit(doc)
        return 0
    ctx.say(f"A: {labels[0]}  ({args.location}, {name_a})")
    ctx.say(f"B: {labels[1]}  ({args.other}, {name_b})")
    for step, fa, fb in rows:
        ctx.say()
        ctx.say(f"{'step ' + str(step):<26} {'A':<22} B")
        ctx.say("\n".join(_block("", fa[0], fb[0], "")[1:]))
        if args.by_source:
            sa, sb = {s.data_source: s for s in fa[1:]}, {s.data_source: s for s in fb[1:]}
            for source in sorted(set(sa) | set(sb), key=str):
                ctx.say("\n".join(_block(f"[{source}]", sa.get(source), sb.get(source), "  ")))
    if plot is not None:
        ctx.say(f"\nwrote {plot}")
    return 0
