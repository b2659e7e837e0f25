"""The readable synthetic rollouts and the tokenizer the project builds and ships itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts
from zarr_skip.synthetic.text import SPECIAL_TOKENS, problems

pytest.importorskip("tokenizers")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # trains the tokenizer again
def test_the_shipped_tokenizer_is_small_has_chat_tokens_and_rebuilds_byte_for_byte(tmp_path: Path) -> None:
    assert TOKENIZER_PATH.stat().st_size < 64 * 1024
    tok = shipped_tokenizer()
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    text = "<|im_start|>user\nWhat is 7 × 8?<|im_end|>"
    enc = tok.encode(text)
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    assert enc.ids[0] == 1 and enc.ids[-1] == 2  # special tokens are single ids
    out = tmp_path / "tokenizer.json"
    script = ROOT / "scripts" / "build_tokenizer.py"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == TOKENIZER_PATH.read_bytes()


def test_rollouts_are_deterministic_and_shaped_like_a_scored_verl_step() -> None:
    a, b = text_rollouts(5, 4, seed=3, step=2), text_rollouts(5, 4, seed=3, step=2)
    assert [r.tolist() for r in a["responses"].unbind()] == [r.tolist() for r in b["responses"].unbind()]
    assert a["uid"] == b["uid"]
    other = text_rollouts(5, 4, seed=3, step=3)
    assert other["uid"] != a["uid"]
    for name in ("prompts", "responses", "response_mask", "old_log_probs", "token_level_scores", "advantages"):
        assert a[name].is_nested and a[name].size(0) == 20, name
    lengths = a["response_length"].tolist()
    for name in ("response_mask", "old_log_probs", "token_level_scores", "token_level_rewards", "advantages"):
        assert [len(r) for r in a[name].unbind()] == lengths, name
    for key in ("uid", "data_source", "raw_prompt", "reward_model", "extra_info", "score", "acc"):
        assert len(a[key]) == 20, key


def test_a_group_shares_uid_and_prompt_and_answers_are_scored_right() -> None:
    tok = shipped_tokenizer()
    n, max_response = 8, 64
    batch = text_rollouts(16, n, seed=0, max_response=max_response)
    prompts = [p.tolist() for p in batch["prompts"].unbind()]
    responses = [r.tolist() for r in batch["responses"].unbind()]
    kinds = set()
    for g in range(16):
        rows = range(g * n, (g + 1) * n)
        assert len({batch["uid"][i] for i in rows}) == 1
        assert len({tuple(prompts[i]) for i in rows}) == 1
        assert len({batch["extra_info"][i]["question"] for i in rows}) == 1
        adv = np.array([batch["advantages"][i][0].item() for i in rows])
        assert abs(adv.mean()) < 1e-4
    assert len(set(batch["uid"])) == 16
    for i, ids in enumerate(responses):
        text = tok.decode(ids, skip_special_tokens=False)
        info, truth = batch["extra_info"][i], batch["reward_model"][i]["ground_truth"]
        assert info["answer"] == truth and info["question"] in batch["raw_prompt"][i][0]["content"]
        boxed = re.search(r"\\boxed\{(-?\d+)\}", text)
        right = text.endswith("<|im_end|>") and boxed is not None and boxed.group(1) == truth
        assert batch["score"][i] == float(right) and bool(batch["acc"][i]) == right
        scores = batch["token_level_scores"][i]
        assert scores[-1].item() == batch["score"][i] and float(scores[:-1].abs().sum()) == 0.0
        if not text.endswith("<|im_end|>"):
            assert len(ids) == max_response
            kinds.add("truncated")
        else:
            kinds.add("right" if right else "wrong")
    assert kinds == {"right", "wrong", "truncated"}
    assert {s for s in batch["data_source"]} == {"synthetic/arithmetic", "synthetic/word_problems"}


def test_a_slip_is_where_the_model_was_unsure() -> None:
    tok = shipped_tokenizer()
    batch = text_rollouts(16, 8, seed=1)
    wrong = [i for i in range(128) if batch["score"][i] == 0 and batch["responses"][i][-1].item() == 2]
    assert wrong
    for i in wrong:
        lp = batch["old_log_probs"][i]
        assert float(lp.min()) <= -2.0  # the wrong number's tokens
    right = [i for i in range(128) if batch["score"][i] == 1]
    assert np.median([float(batch["old_log_probs"][i].min()) for i in right]) > -2.0
    del tok


def test_padded_rollouts_hold_the_same_tokens() -> None:
    jagged = text_rollouts(3, 2, seed=4, max_response=40)
    padded = text_rollouts(3, 2, seed=4, max_response=40, padded=True)
    assert padded.batch["responses"].shape == (6, 40)
    for i, r in enumerate(jagged["responses"].unbind()):
        mask = padded.batch["response_mask"][i].bool()
        assert torch.equal(padded.batch["responses"][i][mask], r)
        p = jagged["prompts"][i]
        assert torch.equal(padded.batch["prompts"][i][-len(p) :], p)
    assert padded.meta_info["pad_token_id"] == 0 and padded.meta_info["eos_token_id"] == 2
    assert list(padded.non_tensor_batch["uid"]) == jagged["uid"]


def test_problems_have_worked_answers() -> None:
    for p in problems(50, seed=9):
        assert p.question.endswith("?")
        assert isinstance(p.answer, int) and p.answer >= 0
