"""What a column is: its spec, the stored-array types, dtype names and schema checks (pure).

The codec (:mod:`zarr_skip.format.columns` encodes, :mod:`zarr_skip.format.restore` decodes)
turns a batch into columns; this module holds the types both sides share.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from zarr_skip.errors import SchemaMismatchError

if TYPE_CHECKING:  # torch loads when a tensor is first encoded or decoded, not at import
    import torch

JAGGED_KINDS = frozenset({"nested", "rows", "str", "json", "pickle"})
BYTES_KINDS = frozenset({"str", "json", "pickle"})

#: torch dtypes numpy has, by name (the same name in both)
NUMPY_NAMES = frozenset(
    "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()
)
NARROW_ORDER = [np.dtype(t) for t in ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8")]


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
            if self.dtype in NUMPY_NAMES:
                return np.dtype(self.dtype)
            return np.dtype(f"u{torch_dtype(self.dtype).itemsize}")  # bfloat16, float8 ... as uints
        dt = numpy_dtype(self.dtype)
        if dt.kind in "biufc":
            return dt.newbyteorder("<") if dt.byteorder == ">" else dt
        return np.dtype(np.uint8)  # raw bytes; the last stored axis holds the item bytes

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """Per-row (per-element for jagged) trailing shape of the stored values."""
        if self.kind in ("ndarray", "rows"):
            dt = numpy_dtype(self.dtype)
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
        part: np.ndarray = self.source[key]  # the writer takes rows: an array, never a scalar
        return part.astype(self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.source.astype(self.dtype)
        return out if dtype is None else out.astype(dtype)

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        return np.asarray(self).astype(dtype, copy=copy)


#: what a stored array is before it is written
StoredArray = np.ndarray | Narrowed


@dataclass(frozen=True, slots=True)
class EncodedColumn:
    """One column ready to store: its spec, its row count, its arrays (name -> array) and
    ``nbytes``, its logical size: numpy's ``nbytes`` of the column as it reads back (every
    row's values at their own dtype, before narrowing and dictionary encoding; strings and JSON
    as their encoded bytes)."""

    spec: ColumnSpec
    rows: int
    arrays: dict[str, StoredArray]
    nbytes: int


@dataclass(slots=True)
class DataProtoLike:
    """A stand-in for ``verl.protocol.DataProto`` when verl is not installed."""

    batch: Any = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        if self.batch is not None:
            return (
                int(self.batch.batch_size[0])
                if hasattr(self.batch, "batch_size")
                else len(next(iter(self.batch.values())))
            )
        return len(next(iter(self.non_tensor_batch.values()), ()))


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A whole mini-batch: columns in order, the batch-level metadata and the batch type."""

    columns: list[EncodedColumn]
    rows: int
    meta_info: dict[str, Any]
    batch_type: str


@functools.cache
def torch_numpy() -> dict[torch.dtype, np.dtype]:
    """The numpy dtype of each torch dtype numpy has."""
    import torch

    return {getattr(torch, name): np.dtype(name) for name in NUMPY_NAMES}


@functools.cache
def uint_of_size() -> dict[int, torch.dtype]:
    """The torch unsigned integer dtype of each width in bytes."""
    import torch

    return {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (``"bfloat16"``)."""
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise SchemaMismatchError(f"unknown torch dtype {name!r} in stored column metadata")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def is_tensor(obj: object) -> bool:
    """Whether ``obj`` is a torch tensor (without importing torch: none exists before it loads)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def jagged_tensor(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``torch.nested.nested_tensor_from_jagged(values, offsets)``, made as ``torch.load`` makes
    a saved one: the NestedTensor class called on its values and offsets (no view of
    ``values``, no trip through torch's dispatcher, a fifth of the cost), and without the public
    function's check for fx symbolic tracing, whose first call logs a warning (``is_fx_tracing
    will return true ...``) in the user's process. Our reads are never traced."""
    cls = _nested_class()
    if cls is None:  # a torch without the internal class: the public function
        import torch

        return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    # torch leaves its internal class untyped; it is a Tensor
    make = cast("Callable[..., torch.Tensor]", cls)
    return make(values, offsets)


def _nested_class() -> type | None:
    try:
        from torch.nested._internal.nested_tensor import NestedTensor
    except ImportError:  # a torch without the internal class
        return None
    return cast(type, NestedTensor)


#: the fields of torch's NestedTensor read by :func:`jagged_parts`: values, offsets, lengths
#: (None without holes), ragged dimension
_FIELDS = ("_values", "_offsets", "_lengths", "_ragged_idx")


def jagged_parts(value: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(values, offsets)`` of a jagged NestedTensor without holes, ragged in dimension 1;
    None for anything else.

    Read from the tensor's own fields where torch's class has them: its ``values()`` and
    ``layout`` go through torch's dispatcher, whose first call in a process imports
    ``torch.distributed.tensor`` and sympy (0.5-0.9 s here), and a fresh DataLoader worker
    whose parent never made a NestedTensor paid that every epoch. A torch without the class or
    its fields is asked the public (dispatched) way."""
    th = sys.modules.get("torch")  # not imported here: no tensor exists before it loads
    if th is None or not isinstance(value, th.Tensor) or not value.is_nested:
        return None
    cls = _nested_class()
    fields = [getattr(value, name, _MISSING) for name in _FIELDS] if cls is not None else [_MISSING]
    if any(f is _MISSING for f in fields):  # by identity: == on a NestedTensor would dispatch
        if value.layout != th.jagged or value.lengths() is not None or getattr(value, "_ragged_idx", 1) != 1:
            return None
        return value.values(), value.offsets()
    if not isinstance(value, cast(type, cls)):
        return None  # strided nested
    values, offsets, lengths, ragged = fields
    if lengths is not None or ragged != 1:
        return None  # holes, or ragged in another dimension
    return cast("torch.Tensor", values), cast("torch.Tensor", offsets)


_MISSING = object()


def nested_rows(value: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a NestedTensor, as ``unbind()`` gives them: for a jagged one without holes,
    detached views of its values split in one call, without torch's dispatcher (see
    :func:`jagged_parts`: a first ``unbind()`` in a process imports sympy, 0.5-0.9 s, which
    ``zarr-skip show`` and a notebook's ``view["responses"][5]`` paid)."""
    parts = jagged_parts(value)
    if parts is None:
        return list(value.unbind())  # holes, strided, or ragged in another dimension
    values: Any = parts[0].detach()  # plain views (7x cheaper to make); torch.Tensor.split is untyped
    offsets = parts[1]
    return list(values[int(offsets[0]) : int(offsets[-1])].split(offsets.diff().tolist()))


class SharedOffsets:
    """Jagged tensors made on one offsets tensor per distinct content.

    torch matches the ragged dimension of two jagged tensors by their offsets tensor, not its
    values: ``old_log_probs * response_mask`` works on a batch whose columns were made on one
    offsets tensor (as verl makes them) and raises on two equal copies. Columns read or collated
    from the same rows share one again, as ``torch.load`` gives back one saved tensor."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, bytes], Any] = {}

    def jagged(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """:func:`jagged_tensor` of ``values`` on the first offsets tensor equal to ``offsets``."""
        return jagged_tensor(values, self.offsets(offsets))

    def offsets(self, offsets: torch.Tensor) -> torch.Tensor:
        key = (str(offsets.dtype), offsets.numpy().tobytes())
        found: torch.Tensor = self._seen.setdefault(key, offsets)
        return found


def share_offsets(columns: dict[str, Any]) -> dict[str, Any]:
    """``columns`` (changed in place and returned) with each jagged NestedTensor whose offsets
    equal an earlier one's remade on that one's offsets tensor (see :class:`SharedOffsets`)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return columns
    shared = SharedOffsets()
    for name, value in columns.items():
        parts = jagged_parts(value)
        if parts is None or parts[0].device.type != "cpu":
            continue  # not jagged, holes, or ragged in another dimension: left as they are
        values, offsets = parts
        first = shared.offsets(offsets)
        if first is not offsets:
            columns[name] = jagged_tensor(values, first)
    return columns


def is_tensordict(obj: object) -> bool:
    return any(c.__name__ == "TensorDictBase" for c in type(obj).__mro__)


def is_dataproto(obj: object) -> bool:
    return all(hasattr(obj, a) for a in ("batch", "non_tensor_batch", "meta_info"))


def check_same_schema(specs: Sequence[ColumnSpec], other: Sequence[ColumnSpec], where: str) -> None:
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


def numpy_dtype(text: str) -> np.dtype:
    if text.startswith("["):
        return np.dtype([(f[0], f[1], tuple(f[2])) if len(f) > 2 else tuple(f) for f in json.loads(text)])
    return np.dtype(text)
