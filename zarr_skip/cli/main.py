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
from zarr_skip.errors import (
    AmbiguousExperimentError,
    CacheNotFoundError,
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
  zarr-skip ls s3://bucket/cache -o endpoint_url=http://minio:9000 --json
  zarr-skip show runs/cache 12 --rows 5                     columns and first rows of step 12
  zarr-skip show runs/cache 12 --text --uid 3f2a...         one GRPO group's rollouts, decoded
  zarr-skip verify runs/cache                               read every chunk, check checksums
  zarr-skip gc runs/cache --keep-last 50 --pin 100 --dry-run
  zarr-skip rm runs/cache 12 13-15 --yes
  zarr-skip import ~/verl_dumps runs/cache                  legacy verl dumps -> Zarr
  zarr-skip export runs/cache 12 13 out/ --format verl      Zarr -> verl's layout
  zarr-skip export runs/cache all r.parquet --format parquet  one record per rollout, decoded
  zarr-skip report runs/cache 12 -o report.html             one HTML file to open or share

exit status: 0 ok, 1 problems found, 2 usage error
"""


def _common(*, experiment: bool = True, storage_short: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        *(["-o"] if storage_short else []),  # `report` takes -o for its output file
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
            help="the experiment to use (full name, or a unique part of it such as the role)",
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


def _add(
    sub: Any, name: str, func: Callable[[Context], int], help_: str, epilog: str, parents: list[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=help_,
        description=help_,
        epilog=epilog,
        parents=parents,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``zarr-skip``."""
    from zarr_skip.cli import _inspect as ins
    from zarr_skip.cli import _manage as man
    from zarr_skip.cli import _training as tr

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, clean, import and export zarr_skip rollout caches.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from zarr_skip import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common, loc = [_common()], "LOCATION is a path or an s3:// URL."

    p = _add(
        sub,
        "ls",
        ins.cmd_ls,
        "list experiments and their steps",
        f"{loc}\n\nexamples:\n  zarr-skip ls runs/cache\n  zarr-skip ls runs/cache -e rollout_tq --json",
        common,
    )
    p.add_argument("location", metavar="LOCATION")

    p = _add(
        sub,
        "show",
        ins.cmd_show,
        "show a step's columns and first rows, or its rollouts decoded (--text)",
        f"{loc}\nWith --text: each rollout's prompt (as chat messages when stored) and response,\n"
        "decoded with --tokenizer or the tokenizer the trainer recorded, with its data source,\n"
        "length, truncation, score, reward and advantage; --json gives them as records.\n\n"
        "examples:\n  zarr-skip show runs/cache 12\n  zarr-skip show runs/cache 12 --rows 10 -e rollout\n"
        "  zarr-skip show runs/cache 12 --text --rows 2 --tokenizer ~/models/qwen/tokenizer.json\n"
        "  zarr-skip show runs/cache 12 --text --uid 3f2a9c1e-... --json",
        common,
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("step", metavar="STEP", type=int)
    which = p.add_mutually_exclusive_group()
    which.add_argument("-n", "--rows", type=int, default=3, help="rows to show (per column; default 3)")
    which.add_argument("--uid", metavar="UID", help="the rows of one GRPO group (implies --text)")
    p.add_argument("--text", action="store_true", help="decoded rollouts instead of columns")
    _tokenizer_option(p)

    p = _add(
        sub,
        "verify",
        ins.cmd_verify,
        "read every chunk and check sizes and checksums",
        f"{loc}\nWithout STEP, every complete step of every (selected) experiment.\n"
        "Exit status 1 when anything is broken.\n\nexamples:\n  zarr-skip verify runs/cache\n"
        "  zarr-skip verify runs/cache 10-20 -e rollout",
        common,
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("steps", metavar="STEP", nargs="*", help="steps (N or A-B); default: all complete steps")

    p = _add(
        sub,
        "gc",
        man.cmd_gc,
        "remove abandoned data, and old steps with --keep-last",
        f"{loc}\nShows what would be removed first. Abandoned steps, leftovers of displaced runs\n"
        "and old temp files go; complete steps only with --keep-last (never --pin-ned ones).\n"
        "Asks before removing; without --yes and without a terminal it refuses.\n\n"
        "examples:\n  zarr-skip gc runs/cache --dry-run\n  zarr-skip gc runs/cache --keep-last 20 --pin 5 --yes",
        common,
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
        f"{loc}\n\nexamples:\n  zarr-skip rm runs/cache 12\n  zarr-skip rm runs/cache 10-19 -e rollout --yes",
        common,
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("steps", metavar="STEP", nargs="+", help="steps to remove (N or A-B)")
    p.add_argument("-y", "--yes", action="store_true", help="remove without asking")

    p = _add(
        sub,
        "import",
        man.cmd_import,
        "import legacy verl dump directories into a cache",
        "LEGACY_DIR is verl's skip dump_dir (or an experiment or GBS.. dir in it); LOCATION the\n"
        "cache. gen_batch.dp steps go to role 'rollout', tq_batch.pt steps to 'rollout_tq'.\n"
        "Complete steps are copied exactly; incomplete ones are reported and skipped, steps the\n"
        "cache already holds are skipped unless --overwrite. Pickled legacy files may only\n"
        "hold data types unless --trust-pickle.\n\nexamples:\n"
        "  zarr-skip import ~/verl_dumps runs/cache\n"
        "  zarr-skip import ~/verl_dumps runs/cache --experiment-name my_exp --project-name my_proj",
        [_common(experiment=False)],
    )
    p.add_argument("legacy_dir", metavar="LEGACY_DIR")
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("--trust-pickle", action="store_true", help="let legacy pickles run code (trusted files only)")
    p.add_argument("--role", help="role of every imported experiment (default: by file kind)")
    p.add_argument("--overwrite", action="store_true", help="replace steps the cache already holds")
    p.add_argument("--experiment-name", help="verl's trainer.experiment_name (splits {exp}_{proj} dir names)")
    p.add_argument("--project-name", help="verl's trainer.project_name")
    p.add_argument("--parameter-sync-step", type=int, metavar="K", help="mini-batches a nested step must have")
    p.add_argument(
        "--allow-pickle", action="store_true", help="store columns the codec cannot store exactly as pickles"
    )
    p.add_argument("--coerce-meta", action="store_true", help="store a JSON-able copy of non-JSON meta_info (lossy)")

    p = _add(
        sub,
        "export",
        man.cmd_export,
        "write steps as parquet or JSON Lines (one record per rollout), or in verl's dump layout",
        f"{loc}\n--format parquet / jsonl: OUT is the file to write, one record per rollout (step, uid,\n"
        "decoded prompt and response when a tokenizer is known, lengths, scores and every scalar,\n"
        "string and JSON column), readable by pandas, pyarrow, polars and DuckDB.\n"
        "--format verl: OUT is verl's dump_dir: steps go to OUT/{exp}_{proj}/GBS.._N.._in.._out../STEP/.\n"
        "Layout auto: gen_batch.dp flat (as verl's rollout skip), tq_batch.pt nested per mini-batch.\n\n"
        "examples:\n  zarr-skip export runs/cache all rollouts.parquet --format parquet\n"
        "  zarr-skip export runs/cache 12 13 rollouts.jsonl --format jsonl --tokenizer ~/models/qwen\n"
        "  zarr-skip export runs/cache 12 13 dumps/ --format verl\n"
        "  zarr-skip export runs/cache all dumps/ -e rollout_tq --layout nested\n"
        "  zarr-skip export runs/cache all sft.jsonl --format sft --min-score 1\n"
        "  zarr-skip export runs/cache 12-20 dpo.parquet --format dpo --pairs 2",
        common,
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("steps", metavar="STEP", nargs="+", help="steps (N, A-B or all)")
    p.add_argument("dest", metavar="OUT")
    p.add_argument(
        "--format",
        choices=["verl", "parquet", "jsonl", *tr.FORMATS],
        default="verl",
        help="output format (default verl)",
    )
    tr.add_options(p)
    p.add_argument("--layout", choices=["auto", "flat", "nested"], default="auto", help="verl layout")
    p.add_argument("--overwrite", action="store_true", help="replace what exists (verl step directories, OUT)")
    _tokenizer_option(p)
    from zarr_skip.cli import _report as rep

    p = _add(
        sub,
        "report",
        rep.cmd_report,
        "write a self-contained HTML report: step table, plots, rollouts with decoded text",
        f"{loc}\nOne HTML file with no outside references (inline CSS, plots as inline PNG, no\n"
        "scripts): open it in any browser or send it. Rollouts are shown for STEPs (default: the\n"
        "latest complete step), whole GRPO groups, up to --rows per step.\n"
        "(Here -o is the output file; storage options are --storage-option KEY=VALUE.)\n\n"
        "examples:\n  zarr-skip report runs/cache -o report.html\n"
        "  zarr-skip report runs/cache 10 20-22 -o report.html --tokenizer ~/models/qwen/tokenizer.json",
        [_common(storage_short=False)],
    )
    p.add_argument("location", metavar="LOCATION")
    p.add_argument("steps", metavar="STEP", nargs="*", help="steps whose rollouts are shown (N or A-B)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    _tokenizer_option(p)
    p.add_argument("--rows", type=int, default=rep.ROWS, metavar="N", help=f"rollouts per step (default {rep.ROWS})")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="leave the plots out")
    p.add_argument("--tokens", action="store_true", help="add each response's tokens coloured by log-prob")
    p.set_defaults(trailing_steps=True)
    return parser


# -- running ---------------------------------------------------------------------------------


def _exit_code(exc: BaseException) -> int:
    return 2 if isinstance(exc, USAGE_ERRORS) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zarr-skip`` with ``argv`` (default: the process arguments); return the exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and getattr(args, "trailing_steps", False) and not any(x.startswith("-") for x in extra):
            args.steps = [*args.steps, *extra]  # `report LOC -e NAME 3 5 -o F`: steps after an option
        elif extra:
            parser.parse_args(argv)  # argparse's own message for what it does not know
        args.storage_options = parse_storage_options(args.storage_option)
    except SystemExit as exc:  # --help, --version, argparse's usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    log = logging.getLogger("zarr_skip")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    old_level = log.level
    log.addHandler(handler)
    log.setLevel((logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)])
    try:
        return int(args.func(Context(args)))
    except UsageError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ZarrSkipError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return _exit_code(exc)
    except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # `zarr-skip ls | head`
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 1
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a failure the library did not type (a store's own error, ...)
        if args.verbose:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"{PROG} {args.command}: error: {type(exc).__name__}: {first} (-v shows the traceback)", file=sys.stderr)
        return 1
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


if __name__ == "__main__":
    sys.exit(main())
