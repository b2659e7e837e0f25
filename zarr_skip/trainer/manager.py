"""SkipManager: verl's rollout skip (``skip.rollout``, ``skip.rollout_tq``, ``skip.async_rollout``) on zarr_skip.

Wired as in verl: ``SkipManager.init(config)``, ``SkipManager.set_step(step)``,
``@SkipManager.annotate(role=...)`` on ``generate_sequences`` and ``@SkipManager.annotate_tq(...)``
on the V1 trainer's ``_add_batch_to_generate`` / ``ReplayBuffer.sample``. A disabled role or an
unlisted step leaves the function untouched and does no I/O; a role's cache is opened at its first
listed step. verl is never imported.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from zarr_skip.errors import ConfigError, StepCompleteError, StepNotFoundError, StorageError
from zarr_skip.format.chunks import Compression
from zarr_skip.format.specs import is_tensordict, share_offsets
from zarr_skip.trainer.remap import Remap, RemapError, parse_sample_step, remap
from zarr_skip.trainer.skipconfig import (
    RoleConfig,
    SkipConfig,
    fingerprint,
    parameter_sync_step,
    parse_skip_config,
    tokenizer_paths,
)

logger = logging.getLogger(__name__)

__all__ = ["SkipManager", "write_retrying"]

#: times a write that failed in the store is tried again (with the same token: never stored twice)
WRITE_RETRIES = 2

F = TypeVar("F", bound=Callable[..., Any])
ROLLOUT_ROLES = ("rollout", "async_rollout")
TQ_ROLES = ("rollout_tq",)
PHASES = ("submit", "sample")
_MISS = object()


@dataclass(slots=True, eq=False)
class _Role:
    """Runtime state of one enabled role: settings, the lazily opened cache, per-step progress."""

    cfg: RoleConfig
    fingerprint: dict[str, Any]
    expected: int  # mini-batches per step: 1, or parameter_sync_step for rollout_tq
    lock: threading.RLock = field(default_factory=threading.RLock)
    missed: set[int] = field(default_factory=set)  # rollout_tq steps whose submit missed in this run
    stored: dict[int, int] = field(default_factory=dict)  # steps this process writes: mini-batches stored
    handle: Any = None
    #: what the experiment records for readers: the trainer's tokenizer and model paths
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.fingerprint["n"])

    def cache(self) -> Any:
        """The role's cache handle, opened on first use (one handle = one run)."""
        with self.lock:
            if self.handle is None:
                from zarr_skip import open_cache  # late: the package may import this module

                kwargs: dict[str, Any] = {"run_id": self.cfg.run_id}
                if self.cfg.compression is not None:
                    kwargs["compression"] = self.cfg.compression
                self.handle = record_attributes(
                    open_cache(self.cfg.dump_dir, self.fingerprint, **kwargs), self.attributes
                )
                logger.info("%s: opened rollout cache at %s", self.cfg.role, self.cfg.dump_dir)
            return self.handle


def write_retrying(cache: Any, step: int, batch: Any, *, token: str | bool, **kwargs: Any) -> Any:
    """``cache.write(step, batch, token=token, **kwargs)``, tried again up to
    :data:`WRITE_RETRIES` times when the store fails (a lost connection may have lost the reply
    of a write that landed: the token makes the retry return that mini-batch, not store a
    second one)."""
    for attempt in range(WRITE_RETRIES + 1):
        try:
            return cache.write(step, batch, token=token, **kwargs)
        except StorageError as exc:
            if attempt == WRITE_RETRIES:
                raise
            logger.warning("step %d: the store failed (%s); trying the write again with its token", step, exc)
    raise AssertionError("unreachable")  # pragma: no cover


def discard_interrupted(cache: Any, step: int, role: str) -> None:
    """Delete what an earlier process of this run (a fixed ``run_id``, restarted) left of the
    incomplete ``step``, before this process writes it: the writer would take those mini-batches
    (or a killed write's claim) for its own and mix them into, or block, the new step."""
    try:
        info = cache.info(step)
        if info.complete or info.run != cache.run_id:
            return  # another run's leftovers are discarded by the writer itself
        if info.state == "writing" and not _only_this_process(cache, step):
            logger.warning(
                "%s: step %d is being written by another live process of run %s; left to it", role, step, info.run
            )
            return
        logger.warning(
            "%s: step %d holds %d of %d mini-batch(es) that an earlier process of run %s left unfinished; "
            "discarding them, the step is generated anew",
            role,
            step,
            info.done,
            info.expected,
            info.run,
        )
        cache.delete(step)
    except StepNotFoundError:
        return
    except Exception:  # training goes on; storing the step may then fail and be logged
        logger.exception("%s: could not discard what an earlier process left of step %d", role, step)


def _only_this_process(cache: Any, step: int) -> bool:
    """Whether every record of this run in ``step`` was written by this very process (an
    earlier manager of it: re-made after a failure), so that no other live process writes it."""
    from zarr_skip.format.state import HOST
    from zarr_skip.store.catalog import scan_step

    scan = scan_step(cache.storage, cache.experiment, step)
    writers = [(r.host, r.pid) for r in scan.runs if r.run == cache.run_id]
    writers += [(p.host, p.pid) for p in scan.parts if p.run == cache.run_id]
    return all(w == (HOST, os.getpid()) for w in writers)


def record_attributes(cache: Any, attributes: Mapping[str, str]) -> Any:
    """Record ``attributes`` (the trainer's tokenizer and model paths, from
    :func:`~zarr_skip.trainer.skipconfig.tokenizer_paths`) in ``cache``'s experiment unless it
    holds them already, so that browsing decodes with the trainer's tokenizer; returns ``cache``."""
    if attributes and any(cache.attributes.get(k) != v for k, v in attributes.items()):
        cache.set_attributes(attributes)
    return cache


def _prompts_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The ``prompts`` argument of ``generate_sequences(self, prompts)`` (or of a plain function)."""
    if kwargs.get("prompts") is not None:
        return kwargs["prompts"]
    if len(args) > 1:
        return args[1]
    return args[0] if len(args) == 1 and hasattr(args[0], "meta_info") else None


def _is_validation(prompts: Any) -> bool:
    if prompts is None:
        return False
    for attr in ("meta_info", "non_tensor_data"):
        info = getattr(prompts, attr, None)
        if isinstance(info, Mapping) and info.get("validate", False):
            return True
    return False


def _async_step(prompts: Any) -> int:
    """The async_rollout step: the feed index in ``prompts.non_tensor_batch["uid"][0]``."""
    uids = getattr(prompts, "non_tensor_batch", None) or {}
    uids = uids.get("uid") if isinstance(uids, Mapping) else None
    if uids is None or len(uids) == 0:
        raise ValueError("async_rollout: expected prompts.non_tensor_batch['uid'] = ['sample_<epoch>_<index>', ...]")
    return parse_sample_step(str(uids[0]))


def inject_step(
    view: Any, uids: Sequence[str], n: int, step: int, policy: str, tq: Any, partition_id: str, where: str
) -> Remap:
    """Put a cached TQ step into TransferQueue under the new prompt ``uids``; return the plan.

    The trajectories are remapped onto the new uids (:func:`remap.remap`), the chosen rows
    (repeats allowed) are read straight from storage (each chunk once, jagged columns without
    unbinding), then trajectories and prompt-level "finished" keys are put.
    """
    if "keys" not in view or "tags" not in view:
        raise RemapError(f"{where}: cached step {view.step} lacks the 'keys'/'tags' columns of a TQ batch")
    old_keys = [str(k) for k in view["keys"][:]]
    old_tags = list(view["tags"][:])
    plan = remap(old_keys, old_tags, [str(u) for u in uids], n, step, policy, source_step=view.step)
    if plan.keys:
        idx = np.asarray(plan.indices, dtype=np.int64)
        rows = share_offsets({name: view[name][idx] for name in view.columns if name not in ("keys", "tags")})
        tq.kv_batch_put(
            keys=list(plan.keys), fields=build_fields(rows, len(idx)), tags=list(plan.tags), partition_id=partition_id
        )
    tq.kv_batch_put(keys=list(plan.prompt_keys), partition_id=partition_id, tags=list(plan.prompt_tags))
    return plan


def build_fields(columns: Mapping[str, Any], rows: int) -> Any:
    """A TensorDict of ``columns`` for ``kv_batch_put`` (a dict when tensordict is missing).

    Per-row Python objects (strings, dicts, per-row arrays) become ``NonTensorStack`` s, as
    TransferQueue hands them out.
    """
    try:
        from tensordict import NonTensorStack, TensorDict
    except ImportError:  # pragma: no cover - tensordict ships with verl and TransferQueue
        return dict(columns)
    items: dict[str, Any] = {}
    for name, value in columns.items():
        if isinstance(value, np.ndarray) and value.dtype == object or isinstance(value, (list, tuple)):
            value = NonTensorStack.from_list(list(value))
        items[name] = value
    return TensorDict(items, batch_size=[rows])


def fields_to_mapping(data: Any) -> dict[str, Any]:
    """The columns of a ``kv_batch_get`` result (TensorDict or mapping) as a dict."""
    if is_tensordict(data):
        return {name: data.get(name) for name in data.keys()}
    if isinstance(data, Mapping):
        return dict(data)
    raise TypeError(f"kv_batch_get returned {type(data).__qualname__}; expected a TensorDict or a mapping")


class SkipManager:
    """Process-wide skip state and the decorators that use it (verl's ``SkipManager`` API).

    State lives on the class: decorators applied at import time consult it at call time and
    pass through until :meth:`init` enables a role.
    """

    _config: SkipConfig = SkipConfig()
    _roles: dict[str, _Role] = {}  # noqa: RUF012 - replaced by init()/reset(), never mutated
    _step: int = -1
    _tq: Any = None
    _lock = threading.Lock()

    # -- state ------------------------------------------------------------------------------

    @classmethod
    def init(cls, config: Any, transfer_queue: Any = None) -> None:
        """Read ``config.skip`` and reset all state.

        Parameters
        ----------
        config : DictConfig or Mapping
            The whole trainer configuration (``skip``, ``trainer``, ``data``, ...).
        transfer_queue : object, optional
            Object with ``kv_batch_get`` / ``kv_batch_put`` used by ``rollout_tq``;
            ``import transfer_queue`` when omitted and first needed.

        Raises
        ------
        ConfigError
            If a setting is invalid (the message names the key).
        """
        skip = parse_skip_config(config)
        paths = tokenizer_paths(config)
        roles: dict[str, _Role] = {}
        for name in ROLLOUT_ROLES + TQ_ROLES:
            cfg = skip.role(name)
            if not cfg.enable:
                continue
            fp = fingerprint(config, name)
            if cfg.compression is not None:  # fail at init, not at the first listed step
                try:
                    Compression.parse(cfg.compression)
                except ConfigError as exc:
                    raise ConfigError(f"skip.{name}.compression: {str(exc).removeprefix('compression: ')}") from None
            expected = 1
            if name in TQ_ROLES:
                expected = parameter_sync_step(config)
                if fp["n"] < 1:
                    raise ConfigError(f"actor_rollout_ref.rollout.n: skip.{name} needs n >= 1, got {fp['n']}")
            roles[name] = _Role(cfg, fp, expected, attributes=dict(paths))
            logger.info("skip.%s: action=%s, %d step(s), cache %s", name, cfg.action, len(cfg.steps), cfg.dump_dir)
        with cls._lock:
            cls._config, cls._roles, cls._step, cls._tq = skip, roles, -1, transfer_queue

    @classmethod
    def reset(cls) -> None:
        """Forget the configuration: every decorator passes through again."""
        with cls._lock:
            cls._config, cls._roles, cls._step, cls._tq = SkipConfig(), {}, -1, None

    @classmethod
    def set_step(cls, step: int) -> None:
        """Set the trainer step used by ``rollout`` and ``rollout_tq``."""
        cls._step = int(step)

    @classmethod
    def config(cls) -> SkipConfig:
        """The parsed skip configuration (all roles disabled before :meth:`init`)."""
        return cls._config

    @classmethod
    def is_active(cls, role: str, step: int | None = None) -> bool:
        """Whether ``role`` is enabled and ``step`` (default: the current step) is listed."""
        rt = cls._roles.get(role)
        return rt is not None and rt.cfg.is_listed(cls._step if step is None else step)

    @classmethod
    def _transfer_queue(cls) -> Any:
        if cls._tq is None:
            try:
                import transfer_queue
            except ImportError as exc:
                raise ImportError(
                    "skip.rollout_tq needs TransferQueue: install transfer_queue or pass "
                    "SkipManager.init(config, transfer_queue=...)"
                ) from exc
            cls._tq = transfer_queue
        return cls._tq

    # -- rollout / async_rollout --------------------------------------------------------------

    @classmethod
    def _target(cls, role: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[_Role, int] | None:
        """The role state and step when this call takes part in skipping, else None."""
        rt = cls._roles.get(role)
        if rt is None:
            return None
        prompts = _prompts_of(args, kwargs)
        if _is_validation(prompts):
            return None
        step = _async_step(prompts) if role == "async_rollout" else cls._step
        return (rt, step) if rt.cfg.is_listed(step) else None

    @staticmethod
    def _lookup(rt: _Role, step: int) -> Any:
        """The cached result for ``step`` (``_MISS`` when there is none to use)."""
        with rt.lock:
            cache = rt.cache()
            source = cache.resolve(step, action=rt.cfg.action)
            if source is None:
                if step not in rt.stored:
                    discard_interrupted(cache, step, rt.cfg.role)
                    rt.stored[step] = 0
                logger.info("%s: step %d not cached; generating and storing it", rt.cfg.role, step)
                return _MISS
            result = cache.load(source).to_dataproto()
        logger.info("%s: step %d served from the cache (stored step %d)", rt.cfg.role, step, source)
        return result

    @staticmethod
    def _store(rt: _Role, step: int, result: Any) -> None:
        try:
            with rt.lock:
                write_retrying(rt.cache(), step, result, expected=1, token=f"{rt.cfg.role}/step-{step}")
        except StepCompleteError as exc:  # complete, or its index claimed by another writer of the run
            logger.info("%s: step %d not stored: %s", rt.cfg.role, step, exc)
        except Exception:  # a failed store must not cost the generated rollout
            logger.exception("%s: could not store step %d; training goes on without caching it", rt.cfg.role, step)
        else:
            logger.info("%s: stored step %d", rt.cfg.role, step)

    @classmethod
    def annotate(cls, role: str = "rollout", **_unused: Any) -> Callable[[F], F]:
        """Decorate a sync or async ``generate_sequences(self, prompts)``.

        On a listed step, a cache hit returns the stored result without calling the
        function; a miss calls it, stores its result and returns it.  Validation calls
        (``prompts.meta_info["validate"]``) always run the function and are never stored.

        Parameters
        ----------
        role : {"rollout", "async_rollout"}
            ``rollout`` uses the step from :meth:`set_step`; ``async_rollout`` parses it
            from ``prompts.non_tensor_batch["uid"][0]`` (``sample_<epoch>_<index>``).
        """
        if role not in ROLLOUT_ROLES:
            raise ValueError(f"annotate: role must be one of {', '.join(ROLLOUT_ROLES)}, got {role!r}")

        def decorator(func: F) -> F:
            if inspect.iscoroutinefunction(func):

                @functools.wraps(func)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    target = cls._target(role, args, kwargs)
                    if target is None:
                        return await func(*args, **kwargs)
                    rt, step = target
                    cached = await asyncio.to_thread(cls._lookup, rt, step)
                    if cached is not _MISS:
                        return cached
                    result = await func(*args, **kwargs)
                    await asyncio.to_thread(cls._store, rt, step, result)
                    return result

                return async_wrapper  # type: ignore[return-value]

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                target = cls._target(role, args, kwargs)
                if target is None:
                    return func(*args, **kwargs)
                rt, step = target
                cached = cls._lookup(rt, step)
                if cached is not _MISS:
                    return cached
                result = func(*args, **kwargs)
                cls._store(rt, step, result)
                return result

            return sync_wrapper  # type: ignore[return-value]

        return decorator

    # -- rollout_tq ---------------------------------------------------------------------------

    @classmethod
    def annotate_tq(cls, role: str = "rollout_tq", phase: str = "submit") -> Callable[[F], F]:
        """Decorate the V1 TransferQueue trainer's two rollout phases.

        ``phase="submit"`` wraps ``_add_batch_to_generate(self)``: on a listed step it calls
        ``self._next_train_batch()`` (keeping the dataloader aligned), then either injects the
        cached step under the new prompt uids, or calls ``self._submit_batch_to_rollout(batch)``.
        ``phase="sample"`` wraps ``ReplayBuffer.sample``: after a miss in this run's submit
        phase, each returned ``train`` batch is read from TransferQueue and stored as the
        step's next mini-batch, up to ``parameter_sync_step`` of them.
        """
        if role not in TQ_ROLES:
            raise ValueError(f"annotate_tq: role must be one of {', '.join(TQ_ROLES)}, got {role!r}")
        if phase not in PHASES:
            raise ValueError(f"annotate_tq: phase must be 'submit' or 'sample', got {phase!r}")

        def decorator(func: F) -> F:
            @functools.wraps(func)
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                rt = cls._roles.get(role)
                step = cls._step
                if rt is None or not rt.cfg.is_listed(step):
                    return func(self, *args, **kwargs)
                if phase == "submit":
                    cls._submit(rt, step, self)
                    return None
                result = func(self, *args, **kwargs)
                cls._after_sample(rt, step, result)
                return result

            return wrapper  # type: ignore[return-value]

        return decorator

    @classmethod
    def _submit(cls, rt: _Role, step: int, trainer: Any) -> None:
        batch = trainer._next_train_batch()
        uids = [str(u) for u in batch["uid"]]
        with rt.lock:
            source = rt.cache().resolve(step, action=rt.cfg.action)
            if source is None:
                rt.missed.add(step)
                if step not in rt.stored:
                    discard_interrupted(rt.cache(), step, rt.cfg.role)
                    rt.stored[step] = 0
        if source is None:
            logger.info("rollout_tq: step %d not cached; generating and storing it", step)
            trainer._submit_batch_to_rollout(batch)
            return
        cls._inject(rt, step, source, uids)

    @classmethod
    def _inject(cls, rt: _Role, step: int, source: int, uids: list[str]) -> None:
        """Put the cached step ``source`` into TransferQueue under the new prompt ``uids``."""
        with rt.lock:
            view = rt.cache().load(source)
            inject_step(view, uids, rt.n, step, rt.cfg.on_group_mismatch, cls._transfer_queue(), "train", "rollout_tq")
        logger.info(
            "rollout_tq: step %d served from the cache (stored step %d): %d prompts x %d trajectories",
            step,
            source,
            len(uids),
            rt.n,
        )

    @classmethod
    def _after_sample(cls, rt: _Role, step: int, result: Any) -> None:
        meta = result[0] if isinstance(result, tuple) else result
        if step not in rt.missed or getattr(meta, "partition_id", None) != "train":
            return
        with rt.lock:
            done = rt.stored.get(step, 0)
            if done >= rt.expected:
                logger.info(
                    "rollout_tq: step %d already has its %d mini-batch(es); this sample is not stored",
                    step,
                    rt.expected,
                )
                return
            keys = [str(k) for k in meta.keys]
            data = cls._transfer_queue().kv_batch_get(keys=keys, partition_id=meta.partition_id)
            payload = {**fields_to_mapping(data), "tags": list(meta.tags), "keys": keys}
            try:
                token = f"rollout_tq/step-{step}/mini-batch-{done}"
                write_retrying(
                    rt.cache(), step, payload, expected=rt.expected, meta_info={"global_steps": step}, token=token
                )
            except Exception:  # a failed store must not stop training; the step stays incomplete
                rt.missed.discard(step)
                logger.exception(
                    "rollout_tq: could not store mini-batch %d of step %d; the step is not cached", done, step
                )
                return
            rt.stored[step] = done + 1
        logger.info("rollout_tq: stored mini-batch %d/%d of step %d", done + 1, rt.expected, step)
