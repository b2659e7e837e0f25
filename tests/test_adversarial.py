"""A short adversarial sweep (``scripts/adversarial_sweep.py`` runs it at size): random damage
to a cache never gives a wrong read or an untyped error, and verify() reports every damage
that changes what a reader gets. The same holds for a cache whose token ids a read of a few rows
takes by the block (zstd blocks, or lz4 ones, which carry no checksum of their own), for the
checked-in format 3 cache, and for caches read as an object store
is read; and neither gc nor a new run's writes after a damage take anything that still reads
right. Format 2 records do not name their place: there a moved or swapped chunk or record
may read wrong unnoticed, and verify() lists such steps as unbound; nothing else is missed."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
from _adversary import (
    DAMAGES,
    KINDS,
    AsRemote,
    api_attack,
    attack,
    build,
    cli_attack,
    edit_index,
    holds,
    sweep,
    then_attack,
)

import zarr_skip as zs


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_short_adversarial_sweep(tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str) -> None:
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    figures = sweep(tmp_path, 30, seed=1, kind=kind)
    assert figures.untyped == 0, [u for t in figures.trials for u in t.untyped]
    assert not figures.failed, [(t.damage, t.wrong) for t in figures.failed]
    assert figures.changed >= 15  # most damages change what a reader gets, and are caught


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "blocked", "lz4"])
def test_a_short_adversarial_sweep_read_as_an_object_store_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """The same damages read through the Store path S3 takes: ranged gets, a few rows' blocks
    fetched in requests planned across holes."""
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    figures = sweep(tmp_path, 30, seed=4, kind=kind, remote=True)
    assert figures.untyped == 0, [u for t in figures.trials for u in t.untyped]
    assert not figures.failed, [(t.damage, t.wrong) for t in figures.failed]
    assert figures.changed >= 15
    storage = zs.open_cache(AsRemote(tmp_path / "pristine", read_only=True))._storage
    assert storage.root is None and storage.hole_bytes  # not the local files' reads


def test_the_blocked_cache_is_read_by_the_block(tmp_path: Path) -> None:
    """What the blocked sweep attacks: token ids in chunks of several blocks each, with the
    block index a read of a few rows goes by, and indexes to edit."""
    build(tmp_path / "pristine", "blocked")
    view = zs.open_cache(tmp_path / "pristine").load(1)
    values = [p.arrays["responses"]["values"] for p in view._parts]
    assert all(a.blocks is not None and any(len(s) > 1 for s in a.blocks) for a in values)
    damage = edit_index(random.Random(0), tmp_path / "pristine")
    assert damage is not None and "checksum recomputed" in damage


@pytest.mark.slow
def test_format_2_is_the_one_whose_swaps_go_unnoticed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The exception :func:`_adversary.holds` allows is real (two chunks of one array swapped between
    mini-batches read wrong in format 2), and only format 2 has it."""
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    unbound = {kind: sweep(tmp_path / kind, 20, seed=3, kind=kind) for kind in ("format2", "format3")}
    assert any(t.wrong and t.unbound for t in unbound["format2"].trials)
    assert not any(t.unbound for t in unbound["format3"].trials)


#: the daily subset (``make test-fast``) takes the default cache; ``make test`` every kind
EVERY_KIND = [k if k == "plain" else pytest.param(k, marks=pytest.mark.slow) for k in KINDS]


@pytest.mark.parametrize("kind", EVERY_KIND)
@pytest.mark.parametrize("damage", sorted({d.__name__ for d in DAMAGES}))
def test_every_kind_of_damage_is_caught(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str, kind: str
) -> None:
    """Each damage on its own, a few times: the sweep's figures hold for every kind."""
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    expected = build(tmp_path / "pristine", kind)
    fn = next(d for d in DAMAGES if d.__name__ == damage)
    rng = random.Random(damage)
    for _ in range(3):
        trial = attack(tmp_path / "pristine", tmp_path / "work", expected, rng, fn)
        assert holds(trial, kind), trial


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("then", "times"), [("gc", 4), ("write", 3)])
def test_gc_and_writes_take_nothing_that_reads_right_from_a_damaged_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str, then: str, times: int
) -> None:
    """gc (strays at any age), or a new run writing every step without ``overwrite``, after
    each kind of damage (``times`` each): every read right before is right after. gc removed a
    complete step whose run record was lost and, in format 2, one whose run record was edited
    to expect another count; a write replaced a complete step whose run record was lost or
    unreadable, and deleted one whose run record was edited or swapped."""
    caplog.set_level(logging.ERROR, logger="zarr_skip")
    expected = build(tmp_path / "pristine", kind)
    lost = []
    for fn in DAMAGES:
        rng = random.Random(fn.__name__)
        lost += [
            then_attack(then, tmp_path / "pristine", tmp_path / "work", expected, rng, kind, fn) for _ in range(times)
        ]
    assert not [(damage, reads) for damage, reads in lost if reads]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "format2"])
def test_every_command_answers_a_damaged_cache_with_a_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """``ls``, ``show``, ``verify``, ``export``, ``report`` and ``compare`` on a cache damaged
    each way: a typed error (its message, status 1 or 2) or an answer, never a failure the
    library did not type (a sweep of 250 damages of each cache kind found none; this keeps it
    so)."""
    caplog.set_level(logging.CRITICAL, logger="zarr_skip")
    build(tmp_path / "pristine", kind)
    seen = []
    for fn in DAMAGES:
        seen += cli_attack(tmp_path / "pristine", tmp_path / "work", tmp_path / "out", random.Random(fn.__name__), fn)
    assert not seen, "\n".join(seen)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "format2"])
def test_views_tables_and_datasets_of_a_damaged_cache_raise_typed_errors_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """``status``, ``table``, each step's notebook views (rollout, group, find, page, their
    text and HTML), ``to_pandas``, ``to_tensordict``, lengths and the torch datasets on a cache
    damaged each way: an answer or a typed error, never another exception (a sweep of 200
    damages of each cache kind found none; this keeps it so)."""
    caplog.set_level(logging.CRITICAL, logger="zarr_skip")
    build(tmp_path / "pristine", kind)
    seen = []
    for fn in DAMAGES:
        seen += api_attack(tmp_path / "pristine", tmp_path / "work", random.Random(fn.__name__), fn)
    assert not seen, "\n".join(seen)
