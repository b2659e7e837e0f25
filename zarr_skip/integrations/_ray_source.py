"""The Ray Data datasource behind :func:`zarr_skip.integrations.ray.read_rollouts` (imports ray)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from ray.data.block import BlockAccessor, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from zarr_skip.data._source import Block, RolloutSource, split_rows

__all__ = ["RolloutDatasource", "block_columns"]


class RolloutDatasource(Datasource):
    """One read task per mini-batch, or per run of consecutive mini-batches when Ray asks for
    fewer tasks than there are mini-batches."""

    def __init__(self, source: RolloutSource) -> None:
        self.source = source

    def get_name(self) -> str:
        return "ZarrSkipRollouts"

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        blocks = self.source.blocks()
        count = max(1, min(len(blocks), parallelism if parallelism > 0 else len(blocks)))
        groups = [blocks[len(blocks) * k // count : len(blocks) * (k + 1) // count] for k in range(count)]
        tasks = []
        for group in groups:
            meta = BlockMetadata(
                num_rows=sum(b.rows for b in group), size_bytes=None, input_files=None, exec_stats=None
            )
            limit = {} if per_task_row_limit is None else {"per_task_row_limit": per_task_row_limit}
            tasks.append(ReadTask(_reader(self.source, group), meta, **limit))
        return tasks


def _reader(source: RolloutSource, group: list[Block]) -> Any:
    def read() -> Iterator[Any]:
        for block in group:
            yield BlockAccessor.batch_to_block(block_columns(source, block))

    return read


def block_columns(source: RolloutSource, block: Block) -> dict[str, np.ndarray]:
    """The rows of ``block`` (a whole mini-batch) as numpy columns: the index, then each column (jagged and dense
    rows as arrays, an object array of them when their shapes differ; objects as Python values)."""
    view = source.view(block.step)
    n = block.rows
    out: dict[str, np.ndarray] = {
        "step": np.full(n, block.step, dtype=np.int64),
        "minibatch": np.full(n, block.minibatch, dtype=np.int64),
        "row": np.arange(block.start, block.stop, dtype=np.int64),
    }
    # a block is a whole mini-batch here: all its columns fetched in one batch of reads
    values = view.minibatches[block.minibatch].to_dict(source.columns)
    for name, value in values.items():
        if isinstance(value, torch.Tensor) and not value.is_nested:
            out[name] = _numpy(value)
        elif isinstance(value, np.ndarray) and value.dtype != object:
            out[name] = value
        else:
            rows = [_numpy(r) if isinstance(r, torch.Tensor) else r for r in split_rows(value)]
            column = np.empty(n, dtype=object)
            for i, r in enumerate(rows):  # one by one: a list of equal-length arrays would broadcast
                column[i] = r
            out[name] = column
    return out


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16
        t = t.float()
    return t.contiguous().numpy()
