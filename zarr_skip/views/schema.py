"""The one schema of "one row per rollout", shared by :meth:`zarr_skip.Cache.table` and the
exports (pure: names, rules and per-row reductions; no I/O).

Fields, in order (:data:`FIELDS`; a table has those whose sources the step holds, an export
every one, null where the step has no source)::

    experiment       the experiment's name (exports only)
    step             the step
    minibatch        the mini-batch index within the step
    row              the row within the step, as ``view[name][row]`` indexes it
    uid              the stored ``uid`` column (verl's GRPO group id)
    data_source      the stored ``data_source`` column
    prompt           the prompt text as the model saw it: ``prompts`` decoded with the chat
                     template's special tokens kept (exports with a tokenizer only)
    response         ``responses`` decoded, special tokens dropped (exports with a tokenizer only)
    messages         ``raw_prompt`` as chat messages ``[{"role", "content"}, ...]`` (exports only)
    prompt_length    the stored per-row ``prompt_length``, else the tokens of ``prompts``
                     (padding dropped)
    response_length  the stored per-row ``response_length``, else the tokens of
                     ``responses`` (padding dropped)
    truncated        ``response_length`` reached the experiment's ``max_response_length``
    score            the stored per-row ``score``, else the row's sum of ``token_level_scores``
    reward           the stored per-row ``reward``, else the row's sum of ``token_level_rewards``
    acc              the stored per-row ``acc``
    advantage        the stored per-row ``advantage``, else the mean of the row's
                     ``advantages`` (verl's GRPO / RLOO advantages are one value per row,
                     repeated over its response tokens: that value)

Then every stored per-row column (one scalar, string or JSON value per row) under its own
name, always: a stored column is never renamed, nulled or replaced. A computed name that a
stored per-row column already takes (a stored ``row``, ``truncated``, ``prompt``,
``messages`` ...) goes under :data:`PREFIX` + name (``zs_row``); the fields marked
"the stored ... column" above are that column itself, so they never clash. In a table, the
per-row lengths of a jagged column ``c`` are ``c_len`` (``prompts`` and ``responses``: see
``prompt_length`` and ``response_length``), and a reduction asked for with
``reduce={"c": "mean"}`` is ``c_mean`` (:data:`REDUCTIONS`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from zarr_skip.errors import ConfigError, ConfigTypeError, SchemaMismatchError

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = [
    "DEFAULT_REDUCTIONS",
    "FIELDS",
    "INDEX",
    "LENGTH_FIELDS",
    "PREFIX",
    "REDUCTIONS",
    "Reduce",
    "Reduction",
    "STORED_FIELDS",
    "TABLE_FIELDS",
    "check_reduce",
    "default_reduction",
    "length_name",
    "place_names",
    "reduce_rows",
]

FIELDS = (
    "experiment",
    "step",
    "minibatch",
    "row",
    "uid",
    "data_source",
    "prompt",
    "response",
    "messages",
    "prompt_length",
    "response_length",
    "truncated",
    "score",
    "reward",
    "acc",
    "advantage",
)
#: the fields every table starts with
INDEX = ("step", "minibatch", "row")
#: the fields a table holds (when the step has their sources): no text, no experiment
TABLE_FIELDS = tuple(f for f in FIELDS if f not in ("experiment", "prompt", "response", "messages"))
#: fields that are the stored per-row column of the same name when the step has one
STORED_FIELDS = frozenset(
    {"uid", "data_source", "prompt_length", "response_length", "score", "reward", "acc", "advantage"}
)
#: the token columns whose per-row lengths are the length fields
LENGTH_FIELDS = {"prompt_length": "prompts", "response_length": "responses"}
#: the prefix of a computed name that a stored per-row column takes
PREFIX = "zs_"


@dataclass(frozen=True, slots=True)
class Reduction:
    """A field computed per row from a token column: ``column`` reduced by ``how``."""

    column: str
    how: str


#: the well-known verl columns reduced by default (when no stored per-row column is the
#: field), the first of a field's that a step holds (``rm_scores``: the rewards verl's agent
#: loop returns when it computes them itself)
DEFAULT_REDUCTIONS = {
    "score": (Reduction("token_level_scores", "sum"), Reduction("rm_scores", "sum")),
    "reward": (Reduction("token_level_rewards", "sum"),),
    "advantage": (Reduction("advantages", "mean"),),
}


def default_reduction(field: str, columns: Collection[str]) -> Reduction | None:
    """The reduction that makes ``field`` of a step with ``columns``, if any (:data:`DEFAULT_REDUCTIONS`)."""
    return next((r for r in DEFAULT_REDUCTIONS.get(field, ()) if r.column in columns), None)


#: ``reduce=`` of a table: token column -> one of :data:`REDUCTIONS`
Reduce = Mapping[str, str] | None
#: what ``reduce=`` may ask for, per row over its values (NaN for a row without values,
#: except ``sum`` (0) and ``len``)
REDUCTIONS = ("sum", "mean", "min", "max", "first", "last")


def length_name(column: str) -> str:
    """The table name of a jagged column's per-row lengths."""
    return f"{column}_len"


def check_reduce(reduce: Reduce) -> dict[str, str]:
    """``reduce`` checked: column name -> one of :data:`REDUCTIONS` (ConfigError otherwise)."""
    if reduce is None:
        return {}
    if not isinstance(reduce, Mapping):
        raise ConfigTypeError(f"reduce: expected a mapping such as {{'advantages': 'mean'}}, got {reduce!r}")
    out = {}
    for column, how in reduce.items():
        if not isinstance(column, str) or how not in REDUCTIONS:
            raise ConfigError(
                f"reduce[{column!r}] = {how!r}: expected a column name and one of {', '.join(REDUCTIONS)}"
            )
        out[column] = how
    return out


def place_names(computed: Iterable[str], stored: Collection[str]) -> dict[str, str]:
    """The name of each computed column beside the stored per-row columns ``stored``: its own,
    or :data:`PREFIX` + it when a stored column takes it (SchemaMismatchError when that is
    taken too: no stored column is ever hidden)."""
    out = {}
    for name in computed:
        if name not in stored:
            out[name] = name
            continue
        other = PREFIX + name
        if other in stored:
            raise SchemaMismatchError(
                f"the computed column {name!r} and its other name {other!r} are both stored per-row columns; "
                f"rename one of them, or leave {name!r} out (columns=...)"
            )
        out[name] = other
    return out


def reduce_rows(values: np.ndarray, lengths: np.ndarray, how: str) -> np.ndarray:
    """Each row's ``how`` (one of :data:`REDUCTIONS`) of the flat ``values`` split by
    ``lengths``, as float64 (a 1-d array of one value per row)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    values = np.asarray(values).astype(np.float64, copy=False).reshape(-1)
    starts = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    full = lengths > 0
    out = np.full(len(lengths), 0.0 if how == "sum" else np.nan)
    if not full.any():
        return out
    at = starts[full]
    if how in ("sum", "mean"):
        sums = np.add.reduceat(values, at) if len(values) else np.zeros(len(at))
        out[full] = sums if how == "sum" else sums / lengths[full]
    elif how in ("min", "max"):
        out[full] = (np.minimum if how == "min" else np.maximum).reduceat(values, at)
    elif how == "first":
        out[full] = values[at]
    elif how == "last":
        out[full] = values[at + lengths[full] - 1]
    else:
        raise ConfigError(f"reduction {how!r}: expected one of {', '.join(REDUCTIONS)}")
    return out


def minibatch_of_rows(view: StepView) -> np.ndarray:
    """The ``minibatch`` field: the index of the mini-batch each row of ``view`` came from."""
    info = view.minibatch_info
    return np.repeat([p.index for p in info], [p.rows for p in info]).astype(np.int64)
