"""What a training run logs per listed step (generated and stored, or replayed), and the
migration from verl's own dumps that docs/verl.md describes: import in place, delete the old
step directories, replay."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.legacy.transfer import export_steps
from zarr_skip.trainer.manager import SkipManager

try:
    from tests import _fake_trainer as ft
except ImportError:  # tests/ itself on sys.path
    import _fake_trainer as ft  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
GROUP = "fake_exp_fake_proj/GBS4_N2_in8_out16"


@pytest.fixture(autouse=True)
def _fresh_manager() -> object:
    SkipManager.reset()
    yield
    SkipManager.reset()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("zarr_skip.trainer")]


def test_each_listed_step_says_generated_or_replayed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1, 2])
    with caplog.at_level(logging.INFO, logger="zarr_skip"):
        ft.run_sync(config, 3, seed=1)
    first = _lines(caplog)
    for step in (1, 2):
        assert first.count(f"rollout: step {step} not cached; generating and storing it") == 1, first
        assert first.count(f"rollout: stored step {step}") == 1, first
    assert not [m for m in first if "step 3" in m]  # an unlisted step does no I/O and says nothing
    caplog.clear()
    SkipManager.reset()
    with caplog.at_level(logging.INFO, logger="zarr_skip"):
        ft.run_sync(config, 3, seed=2)
    second = _lines(caplog)
    for step in (1, 2):
        assert second.count(f"rollout: step {step} served from the cache (stored step {step})") == 1, second
    assert not [m for m in second if "generating" in m]
    doc = (ROOT / "docs" / "verl.md").read_text()
    for line in ("rollout: step 1 not cached; generating and storing it", "rollout: stored step 1"):
        assert line in doc  # the lines the docs quote are the lines the code logs
    assert "rollout: step 1 served from the cache (stored step 1)" in doc


def test_migration_in_place_then_the_old_dumps_can_go(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run1 = ft.run_sync(ft.make_config(tmp_path / "c1", role="rollout", steps=[1, 2]), 2, seed=1)
    dump_dir = tmp_path / "dumps"  # verl's own dumps of steps 1 and 2, as verl's SkipManager writes them
    export_steps(zs.open_cache(tmp_path / "c1", experiment=f"{GROUP}/rollout"), [1, 2], dump_dir)
    assert main(["import", str(dump_dir), str(dump_dir), "--experiment-name", "fake_exp"]) == 0  # in place
    assert zs.open_cache(dump_dir).steps() == [1, 2]
    for step in (1, 2):  # the old step directories; the Zarr group (GBS.../rollout) stays
        shutil.rmtree(dump_dir / GROUP / str(step))
    assert (dump_dir / GROUP / "rollout").is_dir()
    with caplog.at_level(logging.INFO, logger="zarr_skip"):
        run2 = ft.run_sync(ft.make_config(dump_dir, role="rollout", steps=[1, 2]), 2, seed=2)
    assert run2.calls == {1: 0, 2: 0}
    for step in (1, 2):
        ft.assert_dataproto_equal(run2.outputs[step], run1.outputs[step])
        assert f"rollout: step {step} served from the cache (stored step {step})" in _lines(caplog)
