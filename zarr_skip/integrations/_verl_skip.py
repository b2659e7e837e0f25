"""Zarr-backed implementations of verl's skip roles; imported by ``install()`` (imports verl).

Each class follows the interface verl's ``SkipManager`` decorators call on its role object
(``verl.utils.skip.rollout_skip`` of verl 0.9.1) and hands verl back its own types:
``verl.protocol.DataProto`` for ``rollout`` / ``async_rollout``, and for ``rollout_tq`` a
TensorDict (jagged NestedTensors, ``NonTensorStack`` s) put into TransferQueue.

Storage goes through :func:`zarr_skip.open_cache` (one handle, so one run, per role object):
a step counts as cached only when complete, and a newer run takes over a step an older
run left unfinished. Caches written here and by :class:`zarr_skip.trainer.manager.SkipManager` are
the same (same fingerprint, same columns).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from verl.protocol import DataProto
from verl.utils.skip.base_skip import BaseSkip, SkipAction

from zarr_skip import Cache, open_cache
from zarr_skip.errors import (
    CachedStepMissingError,
    ConfigError,
    StepCompleteError,
    UnsupportedColumnError,
    VerlNotInstalledError,
)
from zarr_skip.integrations._verl_legacy import LegacySource
from zarr_skip.integrations._verl_meta import decode_meta, encode_meta
from zarr_skip.integrations._verl_options import options
from zarr_skip.trainer.manager import (
    discard_interrupted,
    fields_to_mapping,
    inject_step,
    record_attributes,
    write_retrying,
)
from zarr_skip.trainer.remap import parse_sample_step
from zarr_skip.trainer.skipconfig import RoleConfig, fingerprint, parameter_sync_step, tokenizer_paths

logger = logging.getLogger(__name__)

__all__ = ["CLASSES", "ZarrAsyncRolloutSkip", "ZarrRolloutSkip", "ZarrRolloutTqSkip", "ZarrSkipBase"]

_PICKLE_HINT = "set ZARR_SKIP_ALLOW_PICKLE=1 or install(allow_pickle=True) to pickle such columns"


class ZarrSkipBase(BaseSkip):  # verl is untyped: pyproject lets this module subclass its Any
    """Shared state of a role: settings, fingerprint, the lazily opened cache, legacy fallback.

    Parameters
    ----------
    local_config : verl's ``RolloutSkipConfig`` (or another role's config)
        ``enable``, ``dump_dir`` (path or URL), ``steps``, ``action``.
    global_config : DictConfig
        The whole trainer configuration (fingerprint, ``parameter_sync_step``).
    """

    support_actions = [SkipAction.CACHE, SkipAction.REPEAT]  # noqa: RUF012 - verl reads it as is
    role: ClassVar[str] = ""
    legacy_kind: ClassVar[str] = "dp"

    def __init__(self, local_config: Any, global_config: Any) -> None:
        super().__init__(local_config, global_config)
        self.options = options()
        cfg = RoleConfig(
            self.role,
            enable=bool(self.enable),
            dump_dir=self.dump_dir,
            steps=tuple(self.steps),
            action=self.action.value,
        )
        self.location = cfg.dump_dir  # absolute path or URL
        try:
            self.fingerprint = fingerprint(global_config, self.role)
            self.expected = self._expected(global_config)
            self.attributes = tokenizer_paths(global_config)  # recorded for readers of the cache
        except ConfigError:
            if self.enable:
                raise
            logger.debug("skip.%s is disabled; ignoring its unusable settings", self.role, exc_info=True)
            self.fingerprint, self.expected, self.attributes = {}, 1, {}
        fp = self.fingerprint
        # the attributes verl's own role objects expose
        self.exp_name, self.project_name = fp.get("experiment_name"), fp.get("project_name")
        self.n, self.gbs = fp.get("n", 0), fp.get("gen_batch_size", 0)
        self.prompt_length = fp.get("max_prompt_length", 0)
        self.response_length = fp.get("max_response_length", 0)
        self._lock = threading.RLock()
        self._cache: Cache | None = None
        self._missed: set[int] = set()  # steps this process found not cached (resolve_step)
        self._legacy: LegacySource | None = None
        if self.enable and self.options.import_legacy:
            self._legacy = LegacySource(self.location, fp, self.legacy_kind, self.expected)

    def _expected(self, global_config: Any) -> int:
        """Mini-batches per step."""
        return 1

    def cache(self) -> Cache:
        """The role's :class:`zarr_skip.Cache`, opened on first use."""
        with self._lock:
            if self._cache is None:
                kwargs: dict[str, Any] = {
                    "run_id": self.options.run_id,
                    "storage_options": self.options.storage_options,
                }
                if self.options.compression is not None:
                    kwargs["compression"] = self.options.compression
                self._cache = record_attributes(open_cache(self.location, self.fingerprint, **kwargs), self.attributes)
                logger.info(
                    "skip.%s: Zarr cache %s (experiment %s, run %s)",
                    self.role,
                    self.location,
                    self._cache.experiment,
                    self._cache.run_id,
                )
            return self._cache

    def resolve_step(self, step: int) -> int | None:
        """The complete step to load for ``step`` under the action, or None (a miss). At the
        first miss of a step in this process, what an earlier process of the same run (a fixed
        ``run_id``, restarted) left of it is discarded: the step is generated anew, and its
        writes would otherwise join or be blocked by those leftovers
        (:func:`~zarr_skip.trainer.manager.discard_interrupted`)."""
        with self._lock:
            cache = self.cache()
            source = cache.resolve(step, action=self.action.value)
            if self._legacy is not None and source != step:
                source = self._legacy.resolve(cache, step, self.action.value, source, self._store_legacy)
            if source is None and step not in self._missed:
                self._missed.add(step)
                discard_interrupted(cache, step, f"skip.{self.role}")
            return source

    def _store_legacy(self, step: int, minibatch: Any, expected: int) -> None:
        raise NotImplementedError

    def _write(self, step: int, batch: Any, meta_info: dict[str, Any]) -> None:
        """Store one mini-batch; failures are logged, never raised (training goes on)."""
        try:
            with self._lock:
                info = write_retrying(
                    self.cache(),
                    step,
                    batch,
                    expected=self.expected,
                    meta_info=meta_info,
                    allow_pickle=self.options.allow_pickle,
                    token=True,  # derived from the batch: a retry finds what an ambiguous failure stored
                )
        except StepCompleteError as exc:  # complete, or every index claimed by other writers of the run
            logger.info("skip.%s: step %d not stored: %s", self.role, step, exc)
        except UnsupportedColumnError as exc:
            logger.error("skip.%s: step %d not cached: %s (%s)", self.role, step, exc, _PICKLE_HINT)
        except Exception:
            logger.exception("skip.%s: could not store step %d; training goes on without caching it", self.role, step)
        else:
            logger.info(
                "skip.%s: stored mini-batch %d/%d of step %d (%d rows) in %s",
                self.role,
                info.index + 1,
                self.expected,
                step,
                info.rows,
                self.location,
            )


class ZarrRolloutSkip(ZarrSkipBase):
    """``skip.rollout``: the whole ``generate_sequences`` output of a trainer step, as one DataProto."""

    role = "rollout"

    def meet_precondition(self, step: int, func: Any = None, *args: Any, **kwargs: Any) -> bool:
        """Whether a cached result serves ``step`` (``cache``: that step; ``repeat``: any)."""
        source = self.resolve_step(step)
        if source is None:
            logger.info("skip.%s: step %d not cached in %s; generating and storing it", self.role, step, self.location)
        return source is not None

    def warp_function(self, step: int, func: Any = None, *args: Any, **kwargs: Any) -> DataProto:
        """The cached DataProto for ``step`` (the decorated function is not called).

        Raises
        ------
        CachedStepMissingError
            If no complete step serves ``step`` any more.
        """
        source = self.resolve_step(step)
        if source is None:
            raise CachedStepMissingError(  # verl's own wording first, so code matching it still matches
                f"{self.action.value} action expected dumped data for step {step}, but none was found under "
                f"{self.location} (zarr_skip, skip.{self.role}: no complete step in the Zarr cache serves it)"
            )
        with self._lock:
            view = self.cache().load(source, allow_pickle=self.options.allow_pickle)
            loaded = view.to_dataproto()
        result = (
            loaded
            if isinstance(loaded, DataProto)
            else DataProto(batch=loaded.batch, non_tensor_batch=loaded.non_tensor_batch, meta_info=loaded.meta_info)
        )
        result.meta_info = decode_meta(result.meta_info)
        logger.info(
            "skip.%s: step %d served from the Zarr cache (stored step %d, %d rows)", self.role, step, source, len(view)
        )
        return result

    def prepare_data(self, step: int, result: Any, *args: Any, **kwargs: Any) -> None:
        """Store the generated ``result`` as ``step`` (errors are logged, not raised)."""
        try:
            meta = encode_meta(getattr(result, "meta_info", None))
        except Exception as exc:  # noqa: BLE001 - any unstorable value: log, do not fail training
            logger.error("skip.%s: step %d not cached: its meta_info cannot be stored (%s)", self.role, step, exc)
            return
        self._write(step, result, meta)

    def _store_legacy(self, step: int, minibatch: Any, expected: int) -> None:
        with self._lock:
            self.cache().write(
                step,
                minibatch,
                expected=expected,
                meta_info=encode_meta(minibatch.meta_info),
                allow_pickle=self.options.allow_pickle,
            )


class ZarrAsyncRolloutSkip(ZarrRolloutSkip):
    """``skip.async_rollout``: one sample of the fully async rollouter per feed index."""

    role = "async_rollout"
    support_online_step = True

    def extract_step(self, *args: Any, **kwargs: Any) -> int:
        """The feed index in ``prompts.non_tensor_batch["uid"][0]`` (``[uid_]sample_<epoch>_<index>``)."""
        prompts = args[1] if len(args) > 1 else kwargs.get("prompts")
        if prompts is None:
            raise ValueError("async_rollout extract_step expects prompts as the second argument")
        uids = getattr(prompts, "non_tensor_batch", {}).get("uid")
        if uids is None or len(uids) == 0:
            raise ValueError("async_rollout extract_step expects uid in prompts.non_tensor_batch")
        return parse_sample_step(str(uids[0]))


class ZarrRolloutTqSkip(ZarrSkipBase):
    """``skip.rollout_tq``: the V1 TransferQueue trainer's trajectories, ``parameter_sync_step`` mini-batches a step."""

    role = "rollout_tq"
    legacy_kind = "tq"

    def _expected(self, global_config: Any) -> int:
        return parameter_sync_step(global_config)

    @property
    def parameter_sync_step(self) -> int:
        """``sample`` calls (mini-batches) that make up one step."""
        return self.expected

    def has_v1_cache(self, step: int) -> bool:
        """Whether a complete cached step serves ``step`` (phase two) or not (phase one)."""
        return self.resolve_step(step) is not None

    def meet_precondition(self, step: int, *args: Any, **kwargs: Any) -> bool:
        """Same as :meth:`has_v1_cache`."""
        return self.has_v1_cache(step)

    def should_save(self, step: int, partition_id: str = "train") -> bool:
        """Whether a sampled ``train`` batch is to be stored: no complete step serves ``step`` yet."""
        return partition_id == "train" and not self.has_v1_cache(step)

    def maybe_load_and_inject(self, step: int, new_prompt_uids: Sequence[str], partition_id: str = "train") -> bool:
        """Inject the cached step into TransferQueue under ``new_prompt_uids``; False on a miss."""
        if not self.meet_precondition(step):
            logger.info("skip.%s: step %d not cached in %s; generating and storing it", self.role, step, self.location)
            return False
        self.load_dump_data(
            step=step, new_prompt_uids=new_prompt_uids, n=int(self.n), global_steps=step, partition_id=partition_id
        )
        return True

    def prepare_data(  # type: ignore[override]  # verl's RolloutTqSkip.prepare_data signature
        self, step: int, batch: Any, global_steps: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        """Read a sampled ``KVBatchMeta`` 's fields from TransferQueue and store them as the step's next mini-batch."""
        keys = [str(k) for k in batch.keys]
        if not keys:
            logger.info("skip.%s: step %d: the sampled batch is empty; nothing to store", self.role, step)
            return
        data = _transfer_queue().kv_batch_get(keys=list(batch.keys), partition_id=batch.partition_id)
        payload = {**fields_to_mapping(data), "tags": list(batch.tags), "keys": keys}
        self._write(step, payload, {"global_steps": int(step if global_steps is None else global_steps)})

    def load_dump_data(
        self, step: int, new_prompt_uids: Sequence[str], n: int, global_steps: int, partition_id: str = "train"
    ) -> None:
        """Put the cached step into TransferQueue: ``n`` trajectories of one cached group per new prompt.

        Raises
        ------
        CachedStepMissingError
            If no complete step serves ``step``.
        RemapError
            If the cached step holds no trajectory groups (or, with ``on_group_mismatch=error``,
            not one per prompt).
        """
        source = self.resolve_step(step)
        if source is None:
            raise CachedStepMissingError(  # verl's own wording first, as for rollout
                f"No dump data found for step {step} under {self.location} "
                f"(zarr_skip, skip.{self.role}: no complete step in the Zarr cache serves it)"
            )
        with self._lock:
            view = self.cache().load(source, allow_pickle=self.options.allow_pickle)
            plan = inject_step(
                view,
                new_prompt_uids,
                n,
                global_steps,
                self.options.on_group_mismatch,
                _transfer_queue(),
                partition_id,
                f"skip.{self.role}",
            )
        logger.info(
            "skip.%s: injected %d cached trajectories of step %d (%d prompts x %d) into partition %r at step %d",
            self.role,
            len(plan.keys),
            source,
            len(plan.prompt_keys),
            n,
            partition_id,
            step,
        )

    def _store_legacy(self, step: int, minibatch: Any, expected: int) -> None:
        payload = {
            **fields_to_mapping(minibatch["tensordict"]),
            "tags": list(minibatch["tags"]),
            "keys": [str(k) for k in minibatch["keys"]],
        }
        with self._lock:
            self.cache().write(
                step,
                payload,
                expected=expected,
                meta_info={"global_steps": int(minibatch.get("global_steps", step))},
                allow_pickle=self.options.allow_pickle,
            )


def _transfer_queue() -> Any:
    try:
        import transfer_queue
    except ImportError as exc:
        raise VerlNotInstalledError(
            "skip.rollout_tq needs TransferQueue: pip install TransferQueue (verl's 'verl-core' extra)"
        ) from exc
    return transfer_queue


#: role -> class, as install() registers them
CLASSES: dict[str, type[ZarrSkipBase]] = {
    "rollout": ZarrRolloutSkip,
    "rollout_tq": ZarrRolloutTqSkip,
    "async_rollout": ZarrAsyncRolloutSkip,
}
