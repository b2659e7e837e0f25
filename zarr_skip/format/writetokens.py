"""Write tokens: what makes a retried write find the mini-batch it already stored (pure).

``Cache.write(step, batch, token=...)`` records the token in the mini-batch's claim, so a write
whose outcome was lost (the object store died after the PUT landed, before the reply) can be
retried: the retry finds the complete mini-batch of its run with that token and returns it
instead of storing the batch a second time under another index. A token is chosen by the
caller (``"rollout/step-12/mb-0"``), or derived from the batch's content (``token=True``:
:func:`content_token`, a hash of every stored byte, about 1 s per GB).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import numpy as np

from zarr_skip.errors import ConfigError, ConfigTypeError
from zarr_skip.format.specs import EncodedBatch, Narrowed

__all__ = ["MAX_TOKEN", "check_token", "content_token"]

#: the longest write token (characters)
MAX_TOKEN = 256


def check_token(token: object) -> str | Literal[True] | None:
    """``token`` when it is None, True or a printable string of 1 to :data:`MAX_TOKEN` characters."""
    if token is None or token is True:
        return token
    if not isinstance(token, str):
        raise ConfigTypeError(f"token: expected a str, True (derive it from the batch) or None, got {token!r:.80}")
    if not 0 < len(token) <= MAX_TOKEN or not token.isprintable():
        raise ConfigError(f"token: expected 1 to {MAX_TOKEN} printable characters, got {token!r:.80}")
    return token


def content_token(batch: EncodedBatch) -> str:
    """A token naming the batch's content: equal batches (columns, values, meta_info) give
    equal tokens."""
    h = hashlib.blake2b(digest_size=16)
    head = {"rows": batch.rows, "type": batch.batch_type, "meta": batch.meta_info}
    h.update(json.dumps(head, sort_keys=True, default=repr).encode("utf-8", "backslashreplace"))
    for column in batch.columns:
        h.update(json.dumps(column.spec.to_json(), sort_keys=True, default=repr).encode())
        h.update(column.spec.name.encode("utf-8", "backslashreplace"))
        for name, array in column.arrays.items():
            values: Any = array.source if isinstance(array, Narrowed) else array
            values = np.ascontiguousarray(values)
            h.update(f"{name}:{values.dtype.str}:{values.shape}".encode())
            h.update(memoryview(values.reshape(-1).view(np.uint8)))
    return "content-" + h.hexdigest()
