"""Moving rollouts between legacy verl dump directories and a zarr_skip cache.

:func:`import_legacy` turns every verl experiment directory found by
:func:`zarr_skip.legacy.dumps.scan_legacy` into Zarr experiments and copies its complete steps bit
for bit; :func:`export_steps` writes steps back in verl's layout, so plain verl loads them.
Both ways a step looks as :class:`zarr_skip.trainer.manager.SkipManager` stores it: a
``gen_batch.dp`` mini-batch is the DataProto itself (role ``rollout``), a ``tq_batch.pt``
one the mapping ``{**tensordict fields, "tags", "keys"}`` with meta_info
``{"global_steps": g}`` (role ``rollout_tq``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from zarr_skip._deprecation import warn_renamed
from zarr_skip.errors import (
    AmbiguousExperimentError,
    ConfigError,
    IncompleteStepError,
    ReadOnlyCacheError,
    StepNotFoundError,
    StorageError,
    UnsupportedColumnError,
)
from zarr_skip.format import args
from zarr_skip.format import layout as _layout

if TYPE_CHECKING:
    from zarr.abc.store import Store

    from zarr_skip.cache import Cache
    from zarr_skip.lazy import StepView

__all__ = ["ExportReport", "ImportReport", "StepTransfer", "coerce_meta_info", "export_steps", "import_legacy"]

logger = logging.getLogger(__name__)

#: the Zarr role of each legacy kind (verl's skip roles)
ROLE_OF_KIND = {"dp": "rollout", "tq": "rollout_tq"}
#: how exported steps are laid out: one file per step (``flat``), one per mini-batch
#: (``nested``), or what verl writes for the step's kind (``auto``)
ExportLayout = Literal["auto", "flat", "nested"]
LAYOUTS: tuple[ExportLayout, ...] = get_args(ExportLayout)
IMPORTED, SKIPPED, FAILED, EXPORTED = "imported", "skipped", "failed", "exported"

Progress = Callable[[int, int], Any]


@dataclass(frozen=True, slots=True)
class StepTransfer:
    """What happened to one step.

    Attributes
    ----------
    experiment : the Zarr experiment (on import: the one it went or would go to).
    step : the step number.
    action : ``imported``, ``skipped``, ``failed`` or ``exported``.
    reason : why it was skipped or failed; on export, the kind and layout written.
    minibatches : mini-batches moved.
    rows : rows moved.
    path : the legacy step directory (the source on import, the destination on export).
    """

    experiment: str
    step: int
    action: str
    reason: str = ""
    minibatches: int = 0
    rows: int = 0
    path: str = ""


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What :func:`import_legacy` did: one entry per legacy step, plus warnings."""

    location: str
    experiments: tuple[str, ...]
    steps: tuple[StepTransfer, ...]
    warnings: tuple[str, ...] = ()

    def _with(self, action: str) -> list[StepTransfer]:
        return [s for s in self.steps if s.action == action]

    @property
    def imported(self) -> list[StepTransfer]:
        return self._with(IMPORTED)

    @property
    def skipped(self) -> list[StepTransfer]:
        return self._with(SKIPPED)

    @property
    def failed(self) -> list[StepTransfer]:
        return self._with(FAILED)

    @property
    def ok(self) -> bool:
        """True when no step failed (skipped ones do not count)."""
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "experiments": list(self.experiments),
            "ok": self.ok,
            "warnings": list(self.warnings),
            "steps": [asdict(s) for s in self.steps],
        }


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What :func:`export_steps` wrote."""

    dest: str
    experiment: str
    steps: tuple[StepTransfer, ...]

    def to_json(self) -> dict[str, Any]:
        return {"dest": self.dest, "experiment": self.experiment, "steps": [asdict(s) for s in self.steps]}


# --------------------------------------------------------------------------- import


def coerce_meta_info(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-able copy of ``meta_info`` (lossy: types are not kept).

    numpy scalars and arrays become Python numbers and lists, tuples and sets lists, bytes
    latin-1 text, other objects their ``repr``. For legacy DataProtos whose ``meta_info``
    holds such values (verl's timings are often ``numpy.float64``).
    """

    def default(value: Any) -> Any:
        if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays, tensors
            return value.tolist()
        if isinstance(value, (set, frozenset)):
            try:
                return sorted(value)
            except TypeError:
                return list(value)
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("latin-1")
        return repr(value)

    def keys(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): keys(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [keys(v) for v in value]
        return value

    coerced: dict[str, Any] = json.loads(json.dumps(keys(dict(meta)), default=default, allow_nan=True))
    return coerced


def _zarr_batch(kind: str, minibatch: Any, step: int, coerce: bool) -> tuple[Any, dict[str, Any]]:
    """The batch and meta_info :meth:`Cache.write` gets for one legacy mini-batch."""
    if kind == "tq":
        from zarr_skip.trainer.manager import fields_to_mapping

        payload = minibatch
        mapping = {
            **fields_to_mapping(payload["tensordict"]),
            "tags": list(payload["tags"]),
            "keys": [str(k) for k in payload["keys"]],
        }
        return mapping, {"global_steps": int(payload.get("global_steps", step))}
    meta = dict(minibatch.meta_info or {})
    return minibatch, coerce_meta_info(meta) if coerce else meta


def _location_of(location_or_cache: Any) -> Any:
    from zarr_skip.cache import Cache

    if not isinstance(location_or_cache, Cache):
        return location_or_cache
    store = location_or_cache.storage.store
    if store.read_only and hasattr(store, "with_read_only"):
        store = store.with_read_only(False)
    return store


def import_legacy(
    dump_dir: str | os.PathLike[str],
    location_or_cache: str | os.PathLike[str] | Store | Cache,
    *,
    allow_pickle: bool = False,
    role: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    experiment_name: str | None = None,
    project_name: str | None = None,
    expected_minibatches: int | None = None,
    coerce_meta: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    trust_pickle: bool | None = None,
) -> ImportReport:
    """Import every complete step of the legacy verl caches under ``dump_dir``.

    Each ``{exp}_{proj}/GBS.._N.._in.._out..`` directory becomes the experiment of
    fingerprint ``{**legacy.fingerprint(), "role": role}``: ``rollout`` for ``gen_batch.dp``
    steps, ``rollout_tq`` for ``tq_batch.pt`` steps. Every mini-batch is stored exactly
    as read. A legacy step is read whole before anything of it is written.

    Parameters
    ----------
    dump_dir : verl's ``skip.*.dump_dir``, or an experiment or ``GBS..`` directory in it.
    location_or_cache : the cache: a location :func:`zarr_skip.open_cache` accepts, or an
        open :class:`~zarr_skip.Cache` (its store is used; any experiment).
    allow_pickle : let the legacy files' pickles run code (only for files you trust; else
        they may hold data types alone), and store columns the codec cannot store exactly as
        pickles (to be read with ``load(step, allow_pickle=True)``). ``trust_pickle`` is its
        deprecated name.
    role : the role of every imported experiment, instead of the per-kind default.
    overwrite : replace steps the cache already holds complete (or being written).
    progress : called with ``(steps done, steps to import)`` after each step.
    experiment_name, project_name : how to split ``{exp}_{proj}`` directory names (verl
        joins them with ``_``); the split is part of the fingerprint the SkipManager checks.
    expected_minibatches : verl's ``parameter_sync_step``: nested legacy steps with another
        count of mini-batches are skipped as incomplete. Without it, the count is inferred per
        experiment (the most common one among its other steps): steps with fewer are skipped,
        and the report warns where it cannot be inferred.
    coerce_meta : store a JSON-able copy of DataProto ``meta_info`` that is not JSON-able
        (see :func:`coerce_meta_info`) instead of failing the step.
    storage_options : for URL locations.

    Raises
    ------
    ConfigError
        ``dump_dir`` is not a directory.
    """
    from zarr_skip.legacy.dumps import scan_legacy

    allow_pickle, overwrite, coerce_meta = _import_flags(allow_pickle, overwrite, coerce_meta, trust_pickle)
    progress = args.maybe_callable(progress, "progress")
    root = Path(args.path(dump_dir, "dump_dir")).expanduser()
    if not root.is_dir():
        raise ConfigError(f"dump_dir: {root} is not a directory")
    location = _location_of(location_or_cache)
    exps = scan_legacy(
        root, experiment_name=experiment_name, project_name=project_name, expected_minibatches=expected_minibatches
    )
    plan, warnings = _import_plan(exps, root, role, named=bool(experiment_name or project_name))
    caches, results = _import_steps(
        plan,
        location,
        storage_options,
        progress,
        allow_pickle=allow_pickle,
        overwrite=overwrite,
        coerce=coerce_meta,
    )
    for r in results:
        level = logging.WARNING if r.action == FAILED else logging.INFO
        logger.log(
            level, "import step %d -> %s: %s%s", r.step, r.experiment, r.action, f" ({r.reason})" if r.reason else ""
        )
    loc = caches[next(iter(caches))].location if caches else str(location)
    return ImportReport(loc, tuple(caches), tuple(results), tuple(warnings))


def _import_flags(allow_pickle: Any, overwrite: Any, coerce_meta: Any, trust_pickle: Any) -> tuple[bool, bool, bool]:
    """:func:`import_legacy`'s flags, each True or False (ConfigTypeError naming another),
    ``trust_pickle`` (deprecated) taken as ``allow_pickle``."""
    allow = args.flag(allow_pickle, "allow_pickle")
    if trust_pickle is not None:
        warn_renamed("import_legacy(trust_pickle=...)", "import_legacy(allow_pickle=...)")
        allow = allow or args.flag(trust_pickle, "trust_pickle")
    return allow, args.flag(overwrite, "overwrite"), args.flag(coerce_meta, "coerce_meta")


def _import_steps(
    plan: Sequence[tuple[Any, Any, str, dict[str, Any]]],
    location: Any,
    storage_options: Mapping[str, Any] | None,
    progress: Progress | None,
    **options: bool,
) -> tuple[dict[str, Cache], list[StepTransfer]]:
    """Import the steps of ``plan`` (see :func:`_import_step` for ``options``): the caches
    opened, one per experiment, and what became of each step."""
    from zarr_skip import open_cache

    total = sum(1 for _, step, _, _ in plan if step.complete)
    caches: dict[str, Cache] = {}
    states: dict[str, dict[int, Any]] = {}
    results: list[StepTransfer] = []
    done = 0
    for _exp, step, name, fp in plan:
        if not step.complete:
            why = f"legacy step incomplete: {step.reason}"
            results.append(StepTransfer(name, step.step, SKIPPED, why, path=str(step.path)))
            continue
        if name not in caches:
            caches[name] = open_cache(location, fp, storage_options=storage_options)
            states[name] = {i.step: i for i in caches[name].status()}
        results.append(_import_step(caches[name], name, step, states[name].get(step.step), **options))
        done += 1
        if progress is not None:
            progress(done, total)
    return caches, results


def _import_plan(
    exps: Sequence[Any], root: Path, role: str | None, *, named: bool
) -> tuple[list[tuple[Any, Any, str, dict[str, Any]]], list[str]]:
    """(legacy experiment, legacy step, experiment name, fingerprint) of every legacy step in
    ``exps``, and the warnings of the scan (``named``: the experiment or project name was given)."""
    warnings: list[str] = []
    if not exps:
        warnings.append(f"no legacy verl cache (a {{exp}}_{{proj}}/GBS.._N.._in.._out.. directory) under {root}")
    plan: list[tuple[Any, Any, str, dict[str, Any]]] = []
    for exp in exps:
        if exp.minibatch_warning:
            warnings.append(exp.minibatch_warning)
        if exp.name_split == "guess" and not named:
            warnings.append(
                f"{exp.path}: split {exp.combined_name!r} as experiment {exp.experiment_name!r}, project "
                f"{exp.project_name!r} (a guess; verl's names are part of the fingerprint: give the "
                "experiment or project name, --experiment-name/--project-name, if verl's differ)"
            )
        for step in exp.steps:
            step_role = role or ROLE_OF_KIND.get(step.kind or "", "rollout")
            fp = {**exp.fingerprint(), "role": step_role}
            plan.append((exp, step, _layout.experiment_name(fp), fp))
    return plan, warnings


def _import_step(
    cache: Cache,
    name: str,
    step: Any,
    info: Any,
    *,
    overwrite: bool,
    allow_pickle: bool,
    coerce: bool,
) -> StepTransfer:
    from zarr_skip.legacy.dumps import read_step

    where = str(step.path)
    if info is not None and info.state != "abandoned" and not overwrite:
        why = "already complete in the cache" if info.complete else f"being written by run {info.run}"
        return StepTransfer(name, step.step, SKIPPED, f"{why} (overwrite to replace it)", path=where)
    try:
        minibatches = read_step(step, allow_pickle)
    except Exception as exc:  # noqa: BLE001 - a damaged or refused file fails this step only
        return StepTransfer(name, step.step, FAILED, f"{type(exc).__name__}: {exc}", path=where)
    written = rows = 0
    try:
        for i, mb in enumerate(minibatches):
            batch, meta = _zarr_batch(step.kind, mb, step.step, coerce)
            part = cache.write(
                step.step,
                batch,
                expected=len(minibatches),
                meta_info=meta,
                overwrite=overwrite and i == 0,
                allow_pickle=allow_pickle,
            )
            written, rows = written + 1, rows + part.rows
    except (ReadOnlyCacheError, StorageError):
        raise  # the cache refuses every write: stop, not one failure per step
    except Exception as exc:  # noqa: BLE001 - reported; the half-written step is removed
        if written:
            cache.delete(step.step)
        return StepTransfer(name, step.step, FAILED, f"{type(exc).__name__}: {exc}{_hint(exc)}", path=where)
    return StepTransfer(name, step.step, IMPORTED, "", written, rows, where)


def _hint(exc: Exception) -> str:
    """Which import option stores what ``exc`` refused: the step's meta_info (its error starts
    with ``meta_info:``) or a column of objects (a column may be named ``meta_info_x``)."""
    if not isinstance(exc, UnsupportedColumnError):
        return ""
    if str(exc).startswith("meta_info:"):
        return " (coerce_meta stores a JSON-able copy)"
    return " (allow_pickle stores it)"


# --------------------------------------------------------------------------- export


def _kind_of(view: StepView, role: str | None) -> str:
    """``tq`` for the rollout_tq role (or, without a verl role, a non-DataProto step with the
    TQ mapping's ``keys`` and ``tags`` columns), else ``dp``."""
    tq_columns = "keys" in view and "tags" in view
    if role in ("rollout", "async_rollout"):
        return "dp"
    if role == "rollout_tq":
        if not tq_columns:
            raise ConfigError(f"step {view.step}: a rollout_tq step needs 'keys' and 'tags' columns")
        return "tq"
    return "tq" if tq_columns and view.batch_type != "dataproto" else "dp"


def _dataproto_of(view: StepView) -> Any:
    """``view.to_dataproto()``; a DataProtoLike when a ``verl`` package exists but will not import."""
    try:
        return view.to_dataproto()
    except ImportError as exc:
        logger.warning("verl.protocol does not import (%s); exporting step %d from a DataProtoLike", exc, view.step)
    from zarr_skip.format.specs import DataProtoLike

    values, schema = view.to_dict(), view.schema
    batch = {n: v for n, v in values.items() if (schema[n].section or schema[n].container) in ("batch", "torch")}
    return DataProtoLike(batch or None, {n: v for n, v in values.items() if n not in batch}, view.meta_info)


def _tq_payload(view: StepView, step: int) -> dict[str, Any]:
    from zarr_skip.trainer.manager import build_fields

    columns = view.to_dict()
    keys = [str(k) for k in columns.pop("keys")]
    tags = [dict(t) for t in columns.pop("tags")]
    return {
        "tensordict": build_fields(columns, len(keys)),
        "tags": tags,
        "keys": keys,
        "global_steps": int(view.meta_info.get("global_steps", step)),
    }


def export_steps(
    cache: Cache,
    steps: Sequence[int],
    dest: str | os.PathLike[str],
    *,
    layout: ExportLayout = "auto",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ExportReport:
    """Write complete steps of ``cache``'s experiment in verl's layout under ``dest``.

    Steps go to ``dest/{exp}_{proj}/GBS{gbs}_N{n}_in{p}_out{r}/{step}/``, named from the
    experiment's fingerprint. ``rollout`` steps (and any step written from a DataProto)
    become ``gen_batch.dp`` (:func:`zarr_skip.legacy.dumps.write_legacy_dp`), steps stored as the
    ``rollout_tq`` mapping ``tq_batch.pt`` (:func:`zarr_skip.legacy.dumps.write_legacy_tq`).

    Parameters
    ----------
    cache : an open cache bound to one experiment.
    steps : complete steps to export; all are checked before anything is written.
    dest : verl's ``dump_dir``.
    layout : ``flat`` (``{step}/file``: one file per step, mini-batches merged), ``nested``
        (``{step}/{i}/file``: one per mini-batch), or ``auto`` (default): what verl writes,
        flat for ``gen_batch.dp`` and nested for ``tq_batch.pt``.
    overwrite : replace step directories that exist (else ``FileExistsError``).
    progress : called with ``(steps done, steps to export)`` after each step.

    Raises
    ------
    StepNotFoundError, IncompleteStepError
        A step is missing or not complete.
    ConfigError
        The experiment's fingerprint lacks verl's keys, ``layout`` is unknown, or ``dest`` is
        inside the cache's own tree (nothing is written).
    FileExistsError
        A step directory exists and ``overwrite`` is false.
    """
    from zarr_skip.legacy.dumps import legacy_experiment_dir
    from zarr_skip.views.export import check_outside

    overwrite, progress = args.flag(overwrite, "overwrite"), args.maybe_callable(progress, "progress")
    check_outside(cache, dest)
    fp, wanted = _checked_export(cache, steps, layout)
    exp_dir = legacy_experiment_dir(dest, **{k: fp[k] for k in _layout.VERL_KEYS})
    taken = [s for s in wanted if (exp_dir / str(s)).exists()]
    if taken and not overwrite:
        raise FileExistsError(
            f"{exp_dir}: step directories {taken} exist; pass overwrite=True (on the CLI --overwrite) to replace them"
        )
    results = []
    for n, s in enumerate(wanted, 1):
        results.append(_export_step(cache.load(s), exp_dir / str(s), layout, fp.get("role"), cache.experiment))
        if progress is not None:
            progress(n, len(wanted))
    assert cache.experiment is not None  # _checked_export checked it
    return ExportReport(str(Path(dest).expanduser()), cache.experiment, tuple(results))


def _checked_export(cache: Cache, steps: Sequence[int], layout: str) -> tuple[dict[str, Any], list[int]]:
    """The experiment's fingerprint and the steps to export, once all are known complete."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    if cache.experiment is None or cache.fingerprint is None:
        raise AmbiguousExperimentError(f"{cache.location}: open one experiment to export its steps")
    fp = cache.fingerprint
    missing_keys = [k for k in _layout.VERL_KEYS if k not in fp]
    if missing_keys:
        raise ConfigError(
            f"experiment {cache.experiment!r}: its fingerprint lacks verl's {', '.join(missing_keys)}, "
            "so it has no verl directory name"
        )
    wanted = list(dict.fromkeys(int(s) for s in steps))
    if not wanted:
        raise StepNotFoundError(f"experiment {cache.experiment!r}: no steps given to export")
    complete = set(cache.steps())
    for s in wanted:
        if s not in complete:
            info = cache.info(s)  # StepNotFoundError when absent
            raise IncompleteStepError(
                f"step {s} is {info.state} ({info.done}/{info.expected} mini-batches): not exported"
            )
    return fp, wanted


def _export_step(view: StepView, step_dir: Path, layout: str, role: str | None, experiment: str | None) -> StepTransfer:
    """Write one step in verl's layout at ``step_dir`` (replacing what is there)."""
    from zarr_skip.legacy.dumps import write_legacy_dp, write_legacy_tq

    kind = _kind_of(view, role)
    lay = layout if layout != "auto" else ("flat" if kind == "dp" else "nested")
    if step_dir.exists():
        shutil.rmtree(step_dir)
    parts = [view] if lay == "flat" else view.minibatches
    for i, part in enumerate(parts):
        index = None if lay == "flat" else i
        if kind == "dp":
            write_legacy_dp(step_dir, _dataproto_of(part), minibatch=index)
        else:
            write_legacy_tq(step_dir, _tq_payload(part, view.step), minibatch=index)
    file = "gen_batch.dp" if kind == "dp" else "tq_batch.pt"
    logger.info("exported step %d to %s (%s %s, %d file(s))", view.step, step_dir, lay, file, len(parts))
    return StepTransfer(experiment or "", view.step, EXPORTED, f"{lay} {file}", len(parts), len(view), str(step_dir))
