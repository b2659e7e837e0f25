"""``skip.rollout_tq`` through verl's real ``annotate_tq`` decorators, and the legacy fallback.

TransferQueue is the in-memory stand-in of ``verl_fakes`` (``test_ray.py`` also runs the real
one). Each scenario runs with verl's own classes and with zarr_skip's, on the same inputs.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from verl.utils.skip import SkipManager
from verl_fakes import (
    FakeTransferQueue,
    ReplayBuffer,
    RolloutWorker,
    TqTrainer,
    assert_same,
    generated_dataproto,
    make_config,
    prompts_dataproto,
    run_tq_step,
)

import zarr_skip as zs
import zarr_skip.integrations.verl as zv
from zarr_skip.trainer.skipconfig import fingerprint

IMPLS = ("verl", "zarr")


def use(impl: str, **options: Any) -> None:
    zv.uninstall()
    if impl == "zarr":
        zv.install(**options)


def tq_run(
    impl: str, cfg: Any, steps: list[int], *, seed: int, prompts: int | None = None, **options: Any
) -> tuple[FakeTransferQueue, TqTrainer]:
    """A fresh process's view of the V1 trainer: init, then one training step per ``steps``."""
    use(impl, **options)
    tq = FakeTransferQueue().install()
    SkipManager.init(cfg)
    psync = SkipManager.skip_instances["rollout_tq"].parameter_sync_step
    trainer = TqTrainer(tq, prompts=prompts or cfg.data.train_batch_size, n=cfg.actor_rollout_ref.rollout.n, seed=seed)
    buffer = ReplayBuffer(tq)
    for step in steps:
        run_tq_step(trainer, buffer, step, psync)
    return tq, trainer


def injected(tq: FakeTransferQueue) -> list[dict[str, Any]]:
    """The puts a cache hit made (the trainer's own puts are absent on a hit)."""
    return tq.puts


def tq_cache(cfg: Any) -> zs.Cache:
    return zs.open_cache(cfg.skip.rollout_tq.dump_dir, fingerprint(cfg, "rollout_tq"))


@pytest.mark.parametrize("prompts", [4, 3, 6], ids=["same", "fewer", "more"])
@pytest.mark.parametrize("psync", [1, 4])
def test_rollout_tq_injects_what_verl_injects(tmp_path: Path, psync: int, prompts: int) -> None:
    puts = {}
    for impl in IMPLS:
        cfg = make_config(tmp_path / impl, role="rollout_tq", steps=[1, 2], psync=psync, prompts=4, n=2)
        _, trainer = tq_run(impl, cfg, [1, 2, 3], seed=1)
        assert trainer.generated == [1, 2, 3]
        tq, trainer = tq_run(impl, cfg, [1, 2], seed=2, prompts=prompts)
        assert trainer.generated == []  # no rollout on a hit
        puts[impl] = injected(tq)
        assert len(puts[impl]) == 4  # trajectories + prompt markers, for each of 2 steps
    for i, (ours, theirs) in enumerate(zip(puts["zarr"], puts["verl"], strict=True)):
        assert_same(ours, theirs, f"put {i}")
    info = tq_cache(make_config(tmp_path / "zarr", role="rollout_tq", steps=[1, 2], psync=psync)).status()
    assert [(i.step, i.complete, i.expected, i.rows) for i in info] == [(1, True, psync, 8), (2, True, psync, 8)]


def test_rollout_tq_injected_rows_are_the_generated_groups(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, role="rollout_tq", steps=[1], psync=2, prompts=3, n=2)
    first, trainer1 = tq_run("zarr", cfg, [1], seed=1)
    generated = {
        k: v for k, v in zip(first.puts[0]["keys"], first.puts[0]["fields"].get("responses").unbind(), strict=True)
    }
    tq, trainer2 = tq_run("zarr", cfg, [1], seed=2)
    put = tq.puts[0]
    old_uid = {new: old for new, old in zip(trainer2.last_uids, trainer1.last_uids, strict=True)}
    for key, row, tag in zip(put["keys"], put["fields"].get("responses").unbind(), put["tags"], strict=True):
        uid, session, _ = key.rsplit("_", 2)
        assert row.equal(generated[f"{old_uid[uid]}_{session}_0"])
        assert tag["global_steps"] == tag["min_global_steps"] == tag["max_global_steps"] == 1
    assert tq.puts[1]["keys"] == trainer2.last_uids
    assert tq.puts[1]["tags"] == [{"is_prompt": True, "status": "finished", "global_steps": 1}] * 3


def test_rollout_tq_repeat_retags_for_the_current_step(tmp_path: Path) -> None:
    puts = {}
    for impl in IMPLS:
        tq_run(impl, make_config(tmp_path / impl, role="rollout_tq", steps=[2], psync=2), [2], seed=1)
        cfg = make_config(tmp_path / impl, role="rollout_tq", steps=[5], psync=2, action="repeat")
        tq, trainer = tq_run(impl, cfg, [5], seed=3)
        assert trainer.generated == []
        puts[impl] = tq.puts
    assert {t["global_steps"] for t in puts["zarr"][0]["tags"]} == {5}
    for ours, theirs in zip(puts["zarr"], puts["verl"], strict=True):
        assert_same(ours, theirs)


@pytest.mark.parametrize("run_id", [None, "fixed"], ids=["new run id", "fixed run id"])
def test_rollout_tq_interrupted_step_is_regenerated_by_one_run(tmp_path: Path, run_id: str | None) -> None:
    """2 of 4 mini-batches written, then the process dies: the next run regenerates the step
    whole. With a fixed run id (``ZARR_SKIP_RUN_ID``) the restarted process is the same run:
    it discards what the dead one left (its writes took indices 2 and 3 and mixed the two
    processes' rows)."""
    options = {} if run_id is None else {"run_id": run_id}
    cfg = make_config(tmp_path, role="rollout_tq", steps=[1], psync=4, prompts=4, n=2)
    use("zarr", **options)
    tq = FakeTransferQueue().install()
    SkipManager.init(cfg)
    trainer, buffer = TqTrainer(tq, prompts=4, n=2, seed=1), ReplayBuffer(tq)
    SkipManager.set_step(1)
    trainer._add_batch_to_generate()
    buffer.sample(1, "train", 2)
    buffer.sample(1, "train", 2)  # ... killed here
    status = tq_cache(cfg).status()
    assert (status[0].complete, status[0].done) == (False, 2)

    _, trainer = tq_run("zarr", cfg, [1], seed=2, **options)
    assert trainer.generated == [1]  # a partial step is never served
    run = SkipManager.skip_instances["rollout_tq"].cache().run_id
    info = tq_cache(cfg).info(1)
    assert (info.complete, info.done, info.run, info.stale_runs) == (True, 4, run, ())
    keys = tq_cache(cfg).load(1)["keys"].read()
    assert sorted(k.rsplit("_", 2)[0] for k in keys) == sorted(trainer.last_uids * 2)

    _, trainer = tq_run("zarr", cfg, [1], seed=3, **options)
    assert trainer.generated == []


def test_rollout_tq_without_transfer_queue_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(tmp_path, role="rollout_tq", steps=[1])
    tq_run("zarr", cfg, [1], seed=1)
    monkeypatch.setitem(__import__("sys").modules, "transfer_queue", None)
    role = SkipManager.skip_instances["rollout_tq"]
    with pytest.raises(zv.VerlNotInstalledError, match="pip install TransferQueue"):
        role.load_dump_data(step=1, new_prompt_uids=["a"], n=2, global_steps=1)


# ------------------------------------------------------------------------------ legacy import


def test_import_legacy_serves_and_stores_a_verl_rollout_dump(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, steps=[1, 2])
    use("verl")
    SkipManager.init(cfg)
    worker = RolloutWorker()
    for step in (1, 2):
        SkipManager.set_step(step)
        worker.generate_sequences(prompts_dataproto())
    SkipManager.set_step(1)
    verl_hit = worker.generate_sequences(prompts_dataproto())

    use("zarr")  # off by default: the legacy dump is not looked at
    SkipManager.init(cfg)
    SkipManager.set_step(1)
    worker = RolloutWorker()
    worker.generate_sequences(prompts_dataproto())
    assert worker.calls == [1]

    use("zarr", import_legacy=True)
    SkipManager.init(cfg)
    worker = RolloutWorker()
    served = []
    for step in (1, 2):
        SkipManager.set_step(step)
        served.append(worker.generate_sequences(prompts_dataproto()))
    assert worker.calls == []
    assert_same(served[0], verl_hit)
    assert_same(served[1], generated_dataproto(2))
    shutil.rmtree(tmp_path / "it_exp_it_proj" / "GBS4_N2_in6_out5" / "2")
    assert [i.step for i in zs.open_cache(str(tmp_path), fingerprint(cfg, "rollout")).status()] == [1, 2]


def test_import_legacy_from_the_environment_for_rollout_tq(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(tmp_path / "verl", role="rollout_tq", steps=[1], psync=2)
    tq_run("verl", cfg, [1], seed=1)
    verl_tq, _ = tq_run("verl", cfg, [1], seed=2)
    monkeypatch.setenv("ZARR_SKIP_IMPORT_LEGACY", "1")
    ours, trainer = tq_run("zarr", cfg, [1], seed=2)
    assert trainer.generated == []
    for a, b in zip(ours.puts, verl_tq.puts, strict=True):
        assert_same(a, b)
    assert tq_cache(cfg).info(1).expected == 2


def test_import_legacy_repeat_counts_legacy_and_zarr_steps(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, steps=[4])
    use("verl")
    SkipManager.init(cfg)
    SkipManager.set_step(4)
    RolloutWorker().generate_sequences(prompts_dataproto())
    use("zarr")
    SkipManager.init(make_config(tmp_path, steps=[2]))
    SkipManager.set_step(2)
    RolloutWorker().generate_sequences(prompts_dataproto())  # Zarr: step 2; legacy: step 4

    use("zarr", import_legacy=True)
    SkipManager.init(make_config(tmp_path, steps=[1, 3, 5], action="repeat"))
    worker = RolloutWorker()
    served = []
    for step in (1, 3, 5):
        SkipManager.set_step(step)
        served.append(worker.generate_sequences(prompts_dataproto()))
    assert worker.calls == []
    for got, source in zip(served, (2, 2, 4), strict=True):
        assert_same(got, generated_dataproto(source))


class _Boom:
    def __reduce__(self) -> Any:
        return (os.system, ("touch pwned",))


def test_import_legacy_refuses_an_unsafe_pickle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    step_dir = tmp_path / "it_exp_it_proj" / "GBS4_N2_in6_out5" / "1"
    step_dir.mkdir(parents=True)
    (step_dir / "gen_batch.dp").write_bytes(pickle.dumps(_Boom()))
    (step_dir / "meta.json").write_text('{"global_steps": 1}')
    use("zarr", import_legacy=True)
    SkipManager.init(make_config(tmp_path, steps=[1]))
    SkipManager.set_step(1)
    worker = RolloutWorker()
    with caplog.at_level(logging.ERROR, logger="zarr_skip"):
        worker.generate_sequences(prompts_dataproto())
    assert worker.calls == [1]
    assert "refusing legacy step 1" in caplog.text
    assert not (tmp_path / "pwned").exists()


def test_import_legacy_failing_half_way_leaves_nothing_behind(tmp_path: Path) -> None:
    from tensordict import TensorDict

    from zarr_skip.legacy.dumps import write_legacy_tq

    cfg = make_config(tmp_path, role="rollout_tq", steps=[1], psync=2)
    tq_run("verl", cfg, [1], seed=1)
    step_dir = tmp_path / "it_exp_it_proj" / "GBS4_N2_in6_out5" / "1"
    odd = TensorDict({"other": __import__("torch").zeros(4, 2)}, batch_size=[4])
    write_legacy_tq(
        step_dir,
        {"tensordict": odd, "tags": [{}] * 4, "keys": [f"u{i}_0_0" for i in range(4)]},
        minibatch=1,
        overwrite=True,
    )  # mini-batch 1 no longer matches mini-batch 0

    _, trainer = tq_run("zarr", cfg, [1], seed=2, import_legacy=True)
    assert trainer.generated == [1]  # legacy mini-batch 0 was stored, then removed again
    info = tq_cache(cfg).info(1)
    assert (info.complete, info.done, info.stale_runs) == (True, 2, ())
    keys = tq_cache(cfg).load(1)["keys"].read()
    assert sorted(k.rsplit("_", 2)[0] for k in keys) == sorted(trainer.last_uids * 2)
