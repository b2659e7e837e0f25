"""Legacy verl rollout caches: find, read, and write them back (no zarr here).

Scanning and reading live here; writing lives in :mod:`zarr_skip.legacy.write`, whose
public names are re-exported.

verl's SkipManager (``verl.utils.skip.rollout_skip``) dumps rollouts under
``{dump_dir}/{experiment_name}_{project_name}/GBS{gbs}_N{n}_in{p}_out{r}/``::

    {step}/gen_batch.dp + meta.json      kind "dp", layout "flat"   (rollout, async_rollout)
    {step}/tq_batch.pt + meta.json       kind "tq", layout "flat"   (rollout_tq, older verl)
    {step}/{i}/tq_batch.pt + meta.json   kind "tq", layout "nested" (i < parameter_sync_step)

``gen_batch.dp`` pickles a ``verl.protocol.DataProto``; ``tq_batch.pt`` is
``torch.save({"tensordict", "tags", "keys", "global_steps"})``; ``meta.json`` is
``{"global_steps": s}`` (dp) or ``{"global_steps": s, "num_trajectories": k}`` (tq).
Reading runs no code from the files unless ``allow_pickle=True``
(:mod:`zarr_skip.legacy._unpickle`); written files load with verl's own code.

verl joins the two names with ``_``, so ``a_b_c`` is (``a``, ``b_c``) or (``a_b``, ``c``).
:func:`scan_legacy` keeps :attr:`LegacyExperiment.combined_name` and splits it by, in
order: the ``experiment_name``/``project_name`` hints (``name_split="hint"``), verl's
default names (``"default"``), a single ``_`` (``"unique"``), else the first ``_``
(``"guess"``); :attr:`LegacyExperiment.name_candidates` lists every split.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from zarr_skip._deprecation import warn_renamed
from zarr_skip.errors import IncompleteStepError, UnsafePickleError
from zarr_skip.legacy._unpickle import (
    DataProtoState,
    decode_dataproto_state,
    load_pickle,
    torch_load,
)
from zarr_skip.legacy.write import (
    DP_FILE,
    META_FILE,
    TQ_FILE,
    legacy_experiment_dir,
    write_legacy_dp,
    write_legacy_tq,
)
from zarr_skip.legacy.write import canonical_int as _canonical_int

__all__ = [
    "DP_FILE",
    "META_FILE",
    "TQ_FILE",
    "LegacyDataProto",
    "LegacyExperiment",
    "LegacyMinibatch",
    "LegacyStep",
    "UnsafePickleError",
    "legacy_experiment_dir",
    "read_minibatch",
    "read_step",
    "scan_legacy",
    "write_legacy_dp",
    "write_legacy_tq",
]

logger = logging.getLogger(__name__)

_KIND_FILES = {"dp": DP_FILE, "tq": TQ_FILE}
_DEFAULT_EXPERIMENT = "default_experiment_name"
_DEFAULT_PROJECT = "default_project_name"
_FP_DIR = re.compile(r"^GBS(-?\d+)_N(-?\d+)_in(.+)_out(.+)$")


# --------------------------------------------------------------------------- values


@dataclass
class LegacyDataProto:
    """Stand-in for ``verl.protocol.DataProto`` where verl is not installed.

    ``batch`` is a TensorDict (or ``None``), ``non_tensor_batch`` ``{name: numpy array}``
    (usually object arrays), ``meta_info`` a dict.
    """

    batch: Any = None
    non_tensor_batch: dict[str, Any] = None  # type: ignore[assignment]
    meta_info: dict[str, Any] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.non_tensor_batch = {} if self.non_tensor_batch is None else self.non_tensor_batch
        self.meta_info = {} if self.meta_info is None else self.meta_info

    def __len__(self) -> int:
        if self.batch is not None and len(self.batch.batch_size) > 0:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0


@dataclass(frozen=True, slots=True)
class LegacyMinibatch:
    """One directory holding a data file and ``meta.json``.

    ``index`` is the mini-batch number (``None`` in the flat layout); ``kind`` is ``"dp"``,
    ``"tq"`` or ``None`` (no single data file); ``data_file`` is ``None`` if absent;
    ``meta`` is the parsed ``meta.json`` (read-only), ``None`` if missing or unreadable;
    ``reason`` says why it is not ``complete``.
    """

    index: int | None
    path: Path
    kind: str | None
    data_file: Path | None
    meta: Mapping[str, Any] | None
    complete: bool
    reason: str | None


@dataclass(frozen=True, slots=True)
class LegacyStep:
    """One ``{step}/`` directory; ``layout`` is ``"flat"`` or ``"nested"`` (``{step}/{i}/``).

    A nested step is complete when its mini-batch dirs are ``0..k-1`` without gaps, each
    with both files (and k equals ``expected_minibatches`` if given to
    :func:`scan_legacy`). verl also knows ``parameter_sync_step``: without it, a step
    whose last mini-batches were never written looks complete. Data files directly in the
    step dir make it flat, whatever subdirectories it also has.
    """

    step: int
    path: Path
    kind: str | None
    layout: str
    minibatches: tuple[LegacyMinibatch, ...]
    complete: bool
    reason: str | None


@dataclass(frozen=True, slots=True)
class LegacyExperiment:
    """One ``{exp}_{proj}/GBS.._N.._in.._out..`` directory and its steps (ascending).

    The prompt/response lengths are ``None`` where the name holds no integer.
    """

    path: Path
    combined_name: str
    experiment_name: str
    project_name: str
    name_split: str
    gen_batch_size: int
    n: int
    max_prompt_length: int | None
    max_response_length: int | None
    steps: tuple[LegacyStep, ...]
    #: mini-batches a nested step needs (given, or inferred from the other steps; None: unknown)
    expected_minibatches: int | None = None
    #: why that count could not be inferred (a warning for the import report), else None
    minibatch_warning: str | None = None

    @property
    def name_candidates(self) -> tuple[tuple[str, str], ...]:
        """Every ``(experiment_name, project_name)`` that joins to ``combined_name``."""
        parts = self.combined_name.split("_")
        return tuple(("_".join(parts[:i]), "_".join(parts[i:])) for i in range(1, len(parts)))

    @property
    def complete_steps(self) -> list[int]:
        """Steps that verl would load, ascending."""
        return [s.step for s in self.steps if s.complete]

    def get_step(self, step: int) -> LegacyStep:
        """Return the :class:`LegacyStep` for ``step`` (``KeyError`` if absent)."""
        for item in self.steps:
            if item.step == step:
                return item
        raise KeyError(step)

    def fingerprint(self) -> dict[str, Any]:
        """The verl settings that identify this data, in zarr_skip's fingerprint keys."""
        return {
            "experiment_name": self.experiment_name,
            "project_name": self.project_name,
            "gen_batch_size": self.gen_batch_size,
            "n": self.n,
            "max_prompt_length": self.max_prompt_length,
            "max_response_length": self.max_response_length,
        }


# --------------------------------------------------------------------------- scanning


def _split_name(combined: str, experiment: str | None, project: str | None) -> tuple[str, str, str]:
    for exp, proj, how in ((experiment, project, "hint"), (_DEFAULT_EXPERIMENT, _DEFAULT_PROJECT, "default")):
        if exp and proj and combined == f"{exp}_{proj}":
            return exp, proj, how
        # the project first: one project holds many experiments, so with both hints given,
        # grpo_v2_math is experiment grpo_v2 of project math rather than grpo of v2_math
        if proj and combined.endswith(f"_{proj}") and len(combined) > len(proj) + 1:
            return combined[: -len(proj) - 1], proj, how
        if exp and combined.startswith(f"{exp}_") and len(combined) > len(exp) + 1:
            return exp, combined[len(exp) + 1 :], how
    head, _, tail = combined.partition("_")
    return head, tail, ("unique" if combined.count("_") == 1 else "guess")


def _read_meta(path: Path) -> tuple[Mapping[str, Any] | None, str | None]:
    if not path.is_file():
        return None, f"{META_FILE} missing"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"{META_FILE} unreadable: {exc}"
    if not isinstance(meta, dict):
        return None, f"{META_FILE} is not a JSON object"
    return MappingProxyType(meta), None


def _scan_minibatch(directory: Path, index: int | None) -> LegacyMinibatch:
    present = [k for k, name in _KIND_FILES.items() if (directory / name).is_file()]
    kind = present[0] if len(present) == 1 else None
    data_file = directory / _KIND_FILES[kind] if kind else None
    meta, reason = _read_meta(directory / META_FILE)
    if len(present) > 1:
        reason = f"both {DP_FILE} and {TQ_FILE} present"
    elif not present:
        reason = f"no {DP_FILE} or {TQ_FILE}"
    elif data_file is not None and data_file.stat().st_size == 0:
        reason = f"{data_file.name} is empty"
    return LegacyMinibatch(index, directory, kind, data_file, meta, reason is None, reason)


def _scan_step(step_dir: Path, step: int, expected: int | None) -> LegacyStep:
    if any((step_dir / name).is_file() for name in _KIND_FILES.values()):
        mb = _scan_minibatch(step_dir, None)
        return LegacyStep(step, step_dir, mb.kind, "flat", (mb,), mb.complete, mb.reason)
    indexed = sorted(
        (idx, child)
        for child in step_dir.iterdir()
        if child.is_dir() and (idx := _canonical_int(child.name)) is not None and idx >= 0
    )
    if not indexed:
        mb = _scan_minibatch(step_dir, None)
        return LegacyStep(step, step_dir, None, "flat", (mb,), False, mb.reason)
    mbs = tuple(_scan_minibatch(child, idx) for idx, child in indexed)
    kinds = {mb.kind for mb in mbs if mb.kind is not None}
    kind = kinds.pop() if len(kinds) == 1 else None
    indices = [idx for idx, _ in indexed]
    reason = None
    if len(kinds) > 1:
        reason = "mini-batches mix gen_batch.dp and tq_batch.pt"
    elif indices != list(range(len(indices))):
        missing = sorted(set(range(max(indices) + 1)) - set(indices))
        reason = f"mini-batch dirs not contiguous from 0: missing {missing}"
    elif expected is not None and len(indices) != expected:
        reason = f"{len(indices)} mini-batch dirs, expected {expected}"
    else:
        bad = next((mb for mb in mbs if not mb.complete), None)
        reason = f"mini-batch {bad.index}: {bad.reason}" if bad is not None else None
    return LegacyStep(step, step_dir, kind, "nested", mbs, reason is None, reason)


def _fingerprint_dirs(root: Path) -> list[tuple[Path, re.Match[str]]]:
    if (m := _FP_DIR.match(root.name)) and root.is_dir():
        return [(root, m)]
    children = sorted(c for c in root.iterdir() if c.is_dir())
    direct = [(c, m) for c in children if (m := _FP_DIR.match(c.name))]
    if direct:
        return direct
    return [(g, m) for c in children for g in sorted(c.iterdir()) if g.is_dir() and (m := _FP_DIR.match(g.name))]


def scan_legacy(
    dump_dir: str | os.PathLike[str],
    *,
    experiment_name: str | None = None,
    project_name: str | None = None,
    expected_minibatches: int | None = None,
) -> list[LegacyExperiment]:
    """Find every legacy verl cache under ``dump_dir``, sorted by path.

    Parameters
    ----------
    dump_dir
        verl's ``skip.*.dump_dir`` (``~`` expanded), or an ``{exp}_{proj}`` or ``GBS..``
        dir. A missing directory gives ``[]``.
    experiment_name, project_name
        Hints to split ``{exp}_{proj}`` names (see the module docs).
    expected_minibatches
        verl's ``parameter_sync_step``: nested steps with another count are incomplete.
        Without it, a nested step with fewer mini-batches than most of the experiment's other
        steps is incomplete (:attr:`LegacyExperiment.minibatch_warning` says when that count
        cannot be inferred).
    """
    root = Path(dump_dir).expanduser()
    if not root.is_dir():
        logger.info("legacy dump dir %s does not exist", root)
        return []
    found: list[LegacyExperiment] = []
    for fp_dir, match in _fingerprint_dirs(root):
        combined = fp_dir.parent.name
        exp, proj, how = _split_name(combined, experiment_name, project_name)
        steps = []
        for child in sorted(fp_dir.iterdir()):
            step = _canonical_int(child.name)
            if not child.is_dir() or step is None:
                logger.debug("skipping %s: not a step directory", child)
                continue
            steps.append(_scan_step(child, step, expected_minibatches))
        steps.sort(key=lambda s: s.step)
        expected, warning = expected_minibatches, None
        if expected is None:
            steps, expected, warning = _infer_minibatches(fp_dir, steps)
        gbs, n, p_len, r_len = match.groups()
        found.append(
            LegacyExperiment(
                fp_dir,
                combined,
                exp,
                proj,
                how,
                int(gbs),
                int(n),
                _canonical_int(p_len),
                _canonical_int(r_len),
                tuple(steps),
                expected,
                warning,
            )
        )
    return found


def _mode(values: Iterable[int]) -> int | None:
    """The most common value, None when there is none or two tie."""
    top = Counter(values).most_common(2)
    return top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None


def _infer_minibatches(fp_dir: Path, steps: list[LegacyStep]) -> tuple[list[LegacyStep], int | None, str | None]:
    """Without ``parameter_sync_step``, a nested step needs the most common count of
    mini-batches among the experiment's other steps: a step with fewer (a run interrupted
    after its first mini-batches) is incomplete. Returns the steps, the count most steps
    have (None if unknown) and a warning when some step's count could not be inferred."""
    counts = {s.step: len(s.minibatches) for s in steps if s.layout == "nested" and s.complete}
    if not counts:
        return steps, None, None
    common = _mode(counts.values())
    out, unknown = [], []
    for s in steps:
        if s.step not in counts:
            out.append(s)
            continue
        others = [c for step, c in counts.items() if step != s.step]
        need = (_mode(others) or common) if others else None
        if need is None:
            unknown.append(s.step)
            out.append(s)
            continue
        if counts[s.step] < need:
            reason = (
                f"{counts[s.step]} of {need} mini-batches ({need} is the most common count among the other "
                "steps; give parameter_sync_step to say otherwise)"
            )
            s = replace(s, complete=False, reason=reason)
        out.append(s)
    warning = None
    if unknown:
        warning = (
            f"{fp_dir}: cannot infer how many mini-batches a nested step needs for step(s) "
            f"{', '.join(map(str, unknown))} (no other steps to compare, or a tie); they are imported as "
            "found: give parameter_sync_step (--parameter-sync-step) to check them"
        )
    return out, common, warning


# --------------------------------------------------------------------------- reading


def _verl_dataproto_class() -> Any:
    module = sys.modules.get("verl.protocol")
    if module is None:
        if importlib.util.find_spec("verl") is None:
            return None
        try:
            import verl.protocol as module  # type: ignore[no-redef]
        except Exception:  # a broken verl install must not stop reading
            logger.warning(
                "verl is installed but verl.protocol failed to import; returning LegacyDataProto", exc_info=True
            )
            return None
    return getattr(module, "DataProto", None)


def _data_file(path: Path) -> Path:
    if path.is_dir():
        present = [path / name for name in _KIND_FILES.values() if (path / name).is_file()]
        if len(present) != 1:
            raise FileNotFoundError(f"{path}: expected exactly one of {DP_FILE}, {TQ_FILE}")
        return present[0]
    return path


def read_minibatch(
    path: str | os.PathLike[str],
    allow_pickle: bool = False,
    *,
    as_verl: bool | None = None,
    trust_pickle: bool | None = None,
) -> Any:
    """Read one legacy mini-batch file, or the directory holding it.

    Parameters
    ----------
    path
        ``gen_batch.dp`` or ``tq_batch.pt`` (by suffix: ``.pt`` is a torch archive, else
        a DataProto pickle), or their directory.
    allow_pickle
        Lift the allow-list: the file may run code. Only for files you trust (numpy's
        ``allow_pickle``; ``trust_pickle`` is its deprecated name).
    as_verl
        DataProto files give a real ``verl.protocol.DataProto`` (``True``), a
        :class:`LegacyDataProto` (``False``), or the former if verl imports (``None``).
        verl's ``__setstate__`` is never run.

    Returns
    -------
    DataProto | LegacyDataProto | dict
        The DataProto-like object, or the ``tq_batch.pt`` payload dict.

    Raises
    ------
    UnsafePickleError
        The file names a global outside the allow-list; nothing of it ran.
    """
    trust = _allow_pickle(allow_pickle, trust_pickle, "read_minibatch")
    file = _data_file(Path(path))
    if file.suffix == ".pt":
        payload = torch_load(file, path=file, trust=trust)
        if not isinstance(payload, dict) or "tensordict" not in payload:
            raise ValueError(f"{file}: not a verl tq_batch payload (got {type(payload).__name__})")
        return payload
    obj = load_pickle(file, trust=trust)
    if not isinstance(obj, DataProtoState):
        if all(hasattr(obj, a) for a in ("batch", "non_tensor_batch", "meta_info")):
            return obj  # trusted load of some other DataProto-like class
        raise ValueError(f"{file}: not a pickled verl DataProto (got {type(obj).__name__})")
    batch, non_tensor, meta = decode_dataproto_state(obj.state, path=file, trust=trust)
    cls = _verl_dataproto_class() if as_verl is not False else None
    if as_verl and cls is None:
        raise ImportError("as_verl=True but verl.protocol.DataProto cannot be imported")
    if cls is None:
        return LegacyDataProto(batch, non_tensor, meta)
    result = cls.__new__(cls)  # as verl's unpickling does: no __init__ / __post_init__
    result.batch, result.non_tensor_batch, result.meta_info = batch, non_tensor, meta
    return result


def _allow_pickle(allow_pickle: bool, trust_pickle: bool | None, where: str) -> bool:
    """``allow_pickle``, or the deprecated ``trust_pickle`` when that was given."""
    if trust_pickle is None:
        return allow_pickle
    warn_renamed(f"{where}(trust_pickle=...)", f"{where}(allow_pickle=...)", stacklevel=4)
    return trust_pickle or allow_pickle


def read_step(
    step: LegacyStep, allow_pickle: bool = False, *, as_verl: bool | None = None, trust_pickle: bool | None = None
) -> list[Any]:
    """Read every mini-batch of a complete step, in order (see :func:`read_minibatch`).

    Raises
    ------
    IncompleteStepError
        If ``step.complete`` is false; the message gives the reason.
    """
    allow_pickle = _allow_pickle(allow_pickle, trust_pickle, "read_step")
    if not step.complete:
        raise IncompleteStepError(f"legacy step {step.step} at {step.path} is incomplete: {step.reason}")
    return [
        read_minibatch(mb.path if mb.data_file is None else mb.data_file, allow_pickle, as_verl=as_verl)
        for mb in step.minibatches
    ]
