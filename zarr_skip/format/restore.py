"""Decoding: a column's value rebuilt from its stored arrays (pure: knows no store)."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import SchemaMismatchError, UnsupportedColumnError
from zarr_skip.format.dictionary import gather_rows
from zarr_skip.format.jsonvalues import json_loads
from zarr_skip.format.specs import ColumnSpec, jagged_tensor, numpy_dtype, torch_dtype

if TYPE_CHECKING:  # torch loads with the first tensor column read, not at import
    import torch

# ---------------------------------------------------------------------------------------------
# decoding


def restore(
    spec: ColumnSpec,
    arrays: Mapping[str, np.ndarray],
    *,
    allow_pickle: bool = False,
    plain: np.ndarray | None = None,
) -> Any:
    """Rebuild a column's value from arrays already widened to ``spec.storage_dtype``.

    ``plain`` marks rows of a ``json`` column that were stored as plain strings (a step whose
    mini-batches mix ``str`` and ``json`` columns of one name).
    """
    kind = spec.kind
    if kind == "tensor":
        return _to_torch(arrays["data"], spec.dtype)
    if kind == "ndarray":
        data = arrays["data"]
        dt = numpy_dtype(spec.dtype)
        if dt.kind in "biufc":
            return data.astype(dt, copy=False)
        return np.ascontiguousarray(data).view(dt).reshape(data.shape[:-1])
    lengths = arrays["lengths"].astype(np.int64, copy=False)
    values = arrays["values"]
    if "codes" in arrays:  # dictionary-encoded: the entries, expanded row by row
        values, lengths = gather_rows(values, lengths, arrays["codes"])
    if kind == "nested":
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        vals = _to_torch(values, spec.dtype)
        return jagged_tensor(vals, _to_torch(offsets, "int64"))
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    if kind == "rows":
        dt = numpy_dtype(spec.dtype)
        arrays_ = [values[a:b].astype(dt, copy=False) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        return _container(arrays_, spec.container)
    raw = values.tobytes()
    texts = [raw[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]
    rows: list[Any]
    if kind == "str":
        rows = [t.decode("utf-8", "surrogatepass") for t in texts]
    elif kind == "json" and (plain is None or not plain.any()):
        rows = json_loads(b"[" + b",".join(texts) + b"]")  # one parse for the whole column
    elif kind == "json":
        assert plain is not None
        rows = [
            t.decode("utf-8", "surrogatepass") if is_str else json_loads(t)
            for t, is_str in zip(texts, plain.tolist(), strict=True)
        ]
    elif kind == "pickle":
        if not allow_pickle:
            raise UnsupportedColumnError(
                f"column {spec.name!r}: holds pickled rows; pass allow_pickle=True to load it "
                "(only for caches you trust)"
            )
        rows = [pickle.loads(t) for t in texts]  # noqa: S301 - explicit opt-in
    else:
        raise SchemaMismatchError(f"column {spec.name!r}: unknown column kind {kind!r}")
    return _container(rows, spec.container)


def _to_torch(a: np.ndarray, name: str) -> torch.Tensor:
    import torch

    target = torch_dtype(name)
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if t.dtype == target else t.view(target)


def _container(rows: list[Any], container: str) -> Any:
    if container == "list":
        return rows
    out = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        out[i] = r
    return out
