"""The codec: a rollout batch <-> named columns of plain numpy arrays (pure: knows no store).

A batch is a mapping of column name to values, a TensorDict, or a DataProto-like object
(attributes ``batch``, ``non_tensor_batch``, ``meta_info``). Each column becomes a
:class:`ColumnSpec` (what to rebuild) and one or two numpy arrays (what to store):

========== ================================== ==================================================
kind       values                             stored arrays
========== ================================== ==================================================
tensor     dense torch tensor, any dtype      ``data`` (rows, ...); dtypes numpy lacks as uints
nested     jagged NestedTensor                ``values`` (total, ...) and ``lengths`` (rows,)
ndarray    numpy array (not object)           ``data`` (rows, ...); non-numeric as raw bytes
rows       per-row numeric numpy arrays       ``values`` and ``lengths``
str        per-row strings                    ``values`` (utf-8 bytes) and ``lengths``
json       per-row JSON-able objects          ``values`` (utf-8 JSON) and ``lengths``
pickle     anything (opt-in)                  ``values`` (pickle bytes) and ``lengths``
========== ================================== ==================================================

Integer arrays are narrowed to the smallest integer type holding every value (token ids to
uint32, masks to uint8) and widened back on load; see :func:`narrow`.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from zarr_skip.errors import SchemaMismatchError, UnsupportedColumnError
from zarr_skip.format import dictionary, layout
from zarr_skip.format.jsonvalues import json_rows, to_json_value
from zarr_skip.format.specs import (
    NARROW_ORDER,
    ColumnSpec,
    EncodedBatch,
    EncodedColumn,
    Narrowed,
    StoredArray,
    dtype_name,
    is_dataproto,
    is_tensor,
    is_tensordict,
    jagged_parts,
    torch_numpy,
    uint_of_size,
)

if TYPE_CHECKING:  # torch loads with the first tensor, not at import
    import torch

# ---------------------------------------------------------------------------------------------
# encoding


def encode_batch(
    batch: Any,
    meta_info: Mapping[str, Any] | None = None,
    *,
    allow_pickle: bool = False,
    on_column: Callable[[EncodedColumn], None] | None = None,
) -> EncodedBatch:
    """Split a batch into encoded columns; raise before anything is stored if it can't be exact.

    ``on_column`` is handed each column as soon as it is encoded (the writer starts compressing
    it). Tensors and arrays are encoded first, the per-row objects (Python work) after them.

    Raises
    ------
    UnsupportedColumnError
        A column's values cannot be stored exactly (names the column and the Python type).
    SchemaMismatchError
        Columns disagree on their number of rows.
    """
    items: list[tuple[str, Any, str]] = []
    if is_dataproto(batch) and not isinstance(batch, Mapping):
        batch_type = "dataproto"
        tensors = batch.batch
        if tensors is not None:
            for name in _keys(tensors):
                items.append((name, tensors[name], "batch"))
        for name, value in (batch.non_tensor_batch or {}).items():
            items.append((name, value, "non_tensor_batch"))
        meta = dict(batch.meta_info or {}) if meta_info is None else dict(meta_info)
    elif is_tensordict(batch):
        batch_type = "tensordict"
        for name in _keys(batch):
            items.append((name, batch.get(name), ""))
        meta = dict(meta_info or {})
    elif isinstance(batch, Mapping):
        batch_type = "mapping"
        items = [(name, value, "") for name, value in batch.items()]
        meta = dict(meta_info or {})
    else:
        raise UnsupportedColumnError(
            f"batch: expected a mapping, a TensorDict or a DataProto-like object, got {type(batch).__qualname__}"
        )
    if not items:
        raise UnsupportedColumnError("batch: has no columns")
    seen: set[str] = set()
    for name, _, _ in items:
        problem = layout.column_name_problem(name)
        if problem is not None:
            raise UnsupportedColumnError(
                f"column {name!r}: not a valid column name ({problem}); names are non-empty strings "
                "without '/', '\\' or NUL, not starting with a dot"
            )
        if name in seen:
            raise UnsupportedColumnError(f"column {name!r}: appears in both batch and non_tensor_batch")
        seen.add(name)
    encoded: dict[int, EncodedColumn] = {}
    for i in sorted(range(len(items)), key=lambda i: not _is_numeric(items[i][1])):
        name, value, section = items[i]
        encoded[i] = encode_column(name, value, section=section, allow_pickle=allow_pickle)
        if on_column is not None:
            on_column(encoded[i])
    columns = [encoded[i] for i in range(len(items))]
    rows = {c.rows for c in columns}
    if len(rows) != 1:
        counts = ", ".join(f"{c.spec.name}={c.rows}" for c in columns)
        raise SchemaMismatchError(f"batch: columns disagree on their number of rows ({counts})")
    return EncodedBatch(columns, rows.pop(), to_json_value(meta), batch_type)


def _is_numeric(value: Any) -> bool:
    """A tensor or a numeric array (the columns whose chunks are large and cheap to encode)."""
    return is_tensor(value) or (isinstance(value, np.ndarray) and value.dtype != object)


def _keys(container: Any) -> list[str]:
    if is_tensordict(container):
        keys = list(container.keys(include_nested=True, leaves_only=True))
        nested = [k for k in keys if isinstance(k, tuple)]
        if nested:
            raise UnsupportedColumnError(
                f"column {'.'.join(nested[0])!r}: nested TensorDicts are not supported; "
                "flatten them first (td.flatten_keys('.'))"
            )
        return keys
    return list(container.keys())


def encode_column(name: str, value: Any, *, section: str = "", allow_pickle: bool = False) -> EncodedColumn:
    """Encode one column (see the module docstring for the kinds)."""
    if is_tensor(value):
        if value.is_nested:
            return _encode_nested(name, value, section)
        return _encode_tensor(name, value, section)
    if _is_non_tensor_stack(value):
        value = value.tolist()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return _encode_objects(name, cast("Sequence[Any]", value), "object", section, allow_pickle)
        if value.ndim == 0:
            raise UnsupportedColumnError(f"column {name!r}: a 0-d array has no rows")
        return _encode_ndarray(name, value, section)
    if isinstance(value, (list, tuple)):
        return _encode_objects(name, value, "list", section, allow_pickle)
    if allow_pickle:
        raise UnsupportedColumnError(
            f"column {name!r}: a column must be a tensor, an array or a list of rows, got {type(value).__qualname__}"
        )
    raise UnsupportedColumnError(
        f"column {name!r}: cannot store {type(value).__qualname__} exactly; pass allow_pickle=True to pickle it"
    )


def _is_non_tensor_stack(value: Any) -> bool:
    return type(value).__name__ in ("NonTensorStack", "NonTensorData") and hasattr(value, "tolist")


def _tensor_to_numpy(t: torch.Tensor, name: str) -> np.ndarray:
    import torch

    if t.layout != torch.strided:
        raise UnsupportedColumnError(
            f"column {name!r}: {t.layout} tensors are not supported; store t.to_dense() (or its indices and values)"
        )
    if t.is_meta:
        raise UnsupportedColumnError(f"column {name!r}: a tensor on the 'meta' device has no data to store")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype in torch_numpy():
        return t.numpy()
    uints = uint_of_size()
    if t.is_quantized or t.dtype.itemsize not in uints or t.dtype.is_complex and (t.dtype.itemsize not in uints):
        raise UnsupportedColumnError(f"column {name!r}: torch dtype {t.dtype} is not supported")
    try:
        return t.view(uints[t.dtype.itemsize]).numpy()
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedColumnError(f"column {name!r}: torch dtype {t.dtype} cannot be stored ({exc})") from None


def _encode_tensor(name: str, t: torch.Tensor, section: str) -> EncodedColumn:
    if t.ndim == 0:
        raise UnsupportedColumnError(f"column {name!r}: a 0-d tensor has no rows")
    data = _tensor_to_numpy(t, name)
    spec = ColumnSpec(name, "tensor", dtype_name(t.dtype), tuple(t.shape[1:]), "torch", section)
    return EncodedColumn(spec, int(t.shape[0]), {"data": narrow(data)}, int(data.nbytes))


def _encode_nested(name: str, t: torch.Tensor, section: str) -> EncodedColumn:
    parts = jagged_parts(t)  # the common case, from the tensor's fields (no torch dispatch: 0.15 ms a write)
    if parts is not None:
        values, offsets = parts
        values, lengths = values[int(offsets[0]) : int(offsets[-1])], offsets.diff()
    else:
        values, lengths = _compact_nested(name, t)
    spec = ColumnSpec(name, "nested", dtype_name(t.dtype), tuple(values.shape[1:]), "torch", section)
    return _jagged_column(spec, _tensor_to_numpy(values, name), lengths.numpy())


def _compact_nested(name: str, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The values and row lengths of a jagged NestedTensor with holes; UnsupportedColumnError
    for another layout or ragged dimension."""
    import torch

    if t.layout != torch.jagged:
        raise UnsupportedColumnError(
            f"column {name!r}: only jagged NestedTensors (layout=torch.jagged) are supported, got layout {t.layout}"
        )
    if getattr(t, "_ragged_idx", None) != 1:  # the public API has no accessor
        raise UnsupportedColumnError(f"column {name!r}: the ragged dimension must be dim 1")
    rows = t.unbind()
    values = torch.cat(rows) if rows else t.values()[:0]
    return values, torch.tensor([r.shape[0] for r in rows], dtype=torch.int64)


def _jagged_column(spec: ColumnSpec, values: np.ndarray, lengths: np.ndarray) -> EncodedColumn:
    """A jagged column's arrays: its rows, or its distinct rows and a code per row when rows
    repeat (see :mod:`zarr_skip.format.dictionary`)."""
    repeated = dictionary.repeated_rows(values, lengths)
    logical = int(values.nbytes)  # every row's values, as they read back
    if repeated is None:
        return EncodedColumn(spec, len(lengths), {"values": narrow(values), "lengths": narrow(lengths)}, logical)
    codes, entries = repeated
    values, lengths = dictionary.gather_rows(values, lengths, entries)
    return EncodedColumn(
        spec, len(codes), {"codes": narrow(codes), "values": narrow(values), "lengths": narrow(lengths)}, logical
    )


def _encode_ndarray(name: str, a: np.ndarray, section: str) -> EncodedColumn:
    dt = a.dtype
    data: StoredArray
    if dt.kind in "biufc":
        data = narrow(np.ascontiguousarray(a, dtype=dt.newbyteorder("<") if dt.byteorder == ">" else dt))
    elif dt.hasobject:
        raise UnsupportedColumnError(f"column {name!r}: numpy dtype {dt} holds Python objects")
    else:  # strings, bytes, datetimes, structured: their raw bytes, one trailing axis of bytes
        data = np.ascontiguousarray(a).view(np.uint8).reshape(*a.shape, dt.itemsize)
    spec = ColumnSpec(name, "ndarray", dt.str if not dt.fields else json.dumps(dt.descr), a.shape[1:], "numpy", section)
    return EncodedColumn(spec, len(a), {"data": data}, int(a.nbytes))


def _encode_objects(name: str, rows: Sequence[Any], container: str, section: str, allow_pickle: bool) -> EncodedColumn:
    if isinstance(rows, np.ndarray) and rows.ndim != 1:
        raise UnsupportedColumnError(
            f"column {name!r}: object arrays must be 1-d (one object per row), got shape {rows.shape}"
        )
    types = set(map(type, rows))
    kinds = {"str"} if types == {str} else {_KIND_OF_TYPE.get(t) or "" for t in types}
    if "" in kinds:
        kinds = {_row_kind(r) for r in rows}
    if kinds == {"str"}:
        blobs = dictionary.shared_blobs(rows, _utf8)
        return _bytes_column(ColumnSpec(name, "str", "str", (), container, section), blobs)
    if kinds == {"array"} and container in ("object", "list"):
        return _encode_rows(name, rows, container, section)
    bad = None
    if kinds <= {"str", "json"}:
        blobs, bad = json_rows(rows)
        if bad is None:
            return _bytes_column(ColumnSpec(name, "json", "json", (), container, section), blobs)
    if allow_pickle:
        blobs = dictionary.shared_blobs(rows, _pickled)
        return _bytes_column(ColumnSpec(name, "pickle", "pickle", (), container, section), blobs)
    if bad is None:
        i, first = next((i, r) for i, r in enumerate(rows) if _row_kind(r) not in ("str", "json"))
        bad = f"row {i}: {type(first).__qualname__}"
    raise UnsupportedColumnError(
        f"column {name!r}: cannot store {bad} exactly (rows must be str, JSON-able objects or "
        "numeric numpy arrays); pass allow_pickle=True to pickle them"
    )


_KIND_OF_TYPE = {str: "str", type(None): "json", bool: "json", int: "json", float: "json", dict: "json", list: "json"}


def _row_kind(row: Any) -> str:
    if isinstance(row, str):
        return "str"
    if isinstance(row, np.ndarray) and row.dtype.kind in "biufc" and row.ndim >= 1:
        return "array"
    if (
        row is None
        or isinstance(row, (bool, int, float, dict, list, tuple))
        or (isinstance(row, np.generic) and row.dtype.kind in "biufc")
    ):
        return "json"
    return "other"


def _utf8(row: str) -> bytes:
    return row.encode("utf-8", "surrogatepass")


def _pickled(row: Any) -> bytes:
    return pickle.dumps(row, protocol=5)


def _bytes_column(spec: ColumnSpec, blobs: list[bytes]) -> EncodedColumn:
    """Rows of bytes: stored back to back, or once per distinct row with a code per row."""
    codes, distinct = dictionary.blob_codes(blobs)
    logical = sum(map(len, blobs))  # every row's bytes, repeats included
    arrays: dict[str, StoredArray] = {}
    if dictionary.pays(len(blobs), len(distinct)):
        arrays["codes"] = narrow(codes)
        blobs = distinct
    lengths = np.fromiter((len(b) for b in blobs), dtype=np.int64, count=len(blobs))
    arrays["values"] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    arrays["lengths"] = narrow(lengths)
    return EncodedColumn(spec, len(codes), arrays, logical)


def _encode_rows(name: str, rows: Sequence[Any], container: str, section: str) -> EncodedColumn:
    first = rows[0]
    dt, trailing = first.dtype, first.shape[1:]
    for i, r in enumerate(rows):
        if r.dtype != dt or r.shape[1:] != trailing:
            raise UnsupportedColumnError(
                f"column {name!r}: row {i} is {r.dtype}{list(r.shape)}, row 0 is {dt}{list(first.shape)}; "
                "per-row arrays must share dtype and trailing shape"
            )
    lengths = np.fromiter((r.shape[0] for r in rows), dtype=np.int64, count=len(rows))
    values = np.concatenate(list(rows)) if len(rows) else np.empty((0, *trailing), dt)
    values = values.astype(dt.newbyteorder("<"), copy=False) if dt.byteorder == ">" else values
    spec = ColumnSpec(name, "rows", dt.str, trailing, container, section)
    return _jagged_column(spec, values, lengths)


def narrow(a: np.ndarray) -> StoredArray:
    """An integer array as the smallest integer dtype holding every value (others unchanged)."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind not in "iu" or a.dtype.itemsize == 1 or a.size == 0:
        return a
    # one pass: with no negative value the OR of all values has the bits of the largest one
    # (the dtype it needs is the same as from max()); min() and max() only when one is negative
    bits = int(np.bitwise_or.reduce(a, axis=None))
    lo, hi = (0, (1 << bits.bit_length()) - 1) if bits >= 0 else (int(a.min()), int(a.max()))
    for dt, least, most in _NARROW_LIMITS:
        if dt.itemsize >= a.dtype.itemsize:
            break
        if least <= lo and hi <= most:
            return Narrowed(a, dt)
    return a


#: the narrow dtypes with their least and greatest values (``np.iinfo`` is built anew per call)
_NARROW_LIMITS = [(dt, int(np.iinfo(dt).min), int(np.iinfo(dt).max)) for dt in NARROW_ORDER]
