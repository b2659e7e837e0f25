"""Pure choices for training exports: which answers of a group to keep, which pairs to make.

No I/O: a group is the list of its answers' scores, in stored order; the answers are named by
their position in that list. Ties are broken by that order (the earlier answer first), so the
same cache always gives the same records. A score that is NaN (or None) counts as no score:
such an answer is never chosen or paired.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zarr_skip.errors import ConfigError
from zarr_skip.format import args

__all__ = ["best_answers", "check_best_of", "check_pairs", "group_rows", "preference_pairs"]


def _scored(scores: Sequence[float | None]) -> list[tuple[int, float]]:
    return [(i, float(s)) for i, s in enumerate(scores) if s is not None and not math.isnan(float(s))]


def check_best_of(best_of: int) -> int:
    """``best_of`` (a Python or numpy int >= 1) as an int."""
    n = args.whole(best_of, "best_of")
    if n < 1:
        raise ConfigError(f"best_of={n}: keep at least one answer a group (a whole number >= 1)")
    return n


def check_pairs(pairs: int | str) -> int | str:
    """``pairs`` (``"all"``, or a Python or numpy int >= 1) as given, an int as an int."""
    if isinstance(pairs, str):
        if pairs == "all":
            return pairs
        raise ConfigError(f"pairs={pairs!r}: give the most pairs a group yields (a whole number >= 1) or 'all'")
    n = args.whole(pairs, "pairs")
    if n < 1:
        raise ConfigError(f"pairs={n}: give the most pairs a group yields (a whole number >= 1) or 'all'")
    return n


def best_answers(scores: Sequence[float | None], best_of: int = 1, min_score: float | None = None) -> list[int]:
    """The ``best_of`` highest scored answers that reach ``min_score``, best first (ties: the
    earlier answer first)."""
    check_best_of(best_of)
    kept = [(i, s) for i, s in _scored(scores) if min_score is None or s >= min_score]
    kept.sort(key=lambda t: (-t[1], t[0]))
    return [i for i, _ in kept[:best_of]]


def preference_pairs(scores: Sequence[float | None], pairs: int | str = 1) -> list[tuple[int, int]]:
    """``(chosen, rejected)`` pairs of a group: chosen among its best answers (those with the top
    score), rejected among its worst (the bottom score); none when all scores are equal.

    ``pairs=k`` gives up to ``k`` pairs, the i-th pairing the i-th best with the i-th worst
    answer (each list in stored order, taken round) until every best and every worst answer is
    used once; ``pairs="all"`` gives every best answer with every worst one.
    """
    check_pairs(pairs)
    scored = _scored(scores)
    if not scored:
        return []
    top = max(s for _, s in scored)
    bottom = min(s for _, s in scored)
    if top == bottom:
        return []
    best = [i for i, s in scored if s == top]
    worst = [i for i, s in scored if s == bottom]
    if pairs == "all":
        return [(b, w) for b in best for w in worst]
    count = min(int(pairs), max(len(best), len(worst)))
    return [(best[k % len(best)], worst[k % len(worst)]) for k in range(count)]


def group_rows(uids: Sequence[object]) -> list[list[int]]:
    """Rows of the same ``uid`` (a GRPO group), groups in order of their first row."""
    groups: dict[object, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    return list(groups.values())
