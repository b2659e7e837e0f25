"""Switch verl's own ``SkipManager`` to the Zarr cache with one call.

>>> from zarr_skip.integrations import verl as zs_verl
>>> zs_verl.install()          # before verl's SkipManager.init(config)   # doctest: +SKIP

:func:`install` registers Zarr-backed classes for the roles ``rollout``, ``rollout_tq`` and
``async_rollout`` in verl's ``verl.utils.skip.base_skip.SKIP_REGISTRY``. verl's
``SkipManager``, its decorators and its Hydra keys (``skip.<role>.enable/dump_dir/steps/action``)
then work unchanged while steps go to a zarr_skip cache at ``dump_dir`` (a path or a URL).
:func:`uninstall` puts verl's own classes back.

Importing this module registers nothing and does not import verl: only :func:`install` does,
raising :class:`VerlNotInstalledError` (an ``ImportError``) when verl is missing.
``import zarr_skip`` never imports this module.

verl's config dataclasses refuse unknown ``skip.<role>.*`` keys, so zarr_skip's own settings
come from :func:`install` keyword arguments, else from environment variables (which Ray
workers get through ``runtime_env={"env_vars": ...}``), else defaults (see :class:`Options`):

- ``import_legacy`` / ``ZARR_SKIP_IMPORT_LEGACY=1``: a step missing from Zarr is read from a
  legacy verl dump under the same ``dump_dir`` (restricted unpickler) and stored into Zarr.
- ``run_id`` / ``ZARR_SKIP_RUN_ID``: the run id of every process writing one training run's
  steps (default: a fresh one per role object).
- ``compression`` / ``ZARR_SKIP_COMPRESSION``: ``zstd`` (default), ``zstd:1``, ``lz4``, ``none``.
- ``allow_pickle`` / ``ZARR_SKIP_ALLOW_PICKLE=1``: pickle columns the codec cannot store exactly.
- ``on_group_mismatch`` / ``ZARR_SKIP_ON_GROUP_MISMATCH``: ``cycle`` (verl's behaviour) or
  ``error`` when a ``rollout_tq`` replay has another number of prompts.
- ``storage_options`` (no variable): passed to :func:`zarr_skip.open_cache` for URLs.

The settings are read when ``SkipManager.init`` builds the role objects. In a Ray job verl
calls ``SkipManager.init`` inside a Ray actor, so install there too: pass
``runtime_env={"worker_process_setup_hook": "zarr_skip.integrations.verl.install"}``
(``docs/verl.md``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..chunks import Compression
from ..errors import ConfigError, ZarrSkipError
from ..remap import POLICIES

logger = logging.getLogger(__name__)

__all__ = [
    "ENV_PREFIX",
    "ROLES",
    "CachedStepMissingError",
    "Options",
    "VerlNotInstalledError",
    "install",
    "installed",
    "options",
    "require_verl",
    "uninstall",
]

#: the roles whose classes :func:`install` replaces
ROLES: tuple[str, ...] = ("rollout", "rollout_tq", "async_rollout")
#: prefix of the environment variables read by :func:`options`
ENV_PREFIX = "ZARR_SKIP_"
#: the verl release this integration is tested against
TESTED_VERL = "0.9.1"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class VerlNotInstalledError(ZarrSkipError, ImportError):
    """verl (``verl.utils.skip``) cannot be imported: ``pip install verl``."""


class CachedStepMissingError(ZarrSkipError, RuntimeError, FileNotFoundError):
    """A cached step was to be loaded but none is there (deleted meanwhile, or never written).

    A ``RuntimeError`` like verl's ``RolloutSkip.warp_function`` raises and a
    ``FileNotFoundError`` like verl's ``RolloutTqSkip.load_dump_data`` raises.
    """


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
        ``"cycle"`` or ``"error"``: :func:`zarr_skip.remap.remap` policy for ``rollout_tq``.
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


_lock = threading.RLock()
_explicit: dict[str, Any] = {}  # install() keyword arguments that were given
_originals: dict[str, Any] = {}  # role -> verl's class (or _ABSENT) replaced by install()
_ABSENT = object()


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
        merged.update(_explicit)
    return replace(Options(), **merged)


def require_verl() -> str:
    """Import verl's skip package and return verl's version.

    Raises
    ------
    VerlNotInstalledError
        If verl or ``verl.utils.skip`` cannot be imported (the message says how to install it).
    """
    try:
        import verl
        import verl.utils.skip.base_skip
    except ImportError as exc:
        if exc.name == "verl":
            raise VerlNotInstalledError(
                "zarr_skip.integrations.verl needs verl: pip install verl "
                f"(tested with verl=={TESTED_VERL})"
            ) from exc
        raise VerlNotInstalledError(
            f"verl is installed but verl.utils.skip cannot be imported ({exc}); this integration "
            f"needs verl with SkipManager: pip install 'verl>={TESTED_VERL}'"
        ) from exc
    return str(getattr(verl, "__version__", "unknown"))


def install(
    *,
    import_legacy: bool | None = None,
    run_id: str | None = None,
    compression: str | None = None,
    allow_pickle: bool | None = None,
    on_group_mismatch: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Register the Zarr-backed skip classes in verl's ``SKIP_REGISTRY`` (idempotent).

    Call it before verl's ``SkipManager.init(config)``, in the process that calls it. Calling
    it again keeps the registration and updates the settings given; arguments left ``None``
    keep their earlier value, else the environment's, else the default.

    Parameters
    ----------
    import_legacy, run_id, compression, allow_pickle, on_group_mismatch, storage_options
        See :class:`Options`.

    Raises
    ------
    VerlNotInstalledError
        If verl is not installed.
    ConfigError
        If a setting is invalid.
    """
    version = require_verl()
    from verl.utils.skip.base_skip import SKIP_REGISTRY

    from . import _verl_skip

    given = {
        "import_legacy": import_legacy,
        "run_id": run_id,
        "compression": compression,
        "allow_pickle": allow_pickle,
        "on_group_mismatch": on_group_mismatch,
        "storage_options": storage_options,
    }
    with _lock:
        candidate = {**_explicit, **{k: v for k, v in given.items() if v is not None}}
        replace(Options(), **candidate)  # validate before changing anything
        _explicit.clear()
        _explicit.update(candidate)
        for role, cls in _verl_skip.CLASSES.items():
            current = SKIP_REGISTRY.get(role, _ABSENT)
            if current is cls:
                continue
            if role not in _originals:
                _originals[role] = current
            SKIP_REGISTRY[role] = cls
    _warn_if_initialized()
    logger.info("zarr_skip: verl %s skip roles %s now use the Zarr cache (%s)", version, ", ".join(ROLES), options())


def uninstall() -> None:
    """Put verl's own skip classes back and forget the install() settings (idempotent).

    Role objects already built by ``SkipManager.init`` keep working until the next ``init``.
    """
    with _lock:
        if not _originals:
            _explicit.clear()
            return
        from verl.utils.skip.base_skip import SKIP_REGISTRY

        for role, cls in _originals.items():
            if cls is _ABSENT:
                SKIP_REGISTRY.pop(role, None)
            else:
                SKIP_REGISTRY[role] = cls
        _originals.clear()
        _explicit.clear()
    logger.info("zarr_skip: verl's own skip classes restored")


def installed() -> bool:
    """Whether verl's ``SKIP_REGISTRY`` currently holds the Zarr-backed classes for every role."""
    base = sys.modules.get("verl.utils.skip.base_skip")
    ours = sys.modules.get(f"{__package__}._verl_skip")
    if base is None or ours is None:
        return False
    return all(base.SKIP_REGISTRY.get(role) is cls for role, cls in ours.CLASSES.items())


def _warn_if_initialized() -> None:
    """Warn when verl's SkipManager already built role objects that are not ours."""
    module = sys.modules.get("verl.utils.skip.skip_manager")
    instances = getattr(getattr(module, "SkipManager", None), "skip_instances", None) or {}
    from . import _verl_skip

    stale = sorted(
        role for role, obj in instances.items()
        if role in _verl_skip.CLASSES and getattr(obj, "enable", False) and not isinstance(obj, _verl_skip.ZarrSkipBase)
    )
    if stale:
        logger.warning(
            "zarr_skip: verl's SkipManager was initialized before install(); enabled roles %s still use "
            "verl's own cache until SkipManager.init(config) runs again",
            ", ".join(stale),
        )
