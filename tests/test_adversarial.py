"""A short adversarial sweep (``scripts/adversarial_sweep.py`` runs it at size): random damage
to a cache never gives a wrong read or an untyped error, and verify() reports every damage
that changes what a reader gets; the same of a cache whose token ids a read of a few rows takes
by the block."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
from _adversary import DAMAGES, attack, build, edit_index, sweep

import zarr_skip as zs


@pytest.mark.slow
def test_a_short_adversarial_sweep(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    figures = sweep(tmp_path, 30, seed=1)
    assert figures.untyped == 0, [u for t in figures.trials for u in t.untyped]
    assert figures.wrong == 0, [(t.damage, t.wrong) for t in figures.trials if t.wrong]
    assert not figures.missed, [t.damage for t in figures.missed]
    assert figures.changed >= 15  # most damages change what a reader gets, and are caught


@pytest.mark.slow
def test_a_short_adversarial_sweep_of_a_cache_read_by_the_block(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    figures = sweep(tmp_path, 30, seed=2, blocked=True)
    assert figures.untyped == 0, [u for t in figures.trials for u in t.untyped]
    assert figures.wrong == 0, [(t.damage, t.wrong) for t in figures.trials if t.wrong]
    assert not figures.missed, [t.damage for t in figures.missed]
    assert figures.changed >= 15


def test_the_blocked_cache_is_read_by_the_block(tmp_path: Path) -> None:
    """What the blocked sweep attacks: token ids in chunks of several blocks each, with the
    block index a read of a few rows goes by, and indexes to edit."""
    build(tmp_path / "pristine", blocked=True)
    view = zs.open_cache(tmp_path / "pristine").load(1)
    values = [p.arrays["responses"]["values"] for p in view._parts]
    assert all(a.blocks is not None and any(len(s) > 1 for s in a.blocks) for a in values)
    damage = edit_index(random.Random(0), tmp_path / "pristine")
    assert damage is not None and "checksum recomputed" in damage


@pytest.mark.parametrize("blocked", [False, True], ids=["plain", "blocked"])
@pytest.mark.parametrize("damage", sorted({d.__name__ for d in DAMAGES}))
def test_every_kind_of_damage_is_caught(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str, blocked: bool
) -> None:
    """Each damage on its own, a few times: the sweep's figures hold for every kind."""
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    expected = build(tmp_path / "pristine", blocked)
    fn = next(d for d in DAMAGES if d.__name__ == damage)
    rng = random.Random(damage)
    for _ in range(3):
        trial = attack(tmp_path / "pristine", tmp_path / "work", expected, rng, fn)
        assert not trial.untyped and not trial.wrong, trial
        assert trial.flagged or not trial.changed, trial
