"""Batching items of the rollout datasets: jagged columns padded or nested."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zarr_skip.errors import ConfigError

__all__ = ["collate_rollouts"]


def collate_rollouts(items: Sequence[dict[str, Any]], *, jagged: str = "pad", pad_value: float = 0) -> dict[str, Any]:
    """A batch of dataset items: a dict of columns.

    Tensors of one shape are stacked; tensors whose first dimension differs between items
    (jagged columns) are padded at the end with ``pad_value`` to the longest, with their lengths
    in ``{name}_len`` (``jagged="pad"``), or made one jagged NestedTensor (``jagged="nested"``).
    ``step``, ``minibatch`` and ``row`` become int64 tensors; other values (strings, JSON) stay
    lists. Use as ``DataLoader(ds, batch_size=8, collate_fn=collate_rollouts)`` or, for nested,
    ``collate_fn=functools.partial(collate_rollouts, jagged="nested")``.
    """
    if jagged not in ("pad", "nested"):
        raise ConfigError(f"jagged={jagged!r}: choose 'pad' or 'nested'")
    if not items:
        return {}
    out: dict[str, Any] = {}
    for name in items[0]:
        values = [item[name] for item in items]
        first = values[0]
        if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in values):
            out.update(_tensors(name, values, jagged, pad_value))
        elif isinstance(first, int) and all(type(v) is int for v in values):
            out[name] = torch.tensor(values, dtype=torch.int64)
        else:
            out[name] = values
    return out


def _tensors(name: str, values: list[torch.Tensor], jagged: str, pad_value: float) -> dict[str, Any]:
    if all(v.shape == values[0].shape for v in values):
        return {name: torch.stack(values)}
    if any(v.dim() == 0 or v.shape[1:] != values[0].shape[1:] for v in values):
        raise ConfigError(f"column {name!r}: rows differ beyond their first dimension; collate them yourself")
    if jagged == "nested":
        return {name: torch.nested.nested_tensor(values, layout=torch.jagged)}
    lengths = torch.tensor([len(v) for v in values], dtype=torch.int64)
    padded = torch.nn.utils.rnn.pad_sequence(values, batch_first=True, padding_value=pad_value)
    return {name: padded, f"{name}_len": lengths}
