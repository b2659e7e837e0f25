"""What every ``zarr-skip`` command shares: the invocation context, step and option parsing."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zarr_skip.cli._format import terminal_safe
from zarr_skip.format.jsonvalues import strict_json

__all__ = ["LOG_FORMAT", "Context", "UsageError", "parse_steps", "parse_storage_options", "relative_step"]

#: how the command prints a library log record and its own warnings alike
LOG_FORMAT = "zarr-skip: %(levelname)s: %(message)s"


class UsageError(Exception):
    """A command-line mistake: printed as one line, exit code 2."""


@dataclass(slots=True)
class Context:
    """One invocation: the parsed arguments and helpers shared by the commands."""

    args: argparse.Namespace

    # -- output -------------------------------------------------------------------------------

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    def say(self, text: str = "") -> None:
        """A line of the command's output (stdout); silent under ``--json``."""
        if not self.json:
            print(terminal_safe(text), file=sys.stdout)

    def note(self, text: str) -> None:
        """A remark for the human at the terminal (stderr)."""
        print(terminal_safe(text), file=sys.stderr)

    def warn(self, text: str) -> None:
        """A warning (stderr), in the same format as the library's logged warnings."""
        print(terminal_safe(LOG_FORMAT % {"levelname": "WARNING", "message": text}), file=sys.stderr)

    def emit(self, doc: Any) -> None:
        """The ``--json`` document (stdout): strict JSON, numbers it cannot hold (NaN,
        infinities) as ``null``."""
        print(json.dumps(strict_json(doc), indent=2, default=str, allow_nan=False), file=sys.stdout)

    @contextlib.contextmanager
    def quiet(self, logger: str) -> Iterator[None]:
        """Silence ``logger``'s warnings (unless ``-v``) while the command reports them itself."""
        log = logging.getLogger(logger)
        old = log.level
        if not self.args.verbose:
            log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            log.setLevel(old)

    def bar(self, desc: str, unit: str, total: int | None = None) -> Any:
        from zarr_skip.cli._format import Bar

        return Bar(getattr(self.args, "progress", None), desc, unit, total)

    def confirm(self, question: str) -> bool:
        """Ask on the terminal; refuse (UsageError) without ``--yes`` when stdin is not one."""
        if getattr(self.args, "yes", False):
            return True
        if not sys.stdin or not sys.stdin.isatty():
            raise UsageError(f"cannot ask '{question}': stdin is not a terminal; nothing done (pass --yes)")
        print(terminal_safe(f"{question} [y/N] "), end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    def tokenizer(self) -> Any:
        """The ``--tokenizer`` to decode with (None: the recorded one, if any), loaded with
        ``--trust-remote-code`` when that is given."""
        path = getattr(self.args, "tokenizer", None)
        if not getattr(self.args, "trust_remote_code", False):
            return path
        if path is None:
            raise UsageError(
                "--trust-remote-code applies to --tokenizer PATH only (a recorded tokenizer never runs code)"
            )
        from zarr_skip.views.tokenizers import load_tokenizer

        return load_tokenizer(path, trust_remote_code=True)

    # -- caches -------------------------------------------------------------------------------

    def open(self, experiment: str | None = None, fingerprint: Mapping[str, Any] | None = None) -> Any:
        """A handle on ``LOCATION``: read-only, or writable when ``fingerprint`` is given."""
        from zarr_skip import open_cache
        from zarr_skip.errors import CacheNotFoundError, MetadataError

        try:
            return open_cache(
                self.args.location, fingerprint, experiment=experiment, storage_options=self.args.storage_options
            )
        except (CacheNotFoundError, MetadataError) as exc:
            found = self._root_above(str(self.args.location))
            if found is None:
                raise
            root, cache = found
            inside = str(self.args.location).rstrip("/")[len(root) :].strip("/")
            names = [n for n in cache.experiments() if inside == n or inside.startswith(n + "/")]
            experiment = max(names, key=len) if names else None
            raise UsageError(
                f"{self.args.location} is not a zarr_skip cache but a group inside one: the cache is at {root} "
                f"({inside} inside it); run: {self.rerun(root, experiment)}"
            ) from exc

    def rerun(self, location: str, experiment: str | None = None) -> str:
        """This command line again with ``location`` for LOCATION (and ``-e experiment`` for
        any experiment option given), quoted for a POSIX shell."""
        import shlex

        argv = list(getattr(self.args, "argv", None) or [self.args.command, str(self.args.location)])
        where = argv.index(str(self.args.location)) if str(self.args.location) in argv else None
        if where is not None:
            argv[where] = location
        if experiment is not None:
            argv = _without_experiment(argv) + ["-e", experiment]
        return "zarr-skip " + " ".join(shlex.quote(a) for a in argv)

    def _root_above(self, location: str) -> tuple[str, Any] | None:
        """The nearest location above ``location`` that is a zarr_skip cache (a few levels up),
        with a read-only handle on it."""
        from zarr_skip import open_cache
        from zarr_skip.errors import ZarrSkipError

        scheme, sep, path = location.rpartition("://")
        head = f"{scheme}{sep}"
        parts = path.rstrip("/").split("/")
        for cut in range(len(parts) - 1, max(0, len(parts) - 9), -1):
            candidate = head + "/".join(parts[:cut])
            if not candidate[len(head) :]:
                break
            try:
                return candidate, open_cache(candidate, storage_options=self.args.storage_options)
            except (ZarrSkipError, OSError, ValueError):  # not a cache either: one level up
                continue
        return None

    def experiments(self) -> dict[str, dict[str, Any]]:
        """The experiments at ``LOCATION`` that ``--experiment`` selects (all without it)."""
        found: dict[str, dict[str, Any]] = self.open().experiments()
        wanted = getattr(self.args, "experiment", None)
        if wanted is None:
            return found
        from zarr_skip.store.experiments import match_experiment

        name = match_experiment(wanted, list(found), str(self.args.location))
        return {name: found[name]}

    def complete_steps(self) -> list[int]:
        """The complete steps of the single experiment this command works on (for ``latest``)."""
        steps: list[int] = self.open(self.one_experiment()[0]).steps()
        return steps

    def one_step(self, cache: Any) -> int:
        """The ``STEP`` argument (N, ``latest`` or ``-K``) as a step of ``cache``."""
        token = str(self.args.step)
        if token == "latest" or (token.startswith("-") and token[1:].isdigit()):
            return relative_step(token, cache.steps())
        try:
            return int(token)
        except ValueError:
            raise UsageError(
                f"step {token!r}: expected a number, latest or -K (-1 is the latest complete step)"
            ) from None

    def one_experiment(self) -> tuple[str, dict[str, Any]]:
        """The single experiment this command works on."""
        found = self.experiments()
        if not found:
            raise UsageError(f"no zarr_skip experiments at {self.args.location}")
        if len(found) > 1:
            raise UsageError(
                f"{self.args.location} holds several experiments; pick one with --experiment NAME:\n  "
                + "\n  ".join(found)
            )
        ((name, fp),) = found.items()
        return name, fp


# -- arguments -------------------------------------------------------------------------------


def _without_experiment(argv: list[str]) -> list[str]:
    """``argv`` without its ``-e NAME`` / ``--experiment NAME`` / ``--experiment=NAME``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-e", "--experiment"):
            skip = True
        elif not a.startswith("--experiment="):
            out.append(a)
    return out


def parse_steps(
    tokens: Sequence[str], *, allow_all: bool = False, complete: Callable[[], Sequence[int]] | None = None
) -> list[int] | None:
    """Step numbers from ``12``, ``10-20`` (inclusive), ``latest`` and ``-K`` (the K-th latest
    of ``complete()``, the complete steps ascending: ``-1`` is the latest) tokens; ``None`` for
    ``all``."""
    steps: list[int] = []
    known: list[Sequence[int]] = []  # complete(), asked for once

    def latest() -> Sequence[int]:
        if complete is None:
            raise UsageError("latest and -K steps are not taken here: give step numbers")
        if not known:
            known.append(complete())
        return known[0]

    for token in tokens:
        if allow_all and token == "all":
            return None
        if token == "latest" or (token.startswith("-") and token[1:].isdigit()):
            steps.append(relative_step(token, latest()))
            continue
        steps += _step_range(token)
    return list(dict.fromkeys(steps))


#: the most steps one ``A-B`` token may name (each becomes a step number in a list)
MAX_RANGE = 1_000_000


def _step_range(token: str) -> range:
    """The steps of ``12`` or ``10-20`` (inclusive), or UsageError."""
    lo, sep, hi = token.partition("-")
    try:
        first, last = int(lo), int(hi if sep else lo)
    except ValueError:
        raise UsageError(f"step {token!r}: expected a number, a range like 10-20, latest or -K") from None
    if last < first:
        raise UsageError(f"step range {token!r}: the end is below the start (write {last}-{first})")
    if last - first >= MAX_RANGE:
        raise UsageError(f"step range {token!r}: {last - first + 1} steps, at most {MAX_RANGE:,} (or give 'all')")
    return range(first, last + 1)


def relative_step(token: str, complete: Sequence[int]) -> int:
    """The step ``latest`` or ``-K`` names among ``complete`` (ascending), or UsageError."""
    k = 1 if token == "latest" else int(token[1:])
    if k == 0:
        raise UsageError(f"step {token!r}: -1 is the latest complete step, -2 the one before, ...")
    if k > len(complete):
        raise UsageError(
            f"step {token!r}: there are {len(complete)} complete step(s)"
            + (f" ({', '.join(map(str, complete[-10:]))})" if complete else "")
        )
    return int(complete[-k])


def parse_storage_options(items: Sequence[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; values that read as JSON (numbers, true/false) are decoded."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
