"""Parse verl's ``skip.*`` configuration into small frozen values.

The keys follow verl's ``SkipManagerConfig`` (``skip.rollout``, ``skip.rollout_tq``,
``skip.async_rollout``, each with ``enable``, ``dump_dir``, ``steps`` and ``action``)
plus three optional zarr_skip extras per role:

``compression``
    Codec name handed to :func:`zarr_skip.open_cache` (``None``: the core's default).
``on_group_mismatch``
    ``"cycle"`` (default, verl's behaviour) or ``"error"``: what the ``rollout_tq``
    replay does when the cached step holds a different number of prompt groups
    than the current batch has prompts.
``run_id``
    Optional run identifier handed to :func:`zarr_skip.open_cache`.

The configuration may be an OmegaConf ``DictConfig`` or nested plain mappings;
omegaconf itself is not imported.  Values that are absent, ``None`` or OmegaConf's
mandatory-missing ``???`` take their defaults.  Invalid values raise
:class:`ConfigError`, whose message names the full dotted key.
"""

from __future__ import annotations

import bisect
import logging
import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zarr_skip.errors import ConfigError
from zarr_skip.format import args, layout

logger = logging.getLogger(__name__)

__all__ = [
    "ACTIONS",
    "DEFAULT_DUMP_DIR",
    "MISMATCH_POLICIES",
    "ROLES",
    "ConfigError",
    "RoleConfig",
    "SkipConfig",
    "fingerprint",
    "parameter_sync_step",
    "parse_skip_config",
]

ROLES: tuple[str, ...] = ("rollout", "rollout_tq", "async_rollout")
ACTIONS: tuple[str, ...] = ("cache", "repeat")
MISMATCH_POLICIES: tuple[str, ...] = ("cycle", "error")
DEFAULT_DUMP_DIR = "~/.verl/rollout_dump"

_ROLE_KEYS = frozenset({"enable", "dump_dir", "steps", "action", "compression", "on_group_mismatch", "run_id"})
_ABSENT = object()


def _is_url(location: str) -> bool:
    return args.url_scheme(location) is not None


def _normalize_dump_dir(value: str) -> str:
    """Expand ``~`` and make local paths absolute; URLs are returned unchanged."""
    if _is_url(value):
        return value
    return os.path.abspath(os.path.expanduser(value))


@dataclass(frozen=True, slots=True)
class RoleConfig:
    """Settings of one skip role (``skip.<role>``).

    Attributes
    ----------
    role : str
        ``"rollout"``, ``"rollout_tq"`` or ``"async_rollout"``.
    enable : bool
        Master switch of the role.
    dump_dir : str
        Cache location: an absolute local path (``~`` expanded) or a URL.
    steps : tuple of int
        Sorted, de-duplicated steps on which the role is eligible.
    action : str
        ``"cache"`` or ``"repeat"``.
    compression : str or None
        Codec name for :func:`zarr_skip.open_cache`; ``None`` keeps the core default.
    on_group_mismatch : str
        ``"cycle"`` or ``"error"``.
    run_id : str or None
        Optional run identifier for :func:`zarr_skip.open_cache`.
    """

    role: str
    enable: bool = False
    dump_dir: str = DEFAULT_DUMP_DIR
    steps: tuple[int, ...] = ()
    action: str = "cache"
    compression: str | None = None
    on_group_mismatch: str = "cycle"
    run_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role:
            raise ConfigError(f"role: expected a non-empty string, got {self.role!r}")
        prefix = f"skip.{self.role}"
        _check_bool(self.enable, f"{prefix}.enable")
        dump_dir = _normalize_dump_dir(_check_str(self.dump_dir, f"{prefix}.dump_dir", allow_path=True))
        object.__setattr__(self, "dump_dir", dump_dir)
        object.__setattr__(self, "steps", _check_steps(self.steps, f"{prefix}.steps"))
        _check_choice(self.action, f"{prefix}.action", ACTIONS)
        if self.compression is not None:
            _check_str(self.compression, f"{prefix}.compression")
        _check_choice(self.on_group_mismatch, f"{prefix}.on_group_mismatch", MISMATCH_POLICIES)
        if self.run_id is not None:
            _check_str(self.run_id, f"{prefix}.run_id")
            try:  # now, not at the first listed step when open_cache would refuse it
                layout.check_run_id(self.run_id)
            except ConfigError as exc:
                raise ConfigError(f"{prefix}.{exc}") from None

    def is_listed(self, step: int) -> bool:
        """Return whether ``step`` is one of :attr:`steps`.

        Parameters
        ----------
        step : int
            Step to look up.

        Returns
        -------
        bool
            ``True`` if the role is eligible at ``step`` (regardless of :attr:`enable`).
        """
        i = bisect.bisect_left(self.steps, step)
        return i < len(self.steps) and self.steps[i] == step

    def is_active(self, step: int) -> bool:
        """Return whether the role is enabled and ``step`` is listed."""
        return self.enable and self.is_listed(step)


@dataclass(frozen=True, slots=True)
class SkipConfig:
    """All skip roles of one run.

    Attributes
    ----------
    rollout, rollout_tq, async_rollout : RoleConfig
        Per-role settings; absent roles are disabled defaults.
    """

    rollout: RoleConfig = field(default_factory=lambda: RoleConfig("rollout"))
    rollout_tq: RoleConfig = field(default_factory=lambda: RoleConfig("rollout_tq"))
    async_rollout: RoleConfig = field(default_factory=lambda: RoleConfig("async_rollout"))

    def __post_init__(self) -> None:
        for name in ROLES:
            value = getattr(self, name)
            if not isinstance(value, RoleConfig) or value.role != name:
                raise ConfigError(f"skip.{name}: expected RoleConfig(role={name!r}), got {value!r}")

    def role(self, name: str) -> RoleConfig:
        """Return the settings of role ``name``.

        Raises
        ------
        KeyError
            If ``name`` is not one of :data:`ROLES`.
        """
        if name not in ROLES:
            raise KeyError(f"unknown skip role {name!r}; expected one of {', '.join(ROLES)}")
        config: RoleConfig = getattr(self, name)  # each name in ROLES is a RoleConfig field
        return config

    @property
    def any_enabled(self) -> bool:
        """Whether at least one role is enabled."""
        return any(getattr(self, name).enable for name in ROLES)

    @classmethod
    def from_config(cls, config: Any) -> SkipConfig:
        """Alias of :func:`parse_skip_config`."""
        return parse_skip_config(config)


# ---------------------------------------------------------------------------
# generic access to DictConfig / mappings / attribute objects


def _child(node: Any, key: str) -> Any:
    """Return ``node[key]`` or ``_ABSENT``; OmegaConf ``???`` counts as absent."""
    if node is None or node is _ABSENT:
        return _ABSENT
    if isinstance(node, Mapping):
        # ``in`` is False for OmegaConf's mandatory-missing values.
        if key not in node:
            return _ABSENT
        value = node[key]
    else:
        value = getattr(node, key, _ABSENT)
    return _ABSENT if value is None else value


def _select(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        node = _child(node, part)
        if node is _ABSENT:
            return default
    return node


def _keys(node: Any) -> list[str]:
    if isinstance(node, Mapping):
        return [str(k) for k in node.keys()]
    return []


# ---------------------------------------------------------------------------
# value checks


def _check_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected a bool (true/false), got {value!r}")


def _check_str(value: Any, key: str, *, allow_path: bool = False) -> str:
    if allow_path and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        what = "a path or URL string" if allow_path else "a string"
        raise ConfigError(f"{key}: expected {what}, got {type(value).__name__} {value!r}")
    if not value.strip():
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _check_choice(value: Any, key: str, choices: tuple[str, ...]) -> str:
    if isinstance(value, str) and value in choices:
        return value
    expected = " or ".join(repr(c) for c in choices)
    raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def _check_int(value: Any, key: str, *, minimum: int | None = None) -> int:
    # bool is an int subclass but never a valid count or step; numpy integers are fine.
    try:
        if isinstance(value, bool):
            raise TypeError
        result = operator.index(value)
    except TypeError:
        raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}") from None
    if minimum is not None and result < minimum:
        raise ConfigError(f"{key}: expected an integer >= {minimum}, got {result}")
    return result


def _check_steps(value: Any, key: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{key}: expected a list of integers, got {type(value).__name__} {value!r}")
    steps = [_check_int(item, f"{key}[{i}]", minimum=0) for i, item in enumerate(value)]
    return tuple(sorted(set(steps)))


# ---------------------------------------------------------------------------
# public parsing


def _parse_role(node: Any, role: str) -> RoleConfig:
    prefix = f"skip.{role}"
    if node is _ABSENT:
        return RoleConfig(role)
    if not isinstance(node, Mapping) and not hasattr(node, "enable"):
        raise ConfigError(f"{prefix}: expected a mapping of settings, got {type(node).__name__} {node!r}")
    unknown = sorted(k for k in _keys(node) if k not in _ROLE_KEYS and not k.startswith("_"))
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}: unknown setting; expected one of {', '.join(sorted(_ROLE_KEYS))}")

    # RoleConfig.__post_init__ validates and normalizes every value.
    kwargs: dict[str, Any] = {"role": role}
    for name in sorted(_ROLE_KEYS):
        value = _child(node, name)
        if value is not _ABSENT:
            kwargs[name] = value
    return RoleConfig(**kwargs)


def parse_skip_config(config: Any) -> SkipConfig:
    """Parse the ``skip`` section of a full trainer configuration.

    Parameters
    ----------
    config : DictConfig or Mapping or None
        The whole run configuration (with a top-level ``skip`` key).  A missing
        ``skip`` section or role yields disabled defaults.  Keys starting with
        ``_`` (such as Hydra's ``_target_``) are ignored; unknown roles are
        ignored with a warning; unknown settings inside a role are errors.

    Returns
    -------
    SkipConfig
        Validated, immutable settings.

    Raises
    ------
    ConfigError
        If a value is invalid; the message names the full key, e.g.
        ``skip.rollout.action: expected 'cache' or 'repeat', got 'cach'``.
    """
    skip = _child(config, "skip")
    if skip is _ABSENT:
        return SkipConfig()
    if not isinstance(skip, Mapping) and not any(hasattr(skip, r) for r in ROLES):
        raise ConfigError(f"skip: expected a mapping of roles, got {type(skip).__name__} {skip!r}")
    for key in _keys(skip):
        if key not in ROLES and not key.startswith("_"):
            logger.warning("ignoring unknown skip role 'skip.%s' (known roles: %s)", key, ", ".join(ROLES))
    return SkipConfig(**{role: _parse_role(_child(skip, role), role) for role in ROLES})


def fingerprint(config: Any, role: str) -> dict[str, Any]:
    """Return the settings that identify cached rollouts of ``role``.

    Mirrors verl's dump-directory naming: ``trainer.experiment_name``,
    ``trainer.project_name``, ``data.gen_batch_size`` (else
    ``data.train_batch_size``), ``actor_rollout_ref.rollout.n``,
    ``data.max_prompt_length`` and ``data.max_response_length``, with verl's
    defaults, plus ``role`` so that every role has its own namespace.

    Parameters
    ----------
    config : DictConfig or Mapping
        The whole run configuration.
    role : str
        Skip role name.

    Returns
    -------
    dict
        JSON-able mapping with keys ``experiment_name``, ``project_name``,
        ``gen_batch_size``, ``n``, ``max_prompt_length``, ``max_response_length``
        and ``role``.

    Raises
    ------
    ConfigError
        If one of the numeric settings is not an integer.
    """
    if not isinstance(role, str) or not role:
        raise ConfigError(f"role: expected a non-empty string, got {role!r}")
    gbs_key = "data.gen_batch_size"
    gbs = _select(config, gbs_key)
    if gbs is None:
        gbs_key = "data.train_batch_size"
        gbs = _select(config, gbs_key, 0)
    return {
        "experiment_name": str(_select(config, "trainer.experiment_name", "default_experiment_name")),
        "project_name": str(_select(config, "trainer.project_name", "default_project_name")),
        "gen_batch_size": _check_int(gbs, gbs_key),
        "n": _check_int(_select(config, "actor_rollout_ref.rollout.n", 0), "actor_rollout_ref.rollout.n"),
        "max_prompt_length": _check_int(_select(config, "data.max_prompt_length", 0), "data.max_prompt_length"),
        "max_response_length": _check_int(_select(config, "data.max_response_length", 0), "data.max_response_length"),
        "role": role,
    }


#: where a trainer configuration names its tokenizer, first found wins (verl: the model's own
#: ``tokenizer_path``, then the legacy ``data.tokenizer``), and its model
TOKENIZER_KEYS = ("actor_rollout_ref.model.tokenizer_path", "data.tokenizer")
MODEL_KEYS = ("actor_rollout_ref.model.path",)


def tokenizer_paths(config: Any) -> dict[str, str]:
    """The tokenizer and model paths the trainer configuration names, for the cache to record.

    Returns ``{"tokenizer": ..., "model": ...}`` with the keys that are set (see
    :data:`TOKENIZER_KEYS`, :data:`MODEL_KEYS`). A local path (``~`` expanded, made absolute when
    it exists) is recorded so that a reader on the same machine finds it; anything else (a hub
    name) is recorded as written.
    """
    out: dict[str, str] = {}
    for name, keys in (("tokenizer", TOKENIZER_KEYS), ("model", MODEL_KEYS)):
        for key in keys:
            value = _select(config, key)
            if value is None or value == "":
                continue
            out[name] = _local_path(_check_str(value, key, allow_path=True))
            break
    return out


def _local_path(value: str) -> str:
    expanded = os.path.expanduser(value)
    return os.path.abspath(expanded) if os.path.exists(expanded) else expanded


def parameter_sync_step(config: Any) -> int:
    """Return how many ``sample`` calls make up one ``rollout_tq`` step.

    Reads ``trainer.v1.{trainer.v1.trainer_mode}.parameter_sync_step``; 1 when
    ``trainer.v1``, the mode or the setting is absent.

    Parameters
    ----------
    config : DictConfig or Mapping
        The whole run configuration.

    Returns
    -------
    int
        A positive integer.

    Raises
    ------
    ConfigError
        If the mode is not a string or the setting is not a positive integer.
    """
    mode = _select(config, "trainer.v1.trainer_mode")
    if mode is None:
        return 1
    if not isinstance(mode, str) or not mode:
        raise ConfigError(f"trainer.v1.trainer_mode: expected a string, got {mode!r}")
    key = f"trainer.v1.{mode}.parameter_sync_step"
    return _check_int(_select(config, key, 1), key, minimum=1)
