"""A cache handle goes on from its own last write to a step (store.writer.StepMemo): the step's
mini-batches written by one handle cost one scan of the step, and nothing the scan would have
caught is missed."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import Keys, assert_equal, concat, make_batch

import zarr_skip as zs
from zarr_skip.store import writer


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The step of every full scan a write makes."""
    made: list[int] = []
    original = writer.scan_step

    def counted(storage: Any, experiment: str, step: int) -> Any:
        made.append(step)
        return original(storage, experiment, step)

    monkeypatch.setattr(writer, "scan_step", counted)
    return made


@pytest.mark.parametrize("token", [None, True])
def test_a_handle_scans_a_step_once_for_its_minibatches(
    location: Any, fingerprint: dict, scans: list[int], token: Any
) -> None:
    cache = zs.open_cache(location, fingerprint)
    batches = [make_batch(3, seed=i) for i in range(4)]
    infos = [cache.write(7, b, expected=4, token=token) for b in batches]
    assert [i.index for i in infos] == [0, 1, 2, 3] and infos[-1].step_complete
    assert scans == [7]  # the first write's; the other three went on from it
    cache.write(8, make_batch(2), expected=2)
    assert scans == [7, 8]  # another step: scanned
    assert_equal(cache.load(7).to_dict(), concat(batches))
    with pytest.raises(zs.StepCompleteError, match="step 7 is complete"):
        cache.write(7, make_batch(3), expected=4)  # a complete step is scanned, and refused


def test_another_writer_of_the_run_between_writes_is_found_by_the_claim(location: Any, fingerprint: dict) -> None:
    mine = zs.open_cache(location, fingerprint, run_id="shared-run")
    other = zs.open_cache(location, fingerprint, run_id="shared-run")  # another rank of the run
    batches = [make_batch(2, seed=i) for i in range(3)]
    assert mine.write(4, batches[0], expected=3).index == 0
    assert other.write(4, batches[1], expected=3).index == 1
    last = mine.write(4, batches[2], expected=3)  # its memo knows index 0 only: index 1 is taken
    assert last.index == 2 and last.step_complete
    assert_equal(mine.load(4).to_dict(), concat(batches))


def test_a_same_token_again_returns_the_stored_minibatch(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    first = cache.write(2, make_batch(3), expected=3, token="t-1")
    again = cache.write(2, make_batch(3), expected=3, token="t-1")  # not stored twice
    assert (again.index, again.nbytes) == (first.index, first.nbytes)
    assert cache.write(2, make_batch(3, seed=5), expected=3, token="t-2").index == 1


def test_a_failed_write_forgets_the_step(
    location: Any, fingerprint: dict, scans: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(5, make_batch(2), expected=3)
    original = writer._write_arrays

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(writer, "_write_arrays", failing)
    with pytest.raises(OSError, match="disk gone"):
        cache.write(5, make_batch(2, seed=1), expected=3)
    monkeypatch.setattr(writer, "_write_arrays", original)
    assert cache.write(5, make_batch(2, seed=2), expected=3).index == 1
    assert scans == [5, 5]  # after the failure the step was scanned again


def test_a_different_expected_or_overwrite_scans(location: Any, fingerprint: dict, scans: list[int]) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(6, make_batch(2), expected=3)
    with pytest.raises(zs.ConfigError, match="expected=3, this write says expected=2"):
        cache.write(6, make_batch(2), expected=2)
    cache.write(6, make_batch(2), expected=3, overwrite=True)
    assert scans == [6, 6, 6]


def test_runs_and_experiments_named_like_temp_files_are_runs_and_experiments(location: Any, fingerprint: dict) -> None:
    """Only a writer's temp file (``{name}.{hex}.partial``) is skipped when a step or the root
    is listed: a run id or an experiment that ends in ``.partial`` is one like any other (its
    writes failed as displaced by a newer run, and the experiment was listed nowhere)."""
    assert zs.open_cache(location, fingerprint, run_id="sweep.partial").write(3, make_batch(2)).step_complete
    named = zs.open_cache(location, fingerprint, experiment="grpo.partial")
    named.write(1, make_batch(2), expected=2)
    named.write(1, make_batch(2, seed=1), expected=2)
    again = zs.open_cache(location)
    assert "grpo.partial" in again.experiments()
    assert zs.open_cache(location, experiment="grpo.partial").status()[0].state == "complete"
    assert zs.open_cache(location, fingerprint).status()[0].run == "sweep.partial"


def test_a_handles_next_minibatch_lists_the_step_once(
    location: Any, fingerprint: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only its owner check lists the step (on a shared file system or S3: one round trip)."""
    from zarr_skip.store.storage import Storage

    cache = zs.open_cache(location, fingerprint)
    cache.write(4, make_batch(2), expected=3)
    listed: list[str] = []
    list_dir, list_and_get = Storage.list_dir, Storage.list_and_get

    def counted_dir(self: Storage, prefix: str) -> list[str]:
        listed.append(prefix)
        return list_dir(self, prefix)

    def counted_and_get(self: Storage, prefixes: Any, keys: Any) -> Any:
        prefixes = list(prefixes)
        listed.extend(prefixes)
        return list_and_get(self, prefixes, keys)

    monkeypatch.setattr(Storage, "list_dir", counted_dir)
    monkeypatch.setattr(Storage, "list_and_get", counted_and_get)
    cache.write(4, make_batch(2, seed=1), expected=3)
    step_path = f"{cache.experiment}/4"
    assert listed.count(step_path) == 1, listed


def test_a_newer_run_between_a_handles_writes_refuses_the_next_and_keeps_none_of_it(
    location: Any, fingerprint: dict
) -> None:
    mine = zs.open_cache(location, fingerprint)
    mine.write(9, make_batch(2), expected=3)
    newer = zs.open_cache(location, fingerprint)  # a restarted trainer: a newer run takes the step
    newer.write(9, make_batch(3, seed=1), expected=2)
    with pytest.raises(zs.DisplacedWriterError, match="step 9, mini-batch 1: run .* took the step over"):
        mine.write(9, make_batch(2, seed=2), expected=3)
    keys = Keys(location)
    assert not [k for k in keys.list() if mine.run_id in k]  # nothing of the refused write stays
    newer.write(9, make_batch(3, seed=3), expected=2)
    assert_equal(
        zs.open_cache(location, fingerprint).load(9).to_dict(), concat([make_batch(3, seed=1), make_batch(3, seed=3)])
    )


def test_a_step_deleted_by_the_handle_is_written_anew(location: Any, fingerprint: dict, scans: list[int]) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(3, make_batch(2), expected=2)
    cache.delete(3)
    first = cache.write(3, make_batch(2, seed=1), expected=2)
    assert first.index == 0 and scans == [3, 3]
    assert cache.write(3, make_batch(2, seed=2), expected=2).step_complete
    assert_equal(cache.load(3).to_dict(), concat([make_batch(2, seed=1), make_batch(2, seed=2)]))
