"""The information floor of a synthetic jagged step: fewer bytes than this no lossless format
can store it in, because the generator draws its values independently at random.

- token ids: the empirical unigram entropy of the drawn tokens, times their count (GRPO prompts
  count once per group: the group's other rows repeat them);
- log-probs: the exact entropy of the float32 values the generator draws (a mixture of
  exponentials, see ``zarr_skip.synthetic.LOG_PROB_MIX``), integrated over every binade;
- everything else (lengths, masks, tags, keys, JSON rows): what zstd level 19 makes of it, an
  upper bound on its information (a small share of the total); per-row objects that repeat
  (the rows of a GRPO group share ``uid``, ``raw_prompt``, ``extra_info``, ...) count each
  distinct value once, plus the entropy of which value each row holds (what a dictionary
  encoding must store at least).
"""

from __future__ import annotations

import json
from typing import Any

import numcodecs
import numpy as np


def _token_bits(tokens: np.ndarray) -> float:
    _, counts = np.unique(tokens, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum() * tokens.size)


def log_prob_bits_per_value(mix: tuple[tuple[float, float], ...], low: float) -> float:
    """Entropy (bits) of one float32 ``-x``, ``x`` drawn from the exponential mixture ``mix``
    and clipped at ``-low``: the probability of each float32 value, binade by binade."""

    def cdf(x: np.ndarray) -> np.ndarray:
        return sum(w * (1 - np.exp(-x / s)) for w, s in mix)

    bits, sub = 0.0, 1 << 12  # each binade in 4096 slices of 2**11 equally likely floats
    for e in range(-126, int(np.ceil(np.log2(-low)))):
        edges = np.linspace(2.0**e, min(2.0 ** (e + 1), -low), sub + 1)
        q = np.diff(cdf(edges))
        q = q[q > 0]
        bits += float(-(q * np.log2(q / (2**23 / sub))).sum())
    return bits


def rows_floor(rows: list[Any], zstd: Any) -> int:
    """Bytes of information in per-row JSON objects: zstd 19 of the distinct values, each once,
    plus the entropy of the rows' choice among them."""
    texts = [json.dumps(r, sort_keys=True) for r in rows]
    distinct = list(dict.fromkeys(texts))
    _, counts = np.unique(np.array(texts, dtype=object), return_counts=True)
    p = counts / counts.sum()
    choice_bits = float(-(p * np.log2(p)).sum() * len(rows)) if len(distinct) > 1 else 0.0
    return len(zstd.encode(("[" + ",".join(distinct) + "]").encode())) + int(np.ceil(choice_bits / 8))


def jagged_floor(preset: Any, seed: int, step: int, payload: str = "minimal") -> dict[str, Any]:
    """Bytes of information in :func:`zarr_skip.synthetic.jagged_payload` ``(preset, seed, step,
    payload=payload)``."""
    from zarr_skip.synthetic import (
        LOG_PROB_MIN,
        LOG_PROB_MIX,
        as_mapping,
        get_preset,
        jagged_payload,
    )

    p = get_preset(preset)
    batch = as_mapping(jagged_payload(p, seed, step=step, payload=payload))
    prompts = batch.pop("prompts")
    offsets = prompts.offsets().numpy()
    first = [prompts.values()[offsets[g] : offsets[g + 1]].numpy() for g in range(0, p.rows, p.n)]
    parts = {
        "prompts": _token_bits(np.concatenate(first)) / 8,
        "responses": _token_bits(batch.pop("responses").values().numpy()) / 8,
    }
    lp = batch.pop("old_log_probs").values()
    parts["old_log_probs"] = log_prob_bits_per_value(LOG_PROB_MIX, LOG_PROB_MIN) * lp.numel() / 8
    zstd = numcodecs.Zstd(level=19)
    for name, value in batch.items():
        if hasattr(value, "is_nested") and value.is_nested:
            raw = value.values().numpy().tobytes() + value.offsets().numpy().tobytes()
        elif hasattr(value, "numpy"):
            raw = value.numpy().tobytes()
        else:
            parts[name] = rows_floor(list(value), zstd)
            continue
        parts[name] = len(zstd.encode(raw))
    whole = {k: int(v) for k, v in parts.items()}
    return {"bytes": sum(whole.values()), "parts": whole}
