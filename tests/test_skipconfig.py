"""Unit tests for zarr_skip.trainer.skipconfig."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from zarr_skip.trainer.skipconfig import (
    DEFAULT_DUMP_DIR,
    ROLES,
    ConfigError,
    RoleConfig,
    SkipConfig,
    fingerprint,
    parameter_sync_step,
    parse_skip_config,
)


def _full_config(**skip: Any) -> dict[str, Any]:
    """A verl-shaped config (as in verl's own unit tests) with the given skip roles."""
    return {
        "skip": {"_target_": "verl.utils.skip.SkipManagerConfig", **skip},
        "actor_rollout_ref": {"rollout": {"skip": {"enable": False}, "n": 2}},
        "trainer": {
            "experiment_name": "ut_exp",
            "project_name": "ut_proj",
            "v1": {
                "trainer_mode": "sync",
                "sync": {},
                "separate_async": {"num_warmup_batches": 1, "parameter_sync_step": 4},
            },
        },
        "data": {
            "train_batch_size": 8,
            "gen_batch_size": 4,
            "max_prompt_length": 8,
            "max_response_length": 16,
        },
    }


# ---------------------------------------------------------------------------
# defaults


def test_missing_skip_section_gives_disabled_defaults() -> None:
    for config in ({}, None, {"trainer": {}}, OmegaConf.create({})):
        cfg = parse_skip_config(config)
        assert cfg == SkipConfig()
        assert not cfg.any_enabled
        for role in ROLES:
            rc = cfg.role(role)
            assert rc.role == role
            assert rc.enable is False
            assert rc.steps == ()
            assert rc.action == "cache"
            assert rc.on_group_mismatch == "cycle"
            assert rc.compression is None
            assert rc.run_id is None
            assert rc.dump_dir == os.path.abspath(os.path.expanduser(DEFAULT_DUMP_DIR))


def test_partial_role_takes_defaults_for_the_rest() -> None:
    cfg = parse_skip_config({"skip": {"rollout": {"enable": True}}})
    assert cfg.rollout.enable is True
    assert cfg.rollout.action == "cache"
    assert cfg.rollout.steps == ()
    assert cfg.rollout_tq == RoleConfig("rollout_tq")
    assert cfg.any_enabled


def test_null_values_take_defaults() -> None:
    cfg = parse_skip_config({"skip": {"rollout": {"enable": None, "steps": None, "action": None}}})
    assert cfg.rollout == RoleConfig("rollout")


def test_omegaconf_missing_value_takes_default() -> None:
    conf = OmegaConf.create({"skip": {"rollout": {"enable": True, "action": "???"}}})
    assert parse_skip_config(conf).rollout.action == "cache"


# ---------------------------------------------------------------------------
# parsing of valid values


def test_dictconfig_and_listconfig_input(tmp_path: Path) -> None:
    conf = OmegaConf.create(
        _full_config(
            rollout={"enable": True, "dump_dir": str(tmp_path), "steps": [5, 1, 3, 3], "action": "repeat"},
            rollout_tq={"enable": False, "dump_dir": "s3://bucket/prefix", "steps": [2], "action": "cache"},
            async_rollout={"enable": True, "dump_dir": str(tmp_path), "steps": list(range(1, 129))},
        )
    )
    assert type(conf.skip.rollout.steps).__name__ == "ListConfig"
    cfg = parse_skip_config(conf)
    assert cfg.rollout.enable is True
    assert cfg.rollout.steps == (1, 3, 5)
    assert isinstance(cfg.rollout.steps, tuple)
    assert all(type(s) is int for s in cfg.rollout.steps)
    assert cfg.rollout.action == "repeat"
    assert cfg.rollout.dump_dir == str(tmp_path)
    assert cfg.rollout_tq.dump_dir == "s3://bucket/prefix"
    assert cfg.async_rollout.steps == tuple(range(1, 129))
    assert cfg.async_rollout.action == "cache"


def test_plain_dict_equals_dictconfig(tmp_path: Path) -> None:
    raw = _full_config(rollout={"enable": True, "dump_dir": str(tmp_path), "steps": [1, 2], "action": "cache"})
    assert parse_skip_config(raw) == parse_skip_config(OmegaConf.create(raw))
    assert SkipConfig.from_config(raw) == parse_skip_config(raw)


def test_interpolated_values_are_resolved(tmp_path: Path) -> None:
    conf = OmegaConf.create(
        {
            "paths": {"root": str(tmp_path), "steps": [4, 2]},
            "skip": {"rollout": {"enable": True, "dump_dir": "${paths.root}/dump", "steps": "${paths.steps}"}},
        }
    )
    cfg = parse_skip_config(conf)
    assert cfg.rollout.dump_dir == str(tmp_path / "dump")
    assert cfg.rollout.steps == (2, 4)


def test_tilde_is_expanded_for_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = parse_skip_config({"skip": {"rollout": {"dump_dir": "~/rollout_dump"}}})
    assert cfg.rollout.dump_dir == str(tmp_path / "rollout_dump")
    assert RoleConfig("rollout").dump_dir == str(tmp_path / ".verl" / "rollout_dump")


def test_relative_path_becomes_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = parse_skip_config({"skip": {"rollout": {"dump_dir": "rel/dump"}}})
    assert cfg.rollout.dump_dir == str(tmp_path / "rel" / "dump")


def test_a_relative_path_holding_colon_slashes_is_a_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = parse_skip_config({"skip": {"rollout": {"dump_dir": "runs/a://b"}}})
    assert cfg.rollout.dump_dir == str(tmp_path / "runs" / "a:" / "b")


def test_pathlike_dump_dir_accepted(tmp_path: Path) -> None:
    cfg = parse_skip_config({"skip": {"rollout": {"dump_dir": tmp_path / "d"}}})
    assert cfg.rollout.dump_dir == str(tmp_path / "d")


@pytest.mark.parametrize("url", ["s3://bucket/x", "S3://bucket/x", "file:///tmp/x", "gs://b/~/x", "memory://cache"])
def test_urls_are_left_alone(url: str) -> None:
    assert parse_skip_config({"skip": {"rollout_tq": {"dump_dir": url}}}).rollout_tq.dump_dir == url


def test_extras_parsed() -> None:
    cfg = parse_skip_config(
        {
            "skip": {
                "rollout_tq": {
                    "enable": True,
                    "steps": [1],
                    "compression": "lz4",
                    "on_group_mismatch": "error",
                    "run_id": "run-7",
                }
            }
        }
    )
    assert cfg.rollout_tq.compression == "lz4"
    assert cfg.rollout_tq.on_group_mismatch == "error"
    assert cfg.rollout_tq.run_id == "run-7"


def test_numpy_integer_steps_accepted() -> None:
    cfg = parse_skip_config({"skip": {"rollout": {"steps": [np.int64(7), np.int32(2)]}}})
    assert cfg.rollout.steps == (2, 7)
    assert all(type(s) is int for s in cfg.rollout.steps)


def test_tuple_steps_accepted() -> None:
    assert parse_skip_config({"skip": {"rollout": {"steps": (3, 0)}}}).rollout.steps == (0, 3)


def test_underscore_keys_ignored() -> None:
    cfg = parse_skip_config({"skip": {"_target_": "x", "rollout": {"_target_": "y", "enable": True}}})
    assert cfg.rollout.enable is True


def test_unknown_role_warns_and_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="zarr_skip.trainer.skipconfig"):
        cfg = parse_skip_config({"skip": {"rolout": {"enable": True}}})
    assert not cfg.any_enabled
    assert "skip.rolout" in caplog.text


def test_attribute_style_config_supported() -> None:
    @dataclasses.dataclass
    class Role:
        enable: bool = True
        dump_dir: str = "/tmp/x"
        steps: tuple[int, ...] = (1,)
        action: str = "repeat"

    @dataclasses.dataclass
    class Skip:
        rollout: Role = dataclasses.field(default_factory=Role)

    @dataclasses.dataclass
    class Top:
        skip: Skip = dataclasses.field(default_factory=Skip)

    cfg = parse_skip_config(Top())
    assert cfg.rollout.enable and cfg.rollout.action == "repeat" and cfg.rollout.steps == (1,)
    assert not cfg.rollout_tq.enable


# ---------------------------------------------------------------------------
# RoleConfig / SkipConfig behaviour


def test_values_are_frozen_and_slotted() -> None:
    cfg = parse_skip_config({"skip": {"rollout": {"enable": True}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.enable = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout = RoleConfig("rollout")  # type: ignore[misc]
    assert not hasattr(cfg.rollout, "__dict__")
    assert not hasattr(cfg, "__dict__")
    assert hash(cfg) == hash(parse_skip_config({"skip": {"rollout": {"enable": True}}}))


def test_is_listed_and_is_active() -> None:
    on = RoleConfig("rollout", enable=True, steps=[10, 2, 5])
    off = RoleConfig("rollout", enable=False, steps=[2])
    assert on.steps == (2, 5, 10)
    assert [s for s in range(12) if on.is_listed(s)] == [2, 5, 10]
    assert on.is_active(5) and not on.is_active(6)
    assert off.is_listed(2) and not off.is_active(2)
    assert not RoleConfig("rollout").is_listed(0)


def test_role_lookup() -> None:
    cfg = SkipConfig()
    assert cfg.role("rollout_tq") is cfg.rollout_tq
    with pytest.raises(KeyError, match="unknown skip role 'bogus'"):
        cfg.role("bogus")


def test_skipconfig_rejects_wrong_role_object() -> None:
    with pytest.raises(ConfigError, match=r"skip\.rollout:"):
        SkipConfig(rollout=RoleConfig("rollout_tq"))


# ---------------------------------------------------------------------------
# errors name the full key


@pytest.mark.parametrize(
    ("role_cfg", "message"),
    [
        ({"action": "cach"}, "skip.rollout.action: expected 'cache' or 'repeat', got 'cach'"),
        ({"action": "random"}, "skip.rollout.action: expected 'cache' or 'repeat', got 'random'"),
        ({"action": 1}, "skip.rollout.action: expected 'cache' or 'repeat', got 1"),
        ({"enable": "yes"}, "skip.rollout.enable: expected a bool (true/false), got 'yes'"),
        ({"enable": 1}, "skip.rollout.enable: expected a bool (true/false), got 1"),
        ({"dump_dir": 3}, "skip.rollout.dump_dir: expected a path or URL string, got int 3"),
        ({"dump_dir": "  "}, "skip.rollout.dump_dir: expected a non-empty string, got '  '"),
        ({"steps": 3}, "skip.rollout.steps: expected a list of integers, got int 3"),
        ({"steps": "1,2"}, "skip.rollout.steps: expected a list of integers, got str '1,2'"),
        ({"steps": [1, "x"]}, "skip.rollout.steps[1]: expected an integer, got str 'x'"),
        ({"steps": [1.5]}, "skip.rollout.steps[0]: expected an integer, got float 1.5"),
        ({"steps": [True]}, "skip.rollout.steps[0]: expected an integer, got bool True"),
        ({"steps": [2, -1]}, "skip.rollout.steps[1]: expected an integer >= 0, got -1"),
        ({"on_group_mismatch": "drop"}, "skip.rollout.on_group_mismatch: expected 'cycle' or 'error', got 'drop'"),
        ({"compression": 5}, "skip.rollout.compression: expected a string, got int 5"),
        ({"run_id": ""}, "skip.rollout.run_id: expected a non-empty string, got ''"),
        ({"run_id": "my run"}, "skip.rollout.run_id: 'my run' is not valid (start with a letter;"),
        ({"run_id": "exp/1"}, "skip.rollout.run_id: 'exp/1' is not valid"),
        ({"stpes": [1]}, "skip.rollout.stpes: unknown setting"),
    ],
)
def test_error_messages_name_the_key(role_cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_skip_config({"skip": {"rollout": role_cfg}})
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("role", ROLES)
def test_error_names_each_role(role: str) -> None:
    with pytest.raises(ConfigError, match=rf"^skip\.{role}\.action: "):
        parse_skip_config(OmegaConf.create({"skip": {role: {"action": "cach"}}}))


def test_error_from_listconfig_item() -> None:
    conf = OmegaConf.create({"skip": {"async_rollout": {"steps": [1, 2, "three"]}}})
    with pytest.raises(ConfigError, match=r"^skip\.async_rollout\.steps\[2\]: expected an integer, got str 'three'"):
        parse_skip_config(conf)


def test_role_must_be_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^skip\.rollout: expected a mapping"):
        parse_skip_config({"skip": {"rollout": True}})
    with pytest.raises(ConfigError, match=r"^skip: expected a mapping"):
        parse_skip_config({"skip": [1, 2]})


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"^skip\.rollout_tq\.action: "):
        RoleConfig("rollout_tq", action="cach")
    with pytest.raises(ConfigError, match=r"^role: "):
        RoleConfig("")


# ---------------------------------------------------------------------------
# fingerprint


def test_fingerprint_matches_verl_fields() -> None:
    for config in (_full_config(), OmegaConf.create(_full_config())):
        assert fingerprint(config, "rollout") == {
            "experiment_name": "ut_exp",
            "project_name": "ut_proj",
            "gen_batch_size": 4,
            "n": 2,
            "max_prompt_length": 8,
            "max_response_length": 16,
            "role": "rollout",
        }


def test_fingerprint_falls_back_to_train_batch_size() -> None:
    raw = _full_config()
    raw["data"]["gen_batch_size"] = None
    assert fingerprint(raw, "rollout")["gen_batch_size"] == 8
    assert fingerprint(OmegaConf.create(raw), "rollout")["gen_batch_size"] == 8
    del raw["data"]["gen_batch_size"]
    assert fingerprint(raw, "rollout")["gen_batch_size"] == 8


def test_fingerprint_defaults_as_verl() -> None:
    assert fingerprint({}, "async_rollout") == {
        "experiment_name": "default_experiment_name",
        "project_name": "default_project_name",
        "gen_batch_size": 0,
        "n": 0,
        "max_prompt_length": 0,
        "max_response_length": 0,
        "role": "async_rollout",
    }


def test_fingerprint_differs_per_role() -> None:
    raw = _full_config()
    fps = {role: fingerprint(raw, role) for role in ROLES}
    assert len({tuple(sorted(fp.items())) for fp in fps.values()}) == len(ROLES)
    assert {fp["role"] for fp in fps.values()} == set(ROLES)


def test_fingerprint_is_json_able() -> None:
    import json

    raw = _full_config()
    raw["data"]["gen_batch_size"] = np.int64(4)
    fp = fingerprint(raw, "rollout")
    assert json.loads(json.dumps(fp)) == fp


def test_fingerprint_errors_name_the_key() -> None:
    raw = _full_config()
    raw["data"]["max_prompt_length"] = "long"
    with pytest.raises(ConfigError, match=r"^data\.max_prompt_length: expected an integer"):
        fingerprint(raw, "rollout")
    raw = _full_config()
    raw["actor_rollout_ref"]["rollout"]["n"] = 2.5
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.rollout\.n: "):
        fingerprint(raw, "rollout")
    with pytest.raises(ConfigError, match=r"^role: "):
        fingerprint(_full_config(), "")


# ---------------------------------------------------------------------------
# parameter_sync_step


def test_parameter_sync_step_sync_mode_is_one() -> None:
    assert parameter_sync_step(_full_config()) == 1
    assert parameter_sync_step(OmegaConf.create(_full_config())) == 1


def test_parameter_sync_step_separate_async() -> None:
    raw = _full_config()
    raw["trainer"]["v1"]["trainer_mode"] = "separate_async"
    assert parameter_sync_step(raw) == 4
    assert parameter_sync_step(OmegaConf.create(raw)) == 4


def test_parameter_sync_step_defaults_to_one() -> None:
    assert parameter_sync_step({}) == 1
    assert parameter_sync_step({"trainer": {}}) == 1
    assert parameter_sync_step({"trainer": {"v1": {}}}) == 1
    assert parameter_sync_step({"trainer": {"v1": {"trainer_mode": "colocate_async"}}}) == 1
    assert parameter_sync_step(OmegaConf.create({"trainer": {"experiment_name": "x"}})) == 1


@pytest.mark.parametrize("value", [0, -2, "4", 1.0, True])
def test_parameter_sync_step_invalid(value: Any) -> None:
    raw = {"trainer": {"v1": {"trainer_mode": "separate_async", "separate_async": {"parameter_sync_step": value}}}}
    with pytest.raises(ConfigError, match=r"^trainer\.v1\.separate_async\.parameter_sync_step: "):
        parameter_sync_step(raw)


def test_parameter_sync_step_bad_mode() -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.v1\.trainer_mode: "):
        parameter_sync_step({"trainer": {"v1": {"trainer_mode": 3}}})


def test_config_error_is_the_core_error() -> None:
    import zarr_skip
    from zarr_skip.errors import ZarrSkipError

    assert ConfigError is zarr_skip.ConfigError
    assert issubclass(ConfigError, ZarrSkipError) and issubclass(ConfigError, ValueError)


def test_tokenizer_paths_prefer_the_tokenizer_then_name_the_model(tmp_path: Path, monkeypatch: Any) -> None:
    from zarr_skip.trainer.skipconfig import tokenizer_paths

    model = tmp_path / "models" / "qwen"
    model.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg = {"actor_rollout_ref": {"model": {"path": "models/qwen", "tokenizer_path": None}}}
    assert tokenizer_paths(cfg) == {"model": str(model)}  # a local relative path becomes absolute
    cfg["data"] = {"tokenizer": "Qwen/Qwen2.5-7B"}  # not local: recorded as written
    assert tokenizer_paths(cfg) == {"model": str(model), "tokenizer": "Qwen/Qwen2.5-7B"}
    cfg["actor_rollout_ref"]["model"]["tokenizer_path"] = "~/tok"
    assert tokenizer_paths(cfg)["tokenizer"] == os.path.expanduser("~/tok")
    assert tokenizer_paths({"trainer": {}}) == {}
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.model\.path: expected a path"):
        tokenizer_paths({"actor_rollout_ref": {"model": {"path": 3}}})


# ---------------------------------------------------------------------------
# the verl integration's own settings (zarr_skip.integrations.verl.install / ZARR_SKIP_*; no verl needed)


@pytest.mark.parametrize("value", ["endpoint_url=http://minio:9000", ["endpoint_url"], 3])
def test_verl_storage_options_that_are_no_mapping_are_refused_at_install(value: Any) -> None:
    """They were taken, and open_cache refused them only at the first listed step, mid-training."""
    from zarr_skip.integrations._verl_options import Options

    with pytest.raises(ConfigError, match=r"storage_options: expected a mapping"):
        Options(storage_options=value)
    assert Options(storage_options={"endpoint_url": "http://minio:9000"}).storage_options is not None


@pytest.mark.parametrize("value", ["my run", "2026-run", "a/b"])
def test_verl_run_ids_that_open_cache_refuses_are_refused_at_install(value: str) -> None:
    """They were taken, and open_cache refused them only at the first listed step, mid-training."""
    from zarr_skip.integrations._verl_options import Options

    with pytest.raises(ConfigError, match=r"^run_id: .* is not valid"):
        Options(run_id=value)
    assert Options(run_id="run-7").run_id == "run-7"


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ZARR_SKIP_COMPRESSION", "zsdt"), ("ZARR_SKIP_ON_GROUP_MISMATCH", "Error"), ("ZARR_SKIP_RUN_ID", "my run")],
)
def test_verl_settings_from_the_environment_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """Set through Ray's env_vars, a bad value named only the install() argument."""
    from zarr_skip.integrations._verl_options import options

    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=rf"^{variable}: .*'{value}'"):
        options()
