"""Batching items of the rollout datasets: jagged columns padded or nested.

A batch's tensors are views of one buffer (in shared memory inside a DataLoader worker, as
torch's ``default_collate`` does), and the batch pickles that buffer once: a worker hands the
main process one shared-memory block per batch, not one per tensor (each costs a
file-descriptor transfer, which dominates an epoch of small tensors). The worker reuses that
memory once the main process drops the batch (:mod:`zarr_skip.data._shm`); a buffer new to the
worker reads as zeros, so a zero padding is not written there: the pages of padding alone are
never touched (each page a worker writes first costs it a page fault).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch.utils.data import get_worker_info

from zarr_skip.data._shm import Lent, lend, lender
from zarr_skip.errors import ConfigError, ConfigTypeError
from zarr_skip.format import args
from zarr_skip.format.specs import SharedOffsets, jagged_parts

__all__ = ["RolloutBatch", "RowItem", "collate_rollouts"]

#: each tensor of a batch starts at a multiple of this many bytes of the batch's buffer
ALIGN = 64

#: a planned output tensor: name, dtype, shape and what writes its values into a view (told
#: whether the view reads as zeros)
Planned = tuple[str, torch.dtype, tuple[int, ...], Callable[[torch.Tensor, bool], None]]


#: where a tensor lies: its base's index, dtype, shape, strides and offset (in elements)
_View = tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...], int]
#: the key under which a nested column's offsets are planned (a name no column has)
OFFSETS = "{}\x00offsets"


class RolloutBatch(dict[str, Any]):
    """A collated batch: a dict of columns (what :func:`collate_rollouts` returns).

    Pickling it (a DataLoader worker handing it to the main process) sends each distinct
    storage under its strided CPU tensors (and jagged NestedTensors' values and offsets) once,
    with where each tensor lies in it, and rebuilds the same views on the other side; other
    values pickle as usual.
    """

    def __copy__(self) -> RolloutBatch:
        """A new batch of the same values (what torch's ``default_convert`` makes in a worker);
        not through :meth:`__reduce__`, which lends a worker's buffers to the pickle."""
        return RolloutBatch(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> RolloutBatch:
        return RolloutBatch({name: copy.deepcopy(value, memo) for name, value in self.items()})

    def __reduce__(self) -> tuple[Any, ...]:
        bases: list[torch.Tensor | Lent] = []
        where: dict[tuple[int, int], int] = {}

        def view(t: torch.Tensor) -> _View:
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in where:
                where[key] = len(bases)
                lent = lend(storage)  # a worker's reused buffer (zarr_skip.data._shm)
                bases.append(lent if lent is not None else torch.empty(0, dtype=torch.uint8).set_(storage))
            return (where[key], t.dtype, tuple(t.shape), t.stride(), int(t.storage_offset()))

        views: dict[str, tuple[_View, ...]] = {}
        plain: dict[str, Any] = {}
        for name, value in self.items():
            if _viewable(value):
                views[name] = (view(value),)
            elif (parts := _plain_jagged(value)) is not None:
                views[name] = (view(parts[0]), view(parts[1]))
            else:
                plain[name] = value
        return (_rebuild_batch, (bases, views, plain, list(self)))


class Rows(Protocol):
    """The rows items were cut from (a block of :class:`~zarr_skip.data.RolloutIterableDataset`):
    it makes the batch of ``runs`` (each some of its rows, or another block's, in order) as
    :func:`collate_rollouts` makes it of their items."""

    def batch(self, runs: list[tuple[Any, np.ndarray]], jagged: str, pad_value: float) -> RolloutBatch: ...


#: the most runs (stretches of items cut from one block) a batch is gathered from by its
#: blocks; more (the shuffled items of blocks that could not be joined alternate between
#: them) cost more than the items
MAX_RUNS = 4


class RowItem(dict[str, Any]):
    """An item of :class:`~zarr_skip.data.RolloutIterableDataset`: a dict of its row's columns
    that also knows where its row lies (``origin``: the block's rows and the row's place in
    them). :func:`collate_rollouts` gathers a batch of such items from their blocks, column by
    column, as ``RolloutIterableDataset(batch_size=...)`` does, instead of from each item's
    values. Any change to the item (``item[k] = v``, ``del``, ``update``, ``pop``...) forgets
    its origin, so the batch is made of its values; it copies and pickles as a plain dict.
    While an item lives, so do the rows it was cut from (its block, or its shuffle buffer's
    blocks joined; its tensors are views of their values)."""

    __slots__ = ("origin",)

    origin: tuple[Rows, int] | None

    def __setitem__(self, key: str, value: Any) -> None:
        self.origin = None
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.origin = None
        super().__delitem__(key)

    def __ior__(self, other: Any) -> RowItem:  # type: ignore[override,misc]
        self.origin = None
        return super().__ior__(other)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.origin = None
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.origin = None
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self.origin = None
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, Any]:
        self.origin = None
        return super().popitem()

    def clear(self) -> None:
        self.origin = None
        super().clear()

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))

    def __copy__(self) -> dict[str, Any]:
        return dict(self)


def _runs(items: Sequence[Mapping[str, Any]]) -> list[tuple[Any, np.ndarray]] | None:
    """The runs of ``items`` (each a block's rows and the places of consecutive items cut from
    it) when every item is an untouched :class:`RowItem` and they make at most
    :data:`MAX_RUNS` runs; else None."""
    runs: list[tuple[Rows, list[int]]] = []
    for item in items:
        origin = getattr(item, "origin", None) if type(item) is RowItem else None
        if origin is None:
            return None
        rows, at = origin
        if runs and runs[-1][0] is rows:
            runs[-1][1].append(at)
        elif len(runs) < MAX_RUNS:
            runs.append((rows, [at]))
        else:
            return None
    return [(rows, np.array(at, dtype=np.int64)) for rows, at in runs]


def _viewable(value: Any) -> bool:
    return (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.requires_grad
    )


def _plain_jagged(value: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The values and offsets of a jagged NestedTensor without holes, ragged in dim 1, when
    both are plain tensors; else None."""
    parts = jagged_parts(value)
    if parts is None or value.requires_grad or not all(_viewable(t) for t in parts):
        return None
    return parts


def _rebuild_batch(
    bases: list[torch.Tensor], views: dict[str, tuple[_View, ...]], plain: dict[str, Any], order: list[str]
) -> RolloutBatch:
    def tensor(v: _View) -> torch.Tensor:
        k, dtype, shape, stride, offset = v
        return torch.empty(0, dtype=dtype).set_(bases[k].untyped_storage(), offset, shape, stride)

    out = RolloutBatch()
    shared = SharedOffsets()  # nested columns of equal rows on one offsets tensor, as they were sent
    for name in order:
        if name not in views:
            out[name] = plain[name]
        elif len(views[name]) == 1:
            out[name] = tensor(views[name][0])
        else:
            values, offsets = (tensor(v) for v in views[name])
            out[name] = shared.jagged(values, offsets)
    return out


def collate_rollouts(items: Sequence[dict[str, Any]], *, jagged: str = "pad", pad_value: float = 0) -> RolloutBatch:
    """A batch of dataset items: a dict of columns (a :class:`RolloutBatch`).

    Tensors of one shape are stacked; tensors whose first dimension differs between items
    (jagged columns) are padded at the end with ``pad_value`` to the longest, with their lengths
    in ``{name}_len`` (``jagged="pad"``), or made one jagged NestedTensor (``jagged="nested"``).
    ``step``, ``minibatch`` and ``row`` become int64 tensors; other values (strings, JSON) stay
    lists. Use as ``DataLoader(ds, batch_size=8, collate_fn=collate_rollouts)`` or, for nested,
    ``collate_fn=functools.partial(collate_rollouts, jagged="nested")``.

    The stacked and padded tensors are views of one buffer (see the module docstring).

    Untouched items of a :class:`~zarr_skip.data.RolloutIterableDataset` (:class:`RowItem`)
    are gathered from the blocks they were cut from, a column at a time, as the dataset's own
    batches are, when a batch's items come from at most :data:`MAX_RUNS` stretches of blocks
    (in stored order a batch spans one block or two, unless the blocks are smaller than the
    batch): the same batch as from their values, made faster.

    A :class:`RolloutBatch` is returned as it is: what a ``DataLoader(batch_size=None)`` over a
    dataset that yields batches (``RolloutIterableDataset(batch_size=...)``) hands each one, so
    ``collate_fn=collate_rollouts`` serves both (torch's default there walks every value of
    every row).
    """
    if isinstance(items, RolloutBatch):
        return items
    check_jagged(jagged, pad_value)
    _check_items(items)
    if not items:
        return RolloutBatch()
    runs = _runs(items)
    if runs is not None:  # untouched items of a RolloutIterableDataset: gathered from their blocks
        return cast("Rows", runs[0][0]).batch(runs, jagged, pad_value)
    planned: list[Planned] = []
    lists: dict[str, list[Any]] = {}
    for name in items[0]:
        plan_values(name, [item[name] for item in items], jagged, pad_value, planned, lists)
    return assemble(list(items[0]), planned, lists)


def _check_items(items: Any) -> None:
    """ConfigTypeError unless ``items`` is a sequence of dicts; ConfigError naming the first item
    whose keys differ from the first one's."""
    if isinstance(items, Mapping) or not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise ConfigTypeError(
            f"collate_rollouts: takes a list of items (dicts of columns), got a {type(items).__name__}; "
            "a dataset that yields whole batches needs DataLoader(batch_size=None) and a RolloutBatch"
        )
    keys = None
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ConfigTypeError(f"collate_rollouts: item {i} is a {type(item).__name__}, not a dict of columns")
        if isinstance(item, RolloutBatch):
            raise ConfigError(
                f"collate_rollouts: item {i} is a whole batch (a dataset made with batch_size=...): "
                "load it with DataLoader(ds, batch_size=None, collate_fn=collate_rollouts), not in batches of batches"
            )
        if keys is None:
            keys = item.keys()
        elif item.keys() != keys:
            diff = sorted(set(keys) ^ set(item.keys()))
            raise ConfigError(f"collate_rollouts: item {i} has other columns than item 0 (differing: {diff})")


def check_jagged(jagged: str, pad_value: float = 0) -> None:
    """ConfigError unless ``jagged`` is 'pad' or 'nested'; ConfigTypeError unless ``pad_value``
    is a number."""
    if jagged not in ("pad", "nested"):
        raise ConfigError(f"jagged={jagged!r}: choose 'pad' or 'nested'")
    args.number(pad_value, "pad_value")


def plan_values(
    name: str,
    values: list[Any],
    jagged: str,
    pad_value: float,
    planned: list[Planned],
    lists: dict[str, list[Any]],
) -> None:
    """Plan column ``name`` of a batch from its rows ``values`` (tensors stacked, padded or
    nested; Python ints as an int64 tensor when they all fit one), or keep them as a list in
    ``lists``."""
    first = values[0]
    if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in values):
        _tensors(name, values, jagged, pad_value, planned)
    elif isinstance(first, int) and all(type(v) is int for v in values) and _int64(values):
        planned.append((name, torch.int64, (len(values),), functools.partial(_write_ints, values)))
    else:
        lists[name] = values


def _int64(values: list[int]) -> bool:
    """Whether every one of ``values`` fits an int64 (a hash above 2**63 stays a Python int)."""
    return -(1 << 63) <= min(values) and max(values) < 1 << 63


def assemble(names: list[str], planned: list[Planned], lists: dict[str, list[Any]]) -> RolloutBatch:
    """The batch of columns ``names``: the ``planned`` tensors written into one buffer (nested
    columns made of their values and offsets), the other columns from ``lists``."""
    views = _packed(planned)
    shared = SharedOffsets()  # nested columns of equal rows on one offsets tensor
    for name in names:
        if OFFSETS.format(name) in views:
            views[name] = shared.jagged(views[name], views.pop(OFFSETS.format(name)))
    return RolloutBatch((name, views[name] if name in views else lists[name]) for name in _order(names, planned))


def _order(first: list[str], planned: list[Planned]) -> list[str]:
    """The batch's keys: the items' order, each jagged column's ``{name}_len`` after it."""
    names = {p[0] for p in planned}
    keys = []
    for name in first:
        keys.append(name)
        if f"{name}_len" in names and f"{name}_len" not in first:
            keys.append(f"{name}_len")
    return keys


def _tensors(name: str, values: list[torch.Tensor], jagged: str, pad_value: float, planned: list[Planned]) -> None:
    """Plan ``name``'s stacked, padded (and its lengths) or nested (its values and offsets) tensor."""
    dtypes = {v.dtype for v in values}
    dtype = dtypes.pop() if len(dtypes) == 1 else functools.reduce(torch.promote_types, (v.dtype for v in values))
    shapes = [v.shape for v in values]
    shape = shapes[0]
    if all(s == shape for s in shapes):
        planned.append((name, dtype, (len(values), *shape), functools.partial(_write_stack, values)))
        return
    if any(len(s) != len(shape) for s in shapes) or (len(shape) > 1 and any(s[1:] != shape[1:] for s in shapes)):
        raise ConfigError(f"column {name!r}: rows differ beyond their first dimension; collate them yourself")
    lengths = [s[0] for s in shapes]
    if jagged == "nested":
        total = (sum(lengths), *shape[1:])
        planned.append((name, dtype, total, functools.partial(_write_cat, values)))
        planned.append(
            (OFFSETS.format(name), torch.int64, (len(values) + 1,), functools.partial(_write_offsets, lengths))
        )
        return
    check_pad(name, pad_value, dtype)
    padded = (len(values), max(lengths), *shape[1:])
    planned.append((name, dtype, padded, functools.partial(_write_padded, values, lengths, pad_value)))
    planned.append((f"{name}_len", torch.int64, (len(values),), functools.partial(_write_ints, lengths)))


def _write_stack(values: list[torch.Tensor], out: torch.Tensor, _zeros: bool) -> None:
    torch.stack(values, out=out)


def _write_padded(
    values: list[torch.Tensor], lengths: list[int], pad_value: float, out: torch.Tensor, zeros: bool
) -> None:
    """The rows over ``pad_value``; when ``out`` reads as ``zeros`` (new shared memory) and the
    padding is all zero bits, the padding is not written: pages of padding alone stay untouched
    (in a worker, each page first written costs a page fault: half of a padded batch's pages)."""
    if not (zeros and zero_bits(pad_value, out.dtype)):
        out.fill_(pad_value)  # then the rows: on fresh memory faster than row then padding, even through numpy
    for row, (value, n) in enumerate(zip(values, lengths, strict=True)):
        out[row, :n] = value


def check_pad(name: str, pad_value: float, dtype: torch.dtype) -> None:
    """ConfigError unless ``pad_value`` can be written into column ``name``'s ``dtype`` (a NaN,
    an infinity or a value out of range in an integer or half-precision column: torch's bare
    RuntimeError while the batch was written; in an integer or bool column, a value it would
    change: -1 in uint8 wraps to 255, 2.5 in int64 is cut to 2, -100 in bool is True)."""
    if not _holds(pad_value, dtype):
        raise ConfigError(
            f"pad_value={pad_value!r}: column {name!r} holds {str(dtype).removeprefix('torch.')}, which cannot "
            "hold it; pass a pad_value that every padded column can hold, or jagged='nested'"
        )


@functools.lru_cache(maxsize=64)
def _holds(pad_value: float, dtype: torch.dtype) -> bool:
    """Whether ``fill_`` writes ``pad_value`` into ``dtype``, unchanged where ``dtype`` is exact
    (integers, bool); rounded where it is a float (asked once a batch per column)."""
    try:
        one = torch.empty(1, dtype=dtype).fill_(pad_value)
    except RuntimeError:
        return False
    return dtype.is_floating_point or dtype.is_complex or bool(one.item() == pad_value)


def zero_bits(value: float, dtype: torch.dtype) -> bool:
    """Whether ``value`` converted to ``dtype`` (as ``fill_`` converts, raising as it raises) is
    all zero bits (not ``-0.0``)."""
    one = torch.empty(1, dtype=dtype).fill_(value)
    return not bool(one.view(torch.uint8).any())


def _write_cat(values: list[torch.Tensor], out: torch.Tensor, _zeros: bool) -> None:
    torch.cat(values, out=out)


def _write_offsets(lengths: list[int], out: torch.Tensor, _zeros: bool) -> None:
    out[0] = 0
    torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0, out=out[1:])


def _write_ints(values: list[int], out: torch.Tensor, _zeros: bool) -> None:
    out.copy_(torch.tensor(values, dtype=torch.int64))


def _packed(planned: list[Planned]) -> dict[str, torch.Tensor]:
    """The planned tensors written into views of one buffer: in a DataLoader worker, whose
    batches go to the main process, shared memory that the worker reuses once the main process
    drops the batch (:mod:`zarr_skip.data._shm`)."""
    if not planned:
        return {}
    starts, total = [], 0
    for _, dtype, shape, _ in planned:
        starts.append(total)
        nbytes = dtype.itemsize * _numel(shape)
        total += -(-nbytes // ALIGN) * ALIGN
    total = max(total, ALIGN)  # shared memory of no bytes cannot be mapped
    in_worker = get_worker_info() is not None
    storage, zeros = lender().take(total) if in_worker else (_new_storage(total), False)
    out = {}
    for (name, dtype, shape, write), start in zip(planned, starts, strict=True):
        view = torch.empty(0, dtype=dtype).set_(storage, start // dtype.itemsize, shape, _contiguous(shape))
        write(view, zeros)
        out[name] = view
    return out


def _new_storage(nbytes: int) -> torch.UntypedStorage:
    return cast(Callable[[int], torch.UntypedStorage], torch.UntypedStorage)(nbytes)  # untyped in torch


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= max(1, s)
    return tuple(reversed(strides))
