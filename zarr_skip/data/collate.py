"""Batching items of the rollout datasets: jagged columns padded or nested.

A batch's tensors are views of one buffer (allocated in shared memory inside a DataLoader
worker, as torch's ``default_collate`` does), and the batch pickles that buffer once: a worker
hands the main process one shared-memory block per batch, not one per tensor (each costs a
file-descriptor transfer, which dominates an epoch of small tensors).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import get_worker_info

from zarr_skip.errors import ConfigError

__all__ = ["RolloutBatch", "collate_rollouts"]

#: each tensor of a batch starts at a multiple of this many bytes of the batch's buffer
ALIGN = 64

#: a planned output tensor: name, dtype, shape and what writes its values into a view
_Planned = tuple[str, torch.dtype, tuple[int, ...], Callable[[torch.Tensor], None]]


class RolloutBatch(dict[str, Any]):
    """A collated batch: a dict of columns (what :func:`collate_rollouts` returns).

    Pickling it (a DataLoader worker handing it to the main process) sends each distinct
    storage under its strided CPU tensors once, with each tensor's dtype, shape, strides and
    offset, and rebuilds the same views on the other side; other values pickle as usual.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        bases: list[torch.Tensor] = []
        where: dict[tuple[int, int], int] = {}
        views: dict[str, tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...], int]] = {}
        plain: dict[str, Any] = {}
        for name, value in self.items():
            if not _viewable(value):
                plain[name] = value
                continue
            storage = value.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in where:
                where[key] = len(bases)
                bases.append(torch.empty(0, dtype=torch.uint8).set_(storage))
            views[name] = (where[key], value.dtype, tuple(value.shape), value.stride(), value.storage_offset())
        return (_rebuild_batch, (bases, views, plain, list(self)))


def _viewable(value: Any) -> bool:
    return (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.requires_grad
    )


def _rebuild_batch(
    bases: list[torch.Tensor],
    views: dict[str, tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...], int]],
    plain: dict[str, Any],
    order: list[str],
) -> RolloutBatch:
    out = RolloutBatch()
    for name in order:
        if name in views:
            k, dtype, shape, stride, offset = views[name]
            out[name] = torch.empty(0, dtype=dtype).set_(bases[k].untyped_storage(), offset, shape, stride)
        else:
            out[name] = plain[name]
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
    """
    if jagged not in ("pad", "nested"):
        raise ConfigError(f"jagged={jagged!r}: choose 'pad' or 'nested'")
    out = RolloutBatch()
    if not items:
        return out
    planned: list[_Planned] = []
    for name in items[0]:
        values = [item[name] for item in items]
        first = values[0]
        if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in values):
            nested = _tensors(name, values, jagged, pad_value, planned)
            if nested is not None:
                out[name] = nested
        elif isinstance(first, int) and all(type(v) is int for v in values):
            planned.append((name, torch.int64, (len(values),), functools.partial(_write_ints, values)))
        else:
            out[name] = values
    views = _packed(planned)
    return RolloutBatch((name, views[name] if name in views else out[name]) for name in _order(items[0], planned))


def _order(first: dict[str, Any], planned: list[_Planned]) -> list[str]:
    """The batch's keys: the items' order, each jagged column's ``{name}_len`` after it."""
    names = {p[0] for p in planned}
    keys = []
    for name in first:
        keys.append(name)
        if f"{name}_len" in names and f"{name}_len" not in first:
            keys.append(f"{name}_len")
    return keys


def _tensors(
    name: str, values: list[torch.Tensor], jagged: str, pad_value: float, planned: list[_Planned]
) -> torch.Tensor | None:
    """Plan ``name``'s stacked or padded tensor (and its lengths); a NestedTensor is returned."""
    dtype = functools.reduce(torch.promote_types, (v.dtype for v in values))
    shape = values[0].shape
    if all(v.shape == shape for v in values):
        planned.append((name, dtype, (len(values), *shape), functools.partial(_write_stack, values)))
        return None
    if any(v.dim() == 0 or v.shape[1:] != shape[1:] for v in values):
        raise ConfigError(f"column {name!r}: rows differ beyond their first dimension; collate them yourself")
    if jagged == "nested":
        return torch.nested.nested_tensor(values, layout=torch.jagged)
    lengths = [len(v) for v in values]
    padded = (len(values), max(lengths), *shape[1:])
    planned.append((name, dtype, padded, functools.partial(_write_padded, values, lengths, pad_value)))
    planned.append((f"{name}_len", torch.int64, (len(values),), functools.partial(_write_ints, lengths)))
    return None


def _write_stack(values: list[torch.Tensor], out: torch.Tensor) -> None:
    torch.stack(values, out=out)


def _write_padded(values: list[torch.Tensor], lengths: list[int], pad_value: float, out: torch.Tensor) -> None:
    out.fill_(pad_value)
    for row, (value, n) in enumerate(zip(values, lengths, strict=True)):
        out[row, :n] = value


def _write_ints(values: list[int], out: torch.Tensor) -> None:
    out.copy_(torch.tensor(values, dtype=torch.int64))


def _packed(planned: list[_Planned]) -> dict[str, torch.Tensor]:
    """The planned tensors written into views of one buffer (shared memory in a DataLoader
    worker, whose batches go to the main process)."""
    if not planned:
        return {}
    starts, total = [], 0
    for _, dtype, shape, _ in planned:
        starts.append(total)
        nbytes = dtype.itemsize * _numel(shape)
        total += -(-nbytes // ALIGN) * ALIGN
    total = max(total, ALIGN)  # shared memory of no bytes cannot be mapped
    in_worker = get_worker_info() is not None
    storage = torch.UntypedStorage._new_shared(total) if in_worker else torch.UntypedStorage(total)
    out = {}
    for (name, dtype, shape, write), start in zip(planned, starts, strict=True):
        view = torch.empty(0, dtype=dtype).set_(storage, start // dtype.itemsize, shape, _contiguous(shape))
        write(view)
        out[name] = view
    return out


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
