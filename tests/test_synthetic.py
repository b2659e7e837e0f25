"""Tests of the synthetic rollout generator (zarr_skip/synthetic.py)."""

from __future__ import annotations

import dataclasses
import pickle
import uuid

import numpy as np
import pytest
import torch

from zarr_skip.synthetic import (
    EOS_ID,
    PAD_ID,
    PRESETS,
    VOCAB_SIZE,
    DataProtoLike,
    Preset,
    as_mapping,
    jagged_payload,
    padded_batch,
)

TINY = Preset(rows=64, max_prompt=48, max_response=96, n=8)
# many rows, short sequences: enough samples to check the truncation share cheaply
WIDE = Preset(rows=4096, max_prompt=16, max_response=64, n=8)

TENSOR_KEYS = {
    "prompts": torch.int64,
    "responses": torch.int64,
    "input_ids": torch.int64,
    "attention_mask": torch.int64,
    "position_ids": torch.int64,
    "response_mask": torch.int64,
    "old_log_probs": torch.float32,
}
NON_TENSOR_KEYS = {"uid", "data_source", "raw_prompt", "reward_model", "extra_info"}


@pytest.fixture(scope="module")
def small_dp() -> DataProtoLike:
    return padded_batch("small", seed=3)


@pytest.fixture(scope="module")
def small_jagged() -> dict:
    return jagged_payload("small", seed=3)


def _lengths(dp: DataProtoLike) -> tuple[torch.Tensor, torch.Tensor]:
    P = dp.batch["prompts"].shape[1]
    return dp.batch["attention_mask"][:, :P].sum(1), dp.batch["response_mask"].sum(1)


def test_presets() -> None:
    assert PRESETS["small"] == Preset(128, 512, 1024, 8)
    assert PRESETS["medium"] == Preset(rows=1024, max_prompt=1024, max_response=4096, n=8)
    assert PRESETS["large"] == Preset(4096, 2048, 8192, 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["small"].rows = 1  # type: ignore[misc]
    with pytest.raises(ValueError):
        Preset(rows=10, max_prompt=64, max_response=64, n=8)  # rows not a multiple of n
    with pytest.raises(ValueError):
        padded_batch("huge")


def test_padded_deterministic_per_seed() -> None:
    a, b, c = padded_batch(TINY, seed=1), padded_batch(TINY, seed=1), padded_batch(TINY, seed=2)
    for k in a.batch:
        assert torch.equal(a.batch[k], b.batch[k]), k
    for k in a.non_tensor_batch:
        assert a.non_tensor_batch[k].tolist() == b.non_tensor_batch[k].tolist(), k
    assert a.meta_info == b.meta_info
    assert not torch.equal(a.batch["responses"], c.batch["responses"])
    assert a.non_tensor_batch["uid"].tolist() != c.non_tensor_batch["uid"].tolist()
    # the step is part of the seed material too
    d = padded_batch(TINY, seed=1, step=2)
    assert d.meta_info["global_steps"] == 2
    assert not torch.equal(a.batch["responses"], d.batch["responses"])


def test_jagged_deterministic_per_seed() -> None:
    a, b = jagged_payload(TINY, seed=5), jagged_payload(TINY, seed=5)
    ma, mb = as_mapping(a), as_mapping(b)
    assert ma.keys() == mb.keys()
    for k, v in ma.items():
        if isinstance(v, torch.Tensor):
            if v.is_nested:
                assert torch.equal(v.values(), mb[k].values()), k
                assert torch.equal(v.offsets(), mb[k].offsets()), k
            else:
                assert torch.equal(v, mb[k]), k
        else:
            assert v == mb[k], k
    assert a["global_steps"] == b["global_steps"] == 1


def test_padded_shapes_dtypes(small_dp: DataProtoLike) -> None:
    p = PRESETS["small"]
    assert len(small_dp) == p.rows
    assert set(small_dp.batch) == set(TENSOR_KEYS)
    for k, dt in TENSOR_KEYS.items():
        assert small_dp.batch[k].dtype == dt, k
    b = small_dp.batch
    assert b["prompts"].shape == (p.rows, p.max_prompt)
    assert b["responses"].shape == (p.rows, p.max_response)
    assert b["old_log_probs"].shape == (p.rows, p.max_response)
    assert b["response_mask"].shape == (p.rows, p.max_response)
    for k in ("input_ids", "attention_mask", "position_ids"):
        assert b[k].shape == (p.rows, p.max_prompt + p.max_response), k
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert set(small_dp.non_tensor_batch) == NON_TENSOR_KEYS
    for k, v in small_dp.non_tensor_batch.items():
        assert isinstance(v, np.ndarray) and v.dtype == object and v.shape == (p.rows,), k
    nt = small_dp.non_tensor_batch
    assert all(isinstance(x, str) for x in nt["data_source"])
    msg = nt["raw_prompt"][0]
    assert isinstance(msg, list) and msg[0]["role"] == "user" and isinstance(msg[0]["content"], str)
    assert nt["reward_model"][0]["style"] == "rule"
    assert isinstance(nt["reward_model"][0]["ground_truth"], str)
    assert nt["extra_info"][0]["split"] == "train" and isinstance(nt["extra_info"][0]["index"], int)
    assert small_dp.meta_info["global_steps"] == 1
    assert small_dp.meta_info["temperature"] == 1.0


def test_padding_and_masks(small_dp: DataProtoLike) -> None:
    b = small_dp.batch
    P, R = b["prompts"].shape[1], b["responses"].shape[1]
    plen, rlen = _lengths(small_dp)
    assert int(plen.min()) >= 8 and int(plen.max()) <= P
    assert int(rlen.min()) >= 1 and int(rlen.max()) <= R
    # masks are exactly "first/last L positions"
    exp_pmask = torch.arange(P)[None, :] >= (P - plen)[:, None]
    exp_rmask = torch.arange(R)[None, :] < rlen[:, None]
    assert torch.equal(b["attention_mask"][:, :P].bool(), exp_pmask)
    assert torch.equal(b["response_mask"].bool(), exp_rmask)
    assert torch.equal(b["attention_mask"][:, P:], b["response_mask"])
    # padding positions hold the pad id, real positions never do
    assert bool((b["prompts"][~exp_pmask] == PAD_ID).all())
    assert bool((b["prompts"][exp_pmask] != PAD_ID).all())
    assert bool((b["responses"][~exp_rmask] == PAD_ID).all())
    assert bool((b["responses"][exp_rmask] != PAD_ID).all())
    assert bool((b["old_log_probs"][~exp_rmask] == 0).all())
    lp = b["old_log_probs"][exp_rmask]
    assert bool((lp <= 0).all()) and bool(torch.isfinite(lp).all())
    # verl's compute_position_id_with_mask
    exp_pos = torch.clip(torch.cumsum(b["attention_mask"], dim=-1) - 1, min=0)
    assert torch.equal(b["position_ids"], exp_pos)
    # finished responses end with EOS, truncated ones are cut at max_response
    last = b["responses"].gather(1, (rlen - 1)[:, None])[:, 0]
    assert bool((last[rlen < R] == EOS_ID).all())


def test_token_values_within_vocab(small_dp: DataProtoLike, small_jagged: dict) -> None:
    for k in ("prompts", "responses", "input_ids"):
        t = small_dp.batch[k]
        assert int(t.min()) >= 0 and int(t.max()) < VOCAB_SIZE, k
    td = small_jagged["tensordict"]
    for k in ("prompts", "responses"):
        v = td[k].values()
        assert int(v.min()) >= 0 and int(v.max()) < VOCAB_SIZE, k
        assert not bool((v == PAD_ID).any()), k
    # Zipf-like: the most frequent token is much more frequent than the median one
    counts = torch.bincount(small_dp.batch["responses"][small_dp.batch["response_mask"].bool()])
    assert int(counts.max()) > 50 * max(1, int(counts[counts > 0].median()))


def test_jagged_matches_padded(small_dp: DataProtoLike, small_jagged: dict) -> None:
    td = small_jagged["tensordict"]
    b = small_dp.batch
    plen, rlen = _lengths(small_dp)
    pm, rm = b["attention_mask"][:, : b["prompts"].shape[1]].bool(), b["response_mask"].bool()
    for k in ("prompts", "responses", "response_mask", "old_log_probs"):
        assert td[k].is_nested and td[k].layout == torch.jagged, k
    assert torch.equal(td["prompts"].offsets().diff(), plen)
    for k in ("responses", "response_mask", "old_log_probs"):
        assert torch.equal(td[k].offsets().diff(), rlen), k
    assert torch.equal(td["prompts"].values(), b["prompts"][pm])
    assert torch.equal(td["responses"].values(), b["responses"][rm])
    assert torch.equal(td["old_log_probs"].values(), b["old_log_probs"][rm])
    assert bool((td["response_mask"].values() == 1).all())
    assert td["response_mask"].dtype == torch.int64
    assert td["old_log_probs"].dtype == torch.float32
    assert torch.equal(td["seq_len"], plen + rlen)
    tags = small_jagged["tags"]
    assert [t["seq_len"] for t in tags] == (plen + rlen).tolist()
    assert all(t["status"] == "finished" and t["global_steps"] == 1 for t in tags)
    assert all(t["min_global_steps"] == t["max_global_steps"] == 1 for t in tags)


def test_grpo_grouping(small_dp: DataProtoLike, small_jagged: dict) -> None:
    p = PRESETS["small"]
    uids = small_dp.non_tensor_batch["uid"].reshape(p.groups, p.n)
    assert all(len(set(row)) == 1 for row in uids.tolist())
    assert len(set(uids[:, 0].tolist())) == p.groups
    for u in uids[:, 0]:
        assert uuid.UUID(u).version == 4
    prompts = small_dp.batch["prompts"].reshape(p.groups, p.n, -1)
    assert bool((prompts == prompts[:, :1]).all())
    assert not torch.equal(prompts[0, 0], prompts[1, 0])
    keys = small_jagged["keys"]
    assert len(keys) == p.rows == len(set(keys))
    for i, key in enumerate(keys):
        uid, session, zero = key.rsplit("_", 2)
        assert uid == small_dp.non_tensor_batch["uid"][i]
        assert int(session) == i % p.n and zero == "0"
    m = as_mapping(small_jagged)
    if "uid" in m:
        assert m["uid"] == small_dp.non_tensor_batch["uid"].tolist()


def test_truncated_share_about_ten_percent() -> None:
    dp = padded_batch(WIDE, seed=0)
    rlen = dp.batch["response_mask"].sum(1)
    share = float((rlen == WIDE.max_response).float().mean())
    assert 0.07 <= share <= 0.13, share
    # long tail: median well below the maximum
    assert float(rlen.float().median()) < 0.7 * WIDE.max_response


def test_as_mapping(small_jagged: dict) -> None:
    m = as_mapping(small_jagged)
    td = small_jagged["tensordict"]
    assert set(m) == set(td.keys()) | {"tags", "keys"}
    assert m["tags"] == small_jagged["tags"] and m["keys"] == small_jagged["keys"]
    for k, v in m.items():
        assert isinstance(v, (torch.Tensor, list)), (k, type(v))
        if isinstance(v, list):
            assert type(v) is list and len(v) == PRESETS["small"].rows, k
    assert m["responses"] is td["responses"]


def test_pickle_roundtrip_like_verl() -> None:
    dp = padded_batch(TINY, seed=9)
    back = pickle.loads(pickle.dumps(dp))
    assert isinstance(back, DataProtoLike) and len(back) == TINY.rows
    for k in dp.batch:
        assert torch.equal(dp.batch[k], back.batch[k]), k
    assert back.non_tensor_batch["uid"].tolist() == dp.non_tensor_batch["uid"].tolist()
    assert back.meta_info == dp.meta_info


def test_realistic_payload_has_verl_sized_objects_shared_per_group() -> None:
    from zarr_skip.synthetic import as_mapping, jagged_payload, padded_batch

    m = as_mapping(jagged_payload("small", 3, payload="realistic"))
    dp = padded_batch("small", 3, payload="realistic")
    n = 8
    for name in ("raw_prompt", "extra_info", "reward_model", "uid", "data_source"):
        rows = m[name]
        assert rows[0] is rows[n - 1] and rows[n] is rows[2 * n - 1], name  # one object per group
        assert rows[0] is not rows[n] or name == "data_source", name
        assert [repr(r) for r in rows] == [repr(r) for r in dp.non_tensor_batch[name]], name
    system, user = m["raw_prompt"][0]
    assert (system["role"], user["role"]) == ("system", "user")
    users = np.array([len(r[1]["content"]) for r in m["raw_prompt"]])
    answers = np.array([len(e["answer"]) for e in m["extra_info"]])
    assert 150 < np.median(users) < 600 and 200 < np.median(answers) < 1000
    assert all(e["question"] in r[1]["content"] for e, r in zip(m["extra_info"], m["raw_prompt"], strict=True))
    assert all(
        e["answer"].endswith("#### " + g["ground_truth"])
        for e, g in zip(m["extra_info"], m["reward_model"], strict=True)
    )
    again = as_mapping(jagged_payload("small", 3, payload="realistic"))
    assert repr(again["extra_info"]) == repr(m["extra_info"])
    minimal = as_mapping(jagged_payload("small", 3))
    assert torch.equal(minimal["responses"].values(), m["responses"].values())  # tensors unchanged
    with pytest.raises(ValueError, match="unknown payload"):
        padded_batch("small", payload="huge")
