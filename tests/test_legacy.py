"""Legacy verl rollout caches: scanning, restricted reading, and writing back (zarr_skip.legacy.dumps).

verl is not installed here, so DataProto pickles are produced by a test double of
``verl/protocol.py`` whose DataProto pickles exactly as verl 0.9's does (``__getstate__``:
``(torch.save bytes of the consolidated batch | numpy encoding, non_tensor_batch,
meta_info)``), and directories are laid out as ``verl.utils.skip.rollout_skip`` does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import pickle
import sys
import types
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_equal
from tensordict import NonTensorStack, TensorDict

from zarr_skip.errors import IncompleteStepError, UnsafePickleError, ZarrSkipError
from zarr_skip.legacy.dumps import (
    LegacyDataProto,
    legacy_experiment_dir,
    read_minibatch,
    read_step,
    scan_legacy,
    write_legacy_dp,
    write_legacy_tq,
)

FAKE_VERL_PROTOCOL = '''
"""Test double of verl/protocol.py: DataProto pickles with verl 0.9's state layout."""
import io
import os
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict


def _enc(t):
    return str(t.dtype).removeprefix("torch."), t.shape, t.flatten().contiguous().view(torch.uint8).numpy()


def _dec(item):
    dtype, shape, data = item
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)


@dataclass
class DataProto:
    batch: Any = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)
    setstate_ran = False

    def __getstate__(self):
        batch = self.batch
        if batch is not None and len(batch.keys()) > 0:
            batch = batch.contiguous().consolidate()
        if os.getenv("VERL_DATAPROTO_SERIALIZATION_METHOD") == "numpy":
            enc = None
            if self.batch is not None:
                items = {k: ((str(v.layout).removeprefix("torch."), [_enc(t) for t in v.unbind()])
                             if v.is_nested else _enc(v)) for k, v in self.batch.items()}
                enc = (tuple(self.batch.batch_size), None, items)
            return enc, self.non_tensor_batch, self.meta_info
        buf = io.BytesIO()
        torch.save(batch, buf)
        return buf.getvalue(), self.non_tensor_batch, self.meta_info

    def __setstate__(self, data):
        raw, self.non_tensor_batch, self.meta_info = data
        if os.getenv("VERL_DATAPROTO_SERIALIZATION_METHOD") == "numpy":
            items = {k: (torch.nested.as_nested_tensor([_dec(t) for t in v[1]], layout=getattr(torch, v[0]))
                         if len(v) == 2 else _dec(v)) for k, v in raw[2].items()}
            self.batch = TensorDict(items, batch_size=raw[0])
        else:
            self.batch = torch.load(io.BytesIO(raw), weights_only=False, map_location="cpu")
        self.setstate_ran = True

    def save_to_disk(self, filepath):
        with open(filepath, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load_from_disk(filepath):
        with open(filepath, "rb") as f:
            return pickle.load(f)
'''


@pytest.fixture(scope="module")
def verl_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fakeverl") / "protocol.py"
    path.write_text(FAKE_VERL_PROTOCOL)
    return path


@contextlib.contextmanager
def verl_installed(src: Path) -> Iterator[types.ModuleType]:
    """Make ``verl.protocol`` importable (the test double) for the duration of the block."""
    parent = types.ModuleType("verl")
    spec = importlib.util.spec_from_file_location("verl.protocol", src)
    module = importlib.util.module_from_spec(spec)
    parent.protocol = module  # type: ignore[attr-defined]
    sys.modules["verl"], sys.modules["verl.protocol"] = parent, module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("verl.protocol", None)
        sys.modules.pop("verl", None)


# ------------------------------------------------------------------ verl-like dumping


def dump_dp(fp_dir: Path, step: int, dp: Any, minibatch: int | None = None) -> Path:
    """As ``RolloutSkip.prepare_data``: ``save_to_disk`` then ``meta.json``."""
    step_dir = fp_dir / str(step) if minibatch is None else fp_dir / str(step) / str(minibatch)
    step_dir.mkdir(parents=True, exist_ok=True)
    dp.save_to_disk(step_dir / "gen_batch.dp")
    (step_dir / "meta.json").write_text(json.dumps({"global_steps": step}))
    return step_dir


def dump_tq(fp_dir: Path, step: int, payload: dict, minibatch: int | None = 0) -> Path:
    """As ``RolloutTqSkip.prepare_data`` (``minibatch=None``: older verl, flat)."""
    save_dir = fp_dir / str(step) if minibatch is None else fp_dir / str(step) / str(minibatch)
    save_dir.mkdir(parents=True, exist_ok=True)
    torch.save(payload, save_dir / "tq_batch.pt")
    meta = {"global_steps": payload["global_steps"], "num_trajectories": len(payload["keys"])}
    (save_dir / "meta.json").write_text(json.dumps(meta))
    return save_dir


def padded_batch(rows: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(rows, 6, generator=g)
    log_probs[0, 0], log_probs[0, 1] = float("nan"), -0.0
    return TensorDict(
        {
            "prompts": torch.randint(0, 151936, (rows, 8), generator=g),
            "responses": torch.randint(0, 151936, (rows, 6), generator=g),
            "attention_mask": torch.randint(0, 2, (rows, 14), generator=g),
            "old_log_probs": log_probs,
            "rm_scores": torch.randn(rows, 6, generator=g).bfloat16(),
            "done": torch.rand(rows, generator=g) > 0.5,
        },
        batch_size=[rows],
    )


def non_tensor(rows: int, seed: int) -> dict[str, np.ndarray]:
    ragged = np.empty(rows, dtype=object)
    ragged[:] = [np.arange(i + seed, dtype=np.int32) for i in range(rows)]
    chat = np.empty(rows, dtype=object)
    chat[:] = [[{"role": "user", "content": f"q{seed}-{i} é"}] for i in range(rows)]
    return {
        "uid": np.array([f"uid-{seed}-{i // 2}" for i in range(rows)], dtype=object),
        "raw_prompt": chat,
        "ids": ragged,
        "score": np.linspace(0, 1, rows, dtype=np.float32),
    }


def make_dp(verl: types.ModuleType, rows: int = 4, seed: int = 0) -> Any:
    meta = {
        "global_token_num": [10, 12],
        "temperature": 0.7,
        "timing": {"gen": 1.5},
        "np_scalar": np.float32(1.5),
        "set": {1, 2},
        "pair": (np.int64(3), None, b"\x00"),
    }
    return verl.DataProto(padded_batch(rows, seed), non_tensor(rows, seed), meta)


def tq_payload(rows: int = 4, seed: int = 0, step: int = 5) -> dict:
    g = torch.Generator().manual_seed(seed)
    lens = [2 + (i * 3 + seed) % 5 for i in range(rows)]
    td = TensorDict(
        {
            "prompts": torch.nested.nested_tensor(
                [torch.randint(0, 99, (n,), generator=g) for n in lens], layout=torch.jagged
            ),
            "responses": torch.nested.nested_tensor(
                [torch.randn(n + 1, generator=g) for n in lens], layout=torch.jagged
            ),
            "response_mask": torch.ones(rows, 7, dtype=torch.int64),
            "rewards": torch.randn(rows, generator=g).bfloat16(),
            "datasource": NonTensorStack(*[f"gsm8k-{i}" for i in range(rows)]),
        },
        batch_size=[rows],
    )
    keys = [f"u{seed}x{i // 2}_{i % 2}_0" for i in range(rows)]
    tags = [{"global_steps": step, "status": "finished", "seq_len": n} for n in lens]
    return {"tensordict": td, "tags": tags, "keys": keys, "global_steps": step}


def assert_td(got: TensorDict, want: TensorDict) -> None:
    assert sorted(got.keys()) == sorted(want.keys())
    assert got.batch_size == want.batch_size
    for key in want.keys():  # noqa: SIM118 - iterating a TensorDict walks its rows
        a, b = got.get(key), want.get(key)
        if isinstance(b, NonTensorStack):
            assert isinstance(a, NonTensorStack) and a.tolist() == b.tolist(), key
            continue
        assert a.layout == b.layout, key
        assert_equal(a, b, key)


def assert_dp(got: Any, want: Any) -> None:
    assert_td(got.batch, want.batch)
    assert_equal(got.non_tensor_batch, want.non_tensor_batch, "non_tensor_batch")
    assert_equal(got.meta_info, want.meta_info, "meta_info")


def assert_payload(got: dict, want: dict) -> None:
    assert sorted(got) == ["global_steps", "keys", "tags", "tensordict"]
    assert_td(got["tensordict"], want["tensordict"])
    assert_equal(got["tags"], want["tags"], "tags")
    assert_equal(got["keys"], want["keys"], "keys")
    assert got["global_steps"] == want["global_steps"]


@pytest.fixture(scope="module")
def legacy_root(tmp_path_factory: pytest.TempPathFactory, verl_src: Path) -> tuple[Path, dict]:
    """A dump dir as verl writes it, with complete and broken steps, and the values written."""
    root = tmp_path_factory.mktemp("dump")
    fp = root / "my_exp_team_proj" / "GBS4_N2_in8_out6"
    want: dict[Any, Any] = {}
    with verl_installed(verl_src) as verl:
        for step in (1, 2):
            want[step] = make_dp(verl, seed=step)
            dump_dp(fp, step, want[step])
        os.environ["VERL_DATAPROTO_SERIALIZATION_METHOD"] = "numpy"
        try:
            want[3] = make_dp(verl, seed=3)
            dump_dp(fp, 3, want[3])
        finally:
            del os.environ["VERL_DATAPROTO_SERIALIZATION_METHOD"]
        (fp / "2" / "meta.json").unlink()  # interrupted before meta.json
        dump_dp(
            root / "default_experiment_name_default_project_name" / "GBS1_N1_in4_out4", 1, make_dp(verl, rows=2, seed=9)
        )
    want[5] = [tq_payload(seed=50), tq_payload(seed=51)]
    for i, payload in enumerate(want[5]):
        dump_tq(fp, 5, payload, minibatch=i)
    dump_tq(fp, 6, tq_payload(seed=60), minibatch=0)
    dump_tq(fp, 6, tq_payload(seed=62), minibatch=2)  # gap: mini-batch 1 missing
    (dump_tq(fp, 7, tq_payload(seed=70), minibatch=0) / "meta.json").unlink()
    want[8] = tq_payload(seed=80, step=8)
    dump_tq(fp, 8, want[8], minibatch=None)  # older verl: flat
    (fp / "9").mkdir()
    (fp / "notastep").mkdir()
    solo = root / "solo_proj" / "GBS2_N1_in4_outNone" / "4"
    solo.mkdir(parents=True)
    (solo / "gen_batch.dp").write_bytes(b"")
    (solo / "meta.json").write_text(json.dumps({"global_steps": 4}))
    return root, want


# ------------------------------------------------------------------ scanning


def test_scan_finds_experiments_steps_and_reasons(legacy_root: tuple[Path, dict]) -> None:
    root, _ = legacy_root
    exps = {e.combined_name: e for e in scan_legacy(root)}
    assert sorted(exps) == ["default_experiment_name_default_project_name", "my_exp_team_proj", "solo_proj"]
    exp = exps["my_exp_team_proj"]
    assert exp.fingerprint() == {
        "experiment_name": "my",
        "project_name": "exp_team_proj",
        "gen_batch_size": 4,
        "n": 2,
        "max_prompt_length": 8,
        "max_response_length": 6,
    }
    assert exp.name_split == "guess"
    assert ("my_exp", "team_proj") in exp.name_candidates and len(exp.name_candidates) == 3
    steps = {s.step: s for s in exp.steps}
    assert [s.step for s in exp.steps] == [1, 2, 3, 5, 6, 7, 8, 9]
    assert exp.complete_steps == [1, 3, 5, 8]
    assert (steps[1].kind, steps[1].layout, steps[1].minibatches[0].index) == ("dp", "flat", None)
    assert dict(steps[1].minibatches[0].meta) == {"global_steps": 1}
    assert (steps[5].kind, steps[5].layout, [m.index for m in steps[5].minibatches]) == ("tq", "nested", [0, 1])
    assert dict(steps[5].minibatches[1].meta) == {"global_steps": 5, "num_trajectories": 4}
    assert (steps[8].kind, steps[8].layout) == ("tq", "flat")
    assert steps[2].reason == "meta.json missing"
    assert steps[6].reason == "mini-batch dirs not contiguous from 0: missing [1]"
    assert steps[7].reason == "mini-batch 0: meta.json missing"
    assert steps[9].kind is None and "no gen_batch.dp or tq_batch.pt" in steps[9].reason
    default = exps["default_experiment_name_default_project_name"]
    assert (default.experiment_name, default.project_name, default.name_split) == (
        "default_experiment_name",
        "default_project_name",
        "default",
    )
    solo = exps["solo_proj"]
    assert (solo.experiment_name, solo.project_name, solo.name_split) == ("solo", "proj", "unique")
    assert solo.max_response_length is None and solo.steps[0].reason == "gen_batch.dp is empty"


def test_scan_hints_expected_minibatches_and_subdirs(legacy_root: tuple[Path, dict]) -> None:
    root, _ = legacy_root
    exp = next(e for e in scan_legacy(root, project_name="team_proj") if e.combined_name == "my_exp_team_proj")
    assert (exp.experiment_name, exp.project_name, exp.name_split) == ("my_exp", "team_proj", "hint")
    # both hints, and a directory of another experiment of the same project: the project decides
    both = {e.combined_name: e for e in scan_legacy(root, experiment_name="my", project_name="team_proj")}
    mine = both["my_exp_team_proj"]
    assert (mine.experiment_name, mine.project_name, mine.name_split) == ("my_exp", "team_proj", "hint")
    strict = next(e for e in scan_legacy(root, expected_minibatches=3) if e.n == 2)
    assert strict.get_step(5).reason == "2 mini-batch dirs, expected 3" and 5 not in strict.complete_steps
    assert [e.path for e in scan_legacy(exp.path)] == [exp.path]  # a GBS dir itself
    assert [e.path for e in scan_legacy(exp.path.parent)] == [exp.path]  # an {exp}_{proj} dir
    assert scan_legacy(root / "missing") == []
    with pytest.raises(IncompleteStepError, match="meta.json missing"):
        read_step(exp.get_step(2))


def test_legacy_experiment_dir_matches_verl_layout(tmp_path: Path) -> None:
    got = legacy_experiment_dir(
        tmp_path,
        experiment_name="e_1",
        project_name="p",
        gen_batch_size=256,
        n=8,
        max_prompt_length=1024,
        max_response_length=2048,
    )
    assert got == tmp_path.resolve() / "e_1_p" / "GBS256_N8_in1024_out2048"


# ------------------------------------------------------------------ reading


def test_read_dp_bit_exact_both_serializations(legacy_root: tuple[Path, dict]) -> None:
    root, want = legacy_root
    exp = next(e for e in scan_legacy(root) if e.n == 2)
    for step in (1, 3):
        (got,) = read_step(exp.get_step(step))
        assert type(got) is LegacyDataProto and len(got) == 4
        assert_dp(got, want[step])


def test_read_tq_bit_exact_nested_and_flat(legacy_root: tuple[Path, dict]) -> None:
    root, want = legacy_root
    exp = next(e for e in scan_legacy(root) if e.n == 2)
    got = read_step(exp.get_step(5))
    assert len(got) == 2
    for g, w in zip(got, want[5], strict=True):
        assert g["tensordict"]["prompts"].is_nested and g["tensordict"]["prompts"].layout == torch.jagged
        assert_payload(g, w)
    assert_payload(read_minibatch(exp.get_step(8).path), want[8])


def test_read_maps_to_real_dataproto_without_running_its_setstate(
    legacy_root: tuple[Path, dict], verl_src: Path
) -> None:
    root, want = legacy_root
    path = root / "my_exp_team_proj" / "GBS4_N2_in8_out6" / "1" / "gen_batch.dp"
    with verl_installed(verl_src) as verl:
        got = read_minibatch(path)
        assert type(got) is verl.DataProto and not got.setstate_ran
        assert_dp(got, want[1])
        assert type(read_minibatch(path, as_verl=False)) is LegacyDataProto
    with pytest.raises(ImportError):
        read_minibatch(path, as_verl=True)


# ------------------------------------------------------------------ writing back


def test_write_dp_round_trip_and_verl_loads_it(tmp_path: Path, verl_src: Path) -> None:
    fp = tmp_path / "x_y" / "GBS4_N2_in8_out6"
    with verl_installed(verl_src) as verl:
        src = [make_dp(verl, seed=s) for s in (11, 12, 13)]
    flat = write_legacy_dp(fp / "11", src[0])
    write_legacy_dp(fp / "12", src[1], minibatch=0)
    write_legacy_dp(fp / "12", src[2], minibatch=1)
    assert (flat / "meta.json").read_text() == json.dumps({"global_steps": 11})
    (exp,) = scan_legacy(tmp_path)
    assert exp.complete_steps == [11, 12] and exp.get_step(12).layout == "nested"
    assert_dp(read_minibatch(flat), src[0])
    for got, want in zip(read_step(exp.get_step(12)), src[1:], strict=True):
        assert_dp(got, want)
    with verl_installed(verl_src) as verl:  # verl's own loader yields verl's own class
        loaded = verl.DataProto.load_from_disk(flat / "gen_batch.dp")
        assert type(loaded) is verl.DataProto and loaded.setstate_ran
        assert_dp(loaded, src[0])
        assert_dp(verl.DataProto.load_from_disk(fp / "12" / "1" / "gen_batch.dp"), src[2])
    with pytest.raises(FileExistsError):
        write_legacy_dp(fp / "11", src[0])


def test_write_dp_from_plain_mapping_and_lists(tmp_path: Path) -> None:
    jagged = torch.nested.nested_tensor([torch.arange(3), torch.arange(5)], layout=torch.jagged)
    src = LegacyDataProto(
        {"ids": torch.arange(6).view(2, 3), "resp": jagged}, {"uid": ["a", "b"], "pairs": [[1, 2], [3, 4]]}, {"k": 1}
    )
    got = read_minibatch(write_legacy_dp(tmp_path / "3", src, global_steps=7))
    assert json.loads((tmp_path / "3" / "meta.json").read_text()) == {"global_steps": 7}
    assert_equal(got.batch["ids"], torch.arange(6).view(2, 3))
    assert_equal(got.batch["resp"], jagged)
    assert got.non_tensor_batch["pairs"].shape == (2,) and got.non_tensor_batch["pairs"][1] == [3, 4]
    assert list(got.non_tensor_batch["uid"]) == ["a", "b"] and got.meta_info == {"k": 1}


def test_write_tq_round_trip_both_layouts(tmp_path: Path) -> None:
    fp = tmp_path / "x_y" / "GBS4_N2_in8_out6"
    src = [tq_payload(seed=s, step=4) for s in (1, 2)]
    for i, payload in enumerate(src):
        write_legacy_tq(fp / "4", payload, minibatch=i)
    consolidated = dict(src[0], tensordict=src[0]["tensordict"].consolidate())
    flat = write_legacy_tq(fp / "9", consolidated, minibatch=None, global_steps=9)
    assert (fp / "4" / "1" / "meta.json").read_text() == json.dumps({"global_steps": 4, "num_trajectories": 4})
    (exp,) = scan_legacy(tmp_path)
    assert [(s.step, s.layout, s.complete) for s in exp.steps] == [(4, "nested", True), (9, "flat", True)]
    for got, want in zip(read_step(exp.get_step(4)), src, strict=True):
        assert_payload(got, want)
    got = read_minibatch(flat / "tq_batch.pt")
    assert got["global_steps"] == 9
    assert_payload(got, dict(src[0], global_steps=9))
    plain = torch.load(flat / "tq_batch.pt", weights_only=False)  # as verl's load_dump_data reads it
    assert isinstance(plain["tensordict"], TensorDict) and plain["keys"] == src[0]["keys"]
    with pytest.raises(ValueError, match="tags"):
        write_legacy_tq(fp / "10", dict(src[0], tags=[]))


# ------------------------------------------------------------------ hostile pickles


class _Shell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch '{self.marker}'",)


class _Touch:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return Path.touch, (self.marker,)


def _refused(exc: pytest.ExceptionInfo, path: Path, name: str) -> None:
    assert isinstance(exc.value, ZarrSkipError) and isinstance(exc.value, pickle.UnpicklingError)
    assert exc.value.path == os.fspath(path) and exc.value.refused == name
    assert os.fspath(path) in str(exc.value) and name in str(exc.value)


def test_hostile_dp_refused_and_payload_not_run(tmp_path: Path, verl_src: Path) -> None:
    marker = tmp_path / "pwned"
    with verl_installed(verl_src) as verl:
        poisoned = make_dp(verl, rows=2)
        poisoned.meta_info["x"] = _Shell(marker)
        evil_meta = dump_dp(tmp_path / "a", 1, poisoned) / "gen_batch.dp"
        buf = io.BytesIO()
        torch.save(_Shell(marker), buf)
        evil_inner = tmp_path / "inner.dp"
        shell = verl.DataProto.__new__(verl.DataProto)  # verl's layout, hostile batch bytes
        shell.__getstate__ = lambda: (buf.getvalue(), {}, {})
        evil_inner.write_bytes(pickle.dumps(shell))
    evil_top = tmp_path / "top.dp"
    evil_top.write_bytes(pickle.dumps(_Touch(marker)))
    write_legacy_dp(tmp_path / "3", LegacyDataProto(None, {"f": [Fraction(1, 3)]}, {}))
    for path, name in ((evil_meta, "posix.system"), (evil_inner, "posix.system"), (evil_top, "pathlib.Path.touch")):
        with pytest.raises(UnsafePickleError) as exc:
            read_minibatch(path)
        _refused(exc, path, name)
        assert not marker.exists()
    with pytest.raises(UnsafePickleError, match="fractions.Fraction"):
        read_minibatch(tmp_path / "3")
    assert read_minibatch(tmp_path / "3", allow_pickle=True).non_tensor_batch["f"][0] == Fraction(1, 3)
    assert read_minibatch(evil_meta, allow_pickle=True, as_verl=False).meta_info["x"] == 0
    assert marker.exists()  # the refused payload was real


def test_hostile_pt_refused_and_trust_lifts_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for i, (hostile, name) in enumerate(((_Shell(marker), "posix.system"), (_Touch(marker), "builtins.getattr"))):
        payload = tq_payload(rows=2)
        payload["tags"][0]["evil"] = hostile
        evil = dump_tq(tmp_path / "fp", i, payload) / "tq_batch.pt"
        with pytest.raises(UnsafePickleError) as exc:
            read_minibatch(evil)
        _refused(exc, evil, name)
        assert not marker.exists()
    read_minibatch(evil, allow_pickle=True)  # explicit opt-in: the payload runs
    assert marker.exists()
    marker.unlink()
    evil_dp = tmp_path / "evil.dp"
    evil_dp.write_bytes(pickle.dumps(_Touch(marker)))
    with pytest.raises(ValueError, match="not a pickled verl DataProto"):
        read_minibatch(evil_dp, allow_pickle=True)
    assert marker.exists()


def test_writing_lives_in_legacy_write_and_is_reexported() -> None:
    from zarr_skip.legacy import dumps as legacy
    from zarr_skip.legacy import write as legacy_write

    for name in ("DP_FILE", "META_FILE", "TQ_FILE", "legacy_experiment_dir", "write_legacy_dp", "write_legacy_tq"):
        assert getattr(legacy, name) is getattr(legacy_write, name) and name in legacy.__all__
    assert legacy_write.canonical_int("12") == 12 and legacy_write.canonical_int("012") is None
