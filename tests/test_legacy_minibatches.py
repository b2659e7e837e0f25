"""Legacy import of nested ``{step}/{i}/tq_batch.pt`` dumps infers how many mini-batches a step
needs: a step interrupted after its first mini-batches is not imported as complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_legacy import dump_tq, tq_payload

import zarr_skip as zs
from zarr_skip.cli.main import main as cli
from zarr_skip.legacy.dumps import scan_legacy
from zarr_skip.legacy.transfer import import_legacy

FP_DIR = Path("e_p") / "GBS4_N2_in8_out16"


def _dumps(root: Path, counts: dict[int, int]) -> Path:
    """verl's rollout_tq dumps: step -> the mini-batches it holds (parameter_sync_step=2)."""
    for step, n in counts.items():
        for i in range(n):
            dump_tq(root / FP_DIR, step, tq_payload(rows=2, seed=step * 10 + i, step=step), minibatch=i)
    return root


def test_an_interrupted_last_step_is_skipped_as_incomplete(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path / "dumps", {1: 2, 2: 2, 3: 1})  # step 3 died after mini-batch 0
    (exp,) = scan_legacy(dumps)
    assert exp.expected_minibatches == 2 and exp.minibatch_warning is None
    assert exp.complete_steps == [1, 2]
    assert "1 of 2 mini-batches" in (exp.get_step(3).reason or "")
    report = import_legacy(dumps, tmp_path / "cache")
    assert [s.step for s in report.imported] == [1, 2]
    (skipped,) = report.skipped
    assert skipped.step == 3 and "1 of 2" in skipped.reason
    cache = zs.open_cache(tmp_path / "cache", experiment=f"{FP_DIR.as_posix()}/rollout_tq")
    assert cache.steps() == [1, 2] and [i.step for i in cache.status()] == [1, 2]


def test_parameter_sync_step_overrides_the_inference(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path / "dumps", {1: 2, 2: 2, 3: 1})
    report = import_legacy(dumps, tmp_path / "cache", expected_minibatches=1)
    assert [s.step for s in report.imported] == [3]


def test_an_unknown_count_is_imported_as_found_with_a_warning(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path / "dumps", {7: 1})  # one step: nothing to compare it with
    report = import_legacy(dumps, tmp_path / "cache")
    assert [s.step for s in report.imported] == [7]
    assert any("cannot infer how many mini-batches" in w and "parameter-sync-step" in w for w in report.warnings)


def test_the_cli_reports_the_skipped_step_and_takes_the_count(tmp_path: Path, capsys: Any) -> None:
    dumps = _dumps(tmp_path / "dumps", {1: 2, 2: 2, 3: 1})
    cli(["import", str(dumps), str(tmp_path / "c1")])
    out = capsys.readouterr()
    assert "1 of 2 mini-batches" in out.out + out.err
    assert cli(["import", str(dumps), str(tmp_path / "c2"), "--parameter-sync-step", "1"]) == 0
    cache = zs.open_cache(tmp_path / "c2", experiment=f"{FP_DIR.as_posix()}/rollout_tq")
    assert cache.steps() == [3]
