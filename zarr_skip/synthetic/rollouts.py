"""Seeded generator of realistic LLM RL rollout steps (verl shapes) for the demo, notebooks, tests and benchmarks.

Two shapes of the same data are produced from one seed:

* :func:`padded_batch` -- verl's padded ``DataProto`` (what verl pickles as ``gen_batch.dp``):
  left-padded prompts, right-padded responses, attention/position/response masks,
  ``old_log_probs`` and the per-row ``non_tensor_batch``.
* :func:`jagged_payload` -- verl's TransferQueue payload (what verl ``torch.save``s as
  ``tq_batch.pt``): jagged NestedTensors without padding plus per-row ``tags`` and ``keys``.

For a given ``(preset, seed)`` both shapes hold exactly the same tokens, lengths, log-probs,
uids and non-tensor fields.  Generation is vectorised (no Python loop per token); the only
Python loops are per GRPO group / per row for the string and dict fields.

Modelling choices (see benchmarks/README.md):

* token ids follow a Zipf-like law with exponent ``ZIPF_A`` (~9.8 bits/token unigram entropy,
  close to real BPE text), sampled as ``floor(U ** (-1/(a-1)))`` (the continuous power-law
  inverse CDF: much faster than ``Generator.zipf``), folded into the regular-token id range
  ``[0, 151643)`` so they never collide with the pad id or special tokens;
* prompts carry a Qwen2 chat template prefix/suffix; responses that end before
  ``max_response`` end with ``<|im_end|>``;
* prompt lengths are log-normal (median 15% of ``max_prompt``) clipped to ``[8, max_prompt]``;
  response lengths are log-normal with a per-group random effect (hard prompts get long answers
  for all ``n`` samples) calibrated so that ~10% are truncated at exactly ``max_response``;
* ``old_log_probs`` are full-precision float32 (a mixture of confident and uncertain tokens), so
  they compress about as badly as real ones.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from zarr_skip.format.specs import jagged_tensor
from zarr_skip.synthetic.payloads import PAYLOADS, realistic_per_group

__all__ = [
    "EOS_ID",
    "PAD_ID",
    "PRESETS",
    "VOCAB_SIZE",
    "DataProtoLike",
    "Preset",
    "as_mapping",
    "get_preset",
    "jagged_payload",
    "padded_batch",
]

VOCAB_SIZE = 151936  # Qwen2 embedding size
PAD_ID = 151643  # <|endoftext|>, verl's pad id for Qwen2 tokenizers
EOS_ID = 151645  # <|im_end|>
N_REGULAR = 151643  # ids [0, 151643) are regular BPE tokens; >= 151643 are special
IM_START, USER, ASSISTANT, NEWLINE = 151644, 872, 77091, 198
PROMPT_PREFIX = np.array([IM_START, USER, NEWLINE], dtype=np.int64)
PROMPT_SUFFIX = np.array([EOS_ID, NEWLINE, IM_START, ASSISTANT, NEWLINE], dtype=np.int64)
MIN_PROMPT = 8  # == len(PROMPT_PREFIX) + len(PROMPT_SUFFIX)
#: log-probs are -Exponential(scale): (share, scale) of confident and of uncertain tokens
LOG_PROB_MIX = ((0.8, 0.02), (0.2, 1.5))
LOG_PROB_MIN = -30.0
MIN_RESPONSE = 2

ZIPF_A = 1.2
TRUNCATED_SHARE = 0.10  # target share of responses hitting max_response exactly
_Z90 = 1.2815515655446004  # standard normal quantile for 0.90
_RESP_SIGMA_GROUP = 0.4
_RESP_SIGMA_ROW = 0.7
_PROMPT_MEDIAN_FRAC = 0.15
_PROMPT_SIGMA = 0.6

DATA_SOURCES = ("openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval", "deepscaler", "codecontests")


@dataclass(frozen=True)
class Preset:
    """Size of one rollout step: ``rows`` sequences, ``n`` samples per prompt (GRPO group)."""

    rows: int
    max_prompt: int
    max_response: int
    n: int = 8

    def __post_init__(self) -> None:
        if self.rows <= 0 or self.n <= 0 or self.rows % self.n:
            raise ValueError(f"rows ({self.rows}) must be a positive multiple of n ({self.n})")
        if self.max_prompt < MIN_PROMPT:
            raise ValueError(f"max_prompt must be >= {MIN_PROMPT}")
        if self.max_response < MIN_RESPONSE:
            raise ValueError(f"max_response must be >= {MIN_RESPONSE}")

    @property
    def groups(self) -> int:
        return self.rows // self.n


PRESETS: dict[str, Preset] = {
    "small": Preset(rows=128, max_prompt=512, max_response=1024, n=8),
    "medium": Preset(1024, 1024, 4096, 8),
    "large": Preset(4096, 2048, 8192, 8),
}


def get_preset(preset: Preset | str) -> Preset:
    """Return ``preset`` itself or the named entry of :data:`PRESETS`."""
    if isinstance(preset, Preset):
        return preset
    try:
        return PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}") from None


class DataProtoLike:
    """Minimal stand-in for ``verl.DataProto`` (attributes ``batch``, ``non_tensor_batch``,
    ``meta_info``).

    Pickling mirrors verl's ``DataProto.__getstate__``: the tensor batch is ``torch.save``d into an
    in-memory buffer and the bytes are pickled together with ``non_tensor_batch`` and
    ``meta_info``; so ``pickle.dump(dp, f)`` costs what verl's ``save_to_disk`` costs.
    """

    def __init__(
        self,
        batch: dict[str, torch.Tensor],
        non_tensor_batch: dict[str, np.ndarray],
        meta_info: dict[str, Any],
    ) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = meta_info

    def __len__(self) -> int:
        for t in self.batch.values():
            return int(t.shape[0])
        for a in self.non_tensor_batch.values():
            return int(a.shape[0])
        return 0

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.batch.items())
        return (
            f"DataProtoLike(rows={len(self)}, batch={{{cols}}}, "
            f"non_tensor_batch={sorted(self.non_tensor_batch)}, meta_info={self.meta_info})"
        )

    def __getstate__(self) -> tuple[bytes, dict[str, np.ndarray], dict[str, Any]]:
        import io

        buffer = io.BytesIO()
        torch.save(self.batch, buffer)
        return buffer.getvalue(), self.non_tensor_batch, self.meta_info

    def __setstate__(self, state: tuple[bytes, dict[str, np.ndarray], dict[str, Any]]) -> None:
        import io

        raw, self.non_tensor_batch, self.meta_info = state
        self.batch = torch.load(io.BytesIO(raw), weights_only=False, map_location="cpu")


# --------------------------------------------------------------------------- generation core


@dataclass(frozen=True)
class _Rollout:
    preset: Preset
    step: int
    prompt_len: np.ndarray  # (rows,) int64, equal within a group
    response_len: np.ndarray  # (rows,) int64
    prompt_tokens: np.ndarray  # concatenated per-row prompt tokens, row order
    response_tokens: np.ndarray  # concatenated per-row response tokens, row order
    log_probs: np.ndarray  # float32, aligned with response_tokens
    uids: list[str]  # one per group
    data_source: list[str]  # one per group
    prompt_text: list[str]  # one per group
    ground_truth: list[str]  # one per group
    index: np.ndarray  # (groups,) dataset index


def _zipf_tokens(rng: np.random.Generator, size: int, a: float = ZIPF_A) -> np.ndarray:
    """Zipf-like token ids in ``[0, N_REGULAR)``: rank ``floor(U**(-1/(a-1))) - 1`` folded."""
    y = 1.0 - rng.random(size)  # (0, 1]
    e = 1.0 / (a - 1.0)
    if abs(e - round(e)) < 1e-12 and 1 <= round(e) <= 8:
        # integer exponent: repeated multiplication is ~5x faster than np.power
        k = round(e)
        x = y.copy()
        for _ in range(k - 1):
            x *= y
        np.reciprocal(x, out=x)
    else:
        x = np.power(y, -e)
    np.floor(x, out=x)
    x -= 1.0
    np.fmod(x, float(N_REGULAR), out=x)
    return x.astype(np.int64)


def _offsets(lengths: np.ndarray) -> NDArray[np.int64]:
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def _segment_positions(lengths: np.ndarray, total: int) -> NDArray[np.int64]:
    """Position of every element inside its segment, for concatenated segments."""
    starts = _offsets(lengths)[:-1]
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


_WORDS: np.ndarray | None = None


def _word_pool() -> np.ndarray:
    global _WORDS
    if _WORDS is None:
        r = np.random.default_rng(12345)
        letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
        p = np.array(
            [
                12.7,
                9.1,
                8.2,
                7.5,
                7.0,
                6.7,
                6.3,
                6.1,
                6.0,
                4.3,
                4.0,
                2.8,
                2.8,
                2.4,
                2.4,
                2.2,
                2.0,
                2.0,
                1.9,
                1.5,
                1.0,
                0.8,
                0.15,
                0.15,
                0.1,
                0.07,
            ]
        )
        p = p / p.sum()
        lens = r.integers(1, 10, size=2000)
        chars = r.choice(letters, size=int(lens.sum()), p=p)
        out, pos = [], 0
        for n in lens:
            out.append("".join(chars[pos : pos + n]))
            pos += n
        _WORDS = np.array(out, dtype=object)
    return _WORDS


def _texts(rng: np.random.Generator, n_chars: np.ndarray) -> list[str]:
    """One pseudo-English string of roughly ``n_chars[i]`` characters per entry."""
    words = _word_pool()
    n_words = np.maximum(1, n_chars // 6)
    ranks = np.minimum(_zipf_tokens(rng, int(n_words.sum()), a=1.3), len(words) - 1)
    tokens = words[ranks]
    off = _offsets(n_words)
    return ["Solve the following problem. " + " ".join(tokens[off[i] : off[i + 1]]) for i in range(len(n_words))]


def _generate(preset: Preset | str, seed: int, step: int) -> _Rollout:
    p = get_preset(preset)
    rng = np.random.default_rng([int(seed), int(step), 0x5EED])
    g, n, rows = p.groups, p.n, p.rows

    # lengths ----------------------------------------------------------------------------
    plen_g = np.exp(rng.normal(np.log(_PROMPT_MEDIAN_FRAC * p.max_prompt), _PROMPT_SIGMA, size=g))
    plen_g = np.clip(np.rint(plen_g), MIN_PROMPT, p.max_prompt).astype(np.int64)
    sigma = float(np.hypot(_RESP_SIGMA_GROUP, _RESP_SIGMA_ROW))
    mu = np.log(p.max_response) - _Z90 * sigma  # P(len >= max_response) == TRUNCATED_SHARE
    log_rlen = (
        mu + np.repeat(rng.normal(0.0, _RESP_SIGMA_GROUP, size=g), n) + rng.normal(0.0, _RESP_SIGMA_ROW, size=rows)
    )
    rlen = np.clip(np.floor(np.exp(log_rlen)), MIN_RESPONSE, p.max_response).astype(np.int64)
    plen = np.repeat(plen_g, n)

    # prompt tokens: one prompt per group, shared by its n rows ---------------------------
    n_ptok_g = int(plen_g.sum())
    ptok_g = _zipf_tokens(rng, n_ptok_g)
    pos_g = _segment_positions(plen_g, n_ptok_g)
    end_dist = np.repeat(plen_g, plen_g) - pos_g  # distance to segment end (1 == last token)
    head = pos_g < len(PROMPT_PREFIX)
    ptok_g[head] = PROMPT_PREFIX[pos_g[head]]
    tail = end_dist <= len(PROMPT_SUFFIX)
    ptok_g[tail] = PROMPT_SUFFIX[len(PROMPT_SUFFIX) - end_dist[tail]]
    n_ptok = int(plen.sum())
    goff = _offsets(plen_g)[:-1]
    src = np.repeat(np.repeat(goff, n), plen) + _segment_positions(plen, n_ptok)
    ptok = ptok_g[src]

    # response tokens ----------------------------------------------------------------------
    n_rtok = int(rlen.sum())
    rtok = _zipf_tokens(rng, n_rtok)
    rend = _offsets(rlen)[1:] - 1
    finished = rlen < p.max_response
    rtok[rend[finished]] = EOS_ID

    # log-probs: 80% confident tokens (mean -0.02), 20% uncertain (mean -1.5) ----------------
    (share, confident), (_, uncertain) = LOG_PROB_MIX
    scale = np.where(rng.random(n_rtok, dtype=np.float32) < share, np.float32(confident), np.float32(uncertain))
    lp = rng.standard_exponential(n_rtok, dtype=np.float32)
    lp *= scale
    np.negative(lp, out=lp)
    np.maximum(lp, np.float32(LOG_PROB_MIN), out=lp)

    # per-group non-tensor fields --------------------------------------------------------
    uid_bytes = rng.integers(0, 256, size=(g, 16), dtype=np.uint8)
    uids = [str(uuid.UUID(bytes=bytes(b), version=4)) for b in uid_bytes]
    ds = rng.integers(0, len(DATA_SOURCES), size=g)
    data_source = [DATA_SOURCES[i] for i in ds]
    prompt_text = _texts(rng, 4 * np.maximum(plen_g - MIN_PROMPT, 1))
    gt = rng.integers(0, 10_000, size=g)
    ground_truth = [str(int(x)) for x in gt]
    index = rng.choice(max(10 * g, 7473), size=g, replace=False).astype(np.int64)

    return _Rollout(p, int(step), plen, rlen, ptok, rtok, lp, uids, data_source, prompt_text, ground_truth, index)


def _non_tensor_per_group(r: _Rollout, payload: str = "minimal") -> dict[str, list[Any]]:
    if payload not in PAYLOADS:
        raise ValueError(f"unknown payload {payload!r}; choose from {list(PAYLOADS)}")
    if payload == "realistic":
        rng = np.random.default_rng([r.step, int(r.index.sum()), 0xFA7])
        return realistic_per_group(rng, r.uids, r.data_source, r.prompt_text, r.ground_truth, r.index.tolist())
    return {
        "uid": list(r.uids),
        "data_source": list(r.data_source),
        "raw_prompt": [[{"role": "user", "content": t}] for t in r.prompt_text],
        "reward_model": [{"style": "rule", "ground_truth": s} for s in r.ground_truth],
        "extra_info": [{"index": int(i), "split": "train"} for i in r.index],
    }


def _object_array(items: list[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, x in enumerate(items):  # per group, never per token
        out[i] = x
    return out


# --------------------------------------------------------------------------- public API


def padded_batch(preset: Preset | str, seed: int = 0, *, step: int = 1, payload: str = "minimal") -> DataProtoLike:
    """verl's padded ``DataProto`` for one rollout step (what verl pickles as ``gen_batch.dp``).

    ``batch``: ``prompts`` (rows, max_prompt) left-padded, ``responses`` (rows, max_response)
    right-padded, ``input_ids`` = cat(prompts, responses), ``attention_mask``, ``position_ids``
    (``clip(cumsum(mask) - 1, 0)``), ``response_mask`` (all int64) and ``old_log_probs``
    (float32, zero in padding).  ``non_tensor_batch``: numpy object arrays with one entry per
    row (``uid``, ``data_source``, ``raw_prompt``, ``reward_model``, ``extra_info``); the ``n``
    rows of a GRPO group share a prompt and a uid (verl's ``repeat(interleave=True)``, which
    shares the same Python objects); ``payload="realistic"`` gives them real sizes
    (:mod:`zarr_skip.synthetic.payloads`).  Deterministic for ``(preset, seed, step)``.
    """
    r = _generate(preset, seed, step)
    p = r.preset
    rows, P, R = p.rows, p.max_prompt, p.max_response
    plen = torch.from_numpy(r.prompt_len)
    rlen = torch.from_numpy(r.response_len)

    # left-padded prompts: scatter the concatenated prompt tokens at flat positions
    n_ptok = len(r.prompt_tokens)
    row_start = np.arange(rows, dtype=np.int64) * P + (P - r.prompt_len)
    flat = np.repeat(row_start, r.prompt_len) + _segment_positions(r.prompt_len, n_ptok)
    prompts = torch.full((rows, P), PAD_ID, dtype=torch.int64)
    prompts.view(-1)[torch.from_numpy(flat)] = torch.from_numpy(r.prompt_tokens)

    # right-padded responses / log-probs
    rmask = torch.arange(R)[None, :] < rlen[:, None]
    responses = torch.full((rows, R), PAD_ID, dtype=torch.int64)
    responses[rmask] = torch.from_numpy(r.response_tokens)
    old_log_probs = torch.zeros((rows, R), dtype=torch.float32)
    old_log_probs[rmask] = torch.from_numpy(r.log_probs)
    response_mask = rmask.to(torch.int64)
    del rmask

    attention_mask = torch.empty((rows, P + R), dtype=torch.int64)
    torch.ge(torch.arange(P)[None, :], (P - plen)[:, None], out=attention_mask[:, :P])
    attention_mask[:, P:] = response_mask
    # == clip(cumsum(attention_mask, -1) - 1, 0) (verl's compute_position_id_with_mask),
    # computed in closed form: max(0, j - (P - plen)) for prompts, plen + min(k, rlen - 1) after.
    position_ids = torch.empty((rows, P + R), dtype=torch.int64)
    torch.sub(torch.arange(P)[None, :], (P - plen)[:, None], out=position_ids[:, :P])
    position_ids[:, :P].clamp_(min=0)
    torch.minimum(torch.arange(R)[None, :], (rlen - 1)[:, None], out=position_ids[:, P:])
    position_ids[:, P:] += plen[:, None]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "old_log_probs": old_log_probs,
    }
    non_tensor = {k: np.repeat(_object_array(v), p.n) for k, v in _non_tensor_per_group(r, payload).items()}
    meta_info = {
        "global_steps": int(step),
        "temperature": 1.0,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "do_sample": True,
        "recompute_log_prob": False,
    }
    return DataProtoLike(batch, non_tensor, meta_info)


def _nested(values: np.ndarray, offsets: torch.Tensor) -> torch.Tensor:
    return jagged_tensor(torch.from_numpy(values), offsets)


def jagged_payload(
    preset: Preset | str, seed: int = 0, *, step: int = 1, non_tensor: bool = True, payload: str = "minimal"
) -> dict[str, Any]:
    """verl's TransferQueue payload for one rollout step (what verl saves as ``tq_batch.pt``).

    Returns ``{"tensordict": TensorDict, "tags": list[dict], "keys": list[str],
    "global_steps": int}``.  The TensorDict (batch_size ``[rows]``) holds jagged NestedTensors
    ``prompts``, ``responses``, ``response_mask`` (int64) and ``old_log_probs`` (float32) with
    the same lengths and values as :func:`padded_batch` (no padding), dense int64 ``prompt_len``,
    ``response_len`` and ``seq_len``, and -- when ``non_tensor`` -- the non-tensor fields
    (``uid``, ``data_source``, ``raw_prompt``, ``reward_model``, ``extra_info``) as
    ``NonTensorStack``s.  Keys are ``{uid}_{session}_0`` (``session`` = sample index within the
    GRPO group); ``payload`` as for :func:`padded_batch`.  When tensordict is not installed
    ``"tensordict"`` is a plain dict of the tensor fields (non-tensor fields are then omitted).
    """
    r = _generate(preset, seed, step)
    p = r.preset
    poff = torch.from_numpy(_offsets(r.prompt_len))
    roff = torch.from_numpy(_offsets(r.response_len))  # shared by responses/mask/log-probs
    seq_len = r.prompt_len + r.response_len
    fields: dict[str, Any] = {
        "prompts": _nested(r.prompt_tokens, poff),
        "responses": _nested(r.response_tokens, roff),
        "response_mask": _nested(np.ones(len(r.response_tokens), dtype=np.int64), roff),
        "old_log_probs": _nested(r.log_probs, roff),
        "prompt_len": torch.from_numpy(r.prompt_len.copy()),
        "response_len": torch.from_numpy(r.response_len.copy()),
        "seq_len": torch.from_numpy(seq_len),
    }
    try:
        from tensordict import NonTensorStack, TensorDict
    except ImportError:  # pragma: no cover - tensordict is a dev dependency
        td: Any = fields
    else:
        td = TensorDict(fields, batch_size=[p.rows])
        if non_tensor:
            for k, v in _non_tensor_per_group(r, payload).items():
                per_row = [x for x in v for _ in range(p.n)]
                td[k] = NonTensorStack(*per_row)

    uids_row = [u for u in r.uids for _ in range(p.n)]
    keys = [f"{u}_{i % p.n}_0" for i, u in enumerate(uids_row)]
    s = int(step)
    tags = [
        {"global_steps": s, "status": "finished", "seq_len": int(L), "min_global_steps": s, "max_global_steps": s}
        for L in seq_len.tolist()
    ]
    return {"tensordict": td, "tags": tags, "keys": keys, "global_steps": s}


def as_mapping(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The flat mapping zarr_skip stores for a jagged payload:
    ``{**tensordict fields, "tags": tags, "keys": keys}``.

    Tensor fields (dense or jagged) are passed through unchanged; ``NonTensorStack`` /
    ``NonTensorData`` fields become plain Python lists (one entry per row).
    """
    td = payload["tensordict"]
    out: dict[str, Any] = {}
    for k in list(td.keys()):
        v = td.get(k) if hasattr(td, "get") else td[k]
        if not isinstance(v, torch.Tensor) and hasattr(v, "tolist"):
            v = v.tolist()  # NonTensorStack -> list (LinkedList -> list)
            v = list(v) if isinstance(v, list) else v
        out[k] = v
    out["tags"] = list(payload["tags"])
    out["keys"] = list(payload["keys"])
    return out
