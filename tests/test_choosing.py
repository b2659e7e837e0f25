"""zarr_skip.views.choosing: which answers SFT keeps and which pairs DPO makes (pure, no I/O)."""

from __future__ import annotations

import math

import pytest

from zarr_skip.errors import ConfigError
from zarr_skip.views.choosing import best_answers, group_rows, preference_pairs

NAN = math.nan


def test_best_answers_best_first_ties_in_stored_order() -> None:
    assert best_answers([1, 0, 1, 0.5]) == [0]
    assert best_answers([1, 0, 1, 0.5], best_of=2) == [0, 2]
    assert best_answers([1, 0, 1, 0.5], best_of=3) == [0, 2, 3]
    assert best_answers([0.5, 0.5, 0.5], best_of=2) == [0, 1]


def test_min_score_and_missing_scores() -> None:
    assert best_answers([0, 0.25, 0], min_score=1) == []
    assert best_answers([1, 0, 2, 1], best_of=4, min_score=1) == [2, 0, 3]
    assert best_answers([NAN, 2, None, 1], best_of=4) == [1, 3]
    assert best_answers([NAN, NAN]) == []


def test_pairs_chosen_among_best_rejected_among_worst() -> None:
    assert preference_pairs([1, 0, 1, 0.5]) == [(0, 1)]
    assert preference_pairs([1, 0, 1, 0.5], pairs=2) == [(0, 1), (2, 1)]
    assert preference_pairs([1, 0, 1, 0.5], pairs=5) == [(0, 1), (2, 1)]  # each best used once, then stop
    assert preference_pairs([0, 0, 0, 0.25], pairs=3) == [(3, 0), (3, 1), (3, 2)]
    assert preference_pairs([1, 1, 0, 0], pairs="all") == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert preference_pairs([NAN, 2, 0, 1]) == [(1, 2)]  # the middle answer is neither


def test_groups_with_one_score_give_no_pair() -> None:
    assert preference_pairs([0.5, 0.5, 0.5, 0.5], pairs="all") == []
    assert preference_pairs([1]) == [] and preference_pairs([]) == [] and preference_pairs([NAN, 1]) == []


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="best_of=0"):
        best_answers([1], best_of=0)
    with pytest.raises(ConfigError, match="pairs='some'"):
        preference_pairs([1, 0], pairs="some")
    with pytest.raises(ConfigError, match="pairs=0"):
        preference_pairs([1, 0], pairs=0)


def test_group_rows_in_order_of_first_row() -> None:
    assert group_rows(["b", "a", "b", "c", "a"]) == [[0, 2], [1, 4], [3]]
