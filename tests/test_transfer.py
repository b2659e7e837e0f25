"""zarr_skip.legacy.transfer: legacy verl dump dirs <-> Zarr, bit for bit, and replay of imported steps.

Legacy directories are built as verl writes them (the dumpers and the DataProto test double
of tests/test_legacy.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_equal
from test_legacy import (
    FAKE_VERL_PROTOCOL,
    assert_dp,
    assert_payload,
    assert_td,
    dump_dp,
    dump_tq,
    make_dp,
    non_tensor,
    padded_batch,
    tq_payload,
    verl_installed,
)

import zarr_skip as zs
from zarr_skip.errors import ConfigError, IncompleteStepError, StepNotFoundError
from zarr_skip.legacy.dumps import read_minibatch, read_step, scan_legacy
from zarr_skip.legacy.transfer import coerce_meta_info, export_steps, import_legacy
from zarr_skip.trainer.manager import SkipManager

try:
    from tests import _fake_trainer as ft
except ImportError:
    import _fake_trainer as ft  # type: ignore[no-redef]

GBS = "GBS4_N2_in8_out6"
EXP = f"my_exp_proj/{GBS}"
META = {"temperature": 0.7, "timing": {"gen": 1.5}, "global_token_num": [10, 12]}


@pytest.fixture(scope="module")
def verl_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fakeverl") / "protocol.py"
    path.write_text(FAKE_VERL_PROTOCOL)
    return path


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory, verl_src: Path) -> tuple[Path, dict[int, Any]]:
    """Both kinds in both layouts, two serializations, and two incomplete steps."""
    root = tmp_path_factory.mktemp("dumps")
    fp = root / "my_exp_proj" / GBS
    want: dict[int, Any] = {}
    with verl_installed(verl_src) as verl:
        want[1] = verl.DataProto(padded_batch(4, 1), non_tensor(4, 1), dict(META))
        dump_dp(fp, 1, want[1])
        os.environ["VERL_DATAPROTO_SERIALIZATION_METHOD"] = "numpy"
        try:
            want[3] = verl.DataProto(padded_batch(6, 3), non_tensor(6, 3), {"k": 3})
            dump_dp(fp, 3, want[3])
        finally:
            del os.environ["VERL_DATAPROTO_SERIALIZATION_METHOD"]
        want[4] = [verl.DataProto(padded_batch(2, s), non_tensor(2, s), {"mb": s}) for s in (40, 41)]
        for i, dp in enumerate(want[4]):
            dump_dp(fp, 4, dp, minibatch=i)  # nested DataProtos
        dump_dp(fp, 2, want[1])
    (fp / "2" / "meta.json").unlink()
    want[5] = [tq_payload(seed=50, step=5), tq_payload(seed=51, step=5)]
    for i, payload in enumerate(want[5]):
        dump_tq(fp, 5, payload, minibatch=i)
    dump_tq(fp, 6, tq_payload(seed=60, step=6), minibatch=1)  # mini-batch 0 missing
    want[8] = tq_payload(seed=80, step=8)
    dump_tq(fp, 8, want[8], minibatch=None)  # older verl: flat
    return root, want


def _td_dict(td: Any) -> dict[str, Any]:
    values = {k: td.get(k) for k in td.keys()}  # noqa: SIM118 - iterating a TensorDict walks its rows
    return {k: v.tolist() if type(v).__name__ == "NonTensorStack" else v for k, v in values.items()}


def assert_tq_minibatch(view: Any, payload: dict[str, Any]) -> None:
    """A stored mini-batch is the rollout_tq mapping of ``payload``, exactly."""
    got = view.to_dict()
    want = {**_td_dict(payload["tensordict"]), "tags": payload["tags"], "keys": payload["keys"]}
    assert list(got) == list(want)
    for name, value in want.items():
        assert_equal(got[name], value, name)
    assert view.meta_info == {"global_steps": payload["global_steps"]}


def test_import_both_kinds_both_layouts_bit_exact(legacy: tuple[Path, dict], tmp_path: Path) -> None:
    root, want = legacy
    seen: list[tuple[int, int]] = []
    report = import_legacy(root, tmp_path / "cache", progress=lambda d, t: seen.append((d, t)))
    (warning,) = report.warnings  # verl joined "my" and "exp_proj" (or "my_exp" and "proj") with "_"
    assert report.ok and "split 'my_exp_proj' as experiment 'my', project 'exp_proj' (a guess" in warning
    assert sorted(report.experiments) == [f"{EXP}/rollout", f"{EXP}/rollout_tq"]
    assert [(s.step, s.action) for s in report.steps] == [
        (1, "imported"),
        (2, "skipped"),
        (3, "imported"),
        (4, "imported"),
        (5, "imported"),
        (6, "skipped"),
        (8, "imported"),
    ]
    by_step = {s.step: s for s in report.steps}
    assert by_step[2].reason == "legacy step incomplete: meta.json missing"
    assert "missing [0]" in by_step[6].reason and by_step[6].path == str(root / "my_exp_proj" / GBS / "6")
    assert (by_step[4].minibatches, by_step[4].rows, by_step[5].minibatches) == (2, 4, 2)
    assert seen == [(i, 5) for i in range(1, 6)]
    dp = zs.open_cache(tmp_path / "cache", experiment=f"{EXP}/rollout")
    assert dp.fingerprint == {
        "experiment_name": "my",
        "project_name": "exp_proj",
        "gen_batch_size": 4,
        "n": 2,
        "max_prompt_length": 8,
        "max_response_length": 6,
        "role": "rollout",
    }
    assert dp.steps() == [1, 3, 4]
    for step in (1, 3):
        view = dp.load(step)
        assert view.batch_type == "dataproto"
        assert_dp(view.to_dataproto(), want[step])
    for mb, src in zip(dp.load(4).minibatches, want[4], strict=True):
        assert_dp(mb.to_dataproto(), src)
    tq = zs.open_cache(tmp_path / "cache", experiment=f"{EXP}/rollout_tq")
    assert tq.steps() == [5, 8] and tq.fingerprint["role"] == "rollout_tq"
    for mb, payload in zip(tq.load(5).minibatches, want[5], strict=True):
        assert_tq_minibatch(mb, payload)
    assert_tq_minibatch(tq.load(8), want[8])


def test_import_skips_complete_steps_unless_overwrite(legacy: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = legacy
    exp_dir = root / "my_exp_proj" / GBS / "8"  # a GBS.. or step-parent dir works too
    import_legacy(exp_dir.parent, tmp_path / "c", role="custom", experiment_name="my_exp")
    cache = zs.open_cache(tmp_path / "c", experiment="my_exp_proj/GBS4_N2_in8_out6/custom")
    assert cache.fingerprint["experiment_name"] == "my_exp" and cache.steps() == [1, 3, 4, 5, 8]
    again = import_legacy(root, tmp_path / "c", role="custom", experiment_name="my_exp")
    assert not again.imported and all(s.reason.startswith(("already complete", "legacy step")) for s in again.skipped)
    runs = {i.step: i.run for i in cache.status()}
    forced = import_legacy(root, cache, role="custom", experiment_name="my_exp", overwrite=True)
    assert [s.step for s in forced.imported] == [1, 3, 4, 5, 8]
    assert all(i.run != runs[i.step] and i.complete for i in cache.status())


def test_guessed_name_split_is_warned(tmp_path: Path, verl_src: Path) -> None:
    with verl_installed(verl_src) as verl:
        dump_dp(tmp_path / "d" / "a_b_c" / GBS, 1, verl.DataProto(padded_batch(2, 0), non_tensor(2, 0), {}))
    report = import_legacy(tmp_path / "d", tmp_path / "c")
    (warning,) = report.warnings
    assert "'a_b_c'" in warning and "a guess" in warning
    with pytest.raises(ConfigError, match="not a directory"):
        import_legacy(tmp_path / "missing", tmp_path / "c")
    (tmp_path / "empty").mkdir()
    assert "no legacy verl cache" in import_legacy(tmp_path / "empty", tmp_path / "c").warnings[0]


def test_non_json_meta_info_fails_unless_coerced(tmp_path: Path, verl_src: Path) -> None:
    with verl_installed(verl_src) as verl:
        src = make_dp(verl, seed=2)  # meta_info holds a set, numpy scalars, bytes
        dump_dp(tmp_path / "d" / "e_p" / GBS, 2, src)
    report = import_legacy(tmp_path / "d", tmp_path / "c")
    (failed,) = report.failed
    assert not report.ok and "meta_info" in failed.reason and "coerce_meta" in failed.reason
    with pytest.raises(zs.CacheNotFoundError):  # nothing half-written, not even an experiment
        zs.open_cache(tmp_path / "c")
    assert import_legacy(tmp_path / "d", tmp_path / "c", coerce_meta=True).ok
    cache = zs.open_cache(tmp_path / "c", experiment=f"e_p/{GBS}/rollout")
    view = cache.load(2)
    assert view.meta_info == coerce_meta_info(src.meta_info)
    assert view.meta_info["np_scalar"] == 1.5 and view.meta_info["set"] == [1, 2]
    assert view.meta_info["pair"] == [3, None, "\x00"]
    assert_td(view.to_dataproto().batch, src.batch)


def test_a_failed_import_names_the_option_that_stores_it() -> None:
    from zarr_skip.errors import UnsupportedColumnError
    from zarr_skip.legacy.transfer import _hint

    assert "coerce_meta" in _hint(UnsupportedColumnError("meta_info: cannot store a set; it must be JSON-able"))
    assert "allow_pickle" in _hint(UnsupportedColumnError("column 'meta_info_raw': cannot store objects"))
    assert _hint(ValueError("meta_info: other")) == ""


def test_coerce_meta_info() -> None:
    got = coerce_meta_info({"a": np.float64(0.5), "b": (1, {2: np.arange(3)}), "c": {"z", "y"}, "d": object})
    assert got == {"a": 0.5, "b": [1, {"2": [0, 1, 2]}], "c": ["y", "z"], "d": "<class 'object'>"}
    assert type(got["a"]) is float and json.dumps(got)


def test_export_then_import_round_trip(legacy: tuple[Path, dict], tmp_path: Path, verl_src: Path) -> None:
    root, want = legacy
    import_legacy(root, tmp_path / "c1")
    out = tmp_path / "out"
    seen: list[tuple[int, int]] = []
    for role in ("rollout", "rollout_tq"):
        cache = zs.open_cache(tmp_path / "c1", experiment=f"{EXP}/{role}")
        report = export_steps(cache, cache.steps(), out, progress=lambda d, t: seen.append((d, t)))
        assert all(s.action == "exported" for s in report.steps)
    assert seen == [(1, 3), (2, 3), (3, 3), (1, 2), (2, 2)]
    (exp,) = scan_legacy(out)
    assert exp.path == out.resolve() / "my_exp_proj" / GBS
    assert [(s.step, s.kind, s.layout, len(s.minibatches)) for s in exp.steps] == [
        (1, "dp", "flat", 1),
        (3, "dp", "flat", 1),
        (4, "dp", "flat", 1),
        (5, "tq", "nested", 2),
        (8, "tq", "nested", 1),
    ]
    assert json.loads((exp.path / "1" / "meta.json").read_text()) == {"global_steps": 1}
    assert json.loads((exp.path / "5" / "1" / "meta.json").read_text()) == {"global_steps": 5, "num_trajectories": 4}
    for step in (1, 3):
        (got,) = read_step(exp.get_step(step))
        assert_dp(got, want[step])
    (merged,) = read_step(exp.get_step(4))  # auto layout: one gen_batch.dp per step, as verl writes
    assert len(merged) == 4 and list(merged.meta_info) == ["mb"]
    for got, payload in zip(read_step(exp.get_step(5)), want[5], strict=True):
        assert_payload(got, payload)
    # step 8 (one mini-batch, from a flat dump) beside step 5 (two): the import would infer it
    # needs two; its file is read directly here
    assert not exp.get_step(8).complete and "1 of 2" in (exp.get_step(8).reason or "")
    (mb8,) = exp.get_step(8).minibatches
    assert_payload(read_minibatch(mb8.path), want[8])
    with verl_installed(verl_src) as verl:  # plain verl loads what was exported
        loaded = verl.DataProto.load_from_disk(exp.path / "1" / "gen_batch.dp")
        assert type(loaded) is verl.DataProto and loaded.setstate_ran
        assert_dp(loaded, want[1])
    plain = torch.load(exp.path / "5" / "0" / "tq_batch.pt", weights_only=False)
    assert plain["keys"] == want[5][0]["keys"] and plain["global_steps"] == 5
    again = import_legacy(out, tmp_path / "c2")
    assert [s.step for s in again.imported] == [1, 3, 4, 5]  # step 8: 1 of 2 mini-batches (inferred)
    assert [s.step for s in again.skipped if "1 of 2" in s.reason] == [8]
    again8 = import_legacy(out, tmp_path / "c2", expected_minibatches=1)
    assert [s.step for s in again8.imported if s.step == 8] == [8]  # parameter_sync_step says so
    for role, steps in (("rollout", (1, 3)), ("rollout_tq", (5, 8))):
        a = zs.open_cache(tmp_path / "c1", experiment=f"{EXP}/{role}")
        b = zs.open_cache(tmp_path / "c2", experiment=f"{EXP}/{role}")
        for step in steps:
            assert_equal(b.load(step).to_dict(), a.load(step).to_dict(), f"step {step}")
            assert b.load(step).meta_info == a.load(step).meta_info


def test_export_layouts_and_errors(legacy: tuple[Path, dict], tmp_path: Path) -> None:
    root, want = legacy
    import_legacy(root, tmp_path / "c")
    dp = zs.open_cache(tmp_path / "c", experiment=f"{EXP}/rollout")
    tq = zs.open_cache(tmp_path / "c", experiment=f"{EXP}/rollout_tq")
    export_steps(dp, [4], tmp_path / "nested", layout="nested")
    export_steps(tq, [5], tmp_path / "flat", layout="flat")
    (exp,) = scan_legacy(tmp_path / "nested")
    for got, src in zip(read_step(exp.get_step(4)), want[4], strict=True):
        assert_dp(got, src)
    (exp,) = scan_legacy(tmp_path / "flat")
    ((got,),) = [read_step(exp.get_step(5))]
    assert exp.get_step(5).layout == "flat" and got["keys"] == want[5][0]["keys"] + want[5][1]["keys"]
    with pytest.raises(FileExistsError, match=r"\[5\] exist; pass overwrite=True \(on the CLI --overwrite\)"):
        export_steps(tq, [5], tmp_path / "flat")
    export_steps(tq, [5], tmp_path / "flat", overwrite=True)  # nested now: the flat file is gone
    (exp,) = scan_legacy(tmp_path / "flat")
    assert exp.get_step(5).layout == "nested" and exp.complete_steps == [5]
    with pytest.raises(StepNotFoundError):
        export_steps(dp, [2], tmp_path / "x")
    dp_rw = zs.open_cache(tmp_path / "c", dp.fingerprint, experiment=dp.experiment)
    dp_rw.write(9, want[1], expected=2)
    with pytest.raises(IncompleteStepError, match="step 9 is writing"):
        export_steps(dp, [1, 9], tmp_path / "x")
    assert not (tmp_path / "x").exists()  # checked before anything is written
    with pytest.raises(ConfigError, match="layout"):
        export_steps(dp, [1], tmp_path / "x", layout="deep")
    plain = zs.open_cache(tmp_path / "other", {"model": "m"})
    plain.write(0, {"x": torch.arange(3)})
    with pytest.raises(ConfigError, match="verl's experiment_name"):
        export_steps(plain, [0], tmp_path / "x")


def test_imported_tq_step_replays_through_the_skip_manager(tmp_path: Path) -> None:
    """run 1 fills a cache; its steps go out to verl's layout and into a new cache; run 2 replays them."""
    SkipManager.reset()
    try:
        config1 = ft.make_config(tmp_path / "c1", role="rollout_tq", steps=[1, 2], train_batch_size=8, sync_steps=2)
        run1 = ft.V1Trainer(config1, seed=1)
        run1.fit(2)
        src = zs.open_cache(tmp_path / "c1", experiment="fake_exp_fake_proj/GBS4_N2_in8_out16/rollout_tq")
        export_steps(src, [1, 2], tmp_path / "legacy")
        report = import_legacy(tmp_path / "legacy", tmp_path / "c2", experiment_name="fake_exp")
        assert [s.step for s in report.imported] == [1, 2] and not report.warnings
        config2 = ft.make_config(tmp_path / "c2", role="rollout_tq", steps=[1, 2], train_batch_size=8, sync_steps=2)
        run2 = ft.V1Trainer(config2, seed=2)
        run2.fit(2)
        assert run2.calls == {1: 0, 2: 0}  # both steps served from the imported cache
        for key, (fields, tags, keys) in run2.records.items():
            fields1, tags1, keys1 = run1.records[key]
            ft.assert_rows_equal(fields, fields1)
            assert tags == tags1 and len(keys) == len(keys1)
    finally:
        SkipManager.reset()
