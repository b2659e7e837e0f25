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
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from zarr_skip.errors import CachedStepMissingError, VerlNotInstalledError
from zarr_skip.integrations._verl_options import ENV_PREFIX, Options, _explicit, _lock, options

logger = logging.getLogger(__name__)

#: the roles whose classes :func:`install` replaces
ROLES: tuple[str, ...] = ("rollout", "rollout_tq", "async_rollout")
#: the verl release this integration is tested against
TESTED_VERL = "0.9.1"
_originals: dict[str, Any] = {}  # role -> verl's class (or _ABSENT) replaced by install()
_ABSENT = object()

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
                f"zarr_skip.integrations.verl needs verl: pip install verl (tested with verl=={TESTED_VERL})"
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

    from zarr_skip.integrations import _verl_skip

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
    from zarr_skip.integrations import _verl_skip

    stale = sorted(
        role
        for role, obj in instances.items()
        if role in _verl_skip.CLASSES and getattr(obj, "enable", False) and not isinstance(obj, _verl_skip.ZarrSkipBase)
    )
    if stale:
        logger.warning(
            "zarr_skip: verl's SkipManager was initialized before install(); enabled roles %s still use "
            "verl's own cache until SkipManager.init(config) runs again",
            ", ".join(stale),
        )
