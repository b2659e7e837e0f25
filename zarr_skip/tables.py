"""Steps and caches as pandas tables: one row per rollout, reading only what the table shows.

A table's columns are named as in :mod:`zarr_skip.views.schema`, the one "row per rollout"
schema the exports share:

- ``step``, ``minibatch`` (the mini-batch index within the step), ``row`` (the row within the
  step, as ``view[name][row]`` indexes it);
- the rollout fields whose sources the step holds: ``uid``, ``data_source``,
  ``prompt_length``, ``response_length``, ``truncated``, ``score``, ``reward``, ``acc``,
  ``advantage`` (by default ``score`` and ``reward`` are the row sums of verl's
  ``token_level_scores`` / ``token_level_rewards`` and ``advantage`` the mean of the row's
  ``advantages``, unless a stored per-row column of that name is the field);
- every stored per-row scalar (a 1-d tensor or numpy array; torch dtypes numpy lacks, such as
  ``bfloat16``, as float32), string and small JSON object (at most :data:`SMALL_JSON` bytes per
  row on average, or any JSON column named in ``columns``), under its own name;
- for each other jagged column ``c`` (token ids, log-probs, per-row arrays, pickles): its
  per-row lengths as ``c_len`` (the values are not read);
- with ``reduce={"c": "mean"}``: each row's mean (sum, min, max, first, last) of the token
  column ``c``, jagged or padded (cut to its mask), as ``c_mean``.

Dense columns with more than one value per row (padded ``input_ids``, masks) are left out
(naming one in ``columns`` is an error: read it with ``view[name]``); padded token columns
count through their mask for the length fields and reductions. Steps that lack a column hold
missing values there. Every step's chunks are fetched in one batch of requests.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ConfigError, MissingExtraError
from zarr_skip.format import args
from zarr_skip.format.arrays import as_numpy, numpy_values
from zarr_skip.store.reads import Range, read_ranges
from zarr_skip.store.storage import Storage
from zarr_skip.views import schema
from zarr_skip.views.measures import by_row
from zarr_skip.views.records import max_response_length
from zarr_skip.views.text import mask_tokens, padded_mask, strip_padding

if TYPE_CHECKING:
    import pandas

    from zarr_skip.lazy import LazyColumn, StepView

#: JSON columns averaging at most this many bytes per row are in a table by default
SMALL_JSON = 256
INDEX = schema.INDEX
_ORDER = "__order"


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


class _Plan:
    """What one step's table reads and shows: per-row columns (values), jagged ones (lengths),
    the rollout fields' sources and the reductions."""

    def __init__(self, view: StepView, columns: Sequence[str] | None, reduce: Mapping[str, str]) -> None:
        self.view = view
        self.reads: dict[tuple[str, str], LazyColumn] = {}  # (column, "whole" | "lengths")
        self.shown: list[str] = []  # stored columns shown by value
        self.lengths: list[str] = []  # jagged columns shown as c_len
        self.fields: list[str] = []  # computed rollout fields
        self.reduce: dict[str, str] = {}
        names = list(view.columns) if columns is None else [n for n in columns if n in view]
        for name in names:
            self._column(name, explicit=columns is not None)
        wanted_fields = schema.TABLE_FIELDS if columns is None else [f for f in columns if f in schema.TABLE_FIELDS]
        for field in wanted_fields:
            self._field(field)
        for name, how in reduce.items():
            if name in view:
                self._token_source(name, f"reduce[{name!r}]")
                self.reduce[name] = how

    def _ask(self, name: str, mode: str) -> None:
        if (name, "whole") not in self.reads:
            self.reads[(name, mode)] = self.view[name]
            if mode == "whole":
                self.reads.pop((name, "lengths"), None)

    def _column(self, name: str, *, explicit: bool) -> None:
        col = self.view[name]
        spec = col.spec
        if spec.kind in ("tensor", "ndarray"):
            if spec.shape == ():
                self.shown.append(name)
                self._ask(name, "whole")
            elif explicit and name not in schema.LENGTH_FIELDS.values():
                raise ConfigError(
                    f"step {self.view.step}, column {name!r}: holds {spec.shape} values per row, too many for a "
                    f"table cell; read it with view[{name!r}] (or reduce it per row: reduce={{{name!r}: 'mean'}})"
                )
        elif spec.kind == "str" or (spec.kind == "json" and (explicit or _small(col))):
            self.shown.append(name)
            self._ask(name, "whole")
        elif spec.kind != "json" and name not in schema.LENGTH_FIELDS.values():
            self.lengths.append(name)
            self._ask(name, "lengths")
        if explicit and name in schema.LENGTH_FIELDS.values():  # `responses`: response_length
            self._field(next(f for f, c in schema.LENGTH_FIELDS.items() if c == name))

    def _field(self, field: str) -> None:
        view = self.view
        if field in INDEX or field in self.fields:
            return
        if field in schema.STORED_FIELDS and field in self.per_row():
            if field not in self.shown:
                self.shown.append(field)
                self._ask(field, "whole")
            return
        if field in schema.LENGTH_FIELDS and schema.LENGTH_FIELDS[field] in view:
            self._token_source(schema.LENGTH_FIELDS[field], field, values=False)
        elif field == "truncated" and "responses" in view and max_response_length(view) is not None:
            self._token_source("responses", field, values=False)
        elif (r := schema.default_reduction(field, view.columns)) is not None:
            if not self._token_source(r.column, field, strict=False):
                return
        else:
            return
        self.fields.append(field)

    def _token_source(self, name: str, why: str, *, values: bool = True, strict: bool = True) -> bool:
        """Ask for what the per-row values (or lengths) of token column ``name`` need; False
        (or ConfigError when ``strict``) when it is no token column."""
        spec = self.view[name].spec
        numeric = spec.kind in ("nested", "rows") or (spec.kind in ("tensor", "ndarray") and len(spec.shape) == 1)
        if not numeric or (spec.jagged and spec.shape != ()):
            if strict:
                raise ConfigError(
                    f"step {self.view.step}, {why}: column {name!r} ({spec.kind}, shape {spec.shape}) holds no "
                    "numbers per token to reduce"
                )
            return False
        if spec.jagged:
            self._ask(name, "whole" if values else "lengths")
            return True
        found = padded_mask(self.view, name, spec.shape[0])
        mask = None if found is None else found[0]
        if mask is not None and self.view[mask].spec.shape[:1] < spec.shape[:1]:
            mask = None  # narrower than the column: it does not say where its tokens are
        if values or mask is None:
            self._ask(name, "whole")
        if mask is not None:
            self._ask(mask, "whole")
        return True

    def per_row(self) -> set[str]:
        out = set()
        for name, spec in self.view.schema.items():
            if (spec.kind in ("tensor", "ndarray") and spec.shape == ()) or spec.kind in ("str", "json"):
                out.add(name)
        return out


def _check_columns(views: Sequence[StepView], columns: Sequence[str] | None) -> None:
    known = dict.fromkeys([name for view in views for name in view.columns] + list(schema.TABLE_FIELDS))
    args.columns(columns, known, where="table")


def views_table(
    storage: Storage,
    views: Sequence[StepView],
    columns: Sequence[str] | None = None,
    reduce: Mapping[str, str] | None = None,
) -> pandas.DataFrame:
    """The rows of ``views`` as one DataFrame (see the module docstring), in view order."""
    pd = pandas_module()
    how = schema.check_reduce(reduce)
    _check_columns(views, columns)
    plans = [_Plan(view, columns, how) for view in views]
    wanted: list[list[Range]] = [
        col._whole() if mode == "whole" else col._lengths_ranges()
        for plan in plans
        for (_, mode), col in plan.reads.items()
    ]
    got = iter(read_ranges(storage, [r for ranges in wanted for r in ranges]))
    fetched = iter([[next(got) for _ in ranges] for ranges in wanted])
    frames: dict[tuple[str, ...], list[dict[str, np.ndarray]]] = {}
    for order, plan in enumerate(plans):
        arrays = {key: next(fetched) for key in plan.reads}
        frame = _frame(plan, arrays)
        frame[_ORDER] = np.full(len(plan.view), order, dtype=np.int64)
        frames.setdefault(tuple(frame), []).append(frame)
    tables = [
        pd.DataFrame({name: np.concatenate([f[name] for f in group]) for name in names}, copy=False)
        for names, group in frames.items()
    ]
    if not tables:
        return pd.DataFrame({name: np.empty(0, np.int64) for name in INDEX})
    names = list(dict.fromkeys(n for t in tables for n in t.columns if n != _ORDER))
    if len(tables) == 1:
        return tables[0][names]
    table = pd.concat(tables, ignore_index=True).sort_values(_ORDER, kind="stable", ignore_index=True)
    return table[names]


def _frame(plan: _Plan, arrays: dict[tuple[str, str], list[np.ndarray]]) -> dict[str, np.ndarray]:
    """One step's table columns, in schema order, from the arrays its plan read."""
    view = plan.view
    rows = len(view)
    stored = {name: _values(view[name], arrays[(name, "whole")]) for name in plan.shown}
    computed: dict[str, np.ndarray] = {
        "step": np.full(rows, view.step, dtype=np.int64),
        "minibatch": schema.minibatch_of_rows(view).astype(np.int64),
        "row": np.arange(rows, dtype=np.int64),
    }
    tokens = _Tokens(view, arrays)
    for field in plan.fields:
        if field in schema.LENGTH_FIELDS:
            computed[field] = tokens.lengths(schema.LENGTH_FIELDS[field])
        elif field == "truncated":
            computed[field] = tokens.lengths("responses") >= (max_response_length(view) or 0)
        else:
            r = schema.default_reduction(field, view.columns)
            assert r is not None  # the plan asked for it
            computed[field] = schema.reduce_rows(*tokens.values(r.column), r.how)
    for name in plan.lengths:
        computed[schema.length_name(name)] = tokens.lengths(name)
    for name, how in plan.reduce.items():
        computed[f"{name}_{how}"] = schema.reduce_rows(*tokens.values(name), how)
    placed = schema.place_names(computed, stored)
    out: dict[str, np.ndarray] = {}
    for field in schema.TABLE_FIELDS:  # the schema's fields first, stored or computed
        if field in stored and field in schema.STORED_FIELDS:
            out[field] = stored[field]
        if field in computed:
            out[placed[field]] = computed[field]
    out.update((name, values) for name, values in stored.items() if name not in out)
    out.update((placed[name], values) for name, values in computed.items() if placed[name] not in out)
    return out


class _Tokens:
    """Per-row lengths and flat values of a step's token columns (jagged, or padded and cut to
    their mask), from the arrays a plan read."""

    def __init__(self, view: StepView, arrays: dict[tuple[str, str], list[np.ndarray]]) -> None:
        self.view = view
        self.arrays = arrays
        self._seen: dict[str, dict[str, np.ndarray]] = {}

    def _stored(self, name: str) -> dict[str, np.ndarray]:
        if name not in self._seen:  # a dictionary-encoded column expands once
            self._seen[name] = self.view[name]._stored(self.arrays[(name, "whole")])
        return self._seen[name]

    def _mask(self, name: str, width: int) -> np.ndarray | None:
        found = padded_mask(self.view, name, width)
        if found is None or (found[0], "whole") not in self.arrays:
            return None
        data = self._stored(found[0])["data"]
        if data.shape[1:] < (width,):
            return None
        flat = by_row(data)
        return mask_tokens(name, flat[:, flat.shape[1] - width :] if found[1] else flat[:, :width])

    def lengths(self, name: str) -> np.ndarray:
        col = self.view[name]
        if col.spec.jagged:
            if (name, "lengths") in self.arrays:
                return np.asarray(col._lengths_of(self.arrays[(name, "lengths")]), dtype=np.int64)
            return np.asarray(self._stored(name)["lengths"], dtype=np.int64)
        return self.values(name)[1]

    def values(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        col = self.view[name]
        spec = col.spec
        if spec.jagged:
            stored = self._stored(name)
            values = numpy_values(stored["values"], spec.dtype) if spec.kind == "nested" else stored["values"]
            return values, np.asarray(stored["lengths"], dtype=np.int64)
        width = spec.shape[0]
        mask = self._mask(name, width)
        if (name, "whole") not in self.arrays:  # lengths alone: from the mask
            assert mask is not None
            return np.empty(0), mask.sum(axis=1).astype(np.int64)
        data = numpy_values(self._stored(name)["data"], spec.dtype).reshape(len(col), width)
        if mask is None:
            return _unpadded(self.view, name, data)
        return data[mask], mask.sum(axis=1).astype(np.int64)


def _unpadded(view: StepView, name: str, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A padded column without a mask: token ids lose the pad id at both ends (as
    :func:`zarr_skip.views.text.token_ids` does), other columns keep every value."""
    rows = strip_padding(view, name, list(data))
    flat = np.concatenate(rows) if rows else np.empty(0, data.dtype)
    return flat, np.array([len(r) for r in rows], dtype=np.int64)


def _small(col: LazyColumn) -> bool:
    values = sum(p["values"].rows for p in col._parts)
    return values <= SMALL_JSON * max(1, len(col))


def _values(col: LazyColumn, arrays: list[np.ndarray]) -> np.ndarray:
    """The table column of per-row column ``col`` from its arrays."""
    return as_numpy(col.spec, col._stored(arrays), plain=col._plain)
