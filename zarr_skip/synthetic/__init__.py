"""Synthetic rollouts shaped like real GRPO steps, for the demo, tests and benchmarks."""

from __future__ import annotations

from zarr_skip.synthetic.payloads import PAYLOADS
from zarr_skip.synthetic.rollouts import (
    EOS_ID,
    LOG_PROB_MIN,
    LOG_PROB_MIX,
    PAD_ID,
    PRESETS,
    VOCAB_SIZE,
    DataProtoLike,
    Preset,
    as_mapping,
    get_preset,
    jagged_payload,
    padded_batch,
)
from zarr_skip.synthetic.text import TOKENIZER_PATH, shipped_tokenizer, text_rollouts

__all__ = [
    "EOS_ID",
    "LOG_PROB_MIN",
    "LOG_PROB_MIX",
    "PAD_ID",
    "PAYLOADS",
    "PRESETS",
    "TOKENIZER_PATH",
    "VOCAB_SIZE",
    "DataProtoLike",
    "Preset",
    "as_mapping",
    "get_preset",
    "jagged_payload",
    "padded_batch",
    "shipped_tokenizer",
    "text_rollouts",
]
