"""A short adversarial sweep (``scripts/adversarial_sweep.py`` runs it at size): random damage
to a cache never gives a wrong read or an untyped error, and verify() reports every damage
that changes what a reader gets."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
from _adversary import DAMAGES, attack, build, sweep


@pytest.mark.slow
def test_a_short_adversarial_sweep(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    figures = sweep(tmp_path, 30, seed=1)
    assert figures.untyped == 0, [u for t in figures.trials for u in t.untyped]
    assert figures.wrong == 0, [(t.damage, t.wrong) for t in figures.trials if t.wrong]
    assert not figures.missed, [t.damage for t in figures.missed]
    assert figures.changed >= 15  # most damages change what a reader gets, and are caught


@pytest.mark.parametrize("damage", sorted({d.__name__ for d in DAMAGES}))
def test_every_kind_of_damage_is_caught(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    """Each damage on its own, a few times: the sweep's figures hold for every kind."""
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    expected = build(tmp_path / "pristine")
    fn = next(d for d in DAMAGES if d.__name__ == damage)
    rng = random.Random(damage)
    for _ in range(3):
        trial = attack(tmp_path / "pristine", tmp_path / "work", expected, rng, fn)
        assert not trial.untyped and not trial.wrong, trial
        assert trial.flagged or not trial.changed, trial
