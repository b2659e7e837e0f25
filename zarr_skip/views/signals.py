"""Per-step RL signals: what an RL engineer reads first about a step of rollouts.

For one step (and for each data source in it): the rows, the mean and spread of the score,
the accuracy when every score is 0 or 1, the mean response length (split by correct and wrong
answers when scores are 0/1), the share of responses that reached the length limit, and the
share of GRPO groups (rows sharing a ``uid``) whose answers all scored the same (those groups
have zero advantage: they carry no gradient signal).

:func:`signals` is pure (numpy arrays in, :class:`StepSignals` out); :func:`step_signals` reads
the columns it needs from a step view: the score column (per-row columns first, in the
order of every view, :data:`~zarr_skip.views.measures.SCORE_COLUMNS`; a token-level one
summed per row), the response lengths (stored lengths of a jagged column, no token read),
``uid`` and ``data_source``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ConfigTypeError
from zarr_skip.views.measures import SCORE_COLUMNS, response_lengths, row_scores
from zarr_skip.views.records import max_response_length

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = ["StepSignals", "by_source", "signals", "step_signals"]


@dataclass(frozen=True, slots=True)
class StepSignals:
    """The signals of one step, or of one data source in it.

    Attributes
    ----------
    step : the step.
    data_source : the data source these rows come from; ``None`` for the whole step.
    rows : rollouts counted.
    score_column : the column the scores come from (``None`` when the step has none).
    score_mean, score_std : mean and (population) standard deviation of the finite scores.
    binary : every finite score is 0 or 1 (then ``accuracy`` and the length split are given).
    accuracy : share of rows scoring 1 (``None`` unless ``binary``).
    length_mean : mean response length (tokens).
    length_correct, length_wrong : mean length of the rows scoring 1 / 0 (``None`` unless
        ``binary``, or when there is no such row).
    max_length : the response length limit (``None`` when unknown).
    truncated : share of responses that reached ``max_length`` (``None`` when unknown).
    groups : GRPO groups (distinct ``uid`` values; 0 without a ``uid`` column).
    same_score_groups : share of the groups of more than one row whose scores are all equal
        (``None`` without such groups or without scores).
    scored_groups : the groups ``same_score_groups`` is a share of: those with two or more
        finite scores (groups of one answer, or of one scored answer, carry no comparison).
    """

    step: int
    data_source: str | None
    rows: int
    score_column: str | None
    score_mean: float | None
    score_std: float | None
    binary: bool
    accuracy: float | None
    length_mean: float | None
    length_correct: float | None
    length_wrong: float | None
    max_length: int | None
    truncated: float | None
    groups: int
    same_score_groups: float | None
    scored_groups: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict (``None`` for what is unknown)."""
        return asdict(self)


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def _same_score_share(scores: np.ndarray, uids: np.ndarray | None) -> tuple[int, float | None, int]:
    """Distinct groups, the share of groups (of 2+ finite scores) whose finite scores are all
    equal, and how many groups that share is of."""
    if uids is None:
        return 0, None, 0
    keys, inverse = np.unique(uids.astype(str), return_inverse=True)
    if not scores.size or not np.isfinite(scores).any():
        return len(keys), None, 0
    same = total = 0
    for g in range(len(keys)):
        found = scores[inverse == g]
        found = found[np.isfinite(found)]
        if found.size < 2:
            continue
        total += 1
        same += int(found.min() == found.max())
    return len(keys), (same / total if total else None), total


def signals(
    step: int,
    scores: np.ndarray | None,
    lengths: np.ndarray | None,
    *,
    uids: np.ndarray | None = None,
    max_length: int | None = None,
    data_source: str | None = None,
    score_column: str | None = None,
) -> StepSignals:
    """The signals of one set of rows (pure).

    Parameters
    ----------
    step : the step they belong to.
    scores : one score per row (NaN for none), or ``None`` without a score column.
    lengths : one response length per row, or ``None`` without responses.
    uids : one GRPO group id per row, or ``None``.
    max_length : the response length limit, when known.
    data_source, score_column : recorded as they are.
    """
    rows = len(scores) if scores is not None else len(lengths) if lengths is not None else 0
    score = np.asarray(scores, dtype=np.float64) if scores is not None else np.empty(0)
    finite = score[np.isfinite(score)]
    binary = bool(finite.size) and bool(np.isin(finite, (0.0, 1.0)).all())
    length = np.asarray(lengths, dtype=np.float64) if lengths is not None else None
    correct = wrong = None
    if binary and length is not None and len(length) == len(score):
        correct, wrong = _mean(length[score == 1.0]), _mean(length[score == 0.0])
    truncated = None
    if max_length is not None and length is not None and length.size:
        truncated = float((length >= max_length).mean())
    groups, same, scored = _same_score_share(score, None if uids is None else np.asarray(uids, dtype=object))
    return StepSignals(
        step=int(step),
        data_source=data_source,
        rows=int(rows),
        score_column=score_column,
        score_mean=_mean(finite),
        score_std=float(finite.std()) if finite.size else None,
        binary=binary,
        accuracy=float((finite == 1.0).mean()) if binary else None,
        length_mean=_mean(length) if length is not None else None,
        length_correct=correct,
        length_wrong=wrong,
        max_length=max_length,
        truncated=truncated,
        groups=groups,
        same_score_groups=same,
        scored_groups=scored,
    )


def _score_column(view: StepView) -> str | None:
    for name in SCORE_COLUMNS:
        if name in view and view[name].spec.kind in ("tensor", "ndarray", "nested", "rows"):
            return name
    return None


def _lengths(view: StepView) -> np.ndarray | None:
    """Response lengths, or ``None`` when unknown: no responses, or padded ones without a mask."""
    if "response_mask" not in view and "responses" not in view:
        return None
    try:
        return response_lengths(view).astype(np.float64)
    except ConfigTypeError:  # padded responses without a mask
        return None


def _strings(view: StepView, name: str) -> np.ndarray | None:
    if name not in view:
        return None
    return np.array([str(v) for v in view[name][:]], dtype=object)


def step_signals(view: StepView, *, max_length: int | None = None) -> list[StepSignals]:
    """The signals of a step: the whole step first, then one per data source (sorted by name,
    only when a ``data_source`` column is stored).

    Parameters
    ----------
    view : the step.
    max_length : the response length limit; default: the experiment's
        ``max_response_length``, else a padded ``responses`` column's width.
    """
    column = _score_column(view)
    scores = row_scores(view, column) if column is not None else None
    lengths = _lengths(view)
    limit = max_length if max_length is not None else max_response_length(view)
    uids = _strings(view, "uid")
    out = [signals(view.step, scores, lengths, uids=uids, max_length=limit, score_column=column)]
    sources = _strings(view, "data_source")
    if sources is None:
        return out
    for source in sorted(set(sources.tolist())):
        mask = sources == source
        out.append(
            signals(
                view.step,
                scores[mask] if scores is not None else None,
                lengths[mask] if lengths is not None else None,
                uids=uids[mask] if uids is not None else None,
                max_length=limit,
                data_source=str(source),
                score_column=column,
            )
        )
    return out


def by_source(found: Sequence[StepSignals]) -> dict[str | None, StepSignals]:
    """Signals keyed by data source (``None``: the whole step)."""
    return {s.data_source: s for s in found}
