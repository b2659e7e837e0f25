"""The ``import_legacy`` fallback: serve a step from a legacy verl dump and store it into Zarr.

verl's own cache lives at ``{dump_dir}/{exp}_{proj}/GBS{gbs}_N{n}_in{p}_out{r}/{step}/``, the
directory whose ``{role}/`` subgroup holds the Zarr cache of the same settings. A step missing
from Zarr whose legacy dump is complete is read through :mod:`zarr_skip.legacy.dumps` (its
restricted unpickler: no code from the files runs), written into Zarr, and then loaded from Zarr
like any cached step. Only local ``dump_dir`` s have legacy dumps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from zarr_skip.errors import StepCompleteError, StepNotFoundError, UnsafePickleError
from zarr_skip.format import args
from zarr_skip.format.state import check_action, resolve
from zarr_skip.legacy.dumps import LegacyStep, legacy_experiment_dir, read_step, scan_legacy

logger = logging.getLogger(__name__)

__all__ = ["LegacySource"]

#: ``store(step, minibatch, expected)`` writes one legacy mini-batch into the Zarr cache
Store = Callable[[int, Any, int], None]


class LegacySource:
    """Legacy verl dumps of one role's settings under its ``dump_dir``.

    Parameters
    ----------
    location : str
        The role's ``dump_dir`` (absolute path, or a URL: then there are no legacy dumps).
    fingerprint : mapping
        :func:`zarr_skip.trainer.skipconfig.fingerprint` of the role.
    kind : {"dp", "tq"}
        ``gen_batch.dp`` dumps (``rollout``, ``async_rollout``) or ``tq_batch.pt`` ones.
    expected : int or None
        Mini-batches per nested ``tq`` step (``parameter_sync_step``).
    """

    def __init__(self, location: str, fingerprint: Mapping[str, Any], kind: str, expected: int | None = None):
        self.kind = kind
        self.expected = expected
        self.fingerprint = dict(fingerprint)
        self.failed: set[int] = set()  # legacy steps that did not import: not tried again
        self.directory: Path | None = None
        if args.url_scheme(location) is not None:
            logger.warning("import_legacy: %s is a URL; legacy verl dumps are read from local paths only", location)
            return
        fp = self.fingerprint
        self.directory = legacy_experiment_dir(
            location,
            experiment_name=fp["experiment_name"],
            project_name=fp["project_name"],
            gen_batch_size=fp["gen_batch_size"],
            n=fp["n"],
            max_prompt_length=fp["max_prompt_length"],
            max_response_length=fp["max_response_length"],
        )

    def steps(self) -> dict[int, LegacyStep]:
        """Complete legacy steps of this kind, by step."""
        if self.directory is None or not self.directory.is_dir():
            return {}
        found = scan_legacy(
            self.directory,
            experiment_name=self.fingerprint["experiment_name"],
            project_name=self.fingerprint["project_name"],
            expected_minibatches=self.expected,
        )
        return {s.step: s for exp in found for s in exp.steps if s.complete and s.kind == self.kind}

    def resolve(self, cache: Any, step: int, action: str, zarr_source: int | None, store: Store) -> int | None:
        """The step to load for ``step`` counting legacy steps as cached; imports it if needed.

        Parameters
        ----------
        cache : zarr_skip.Cache
            The role's cache (its complete steps take precedence).
        step : int
            The step asked for.
        action : {"cache", "repeat"}
            verl's action; both resolve over Zarr and legacy steps together.
        zarr_source : int or None
            What the Zarr cache alone resolved ``step`` to.
        store : callable
            Writes one legacy mini-batch into the cache.

        Returns
        -------
        int or None
            A step now complete in the Zarr cache, or ``zarr_source`` when no legacy step is
            better, importing it failed (it is not tried again), or this run is writing that
            step itself.
        """
        legacy = self.steps()
        if not legacy:
            return zarr_source
        zarr_steps = set(cache.steps()) if action == "repeat" else set()
        choice = resolve(step, check_action(action), zarr_steps | set(legacy))
        if choice is None or choice in zarr_steps or choice == zarr_source or choice in self.failed:
            return zarr_source
        if self._writing(cache, choice):
            return zarr_source
        if self._import(cache, legacy[choice], store):
            return choice
        self.failed.add(choice)
        return zarr_source

    @staticmethod
    def _writing(cache: Any, step: int) -> bool:
        """Whether this run is writing ``step`` itself (its fresh mini-batches must not mix with legacy ones)."""
        try:
            info = cache.info(step)
        except StepNotFoundError:
            return False
        return not info.complete and info.run == cache.run_id

    def _import(self, cache: Any, lstep: LegacyStep, store: Store) -> bool:
        try:
            minibatches = read_step(lstep, allow_pickle=False, as_verl=True)
        except UnsafePickleError as exc:
            logger.error("import_legacy: refusing legacy step %d at %s: %s", lstep.step, lstep.path, exc)
            return False
        except Exception:
            logger.exception("import_legacy: cannot read legacy step %d at %s", lstep.step, lstep.path)
            return False
        try:
            for mb in minibatches:
                store(lstep.step, mb, len(minibatches))
        except StepCompleteError:
            logger.info("import_legacy: step %d was completed by another writer meanwhile", lstep.step)
            return True
        except Exception:
            logger.exception("import_legacy: could not store legacy step %d from %s", lstep.step, lstep.path)
            self._discard_partial(cache, lstep.step)
            return False
        logger.info(
            "import_legacy: step %d imported from %s (%d mini-batch(es))", lstep.step, lstep.path, len(minibatches)
        )
        return True

    @staticmethod
    def _discard_partial(cache: Any, step: int) -> None:
        """Remove what a failed import of this run left, so fresh mini-batches never mix with legacy ones."""
        try:
            info = cache.info(step)
            if not info.complete and info.run == cache.run_id:
                cache.delete(step)
        except Exception as exc:  # noqa: BLE001 - best effort; the next writer takes the step over
            logger.warning("import_legacy: could not remove the partial step %d: %s", step, exc)
