"""Writing legacy verl rollout caches: ``gen_batch.dp`` / ``tq_batch.pt`` + ``meta.json``.

The files are laid out and encoded as verl's ``verl.utils.skip.rollout_skip`` writes them,
so plain verl loads them (``DataProto.load_from_disk``, ``torch.load``). The names here are
re-exported by :mod:`zarr_skip.legacy.dumps`, which also holds the scanner and the reader; the
file names of verl's layout live here so both modules share them without an import cycle.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from zarr_skip.legacy._unpickle import encode_dataproto

__all__ = [
    "DP_FILE",
    "META_FILE",
    "TQ_FILE",
    "legacy_experiment_dir",
    "write_legacy_dp",
    "write_legacy_tq",
]

logger = logging.getLogger(__name__)

DP_FILE = "gen_batch.dp"
TQ_FILE = "tq_batch.pt"
META_FILE = "meta.json"


def canonical_int(name: str) -> int | None:
    """``int(name)`` for a canonical decimal integer (no sign-less zero padding), else None."""
    return int(name) if re.fullmatch(r"-?\d+", name) and str(int(name)) == name else None


def legacy_experiment_dir(
    dump_dir: str | os.PathLike[str],
    *,
    experiment_name: str,
    project_name: str,
    gen_batch_size: int,
    n: int,
    max_prompt_length: Any,
    max_response_length: Any,
) -> Path:
    """verl's ``{dump_dir}/{exp}_{proj}/GBS{gbs}_N{n}_in{p}_out{r}`` directory (absolute)."""
    sub = f"{experiment_name}_{project_name}"
    fp = f"GBS{gen_batch_size}_N{n}_in{max_prompt_length}_out{max_response_length}"
    return Path(dump_dir).expanduser().resolve() / sub / fp


def _target_dir(step_dir: str | os.PathLike[str], minibatch: int | None) -> tuple[Path, int]:
    step_path = Path(step_dir).expanduser()
    step = canonical_int(step_path.name)
    if step is None:
        raise ValueError(f"{step_path}: the step directory's name must be the step number")
    if minibatch is not None and minibatch < 0:
        raise ValueError(f"minibatch must be >= 0, not {minibatch}")
    target = step_path if minibatch is None else step_path / str(minibatch)
    target.mkdir(parents=True, exist_ok=True)
    return target, step


def _write_atomic(path: Path, data: bytes, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _object_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    arr = np.empty(len(value), dtype=object)
    arr[:] = list(value)
    return arr


def _as_tensordict(batch: Any, rows: int | None) -> Any:
    from tensordict import TensorDict, TensorDictBase

    if batch is None or isinstance(batch, TensorDictBase):
        return batch
    if isinstance(batch, Mapping):
        if rows is None:
            rows = len(next(iter(batch.values()))) if batch else 0
        return TensorDict(dict(batch), batch_size=[rows])
    raise TypeError(f"batch must be a TensorDict, a mapping of tensors or None, not {type(batch).__name__}")


def write_legacy_dp(
    step_dir: str | os.PathLike[str],
    dataproto_like: Any,
    *,
    minibatch: int | None = None,
    global_steps: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``gen_batch.dp`` + ``meta.json`` as verl's ``RolloutSkip.prepare_data`` does.

    ``pickle.load`` (verl's ``DataProto.load_from_disk``) of the file yields a real
    ``verl.protocol.DataProto`` wherever verl is installed. Returns the directory written.

    Parameters
    ----------
    step_dir
        ``.../{step}``; its name is the step number.
    dataproto_like
        Has ``batch`` (TensorDict, mapping of tensors or None), ``non_tensor_batch``
        (``{name: array or list}``) and ``meta_info`` (dict).
    minibatch
        ``None``: into ``step_dir`` (verl's layout); ``i``: into ``step_dir/i``.
    global_steps
        ``meta.json``'s value; defaults to the step number.
    overwrite
        Replace an existing data file instead of raising ``FileExistsError``.
    """
    target, step = _target_dir(step_dir, minibatch)
    non_tensor = {k: _object_array(v) for k, v in dict(dataproto_like.non_tensor_batch or {}).items()}
    rows = len(next(iter(non_tensor.values()))) if non_tensor else None
    batch = _as_tensordict(dataproto_like.batch, rows)
    data = encode_dataproto(batch, non_tensor, dict(dataproto_like.meta_info or {}))
    _write_atomic(target / DP_FILE, data, overwrite)
    steps = step if global_steps is None else int(global_steps)
    (target / META_FILE).write_text(json.dumps({"global_steps": steps}))
    logger.info("wrote legacy DataProto for step %d to %s", step, target)
    return target


def write_legacy_tq(
    step_dir: str | os.PathLike[str],
    payload: Mapping[str, Any],
    *,
    minibatch: int | None = 0,
    global_steps: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``tq_batch.pt`` + ``meta.json`` as verl's ``RolloutTqSkip.prepare_data`` does.

    Returns the directory written.

    Parameters
    ----------
    step_dir
        ``.../{step}``; its name is the step number.
    payload
        ``{"tensordict": TensorDict or mapping of tensors, "tags": list[dict],
        "keys": list[str], "global_steps": int (optional)}``.
    minibatch
        ``i``: into ``step_dir/i/`` (current verl; default 0); ``None``: into ``step_dir``
        (older verl).
    global_steps
        For the payload and ``meta.json``; defaults to ``payload["global_steps"]``, else
        the step number.
    overwrite
        Replace an existing data file instead of raising ``FileExistsError``.
    """
    import torch

    keys = [str(k) for k in payload["keys"]]
    tags = [dict(t) for t in payload["tags"]]
    if len(tags) != len(keys):
        raise ValueError(f"payload has {len(tags)} tags for {len(keys)} keys")
    td = _as_tensordict(payload["tensordict"], len(keys))
    if getattr(td, "_consolidated", None):
        td = td.clone()  # a plain TensorDict pickles the same way in every tensordict version
    target, step = _target_dir(step_dir, minibatch)
    if global_steps is None:
        global_steps = int(payload.get("global_steps", step))
    save = {"tensordict": td, "tags": tags, "keys": keys, "global_steps": int(global_steps)}
    buf = io.BytesIO()
    torch.save(save, buf)
    _write_atomic(target / TQ_FILE, buf.getvalue(), overwrite)
    meta = {"global_steps": int(global_steps), "num_trajectories": len(keys)}
    (target / META_FILE).write_text(json.dumps(meta))
    logger.info("wrote legacy TQ batch (%d trajectories) for step %d to %s", len(keys), step, target)
    return target
