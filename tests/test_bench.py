"""The benchmark's information floor: a true lower bound on the bytes of a synthetic step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numcodecs
import numpy as np
import pytest

import zarr_skip as zs
from benchmarks.floor import jagged_floor, log_prob_bits_per_value
from zarr_skip.synthetic import LOG_PROB_MIN, LOG_PROB_MIX, as_mapping, jagged_payload


@pytest.mark.parametrize("scale", [0.02, 1.5])
def test_float32_entropy_of_one_exponential(scale: float) -> None:
    # H = h(X) - E[log2 ulp(X)]: differential entropy log2(e * scale), float32 ulp 2**(e - 23)
    x = np.random.default_rng(0).exponential(scale, 1_000_000)
    expected = np.log2(np.e * scale) + 23 - np.floor(np.log2(x)).mean()
    assert log_prob_bits_per_value(((1.0, scale),), -60.0) == pytest.approx(expected, abs=0.02)


def test_the_floor_is_below_what_strong_codecs_reach() -> None:
    floor = jagged_floor("small", 0, 1)
    td = jagged_payload("small", 0, step=1)["tensordict"]
    lp = td["old_log_probs"].values().numpy()
    tokens = td["responses"].values().numpy().astype(np.uint32)
    strong = numcodecs.Blosc("zstd", 9, numcodecs.Blosc.SHUFFLE, blocksize=1 << 20)
    assert floor["parts"]["old_log_probs"] < len(strong.encode(lp))
    assert floor["parts"]["responses"] < len(strong.encode(tokens))
    # and not a trivial bound: within 15% of them
    assert floor["parts"]["old_log_probs"] > 0.85 * len(strong.encode(lp))
    assert floor["bytes"] == sum(floor["parts"].values())
    assert 20 < log_prob_bits_per_value(LOG_PROB_MIX, LOG_PROB_MIN) < 32


def test_the_floor_of_repeated_rows_counts_each_distinct_value_once() -> None:
    from benchmarks.floor import rows_floor

    zstd = numcodecs.Zstd(level=19)
    groups = [{"question": f"question {g} " + "abc " * 50, "index": g} for g in range(16)]
    once = rows_floor(groups, zstd)
    repeated = rows_floor([g for g in groups for _ in range(8)], zstd)
    assert once < repeated <= once + 16 * 8 * 4 // 8 + 1  # plus 4 bits per row: which of 16 values
    floor = jagged_floor("small", 0, 1, payload="realistic")
    assert floor["parts"]["extra_info"] > jagged_floor("small", 0, 1)["parts"]["extra_info"]


def test_the_tables_benchmark_runs(tmp_path: object) -> None:
    """bench_tables end to end on a few small steps: every row of its report is there."""
    import json
    from pathlib import Path

    from benchmarks.bench_tables import main

    out = Path(str(tmp_path))
    main(["--parts", "arrays,tables", "--steps", "3", "--preset", "small", "--array-preset", "small",
          "--reps", "1", "--out", str(out)])  # fmt: skip
    res = json.loads((out / "tables.json").read_text())
    assert set(res["arrays"]["columns"]) == {"responses", "old_log_probs", "prompt_len", "uid", "tags"}
    assert res["tables_local"]["rows"] == 3 * 128 and res["tables_local"]["table_cold"] > 0
    assert "Cache.table on local disk" in (out / "tables.md").read_text()


def test_the_write_floor_benchmark_times_each_part_of_a_write(tmp_path: Path) -> None:
    from benchmarks import write_floor

    assert write_floor.main(["--preset", "small", "--reps", "1", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "write_floor_small.json").read_text())
    parts = ("dump", "write", "encode", "compress_1thread", "compress", "files")
    assert all(len(r["samples_s"][k]) == 1 and r["median_s"][k] > 0 for k in parts)
    # the files it creates are those of a real write of the step
    cache = zs.open_cache(str(tmp_path / "c"), fingerprint={"job": "f"})
    cache.write(1, as_mapping(jagged_payload("small", 0, step=1, payload="realistic")))
    step = [p for p in (tmp_path / "c").rglob("*") if "/1/" in str(p.relative_to(tmp_path))]
    assert r["files"] >= sum(p.is_file() for p in step) >= 5  # a packed step: 5 files
    assert 1 <= r["speedup"] <= r["cores"] and r["achievable_vs_dump"] >= r["ideal_vs_dump"]
    assert "cannot avoid" in (tmp_path / "write_floor_small.md").read_text()
    assert not list(tmp_path.glob(".write-floor-*"))  # its work directory is gone


def test_nothing_is_deleted_while_the_benchmark_times_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # deleting files makes the next file creations slower (ext4 without a journal skips the
    # inodes freed in the last minutes), which a format of many files would pay for
    import argparse
    import shutil

    from benchmarks import runners

    deleted: list[str] = []
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(runners.shutil, "rmtree", lambda p, *a, **k: (deleted.append(str(p)), real_rmtree(p, *a, **k)))
    writes: list[tuple[str, int]] = []

    class FakeRunner:
        def run(self, spec: dict, timeout: float | None = None) -> dict:
            if spec["op"] == "write":
                assert not deleted, f"deleted before a timed write: {deleted}"
                Path(spec["dir"]).mkdir(parents=True)
                (Path(spec["dir"]) / "out").write_bytes(b"x")
                writes.append((spec["format"], spec["rep"]))
            return {"sample": 0.001, "peak_rss": 0}

    args = argparse.Namespace(
        formats=["plain_dump_realistic", "zarr_skip_realistic"],
        baseline_only=False,
        ops=["write", "read_cold"],
        reps=3,
        seed=0,
        isolation="fork",
        cold="auto",
        warmup=True,
        verify=False,
        status_steps=0,
        timeout=60,
    )
    monkeypatch.setattr(runners, "in_memory_sizes", lambda preset, seed: {})
    out = runners.bench_preset("small", args, tmp_path, FakeRunner())  # type: ignore[arg-type]
    assert len(writes) == 6 and out["formats"]["zarr_skip_realistic"]["write"]["median_s"] == 0.001
    assert deleted and not (tmp_path / "small").exists()  # removed once the preset is measured


def test_the_warm_up_leaves_its_files_for_the_runner(tmp_path: Path) -> None:
    from benchmarks.worker import _warmup_process

    _warmup_process("zarr_skip_realistic", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [f"warmup-{os.getpid()}"]
    assert any(p.is_file() for p in tmp_path.rglob("*"))
