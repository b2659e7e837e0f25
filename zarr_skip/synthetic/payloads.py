"""Per-row objects of a GRPO step as verl has them (the ``realistic`` payload of the presets).

verl's datasets (gsm8k, MATH, ...) give every prompt a chat ``raw_prompt`` (a system and a user
message), ``extra_info`` with the question and the worked answer, ``reward_model`` with the
ground truth, ``data_source`` and a ``uid``; ``repeat(interleave=True)`` then makes the ``n`` rows
of a group hold the same Python objects. The ``minimal`` payload keeps these fields tiny (a
short user message, an index); ``realistic`` gives them the sizes real steps have (a few
hundred characters each), so that the cost of per-row objects is measured.

Pure and seeded: the same inputs give the same objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

PAYLOADS = ("minimal", "realistic")

SYSTEM_PROMPT = (
    "You are a careful math tutor. Reason step by step, check every intermediate result, and "
    "give the final answer as a number after the marker ####."
)
INSTRUCTION = ' Let\'s think step by step and output the final answer after "####".'
#: at most this many characters of a question (a word boundary below it)
MAX_QUESTION = 480


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: text.rfind(" ", 0, limit)]


def realistic_per_group(
    rng: np.random.Generator,
    uids: Sequence[str],
    data_source: Sequence[str],
    questions: Sequence[str],
    ground_truth: Sequence[str],
    index: Sequence[int],
) -> dict[str, list[Any]]:
    """One object per GRPO group and field (repeat each ``n`` times, as the same object).

    The worked answer of ``extra_info`` is made of the question's words in a shuffled order
    (about half as long again), closed by ``#### {ground truth}``.
    """
    raw_prompt, extra_info, reward_model = [], [], []
    for q, gt, i in zip(questions, ground_truth, index, strict=True):
        question = _cut(q, MAX_QUESTION)
        words = question.split()
        steps = " ".join(rng.permutation(words + words[: len(words) // 2]).tolist())
        answer = f"{steps}\n#### {gt}"
        raw_prompt.append(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question + INSTRUCTION}]
        )
        extra_info.append({"split": "train", "index": int(i), "question": question, "answer": answer})
        reward_model.append({"style": "rule", "ground_truth": gt})
    return {
        "uid": list(uids),
        "data_source": list(data_source),
        "raw_prompt": raw_prompt,
        "reward_model": reward_model,
        "extra_info": extra_info,
    }
