"""Columns as numpy sees them: their logical shape and dtype, and their values as numpy (pure).

What :class:`zarr_skip.LazyColumn` answers to ``shape``, ``dtype`` and ``np.asarray(col)``:

========================== ========================= ================== ===========================
kind                       ``shape``                 ``dtype``          ``np.asarray(col)``
========================== ========================= ================== ===========================
tensor (torch)             ``(rows, *trailing)``     the torch dtype    the values (see below)
ndarray (numpy)            ``(rows, *trailing)``     the numpy dtype    the values
nested (jagged torch)      ``(rows, None, *trail.)`` the torch dtype    object array of row arrays
rows (per-row arrays)      ``(rows, None, *trail.)`` the numpy dtype    object array of row arrays
str, json, pickle          ``(rows,)``               ``object``         object array of the rows
========================== ========================= ================== ===========================

``None`` marks the ragged dimension (every row has its own length: ``col.lengths()``). Torch
dtypes numpy lacks (``bfloat16``, ``float8_*``) convert exactly to the smallest numpy float that
holds them, ``float32`` (``complex32`` to ``complex64``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ConfigError
from zarr_skip.format.restore import restore
from zarr_skip.format.specs import NUMPY_NAMES, ColumnSpec, numpy_dtype, torch_dtype

if TYPE_CHECKING:  # torch loads only for columns of torch dtypes numpy lacks
    import torch


def logical_shape(spec: ColumnSpec, rows: int) -> tuple[int | None, ...]:
    """The column's shape: rows, ``None`` for a ragged dimension, then the per-row shape."""
    if spec.kind in ("nested", "rows"):
        return (rows, None, *spec.shape)
    if spec.jagged:  # strings, JSON objects, pickles: one object per row
        return (rows,)
    return (rows, *spec.shape)


def logical_dtype(spec: ColumnSpec) -> np.dtype | torch.dtype:
    """The dtype of what ``col[:]`` holds: a torch dtype for torch columns, else numpy's."""
    if spec.kind in ("tensor", "nested"):
        return torch_dtype(spec.dtype)
    if spec.kind in ("ndarray", "rows"):
        return numpy_dtype(spec.dtype)
    return np.dtype(object)


def as_numpy(
    spec: ColumnSpec,
    arrays: dict[str, np.ndarray],
    dtype: Any = None,
    *,
    allow_pickle: bool = False,
    plain: np.ndarray | None = None,
) -> np.ndarray:
    """The column as numpy, from its stored arrays (see the module docstring): what
    ``np.asarray(col, dtype)`` gives, built without torch for dtypes numpy has.

    Raises ValueError for a numeric ``dtype`` of a jagged numeric column.
    """
    return with_dtype(spec, _as_numpy(spec, arrays, allow_pickle, plain), dtype)


def with_dtype(spec: ColumnSpec, out: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``out`` (the column as numpy) as ``dtype``: what ``np.asarray(col, dtype)`` does after
    reading (ValueError for a numeric ``dtype`` of a jagged numeric column)."""
    if dtype is None or np.dtype(dtype) == out.dtype:
        return out
    if spec.kind in ("nested", "rows") and np.dtype(dtype) != object:
        raise ConfigError(
            f"column {spec.name!r} is jagged: numpy cannot hold its rows as one array of dtype {np.dtype(dtype)}; "
            "np.asarray(col) gives an object array of rows, col.lengths() their lengths"
        )
    try:
        return out.astype(dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"column {spec.name!r}: dtype {np.dtype(dtype)}: its values cannot be one ({exc})") from None


def _as_numpy(
    spec: ColumnSpec, arrays: dict[str, np.ndarray], allow_pickle: bool, plain: np.ndarray | None
) -> np.ndarray:
    if spec.kind == "tensor":
        return _numpy_values(arrays["data"], spec.dtype)
    if spec.kind in ("nested", "rows"):
        values = _numpy_values(arrays["values"], spec.dtype) if spec.kind == "nested" else arrays["values"]
        if spec.kind == "rows":
            values = values.astype(numpy_dtype(spec.dtype), copy=False)
        lengths = arrays["lengths"].astype(np.int64, copy=False)
        return object_array(np.split(values, np.cumsum(lengths)[:-1]) if len(lengths) else [])
    value = restore(spec, arrays, allow_pickle=allow_pickle, plain=plain)
    return value if isinstance(value, np.ndarray) else object_array(value)


def object_array(rows: Sequence[Any]) -> np.ndarray:
    """A 1-d object array holding ``rows`` as they are (numpy would broadcast equal-length lists)."""
    return np.fromiter(rows, dtype=object, count=len(rows))  # one element per row, never broadcast


def numpy_values(stored: np.ndarray, name: str) -> np.ndarray:
    """Stored values of torch or numpy dtype ``name`` as numpy (see :func:`_numpy_values`)."""
    return _numpy_values(stored, name)


def _numpy_values(stored: np.ndarray, name: str) -> np.ndarray:
    """Values of torch dtype ``name`` stored as ``stored`` (widened), as numpy: as they are
    when numpy has the dtype, else converted exactly to float32 (complex64) through torch."""
    if name in NUMPY_NAMES:
        return stored
    import torch

    t = torch.from_numpy(np.ascontiguousarray(stored)).view(torch_dtype(name))
    return (t.to(torch.complex64) if t.dtype.is_complex else t.to(torch.float32)).numpy()
