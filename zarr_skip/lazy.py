"""Lazy views of a stored step: columns merged across mini-batches, read chunk by chunk.

Nothing is read when a view is made but the mini-batches' metadata. Indexing a column reads
only the chunks holding the requested rows, concurrently, and decodes each straight into the
output array when it can (no per-mini-batch copies followed by a concatenation).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import chunks, layout
from .columns import ColumnSpec, DataProtoLike, check_same_schema, merged_spec, restore
from .jsonvalues import from_json_value
from .errors import MetadataError, SchemaMismatchError
from .storage import Storage


@dataclass(frozen=True, slots=True)
class ArrayPart:
    """One stored array of one mini-batch."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunk: int
    sizes: tuple[int, ...]
    compression: chunks.Compression
    where: str
    separator: str = "/"
    shard: bool = False  # the chunks lie back to back in one file, chunk key 0

    @property
    def rows(self) -> int:
        return self.shape[0]

    def key(self, i: int) -> str:
        """The key holding chunk ``i``."""
        return layout.chunk_key(self.path, 0 if self.shard else i, len(self.shape), self.separator)

    def span(self, i: int) -> tuple[int, int] | None:
        """Where chunk ``i`` lies in its shard (``(start, length)``), None if it is a file."""
        return (sum(self.sizes[:i]), self.sizes[i]) if self.shard else None

    def describe(self, storage: Storage, i: int) -> str:
        """Chunk ``i`` for messages: its file, and its place in the shard."""
        path = storage.key_path(self.key(i))
        return f"{self.where}, chunk {i} of shard {path}" if self.shard else f"{self.where}, chunk {path}"


@dataclass(frozen=True, slots=True)
class Part:
    """One complete mini-batch: where it is and what its metadata says."""

    step: int
    index: int
    run: str
    path: str
    rows: int
    meta_info: dict[str, Any]
    batch_type: str
    specs: dict[str, ColumnSpec]
    arrays: dict[str, dict[str, ArrayPart]]
    nbytes: int
    raw_nbytes: int

    @classmethod
    def from_doc(cls, step: int, path: str, doc: Mapping[str, Any]) -> Part:
        if doc.get("checksum") != layout.doc_checksum(doc):
            raise MetadataError(
                f"step {step}, mini-batch {doc.get('index')}: metadata checksum mismatch at {path} "
                "(the zarr.json was altered after it was written)"
            )
        try:
            index = int(doc["index"])
            default = chunks.Compression(**doc["compression"])
            data = layout.join(path, str(doc["data"]))
            specs, arrays = {}, {}
            for name, entry in doc["columns"].items():
                specs[name] = ColumnSpec.from_json(name, entry)
                multi = len(entry["arrays"]) > 1
                arrays[name] = {
                    aname: ArrayPart(
                        path=layout.join(data, name, aname if multi else ""),
                        dtype=np.dtype(a["dtype"]),
                        shape=tuple(a["shape"]),
                        chunk=int(a["chunk"]),
                        sizes=tuple(a["sizes"]),
                        compression=chunks.Compression(**a["codec"]) if "codec" in a else default,
                        where=f"step {step}, mini-batch {index}, column {name!r}",
                        separator=_separator(a.get("separator", "/")),
                        shard=a.get("shard", False) is True,
                    )
                    for aname, a in entry["arrays"].items()
                }
            return cls(
                step, index, str(doc["run"]), path, int(doc["rows"]), from_json_value(doc.get("meta_info", {})),
                str(doc.get("batch_type", "mapping")), specs, arrays, int(doc["nbytes"]),
                int(doc.get("raw_nbytes", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MetadataError(f"step {step}, {path}: malformed mini-batch metadata ({exc!r})") from None


class StepView:
    """A complete step, lazily: ``view[name]`` is a :class:`LazyColumn` merged across mini-batches.

    Attributes
    ----------
    step : the step number.
    columns : column names, in stored order.
    meta_info : the first mini-batch's batch-level metadata.
    minibatches : one view per mini-batch, in index order.
    """

    def __init__(self, storage: Storage, step: int, parts: Sequence[Part], *, allow_pickle: bool = False):
        if not parts:
            raise MetadataError(f"step {step}: a step view needs at least one mini-batch")
        first = parts[0]
        for p in parts[1:]:
            check_same_schema(
                list(p.specs.values()), list(first.specs.values()),
                f"step {step}, mini-batch {p.index} vs mini-batch {first.index}",
            )
        self._storage = storage
        self.step = step
        self.parts = list(parts)
        self._allow_pickle = allow_pickle
        self._cols: dict[str, LazyColumn] = {}

    @property
    def columns(self) -> list[str]:
        return list(self.parts[0].specs)

    @property
    def schema(self) -> dict[str, ColumnSpec]:
        return dict(self.parts[0].specs)

    @property
    def meta_info(self) -> dict[str, Any]:
        return dict(self.parts[0].meta_info)

    @property
    def batch_type(self) -> str:
        return self.parts[0].batch_type

    @property
    def minibatches(self) -> list[StepView]:
        return [StepView(self._storage, self.step, [p], allow_pickle=self._allow_pickle) for p in self.parts]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def raw_nbytes(self) -> int:
        return sum(p.raw_nbytes for p in self.parts)

    def __len__(self) -> int:
        return sum(p.rows for p in self.parts)

    def __contains__(self, name: object) -> bool:
        return name in self.parts[0].specs

    def __iter__(self):  # noqa: ANN204 - iterates column names like a mapping
        return iter(self.columns)

    def __getitem__(self, name: str) -> LazyColumn:
        if name not in self.parts[0].specs:
            raise KeyError(f"step {self.step}: no column {name!r} (columns: {', '.join(self.columns)})")
        if name not in self._cols:
            self._cols[name] = LazyColumn(self._storage, self.step, self.parts, name, self._allow_pickle)
        return self._cols[name]

    def to_dict(self, columns: Sequence[str] | None = None) -> dict[str, Any]:
        """Every column (or those named) read in full, as the types that were written.

        The chunks of all of them are fetched and decoded in one batch.
        """
        cols = [self[name] for name in (columns or self.columns)]
        wanted = [col._whole() for col in cols]
        arrays = iter(_read_ranges(self._storage, [r for ranges in wanted for r in ranges]))
        return {col.name: col._restore_whole([next(arrays) for _ in ranges]) for col, ranges in zip(cols, wanted)}

    def to_tensordict(self) -> Any:
        """Tensor columns as a TensorDict (needs the optional ``tensordict`` package)."""
        from tensordict import TensorDict

        data = {n: v for n, v in self.to_dict().items() if self.schema[n].container == "torch"}
        return TensorDict(data, batch_size=[len(self)])

    def to_dataproto(self) -> Any:
        """The step as verl's ``DataProto`` when verl is installed, else a :class:`DataProtoLike`.

        Columns written from a DataProto go back to their section; for other batches tensors go
        to ``batch`` and everything else to ``non_tensor_batch``.
        """
        values = self.to_dict()
        tensors = {n: v for n, v in values.items() if _section(self.schema[n]) == "batch"}
        others = {n: v for n, v in values.items() if _section(self.schema[n]) != "batch"}
        batch: Any = tensors or None
        if tensors and importlib.util.find_spec("tensordict") is not None:
            from tensordict import TensorDict

            batch = TensorDict(tensors, batch_size=[len(self)])
        try:
            from verl.protocol import DataProto
        except ImportError:
            return DataProtoLike(batch=batch, non_tensor_batch=others, meta_info=self.meta_info)
        return DataProto(batch=batch, non_tensor_batch=others, meta_info=self.meta_info)

    def __repr__(self) -> str:
        from .display import step_repr

        return step_repr(self)

    def _repr_html_(self) -> str:
        from .display import step_html

        return step_html(self)


def _section(spec: ColumnSpec) -> str:
    if spec.section:
        return spec.section
    return "batch" if spec.container == "torch" else "non_tensor_batch"


class LazyColumn:
    """One column of a step, merged across mini-batches; index it to read rows.

    ``col[5]`` one row, ``col[10:74]`` a slice, ``col[np.array([...])]`` chosen rows,
    ``col[:]`` or ``col.read()`` everything. Only the chunks holding those rows are read.
    """

    def __init__(self, storage: Storage, step: int, parts: Sequence[Part], name: str, allow_pickle: bool):
        self._storage = storage
        self.step = step
        self.name = name
        self.spec = merged_spec([p.specs[name] for p in parts])
        self._parts = [p.arrays[name] for p in parts]
        # rows of mini-batches that stored this json column as plain strings
        str_parts = [p.specs[name].kind == "str" for p in parts]
        self._plain = np.repeat(str_parts, [p.rows for p in parts]) if self.spec.kind == "json" and any(str_parts) else None
        self._allow_pickle = allow_pickle
        self._lengths: np.ndarray | None = None
        self._rows = sum(p.rows for p in parts)

    def __len__(self) -> int:
        return self._rows

    @property
    def nbytes(self) -> int:
        return sum(sum(a.sizes) for arrs in self._parts for a in arrs.values())

    @property
    def raw_nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize for arrs in self._parts for a in arrs.values())

    def read(self) -> Any:
        return self[:]

    def lengths(self) -> np.ndarray:
        """Per-row lengths of a jagged column (tokens, bytes or elements), read once."""
        if not self.spec.jagged:
            raise TypeError(f"column {self.name!r} is not jagged")
        if self._lengths is None:
            parts = [p["lengths"] for p in self._parts]
            self._lengths = _read_range(self._storage, parts, 0, self._rows, np.dtype(np.int64), ())
        return self._lengths

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray) -> Any:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            i = int(key) + (self._rows if key < 0 else 0)
            if not 0 <= i < self._rows:
                raise IndexError(f"column {self.name!r}: row {key} out of range for {self._rows} rows")
            value = self._select(np.arange(i, i + 1))
            if self.spec.kind == "nested":
                return value.unbind()[0]
            return value[0]
        if isinstance(key, slice):
            start, stop, stride = key.indices(self._rows)
            if stride == 1:
                return self._select_range(start, max(start, stop))
            return self._select(np.arange(start, stop, stride))
        idx = np.asarray(key)
        if idx.dtype == bool:
            if idx.shape != (self._rows,):
                raise IndexError(f"column {self.name!r}: boolean mask of shape {idx.shape}, need ({self._rows},)")
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise IndexError(f"column {self.name!r}: index with an int, a slice or a 1-d array of ints")
        idx = idx.astype(np.int64)
        idx = np.where(idx < 0, idx + self._rows, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self._rows):
            raise IndexError(f"column {self.name!r}: row index out of range for {self._rows} rows")
        return self._select(idx)

    def _whole(self) -> list[Range]:
        """What reading every row takes: the data, or the lengths and the values (whose range
        is known from the metadata, so both are read at once)."""
        spec = self.spec
        if not spec.jagged:
            return [([p["data"] for p in self._parts], 0, self._rows, spec.storage_dtype, spec.storage_shape)]
        values = [p["values"] for p in self._parts]
        return [
            ([p["lengths"] for p in self._parts], 0, self._rows, np.dtype(np.int64), ()),
            (values, 0, sum(a.rows for a in values), spec.storage_dtype, spec.storage_shape),
        ]

    def _restore_whole(self, arrays: Sequence[np.ndarray]) -> Any:
        """The column from the arrays :meth:`_whole` named."""
        if not self.spec.jagged:
            return restore(self.spec, {"data": arrays[0]})
        self._lengths, values = arrays
        return restore(self.spec, {"values": values, "lengths": self._lengths},
                       allow_pickle=self._allow_pickle, plain=self._plain)

    def _select_range(self, start: int, stop: int) -> Any:
        spec = self.spec
        if start == 0 and stop == self._rows:
            return self._restore_whole(_read_ranges(self._storage, self._whole()))
        if not spec.jagged:
            data = _read_range(self._storage, [p["data"] for p in self._parts], start, stop,
                               spec.storage_dtype, spec.storage_shape)
            return restore(spec, {"data": data})
        lengths, vstart = self._lengths_range(start, stop)
        values = _read_range(self._storage, [p["values"] for p in self._parts], vstart,
                             vstart + int(lengths.sum()), spec.storage_dtype, spec.storage_shape)
        plain = None if self._plain is None else self._plain[start:stop]
        return restore(spec, {"values": values, "lengths": lengths}, allow_pickle=self._allow_pickle, plain=plain)

    def _lengths_range(self, start: int, stop: int) -> tuple[np.ndarray, int]:
        """Lengths of rows ``start:stop`` and the position of row ``start``'s first value.

        Reads only the lengths of the mini-batches holding those rows: each mini-batch's value
        count is in its metadata.
        """
        if self._lengths is not None:
            offsets = _offsets(self._lengths)
            return self._lengths[start:stop], int(offsets[start])
        row_starts = np.cumsum([0] + [p["lengths"].rows for p in self._parts])
        value_starts = np.cumsum([0] + [p["values"].rows for p in self._parts])
        first = max(0, int(np.searchsorted(row_starts, start, side="right")) - 1)
        lens = _read_range(self._storage, [p["lengths"] for p in self._parts], int(row_starts[first]),
                           stop, np.dtype(np.int64), ())
        before = start - int(row_starts[first])
        return lens[before:], int(value_starts[first]) + int(lens[:before].sum())

    def _select(self, idx: np.ndarray) -> Any:
        spec = self.spec
        if not spec.jagged:
            data = _read_index(self._storage, [p["data"] for p in self._parts], idx,
                               spec.storage_dtype, spec.storage_shape)
            return restore(spec, {"data": data})
        lengths = self.lengths()
        offsets = _offsets(lengths)
        sel = lengths[idx]
        starts = offsets[idx]
        # value positions of every selected row, in order: starts repeated, plus 0..len-1
        within = np.arange(int(sel.sum()), dtype=np.int64) - np.repeat(_offsets(sel)[:-1], sel)
        vidx = np.repeat(starts, sel) + within
        values = _read_index(self._storage, [p["values"] for p in self._parts], vidx,
                             spec.storage_dtype, spec.storage_shape)
        plain = None if self._plain is None else self._plain[idx]
        return restore(spec, {"values": values, "lengths": sel}, allow_pickle=self._allow_pickle, plain=plain)

    def __repr__(self) -> str:
        from .display import column_repr

        return column_repr(self)

    def _repr_html_(self) -> str:
        from .display import column_html

        return column_html(self)


def _separator(value: Any) -> str:
    if value not in ("/", "."):
        raise ValueError(f"chunk key separator {value!r}")
    return str(value)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _check_shape(parts: Sequence[ArrayPart], trailing: tuple[int, ...]) -> None:
    for a in parts:
        if tuple(a.shape[1:]) != tuple(trailing):
            raise SchemaMismatchError(
                f"{a.where}: stored array {a.path} has trailing shape {a.shape[1:]}, expected {trailing}"
            )


#: rows ``start:stop`` of arrays concatenated along axis 0, as ``dtype`` with ``trailing`` shape
Range = tuple[Sequence[ArrayPart], int, int, np.dtype, tuple[int, ...]]


def _read_range(
    storage: Storage, parts: Sequence[ArrayPart], start: int, stop: int, dtype: np.dtype,
    trailing: tuple[int, ...],
) -> np.ndarray:
    """Rows ``start:stop`` of arrays concatenated along axis 0, decoded into one output."""
    return _read_ranges(storage, [(parts, start, stop, dtype, trailing)])[0]


def _read_ranges(storage: Storage, ranges: Sequence[Range]) -> list[np.ndarray]:
    """Several :func:`_read_range` at once: their chunks are fetched and decoded together."""
    outs, jobs = [], []
    for parts, start, stop, dtype, trailing in ranges:
        _check_shape(parts, trailing)
        out = np.empty((stop - start, *trailing), dtype=dtype)
        outs.append(out)
        base = 0
        for a in parts:
            lo, hi = max(start, base), min(stop, base + a.rows)
            if lo < hi and a.sizes:
                for c in range((lo - base) // a.chunk, (hi - base - 1) // a.chunk + 1):
                    c0 = base + c * a.chunk
                    c1 = min(c0 + a.chunk, base + a.rows)
                    s0, s1 = max(lo, c0), min(hi, c1)
                    jobs.append((a, c, c1 - c0, slice(s0 - c0, s1 - c0), slice(s0 - start, s1 - start), out))
            base += a.rows
    _decode_jobs(storage, jobs)
    return outs


def _read_index(
    storage: Storage, parts: Sequence[ArrayPart], idx: np.ndarray, dtype: np.dtype,
    trailing: tuple[int, ...],
) -> np.ndarray:
    """Rows ``idx`` (any order, repeats allowed) of arrays concatenated along axis 0."""
    _check_shape(parts, trailing)
    out = np.empty((len(idx), *trailing), dtype=dtype)
    if not len(idx):
        return out
    starts = np.cumsum([0] + [a.rows for a in parts])
    which = np.searchsorted(starts, idx, side="right") - 1
    jobs = []
    for p in np.unique(which):
        a = parts[p]
        if not a.sizes:
            continue
        sel = np.flatnonzero(which == p)
        local = idx[sel] - starts[p]
        chunk_of = local // a.chunk
        for c in np.unique(chunk_of):
            mine = chunk_of == c
            n = min(a.chunk, a.rows - int(c) * a.chunk)
            jobs.append((a, int(c), n, local[mine] - int(c) * a.chunk, sel[mine], out))
    _decode_jobs(storage, jobs)
    return out


def _decode_jobs(storage: Storage, jobs: list[tuple[Any, ...]]) -> None:
    """Fetch and decode chunks concurrently, each straight into its output when it can."""

    def decode(job: tuple[Any, ...], blob: bytes | None) -> None:
        a, c, n, src, dst, out = job
        where = a.describe(storage, c)
        size = a.sizes[c]
        if n < a.chunk:  # the last chunk: zarr stores it at the full chunk shape
            rows = chunks.decode_rows(blob, a.dtype, a.shape[1:], n, a.compression, stored_size=size, where=where)
            out[dst] = rows[src]
            return
        whole = isinstance(src, slice) and src == slice(0, n) and isinstance(dst, slice)
        if whole and a.dtype == out.dtype:
            chunks.decode_into(blob, out[dst], a.compression, stored_size=size, where=where)
        elif whole and a.dtype.kind in "iu" and out.dtype.kind in "iu" and a.dtype.itemsize < out.dtype.itemsize:
            region = out[dst]  # a narrowed chunk decodes into the back of its rows and widens there
            narrow = chunks.decode_into(blob, chunks.narrow_view(region, a.dtype), a.compression,
                                        stored_size=size, where=where)
            chunks.widen_in_place(region, narrow)
        else:
            tmp = np.empty((n, *a.shape[1:]), dtype=a.dtype)
            chunks.decode_into(blob, tmp, a.compression, stored_size=size, where=where)
            out[dst] = tmp[src]

    storage.map_get(jobs, lambda job: job[0].key(job[1]), decode, lambda job: job[0].span(job[1]))
