"""Batches cut straight from decoded blocks: each batch's rows gathered column by column.

What :class:`~zarr_skip.data.RolloutIterableDataset` yields when given a ``batch_size``: the
batches that :func:`~zarr_skip.data.collate_rollouts` would make of its items, ``batch_size``
items at a time, without making the items. A block's columns are read as one slice each (a
:class:`Segment`); a batch is the rows it takes of one or two segments (``runs``), and each of
its columns is gathered from those rows at once: a dense column with one ``index_select``, a
jagged one (the values and offsets of a NestedTensor) by copying the values of its rows into the
padded, stacked or nested tensor. Columns of other kinds (strings, JSON, a column whose kind or
trailing shape differs between the segments of one batch) are cut into rows and collated as
:func:`collate_rollouts` does. The batch is one buffer, in shared memory in a DataLoader worker.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from zarr_skip.data._source import INDEX, Block, item_values, split_rows, split_values
from zarr_skip.data.collate import (
    OFFSETS,
    Planned,
    RolloutBatch,
    RowItem,
    assemble,
    check_pad,
    plan_values,
    zero_bits,
)
from zarr_skip.format.specs import jagged_parts, torch_numpy, uint_of_size

__all__ = ["Dense", "Jagged", "Segment", "cut", "items", "join", "joins_as_they_are", "make_batch", "segment", "spread"]


@dataclass(frozen=True, slots=True)
class Dense:
    """A column whose rows are slices of one strided tensor (``rows`` first)."""

    tensor: torch.Tensor


@dataclass(frozen=True, slots=True)
class Jagged:
    """A jagged column: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: torch.Tensor
    offsets: np.ndarray

    def lengths(self, idx: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.offsets[idx + 1] - self.offsets[idx]
        return out


#: a segment's column: gathered whole (Dense, Jagged) or as a list of its rows' item values
Column = Dense | Jagged | list[Any]


@dataclass(slots=True)
class Segment:
    """Rows read together: ``index`` (each row's ``step``, ``minibatch`` and ``row``) and the
    ``columns``, each as a :data:`Column`."""

    index: dict[str, np.ndarray]
    columns: dict[str, Column]
    rows_of: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.index["row"])

    def items_of(self, name: str) -> list[Any]:
        """Column ``name`` as the items' values of its rows (what the per-row path holds)."""
        if name not in self.rows_of:
            self.rows_of[name] = _item_rows(self.columns[name])
        return self.rows_of[name]

    def batch(self, runs: list[Run], jagged: str, pad_value: float) -> RolloutBatch:
        """The batch of ``runs`` (rows of this segment and others of the same columns), as
        ``collate_rollouts`` makes it of their items (:func:`make_batch`)."""
        return make_batch(runs, list(self.columns), jagged, pad_value)


def items(seg: Segment) -> list[RowItem]:
    """The items of ``seg``'s rows (``step``, ``minibatch``, ``row``, then each column's value
    of the row), each knowing its place in ``seg``, so that ``collate_rollouts`` gathers their
    batch from ``seg`` (:class:`~zarr_skip.data.collate.RowItem`)."""
    names = [*INDEX, *seg.columns]
    columns = [seg.index[name].tolist() for name in INDEX] + [seg.items_of(name) for name in seg.columns]
    out = []
    for i, values in enumerate(zip(*columns, strict=True)):
        item = RowItem(zip(names, values, strict=True))
        item.origin = (seg, i)
        out.append(item)
    return out


def segment(block: Block, read: dict[str, Any]) -> Segment:
    """The segment of ``block``'s rows from its columns as read."""
    n = block.rows
    index = {
        "step": np.full(n, block.step, dtype=np.int64),
        "minibatch": np.full(n, block.minibatch, dtype=np.int64),
        "row": np.arange(block.start, block.stop, dtype=np.int64),
    }
    return Segment(index, {name: _column(value) for name, value in read.items()})


def _column(value: Any) -> Column:
    """A column slice as read, as a :data:`Column` (rows as the per-row path makes them)."""
    parts = jagged_parts(value)
    if parts is not None:
        return Jagged(parts[0].detach(), parts[1].numpy())
    if isinstance(value, torch.Tensor) and not value.is_nested and value.layout == torch.strided and value.dim() >= 1:
        return Dense(value.detach())
    if isinstance(value, np.ndarray) and value.ndim >= 1 and value.dtype.kind in "biuf" and value.dtype != np.uint64:
        return Dense(torch.from_numpy(np.ascontiguousarray(value)))
    return item_values(split_rows(value))


def _item_rows(column: Column) -> list[Any]:
    if isinstance(column, Dense):
        return list(column.tensor.unbind(0))
    if isinstance(column, Jagged):
        return split_values(column.values, column.offsets.tolist())
    return column


def joins_as_they_are(segments: Sequence[Segment]) -> bool:
    """Whether :func:`join` of ``segments`` keeps each column's kind and dtype, so that the
    items of the joined rows equal those of each segment (a tensor column whose dtype differs
    between segments is joined promoted)."""
    return all(len({_kind(s.columns[name]) for s in segments}) == 1 for name in segments[0].columns)


def _kind(column: Column) -> tuple[str, torch.dtype | None]:
    if isinstance(column, Dense):
        return "dense", column.tensor.dtype
    if isinstance(column, Jagged):
        return "jagged", column.values.dtype
    return "rows", None


def join(segments: Sequence[Segment]) -> Segment:
    """One segment of ``segments``' rows in order (a shuffle buffer of several blocks)."""
    if len(segments) == 1:
        return segments[0]
    index = {name: np.concatenate([s.index[name] for s in segments]) for name in INDEX}
    columns: dict[str, Column] = {}
    for name in segments[0].columns:
        parts = [s.columns[name] for s in segments]
        dense, jagged = _dense(parts), _jagged(parts)
        if dense is not None:
            columns[name] = Dense(torch.cat(dense))
        elif jagged is not None:
            columns[name] = _join_jagged(jagged)
        else:
            columns[name] = [row for s in segments for row in s.items_of(name)]
    return Segment(index, columns)


def _dense(parts: list[Column]) -> list[torch.Tensor] | None:
    """The tensors of ``parts`` when all are dense with rows of one shape, else None."""
    tensors = [p.tensor for p in parts if isinstance(p, Dense)]
    return tensors if len(tensors) == len(parts) and _same_trailing(tensors) else None


def _jagged(parts: list[Column]) -> list[Jagged] | None:
    """``parts`` when all are jagged with values of one trailing shape, else None."""
    jagged = [p for p in parts if isinstance(p, Jagged)]
    return jagged if len(jagged) == len(parts) and _same_trailing(p.values for p in jagged) else None


def _same_trailing(tensors: Iterable[torch.Tensor]) -> bool:
    return len({tuple(t.shape[1:]) for t in tensors}) == 1


def _join_jagged(parts: list[Jagged]) -> Jagged:
    values = torch.cat([p.values[int(p.offsets[0]) : int(p.offsets[-1])] for p in parts])
    lengths = np.concatenate([np.diff(p.offsets) for p in parts])
    return Jagged(values, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


#: a run of a batch: rows ``idx`` of a segment, in the batch's order
Run = tuple[Segment, np.ndarray]


def spread(segments: Sequence[Segment], order: np.ndarray) -> Iterator[Run]:
    """The runs of ``order`` (rows of ``segments`` counted in turn, as if joined) in their own
    segments: each stretch of consecutive rows of one segment as one run."""
    if not len(order):
        return
    starts = np.cumsum([0, *(s.rows for s in segments)])
    which = np.searchsorted(starts, order, side="right") - 1
    edges = [0, *(np.flatnonzero(np.diff(which)) + 1).tolist(), len(order)]
    for lo, hi in zip(edges, edges[1:], strict=False):
        k = int(which[lo])
        yield segments[k], order[lo:hi] - starts[k]


def cut(orders: Iterable[Run], size: int, drop_last: bool) -> Iterator[list[Run]]:
    """The runs of each batch of ``size`` rows, taking the rows of each ``(segment, order)`` in
    turn (a batch may end one segment and begin the next); the last, shorter batch too unless
    ``drop_last``."""
    pending: list[Run] = []
    count = 0
    for seg, order in orders:
        pos = 0
        while pos < len(order):
            take = min(size - count, len(order) - pos)
            pending.append((seg, order[pos : pos + take]))
            count, pos = count + take, pos + take
            if count == size:
                yield pending
                pending, count = [], 0
    if pending and not drop_last:
        yield pending


def make_batch(runs: list[Run], names: list[str], jagged: str, pad_value: float) -> RolloutBatch:
    """The batch of the rows of ``runs``: what ``collate_rollouts`` makes of their items."""
    rows = sum(len(idx) for _, idx in runs)
    planned: list[Planned] = []
    lists: dict[str, list[Any]] = {}
    for name in INDEX:
        index = np.concatenate([seg.index[name][idx] for seg, idx in runs])
        planned.append((name, torch.int64, (rows,), functools.partial(_write_array, index)))
    for name in names:
        parts = [seg.columns[name] for seg, _ in runs]
        dense, jagged_parts = _dense(parts), _jagged(parts)
        idxs = [idx for _, idx in runs]
        if dense is not None:
            _plan_dense(name, list(zip(dense, idxs, strict=True)), planned)
        elif jagged_parts is not None:
            _plan_jagged(name, list(zip(jagged_parts, idxs, strict=True)), jagged, pad_value, planned)
        else:
            values = [row for seg, idx in runs for row in map(seg.items_of(name).__getitem__, idx.tolist())]
            plan_values(name, values, jagged, pad_value, planned, lists)
    return assemble([*INDEX, *names], planned, lists)


def _dtype(tensors: Iterable[torch.Tensor]) -> torch.dtype:
    return functools.reduce(torch.promote_types, (t.dtype for t in tensors))


def _plan_dense(name: str, sources: list[tuple[torch.Tensor, np.ndarray]], planned: list[Planned]) -> None:
    rows = sum(len(idx) for _, idx in sources)
    shape = (rows, *sources[0][0].shape[1:])
    planned.append((name, _dtype(t for t, _ in sources), shape, functools.partial(_write_dense, sources)))


def _write_dense(sources: list[tuple[torch.Tensor, np.ndarray]], out: torch.Tensor, _zeros: bool) -> None:
    at = 0
    for tensor, idx in sources:
        part = out.narrow(0, at, len(idx))
        rows = torch.from_numpy(idx)
        if tensor.dtype == out.dtype:
            torch.index_select(tensor, 0, rows, out=part)
        else:
            part.copy_(tensor.index_select(0, rows))
        at += len(idx)


def _plan_jagged(
    name: str,
    sources: list[tuple[Jagged, np.ndarray]],
    jagged: str,
    pad_value: float,
    planned: list[Planned],
) -> None:
    """Plan ``name``'s rows as ``collate_rollouts`` would: stacked when their lengths agree,
    else padded (with ``{name}_len``) or nested (values, then offsets)."""
    lengths = np.concatenate([col.lengths(idx) for col, idx in sources])
    dtype = _dtype(col.values for col, _ in sources)
    trailing = tuple(sources[0][0].values.shape[1:])
    rows, longest = len(lengths), int(lengths.max())
    if jagged == "nested" and int(lengths.min()) != longest:
        write = functools.partial(_write_nested, sources)
        planned.append((name, dtype, (int(lengths.sum()), *trailing), write))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        planned.append((OFFSETS.format(name), torch.int64, (rows + 1,), functools.partial(_write_array, offsets)))
        return
    if int(lengths.min()) != longest:
        check_pad(name, pad_value, dtype)
    write = functools.partial(_write_padded, sources, pad_value if int(lengths.min()) != longest else None)
    planned.append((name, dtype, (rows, longest, *trailing), write))
    if int(lengths.min()) != longest:
        planned.append((f"{name}_len", torch.int64, (rows,), functools.partial(_write_array, lengths)))


def _values_of(col: Jagged, idx: np.ndarray) -> torch.Tensor:
    """The values of rows ``idx`` of ``col`` in that order (a view when they lie in order)."""
    starts = col.offsets[idx]
    lengths = col.offsets[idx + 1] - starts
    total = int(lengths.sum())
    if len(idx) and int(starts[0]) + total == int(col.offsets[idx[-1] + 1]) and bool(np.all(np.diff(idx) == 1)):
        return col.values.narrow(0, int(starts[0]), total)
    return col.values.index_select(0, torch.from_numpy(_spread(starts, lengths)))


def _spread(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorised."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    out: np.ndarray = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    return out


def _write_nested(sources: list[tuple[Jagged, np.ndarray]], out: torch.Tensor, _zeros: bool) -> None:
    at = 0
    for col, idx in sources:
        values = _values_of(col, idx)
        out.narrow(0, at, len(values)).copy_(values)
        at += len(values)


def _write_padded(
    sources: list[tuple[Jagged, np.ndarray]], pad_value: float | None, out: torch.Tensor, zeros: bool
) -> None:
    """The rows at the start of each row of ``out``, over ``pad_value`` (None: the rows fill
    ``out``); a zero padding is not written where ``out`` reads as ``zeros``."""
    if pad_value is not None and zeros and zero_bits(pad_value, out.dtype):
        pad_value = None  # the padding is there
    if all(col.values.dtype == out.dtype for col, _ in sources):
        _copy_rows(sources, pad_value, out)
        return
    if pad_value is not None:
        out.fill_(pad_value)
    longest = out.shape[1]
    flat = out.view(out.shape[0] * longest, *out.shape[2:])
    row = 0
    for col, idx in sources:
        if len(idx):
            where = _spread(np.arange(row, row + len(idx), dtype=np.int64) * longest, col.lengths(idx))
            flat.index_copy_(0, torch.from_numpy(where), _values_of(col, idx).to(out.dtype))
        row += len(idx)


def _copy_rows(sources: list[tuple[Jagged, np.ndarray]], pad_value: float | None, out: torch.Tensor) -> None:
    """:func:`_write_padded` of values of ``out``'s dtype: each row copied and padded in turn
    through numpy (a row costs a microsecond; scattering by index costs 4x as much a batch, and
    filling first writes the buffer twice)."""
    dst = _bits(out)
    pad = None if pad_value is None else _bits(torch.empty(1, dtype=out.dtype).fill_(pad_value))[0]
    row = 0
    for col, idx in sources:
        src = _bits(col.values)
        for start, stop in zip(col.offsets[idx].tolist(), col.offsets[idx + 1].tolist(), strict=True):
            dst[row, : stop - start] = src[start:stop]
            if pad is not None:
                dst[row, stop - start :] = pad
            row += 1


def _bits(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a numpy array over its memory, never a copy (dtypes numpy lacks as the
    unsigned integers of their width, as they are stored)."""
    if tensor.dtype in torch_numpy():
        return tensor.numpy()
    return tensor.view(uint_of_size()[tensor.element_size()]).numpy()


def _write_array(values: np.ndarray, out: torch.Tensor, _zeros: bool) -> None:
    out.copy_(torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)))
