"""What every ``zarr-skip`` command shares: the invocation context, step and option parsing."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zarr_skip.cli._format import terminal_safe
from zarr_skip.errors import ExperimentNotFoundError

__all__ = ["LOG_FORMAT", "Context", "UsageError", "parse_steps", "parse_storage_options"]

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
        """The ``--json`` document (stdout)."""
        print(json.dumps(doc, indent=2, default=str, allow_nan=True), file=sys.stdout)

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
            hint = f" -e {max(names, key=len)}" if names else ""
            raise UsageError(
                f"{self.args.location} is not a zarr_skip cache but a group inside one: the cache is at {root} "
                f"({inside} inside it); run: zarr-skip {self.args.command} {root}{hint}"
            ) from exc

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
        found = self.open().experiments()
        wanted = getattr(self.args, "experiment", None)
        if wanted is None:
            return found
        if wanted in found:
            return {wanted: found[wanted]}
        matches = [n for n in found if n.endswith("/" + wanted)] or [n for n in found if wanted in n]
        if len(matches) == 1:
            return {matches[0]: found[matches[0]]}
        if matches:
            raise UsageError(f"--experiment {wanted!r} matches several experiments: {', '.join(matches)}")
        raise ExperimentNotFoundError(
            f"experiment {wanted!r} not found at {self.args.location} (found: {', '.join(found) or 'none'})"
        )

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


def parse_steps(tokens: Sequence[str], *, allow_all: bool = False) -> list[int] | None:
    """Step numbers from ``12``, ``10-20`` (inclusive) tokens; ``None`` for ``all``."""
    steps: list[int] = []
    for token in tokens:
        if allow_all and token == "all":
            return None
        lo, sep, hi = token.partition("-")
        try:
            steps += list(range(int(lo), int(hi) + 1)) if sep else [int(token)]
        except ValueError:
            raise UsageError(f"step {token!r}: expected a number or a range like 10-20") from None
        if steps and min(steps) < 0:
            raise UsageError(f"step {token!r}: steps are non-negative")
    return list(dict.fromkeys(steps))


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
