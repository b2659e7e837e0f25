"""The batch of the checked-in old-format caches (``tests/fixtures/format{2,3}``): built the
same way by the script that wrote them and by the tests that read them back."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: the fixture caches' fingerprint
FINGERPRINT = {"fixture": "old-format", "n": 2}
#: steps and mini-batches per step of the fixture caches
STEPS = (0,)
MINIBATCHES = 2
#: small chunks, so that some arrays have several (stored as shards)
CHUNK_BYTES = 256


def batch(step: int, index: int) -> dict[str, Any]:
    """Mini-batch ``index`` of ``step``: every column kind, repeated rows (dictionary-encoded
    from format 3 on), bf16 and fp8, ragged rows with a trailing dimension."""
    g = torch.Generator().manual_seed(1000 * step + index)
    rows = 6
    lengths = [int(n) for n in torch.randint(1, 9, (rows,), generator=g)]
    responses = torch.nested.nested_tensor(
        [torch.randint(0, 50000, (n,), generator=g) for n in lengths], layout=torch.jagged
    )
    prompts = [f"prompt {step}-{index}-{i // 2} ü" for i in range(rows)]  # pairs repeat
    shared = {"source": "gsm8k", "step": step}
    return {
        "input_ids": torch.randint(0, 32000, (rows, 5), generator=g),
        "old_log_probs": torch.randn(rows, 5, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(rows, 3, generator=g).to(torch.float8_e4m3fn),
        "responses": responses,
        "points": [np.arange(2 * (i + 1), dtype=np.float32).reshape(i + 1, 2) for i in range(rows)],
        "uid": [f"uid-{step}-{index}-{i // 2}" for i in range(rows)],
        "raw_prompt": [[{"role": "user", "content": p}] for p in prompts],
        "extra_info": [shared] * rows,
        "scores": np.linspace(0, 1, rows, dtype=np.float64),
    }
