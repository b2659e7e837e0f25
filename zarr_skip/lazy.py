"""Lazy views of a stored step: columns merged across mini-batches, read chunk by chunk.

Nothing is read when a view is made but the mini-batches' metadata. Indexing a column reads
only the chunks holding the requested rows, concurrently, and decodes each straight into the
output array when it can (no per-mini-batch copies followed by a concatenation).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Generator, ItemsView, Iterable, Iterator, KeysView, Sequence, ValuesView
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip import tables
from zarr_skip._deprecation import keyword_only, warn_renamed
from zarr_skip.errors import ConfigError, MetadataError, MissingExtraError
from zarr_skip.format import args, arrays
from zarr_skip.format.restore import restore
from zarr_skip.format.specs import (
    BYTES_KINDS,
    ColumnSpec,
    DataProtoLike,
    check_same_schema,
    merged_spec,
    nested_rows,
    share_offsets,
)
from zarr_skip.store import reads
from zarr_skip.store.blocks import iter_rows, rows_of
from zarr_skip.store.dictreads import DictColumn, is_dictionary
from zarr_skip.store.memo import ChunkMemo
from zarr_skip.store.reads import ArrayPart, Batch, Fetched, Part, Range, Reader, read_range, read_ranges, read_rounds
from zarr_skip.store.storage import Storage
from zarr_skip.store.writer import MinibatchInfo
from zarr_skip.views import browse, display
from zarr_skip.views.schema import Reduce
from zarr_skip.views.text import Message, Rows, chat_rows, decode_column

if TYPE_CHECKING:
    import pandas
    import torch

    from zarr_skip.cache import Cache
    from zarr_skip.views.groups import GroupView
    from zarr_skip.views.rollouts import RolloutList, RolloutView

_INT64 = np.dtype(np.int64)

#: a row read fetches the values chunks its rows lie in with their lengths when at most this many
PREFETCH_CHUNKS = 8
ITER_CHUNKS = 32  #: iterating a column reads this many chunks (16 MiB) at a time, the next ahead


class StepView:
    """A complete step, lazily: ``view[name]`` is a :class:`LazyColumn` merged across mini-batches.

    Attributes
    ----------
    step : the step number.
    columns : column names, in stored order.
    meta_info : the first mini-batch's batch-level metadata.
    minibatches : one view per mini-batch, in index order.
    cache : the Cache the view was loaded from (None when made directly): its attributes name
        the tokenizer that :meth:`text` decodes with by default.
    """

    def __init__(
        self,
        storage: Storage,
        step: int,
        parts: Sequence[Part],
        *,
        allow_pickle: bool = False,
        cache: Cache | None = None,
    ) -> None:
        if not parts:
            raise MetadataError(f"step {step}: a step view needs at least one mini-batch")
        first = parts[0]
        for p in parts[1:]:
            check_same_schema(
                list(p.specs.values()),
                list(first.specs.values()),
                f"step {step}, mini-batch {p.index} vs mini-batch {first.index}",
            )
        self._storage = storage
        self.step = step
        self._parts = list(parts)
        self._allow_pickle = allow_pickle
        self._cols: dict[str, LazyColumn] = {}
        self.cache = cache

    @property
    def columns(self) -> list[str]:
        return list(self._parts[0].specs)

    @property
    def schema(self) -> dict[str, ColumnSpec]:
        return dict(self._parts[0].specs)

    @property
    def meta_info(self) -> dict[str, Any]:
        return dict(self._parts[0].meta_info)

    @property
    def batch_type(self) -> str:
        return self._parts[0].batch_type

    @property
    def minibatches(self) -> list[StepView]:
        return [
            StepView(self._storage, self.step, [p], allow_pickle=self._allow_pickle, cache=self.cache)
            for p in self._parts
        ]

    @property
    def minibatch_info(self) -> tuple[MinibatchInfo, ...]:
        """Each mini-batch's index, run, rows and sizes, in index order (from the metadata)."""
        return tuple(
            MinibatchInfo(self.step, p.index, p.run, p.rows, p.nbytes, p.raw_nbytes, True, p.path) for p in self._parts
        )

    @property
    def parts(self) -> list[Part]:
        """Deprecated: :attr:`minibatch_info` (each mini-batch's numbers) or :attr:`minibatches`
        (a view of each)."""
        warn_renamed("StepView.parts", "StepView.minibatch_info (or StepView.minibatches for views)")
        return list(self._parts)

    @property
    def nbytes(self) -> int:
        """Logical (decoded) bytes of every column, as numpy's and zarr's ``nbytes``."""
        return sum(p.raw_nbytes for p in self._parts)

    @property
    def nbytes_stored(self) -> int:
        """Stored (compressed) bytes of every column."""
        return sum(p.nbytes for p in self._parts)

    @property
    def raw_nbytes(self) -> int:
        """Deprecated: :attr:`nbytes` (the logical size)."""
        warn_renamed("StepView.raw_nbytes", "StepView.nbytes (the logical size; nbytes_stored is the stored one)")
        return self.nbytes

    def __len__(self) -> int:
        return sum(p.rows for p in self._parts)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._parts[0].specs

    def __iter__(self) -> Iterator[str]:  # column names, like a mapping
        return iter(self.columns)

    def __getitem__(self, name: str) -> LazyColumn:
        args.column(name, self._parts[0].specs, "column", f"step {self.step}")
        if name not in self._cols:
            self._cols[name] = LazyColumn(self._storage, self.step, self._parts, name, self._allow_pickle)
        return self._cols[name]

    # -- a mapping of columns (``len()`` stays the row count, as in pandas) ------------------

    def keys(self) -> KeysView[str]:
        return self._parts[0].specs.keys()

    def values(self) -> ValuesView[LazyColumn]:
        return {name: self[name] for name in self.columns}.values()

    def items(self) -> ItemsView[str, LazyColumn]:
        return {name: self[name] for name in self.columns}.items()

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def to_pandas(self, columns: Sequence[str] | None = None, *, reduce: Reduce = None) -> pandas.DataFrame:
        """This step as a table: see :meth:`zarr_skip.Cache.table` (needs ``zarr-skip[pandas]``)."""
        return tables.views_table(self._storage, [self], columns, reduce)

    def to_dict(self, columns: Sequence[str] | None = None) -> dict[str, Any]:
        """Every column (or those named) read in full, as the types that were written; the
        chunks of all of them are fetched and decoded in one batch (those of a mini-batch's
        data file in one ranged read). Reading every column of local files first asks the
        kernel to read the data files (``posix_fadvise``), which a cold read then finds read
        while its columns' records were checked."""
        names = args.columns(columns, self.columns, where=f"step {self.step}")
        if names is None:  # the kernel reads the data files while the columns are set up
            self._storage.read_ahead([(p.data_file[0], (0, p.data_file[1])) for p in self._parts if p.data_file])
        cols = [self[name] for name in (self.columns if names is None else names)]
        wanted = [col._whole() for col in cols]
        arrays = iter(read_ranges(self._storage, [r for ranges in wanted for r in ranges]))
        return share_offsets(
            {
                col.name: col._restore_whole([next(arrays) for _ in ranges])
                for col, ranges in zip(cols, wanted, strict=True)
            }
        )

    def to_tensordict(self) -> Any:
        """Tensor columns as a TensorDict (needs ``pip install 'zarr-skip[tensordict]'``)."""
        try:
            from tensordict import TensorDict
        except ImportError as exc:
            raise MissingExtraError(
                f"step {self.step}: to_tensordict() needs tensordict: pip install 'zarr-skip[tensordict]'"
            ) from exc

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

    # -- decoded text and readable views (zarr_skip.views); each view reads nothing until shown

    @keyword_only
    def text(
        self,
        column: str = "responses",
        *,
        rows: Rows = None,
        tokenizer: Any = None,
        skip_special_tokens: bool = True,
    ) -> list[str]:
        """Token ids of ``column`` (``"responses"``, ``"prompts"``) decoded, one string per row.

        Only the rows asked for are read: ``rows`` is one row (an int), a slice, a sequence of
        row numbers, or None (all). ``tokenizer`` is a path, a ``tokenizers.Tokenizer``, a
        ``transformers`` tokenizer or a Decoder; by default the one the experiment recorded
        (:func:`zarr_skip.views.tokenizers.tokenizer_for`). Padding is dropped.

        Raises
        ------
        TokenizerNotFoundError
            No tokenizer given and none recorded (or the recorded path is not on this machine).
        """
        return decode_column(self, column, rows, tokenizer, skip_special_tokens=skip_special_tokens)

    def messages(self, rows: Rows = None) -> list[list[Message]]:
        """The chat prompt of each row (its ``raw_prompt``) as ``Message(role, content)`` pairs."""
        return chat_rows(self, rows)

    def rollout(self, row: int, *, tokenizer: Any = None, max_length: int | None = None) -> RolloutView:
        """Row ``row`` drawn in full: the prompt (chat messages), the response, badges and its
        tokens coloured by log-prob."""
        return browse.rollout(self, row, tokenizer=tokenizer, max_length=max_length)

    def group(
        self, uid: object = None, *, row: int | None = None, tokenizer: Any = None, max_length: int | None = None
    ) -> GroupView:
        """The GRPO group ``uid`` (or that of row ``row``): its responses side by side."""
        return browse.group(self, uid, row=row, tokenizer=tokenizer, max_length=max_length)

    def find(
        self, *, tokenizer: Any = None, max_length: int | None = None, limit: int | None = 20, **criteria: Any
    ) -> RolloutList:
        """Rows by ``uid``, ``score``, ``truncated``, ``text``, ``longest`` / ``shortest`` /
        ``best`` / ``worst``: see :func:`zarr_skip.views.finding.find_rows`."""
        return browse.find(self, tokenizer=tokenizer, max_length=max_length, limit=limit, **criteria)

    @keyword_only
    def page(self, k: int = 0, *, size: int = 20, tokenizer: Any = None, max_length: int | None = None) -> RolloutList:
        """Page ``k`` of the step's rollouts, ``size`` rows a page."""
        return browse.page(self, k, size, tokenizer=tokenizer, max_length=max_length)

    def __repr__(self) -> str:
        return display.step_head(self)  # no store request: the listing is _repr_pretty_'s

    def _repr_pretty_(self, p: display.PrettyPrinter, cycle: bool) -> None:
        p.text(display.step_head(self) if cycle else display.step_text(self))

    def _repr_html_(self) -> str:
        return display.step_html(self)


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
        self._logical = [p.logical.get(name) for p in parts]
        # rows of mini-batches that stored this json column as plain strings
        str_parts = [p.specs[name].kind == "str" for p in parts]
        self._plain = (
            np.repeat(str_parts, [p.rows for p in parts]) if self.spec.kind == "json" and any(str_parts) else None
        )
        self._allow_pickle = allow_pickle
        self._lengths: np.ndarray | None = None
        self._rows = sum(p.rows for p in parts)
        # mini-batches storing repeated rows once (dictionary-encoded) are read by DictColumn
        self._dict = (
            DictColumn(storage, self.spec, [p.specs[name] for p in parts], self._parts, allow_pickle)
            if any(is_dictionary(a) for a in self._parts)
            else None
        )

    def __len__(self) -> int:
        return self._rows

    @property
    def nbytes(self) -> int:
        """Logical bytes: numpy's ``nbytes`` of the column as it reads back (every row at its own
        dtype, repeats included; strings and JSON as their UTF-8 bytes). A mini-batch written
        before records held it counts its stored arrays instead (narrowed integers, repeated
        rows once)."""
        return sum(
            sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in arrs.values()) if n is None else n
            for arrs, n in zip(self._parts, self._logical, strict=True)
        )

    @property
    def nbytes_stored(self) -> int:
        """Stored (compressed) bytes of the column's chunks."""
        return sum(sum(a.sizes) for arrs in self._parts for a in arrs.values())

    @property
    def raw_nbytes(self) -> int:
        """Deprecated: :attr:`nbytes` (the logical size)."""
        warn_renamed("LazyColumn.raw_nbytes", "LazyColumn.nbytes (the logical size; nbytes_stored is the stored one)")
        return self.nbytes

    def read(self) -> Any:
        return self[:]

    def lengths(self) -> np.ndarray:
        """Per-row lengths of a jagged column (tokens, bytes or elements), read once."""
        if not self.spec.jagged:
            raise TypeError(f"column {self.name!r} is not jagged")
        if self._lengths is None and self._dict is not None:
            self._lengths = self._dict.lengths()
        if self._lengths is None:
            known = self._recorded_lengths(range(len(self._parts)))
            self._lengths = (
                np.concatenate(known)
                if known is not None
                else reads.checked_lengths(read_ranges(self._storage, [self._lengths_whole()])[0], self._parts)
            )
        return self._lengths

    def _recorded_lengths(self, parts: Iterable[int]) -> list[np.ndarray] | None:
        """The row lengths of mini-batches ``parts`` from their records' ``value_ends`` (checked
        as the record was: never negative, adding to the values stored), read from no chunk;
        None when one of them keeps none (:meth:`_recorded_ends`)."""
        ends = self._recorded_ends(parts)
        return None if ends is None else [np.diff(e, prepend=np.int64(0)) for e in ends]

    def _recorded_ends(self, parts: Iterable[int]) -> list[np.ndarray] | None:
        """The ``value_ends`` the records of mini-batches ``parts`` keep; None when one of them
        keeps none (records of older writers, or of one values chunk)."""
        ends = [self._parts[p]["lengths"].value_ends for p in parts]
        return None if any(e is None for e in ends) else ends  # type: ignore[return-value]  # none is None

    def _lengths_whole(self) -> Range:
        return ([p["lengths"] for p in self._parts], 0, self._rows, np.dtype(np.int64), ())

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray) -> Any:
        key = args.rows(key, self._rows, "rows", f"column {self.name!r}", none=False)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            i = int(key)  # made non-negative and checked by args.rows
            value = self._select_range(i, i + 1)  # reads that row's mini-batch only
            if self.spec.kind == "nested":
                return nested_rows(value)[0]
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

    # -- the array protocol: see zarr_skip.format.arrays for what each kind answers -----------

    @property
    def shape(self) -> tuple[int | None, ...]:
        """Rows, ``None`` for a ragged dimension, the per-row shape (``(rows,)`` for objects)."""
        return arrays.logical_shape(self.spec, self._rows)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype | torch.dtype:
        """What ``col[:]`` holds: a torch dtype for torch columns, numpy's for the others."""
        return arrays.logical_dtype(self.spec)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(col)``: every row (see :mod:`zarr_skip.format.arrays`); ValueError for
        ``copy=False`` (reading makes a new array, as in zarr) or a numeric dtype of jagged rows."""
        dtype, copy = args.dtype(dtype, where=f"column {self.name!r}"), args.maybe_flag(copy, "copy")
        if copy is False:
            raise ConfigError(f"column {self.name!r}: np.asarray(col, copy=False): reading always makes a new array")
        if self._dict is not None and self.spec.kind in BYTES_KINDS:  # each entry decoded once, as col[:]
            return arrays.with_dtype(self.spec, arrays.object_array(self[:]), dtype)
        stored = self._stored(read_ranges(self._storage, self._whole()))
        return arrays.as_numpy(self.spec, stored, dtype, allow_pickle=self._allow_pickle, plain=self._plain)

    def __iter__(self) -> Iterator[Any]:
        """The rows, as ``col[i]`` gives them, read :data:`ITER_CHUNKS` chunks at a time (each once)."""
        few = sum(len(a.sizes) for arrs in self._parts for a in arrs.values()) <= ITER_CHUNKS
        if few or self._dict is not None:  # one block, or repeated rows (decoded once each): as col[:]
            return iter(rows_of(self[:]))
        lengths = self.lengths if self.spec.jagged else None  # read while the first block is fetched
        return iter_rows(self._storage, self.spec, self._parts, lengths, ITER_CHUNKS, self._allow_pickle, self._plain)

    def _whole(self) -> list[Range]:
        """What reading every row takes: the data, or the lengths and the values (whose range
        is known from the metadata, so both are read at once)."""
        spec = self.spec
        if not spec.jagged:
            return [([p["data"] for p in self._parts], 0, self._rows, spec.storage_dtype, spec.storage_shape)]
        if self._dict is not None:
            return self._dict.whole_ranges()
        values = [p["values"] for p in self._parts]
        return [
            ([p["lengths"] for p in self._parts], 0, self._rows, np.dtype(np.int64), ()),
            (values, 0, sum(a.rows for a in values), spec.storage_dtype, spec.storage_shape),
        ]

    def _stored(self, arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays :meth:`_whole` named as a plain column stores them (``data``, or per-row
        ``lengths`` and ``values``)."""
        if not self.spec.jagged:
            return {"data": arrays[0]}
        if self._dict is not None:
            return self._dict.expand_whole(arrays)
        return {"lengths": reads.checked_lengths(arrays[0], self._parts), "values": arrays[1]}

    def _lengths_ranges(self) -> list[Range]:
        """What reading every row's length takes (nothing when the records say where each row
        ends); :meth:`_lengths_of` gives the lengths."""
        if self._dict is not None:
            return self._dict.lengths_ranges()
        return [] if self._recorded_ends(range(len(self._parts))) is not None else [self._lengths_whole()]

    def _lengths_of(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        d = self._dict
        if d is not None:
            return d.lengths_of(arrays)
        return reads.checked_lengths(arrays[0], self._parts) if arrays else self.lengths()

    def _restore_whole(self, arrays: Sequence[np.ndarray]) -> Any:
        """The column from the arrays :meth:`_whole` named."""
        if not self.spec.jagged:
            return restore(self.spec, {"data": arrays[0]})
        if self._dict is not None:
            return self._dict.restore_whole(arrays)
        self._lengths, values = reads.checked_lengths(arrays[0], self._parts), arrays[1]
        return restore(
            self.spec, {"values": values, "lengths": self._lengths}, allow_pickle=self._allow_pickle, plain=self._plain
        )

    def _select_range(self, start: int, stop: int) -> Any:
        spec = self.spec
        if start == 0 and stop == self._rows:
            return self._restore_whole(read_ranges(self._storage, self._whole()))
        if not spec.jagged:
            data = read_range(
                self._storage, [p["data"] for p in self._parts], start, stop, spec.storage_dtype, spec.storage_shape
            )
            return restore(spec, {"data": data})
        if self._dict is not None:
            return self._dict.rows(np.arange(start, stop, dtype=np.int64))
        fetched: Fetched = {}
        lengths, vstart = self._lengths_range(start, stop, fetched)
        values = read_range(
            self._storage,
            [p["values"] for p in self._parts],
            vstart,
            vstart + int(lengths.sum()),
            spec.storage_dtype,
            spec.storage_shape,
            fetched=fetched,
        )
        plain = None if self._plain is None else self._plain[start:stop]
        return restore(spec, {"values": values, "lengths": lengths}, allow_pickle=self._allow_pickle, plain=plain)

    def _lengths_range(self, start: int, stop: int, fetched: Fetched) -> tuple[np.ndarray, int]:
        """Lengths of rows ``start:stop`` and the position of row ``start``'s first value.

        Reads only the lengths of the mini-batches holding those rows: each mini-batch's value
        count is in its metadata. The values chunks holding those rows, when the metadata names
        them and they are few, are fetched in the same batch (into ``fetched``), so that a read
        of a few rows waits for one round of requests, not two.
        """
        if self._lengths is not None:
            offsets = _offsets(self._lengths)
            return self._lengths[start:stop], int(offsets[start])
        row_starts, value_starts = self._starts()
        first = max(0, int(np.searchsorted(row_starts, start, side="right")) - 1)
        last = int(np.searchsorted(row_starts, stop, side="left"))  # the parts first..last-1 hold the rows
        lo, hi = int(row_starts[first]), int(row_starts[last])  # all their rows: checked against their values
        known = self._recorded_lengths(range(first, last))
        if known is not None:
            lens = np.concatenate(known) if known else np.zeros(0, np.int64)
        else:
            ahead = self._values_ahead(
                (i, start - int(row_starts[i]), stop - int(row_starts[i])) for i in range(first, last)
            )
            lens = read_ranges(
                self._storage,
                [([p["lengths"] for p in self._parts], lo, hi, _INT64, ())],
                prefetch=ahead,
                fetched=fetched,
            )[0]
            reads.checked_lengths(lens, self._parts[first:last])
        before = start - int(row_starts[first])
        return lens[before : stop - lo], int(value_starts[first]) + int(lens[:before].sum())

    def _starts(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each mini-batch's rows and values start in the merged column (its row and
        value counts are in the metadata)."""
        return (
            np.cumsum([0] + [p["lengths"].rows for p in self._parts]),
            np.cumsum([0] + [p["values"].rows for p in self._parts]),
        )

    def _values_ahead(self, spans: Iterable[tuple[int, int, int]]) -> list[tuple[ArrayPart, int]]:
        """The values chunks holding rows ``start:stop`` of mini-batch ``part`` for each
        ``(part, start, stop)`` whose metadata names them, when they are at most
        :data:`PREFETCH_CHUNKS`; else none (they are then read after the lengths)."""
        ahead: dict[tuple[str, int], tuple[ArrayPart, int]] = {}
        for part, start, stop in spans:
            values = self._parts[part]["values"]
            held = values.chunks_of_rows(max(0, start), stop)
            ahead.update({(values.path, c): (values, c) for c in held or ()})
            if len(ahead) > PREFETCH_CHUNKS:
                return []
        return list(ahead.values())

    def _lengths_index(self, idx: np.ndarray) -> Generator[Batch, None, tuple[np.ndarray, np.ndarray]]:
        """Lengths of rows ``idx`` and the position of each one's first value, from the lengths
        of the mini-batches holding them only (with, for a few rows, their values chunks in the
        same batch, as :meth:`_lengths_range` does): a reader for :func:`reads.read_rounds`."""
        if self._lengths is not None:
            return self._lengths[idx], _offsets(self._lengths)[idx]
        row_starts, value_starts = self._starts()
        which = np.searchsorted(row_starts, idx, side="right") - 1
        touched = [int(p) for p in np.unique(which)]
        lens = self._recorded_lengths(touched)
        if lens is None:
            lens = yield from self._read_lengths(idx, which, touched)
        if len(touched) == len(self._parts):
            self._lengths = np.concatenate(lens)
        sel, starts = np.empty(len(idx), np.int64), np.empty(len(idx), np.int64)
        for p, part_lengths in zip(touched, lens, strict=True):
            mine = which == p
            local = idx[mine] - row_starts[p]
            sel[mine] = part_lengths[local]
            starts[mine] = _offsets(part_lengths)[local] + value_starts[p]
        return sel, starts

    def _read_lengths(
        self, idx: np.ndarray, which: np.ndarray, touched: list[int]
    ) -> Generator[Batch, None, list[np.ndarray]]:
        """The lengths of mini-batches ``touched`` (holding rows ``idx``, of mini-batches
        ``which``), read and checked: a reader for :func:`reads.read_rounds`, whose batch
        fetches, for a few rows, their values chunks too (as :meth:`_lengths_range` does)."""
        row_starts = self._starts()[0]
        batch = Batch()
        if len(idx) <= PREFETCH_CHUNKS:  # else the rows' chunks are not worth a Python loop
            batch.prefetch += self._values_ahead(
                (p, i - int(row_starts[p]), i - int(row_starts[p]) + 1)
                for i, p in zip(idx.tolist(), which.tolist(), strict=True)
            )
        lens = [
            batch.range([self._parts[p]["lengths"]], 0, int(row_starts[p + 1] - row_starts[p]), _INT64, ())
            for p in touched
        ]
        yield batch  # the lengths read
        for p, part_lengths in zip(touched, lens, strict=True):
            reads.checked_lengths(part_lengths, [self._parts[p]])
        return lens

    def _select(self, idx: np.ndarray) -> Any:
        return read_rounds(self._storage, [self._reader(idx)])[0]

    def _reader(self, idx: np.ndarray) -> Reader:
        """Rows ``idx`` (checked, any order, repeats allowed), as a reader for
        :func:`reads.read_rounds`: so the rows of several columns are read in the same rounds."""
        spec = self.spec
        batch = Batch()
        if not spec.jagged:
            data = batch.index([p["data"] for p in self._parts], idx, spec.storage_dtype, spec.storage_shape)
            yield batch
            return restore(spec, {"data": data})
        if self._dict is not None:
            return (yield from self._dict.reader(idx))
        sel, starts = yield from self._lengths_index(idx)
        values_parts = [p["values"] for p in self._parts]
        if len(idx) <= reads.MAX_RUNS:  # each row's values copied as one run
            values = batch.runs(values_parts, starts, sel, spec.storage_dtype, spec.storage_shape)
        else:  # value positions of every selected row, in order: starts repeated, plus 0..len-1
            within = np.arange(int(sel.sum()), dtype=np.int64) - np.repeat(_offsets(sel)[:-1], sel)
            vidx = np.repeat(starts, sel) + within
            values = batch.index(values_parts, vidx, spec.storage_dtype, spec.storage_shape)
        yield batch
        plain = None if self._plain is None else self._plain[idx]
        return restore(spec, {"values": values, "lengths": sel}, allow_pickle=self._allow_pickle, plain=plain)

    def __repr__(self) -> str:
        return display.column_head(self)  # no store request: the listing is _repr_pretty_'s

    def _repr_pretty_(self, p: display.PrettyPrinter, cycle: bool) -> None:
        p.text(display.column_head(self) if cycle else display.column_text(self))

    def _repr_html_(self) -> str:
        return display.column_html(self)


def read_rows(
    requests: Sequence[tuple[StepView, Any]], columns: Sequence[str], *, memo: ChunkMemo | None = None
) -> list[dict[str, Any]]:
    """Chosen rows of several columns of several steps, read together: for each ``(view,
    rows)`` (row numbers in any order, repeats allowed, negative ones from the end; a slice or a
    boolean mask; one int is read as ``[i]``), ``{name: view[name][rows]}`` for each of
    ``columns``, the same values.

    Every column of every step is read in the same rounds (:func:`reads.read_rounds`): the
    dense rows, the lengths of jagged columns and the codes of dictionary-encoded ones in one
    round of requests, the values in a second; each chunk is fetched and decoded once, however
    many rows and columns lie in it. Views of another cache's storage are read in rounds of
    their own. ``memo``: small decoded chunks kept across calls (:mod:`zarr_skip.store.memo`),
    copied from there instead of fetched and decoded again.
    """
    readers: dict[int, tuple[Storage, list[Reader]]] = {}
    for view, rows in requests:
        n = len(view)
        idx = args.rows(rows, n, "rows", f"step {view.step}", none=False)
        if isinstance(idx, slice):
            idx = np.arange(*idx.indices(n), dtype=np.int64)
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        cols = [view[name] for name in columns]
        readers.setdefault(id(view._storage), (view._storage, []))[1].extend(col._reader(idx) for col in cols)
    got: dict[int, Iterator[Any]] = {
        key: iter(read_rounds(storage, found, memo=memo)) for key, (storage, found) in readers.items()
    }
    return [{name: next(got[id(view._storage)]) for name in columns} for view, _ in requests]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out
