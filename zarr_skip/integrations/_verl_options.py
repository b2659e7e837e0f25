"""Settings of the verl integration: ``install()`` arguments, else environment, else defaults."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from zarr_skip.errors import ConfigError
from zarr_skip.format import checks, layout
from zarr_skip.format.chunks import Compression
from zarr_skip.trainer.remap import POLICIES

__all__ = ["ENV_PREFIX", "Options", "options"]

#: prefix of the environment variables read by :func:`options`
ENV_PREFIX = "ZARR_SKIP_"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True, slots=True)
class Options:
    """zarr_skip settings of the verl integration (see the module docstring).

    Attributes
    ----------
    import_legacy : bool
        Fall back to legacy verl dumps under ``dump_dir`` for steps missing from Zarr.
    run_id : str or None
        Run id for :func:`zarr_skip.open_cache`; ``None``: a fresh one per role object.
    compression : str or None
        Codec for :func:`zarr_skip.open_cache`; ``None``: zarr_skip's default.
    allow_pickle : bool
        Pickle columns that cannot be stored exactly (written and read back).
    on_group_mismatch : str
        ``"cycle"`` or ``"error"``: :func:`zarr_skip.trainer.remap.remap` policy for ``rollout_tq``.
    storage_options : mapping or None
        Passed to :func:`zarr_skip.open_cache` for URLs.
    """

    import_legacy: bool = False
    run_id: str | None = None
    compression: str | None = None
    allow_pickle: bool = False
    on_group_mismatch: str = "cycle"
    storage_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("import_legacy", "allow_pickle"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        if self.on_group_mismatch not in POLICIES:
            raise ConfigError(f"on_group_mismatch: expected 'cycle' or 'error', got {self.on_group_mismatch!r}")
        if self.compression is not None:
            Compression.parse(self.compression)  # raises ConfigError naming the codec
        if self.run_id is not None and (not isinstance(self.run_id, str) or not self.run_id.strip()):
            raise ConfigError(f"run_id: expected a non-empty string, got {self.run_id!r}")
        if self.run_id is not None:
            layout.check_run_id(self.run_id)  # open_cache would refuse it at the first listed step
        checks.check_mapping(self.storage_options, "storage_options")  # not first at a listed step


_lock = threading.RLock()
_explicit: dict[str, Any] = {}  # install() keyword arguments that were given


def _env_bool(name: str) -> bool | None:
    raw = os.environ.get(ENV_PREFIX + name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{ENV_PREFIX}{name}: expected 1/0, true/false, yes/no or on/off, got {raw!r}")


def _env_str(name: str) -> str | None:
    raw = os.environ.get(ENV_PREFIX + name)
    return raw.strip() or None if raw is not None else None


def options() -> Options:
    """The settings role objects use now: install() arguments, else environment, else defaults.

    Raises
    ------
    ConfigError
        If a setting is invalid (the message names the argument or variable).
    """
    env: dict[str, Any] = {
        "import_legacy": _env_bool("IMPORT_LEGACY"),
        "run_id": _env_str("RUN_ID"),
        "compression": _env_str("COMPRESSION"),
        "allow_pickle": _env_bool("ALLOW_PICKLE"),
        "on_group_mismatch": _env_str("ON_GROUP_MISMATCH"),
    }
    merged = {k: v for k, v in env.items() if v is not None}
    with _lock:
        explicit = dict(_explicit)
    for name in merged.keys() - explicit.keys():  # a value from the environment: name its variable
        try:
            replace(Options(), **{name: merged[name]})
        except ConfigError as exc:
            raise ConfigError(f"{ENV_PREFIX}{name.upper()}: {exc}") from None
    merged.update(explicit)
    return replace(Options(), **merged)
