"""verl's real SkipManager with zarr_skip's classes installed, compared with verl's own cache.

Every scenario runs twice on the same inputs: once with verl's own classes (pickle /
torch.save under one dump_dir) and once with ``zarr_skip.integrations.verl.install()`` (Zarr
under another); what verl gets back must be the same, value and type.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.utils.skip import SkipManager
from verl.utils.skip.base_skip import SKIP_REGISTRY
from verl.utils.skip.rollout_skip import AsyncRolloutSkip, RolloutSkip, RolloutTqSkip
from verl_fakes import (
    RolloutWorker,
    assert_same,
    generated_dataproto,
    make_config,
    prompts_dataproto,
)

import zarr_skip as zs
import zarr_skip.integrations.verl as zv
from zarr_skip.integrations import _verl_skip
from zarr_skip.trainer.skipconfig import fingerprint

IMPLS = ("verl", "zarr")


def use(impl: str, **options: Any) -> None:
    """Register verl's own classes (``verl``) or zarr_skip's (``zarr``)."""
    zv.uninstall()
    if impl == "zarr":
        zv.install(**options)


def role_cache(cfg: Any, role: str) -> zs.Cache:
    return zs.open_cache(cfg.skip[role].dump_dir, fingerprint(cfg, role))


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


# ------------------------------------------------------------------------------ install


def test_importing_registers_nothing_and_zarr_skip_never_imports_verl() -> None:
    proc = run_python(
        "import sys, zarr_skip, zarr_skip.integrations, zarr_skip.integrations.verl as zv\n"
        "assert not any(m == 'verl' or m.startswith('verl.') for m in sys.modules), 'verl imported'\n"
        "from verl.utils.skip.base_skip import SKIP_REGISTRY\n"
        "assert {c.__module__ for c in SKIP_REGISTRY.values()} == {'verl.utils.skip.rollout_skip'}\n"
        "assert not zv.installed()\n"
        "zv.install(); assert zv.installed()\n"
        "print('ok')\n"
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_install_without_verl_raises_a_clear_import_error() -> None:
    proc = run_python(
        "import sys; sys.modules['verl'] = None\n"
        "import zarr_skip.integrations.verl as zv\n"
        "from zarr_skip.errors import ZarrSkipError\n"
        "try:\n"
        "    zv.install()\n"
        "except zv.VerlNotInstalledError as exc:\n"
        "    assert isinstance(exc, ImportError) and isinstance(exc, ZarrSkipError)\n"
        "    print(exc)\n"
        "zv.uninstall()\n"
        "assert not zv.installed()\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install verl" in proc.stdout


def test_install_is_idempotent_and_uninstall_restores_verls_classes() -> None:
    originals = dict(SKIP_REGISTRY)
    assert originals == {"rollout": RolloutSkip, "rollout_tq": RolloutTqSkip, "async_rollout": AsyncRolloutSkip}
    zv.install()
    zv.install(compression="lz4")
    assert zv.installed()
    assert dict(SKIP_REGISTRY) == _verl_skip.CLASSES
    assert zv.options().compression == "lz4"
    zv.uninstall()
    zv.uninstall()
    assert dict(SKIP_REGISTRY) == originals
    assert not zv.installed()
    assert zv.options().compression is None


def test_install_after_init_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    SkipManager.init(make_config(tmp_path))
    with caplog.at_level(logging.WARNING, logger="zarr_skip"):
        zv.install()
    assert "initialized before install()" in caplog.text
    SkipManager.init(make_config(tmp_path))
    assert isinstance(SkipManager.skip_instances["rollout"], _verl_skip.ZarrRolloutSkip)


def test_options_come_from_install_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZARR_SKIP_IMPORT_LEGACY", "1")
    monkeypatch.setenv("ZARR_SKIP_RUN_ID", "run-env")
    monkeypatch.setenv("ZARR_SKIP_COMPRESSION", "zstd:1")
    assert zv.options() == zv.Options(import_legacy=True, run_id="run-env", compression="zstd:1")
    zv.install(run_id="run-arg", import_legacy=False)
    assert (zv.options().run_id, zv.options().import_legacy) == ("run-arg", False)
    monkeypatch.setenv("ZARR_SKIP_ALLOW_PICKLE", "maybe")
    with pytest.raises(zs.ConfigError, match="ZARR_SKIP_ALLOW_PICKLE"):
        zv.options()
    with pytest.raises(zs.ConfigError, match="on_group_mismatch"):
        zv.install(on_group_mismatch="shuffle")


def test_verl_refuses_extra_skip_keys(tmp_path: Path) -> None:
    """Why zarr_skip's settings are install() arguments or environment variables."""
    cfg = make_config(tmp_path)
    cfg.skip.rollout.import_legacy = True
    zv.install()
    with pytest.raises(Exception, match="import_legacy"):
        SkipManager.init(cfg)


# ------------------------------------------------------------------------------ rollout


def rollout_run(impl: str, cfg: Any, steps: list[int], **options: Any) -> tuple[list[DataProto], list[int]]:
    """A fresh process's view: init, then one generate_sequences call per step."""
    use(impl, **options)
    SkipManager.init(cfg)
    worker = RolloutWorker()
    out = []
    for step in steps:
        SkipManager.set_step(step)
        out.append(worker.generate_sequences(prompts_dataproto()))
    return out, worker.calls


@pytest.mark.parametrize("impl", IMPLS)
def test_rollout_miss_then_hit(tmp_path: Path, impl: str) -> None:
    cfg = make_config(tmp_path / impl, steps=[1, 2])
    first, calls = rollout_run(impl, cfg, [1, 2, 3])
    assert calls == [1, 2, 3]
    again, calls = rollout_run(impl, cfg, [1, 2, 3])
    assert calls == [3]  # unlisted step 3 was neither stored nor served
    for step, (a, b) in enumerate(zip(first[:2], again[:2], strict=True), start=1):
        assert_same(b, a, f"step {step}")
        assert_same(b, generated_dataproto(step), f"step {step}")
    if impl == "zarr":
        assert [i.step for i in role_cache(cfg, "rollout").status()] == [1, 2]


def test_rollout_hit_equals_verls_own_cache(tmp_path: Path) -> None:
    results = {}
    for impl in IMPLS:
        cfg = make_config(tmp_path / impl, steps=[1, 4])
        rollout_run(impl, cfg, [1, 4])
        results[impl], calls = rollout_run(impl, cfg, [1, 4])
        assert calls == []
    for a, b in zip(results["zarr"], results["verl"], strict=True):
        assert_same(a, b)


def test_rollout_repeat_chooses_the_same_step_as_verl(tmp_path: Path) -> None:
    served = {}
    for impl in IMPLS:
        rollout_run(impl, make_config(tmp_path / impl, steps=[2, 5]), [2, 5])
        cfg = make_config(tmp_path / impl, steps=[1, 3, 5, 7], action="repeat")
        served[impl], calls = rollout_run(impl, cfg, [1, 3, 5, 7])
        assert calls == []
    expected = [2, 2, 5, 5]  # exact, else the largest smaller, else the smallest larger
    for got_zarr, got_verl, source in zip(served["zarr"], served["verl"], expected, strict=True):
        assert_same(got_zarr, got_verl)
        assert_same(got_zarr, generated_dataproto(source))


def test_rollout_repeat_with_nothing_cached_generates(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, steps=[3], action="repeat")
    _, calls = rollout_run("zarr", cfg, [3])
    assert calls == [3]
    use("zarr")
    SkipManager.init(make_config(tmp_path / "empty", steps=[3], action="repeat"))
    role = SkipManager.skip_instances["rollout"]
    assert role.meet_precondition(3, None) is False
    verls = "^repeat action expected dumped data for step 3, but none was found under"  # verl's own wording
    with pytest.raises(zv.CachedStepMissingError, match=verls) as info:
        role.warp_function(3, None)
    assert isinstance(info.value, RuntimeError)
    assert "no complete step in the Zarr cache" in str(info.value)


def test_the_model_path_is_recorded_for_readers(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    cfg = make_config(tmp_path / "c", steps=[1])
    cfg.actor_rollout_ref.model = {"path": str(model), "tokenizer_path": None}
    rollout_run("zarr", cfg, [1])
    assert zs.open_cache(tmp_path / "c").attributes == {"model": str(model)}


@pytest.mark.parametrize("impl", IMPLS)
def test_rollout_validation_bypasses_the_cache(tmp_path: Path, impl: str) -> None:
    cfg = make_config(tmp_path / impl, steps=[1])
    rollout_run(impl, cfg, [1])
    use(impl)
    SkipManager.init(cfg)
    SkipManager.set_step(1)
    worker = RolloutWorker()
    for _ in range(2):
        out = worker.generate_sequences(prompts_dataproto(validate=True))
        assert_same(out, generated_dataproto(1))
    assert worker.calls == [1, 1]
    if impl == "zarr":
        assert [i.step for i in role_cache(cfg, "rollout").status()] == [1]


def test_rollout_dump_dir_may_be_a_url(tmp_path: Path) -> None:
    cfg = make_config(f"file://{tmp_path}/url-cache", steps=[1])
    first, calls = rollout_run("zarr", cfg, [1])
    again, calls = rollout_run("zarr", cfg, [1])
    assert calls == []
    assert_same(again[0], first[0])
    assert (tmp_path / "url-cache" / "zarr.json").is_file()


def test_rollout_column_the_codec_refuses_is_logged_or_pickled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def odd(step: int, rows: int = 8) -> DataProto:
        dp = generated_dataproto(step, rows)
        dp.non_tensor_batch["odd"] = np.array([frozenset({i}) for i in range(rows)], dtype=object)
        return dp

    monkeypatch.setattr("verl_fakes.generated_dataproto", odd)
    cfg = make_config(tmp_path / "a", steps=[1])
    with caplog.at_level(logging.ERROR, logger="zarr_skip"):
        _, calls = rollout_run("zarr", cfg, [1, 1])
    assert calls == [1, 1] and "ZARR_SKIP_ALLOW_PICKLE" in caplog.text
    cfg = make_config(tmp_path / "b", steps=[1])
    first, _ = rollout_run("zarr", cfg, [1], allow_pickle=True)
    again, calls = rollout_run("zarr", cfg, [1], allow_pickle=True)
    assert calls == []
    assert_same(again[0], first[0])


# ------------------------------------------------------------------------------ async_rollout


def async_run(impl: str, cfg: Any, indices: list[int]) -> tuple[list[DataProto], list[int]]:
    use(impl)
    SkipManager.init(cfg)
    worker = RolloutWorker()

    async def main() -> list[DataProto]:
        uids = [[f"sample_0_{i}"] * 2 for i in indices]
        return [await worker.generate_sequences_single(prompts_dataproto(2, uids=u)) for u in uids]

    return asyncio.run(main()), worker.calls


def test_async_rollout_uses_the_sample_index(tmp_path: Path) -> None:
    results = {}
    for impl in IMPLS:
        cfg = make_config(tmp_path / impl, role="async_rollout", steps=[1, 2])
        first, calls = async_run(impl, cfg, [1, 2, 3])
        assert calls == [1, 2, 3]
        results[impl], calls = async_run(impl, cfg, [2, 1, 3])
        assert calls == [3]
        assert_same(results[impl][0], first[1])
        assert_same(results[impl][1], first[0])
    for a, b in zip(results["zarr"], results["verl"], strict=True):
        assert_same(a, b)
    cfg = make_config(tmp_path / "zarr", role="async_rollout", steps=[1, 2])
    assert [i.step for i in role_cache(cfg, "async_rollout").status()] == [1, 2]


def test_documented_hydra_overrides_compose_with_verls_config() -> None:
    """docs/verl.md's command line, against verl's own ppo_trainer.yaml and main_ppo's merge."""
    from hydra import compose, initialize_config_module
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    overrides = [
        "skip.rollout.enable=True",
        "skip.rollout.dump_dir=s3://bucket/rollouts",
        "skip.rollout.steps=[1,2,3]",
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=zarr_skip.integrations.verl.install",
        "+ray_kwargs.ray_init.runtime_env.env_vars.ZARR_SKIP_IMPORT_LEGACY=yes",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
        with pytest.raises(Exception, match=r"\+skip.rollout.import_legacy"):
            compose(config_name="ppo_trainer", overrides=["skip.rollout.import_legacy=True"])
    ray_init = cfg.ray_kwargs.get("ray_init", {})
    runtime_env = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(cfg), ray_init.get("runtime_env", {})))
    assert runtime_env["worker_process_setup_hook"] == "zarr_skip.integrations.verl.install"
    assert all(isinstance(v, str) for v in runtime_env["env_vars"].values())
    assert runtime_env["env_vars"]["ZARR_SKIP_IMPORT_LEGACY"] == "yes"
    zv.install()
    SkipManager.init(cfg)
    role = SkipManager.skip_instances["rollout"]
    assert isinstance(role, _verl_skip.ZarrRolloutSkip)
    assert (role.location, role.steps, role.n) == ("s3://bucket/rollouts", [1, 2, 3], cfg.actor_rollout_ref.rollout.n)


def test_meta_info_types_survive_the_json_metadata() -> None:
    from zarr_skip.integrations._verl_meta import TYPES_KEY, decode_meta, encode_meta

    meta = {
        "timing": {"mean": np.float64(0.5), "n": np.int64(3), "ok": np.bool_(True), "f16": np.float16(1.5)},
        "shape": (2, (3, np.int32(4)), []),
        "arr": np.arange(6, dtype=np.uint16).reshape(2, 3),
        "empty": np.zeros((0, 2)),
        "plain": [1, 2.5, "x", None, {"k": [True]}],
    }
    encoded = encode_meta(meta)
    json_types = (dict, list, str, int, float, bool, type(None))
    stack = [encoded]
    while stack:
        value = stack.pop()
        assert type(value) in json_types, value
        stack.extend(value.values() if isinstance(value, dict) else value if isinstance(value, list) else [])
    assert_same(decode_meta(encoded), meta)
    assert encode_meta({"a": 1}) == {"a": 1} and TYPES_KEY not in encode_meta({"a": [1]})
    with pytest.raises(zs.MetadataError, match="reserved"):
        encode_meta({TYPES_KEY: 1, "x": np.int8(1)})
    with pytest.raises(zs.MetadataError):
        decode_meta({"a": 1, TYPES_KEY: [{"path": ["b"], "type": "scalar", "dtype": "<i8"}]})


def test_zarr_skip_skipmanager_serves_what_the_integration_stored(tmp_path: Path) -> None:
    from zarr_skip.trainer.manager import SkipManager as ZarrSkipManager

    cfg = make_config(tmp_path, steps=[1])
    stored, _ = rollout_run("zarr", cfg, [1])
    ZarrSkipManager.init(cfg)
    try:
        calls = []

        @ZarrSkipManager.annotate(role="rollout")
        def generate(self: Any, prompts: DataProto) -> DataProto:
            calls.append(1)
            return generated_dataproto(1)

        ZarrSkipManager.set_step(1)
        served = generate(None, prompts_dataproto())
    finally:
        ZarrSkipManager.reset()
    assert calls == []
    assert_same(served.batch, stored[0].batch)
    assert_same(served.non_tensor_batch, stored[0].non_tensor_batch)
