"""``zarr-skip export ... --format sft|dpo``: training records in TRL's conversational formats."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from zarr_skip.cli._context import Context, UsageError

__all__ = ["FORMATS", "add_options", "check_unused", "export_training_records"]

FORMATS = ("sft", "dpo")


def _pairs(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number or 'all'") from None


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of the training formats on ``zarr-skip export``."""
    g = p.add_argument_group("--format sft / dpo (TRL's conversational formats; OUT is .jsonl or .parquet)")
    g.add_argument("--score", default="score", help="per-row column ranking the answers (default score)")
    g.add_argument("--min-score", type=float, metavar="X", help="sft: keep answers scoring >= X; dpo: chosen >= X")
    g.add_argument("--best-of", type=int, default=1, metavar="K", help="sft: answers kept per group (default 1)")
    g.add_argument("--pairs", type=_pairs, default=1, metavar="K", help="dpo: pairs per group, or 'all' (default 1)")
    g.add_argument("--token-ids", action="store_true", help="keep the token ids in *_ids columns too")


#: the training options and their defaults (as ``--flag``: argparse's dest)
_DEFAULTS = {
    "--score": ("score", "score"),
    "--min-score": ("min_score", None),
    "--best-of": ("best_of", 1),
    "--pairs": ("pairs", 1),
    "--token-ids": ("token_ids", False),
}


def check_unused(a: argparse.Namespace) -> None:
    """UsageError when a training option is given without ``--format sft`` or ``dpo``: the
    export would write every rollout, not the records those options choose."""
    if a.format in FORMATS:
        return
    given = [flag for flag, (dest, default) in _DEFAULTS.items() if getattr(a, dest) != default]
    if given:
        raise UsageError(
            f"{', '.join(given)}: these choose training records; pass --format sft or --format dpo "
            f"(without it OUT gets every rollout)"
        )


def export_training_records(ctx: Context, cache: Any, steps: list[int]) -> int:
    """Write SFT or DPO records of ``steps`` to the file OUT."""
    from zarr_skip.views.training import export_training

    a = ctx.args
    out = Path(a.dest)
    if out.is_dir():
        raise UsageError(f"{out} is a directory; with --format {a.format} OUT is the .jsonl or .parquet file to write")
    if out.exists() and not a.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    with ctx.bar("export", "step", total=len(steps)) as bar:
        report = export_training(
            cache,
            out,
            steps,
            format=a.format,
            score=a.score,
            min_score=a.min_score,
            best_of=a.best_of,
            pairs=a.pairs,
            tokenizer=a.tokenizer,
            token_ids=a.token_ids,
            progress=bar.callback(),
        )
    ctx.say(
        f"{report.records} {report.format} records from {report.groups} group(s) of {len(report.steps)} step(s) "
        f"-> {report.path} ({report.file_format})"
    )
    if ctx.json:
        ctx.emit({"location": str(a.location), "experiment": cache.experiment, **report.to_json()})
    return 0
