"""benchmarks/bench_data.py runs end to end on a tiny preset (the torch parts; Ray is measured by
``make bench``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_data_benchmark_runs(tmp_path: Path) -> None:
    from benchmarks.bench_data import main

    main(["--preset", "tiny", "--steps", "2", "--items", "10", "--reps", "1", "--parts", "iterable,map",
          "--out", str(tmp_path)])  # fmt: skip
    res = json.loads((tmp_path / "data.json").read_text())
    torch_part = res["torch"]
    assert torch_part["iterable"]["rows"] == torch_part["to_dict"]["rows"] == 2 * 32
    assert torch_part["iterable_batched"]["rows"] == 2 * 32
    assert res["targets"]["iterable_batched_ratio"]["value"] > 0
    assert torch_part["loader_floor"]["rows"] == 2 * 32 and res["targets"]["loader_floor_ratio"] > 0
    for how in ("later_epoch", "later_epoch_batched"):  # epoch 2 of persistent workers: every row again
        assert torch_part[how]["rows"] == 2 * 32 and res["targets"][f"{how}_ratio"]["value"] > 0
    assert torch_part["map"]["rows"] == 10 and torch_part["map"]["bytes_read"] > 0
    assert torch_part["map_loader"]["rows"] == 2 * 32 and res["targets"]["map_loader_vs_iterable"] > 0
    assert res["targets"]["iterable_ratio"]["value"] > 0 and res["sizes"]["row_decoded"] > 0
    for how in ("iterable", "iterable_batched", "later_epoch", "later_epoch_batched"):  # per round, paired
        lo, mid, hi = res["targets"][f"{how}_ratio"]["per_round"]
        pairs = zip(torch_part[how]["samples"], torch_part["to_dict"]["samples"], strict=True)
        ratios = [a / b for a, b in pairs]
        assert (lo, hi) == (min(ratios), max(ratios)) and lo <= mid <= hi
    assert "min / **median** / max over 1 rounds" in (tmp_path / "data.md").read_text()
    assert "RolloutIterableDataset" in (tmp_path / "data.md").read_text()
    assert "random rows, RolloutDataset through DataLoader" in (tmp_path / "data.md").read_text()
    assert "the DataLoader alone" in (tmp_path / "data.md").read_text()
    assert "a later epoch through persistent workers" in (tmp_path / "data.md").read_text()
    assert not list(tmp_path.glob(".bench-tmp-*"))
