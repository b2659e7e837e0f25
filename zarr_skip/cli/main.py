"""The ``zarr-skip`` command: inspect, verify, clean, import and export rollout caches.

Run ``zarr-skip --help`` (or ``python -m zarr_skip.cli --help``). Exit codes: 0 ok, 1 problems
found (damaged data, failed imports, declined confirmation), 2 usage errors (bad arguments,
no such experiment or step). The commands live in :mod:`zarr_skip.cli._inspect` and
:mod:`zarr_skip.cli._manage`; this module parses arguments and turns errors into messages.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from zarr_skip.cli._context import LOG_FORMAT, Context, UsageError, parse_storage_options
from zarr_skip.cli._format import SafeFormatter, terminal_safe
from zarr_skip.errors import (
    AmbiguousExperimentError,
    CacheNotFoundError,
    ColumnNotFoundError,
    ConfigError,
    ExperimentNotFoundError,
    FingerprintMismatchError,
    FormatVersionError,
    IncompleteStepError,
    ReadOnlyCacheError,
    StepNotFoundError,
    TokenizerNotFoundError,
    ZarrSkipError,
)

__all__ = ["UsageError", "build_parser", "main"]

PROG = "zarr-skip"
#: library errors that mean "you asked for something that is not there / not allowed"
USAGE_ERRORS = (
    AmbiguousExperimentError,
    CacheNotFoundError,
    ColumnNotFoundError,
    ConfigError,
    ExperimentNotFoundError,
    FingerprintMismatchError,
    FormatVersionError,
    IncompleteStepError,
    ReadOnlyCacheError,
    StepNotFoundError,
    TokenizerNotFoundError,
)


EXAMPLES = """\
examples:
  zarr-skip ls runs/cache                                   experiments and steps
  zarr-skip ls s3://bucket/cache --storage-option endpoint_url=http://minio:9000 --json
  zarr-skip show runs/cache 12 --rows 5                     columns and first rows of step 12
  zarr-skip show runs/cache latest --row 5                  one rollout of the latest step, decoded
  zarr-skip show runs/cache -1 --uid 3f2a                   one GRPO group by a prefix of its uid
  zarr-skip verify runs/cache                               read every chunk, check checksums
  zarr-skip gc runs/cache --keep-last 50 --pin 100 --dry-run
  zarr-skip rm runs/cache 12 13-15 --yes
  zarr-skip import ~/verl_dumps runs/cache                  legacy verl dumps -> Zarr
  zarr-skip export runs/cache 12 13 out/ --format verl      Zarr -> verl's layout
  zarr-skip export runs/cache all r.parquet                 one record per rollout, decoded
  zarr-skip report runs/cache 12 -o report.html             one HTML file to open or share
  zarr-skip compare runs/a runs/b --steps 10-20             two runs' signals side by side

exit status: 0 ok, 1 problems found, 2 usage error
"""


def _common(*, experiment: bool = True) -> argparse.ArgumentParser:
    """The options every command takes (storage options long-only: ``-o`` is always an output)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument(
        "--storage-option",
        dest="storage_option",
        action="append",
        metavar="KEY=VALUE",
        help="option for s3:// locations (endpoint_url, key, secret, region, ...); repeat",
    )
    if experiment:
        p.add_argument(
            "-e",
            "--experiment",
            metavar="NAME",
            help="the experiment to use (full name, its last part such as the role, or a unique whole part of it)",
        )
    p.add_argument("--json", action="store_true", help="print one JSON document for scripts")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars on stderr (default: when stderr is a terminal)",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    return p


def _tokenizer_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json or model directory to decode with (default: the one the trainer recorded, if here)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let transformers run the tokenizer code of the --tokenizer directory (never a recorded one's)",
    )


def _add(
    sub: Any, name: str, func: Callable[[Context], int], help_: str, epilog: str, parents: list[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=help_,
        epilog=epilog,
        parents=parents,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.set_defaults(func=func)
    return p


LOC = "LOCATION is a path or an s3:// URL."
STEPS = "A STEP is N, A-B, latest or -K (the K-th latest complete step: -1 is the latest)."


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``zarr-skip``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, clean, import and export zarr_skip rollout caches.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    from zarr_skip import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_ls(sub)
    _add_show(sub)
    _add_verify(sub)
    _add_gc_rm(sub)
    _add_import(sub)
    _add_export(sub)
    _add_report(sub)
    _add_compare(sub)
    return parser


def _add_compare(sub: Any) -> None:
    from zarr_skip.cli import _compare

    p = _add(sub, "compare", _compare.cmd_compare, _compare.HELP, _compare.EPILOG, [_common()])
    _compare.add_arguments(p)


def _add_ls(sub: Any) -> None:
    from zarr_skip.cli import _inspect as ins

    p = _add(
        sub,
        "ls",
        ins.cmd_ls,
        "list experiments and their steps",
        f"{LOC}\n\nexamples:\n  zarr-skip ls runs/cache\n  zarr-skip ls runs/cache -e rollout_tq --json",
        [_common()],
    )
    p.add_argument("location", metavar="LOCATION")


def _add_show(sub: Any) -> None:
    from zarr_skip.cli import _inspect as ins

    p = _add(
        sub,
        "show",
        ins.cmd_show,
        "show a step's columns and first rows, or its rollouts decoded (--text, --row, --uid)",
        f"{LOC}\n{STEPS}\nWith --text: each rollout's prompt (as chat messages when stored) and response,\n"
        "decoded with --tokenizer or the tokenizer the trainer recorded, with its data source,\n"
        "length, truncation, score, reward and advantage; --json gives them as records.\n\n"
        "examples:\n  zarr-skip show runs/cache 12\n  zarr-skip show runs/cache latest --rows 10 -e rollout\n"
        "  zarr-skip show runs/cache -1 --row 5                     one rollout of the latest step\n"
        "  zarr-skip show runs/cache 12 --text --rows 2 --tokenizer ~/models/qwen/tokenizer.json\n"
        "  zarr-skip show runs/cache 12 --uid 3f2a --json          a GRPO group by a prefix of its uid",
        [_common()],
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("step", metavar="STEP")
    which = p.add_mutually_exclusive_group()
    which.add_argument("-n", "--rows", type=int, default=3, help="rows to show (per column; default 3)")
    which.add_argument("--row", type=int, metavar="N", help="one rollout: row N of the step (implies --text)")
    which.add_argument("--uid", metavar="UID", help="the rows of one GRPO group, by a unique prefix (implies --text)")
    p.add_argument("--text", action="store_true", help="decoded rollouts instead of columns")
    _tokenizer_option(p)


def _add_verify(sub: Any) -> None:
    from zarr_skip.cli import _inspect as ins

    p = _add(
        sub,
        "verify",
        ins.cmd_verify,
        "read every chunk and check sizes and checksums",
        f"{LOC}\n{STEPS}\nWithout STEP, every complete step of every (selected) experiment.\n"
        "Exit status 1 when anything is broken.\n\nexamples:\n  zarr-skip verify runs/cache\n"
        "  zarr-skip verify runs/cache 10-20 -e rollout",
        [_common()],
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("steps", metavar="STEP", nargs="*", help="steps (N, A-B, latest, -K); default: all complete steps")
    p.set_defaults(trailing_steps=True)


def _add_gc_rm(sub: Any) -> None:
    from zarr_skip.cli import _manage as man

    p = _add(
        sub,
        "gc",
        man.cmd_gc,
        "remove abandoned data, and old steps with --keep-last",
        f"{LOC}\nShows what would be removed first. Abandoned steps, leftovers of displaced runs\n"
        "and old temp files go; complete steps only with --keep-last (never --pin-ned ones).\n"
        "Asks before removing; without --yes and without a terminal it refuses.\n\n"
        "examples:\n  zarr-skip gc runs/cache --dry-run\n  zarr-skip gc runs/cache --keep-last 20 --pin 5 --yes",
        [_common()],
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("--keep-last", type=int, metavar="K", help="keep only the K newest complete steps (per experiment)")
    p.add_argument("--pin", type=int, nargs="+", default=[], metavar="STEP", help="steps --keep-last never removes")
    p.add_argument("--dry-run", action="store_true", help="only show what would be removed")
    p.add_argument("-y", "--yes", action="store_true", help="remove without asking")

    p = _add(
        sub,
        "rm",
        man.cmd_rm,
        "remove steps, whatever their state",
        f"{LOC}\n{STEPS}\n\nexamples:\n  zarr-skip rm runs/cache 12\n  zarr-skip rm runs/cache 10-19 -e rollout --yes",
        [_common()],
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("steps", metavar="STEP", nargs="+", help="steps to remove (N, A-B, latest, -K)")
    p.add_argument("-y", "--yes", action="store_true", help="remove without asking")


def _add_import(sub: Any) -> None:
    from zarr_skip.cli import _manage as man

    p = _add(
        sub,
        "import",
        man.cmd_import,
        "import legacy verl dump directories into a cache",
        "LEGACY_DIR is verl's skip dump_dir (or an experiment or GBS.. dir in it); LOCATION the\n"
        "cache. gen_batch.dp steps go to role 'rollout', tq_batch.pt steps to 'rollout_tq'.\n"
        "Complete steps are copied exactly; incomplete ones are reported and skipped, steps the\n"
        "cache already holds are skipped unless --overwrite. Pickled legacy files may only\n"
        "hold data types unless --allow-pickle.\n\nexamples:\n"
        "  zarr-skip import ~/verl_dumps runs/cache\n"
        "  zarr-skip import ~/verl_dumps runs/cache --experiment-name my_exp --project-name my_proj",
        [_common(experiment=False)],
    )
    p.add_argument("legacy_dir", metavar="LEGACY_DIR")
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("--trust-pickle", action="store_true", help="deprecated: --allow-pickle")
    p.add_argument("--role", help="role of every imported experiment (default: by file kind)")
    p.add_argument("--overwrite", action="store_true", help="replace steps the cache already holds")
    p.add_argument("--experiment-name", help="verl's trainer.experiment_name (splits {exp}_{proj} dir names)")
    p.add_argument("--project-name", help="verl's trainer.project_name")
    p.add_argument("--parameter-sync-step", type=int, metavar="K", help="mini-batches a nested step must have")
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="let legacy pickles run code (trusted files only) and store columns the codec cannot store exactly "
        "as pickles",
    )
    p.add_argument("--coerce-meta", action="store_true", help="store a JSON-able copy of non-JSON meta_info (lossy)")


def _add_export(sub: Any) -> None:
    from zarr_skip.cli import _manage as man
    from zarr_skip.cli import _training as tr

    p = _add(
        sub,
        "export",
        man.cmd_export,
        "write steps as parquet or JSON Lines (one record per rollout), or in verl's dump layout",
        f"{LOC}\n{STEPS}\nOUT (the last argument, or -o OUT) named .parquet, .jsonl or .jsonl.gz: the file to\n"
        "write, one record per rollout (step, uid, decoded prompt and response when a tokenizer is\n"
        "known, lengths, scores and every scalar, string and JSON column), readable by pandas,\n"
        "pyarrow, polars and DuckDB. --format verl: OUT is verl's dump_dir: steps go to\n"
        "OUT/{exp}_{proj}/GBS.._N.._in.._out../STEP/. Layout auto: gen_batch.dp flat (as verl's\n"
        "rollout skip), tq_batch.pt nested per mini-batch.\n\n"
        "examples:\n  zarr-skip export runs/cache all rollouts.parquet\n"
        "  zarr-skip export runs/cache 12 13 -o rollouts.jsonl.gz --tokenizer ~/models/qwen\n"
        "  zarr-skip export runs/cache 12 13 dumps/ --format verl\n"
        "  zarr-skip export runs/cache all dumps/ -e rollout_tq --format verl --layout nested\n"
        "  zarr-skip export runs/cache all sft.jsonl --format sft --min-score 1\n"
        "  zarr-skip export runs/cache 12-20 dpo.parquet --format dpo --pairs 2",
        [_common()],
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("items", metavar="STEP", nargs="+", help="steps (N, A-B, latest, -K or all), then OUT")
    p.add_argument("-o", "--output", metavar="OUT", help="the file (or with --format verl the directory) to write")
    p.add_argument(
        "--format",
        choices=["verl", "parquet", "jsonl", *tr.FORMATS],
        default=None,
        help="output format (default: from OUT's suffix: .parquet, .jsonl, .jsonl.gz; verl, sft, dpo only if given)",
    )
    tr.add_options(p)
    p.add_argument("--layout", choices=["auto", "flat", "nested"], default="auto", help="verl layout")
    p.add_argument("--overwrite", action="store_true", help="replace what exists (verl step directories, OUT)")
    _tokenizer_option(p)


def _add_report(sub: Any) -> None:
    from zarr_skip.cli import _report as rep

    p = _add(
        sub,
        "report",
        rep.cmd_report,
        "write a self-contained HTML report: signals per step and data source, plots, rollouts",
        f"{LOC}\n{STEPS}\nOne HTML file with no outside references (inline CSS, plots as inline PNG, an optional\n"
        "inline script to sort and filter): open it in any browser or send it. Rollouts are shown\n"
        "for STEPs (default: the latest complete step), whole GRPO groups, up to --rows per step.\n\n"
        "examples:\n  zarr-skip report runs/cache -o report.html\n"
        "  zarr-skip report runs/cache 10 20-22 -o report.html --tokenizer ~/models/qwen/tokenizer.json",
        [_common()],
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("steps", metavar="STEP", nargs="*", help="steps whose rollouts are shown (N, A-B, latest, -K)")
    p.add_argument("-o", "--output", default="report.html", metavar="FILE", help="the HTML file (default report.html)")
    _tokenizer_option(p)
    p.add_argument("--rows", type=int, default=rep.ROWS, metavar="N", help=f"rollouts per step (default {rep.ROWS})")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="leave the plots out")
    p.add_argument("--tokens", action="store_true", help="add each response's tokens coloured by log-prob")
    p.add_argument("--no-script", dest="script", action="store_false", help="leave out the sorting/filtering script")
    p.set_defaults(trailing_steps=True)


# -- running ---------------------------------------------------------------------------------


def _exit_code(exc: BaseException) -> int:
    return 2 if isinstance(exc, USAGE_ERRORS) else 1


def _step_token(arg: str) -> bool:
    """``arg`` is a STEP (``12``, ``10-20``, ``latest``, ``-K``), not an option."""
    return not arg.startswith("-") or arg[1:].isdigit()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zarr-skip`` with ``argv`` (default: the process arguments); return the exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and getattr(args, "trailing_steps", False) and all(_step_token(x) for x in extra):
            args.steps = [*args.steps, *extra]  # `report LOC -e NAME 3 -1 -o F`: steps after an option
        elif extra:
            parser.parse_args(argv)  # argparse's own message for what it does not know
        args.storage_options = parse_storage_options(args.storage_option)
        args.argv = list(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help, --version, argparse's usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(terminal_safe(f"{PROG}: error: {exc}"), file=sys.stderr)
        return 2
    log = logging.getLogger("zarr_skip")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter(LOG_FORMAT))
    old_level = log.level
    log.addHandler(handler)
    log.setLevel((logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)])
    try:
        return int(args.func(Context(args)))
    except UsageError as exc:
        print(terminal_safe(f"{PROG} {args.command}: error: {exc}"), file=sys.stderr)
        return 2
    except ZarrSkipError as exc:
        print(terminal_safe(f"{PROG} {args.command}: error: {exc}"), file=sys.stderr)
        return _exit_code(exc)
    except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        print(terminal_safe(f"{PROG} {args.command}: error: {exc}"), file=sys.stderr)
        return 2
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # `zarr-skip ls | head`
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 1
        print(terminal_safe(f"{PROG} {args.command}: error: {exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(terminal_safe(f"{PROG}: interrupted"), file=sys.stderr)
        return 130
    except Exception as exc:  # a failure the library did not type (a store's own error, ...)
        if args.verbose:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        text = f"{PROG} {args.command}: error: {type(exc).__name__}: {first} (-v shows the traceback)"
        print(terminal_safe(text), file=sys.stderr)
        return 1
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


if __name__ == "__main__":
    sys.exit(main())
