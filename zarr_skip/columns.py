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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .errors import SchemaMismatchError, UnsupportedColumnError
from .jsonvalues import json_loads, json_rows, to_json_value

JAGGED_KINDS = frozenset({"nested", "rows", "str", "json", "pickle"})
BYTES_KINDS = frozenset({"str", "json", "pickle"})

_TORCH_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(bool),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
_UINT_OF_SIZE = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}
_NARROW_ORDER = [np.dtype(t) for t in ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8")]


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """What a column is and how to rebuild it; equal specs mean mergeable mini-batches.

    Attributes
    ----------
    name : column name.
    kind : one of ``tensor nested ndarray rows str json pickle`` (see the module docstring).
    dtype : logical element type: a torch dtype name (``bfloat16``) or a numpy dtype string.
    shape : per-row trailing shape (for jagged kinds: the shape after the ragged axis).
    container : how rows are handed back: ``torch``, ``numpy``, ``list`` or ``object`` (a
        numpy object array).
    section : ``batch``/``non_tensor_batch`` for DataProto columns, else ``""``.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    container: str
    section: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "container": self.container,
            "section": self.section,
        }

    @classmethod
    def from_json(cls, name: str, doc: Mapping[str, Any]) -> ColumnSpec:
        return cls(
            name=name,
            kind=doc["kind"],
            dtype=doc["dtype"],
            shape=tuple(doc["shape"]),
            container=doc["container"],
            section=doc.get("section", ""),
        )

    @property
    def jagged(self) -> bool:
        return self.kind in JAGGED_KINDS

    @property
    def storage_dtype(self) -> np.dtype:
        """The numpy dtype rows are rebuilt in (before a torch view, after widening)."""
        if self.kind in BYTES_KINDS:
            return np.dtype(np.uint8)
        if self.kind in ("tensor", "nested"):
            tdt = torch_dtype(self.dtype)
            return _TORCH_NUMPY.get(tdt) or _TORCH_NUMPY[_UINT_OF_SIZE[tdt.itemsize]]
        dt = _numpy_dtype(self.dtype)
        if dt.kind in "biufc":
            return dt.newbyteorder("<") if dt.byteorder == ">" else dt
        return np.dtype(np.uint8)  # raw bytes; the last stored axis holds the item bytes

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """Per-row (per-element for jagged) trailing shape of the stored values."""
        if self.kind in ("ndarray", "rows"):
            dt = _numpy_dtype(self.dtype)
            if dt.kind not in "biufc":
                return (*self.shape, dt.itemsize)
        return self.shape


@dataclass(frozen=True, slots=True)
class Narrowed:
    """An integer array to be stored as the narrower integer ``dtype`` that holds its values.

    Converted slice by slice when it is written (``self[a:b]``), so the writer's threads narrow
    chunks in parallel and no full-size narrowed copy is ever made.
    """

    source: np.ndarray
    dtype: np.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def ndim(self) -> int:
        return self.source.ndim

    @property
    def size(self) -> int:
        return self.source.size

    @property
    def nbytes(self) -> int:
        return self.source.size * self.dtype.itemsize

    def __getitem__(self, key: Any) -> np.ndarray:
        return self.source[key].astype(self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.source.astype(self.dtype)
        return out if dtype is None else out.astype(dtype)

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        return np.asarray(self).astype(dtype, copy=copy)


#: what a stored array is before it is written
StoredArray = np.ndarray | Narrowed


@dataclass(frozen=True, slots=True)
class EncodedColumn:
    """One column ready to store: its spec, its row count and its arrays (name -> array)."""

    spec: ColumnSpec
    rows: int
    arrays: dict[str, StoredArray]


@dataclass(slots=True)
class DataProtoLike:
    """A stand-in for ``verl.protocol.DataProto`` when verl is not installed."""

    batch: Any = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0]) if hasattr(self.batch, "batch_size") else len(
                next(iter(self.batch.values()))
            )
        return len(next(iter(self.non_tensor_batch.values()), ()))


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A whole mini-batch: columns in order, the batch-level metadata and the batch type."""

    columns: list[EncodedColumn]
    rows: int
    meta_info: dict[str, Any]
    batch_type: str


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (``"bfloat16"``)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise SchemaMismatchError(f"unknown torch dtype {name!r} in stored column metadata")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def is_tensordict(obj: object) -> bool:
    return any(c.__name__ == "TensorDictBase" for c in type(obj).__mro__)


def is_dataproto(obj: object) -> bool:
    return all(hasattr(obj, a) for a in ("batch", "non_tensor_batch", "meta_info"))


# ---------------------------------------------------------------------------------------------
# encoding


def encode_batch(
    batch: Any, meta_info: Mapping[str, Any] | None = None, *, allow_pickle: bool = False
) -> EncodedBatch:
    """Split a batch into encoded columns; raise before anything is stored if it can't be exact.

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
            f"batch: expected a mapping, a TensorDict or a DataProto-like object, "
            f"got {type(batch).__qualname__}"
        )
    if not items:
        raise UnsupportedColumnError("batch: has no columns")
    seen: set[str] = set()
    columns = []
    for name, value, section in items:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise UnsupportedColumnError(
                f"column {name!r}: names must be non-empty strings without '/' or a leading dot"
            )
        if name in seen:
            raise UnsupportedColumnError(
                f"column {name!r}: appears in both batch and non_tensor_batch"
            )
        seen.add(name)
        columns.append(encode_column(name, value, section=section, allow_pickle=allow_pickle))
    rows = {c.rows for c in columns}
    if len(rows) != 1:
        counts = ", ".join(f"{c.spec.name}={c.rows}" for c in columns)
        raise SchemaMismatchError(f"batch: columns disagree on their number of rows ({counts})")
    return EncodedBatch(columns, rows.pop(), to_json_value(meta), batch_type)


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


def encode_column(
    name: str, value: Any, *, section: str = "", allow_pickle: bool = False
) -> EncodedColumn:
    """Encode one column (see the module docstring for the kinds)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return _encode_nested(name, value, section)
        return _encode_tensor(name, value, section)
    if _is_non_tensor_stack(value):
        value = value.tolist()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return _encode_objects(name, value, "object", section, allow_pickle)
        if value.ndim == 0:
            raise UnsupportedColumnError(f"column {name!r}: a 0-d array has no rows")
        return _encode_ndarray(name, value, section)
    if isinstance(value, (list, tuple)):
        return _encode_objects(name, value, "list", section, allow_pickle)
    if allow_pickle:
        raise UnsupportedColumnError(
            f"column {name!r}: a column must be a tensor, an array or a list of rows, "
            f"got {type(value).__qualname__}"
        )
    raise UnsupportedColumnError(
        f"column {name!r}: cannot store {type(value).__qualname__} exactly; pass "
        "allow_pickle=True to pickle it"
    )


def _is_non_tensor_stack(value: Any) -> bool:
    return type(value).__name__ in ("NonTensorStack", "NonTensorData") and hasattr(value, "tolist")


def _tensor_to_numpy(t: torch.Tensor, name: str) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype in _TORCH_NUMPY:
        return t.numpy()
    if t.is_quantized or t.dtype.itemsize not in _UINT_OF_SIZE or t.dtype.is_complex and (
        t.dtype.itemsize not in _UINT_OF_SIZE
    ):
        raise UnsupportedColumnError(f"column {name!r}: torch dtype {t.dtype} is not supported")
    try:
        return t.view(_UINT_OF_SIZE[t.dtype.itemsize]).numpy()
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedColumnError(
            f"column {name!r}: torch dtype {t.dtype} cannot be stored ({exc})"
        ) from None


def _encode_tensor(name: str, t: torch.Tensor, section: str) -> EncodedColumn:
    if t.ndim == 0:
        raise UnsupportedColumnError(f"column {name!r}: a 0-d tensor has no rows")
    data = _tensor_to_numpy(t, name)
    spec = ColumnSpec(name, "tensor", dtype_name(t.dtype), tuple(t.shape[1:]), "torch", section)
    return EncodedColumn(spec, int(t.shape[0]), {"data": narrow(data)})


def _encode_nested(name: str, t: torch.Tensor, section: str) -> EncodedColumn:
    if t.layout != torch.jagged:
        raise UnsupportedColumnError(
            f"column {name!r}: only jagged NestedTensors (layout=torch.jagged) are supported, "
            f"got layout {t.layout}"
        )
    if t._ragged_idx != 1:  # noqa: SLF001 - the public API has no accessor
        raise UnsupportedColumnError(f"column {name!r}: the ragged dimension must be dim 1")
    offsets = t.offsets()
    if getattr(t, "_lengths", None) is not None:  # non-contiguous (holes): compact first
        parts = t.unbind()
        values = torch.cat(parts) if parts else t.values()[:0]
        lengths = torch.tensor([p.shape[0] for p in parts], dtype=torch.int64)
    else:
        values = t.values()[int(offsets[0]) : int(offsets[-1])]
        lengths = offsets.diff()
    spec = ColumnSpec(name, "nested", dtype_name(t.dtype), tuple(values.shape[1:]), "torch", section)
    return EncodedColumn(
        spec,
        int(lengths.shape[0]),
        {"values": narrow(_tensor_to_numpy(values, name)), "lengths": narrow(lengths.numpy())},
    )


def _encode_ndarray(name: str, a: np.ndarray, section: str) -> EncodedColumn:
    dt = a.dtype
    if dt.kind in "biufc":
        data = np.ascontiguousarray(a, dtype=dt.newbyteorder("<") if dt.byteorder == ">" else dt)
        data = narrow(data)
    elif dt.hasobject:
        raise UnsupportedColumnError(f"column {name!r}: numpy dtype {dt} holds Python objects")
    else:  # strings, bytes, datetimes, structured: their raw bytes, one trailing axis of bytes
        data = np.ascontiguousarray(a).view(np.uint8).reshape(*a.shape, dt.itemsize)
    spec = ColumnSpec(name, "ndarray", dt.str if not dt.fields else json.dumps(dt.descr), a.shape[1:], "numpy", section)
    return EncodedColumn(spec, len(a), {"data": data})


def _encode_objects(
    name: str, rows: Sequence[Any] | np.ndarray, container: str, section: str, allow_pickle: bool
) -> EncodedColumn:
    if isinstance(rows, np.ndarray) and rows.ndim != 1:
        raise UnsupportedColumnError(
            f"column {name!r}: object arrays must be 1-d (one object per row), got shape {rows.shape}"
        )
    types = set(map(type, rows))
    kinds = {"str"} if types == {str} else {_KIND_OF_TYPE.get(t) or "" for t in types}
    if "" in kinds:
        kinds = {_row_kind(r) for r in rows}
    if kinds == {"str"}:
        blobs = [r.encode("utf-8", "surrogatepass") for r in rows]
        return _bytes_column(ColumnSpec(name, "str", "str", (), container, section), blobs)
    if kinds == {"array"} and container in ("object", "list"):
        return _encode_rows(name, rows, container, section)
    bad = None
    if kinds <= {"str", "json"}:
        blobs, bad = json_rows(rows)
        if bad is None:
            return _bytes_column(ColumnSpec(name, "json", "json", (), container, section), blobs)
    if allow_pickle:
        blobs = [pickle.dumps(r, protocol=5) for r in rows]
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
    if row is None or isinstance(row, (bool, int, float, dict, list, tuple)) or (
        isinstance(row, np.generic) and row.dtype.kind in "biufc"
    ):
        return "json"
    return "other"


def _bytes_column(spec: ColumnSpec, blobs: list[bytes]) -> EncodedColumn:
    lengths = np.fromiter((len(b) for b in blobs), dtype=np.int64, count=len(blobs))
    values = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    return EncodedColumn(spec, len(blobs), {"values": values, "lengths": narrow(lengths)})


def _encode_rows(name: str, rows: Sequence[np.ndarray], container: str, section: str) -> EncodedColumn:
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
    return EncodedColumn(spec, len(rows), {"values": narrow(values), "lengths": narrow(lengths)})


def narrow(a: np.ndarray) -> StoredArray:
    """An integer array as the smallest integer dtype holding every value (others unchanged)."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind not in "iu" or a.dtype.itemsize == 1 or a.size == 0:
        return a
    lo, hi = int(a.min()), int(a.max())
    for dt in _NARROW_ORDER:
        if dt.itemsize >= a.dtype.itemsize:
            break
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return Narrowed(a, dt)
    return a


def check_same_schema(
    specs: Sequence[ColumnSpec], other: Sequence[ColumnSpec], where: str
) -> None:
    """Raise :class:`SchemaMismatchError` naming the first difference between two schemas."""
    mine = {s.name: s for s in specs}
    theirs = {s.name: s for s in other}
    if mine.keys() != theirs.keys():
        extra, missing = sorted(mine.keys() - theirs.keys()), sorted(theirs.keys() - mine.keys())
        raise SchemaMismatchError(
            f"{where}: columns differ from the step's other mini-batches "
            f"(new here: {extra or 'none'}; missing here: {missing or 'none'})"
        )
    for name, spec in mine.items():
        if spec != theirs[name] and not _text_kinds(spec, theirs[name]):
            a, b = spec.to_json(), theirs[name].to_json()
            diff = ", ".join(f"{k} {a[k]!r} vs {b[k]!r}" for k in a if a[k] != b[k])
            raise SchemaMismatchError(f"{where}, column {name!r}: {diff}")


def _text_kinds(a: ColumnSpec, b: ColumnSpec) -> bool:
    """Rows of strings and rows of JSON (an empty or all-str mini-batch) merge as JSON."""
    return {a.kind, b.kind} == {"str", "json"} and (a.container, a.section) == (b.container, b.section)


def merged_spec(specs: Sequence[ColumnSpec]) -> ColumnSpec:
    """The spec of a column merged across mini-batches (``json`` when str and json mix)."""
    first = specs[0]
    if any(s.kind == "json" for s in specs) and any(s.kind == "str" for s in specs):
        return ColumnSpec(first.name, "json", "json", (), first.container, first.section)
    return first


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
        dt = _numpy_dtype(spec.dtype)
        if dt.kind in "biufc":
            return data.astype(dt, copy=False)
        return np.ascontiguousarray(data).view(dt).reshape(data.shape[:-1])
    lengths = arrays["lengths"].astype(np.int64, copy=False)
    values = arrays["values"]
    if kind == "nested":
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        vals = _to_torch(values, spec.dtype)
        return torch.nested.nested_tensor_from_jagged(vals, offsets=torch.from_numpy(offsets))
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    if kind == "rows":
        dt = _numpy_dtype(spec.dtype)
        rows = [values[a:b].astype(dt, copy=False) for a, b in zip(bounds[:-1], bounds[1:])]
        return _container(rows, spec.container)
    raw = values.tobytes()
    texts = [raw[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    if kind == "str":
        rows = [t.decode("utf-8", "surrogatepass") for t in texts]
    elif kind == "json" and (plain is None or not plain.any()):
        rows = json_loads(b"[" + b",".join(texts) + b"]")  # one parse for the whole column
    elif kind == "json":
        rows = [
            t.decode("utf-8", "surrogatepass") if is_str else json_loads(t)
            for t, is_str in zip(texts, plain.tolist())
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


def _numpy_dtype(text: str) -> np.dtype:
    if text.startswith("["):
        return np.dtype([(f[0], f[1], tuple(f[2])) if len(f) > 2 else tuple(f) for f in json.loads(text)])
    return np.dtype(text)


def _to_torch(a: np.ndarray, name: str) -> torch.Tensor:
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
