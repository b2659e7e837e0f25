"""SkipManager against a simulated verl trainer (tests/_fake_trainer.py) and the real cache."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zarr_skip import open_cache
from zarr_skip.errors import ConfigError, GroupMismatchError
from zarr_skip.format import layout
from zarr_skip.trainer.manager import SkipManager
from zarr_skip.trainer.remap import SampleIdError
from zarr_skip.trainer.skipconfig import fingerprint

try:
    from tests import _fake_trainer as ft
except ImportError:
    import _fake_trainer as ft  # type: ignore[no-redef]

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _reset_manager() -> Any:
    SkipManager.reset()
    yield
    SkipManager.reset()


def _cache(config: Any, role: str) -> Any:
    return open_cache(config.skip[role].dump_dir, fingerprint(config, role))


# ---------------------------------------------------------------------------------------------
# pass-through, configuration, disabled mode


def test_decorators_pass_through_before_init() -> None:
    agent = ft.AgentLoopManager(seed=1)
    out = agent.generate_sequences(ft.make_prompts(["a", "b"]))
    assert agent.calls == 1 and len(out) == 2
    assert not SkipManager.is_active("rollout", 1)


def test_annotate_rejects_unknown_role_and_phase() -> None:
    with pytest.raises(ValueError, match="role must be one of rollout, async_rollout"):
        SkipManager.annotate(role="rollout_tq")
    with pytest.raises(ValueError, match="role must be one of rollout_tq"):
        SkipManager.annotate_tq(role="rollout", phase="submit")
    with pytest.raises(ValueError, match="phase must be 'submit' or 'sample'"):
        SkipManager.annotate_tq(role="rollout_tq", phase="both")


def test_init_rejects_bad_config(tmp_path: Path) -> None:
    config = ft.make_config(tmp_path, role="rollout", action="cach")
    with pytest.raises(ConfigError, match=r"^skip\.rollout\.action: expected 'cache' or 'repeat', got 'cach'"):
        SkipManager.init(config)
    config = ft.make_config(tmp_path, role="rollout_tq", n=0)
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.rollout\.n: "):
        SkipManager.init(config)
    config = ft.make_config(tmp_path, role="rollout")
    config.skip.rollout.compression = "brotli"
    with pytest.raises(ConfigError, match=r"^skip\.rollout\.compression: .*brotli"):
        SkipManager.init(config)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("compression", ["lz4", "none", "zstd:1"])
def test_compression_setting_is_used(tmp_path: Path, compression: str) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1])
    config.skip.rollout.compression = compression
    run1 = ft.run_sync(config, 1, seed=1)
    run2 = ft.run_sync(config, 1, seed=2)
    assert run2.calls == {1: 0}
    ft.assert_dataproto_equal(run2.outputs[1], run1.outputs[1])
    docs = [json.loads(f.read_text()) for f in (tmp_path / "c").rglob("zarr.json")]
    parts = [d["attributes"].get(layout.PART_ATTR) for d in docs]
    used = [p["compression"] for p in parts if p]
    name, _, level = compression.partition(":")
    assert used and all(c["name"] == name for c in used)
    assert not level or all(c["level"] == int(level) for c in used)


def test_is_active_and_config(tmp_path: Path) -> None:
    SkipManager.init(ft.make_config(tmp_path, role="rollout", steps=[2, 5]))
    SkipManager.set_step(5)
    assert SkipManager.is_active("rollout") and SkipManager.is_active("rollout", 2)
    assert not SkipManager.is_active("rollout", 3) and not SkipManager.is_active("rollout_tq", 5)
    assert SkipManager.config().rollout.steps == (2, 5)


@pytest.mark.parametrize("role", ["rollout", "rollout_tq", "async_rollout"])
@pytest.mark.parametrize("enable", [False, True])
def test_no_io_when_disabled_or_unlisted(
    tmp_path: Path, role: str, enable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "cache"
    # disabled: listed steps are ignored; enabled: no listed step is ever reached
    config = ft.make_config(dump, role=role, steps=[1, 2] if not enable else [99], enable=enable)
    monkeypatch.setitem(sys.modules, "transfer_queue", None)  # importing it would fail
    if role == "rollout":
        run = ft.run_sync(config, 2, seed=1)
        assert run.calls == {1: 1, 2: 1}
    elif role == "async_rollout":
        _, calls = ft.run_async(config, [0, 1, 2], seed=1)
        assert len(calls) == 3
    else:
        trainer = ft.V1Trainer(config, seed=1)
        trainer.fit(2, transfer_queue=None)
        assert trainer.calls == {1: 1, 2: 1}
    assert not dump.exists()


# ---------------------------------------------------------------------------------------------
# rollout


def test_rollout_run2_replays_every_listed_step(tmp_path: Path) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1, 2, 4])
    run1 = ft.run_sync(config, 5, seed=1)
    assert run1.calls == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    assert _cache(config, "rollout").steps() == [1, 2, 4]

    run2 = ft.run_sync(config, 5, seed=2)
    assert run2.calls == {1: 0, 2: 0, 3: 1, 4: 0, 5: 1}
    assert run2.prompts == run1.prompts
    for step in (1, 2, 4):
        ft.assert_dataproto_equal(run2.outputs[step], run1.outputs[step])
        assert run2.outputs[step].non_tensor_batch["extra_info"][0]["seed"] == 1
    assert run2.outputs[3].meta_info["seed"] == 2
    out = run2.outputs[1]
    assert out.batch["old_log_probs"].dtype == torch.bfloat16
    assert isinstance(out.non_tensor_batch["response_text"], np.ndarray)


def test_rollout_validation_bypasses_cache(tmp_path: Path) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1, 2])
    run1 = ft.run_sync(config, 2, seed=1, validate_at=[1, 2])  # asserts each validation call ran
    run2 = ft.run_sync(config, 2, seed=2, validate_at=[1, 2])
    assert run2.calls == {1: 0, 2: 0}
    cache = _cache(config, "rollout")
    assert cache.steps() == [1, 2]
    assert len(cache.load(1)) == 4  # the training batch, not the 2 validation prompts
    ft.assert_dataproto_equal(run2.outputs[1], run1.outputs[1])

    # validation through the ``prompts=`` keyword too
    SkipManager.init(config)
    SkipManager.set_step(1)
    agent = ft.AgentLoopManager(seed=3)
    out = agent.generate_sequences(prompts=ft.make_prompts(["v"], validate=True))
    assert agent.calls == 1 and out.meta_info["seed"] == 3


def test_rollout_repeat_with_missing_steps(tmp_path: Path) -> None:
    dump = tmp_path / "c"
    run1 = ft.run_sync(ft.make_config(dump, role="rollout", steps=[2]), 2, seed=1)
    repeat = ft.make_config(dump, role="rollout", steps=[1, 2, 3, 4], action="repeat")
    run2 = ft.run_sync(repeat, 4, seed=2)
    assert run2.calls == {1: 0, 2: 0, 3: 0, 4: 0}
    for step in (1, 2, 3, 4):
        ft.assert_dataproto_equal(run2.outputs[step], run1.outputs[2])
    assert _cache(repeat, "rollout").steps() == [2]  # repeat hits store nothing


def test_rollout_repeat_with_empty_cache_generates_and_stores(tmp_path: Path) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1, 2], action="repeat")
    run1 = ft.run_sync(config, 2, seed=1)
    assert run1.calls == {1: 1, 2: 0}  # step 2 repeats step 1, stored just before
    assert _cache(config, "rollout").steps() == [1]


def test_rollout_store_failure_keeps_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1])
    real = ft.generate

    def unstorable(prompts: Any, seed: int) -> Any:
        out = real(prompts, seed)
        out.non_tensor_batch["weird"] = np.array([object() for _ in range(len(out))], dtype=object)
        return out

    monkeypatch.setattr(ft, "generate", unstorable)
    with caplog.at_level(logging.ERROR, logger="zarr_skip.trainer.manager"):
        run = ft.run_sync(config, 1, seed=1)
    assert "weird" in run.outputs[1].non_tensor_batch
    assert "could not store step 1" in caplog.text
    assert _cache(config, "rollout").steps() == []


# ---------------------------------------------------------------------------------------------
# async_rollout


def test_async_rollout_roundtrip(tmp_path: Path) -> None:
    config = ft.make_config(tmp_path / "c", role="async_rollout", steps=[1, 2, 3, 5])
    out1, calls1 = ft.run_async(config, range(7), seed=1)
    assert len(calls1) == 7
    assert _cache(config, "async_rollout").steps() == [1, 2, 3, 5]
    out2, calls2 = ft.run_async(config, range(7), seed=2)
    assert sorted(calls2) == ["uid_sample_0_0", "uid_sample_0_4", "uid_sample_0_6"]
    for step in (1, 2, 3, 5):
        ft.assert_dataproto_equal(out2[step], out1[step])
    assert out2[4].meta_info["seed"] == 2


def test_async_rollout_bad_uid(tmp_path: Path) -> None:
    SkipManager.init(ft.make_config(tmp_path / "c", role="async_rollout", steps=[1]))
    rollouter = ft.Rollouter(seed=1)
    with pytest.raises(SampleIdError, match="'prompt-7'"):
        asyncio.run(rollouter.generate_sequences_single(ft.make_prompts(["x"], ["prompt-7"])))
    with pytest.raises(ValueError, match="non_tensor_batch\\['uid'\\]"):
        asyncio.run(rollouter.generate_sequences_single(ft.make_prompts(["x"])))


def test_roles_have_separate_namespaces(tmp_path: Path) -> None:
    dump = tmp_path / "shared"
    ft.run_sync(ft.make_config(dump, role="rollout", steps=[1]), 1, seed=1)
    ft.run_async(ft.make_config(dump, role="async_rollout", steps=[1]), [1], seed=1)
    names = open_cache(dump).experiments()
    assert sorted(names) == [
        "fake_exp_fake_proj/GBS4_N2_in8_out16/async_rollout",
        "fake_exp_fake_proj/GBS4_N2_in8_out16/rollout",
    ]
    assert {fp["role"] for fp in names.values()} == {"rollout", "async_rollout"}


# ---------------------------------------------------------------------------------------------
# rollout_tq


def _assert_replayed(run1: ft.V1Trainer, run2: ft.V1Trainer, steps: list[int]) -> None:
    for (step, index), (fields, tags, keys) in run2.records.items():
        if step not in steps:
            continue
        fields1, tags1, keys1 = run1.records[(step, index)]
        ft.assert_rows_equal(fields, fields1)
        assert tags == tags1
        assert [k.rsplit("_", 2)[1:] for k in keys] == [k.rsplit("_", 2)[1:] for k in keys1]
        assert not set(keys) & set(keys1)  # fresh uids


@pytest.mark.parametrize("sync_steps", [1, 4])
def test_rollout_tq_run2_replays_every_listed_step(tmp_path: Path, sync_steps: int) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout_tq", steps=[1, 3], train_batch_size=8, sync_steps=sync_steps)
    run1 = ft.V1Trainer(config, seed=1)
    run1.fit(3)
    cache = _cache(config, "rollout_tq")
    assert cache.steps() == [1, 3]
    view = cache.load(3)
    assert len(view.minibatches) == sync_steps and len(view) == 16
    assert view.meta_info == {"global_steps": 3}

    run2 = ft.V1Trainer(config, seed=2)
    run2.fit(3)
    assert run2.calls == {1: 0, 2: 1, 3: 0}
    assert run2.loader.drawn == run1.loader.drawn  # the dataloader stays aligned on hits
    _assert_replayed(run1, run2, [1, 3])
    fields, tags, _ = run2.records[(3, 0)]
    assert all(t["global_steps"] == t["min_global_steps"] == t["max_global_steps"] == 3 for t in tags)
    assert fields["extra_info"][0]["seed"] == 1
    assert fields["responses"][0].dtype == torch.int64 and fields["rm_scores"][0].dtype == torch.bfloat16
    assert run2.records[(2, 0)][0]["extra_info"][0]["seed"] == 2


def test_rollout_tq_extra_samples_are_not_stored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = ft.make_config(tmp_path / "c", role="rollout_tq", steps=[1], train_batch_size=8, sync_steps=2)
    trainer = ft.V1Trainer(config, seed=1)
    trainer.sync_steps = 4  # the trainer samples more often than the config says
    with caplog.at_level(logging.INFO, logger="zarr_skip.trainer.manager"):
        trainer.fit(1)
    assert caplog.text.count("this sample is not stored") == 2
    view = _cache(config, "rollout_tq").load(1)
    assert len(view.minibatches) == 2 and len(view) == 8


def test_rollout_tq_repeat_with_missing_steps(tmp_path: Path) -> None:
    dump = tmp_path / "c"
    run1 = ft.V1Trainer(ft.make_config(dump, role="rollout_tq", steps=[2], train_batch_size=8), seed=1)
    run1.fit(2)
    repeat = ft.make_config(dump, role="rollout_tq", steps=[1, 2, 3], action="repeat", train_batch_size=8)
    run2 = ft.V1Trainer(repeat, seed=2)
    run2.fit(3)
    assert run2.calls == {1: 0, 2: 0, 3: 0}
    for step in (1, 2, 3):
        fields, tags, _ = run2.records[(step, 0)]
        ft.assert_rows_equal(fields, run1.records[(2, 0)][0])
        assert all(t["global_steps"] == step for t in tags)


def test_rollout_tq_group_mismatch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump = tmp_path / "c"
    ft.V1Trainer(ft.make_config(dump, role="rollout_tq", steps=[1], train_batch_size=4), seed=1).fit(1)
    # same fingerprint (gen_batch_size is fixed), twice the prompts
    strict = ft.make_config(dump, role="rollout_tq", steps=[1], train_batch_size=8, on_group_mismatch="error")
    with pytest.raises(GroupMismatchError, match="4 prompt groups but the batch has 8 prompts"):
        ft.V1Trainer(strict, seed=2).fit(1)
    lenient = ft.make_config(dump, role="rollout_tq", steps=[1], train_batch_size=8)
    trainer = ft.V1Trainer(lenient, seed=2)
    with caplog.at_level(logging.WARNING, logger="zarr_skip.trainer.remap"):
        trainer.fit(1)
    assert trainer.calls == {1: 0} and "groups are reused cyclically" in caplog.text
    fields = trainer.records[(1, 0)][0]
    assert fields["raw_prompt"][:8] == fields["raw_prompt"][8:]


def test_rollout_tq_imports_transfer_queue_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tq = ft.FakeTQ()
    module = types.ModuleType("transfer_queue")
    module.kv_batch_get, module.kv_batch_put = tq.kv_batch_get, tq.kv_batch_put  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transfer_queue", module)
    config = ft.make_config(tmp_path / "c", role="rollout_tq", steps=[1])
    ft.V1Trainer(config, seed=1, tq=tq).fit(1, transfer_queue=None)
    run2 = ft.V1Trainer(config, seed=2, tq=tq)
    run2.fit(1, transfer_queue=None)
    assert run2.calls == {1: 0}


def test_rollout_tq_missing_transfer_queue_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transfer_queue", None)
    config = ft.make_config(tmp_path / "c", role="rollout_tq", steps=[1])
    with pytest.raises(ImportError, match="skip.rollout_tq needs TransferQueue"):
        ft.V1Trainer(config, seed=1).fit(1, transfer_queue=None)


@pytest.mark.slow
def test_rollout_tq_killed_mid_step_regenerates_only_that_step(tmp_path: Path) -> None:
    dump, marker = tmp_path / "c", tmp_path / "marker"
    cmd = [
        sys.executable,
        str(TESTS / "_fake_trainer.py"),
        str(dump),
        "--steps",
        "1,2,3",
        "--total-steps",
        "3",
        "--sync-steps",
        "4",
        "--train-batch-size",
        "8",
        "--seed",
        "1",
        "--kill-at",
        "2:1",
        "--marker",
        str(marker),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if proc.poll() is not None:
                pytest.fail(f"trainer exited early ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "trainer did not reach step 2"
            time.sleep(0.05)
        proc.kill()  # SIGKILL: no cleanup of any kind
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()

    config = ft.make_config(dump, role="rollout_tq", steps=[1, 2, 3], train_batch_size=8, sync_steps=4)
    states = {i.step: i for i in _cache(config, "rollout_tq").status()}
    assert states[1].complete and not states[2].complete and 3 not in states
    assert states[2].state == "abandoned"

    run2 = ft.V1Trainer(config, seed=2)
    run2.fit(3)
    assert run2.calls == {1: 0, 2: 1, 3: 1}
    assert _cache(config, "rollout_tq").steps() == [1, 2, 3]

    run3 = ft.V1Trainer(config, seed=3)
    run3.fit(3)
    assert run3.calls == {1: 0, 2: 0, 3: 0}
    _assert_replayed(run2, run3, [1, 2, 3])
    seeds = {step: {e["seed"] for i in range(4) for e in run3.records[(step, i)][0]["extra_info"]} for step in (1, 2)}
    assert seeds == {1: {1}, 2: {2}}  # step 2 holds run 2's data only, nothing of the killed run
    view = _cache(config, "rollout_tq").load(2)
    assert len(view.minibatches) == 4 and len(view) == 16


def test_rollout_tq_restart_with_a_fixed_run_id_regenerates_the_interrupted_step(tmp_path: Path) -> None:
    """With ``skip.rollout_tq.run_id`` set, a restarted trainer is the same run: its step 1 kept
    the killed trainer's first mini-batch (the same write token returned it, dropping the new
    one) and added its own second one, so step 1 replayed two runs' prompts mixed."""
    config = ft.make_config(tmp_path / "c", role="rollout_tq", steps=[1], train_batch_size=8, sync_steps=2)
    config.skip.rollout_tq.run_id = "my-run"

    def die(step: int, index: int) -> None:
        raise KeyboardInterrupt  # after mini-batch 0 of step 1 is stored

    with pytest.raises(KeyboardInterrupt):
        ft.V1Trainer(config, seed=1).fit(1, die)
    assert _cache(config, "rollout_tq").info(1).done == 1

    SkipManager.reset()
    run2 = ft.V1Trainer(config, seed=2)
    run2.fit(1)
    view = _cache(config, "rollout_tq").load(1)
    assert len(view.minibatches) == 2 and {e["seed"] for e in view["extra_info"][:]} == {2}
    run3 = ft.V1Trainer(config, seed=3)
    run3.fit(1)
    assert run3.calls == {1: 0}
    _assert_replayed(run2, run3, [1])


def test_rollout_restart_with_a_fixed_run_id_stores_the_step_a_killed_write_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write killed mid-way leaves its claim; the restarted trainer, being the same run, found
    every mini-batch of the step "written or being written" and never stored it again."""
    from zarr_skip.store import writer

    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1])
    config.skip.rollout.run_id = "my-run"
    with monkeypatch.context() as m:  # a kill during the write: no clean-up runs
        m.setattr(writer, "_discard", lambda *args: None)
        m.setattr(writer, "_forget_run_if_empty", lambda *args: None)
        m.setattr(writer, "_write_arrays", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            ft.run_sync(config, 1, seed=1)
    assert not _cache(config, "rollout").info(1).complete

    run2 = ft.run_sync(config, 1, seed=2)
    assert run2.calls == {1: 1} and _cache(config, "rollout").steps() == [1]
    run3 = ft.run_sync(config, 1, seed=3)
    assert run3.calls == {1: 0}
    ft.assert_dataproto_equal(run3.outputs[1], run2.outputs[1])


def test_the_trainers_tokenizer_and_model_paths_are_recorded_for_readers(tmp_path: Path) -> None:
    from zarr_skip.synthetic import TOKENIZER_PATH
    from zarr_skip.views import tokenizer_for

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes(TOKENIZER_PATH.read_bytes())
    config = ft.make_config(tmp_path / "c", role="rollout", steps=[1])
    config.actor_rollout_ref.model = {"path": str(model)}
    ft.run_sync(config, 1, seed=1)
    reader = open_cache(tmp_path / "c")
    assert reader.attributes == {"model": str(model)}
    assert tokenizer_for(reader.load(1)) is not None  # browsing finds it by itself
    config.actor_rollout_ref.model.tokenizer_path = str(model / "tokenizer.json")
    SkipManager.reset()
    run = ft.run_sync(config, 1, seed=2)
    assert run.calls == {1: 0}  # replayed, and the tokenizer path recorded on top
    assert open_cache(tmp_path / "c").attributes == {"model": str(model), "tokenizer": str(model / "tokenizer.json")}


def test_a_step_another_live_process_of_the_run_writes_is_left_to_it(tmp_path: Path) -> None:
    """Before writing a step, the manager discards what an earlier process of its run left, but
    never a step that another live process of the run is writing: only once that one is gone."""
    from helpers import FINGERPRINT

    from zarr_skip.trainer.manager import discard_interrupted

    code = (
        "import sys; sys.path.insert(0, 'tests'); import zarr_skip as zs; from helpers import FINGERPRINT, make_batch\n"
        f"zs.open_cache({str(tmp_path / 'c')!r}, FINGERPRINT, run_id='my-run').write(1, make_batch(4), expected=2)\n"
        "print('ready', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        cache = open_cache(tmp_path / "c", FINGERPRINT, run_id="my-run")
        assert cache.info(1).state == "writing"
        discard_interrupted(cache, 1, "rollout_tq")
        assert cache.info(1).done == 1  # the live writer's mini-batch stays
    finally:
        child.communicate("")  # it exits: its mini-batch is what an earlier process left
    discard_interrupted(cache, 1, "rollout_tq")
    assert cache.steps() == [] and 1 not in [i.step for i in cache.status()]
