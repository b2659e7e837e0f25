"""Re-scoring cached rollouts with a new verifier: :meth:`zarr_skip.Cache.rescore`.

``fn`` sees each rollout as one dict, ``{"step", "minibatch", "row", "messages", "response",
...its row's columns}`` (the prompt's chat messages and the decoded response), the same shape
as a row of :func:`zarr_skip.integrations.ray.read_rollouts` (which has token ids, not text),
so a verifier written for one runs on the other. It returns a number, or a mapping of names to
numbers for several new scores at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ColumnNotFoundError, ConfigError, ConfigTypeError, MissingExtraError
from zarr_skip.format import args
from zarr_skip.format.specs import nested_rows
from zarr_skip.views.records import chosen_steps, per_row_columns, rollout_columns
from zarr_skip.views.text import require_tokenizer
from zarr_skip.views.training import row_scores

if TYPE_CHECKING:
    import pandas

    from zarr_skip.cache import Cache
    from zarr_skip.lazy import StepView

__all__ = ["NEW_SCORE", "rescore_rollouts"]

#: the column of a new score when ``fn`` returns a number
NEW_SCORE = "new_score"


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise MissingExtraError("rescore returns a pandas DataFrame: pip install 'zarr-skip[pandas]'") from None
    return pandas


def rescore_rollouts(
    cache: Cache,
    fn: Callable[[dict[str, Any]], float | Mapping[str, float]],
    steps: int | Iterable[int] | None = None,
    *,
    columns: Sequence[str] | None = None,
    score: str = "score",
    tokenizer: Any = None,
) -> pandas.DataFrame:
    """``fn`` called on every rollout of ``steps`` (default: every complete step).

    Parameters
    ----------
    fn : takes a rollout (see the module docstring), returns its new score (a number) or new
        scores (a mapping of names to numbers).
    columns : the row's columns ``fn`` sees (default: every per-row scalar, string and JSON column).
    score : the stored score set beside the new ones (NaN where the step has none).
    tokenizer : decodes the responses (default: the one the experiment recorded).

    Returns
    -------
    A pandas DataFrame with ``step``, ``minibatch``, ``row``, ``uid`` (when stored), ``score``
    (the stored one) and the new scores (``new_score``, or the names ``fn`` returned), a row per
    rollout in stored order.
    """
    pd = _pandas()  # before any I/O
    if not callable(fn):
        raise ConfigTypeError(f"fn: expected a function of a rollout, got {type(fn).__name__} {fn!r:.60}")
    columns = args.columns(columns)
    score = args.name(score, "score")
    chosen = chosen_steps(cache, steps, "rescore")
    views = [cache.load(s) for s in chosen]
    decoder = require_tokenizer(views[0], tokenizer)
    records: list[dict[str, Any]] = []
    for view in views:
        records += _step(view, fn, columns, score, decoder)
    return pd.DataFrame.from_records(records)


def _step(
    view: StepView,
    fn: Callable[[dict[str, Any]], float | Mapping[str, float]],
    columns: Sequence[str] | None,
    score: str,
    decoder: Any,
) -> list[dict[str, Any]]:
    names = per_row_columns(view) if columns is None else list(columns)
    missing = [n for n in names if n not in view]
    if missing:
        raise ColumnNotFoundError(
            f"step {view.step}: no column {', '.join(map(repr, missing))} (columns: {', '.join(view)})"
        )
    text = rollout_columns(view, decoder=decoder, extra=False)
    values = {name: _rows(view[name][:]) for name in names}
    minibatch = np.repeat(np.arange(len(view.minibatches)), [len(m) for m in view.minibatches])
    try:
        stored = row_scores(view, score)
    except KeyError:
        stored = np.full(len(view), math.nan)
    uids = values.get("uid") or (_rows(view["uid"][:]) if "uid" in view else None)
    out = []
    for row in range(len(view)):
        rollout: dict[str, Any] = {
            "step": view.step,
            "minibatch": int(minibatch[row]),
            "row": row,
            "messages": text["messages"][row] or [{"role": "user", "content": text["prompt"][row] or ""}],
            "response": text["response"][row] or "",
        }
        rollout.update({name: column[row] for name, column in values.items()})
        record: dict[str, Any] = {"step": view.step, "minibatch": int(minibatch[row]), "row": row}
        if uids is not None:
            record["uid"] = uids[row]
        record[score] = float(stored[row])
        try:
            result = fn(rollout)
        except Exception as exc:
            exc.add_note(f"zarr_skip: raised by the rescoring function on step {view.step}, row {row}")
            raise
        record.update(_new_scores(result, view.step, row, taken=("step", "minibatch", "row", "uid", score)))
        out.append(record)
    return out


def _rows(value: Any) -> list[Any]:
    """A column's rows as Python values (a jagged column's row as the list of its values)."""
    if getattr(value, "is_nested", False):  # a jagged NestedTensor (torch is not imported here)
        return [row.tolist() for row in nested_rows(value)]
    if hasattr(value, "tolist") and not (isinstance(value, np.ndarray) and value.dtype == object):
        return list(value.tolist())
    return list(value)


def _new_scores(result: Any, step: int, row: int, taken: Sequence[str] = ()) -> dict[str, float]:
    """What the rescoring function returned for ``row``: a number, or a mapping of names to
    numbers, none of them one of the ``taken`` columns of the table (its key, the stored score)."""
    scores = result.items() if isinstance(result, Mapping) else [(NEW_SCORE, result)]
    out = {}
    for name, value in scores:
        if str(name) in taken:
            raise ConfigError(
                f"step {step}, row {row}: the rescoring function returned a score named {str(name)!r}, a column the "
                f"table already has ({', '.join(taken)}); name it otherwise"
            )
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            got = f"{result!r:.80}" if value is result else f"{value!r:.80} for {name!r}"
            raise ConfigTypeError(
                f"step {step}, row {row}: the rescoring function returned {got}; return a number "
                "or a mapping of names to numbers"
            ) from None
    return out
