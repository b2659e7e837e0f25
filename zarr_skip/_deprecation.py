"""Old names kept for one release: each use warns with a :class:`DeprecationWarning` naming the
new one (docs/deprecations.md lists them)."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["keyword_only", "warn_renamed"]


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (pointing at the caller's line)."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def keyword_only(func: Callable[P, R]) -> Callable[P, R]:
    """Let ``func``'s keyword-only parameters still be passed by position for one release.

    Positional arguments beyond ``func``'s positional parameters are given, in order, to its
    keyword-only parameters, with a warning naming them; the type checker sees ``func``'s own
    signature, so new code is told to name them.
    """
    params = inspect.signature(func).parameters.values()
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    keywords = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    name = func.__qualname__

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(args) > positional:
            extra = args[positional:]
            if len(extra) > len(keywords):
                raise TypeError(f"{name}() takes {positional} positional arguments but {len(args)} were given")
            names = keywords[: len(extra)]
            clash = [n for n in names if n in kwargs]
            if clash:
                raise TypeError(f"{name}() got multiple values for argument {clash[0]!r}")
            warn_renamed(
                f"passing {', '.join(names)} to {name}() by position",
                "keywords (" + ", ".join(f"{n}=..." for n in names) + ")",
            )
            kwargs.update(zip(names, extra, strict=True))
            args = args[:positional]
        return func(*args, **kwargs)

    return wrapper
