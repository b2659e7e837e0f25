"""Readable synthetic rollouts: short maths problems with worked answers, right and wrong, scored.

A GRPO step as verl holds it after scoring, with real text: each of ``groups`` prompts (a chat
``raw_prompt``, tokenized with the project's own small tokenizer, :data:`TOKENIZER_PATH`) gets
``n`` worked answers sharing its ``uid``. Answers are right, slip in one step (the slip's tokens
get low log-probs, as a model unsure of them would), or ramble until cut at ``max_response``
(truncated: no ``<|im_end|>``). Scores are 1.0 for a right final answer, else 0.0; ``acc`` says
the same as a bool; ``advantages`` are GRPO's (score minus the group's mean, over its std).

The columns and their names are verl's: ``prompts``, ``responses``, ``response_mask``,
``old_log_probs``, ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``uid``,
``data_source``, ``raw_prompt``, ``reward_model``, ``extra_info``, ``score``, ``acc``; jagged
(NestedTensors, no padding) by default, or verl's padded ``DataProto`` layout.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zarr_skip.format.specs import jagged_tensor
from zarr_skip.synthetic.rollouts import DataProtoLike

__all__ = [
    "EOS_TEXT",
    "PAD_TEXT",
    "SPECIAL_TOKENS",
    "TOKENIZER_PATH",
    "Problem",
    "chat_prompt",
    "problems",
    "shipped_tokenizer",
    "text_rollouts",
    "training_corpus",
]

#: the small byte-level BPE tokenizer the project trains on its own text (scripts/build_tokenizer.py)
TOKENIZER_PATH = Path(__file__).with_name("tokenizer.json")
PAD_TEXT, START_TEXT, EOS_TEXT = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD_TEXT, START_TEXT, EOS_TEXT)
INSTRUCTION = "Let's think step by step and put the final answer in \\boxed{}."

_NAMES = ("Ava", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena")
_ITEMS = ("apple", "marble", "book", "pencil", "sticker", "cookie", "stamp", "shell", "card", "coin")
_SOURCES = ("synthetic/arithmetic", "synthetic/word_problems")
_RAMBLE = "Wait, let me check that again. "


@dataclass(frozen=True, slots=True)
class Problem:
    """A question and the steps of its worked answer: ``(text before, left, op, right)``."""

    question: str
    steps: tuple[tuple[str, int, str, int], ...]
    data_source: str

    @property
    def answer(self) -> int:
        return _apply(*self.steps[-1][1:])


def _apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "×": a * b, "÷": a // b}[op]


def _problem(rng: np.random.Generator) -> Problem:
    kind = int(rng.integers(0, 6))
    name, item = str(rng.choice(_NAMES)), str(rng.choice(_ITEMS))
    a, b, c = (int(x) for x in rng.integers(2, 60, size=3))
    if kind == 0:
        op = str(rng.choice(["+", "-", "×"]))
        a, b = (max(a, b), min(a, b)) if op == "-" else (a, b)
        return Problem(f"What is {a} {op} {b}?", (("", a, op, b),), _SOURCES[0])
    if kind == 1:
        return Problem(
            f"{name} has {a} {item}s and buys {b} more. How many {item}s does {name} have now?",
            ((f"{name} starts with {a} {item}s and buys {b} more. ", a, "+", b),),
            _SOURCES[1],
        )
    if kind == 2:
        a += b
        return Problem(
            f"{name} has {a} {item}s and gives {b} to a friend. How many {item}s are left?",
            ((f"{name} gives away {b} of {a} {item}s. ", a, "-", b),),
            _SOURCES[1],
        )
    if kind == 3:
        a, b = a % 12 + 2, b % 12 + 2
        return Problem(
            f"A box holds {a} {item}s. How many {item}s are in {b} boxes?",
            ((f"Each of the {b} boxes holds {a} {item}s. ", b, "×", a),),
            _SOURCES[1],
        )
    if kind == 4:
        b, each = b % 9 + 2, c % 12 + 2
        return Problem(
            f"{name} shares {b * each} {item}s equally among {b} friends. How many does each friend get?",
            ((f"{b * each} {item}s shared by {b} friends: ", b * each, "÷", b),),
            _SOURCES[1],
        )
    a, b = a % 9 + 2, b % 12 + 2
    c = c % (a * b - 1) + 1
    return Problem(
        f"{name} buys {a} packs of {b} {item}s and uses {c} of them. How many {item}s are left?",
        ((f"{name} buys {a} packs of {b}. ", a, "×", b), (f"Then uses {c}. ", a * b, "-", c)),
        _SOURCES[1],
    )


def problems(count: int, seed: int = 0) -> list[Problem]:
    """``count`` problems, the same for the same seed."""
    rng = np.random.default_rng([int(seed), 0x7E47])
    return [_problem(rng) for _ in range(count)]


def _user_turn(question: str) -> str:
    return f"{question} {INSTRUCTION}"


def chat_prompt(question: str) -> str:
    """The user turn and the assistant's opening in the Qwen2 chat template."""
    return f"{START_TEXT}user\n{_user_turn(question)}{EOS_TEXT}\n{START_TEXT}assistant\n"


def _worked(p: Problem, slip: int | None) -> tuple[str, tuple[int, int] | None]:
    """The worked answer, with ``slip`` added to the first step's result when given, and the
    character span of the wrong number (None when right)."""
    text, span, carry = "", None, None
    for i, (before, a, op, b) in enumerate(p.steps):
        a = carry if carry is not None and i else a
        value = _apply(a, op, b) + (slip if slip is not None and i == 0 else 0)
        text += f"{before}{a} {op} {b} = "
        if slip is not None and i == 0:
            span = (len(text), len(text) + len(str(value)))
        text += f"{value}.\n"
        carry = value
    return f"{text}The answer is \\boxed{{{carry}}}.", span


def training_corpus(count: int = 3000, seed: int = 1234) -> list[str]:
    """Text to train the shipped tokenizer on: prompts and worked answers, right and wrong."""
    out = []
    rng = np.random.default_rng(seed)
    for p in problems(count, seed):
        slip = None if rng.random() < 0.5 else int(rng.integers(1, 10))
        out.append(chat_prompt(p.question) + _worked(p, slip)[0] + EOS_TEXT)
    out.append(_RAMBLE * 3)
    return out


@lru_cache(maxsize=1)
def shipped_tokenizer() -> Any:
    """The shipped tokenizer as a ``tokenizers.Tokenizer`` (needs ``zarr-skip[text]``)."""
    from zarr_skip.views.tokenizers import _tokenizers_module

    return _tokenizers_module().Tokenizer.from_file(str(TOKENIZER_PATH))


@dataclass(frozen=True, slots=True)
class _Row:
    prompt: list[int]
    response: list[int]
    log_probs: np.ndarray
    score: float


def _answer(
    encode: Callable[[str], Any], eos: int, p: Problem, prompt: list[int], rng: np.random.Generator, max_response: int
) -> _Row:
    """One sampled answer: right (55%), one slip (35%) or rambling until truncated (10%)."""
    u = rng.random()
    slip = None if u < 0.55 else int(rng.choice([-10, -2, -1, 1, 2, 10]))
    text, span = _worked(p, slip)
    if u >= 0.9:
        text = f"{_worked(p, None)[0].rsplit('The answer', 1)[0]}{_RAMBLE * (max_response // 4 + 1)}"
        span = None
    enc = encode(text)
    ids = list(enc.ids) + [eos]
    # confident tokens, a few uncertain ones, and a slip the model was unsure of
    lp = -rng.exponential(np.where(rng.random(len(ids)) < 0.85, 0.03, 0.9)).astype(np.float32)
    if span is not None:
        unsure = [i for i, (s, e) in enumerate(enc.offsets) if s < span[1] and e > span[0]]
        lp[unsure] = -rng.uniform(2.0, 6.0, size=len(unsure)).astype(np.float32)
    truncated = len(ids) > max_response
    ids, lp = ids[:max_response], lp[:max_response]
    right = not truncated and slip is None and u < 0.9
    return _Row(prompt, ids, lp, 1.0 if right else 0.0)


def text_rollouts(
    groups: int = 8,
    n: int = 4,
    seed: int = 0,
    *,
    step: int = 1,
    max_response: int = 96,
    padded: bool = False,
) -> Any:
    """One scored GRPO step of readable rollouts (``groups * n`` rows).

    Returns a mapping of columns (jagged NestedTensors, lists and arrays: what
    :meth:`zarr_skip.Cache.write` takes), or with ``padded`` verl's padded
    :class:`DataProtoLike` (prompts left-padded to the longest, responses right-padded to
    ``max_response``, with attention and response masks, meta_info with the pad and eos ids).
    Deterministic for ``(groups, n, seed, step, max_response)``.
    """
    tok = shipped_tokenizer()
    # the n answers of a group often share a text: encode each text once
    encode = lru_cache(maxsize=1024)(partial(tok.encode, add_special_tokens=False))
    eos = int(tok.token_to_id(EOS_TEXT))
    rng = np.random.default_rng([int(seed), int(step), 0x7E47])
    rows: list[_Row] = []
    uids: list[str] = []
    per_group: list[Problem] = []
    for p in problems(groups, seed=int(seed) * 100_003 + int(step)):
        prompt = list(encode(chat_prompt(p.question)).ids)
        rows += [_answer(encode, eos, p, prompt, rng, max_response) for _ in range(n)]
        uids.append(str(uuid.UUID(bytes=bytes(rng.integers(0, 256, 16, dtype=np.uint8)), version=4)))
        per_group.append(p)
    scores = np.array([r.score for r in rows], dtype=np.float32)
    grouped = scores.reshape(groups, n)
    adv = ((grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, keepdims=True) + 1e-6)).reshape(-1)
    non_tensor: dict[str, Any] = {
        "uid": [u for u in uids for _ in range(n)],
        "data_source": [p.data_source for p in per_group for _ in range(n)],
        "raw_prompt": [[{"role": "user", "content": _user_turn(p.question)}] for p in per_group for _ in range(n)],
        "reward_model": [{"style": "rule", "ground_truth": str(p.answer)} for p in per_group for _ in range(n)],
        "extra_info": [
            {"index": int(seed) * 10_000 + i, "split": "train", "question": p.question, "answer": str(p.answer)}
            for i, p in enumerate(per_group)
            for _ in range(n)
        ],
        "score": scores,
        "acc": scores > 0.5,
    }
    resp_lp = [r.log_probs for r in rows]
    last_only = [np.eye(1, len(r.response), len(r.response) - 1, dtype=np.float32)[0] * r.score for r in rows]
    token_cols = {
        "responses": [np.array(r.response, dtype=np.int64) for r in rows],
        "response_mask": [np.ones(len(r.response), dtype=np.int64) for r in rows],
        "old_log_probs": resp_lp,
        "token_level_scores": last_only,
        "token_level_rewards": last_only,
        "advantages": [np.full(len(r.response), a, dtype=np.float32) for r, a in zip(rows, adv, strict=True)],
    }
    prompts = [np.array(r.prompt, dtype=np.int64) for r in rows]
    if padded:
        return _padded(prompts, token_cols, non_tensor, tok, step, max_response)
    out: dict[str, Any] = {"prompts": _nested(prompts)}
    out.update({k: _nested(v) for k, v in token_cols.items()})
    out["response_length"] = torch.tensor([len(r.response) for r in rows], dtype=torch.int64)
    out.update(non_tensor)
    return out


def _nested(rows: list[np.ndarray]) -> torch.Tensor:
    return jagged_tensor(  # without torch's fx-tracing warning in the user's process
        torch.from_numpy(np.concatenate(rows)),
        torch.from_numpy(np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)),
    )


def _padded(
    prompts: list[np.ndarray],
    token_cols: dict[str, list[np.ndarray]],
    non_tensor: dict[str, Any],
    tok: Any,
    step: int,
    max_response: int,
) -> DataProtoLike:
    pad, eos = int(tok.token_to_id(PAD_TEXT)), int(tok.token_to_id(EOS_TEXT))
    width = max(len(p) for p in prompts)
    rows = len(prompts)
    left = torch.full((rows, width), pad, dtype=torch.int64)
    prompt_mask = torch.zeros((rows, width), dtype=torch.int64)
    for i, p in enumerate(prompts):
        left[i, width - len(p) :] = torch.from_numpy(p)
        prompt_mask[i, width - len(p) :] = 1
    batch: dict[str, torch.Tensor] = {"prompts": left}
    for name, values in token_cols.items():
        fill = pad if name == "responses" else 0
        dtype = torch.int64 if values[0].dtype == np.int64 else torch.float32
        t = torch.full((rows, max_response), fill, dtype=dtype)
        for i, v in enumerate(values):
            t[i, : len(v)] = torch.from_numpy(v)
        batch[name] = t
    batch["input_ids"] = torch.cat([left, batch["responses"]], dim=1)
    batch["attention_mask"] = torch.cat([prompt_mask, batch["response_mask"]], dim=1)
    objects = {k: _objects(v) for k, v in non_tensor.items()}
    meta = {"global_steps": int(step), "eos_token_id": eos, "pad_token_id": pad, "temperature": 1.0}
    return DataProtoLike(batch, objects, meta)


def _objects(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
