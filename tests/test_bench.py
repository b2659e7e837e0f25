"""The benchmark's information floor: a true lower bound on the bytes of a synthetic step."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

import zarr_skip as zs
from benchmarks.floor import jagged_floor, log_prob_bits_per_value
from zarr_skip.format.chunks import AUTO_BLOCK_BYTES
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


@pytest.mark.slow
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


def test_imports_are_timed_from_compiled_bytecode(tmp_path: Path) -> None:
    """A shell that says not to write bytecode would time zarr_skip compiling its modules
    against zarr's compiled wheel: the timed imports write and read theirs in a prefix."""
    import subprocess
    import sys

    from benchmarks.bench_tables import import_env

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "probe_module.py").write_text("VALUE = 1\n")
    env = import_env({**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path / "lib")},
                     str(tmp_path / "pycache"))  # fmt: skip
    subprocess.run([sys.executable, "-c", "import probe_module"], env=env, check=True)
    assert list((tmp_path / "pycache").rglob("probe_module*.pyc"))
    assert not (tmp_path / "lib" / "__pycache__").exists()


@pytest.mark.slow
def test_the_write_floor_benchmark_times_each_part_of_a_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import baseline, write_floor
    from benchmarks.formats import PlainDumpRealistic
    from zarr_skip.synthetic import PRESETS

    dumped: list[Path] = []
    real_dump = baseline.plain_dump
    monkeypatch.setattr(baseline, "plain_dump", lambda m, d: dumped.append(Path(d)) or real_dump(m, d))
    out = tmp_path / "results" / "realistic"  # does not exist yet: created
    assert write_floor.main(["--preset", "small", "--reps", "1", "--out", str(out)]) == 0
    r = json.loads((out / "write_floor_small.json").read_text())
    # one definition of the plain dump: write_floor's and bench.py's both go through baseline.plain_dump
    assert len(dumped) == 1 and r["baseline"] == baseline.DEFINITION and "not fsynced" in r["baseline"]
    fmt = PlainDumpRealistic(PRESETS["small"])
    (tmp_path / "b").mkdir()
    fmt.write(None, tmp_path / "b", fmt.make(0))
    assert dumped[-1] == tmp_path / "b" and (tmp_path / "b" / baseline.DUMP_FILE).is_file()
    assert set(fmt.read(tmp_path / "b")) == set(fmt.make(0))
    tmp_path = out
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


def test_the_warm_up_writes_through_the_pool_as_a_real_step_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm-up whose arrays are all compressed inline would leave the pool's threads to be
    started inside the timed write (the warm-up is there so that it is not)."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.worker import _warmup_process
    from zarr_skip.store import _localfs

    class Counting(ThreadPoolExecutor):
        submitted = 0

        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            Counting.submitted += 1
            return super().submit(fn, *args, **kwargs)

    with Counting(max_workers=2) as counting:
        monkeypatch.setattr(_localfs, "_POOL", counting)
        monkeypatch.setattr(_localfs, "_POOL_PID", os.getpid())
        _warmup_process("zarr_skip_realistic", tmp_path)
    assert Counting.submitted >= 2


# --------------------------------------------------------------------------- machine load (benchmarks/load.py)


def _snap(t: float, total: int, busy: int, procs: list[tuple[int, int, str, int, int]]) -> object:
    from benchmarks.load import CpuTimes, ProcTimes, Snapshot

    return Snapshot(t, CpuTimes(total, busy), {p[0]: ProcTimes(*p) for p in procs})


def test_proc_stat_lines_are_parsed_even_with_parentheses_in_a_name() -> None:
    from benchmarks.load import parse_pid_stat, parse_proc_stat

    cpu = parse_proc_stat("cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 50 2 25 400 10 1 1 5 0 0\n")
    assert (cpu.total, cpu.busy) == (990, 990 - 800 - 20)
    p = parse_pid_stat("4242 (my (odd) name) S 17 4242 4242 0 -1 4194304 98 0 0 0 30 12 5 1 20 0 1 0 4077")
    assert (p.pid, p.ppid, p.comm, p.own, p.reaped) == (4242, 17, "my (odd) name", 42, 6)
    with pytest.raises(ValueError, match="cpu"):
        parse_proc_stat("intr 1 2 3\n")


def test_the_others_share_excludes_our_tree_and_counts_what_it_reaped() -> None:
    from benchmarks.load import shares

    # ours: 10 (root) with child 11; 11 ends between the samples and is reaped by 10 (its 30
    # ticks move into 10's cutime); 20 is someone else's; the machine ran 200 busy ticks of 400
    a = _snap(0.0, 1000, 100, [(10, 1, "bench", 50, 0), (11, 10, "worker", 20, 0), (20, 1, "pytest", 5, 0)])
    b = _snap(2.0, 1400, 300, [(10, 1, "bench", 70, 30), (12, 10, "worker", 10, 0), (20, 1, "pytest", 105, 0)])
    s = shares(a, b, root=10)  # type: ignore[arg-type]
    # ours: (70 + 30 + 10) - (50 + 20) = 40 ticks; others: 200 - 40 = 160 of 400 (pytest 100, the rest gone)
    assert s.ours == pytest.approx(0.10) and s.others == pytest.approx(0.40) and s.seconds == 2.0
    # what no live process accounts for: processes that started or ended between the samples
    assert s.top_others == (("pytest", pytest.approx(0.25)), ("short-lived processes", pytest.approx(0.15)))


def test_our_tree_is_followed_through_orphans_and_processes_reaped_elsewhere() -> None:
    """A Ray cluster's shutdown: its raylet (11, ours) is killed and reaped by us, its worker
    (12) re-parented to init keeps running, then ends reaped by init. The worker's time while
    it lived is ours; only its last interval's is lost (counted as others')."""
    from benchmarks.load import shares_over

    s0 = _snap(0.0, 0, 0, [(10, 1, "bench", 0, 0), (11, 10, "raylet", 10, 0), (12, 11, "worker", 100, 0)])
    s1 = _snap(1.0, 200, 55, [(10, 1, "bench", 0, 15), (12, 1, "worker", 150, 0)])  # 11: +5, 12: +50
    s2 = _snap(2.0, 400, 105, [(10, 1, "bench", 0, 15), (20, 1, "pytest", 30, 0)])  # 12: +20, then gone
    whole, steps = shares_over([s0, s1, s2], root=10)  # type: ignore[list-item]
    assert [st.ours for st in steps] == [pytest.approx(55 / 200), 0.0]
    assert whole.ours == pytest.approx(55 / 400) and whole.others == pytest.approx(50 / 400)
    # taken from the first and last samples alone, the killed cluster's 110 ticks were counted
    # against us: nothing of the run was ours, and all of it others'
    assert whole.others < 0.2


def test_workers_reaped_by_a_process_that_ended_too_are_ours() -> None:
    """A measurement process (11) joined its DataLoader worker (12), then ended and was reaped
    by us, within one interval: the worker's time before it, counted already, is not counted
    again."""
    from benchmarks.load import shares

    a = _snap(0.0, 0, 0, [(10, 1, "bench", 0, 0), (11, 10, "measure", 10, 0), (12, 11, "worker", 40, 0)])
    b = _snap(1.0, 200, 7, [(10, 1, "bench", 0, 57)])  # 11 ended at 12 + 45 (its worker's, reaped)
    s = shares(a, b, root=10)  # type: ignore[arg-type]
    assert s.ours == pytest.approx(7 / 200) and s.others == 0.0


def test_the_verdict_is_busy_on_load_or_on_other_processes_and_says_why() -> None:
    from benchmarks.load import Thresholds, verdict

    quiet = verdict(2, 0.3, 0.02, 0.04)
    assert not quiet.busy and quiet.text.startswith("quiet: load 0.3 on 2 cores")
    loaded = verdict(2, 3.2, 0.05, 0.64, top=[("python", 0.5)])
    assert loaded.busy and loaded.text.startswith("BUSY: load 3.2 on 2 cores")
    assert "other processes used 64% CPU during the run" in loaded.text and "python 50%" in loaded.text
    assert len(loaded.reasons) == 2
    assert verdict(2, 0.3, 0.25, None).busy  # busy before, not measured during
    assert not verdict(2, 1.9, 0.3, 0.3, thresholds=Thresholds(load_per_core=1.0, other_cpu=0.5)).busy


def test_the_monitor_records_the_load_before_and_during_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import load

    monkeypatch.delenv(load.BEFORE_ENV, raising=False)
    with load.LoadMonitor(interval_s=0.05, probe_s=0.05) as mon:
        sum(range(200_000))
    r = mon.result
    assert r is not None and r["during"]["samples"] >= 2 and 0 <= r["during"]["other_cpu"] <= 1
    assert len(r["before"]["loadavg"]) == 3 and r["verdict"].startswith("BUSY" if r["busy"] else "quiet")
    assert load.line(r).endswith("see benchmarks/load.py)")
    # a suite hands its before-record down to the scripts it runs
    monkeypatch.setenv(load.BEFORE_ENV, json.dumps({"loadavg": [9.0, 0, 0], "other_cpu": 0.0, "top_others": []}))
    assert load.LoadMonitor().take_before()["loadavg"][0] == 9.0


def test_a_spread_reads_min_median_max_with_the_median_in_bold() -> None:
    from benchmarks.measure import spread_text

    assert spread_text([0.0123, 0.0101, 0.0456, 0.02], scale=1e3) == "10.1 / **16.2** / 45.6"
    assert spread_text([3.0, 1.0, 2.0], "{:.2f}") == "1.00 / **2.00** / 3.00"


def test_a_monitored_run_works_in_a_directory_of_its_own_then_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import load

    monkeypatch.delenv(load.BEFORE_ENV, raising=False)
    out, seen = tmp_path / "out", []
    mon = load.LoadMonitor(interval_s=0.05, probe_s=0.05)
    mon.take_before()
    run = load.run_monitored(mon, out, ".bench-tmp-x-", lambda work: seen.append(work) or 7)
    assert run.result == 7 and seen[0].parent == out and seen[0].name.startswith(".bench-tmp-x-")
    assert not seen[0].exists() and run.record is not None and run.started.endswith("+00:00")
    mon = load.LoadMonitor(interval_s=0.05, probe_s=0.05)
    mon.take_before()
    kept = load.run_monitored(mon, out, ".bench-tmp-x-", lambda work: work, keep=True)
    assert kept.result.is_dir() and f"kept {kept.result}" in capsys.readouterr().err
    mon = load.LoadMonitor(interval_s=0.05, probe_s=0.05)
    mon.take_before()
    with pytest.raises(ZeroDivisionError):  # a failed measurement still stops the monitor and cleans up
        load.run_monitored(mon, out, ".bench-tmp-y-", lambda work: 1 // 0)
    assert mon.result is not None and not list(out.glob(".bench-tmp-y-*"))
    load.publish(out, "x", {"a": 1, "when": Path("p")}, "# x\n")
    assert (out / "x.md").read_text() == "# x\n" and json.loads((out / "x.json").read_text()) == {"a": 1, "when": "p"}
    assert "# x" in capsys.readouterr().out


def test_writes_that_wait_on_the_disk_make_the_machine_busy_and_are_named() -> None:
    from benchmarks.load import verdict

    slow = verdict(2, 0.3, 0.02, None, page_cache_mb_s=120.0)
    assert slow.busy and "writes went into the page cache at 120 MB/s before the run (quiet: >= 300)" in slow.text
    fast = verdict(2, 0.3, 0.02, None, page_cache_mb_s=900.0)
    assert not fast.busy and fast.text.endswith("writes into the page cache 900 MB/s")
    assert "page cache" not in verdict(2, 0.3, 0.02, None).text  # not probed: not said


def test_the_page_cache_probe_writes_where_asked_and_leaves_nothing(tmp_path: Path) -> None:
    from benchmarks.load import probe_page_cache

    where = tmp_path / "out"
    rate = probe_page_cache(where, mib=4, rounds=2)
    assert rate > 0 and where.is_dir() and not list(where.iterdir())


def test_require_quiet_probes_the_page_cache_where_the_run_writes_and_refuses_a_slow_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from benchmarks import load

    monkeypatch.delenv(load.BEFORE_ENV, raising=False)
    probed: list[tuple[Path, int]] = []
    monkeypatch.setattr(load, "probe_page_cache", lambda where, mib: probed.append((where, mib)) or 80.0)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    load.add_arguments(ap)
    lax = ["--quiet-load", "1000", "--quiet-cpu", "1.5"]  # the CPU passes on any machine
    assert load.guard(ap.parse_args(["--out", str(tmp_path), "--require-quiet", *lax])) is None
    assert probed == [(tmp_path, load.PAGE_CACHE_MIB)] and "page cache at 80 MB/s" in capsys.readouterr().err
    mon = load.guard(ap.parse_args(["--out", str(tmp_path), *lax]))  # no --require-quiet: no probe
    assert mon is not None and "page_cache_mb_s" not in mon.before and len(probed) == 1
    mon = load.guard(ap.parse_args(["--out", str(tmp_path), "--require-quiet", "--page-cache-mib", "0", *lax]))
    assert mon is not None and len(probed) == 1  # 0: no probe
    # not probed on a busy CPU: the run is refused for that alone
    assert load.guard(ap.parse_args(["--out", str(tmp_path), "--require-quiet", "--quiet-cpu", "-1"])) is None
    assert len(probed) == 1


def test_require_quiet_turns_a_run_that_became_busy_into_exit_code_3() -> None:
    from benchmarks.load import exit_code

    assert exit_code({"busy": True}, require_quiet=True) == 3
    assert exit_code({"busy": True}, require_quiet=False) == 0  # marked BUSY in the report only
    assert exit_code({"busy": False}, require_quiet=True) == exit_code(None, require_quiet=True) == 0


def test_require_quiet_refuses_a_busy_machine_before_measuring(tmp_path: Path) -> None:
    from benchmarks import bench

    # an impossible threshold makes any machine busy: the run is refused before anything is measured
    code = bench.main(["--preset", "small", "--out", str(tmp_path), "--require-quiet", "--quiet-cpu", "-1"])
    assert code == 2 and not list(tmp_path.iterdir())
    from benchmarks import suite

    code = suite.main(["--quick", "--out", str(tmp_path / "s"), "--require-quiet", "--quiet-load", "-1"])
    assert code == 2 and not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- peers (benchmarks/bench_peers.py)


def test_parquet_rows_read_only_the_row_groups_that_hold_them(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.bench_peers import COLUMN, PARQUET_FILE, ParquetPeer, _row_groups_holding

    values = [[i] * (i % 5 + 1) for i in range(100)]
    pq.write_table(pa.table({COLUMN: values}), tmp_path / PARQUET_FILE, row_group_size=10)
    meta = pq.ParquetFile(tmp_path / PARQUET_FILE).metadata
    assert _row_groups_holding(meta, [23, 27, 71]) == ([2, 7], [3, 7, 11])
    got = ParquetPeer().rows(tmp_path, [23, 27, 71])
    assert got.column(COLUMN).to_pylist() == [values[23], values[27], values[71]]


def test_the_few_row_variant_of_the_peer_benchmark_stores_token_ids_in_8_kib_blocks(tmp_path: Path) -> None:
    from benchmarks.bench_peers import COLUMN, VARIANTS, ZarrSkipPeer
    from zarr_skip.synthetic import PRESETS

    preset = PRESETS["small"]
    mapping = as_mapping(jagged_payload(preset, 0, step=1, payload="realistic"))
    for name, blocksize in (("zarr_skip_8k", 8 << 10), ("zarr_skip_lz4_8k", 8 << 10), ("zarr_skip", AUTO_BLOCK_BYTES)):
        peer = ZarrSkipPeer(preset, *VARIANTS.get(name, ("auto", 0)))
        peer.write(mapping, tmp_path / name)
        view = zs.open_cache(str(tmp_path / name), fingerprint=peer.fp).load(1)
        values = view._parts[0].arrays[COLUMN]["values"]
        assert values.compression.blocksize == blocksize and (values.blocks is not None) is (blocksize == 8 << 10)
        assert view[COLUMN][[3, 90]][1].tolist() == mapping[COLUMN][90].tolist()


def _run_apart(name: str, argv: list[str]) -> None:
    """``python -m benchmarks.<name> *argv`` in its own process, which must exit 0: once lance is
    imported, every later fork of the test process warns ("lance is not fork-safe"), which the
    suite's warnings-as-errors would turn into failures."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *argv], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_the_peer_benchmark_compares_parquet_and_lance_with_zarr_skip(tmp_path: Path) -> None:
    from benchmarks import bench_peers

    out = tmp_path / "new"
    _run_apart("bench_peers", ["--preset", "small", "--reps", "1", "--cold", "fadvise", "--out", str(out)])
    r = json.loads((out / "peers_small.json").read_text())
    assert r["formats"] == list(bench_peers.FORMATS)
    assert r["formats"][-4:] == ["zarr_skip_lz4", "zarr_skip_none", "zarr_skip_8k", "zarr_skip_lz4_8k"]
    for f in r["formats"]:  # one kept sample of every operation (the warm-up dropped), bytes, files
        assert all(len(r["samples_s"][f][op]) == 1 for op in bench_peers.OPS)
        assert r["disk"][f]["files"] >= 1 and r["disk"][f]["bytes_allocated"] > 0
    assert r["disk"]["parquet"]["files"] == 1 and r["summary"]["vs_zarr_skip"]["zarr_skip"]["write"] == 1.0
    assert r["load"]["verdict"] and r["cold_method"] == "fadvise"
    md = (out / "peers_small.md").read_text()
    names = [*bench_peers.FORMATS]
    assert "| metric | " + " | ".join(names) + " | parquet / zarr_skip |" in md
    # the compression variants trade bytes for speed: none stores more than lz4, lz4 more than the default
    b = {f: r["disk"][f]["bytes_allocated"] for f in r["formats"]}
    assert b["zarr_skip_none"] > b["zarr_skip_lz4"] > b["zarr_skip"]
    assert not list(out.glob(".bench-tmp-peers-*"))


# --------------------------------------------------------------------------- FUSE and S3 (benchmarks/bench_shared.py)


def test_a_step_splits_into_mini_batches_that_concatenate_back() -> None:
    import torch

    from benchmarks.bench_shared import split_rows

    m = as_mapping(jagged_payload("small", 0, step=1, payload="realistic"))
    parts = split_rows(m, 3)
    assert [len(p["keys"]) for p in parts] == [42, 43, 43]
    for k, v in m.items():
        if isinstance(v, torch.Tensor) and v.is_nested:
            rows = [t for p in parts for t in p[k].unbind()]
            assert all(torch.equal(a, b) for a, b in zip(rows, v.unbind(), strict=True))
        elif isinstance(v, torch.Tensor):
            assert torch.equal(torch.cat([p[k] for p in parts]), v)
        else:
            assert [x for p in parts for x in p[k]] == v


def test_server_counters_are_read_from_prometheus_text() -> None:
    from benchmarks.bench_shared import count_cells, delta, parse_metrics

    text = """# HELP SeaweedFS_s3_request_total Counter of s3 requests.
SeaweedFS_s3_request_total{bucket="b",code="200",type="PUT"} 7
SeaweedFS_s3_request_total{bucket="b",code="412",type="PUT"} 1
SeaweedFS_s3_request_total{bucket="",code="200",type="GET"} 3e+00
SeaweedFS_filerStore_request_total{store="leveldb2",type="insert"} 5
SeaweedFS_volumeServer_request_total{type="PUT"} 99
"""
    c = parse_metrics(text)
    assert c == {"s3 PUT": 8, "s3 GET": 3, "filer insert": 5}
    assert delta(parse_metrics(text.replace("} 7", "} 9")), c) == {"s3 PUT": 2}
    cells = count_cells([{"files": 80, "requests": {"s3 PUT": 3}}, {"files": 60}, {"files": 62}])
    assert cells == {"files": "80 / 61", "s3 PUT": "3 / 0"}


def test_the_benchmarks_find_the_test_suites_servers() -> None:
    from benchmarks.servers import test_helper

    assert callable(test_helper("_s3server", "seaweedfs").seaweedfs)
    assert callable(test_helper("_fuse", "seaweedfs_mounts").fuse_unavailable_reason)
    with pytest.raises(ImportError, match="no_such_thing"):
        test_helper("_s3server", "no_such_thing")


@pytest.mark.slow
@pytest.mark.s3
def test_the_shared_benchmark_times_and_counts_fuse_and_s3_against_local_disk(tmp_path: Path) -> None:
    from benchmarks import bench_shared
    from benchmarks.servers import test_helper

    out = tmp_path / "new"
    lax = ["--quiet-load", "1000", "--quiet-cpu", "1.5"]  # counts as quiet: its figures enter the table
    assert bench_shared.main(["--preset", "small", "--reps", "1", "--out", str(out), *lax]) == 0
    r = json.loads((out / "shared_small.json").read_text())
    fuse_ok = test_helper("_fuse", "seaweedfs_mounts").fuse_unavailable_reason() is None
    left_out = r["fuse_left_out"]  # FUSE is left out only where it cannot work, and says why
    assert set(r["backends"]) == {"local", "s3"} | (set() if left_out else {"fuse"})
    assert not left_out or not fuse_ok or left_out.startswith("mount failed")
    for b, v in r["backends"].items():
        assert len(v["write_s"]) == 1 and len(v["minibatch_s"][0]) == 4 and v["read_s"][0] > 0
        assert len(v["floor_s"]) == (0 if b == "s3" else 4)  # a plain file per mini-batch on file systems
        counts = r["counts"][b]["minibatches"]
        assert len(counts) == 4
        if b == "s3":  # every key stored is one PUT at least; the read GETs what it needs
            assert all(mb["keys"] > 0 and mb["requests"].get("s3 PUT", 0) >= mb["keys"] for mb in counts)
            assert r["counts"][b]["read"].get("s3 GET", 0) > 0
        else:
            assert all(mb["files"] > 0 for mb in counts)
    assert r["summary"]["local"]["vs_local"]["write"] == 1.0
    text = (out / "shared_small.md").read_text()
    assert "| write one mini-batch |" in text and "| floor: one plain file of a data file's size" in text
    assert left_out or "The least a mini-batch write can take" in text
    assert not list(out.glob(".bench-tmp-shared-*"))
    from benchmarks.summary import read_results, table

    rows = [ln for ln in table(read_results(out, "small"), "small") if "(shared_small.json)" in ln]
    assert len(rows) == 4 and all(ln.endswith("| quiet (shared_small.json) |") for ln in rows[2:])  # S3


@pytest.mark.slow
@pytest.mark.s3
def test_the_rename_race_counts_two_winners_and_the_one_mount_control_has_none(tmp_path: Path) -> None:
    from benchmarks import fuse_race
    from benchmarks.servers import test_helper

    reason = test_helper("_fuse", "seaweedfs_mounts").fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    rows = fuse_race.run(6, [0.0], tmp_path)
    assert [r["mounts"] for r in rows] == ["two mounts", "one mount (control)"]
    for r in rows:
        assert r["rounds"] == 6 and len(r["rename_ms"]) == 12 and 0 <= r["unseen"] <= r["two_winners"] <= 6
    assert rows[1]["two_winners"] == 0  # within one mount the rename is exclusive


# ----------------------------------------------------------------- make bench (benchmarks/suite.py, summary.py)


def _peers_result(busy: bool | None) -> dict:
    samples = {"zarr_skip": {"write": [0.010, 0.012, 0.011]}, "parquet": {"write": [0.030, 0.036, 0.033]}}
    res: dict = {"samples_s": samples}
    if busy is not None:
        res["load"] = {"busy": busy, "verdict": "BUSY: ..." if busy else "quiet: ..."}
    return res


def test_the_performance_table_shows_figures_of_quiet_runs_only() -> None:
    from benchmarks.summary import table

    row = "| peers: parquet write vs zarr_skip |"
    quiet = next(ln for ln in table({"peers": _peers_result(False)}) if ln.startswith(row))
    assert quiet == f"{row} 30.0 / **33.0** / 36.0 | 10.0 / **11.0** / 12.0 | 3.00 | quiet (peers_medium.json) |"
    busy = next(ln for ln in table({"peers": _peers_result(True)}) if ln.startswith(row))
    assert "BUSY run: not shown" in busy and "33.0" not in busy
    unknown = next(ln for ln in table({"peers": _peers_result(None)}) if ln.startswith(row))
    assert "no load record: not shown" in unknown
    missing = table({}, preset="small")
    assert any("no result (shared_small.json)" in ln for ln in missing)


def test_the_suite_hands_its_load_record_down_and_reports_each_part(tmp_path: Path) -> None:
    from benchmarks import suite

    out = tmp_path / "results"
    # thresholds no machine exceeds: this run counts as quiet, so its figures enter the table
    lax = ["--quiet-load", "1000", "--quiet-cpu", "1.5"]
    assert suite.main(["--quick", "--only", "write_floor", "--out", str(out), *lax]) == 0
    run = json.loads((out / "suite.json").read_text())
    assert [p["part"] for p in run["parts"]] == ["write_floor"] and run["parts"][0]["exit"] == 0
    part = json.loads((out / "realistic" / "write_floor_small.json").read_text())
    assert part["load"]["before"] == run["before"]  # probed once, by the suite, before any part ran
    thresholds = {"load_per_core": 1000.0, "other_cpu": 1.5, "page_cache_mb_s": 300.0}
    assert part["load"]["thresholds"] == thresholds and not part["load"]["busy"]
    md = (out / "suite.md").read_text()
    assert "| write_floor | 0 |" in md and "## Performance table (quiet runs only)" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| write, parts: the write vs the plain dump"))
    assert row.endswith("| quiet (realistic/write_floor_small.json) |") and row.count("**") == 4
    assert "| no result (small.json) |" in md  # the parts not run have no figures


@pytest.mark.slow
def test_a_bench_run_records_the_load_in_its_results(tmp_path: Path) -> None:
    from benchmarks import bench

    argv = ["--preset", "small", "--reps", "1", "--formats", "plain_dump_realistic,zarr_skip_realistic",
            "--ops", "write,read_cold", "--status-steps", "0", "--dd-mib", "0", "--cold", "fadvise",
            "--out", str(tmp_path), "--quiet-load", "1000", "--quiet-cpu", "1.5"]  # fmt: skip
    assert bench.main(argv) in (0, 1)  # 1: a target failed, which is a result, not an error
    run = json.loads((tmp_path / "small.json").read_text())
    rec = run["result"]["load"]
    assert rec["during"]["samples"] >= 2 and rec["busy"] is False  # lax thresholds: quiet
    head = (tmp_path / "small.md").read_text().splitlines()[4]
    assert head.startswith("Machine load: quiet: load ")
    # the performance table takes this run's figures, and says which rows it did not measure
    from benchmarks.summary import read_results, table

    rows = {ln.split(" | ")[0]: ln for ln in table(read_results(tmp_path, "small"), "small")}
    assert rows["| realistic step, write vs the plain dump"].endswith("| quiet (small.json) |")
    assert "not measured" in rows["| realistic step, write vs verl's `tq_batch.pt`"]


def test_stored_sizes_are_read_in_one_place_whichever_names_the_library_uses() -> None:
    from types import SimpleNamespace

    from benchmarks.measure import part_sizes

    assert part_sizes(SimpleNamespace(nbytes=100, raw_nbytes=400)) == (100, 400)  # before the rename
    assert part_sizes(SimpleNamespace(nbytes=400, nbytes_stored=100)) == (100, 400)  # numpy's names


@pytest.mark.parametrize(
    "name", ["bench", "bench_data", "bench_peers", "bench_s3", "bench_shared", "bench_tables", "few_rows", "load",
             "suite", "summary", "write_floor", "fuse_race", "block_decode", "take_phases"],
)  # fmt: skip
def test_every_benchmark_prints_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0
    assert "--require-quiet" in capsys.readouterr().out or name in ("summary", "fuse_race")  # no timings


def test_the_few_rows_benchmark_compares_every_setting(tmp_path: Path) -> None:
    from benchmarks import few_rows

    assert few_rows.main(["--presets", "small", "--reps", "1", "--rows", "8", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "few_rows.json").read_text())
    got = r["presets"]["small"]
    assert set(got["samples_s"]) == set(few_rows.SETTINGS) and got["floor_bytes"] > 0
    assert all(len(s["rows"]) == len(s["whole"]) == 1 for s in got["samples_s"].values())
    # lz4 stores more than zstd: the trade-off the table shows
    assert got["nbytes_stored"]["lz4"]["column"] > got["nbytes_stored"]["default"]["column"]
    assert "| small | auto-8k |" in (tmp_path / "few_rows.md").read_text()
    assert not list(tmp_path.glob(".bench-tmp-rows-*"))


@pytest.mark.slow
def test_the_take_phases_benchmark_splits_both_reads_by_phase_cold_and_warm(tmp_path: Path) -> None:
    from benchmarks import take_phases

    argv = ["--preset", "small", "--reps", "1", "--rows", "8", "--cold", "fadvise", "--out", str(tmp_path)]
    _run_apart("take_phases", argv)
    r = json.loads((tmp_path / "take_phases_small.json").read_text())
    assert list(r["samples_s"]) == list(take_phases.READS)
    for read, states in r["samples_s"].items():
        assert set(states) == {"cold", "warm"}
        for phases in states.values():
            assert list(phases) == list(take_phases.PHASES[read])
            assert all(len(v) == 1 and v[0] > 0 for v in phases.values())
    md = (tmp_path / "take_phases_small.md").read_text()
    assert "| zarr_skip | rows |" in md and "| lance | take |" in md and "| lance | **total** |" in md
    assert not list(tmp_path.glob(".bench-tmp-take-*"))


def test_the_read_without_a_codec_gets_zeros_for_every_zstd_block_then_the_codec_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``take_phases.no_codec``: the bound it times is a read whose zstd blocks are not
    decompressed (their values zeros), and the read after it is right again."""
    import torch

    from benchmarks import take_phases
    from zarr_skip.format import zstd_blocks

    monkeypatch.setattr(zstd_blocks, "MIN_BLOCKS", 1)  # the small step's few blocks through zstandard
    batch = as_mapping(jagged_payload("small", 0, payload="realistic"))
    zs.open_cache(tmp_path, {"t": 1}, compression=zs.Compression("auto", blocksize=8 << 10)).write(1, dict(batch))
    rows = np.arange(0, 64, 4)
    want = [batch["responses"].unbind()[int(i)] for i in rows]
    with take_phases.no_codec():
        got = zs.open_cache(tmp_path).load(1)["responses"][rows].unbind()
    assert [int(t.abs().sum()) for t in got] == [0] * len(rows)
    assert [len(t) for t in got] == [len(t) for t in want]
    got = zs.open_cache(tmp_path).load(1)["responses"][rows].unbind()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.slow
def test_the_block_decode_benchmark_times_blosc_alone_and_through_zstandard(tmp_path: Path) -> None:
    from benchmarks import block_decode

    argv = ["--preset", "small", "--reps", "1", "--per-round", "2", "--out", str(tmp_path)]
    assert block_decode.main(argv) == 0
    r = json.loads((tmp_path / "block_decode.json").read_text())
    assert list(r["frames_mb_s"]) == ["8 KiB", "16 KiB", "32 KiB", "one block"]
    assert all(len(v) == 1 and v[0] > 0 for got in r["frames_mb_s"].values() for v in got.values())
    assert set(r["reads_ms"]) == {"every core", "one core"}  # the second in a process pinned to one core
    for ops in r["reads_ms"].values():
        assert set(ops) == {"rows warm", "whole warm", "rows cold", "whole cold"}
        assert {m: len(ops["rows cold"][m]["wall"]) for m in block_decode.MODES} == {"blosc": 1, "zarr_skip": 1}
    md = (tmp_path / "block_decode.md").read_text()
    assert "| 8 KiB |" in md and "| 64 random rows, cold | one core |" in md
    assert not list(tmp_path.glob(".bench-tmp-blocks-*"))


@pytest.mark.parametrize("fmt", ["torch_save_jagged", "pickle_padded", "plain_dump_realistic", "zarr_skip_jagged"])
def test_write_next_times_a_later_step_into_a_place_holding_the_first(tmp_path: Path, fmt: str) -> None:
    """``write_next``: what a trainer pays for every step after its first. verl's formats make
    the step's directory first, as its rollout skip does (``mkdir(parents=True, exist_ok=True)``)."""
    from benchmarks import worker

    preset = {"rows": 8, "max_prompt": 16, "max_response": 16, "n": 2}
    d = tmp_path / "out"
    spec = {
        "preset": preset,
        "op": "write_next",
        "seed": 0,
        "format": fmt,
        "scratch": str(tmp_path / "s"),
        "dir": str(d),
    }
    out = worker.run_worker(spec)
    assert out["sample"] > 0
    if fmt == "zarr_skip_jagged":
        import zarr_skip as zs

        assert zs.open_cache(str(d)).steps() == [1, 2]
    else:
        names = {
            "torch_save_jagged": "1/tq_batch.pt",
            "pickle_padded": "1/gen_batch.dp",
            "plain_dump_realistic": "dump.pt",
        }
        first = d / names[fmt]
        assert first.is_file() and (d / "2" / first.name).is_file()
        assert sorted(p.name for p in d.iterdir()) == sorted({first.relative_to(d).parts[0], "2"})


def test_the_report_gives_the_median_of_each_repetitions_own_ratio() -> None:
    # a machine alternating between two speeds: each repetition's pair ran at one speed
    from benchmarks import report

    def res(samples: list[float], **more: Any) -> dict[str, Any]:
        return {"samples": samples, "median_s": sorted(samples)[len(samples) // 2], **more}

    out = {
        "formats": {
            "tq_batch_realistic": {"write": res([10.0, 20.0, 10.0, 20.0, 20.0])},
            "zarr_skip_realistic": {"write": res([9.0, 18.0, 9.0, 18.0, 10.0]), "read_cold": res([1.0])},
            "torch_save_jagged": {"write": res([1.0, 1.0])},
            "zarr_skip_jagged": {"write": res([1.0, 1.0, 1.0])},  # a repetition short: no pairs
            "pickle_padded": {"write": res([2.0, 2.0], errors=["boom"])},
            "zarr_skip_padded": {"write": res([1.0, 1.0])},
        }
    }
    # the ratio of the medians says 10 / 20 = 0.5; the pairs say 0.9 in 4 of 5 repetitions
    assert report.paired(out) == {"realistic": {"write": pytest.approx(0.9)}}
    lines = report._paired_section(report.paired(out))
    assert "| write | 0.900 |" in lines and any("zarr_skip_realistic / tq_batch_realistic" in ln for ln in lines)
    assert report._paired_section({}) == []


def test_the_command_a_report_records_reproduces_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from benchmarks.machine import command_line

    assert command_line("few_rows", ["--presets", "medium", "--reps", "3"]) == (
        "python -m benchmarks.few_rows --presets medium --reps 3"
    )
    monkeypatch.setattr(sys, "argv", ["few_rows.py", "--require-quiet"])  # None: this process's arguments
    assert command_line("bench_peers", None) == "python -m benchmarks.bench_peers --require-quiet"
