"""Steps and caches as pandas tables: one row per rollout, reading only what the table shows.

A table has the columns ``step``, ``minibatch`` (the mini-batch index within the step) and
``row`` (the row within the step, as ``view[name][row]`` indexes it), then one per stored column:

- a per-row scalar (a 1-d tensor or numpy array): its values (torch dtypes numpy lacks, such
  as ``bfloat16``, as float32);
- strings and small JSON objects (at most :data:`SMALL_JSON` bytes per row on average, or any
  JSON column named in ``columns``): the values;
- a jagged column (token ids, log-probs, per-row arrays, pickles): its per-row lengths, under
  the column's own name; the values are never read.

Dense columns with more than one value per row (padded ``input_ids``, masks) are left out
(naming one in ``columns`` is an error: read it with ``view[name]``). Steps that lack a column
hold missing values there. Every step's chunks are fetched in one batch of requests.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ConfigError, MissingExtraError
from zarr_skip.format import args
from zarr_skip.format.arrays import as_numpy
from zarr_skip.store.reads import read_ranges
from zarr_skip.store.storage import Storage

if TYPE_CHECKING:
    import pandas

    from zarr_skip.lazy import LazyColumn, StepView

#: JSON columns averaging at most this many bytes per row are in a table by default
SMALL_JSON = 256
INDEX = ("step", "minibatch", "row")


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a table of many steps is built, as it was after
    (also after an error): the records of a thousand steps are hundreds of thousands of small
    containers, and collecting them again and again took a quarter of ``Cache.table``; what is
    built here forms no cycles to free meanwhile (reference counting frees the rest)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def pandas_module() -> Any:
    """pandas, or :class:`MissingExtraError` naming the extra that installs it."""
    try:
        import pandas
    except ImportError as exc:
        raise MissingExtraError("tables need pandas, which is not installed: pip install 'zarr-skip[pandas]'") from exc
    return pandas


def views_table(storage: Storage, views: Sequence[StepView], columns: Sequence[str] | None = None) -> pandas.DataFrame:
    """The rows of ``views`` as one DataFrame (see the module docstring), in view order."""
    pd = pandas_module()
    columns = args.columns(columns, dict.fromkeys(name for view in views for name in view.columns), where="table")
    chosen = [_chosen(view, columns) for view in views]
    wanted = [col._whole() if whole else col._lengths_ranges() for cols in chosen for col, whole in cols]
    got = iter(read_ranges(storage, [r for ranges in wanted for r in ranges]))
    stored = iter([[next(got) for _ in ranges] for ranges in wanted])  # the arrays of each column
    frames: dict[tuple[str, ...], list[dict[str, np.ndarray]]] = {}
    for view, cols in zip(views, chosen, strict=True):
        rows = len(view)
        frame = {
            "step": np.full(rows, view.step, dtype=np.int64),
            "minibatch": np.repeat([p.index for p in view.parts], [p.rows for p in view.parts]).astype(np.int64),
            "row": np.arange(rows, dtype=np.int64),
        }
        for col, whole in cols:
            frame[col.name] = _column(col, whole, stored)
        frames.setdefault(tuple(frame), []).append(frame)
    order = list(INDEX) + (list(columns) if columns is not None else _first_seen(list(frames)))
    tables = [
        pd.DataFrame({name: np.concatenate([f[name] for f in group]) for name in names}, copy=False)
        for names, group in frames.items()
    ]
    if not tables:
        return pd.DataFrame({name: np.empty(0, np.int64) for name in INDEX})
    if len(tables) == 1:
        return tables[0][[n for n in order if n in tables[0]]]
    table = pd.concat(tables, ignore_index=True).sort_values(["step", "row"], kind="stable", ignore_index=True)
    return table[[n for n in order if n in table]]


def _chosen(view: StepView, columns: Sequence[str] | None) -> list[tuple[LazyColumn, bool]]:
    """The columns of ``view`` a table shows, each with whether its values are read (or only
    its lengths)."""
    out = []
    for name in view.columns if columns is None else [n for n in columns if n in view]:
        col = view[name]
        spec = col.spec
        if spec.kind in ("tensor", "ndarray"):
            if spec.shape == ():
                out.append((col, True))
            elif columns is not None:
                raise ConfigError(
                    f"step {view.step}, column {name!r}: holds {spec.shape} values per row, too many for a "
                    f"table cell; read it with view[{name!r}]"
                )
        elif spec.kind == "str" or (spec.kind == "json" and (columns is not None or _small(col))):
            out.append((col, True))
        elif spec.kind != "json":
            out.append((col, False))
    return out


def _small(col: LazyColumn) -> bool:
    values = sum(p["values"].rows for p in col._parts)
    return values <= SMALL_JSON * max(1, len(col))


def _column(col: LazyColumn, whole: bool, stored: Any) -> np.ndarray:
    """The table column of ``col`` from the next column's arrays of ``stored``."""
    arrays = next(stored)
    if not whole:
        return np.asarray(col._lengths_of(arrays))
    return as_numpy(col.spec, col._stored(arrays), plain=col._plain)


def _first_seen(groups: list[tuple[str, ...]]) -> list[str]:
    return list(dict.fromkeys(n for names in groups for n in names if n not in INDEX))
