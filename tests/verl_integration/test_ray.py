"""Ray: several actors of one run write the mini-batches of the same steps; the real TransferQueue.

One local Ray cluster (2 CPUs, no dashboard) for the module. Every worker process runs
``zarr_skip.integrations.verl.install`` as Ray's ``worker_process_setup_hook``, the way a verl
job gets the integration into the actor that calls ``SkipManager.init``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from omegaconf import OmegaConf
from verl.utils.skip import SkipManager
from verl_fakes import (
    ReplayBuffer,
    TqTrainer,
    TqWriter,
    assert_same,
    make_config,
    trajectory_fields,
)

import zarr_skip as zs
import zarr_skip.integrations.verl as zv
from zarr_skip.trainer.skipconfig import fingerprint

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": path},
            "worker_process_setup_hook": "zarr_skip.integrations.verl.install",
        },
    )
    try:
        yield
    finally:
        ray.shutdown()


def test_actors_of_one_run_complete_each_step_exactly_once(cluster: None, tmp_path: Path) -> None:
    ranks, steps, prompts, n = 3, [1, 2, 3, 4], 2, 2
    run_id = f"ray-{uuid.uuid4().hex[:8]}"
    cfg = make_config(tmp_path, role="rollout_tq", steps=steps, psync=ranks, prompts=ranks * prompts, n=n)
    writer = ray.remote(num_cpus=0)(TqWriter)
    actors = [
        writer.options(runtime_env={"env_vars": {"ZARR_SKIP_RUN_ID": run_id}}).remote(rank, OmegaConf.to_container(cfg))
        for rank in range(ranks)
    ]
    # every rank writes every step at once: concurrent claims on the same steps
    results = ray.get([a.write.remote(step, prompts, n) for step in steps for a in actors], timeout=300)
    assert {r["hooked"] for r in results} == {True}
    assert {r["role_class"] for r in results} == {"ZarrRolloutTqSkip"}
    assert {r["run"] for r in results} == {run_id}

    cache = zs.open_cache(str(tmp_path), fingerprint(cfg, "rollout_tq"))
    rows = ranks * prompts * n
    infos = cache.status()
    assert [(i.step, i.state, i.expected, i.done, i.rows, i.run, i.stale_runs) for i in infos] == [
        (s, "complete", ranks, ranks, rows, run_id, ()) for s in steps
    ]
    for step in steps:
        mine = [r for r in results[(step - 1) * ranks : step * ranks]]
        view = cache.load(step)
        keys = list(view["keys"].read())
        assert sorted(keys) == sorted(k for r in mine for k in r["keys"])  # all data, none twice
        owners = [{k.split("p")[0] for k in mb["keys"].read()} for mb in view.minibatches]
        assert sorted(o.pop() for o in owners if len(o) == 1) == [f"r{rank}" for rank in range(ranks)]
        responses = view["responses"].read().unbind()
        expected = {}
        for r in mine:
            for key, row in zip(r["keys"], trajectory_fields(step, r["pairs"]).get("responses").unbind(), strict=True):
                expected[key] = row
        for key, row in zip(keys, responses, strict=True):
            assert row.equal(expected[key]), f"step {step} {key}"
        assert [t["rank"] for t in view["tags"].read()] == [int(k[1:].split("p")[0]) for k in keys]

    for a in actors:
        ray.kill(a)


def test_real_transfer_queue_round_trip_matches_verl(cluster: None, tmp_path: Path) -> None:
    """Store from and inject into the real TransferQueue; read back what verl's own classes put."""
    import transfer_queue as tq

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        got: dict[str, Any] = {}
        for impl in ("verl", "zarr"):
            cfg = make_config(tmp_path / impl, role="rollout_tq", steps=[1], psync=2, prompts=3, n=2)
            zv.uninstall()
            if impl == "zarr":
                zv.install()
            for seed in (1, 2):  # run 1 fills the cache, run 2 is served from it
                SkipManager.init(cfg)
                trainer = TqTrainer(tq, prompts=3, n=2, seed=seed)
                SkipManager.set_step(1)
                trainer._add_batch_to_generate()
                if seed == 2:
                    assert trainer.generated == []
                    listed = tq.kv_list("train")["train"]
                    traj = sorted(k for k, t in listed.items() if not t.get("is_prompt"))
                    got[impl] = (
                        traj,
                        [listed[k] for k in traj],
                        tq.kv_batch_get(keys=traj, partition_id="train"),
                        sorted(k for k, t in listed.items() if t.get("is_prompt")),
                    )
                buffer = ReplayBuffer(tq)
                for _ in range(2):
                    buffer.sample(1, "train", 3)
                keys = list(tq.kv_list("train")["train"])
                tq.kv_clear(keys=keys, partition_id="train")
        assert got["zarr"][0] == got["verl"][0] and len(got["zarr"][0]) == 6
        assert_same(got["zarr"][1], got["verl"][1])
        assert_same(got["zarr"][2], got["verl"][2])
        assert got["zarr"][3] == got["verl"][3]
        stored = zs.open_cache(str(tmp_path / "zarr"), fingerprint(cfg, "rollout_tq")).info(1)
        assert (stored.complete, stored.expected, stored.rows) == (True, 2, 6)
        assert np.array_equal(got["zarr"][2].get("rm_scores").numpy(), got["verl"][2].get("rm_scores").numpy())
    finally:
        tq.close()
