"""The four storage formats compared, and the data each one stores.

Each :class:`Format` builds its input from :mod:`zarr_skip.synthetic` (the jagged
TransferQueue payload or the padded ``DataProto`` of one step) and runs the measured
operations on it: ``write``, a full ``read``, one ``column`` and the first 64 rows
(``rows64``).  Two formats are verl's baselines (``torch.save`` of ``tq_batch.pt``,
``pickle`` of ``gen_batch.dp``), two are zarr_skip through its public API.

Also here: the names of the operations and formats the other modules share, the size of a
step in memory, and the untimed round-trip check.

Notes
-----
torch, numpy and zarr_skip are imported inside the functions, never at module level, so that
``--baseline-only`` never imports zarr_skip; the measurement processes import them all before
timing anything (``benchmarks.worker._preimport``).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

STEP = 1

#: ``write``: the first step of a new cache (or directory); ``write_next``: the next step, into a
#: cache (or directory) that holds one already, as a trainer writes every step after its first
WRITE_OPS = ("write", "write_next", "write_fsync")
READ_OPS = ("read_cold", "read_warm", "column_cold", "column_warm", "rows64_cold", "rows64_warm")
OPS = WRITE_OPS + READ_OPS
# format name -> (shape, is baseline); shape "realistic": the jagged step with the realistic
# per-row payload (zarr_skip.synthetic.payloads)
FORMATS = {
    "torch_save_jagged": ("jagged", True),
    "zarr_skip_jagged": ("jagged", False),
    "pickle_padded": ("padded", True),
    "zarr_skip_padded": ("padded", False),
    "tq_batch_realistic": ("realistic", True),
    "plain_dump_realistic": ("realistic", True),
    "zarr_skip_realistic": ("realistic", False),
}
#: comparison name -> (contender, baseline); ratios are contender / baseline
COMPARISONS = {
    "jagged": ("zarr_skip_jagged", "torch_save_jagged"),
    "padded": ("zarr_skip_padded", "pickle_padded"),
    "realistic": ("zarr_skip_realistic", "tq_batch_realistic"),
    "realistic_vs_dump": ("zarr_skip_realistic", "plain_dump_realistic"),
}


def fingerprint(preset) -> dict[str, Any]:
    """The run fingerprint every benchmark cache is opened with."""
    return {
        "experiment_name": "bench",
        "project_name": "zarr_skip_benchmarks",
        "gen_batch_size": preset.rows // preset.n,
        "n": preset.n,
        "max_prompt_length": preset.max_prompt,
        "max_response_length": preset.max_response,
    }


def verl_step_dir(d: Path, step: int) -> Path:
    """``d / str(step)``, made as verl's rollout skip makes a step's directory before saving
    (``step_dir.mkdir(parents=True, exist_ok=True)``, verl/utils/skip/rollout_skip.py)."""
    step_dir = d / str(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    return step_dir


def nested_head(nt, k: int):
    """First ``k`` rows of a jagged NestedTensor (``nt[:k]`` is not supported on dim 0)."""
    import torch

    off = nt.offsets()
    k = min(k, len(off) - 1)
    return torch.nested.nested_tensor_from_jagged(nt.values()[: int(off[k])], off[: k + 1])


class Format:
    """One storage format: how to build its input and run each operation."""

    shape = ""

    def __init__(self, preset) -> None:
        self.preset = preset

    def make(self, seed: int):
        from zarr_skip.synthetic import jagged_payload, padded_batch

        if self.shape == "realistic":
            return jagged_payload(self.preset, seed, step=STEP, payload="realistic")
        if self.shape == "jagged":
            return jagged_payload(self.preset, seed, step=STEP)
        return padded_batch(self.preset, seed, step=STEP)

    def prepare_write(self, d: Path) -> Any:  # untimed per-run setup
        return None

    def prepare_step(self, d: Path, step: int) -> None:  # untimed, before a later step's write
        return None

    def write(self, ctx: Any, d: Path, data: Any, step: int = STEP) -> None:
        raise NotImplementedError

    def read(self, d: Path) -> Any:
        raise NotImplementedError

    def column(self, d: Path) -> Any:
        raise NotImplementedError

    def rows64(self, d: Path) -> Any:
        raise NotImplementedError


class TorchSaveJagged(Format):
    shape = "jagged"

    def write(self, ctx, d, data, step=STEP):
        import torch

        torch.save(data, verl_step_dir(d, step) / "tq_batch.pt")

    def read(self, d):
        import torch

        return torch.load(d / str(STEP) / "tq_batch.pt", weights_only=False)

    def column(self, d):
        return self.read(d)["tensordict"]["responses"]

    def rows64(self, d):
        return nested_head(self.read(d)["tensordict"]["responses"], 64)


class TqBatchRealistic(TorchSaveJagged):
    """verl's ``tq_batch.pt`` as ``RolloutTqSkip.prepare_data`` saves it: ``torch.save`` of
    ``{"tensordict": TensorDict (NonTensorStack fields), "tags", "keys", "global_steps"}``."""

    shape = "realistic"


class PlainDumpRealistic(Format):
    """``torch.save`` of the same tensors and lists as a plain dict (no TensorDict, no
    NonTensorStack): the speed of an uncompressed dump. Its input is the flat mapping, made
    untimed. One definition for every benchmark: :mod:`benchmarks.baseline`."""

    shape = "realistic"

    def make(self, seed):
        from zarr_skip.synthetic import as_mapping

        return as_mapping(super().make(seed))

    def prepare_step(self, d, step):  # one dump file per step: its directory made untimed
        (d / str(step)).mkdir()

    def write(self, ctx, d, data, step=STEP):
        from .baseline import plain_dump

        plain_dump(data, d if step == STEP else d / str(step))

    def read(self, d):
        from .baseline import plain_load

        return plain_load(d)

    def column(self, d):
        return self.read(d)["responses"]

    def rows64(self, d):
        return nested_head(self.read(d)["responses"], 64)


class PicklePadded(Format):
    shape = "padded"

    def write(self, ctx, d, data, step=STEP):
        with open(verl_step_dir(d, step) / "gen_batch.dp", "wb") as f:  # verl DataProto.save_to_disk
            pickle.dump(data, f)

    def read(self, d):
        with open(d / str(STEP) / "gen_batch.dp", "rb") as f:  # verl DataProto.load_from_disk
            return pickle.load(f)

    def column(self, d):
        return self.read(d).batch["responses"]

    def rows64(self, d):
        return self.read(d).batch["responses"][:64]


class ZarrSkip(Format):
    """zarr_skip through its public API (/work/spec/API.md). Reads include ``open_cache``."""

    def prepare_write(self, d):
        import zarr_skip as zs

        return zs.open_cache(str(d), fingerprint=fingerprint(self.preset))

    def _batch(self, data):
        if self.shape in ("jagged", "realistic"):
            from zarr_skip.synthetic import as_mapping

            return as_mapping(data)  # timed: converting the TQ payload is part of the job
        return data

    def write(self, ctx, d, data, step=STEP):
        ctx.write(step, self._batch(data))

    def _view(self, d):
        import zarr_skip as zs

        return zs.open_cache(str(d), fingerprint=fingerprint(self.preset)).load(STEP)

    def read(self, d):
        return self._view(d).to_dict()

    def column(self, d):
        return self._view(d)["responses"][:]

    def rows64(self, d):
        return self._view(d)["responses"][:64]


class ZarrSkipJagged(ZarrSkip):
    shape = "jagged"


class ZarrSkipPadded(ZarrSkip):
    shape = "padded"


class ZarrSkipRealistic(ZarrSkip):
    shape = "realistic"


FORMAT_CLASSES: dict[str, type[Format]] = {
    "torch_save_jagged": TorchSaveJagged,
    "zarr_skip_jagged": ZarrSkipJagged,
    "pickle_padded": PicklePadded,
    "zarr_skip_padded": ZarrSkipPadded,
    "tq_batch_realistic": TqBatchRealistic,
    "plain_dump_realistic": PlainDumpRealistic,
    "zarr_skip_realistic": ZarrSkipRealistic,
}


def in_memory_sizes(preset: Any, seed: int) -> dict[str, int]:
    """Bytes of one step's tensors in memory (padded and jagged shapes) and its token counts."""
    import torch

    from zarr_skip.synthetic import jagged_payload, padded_batch

    dp = padded_batch(preset, seed, step=STEP)
    pl = jagged_payload(preset, seed, step=STEP)
    td = pl["tensordict"]
    return {
        "padded_tensor_bytes": sum(t.numel() * t.element_size() for t in dp.batch.values()),
        "jagged_tensor_bytes": sum(
            (t.values().numel() * t.values().element_size() if t.is_nested else t.numel() * t.element_size())
            for t in (td.get(k) for k in td.keys())  # noqa: SIM118 - a TensorDict iterates rows
            if isinstance(t, torch.Tensor)
        ),
        "response_tokens": int(dp.batch["response_mask"].sum()),
        "prompt_tokens": int(dp.batch["attention_mask"][:, : preset.max_prompt].sum()),
    }


# --------------------------------------------------------------------------- verification


def same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` hold the same values (tensors: same dtype, layout and elements)."""
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype:
            return False
        if a.is_nested:
            if not b.is_nested:
                return False
            ao, bo = a.offsets(), b.offsets()  # type: ignore[attr-defined]
            return bool(torch.equal(a.values(), b.values()) and torch.equal(ao.long(), bo.long()))
        return bool(not b.is_nested and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, np.ndarray):
        a = a.tolist()
    if isinstance(b, np.ndarray):
        b = b.tolist()
    try:
        return list(a) == list(b)
    except TypeError:
        return a == b


def verify_roundtrip(fmt: Format, d: Path, seed: int) -> dict[str, Any]:
    """Untimed: does ``load(step).to_dict()`` give back what was written?"""
    from zarr_skip.synthetic import as_mapping

    data = fmt.make(seed)
    if fmt.shape in ("jagged", "realistic"):
        expected = as_mapping(data)
    else:
        expected = {**data.batch, **data.non_tensor_batch}
    got = fmt.read(d)
    missing = sorted(set(expected) - set(got))
    mismatched = sorted(k for k in expected if k in got and not same(expected[k], got[k]))
    extra = sorted(set(got) - set(expected))
    return {"ok": not missing and not mismatched, "missing": missing, "mismatched": mismatched, "extra": extra}
