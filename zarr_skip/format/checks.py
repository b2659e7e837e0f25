"""Checks of the arguments the public API takes, before anything is read or written (pure).

A wrong type raises :class:`~zarr_skip.errors.ConfigTypeError` (a ``TypeError``), a wrong value
:class:`~zarr_skip.errors.ConfigError` (a ``ValueError``); both name the argument.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from zarr_skip.errors import ConfigError, ConfigTypeError
from zarr_skip.format import args
from zarr_skip.format.layout import step_name

__all__ = [
    "MAX_EXPECTED",
    "check_location",
    "check_mapping",
    "check_open",
    "check_seconds",
    "check_steps",
    "check_whole",
]

#: the most mini-batches a step may expect (verl's parameter_sync_step is a handful)
MAX_EXPECTED = 1 << 16


def check_whole(value: Any, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int within ``[minimum, maximum]`` (a bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(f"{what}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" + (f" and at most {maximum:,}" if maximum is not None else "")
        raise ConfigError(f"{what}: must be {bound}, got {value!r}")
    return value


def check_seconds(value: Any, what: str, *, zero: bool) -> float:
    """``value`` as a finite number of seconds, positive (or zero when ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigTypeError(f"{what}: expected seconds as a number, got {type(value).__name__} {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        raise ConfigError(f"{what}: must be a finite number of seconds {'>= 0' if zero else '> 0'}, got {value!r}")
    return seconds


def check_mapping(value: Any, what: str) -> Mapping[str, Any] | None:
    """``value`` if it is a mapping or None."""
    if value is not None and not isinstance(value, Mapping):
        raise ConfigTypeError(f"{what}: expected a mapping (dict) or None, got {type(value).__name__}")
    return value


def check_json_mapping(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a dict of str keys whose values strict JSON holds (no NaN or infinities,
    no bytes, objects or other types JSON has not)."""
    if not isinstance(value, Mapping):
        raise ConfigTypeError(f"{what}: expected a mapping (dict), got {type(value).__name__}")
    keys = [k for k in value if not isinstance(k, str)]
    if keys:
        raise ConfigTypeError(f"{what}: keys must be str, got {type(keys[0]).__name__} {keys[0]!r:.60}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{what}: not strict JSON ({exc})") from None
    return dict(value)


def check_open(
    fingerprint: Any,
    storage_options: Any,
    read_only: Any,
    chunk_bytes: Any,
    lease: Any,
    claim_settle: Any,
    experiment: Any = None,
) -> tuple[float, float]:
    """The arguments of ``open_cache`` but its location; the lease and claim settle time as
    floats."""
    if experiment is not None:
        args.name(experiment, "experiment")
    check_mapping(fingerprint, "fingerprint")
    check_mapping(storage_options, "storage_options")
    if read_only is not None and not isinstance(read_only, bool):
        raise ConfigTypeError(f"read_only: expected a bool or None, got {type(read_only).__name__}")
    check_whole(chunk_bytes, "chunk_bytes")
    return check_seconds(lease, "lease", zero=True), check_seconds(claim_settle, "claim_settle", zero=True)


def check_location(value: Any) -> None:
    """A location is a path, a URL string or a zarr Store (checked by the caller)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigTypeError(
            f"location: expected a path, a file:// or s3:// URL, or a zarr Store, got {type(value).__name__}"
        )
    if not os.fspath(value):
        raise ConfigError("location: empty path")


def check_steps(steps: Any, *, one: bool = False, unique: bool = False, what: str = "steps") -> list[int] | None:
    """``steps`` (None, or an iterable of step numbers; with ``one``, a single step too) as a
    list of ints, every step checked: Python or numpy integers, each a valid step number; with
    ``unique``, each once (where first named), as the CLI reads ``3 3`` or ``1-3 2``. Errors
    name the argument ``what``."""
    if steps is None:
        return None
    if one and isinstance(steps, (int, np.integer)) and not isinstance(steps, (bool, np.bool_)):
        steps = [steps]
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        wanted = "a step (an int), steps or None" if one else "an iterable of ints or None"
        raise ConfigTypeError(f"{what}: expected {wanted}, got {type(steps).__name__} {steps!r:.60}")
    out = [args.whole(step, what) for step in steps]
    for step in out:
        if step < 0:
            raise ConfigError(f"{what}: expected non-negative ints, got {step}")
        step_name(step)
    return list(dict.fromkeys(out)) if unique else out
