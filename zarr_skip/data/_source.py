"""Where a dataset's rows come from: a picklable description of the cache, opened per process.

A :class:`RolloutSource` holds the location, experiment, steps, columns and storage options, and
opens the cache (and each step's lazy view) on first use in the process that reads: a worker of
a ``DataLoader`` or a Ray task gets a copy without open handles and opens the store itself.
Rows are read through the handle: :meth:`zarr_skip.Cache.load`, the
:class:`~zarr_skip.StepView` and its :class:`~zarr_skip.LazyColumn` slices, and
:func:`zarr_skip.lazy.read_rows` for chosen rows of many columns and steps at once, with a
per-process :class:`~zarr_skip.store.memo.ChunkMemo` of small decoded chunks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zarr_skip.cache import Cache, open_cache
from zarr_skip.errors import ColumnNotFoundError, ConfigError, StepNotFoundError
from zarr_skip.format import args, checks
from zarr_skip.format.specs import nested_rows
from zarr_skip.lazy import StepView, read_rows
from zarr_skip.store.memo import ChunkMemo

__all__ = ["Block", "RolloutSource", "as_item_value", "item_values", "split_rows", "split_values"]

#: the fields every item has before its columns
INDEX = ("step", "minibatch", "row")


@dataclass(frozen=True, slots=True)
class Block:
    """Contiguous rows ``[start, stop)`` of one mini-batch of a step (rows counted in the step)."""

    step: int
    minibatch: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


class RolloutSource:
    """The rows of the complete steps of one experiment, opened lazily in each process.

    Parameters
    ----------
    location : a path or an ``s3://`` URL (a zarr Store object does not travel to other processes).
    experiment : the experiment to read (default: the only one stored).
    steps : the steps to read (default: every complete step, at the time of the first use).
    columns : the columns of each row (default: every column of the first step).
    storage_options : for URLs: endpoint, credentials, ...
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        experiment: str | None = None,
        steps: int | Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(location, (str, os.PathLike)):
            raise ConfigError(
                f"location {location!r}: pass a path or an s3:// URL (with storage_options), not a store object: "
                "each DataLoader worker or Ray task opens the store itself"
            )
        text = os.fspath(location)
        # a relative path is the caller's: a process that starts elsewhere (a Ray worker) opens the same
        self.location = text if args.url_scheme(text) else os.path.abspath(os.path.expanduser(text))
        self.experiment = None if experiment is None else args.name(experiment, "experiment")
        options = checks.check_mapping(storage_options, "storage_options")
        self.storage_options = None if options is None else dict(options)
        self._steps = checks.check_steps(steps, one=True, unique=True)  # a step named twice is read once
        self._columns = args.columns(columns)
        self._cache: Cache | None = None
        self._pid = os.getpid()
        self._views: dict[int, StepView] = {}
        self._blocks: list[Block] | None = None
        self.memo = ChunkMemo()

    # -- pickling: the description travels, the open handles do not ---------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "experiment": self.experiment,
            "storage_options": self.storage_options,
            "_steps": self.steps,
            "_columns": self.columns,
            "_blocks": self.blocks(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cache = None
        self._pid = os.getpid()
        self._views = {}
        self.memo = ChunkMemo()

    # -- the cache and its steps ---------------------------------------------------------------

    @property
    def cache(self) -> Cache:
        if self._pid != os.getpid():  # a forked DataLoader worker
            if self._cache is None or not self._cache.storage.fork_safe:  # S3: open the store anew
                self._cache, self._views = None, {}
            self._pid = os.getpid()  # local files: the parent's cache and loaded steps go on serving
            self.memo = ChunkMemo()  # its lock may have been held by another thread at the fork
        if self._cache is None:
            self._cache = open_cache(self.location, experiment=self.experiment, storage_options=self.storage_options)
            if self.experiment is None:
                self.experiment = self._cache.experiment
        return self._cache

    @property
    def steps(self) -> list[int]:
        if self._steps is None:
            self._steps = self.cache.steps()
            if not self._steps:
                raise StepNotFoundError(
                    f"no complete steps in experiment {self.cache.experiment!r} at {self.location}: "
                    "write some, or pass steps="
                )
        return list(self._steps)

    def view(self, step: int) -> StepView:
        """The lazy view of ``step``, loaded once per process."""
        cache = self.cache  # first: a forked worker drops the parent's views
        if step not in self._views:
            self._views[step] = cache.load(step)
        return self._views[step]

    @property
    def columns(self) -> list[str]:
        if self._columns is None:
            steps = self.steps  # none when steps=[] was asked for: no rows, of no columns
            self._columns = self.view(steps[0]).columns if steps else []
        for name in self._columns:
            if name in INDEX:
                raise ConfigError(f"column {name!r}: the name is taken by the index fields {', '.join(INDEX)}")
        return list(self._columns)

    def blocks(self, block_rows: int | None = None) -> list[Block]:
        """Every step's mini-batches as blocks in order (each split into runs of at most
        ``block_rows`` rows when given), checking that each step has the columns asked for."""
        if self._blocks is None:
            found = []
            for step in self.steps:
                view = self.view(step)
                missing = [c for c in self.columns if c not in view]
                if missing:
                    raise ColumnNotFoundError(
                        f"step {step}: no column {', '.join(map(repr, missing))} at {self.location} "
                        f"(columns: {', '.join(view.columns)}); pass columns= that every step has"
                    )
                start = 0
                for index, mb in enumerate(view.minibatches):
                    found.append(Block(step, index, start, start + len(mb)))
                    start += len(mb)
            self._blocks = found
        if block_rows is None:
            return list(self._blocks)
        return [piece for b in self._blocks for piece in _pieces(b, block_rows)]

    # -- reading rows ----------------------------------------------------------------------------

    def read_columns(self, block: Block) -> dict[str, Any]:
        """``block``'s rows of each column as read (NestedTensor, tensor, array or list): each
        column as one slice (its chunks once), or a whole mini-batch's columns in one batch of
        reads."""
        view = self.view(block.step)
        minibatch = view.minibatches[block.minibatch]
        if len(minibatch) == block.rows:  # a whole mini-batch: all its columns in one batch of reads
            return minibatch.to_dict(self.columns)
        return {name: view[name][block.start : block.stop] for name in self.columns}

    def take(self, requests: Sequence[tuple[int, np.ndarray, np.ndarray]]) -> list[list[dict[str, Any]]]:
        """The items of the rows of each ``(step, rows, minibatches)`` (rows counted in the step,
        in any order, repeats allowed; ``minibatches``: each one's mini-batch), in that order:
        every column of every step read together (:func:`zarr_skip.lazy.read_rows`), so each
        chunk is fetched and decoded once, in two rounds of requests; small chunks decoded
        once in this process (lengths, codes, dense per-row columns) are copied from
        :attr:`memo` (:mod:`zarr_skip.store.memo`, at most 16 MiB)."""
        names = ["step", "minibatch", "row", *self.columns]
        got = read_rows([(self.view(step), rows) for step, rows, _ in requests], self.columns, memo=self.memo)
        out = []
        for (step, rows, minibatches), read in zip(requests, got, strict=True):
            columns = [item_values(split_rows(read[name])) for name in self.columns]
            per_row = zip(minibatches.tolist(), rows.tolist(), *columns, strict=True)
            out.append([dict(zip(names, (step, *values), strict=True)) for values in per_row])
        return out

    def item(self, block: Block, row: int) -> dict[str, Any]:
        """The item of one row (counted in the step) of ``block``: that row of each column, all
        of them read together (two rounds of requests, not two per column)."""
        return self.take([(block.step, np.array([row], dtype=np.int64), np.array([block.minibatch]))])[0][0]


def _pieces(block: Block, size: int) -> list[Block]:
    if size < 1:
        raise ConfigError(f"block_rows={size}: give a positive number of rows")
    return [
        Block(block.step, block.minibatch, s, min(s + size, block.stop)) for s in range(block.start, block.stop, size)
    ]


def split_rows(value: Any) -> list[Any]:
    """A column slice (NestedTensor, tensor, array or list) as a list of its rows (a jagged
    NestedTensor's rows as views of its values, made in one call)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return nested_rows(value)
        return list(value.detach().unbind(0))
    if isinstance(value, np.ndarray):
        return list(value) if value.dtype != object else value.tolist()
    return list(value)


def split_values(values: torch.Tensor, offsets: list[int]) -> list[torch.Tensor]:
    """The rows of jagged ``values``, row ``i`` being ``values[offsets[i]:offsets[i + 1]]``, as
    views made in one call."""
    lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    return list(torch.split(values.narrow(0, offsets[0], offsets[-1] - offsets[0]), lengths))


#: the types of rows :func:`as_item_value` gives as they are (what JSON and strings read as)
_AS_THEY_ARE = frozenset((torch.Tensor, str, dict, list, int, float, bool, type(None), bytes))


def item_values(rows: list[Any]) -> list[Any]:
    """:func:`as_item_value` of each row (tensors, strings and JSON values, the common cases,
    as they are)."""
    if _AS_THEY_ARE.issuperset(map(type, rows)):
        return rows
    return [as_item_value(r) for r in rows]


def as_item_value(value: Any) -> Any:
    """One row of a column as an item holds it: numeric rows as tensors, objects as Python values."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.dtype != np.uint64:
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        if value.dtype.kind in "biuf":
            return torch.from_numpy(np.asarray(value).copy())
        return value.item()
    return value
