"""A simulated verl trainer for the SkipManager tests (no verl, no GPU).

Three drivers, one per skip role, wired exactly as verl wires SkipManager:

* :func:`run_sync` – ``RayPPOTrainer`` + ``AgentLoopManager.generate_sequences`` (``rollout``).
* :func:`run_async` – ``FullyAsyncRollouter.generate_sequences_single`` (``async_rollout``).
* :class:`V1Trainer` – V1 ``PPOTrainer._add_batch_to_generate`` + ``ReplayBuffer.sample`` over a
  :class:`FakeTQ` TransferQueue (``rollout_tq``).

Generated data depends on a per-run ``seed``, so a replayed batch is told apart from a
regenerated one. Run as a script, it drives :class:`V1Trainer` and can stop itself after a given
mini-batch (for the SIGKILL test): ``python _fake_trainer.py DUMP_DIR --steps 1,2 --kill-at 2:1
--marker FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import NonTensorStack, TensorDict

if __package__ in (None, ""):  # run as a script: make zarr_skip importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zarr_skip.format.specs import DataProtoLike
from zarr_skip.trainer.manager import SkipManager

N_PROMPTS = 13  # dataset size: not a multiple of the batch size, so epochs wrap mid-batch


def make_config(
    dump_dir: str | Path,
    *,
    role: str = "rollout",
    steps: Sequence[int] = (1, 2, 3),
    action: str = "cache",
    enable: bool = True,
    n: int = 2,
    train_batch_size: int = 4,
    sync_steps: int = 1,
    on_group_mismatch: str = "cycle",
) -> DictConfig:
    """A verl-shaped config enabling skip for ``role``."""
    mode = "separate_async" if sync_steps > 1 else "sync"
    skip = {
        r: {"enable": enable and r == role, "dump_dir": str(dump_dir), "steps": list(steps), "action": action}
        for r in ("rollout", "rollout_tq", "async_rollout")
    }
    skip[role]["on_group_mismatch"] = on_group_mismatch
    return OmegaConf.create(
        {
            "skip": {"_target_": "verl.utils.skip.SkipManagerConfig", **skip},
            "actor_rollout_ref": {"rollout": {"n": n}},
            "trainer": {
                "experiment_name": "fake_exp",
                "project_name": "fake_proj",
                "v1": {"trainer_mode": mode, "sync": {}, "separate_async": {"parameter_sync_step": sync_steps}},
            },
            "data": {
                "train_batch_size": train_batch_size,
                "gen_batch_size": 4,
                "max_prompt_length": 8,
                "max_response_length": 16,
            },
        }
    )


def _rng(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32("/".join(map(str, parts)).encode()))


class PromptLoader:
    """An endless dataloader over ``N_PROMPTS`` prompts, ``size`` per batch."""

    def __init__(self, size: int) -> None:
        self.size, self.position, self.drawn = size, 0, []

    def next(self) -> list[str]:
        texts = [f"prompt {(self.position + i) % N_PROMPTS}" for i in range(self.size)]
        self.position += self.size
        self.drawn.append(texts)
        return texts


def _tokens(text: str) -> torch.Tensor:
    return torch.tensor([ord(c) for c in text], dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# rollout (sync, DataProto)


@dataclass
class FakeDataProto:
    """Just enough of verl's DataProto: ``batch``, ``non_tensor_batch``, ``meta_info``."""

    batch: Any = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.batch.batch_size[0])


def make_prompts(texts: list[str], uids: list[str] | None = None, *, validate: bool = False) -> FakeDataProto:
    ids = torch.nn.utils.rnn.pad_sequence([_tokens(t) for t in texts], batch_first=True)
    nt = {"raw_prompt": np.array(texts, dtype=object)}
    if uids is not None:
        nt["uid"] = np.array(uids, dtype=object)
    return FakeDataProto(TensorDict({"input_ids": ids}, batch_size=[len(texts)]), nt, {"validate": validate})


def generate(prompts: FakeDataProto, seed: int) -> FakeDataProto:
    """Fake generation: responses, masks, log-probs of every dtype kind, strings and dicts."""
    texts = [str(t) for t in prompts.non_tensor_batch["raw_prompt"]]
    rows = len(texts)
    g = _rng(seed, *texts)
    responses = torch.randint(0, 32000, (rows, 6), generator=g)
    mask = torch.rand(rows, 6, generator=g) > 0.3
    batch = TensorDict(
        {
            "input_ids": prompts.batch["input_ids"].clone(),
            "responses": responses,
            "response_mask": mask.to(torch.int64),
            "old_log_probs": torch.randn(rows, 6, generator=g).to(torch.bfloat16),
            "rm_scores": torch.randn(rows, generator=g),
        },
        batch_size=[rows],
    )
    extra = np.empty(rows, dtype=object)
    for i, t in enumerate(texts):
        extra[i] = {"seed": seed, "len": len(t), "tags": ["a", t]}
    nt = {
        **{k: v.copy() for k, v in prompts.non_tensor_batch.items()},
        "response_text": np.array([f"answer {seed}:{t}" for t in texts], dtype=object),
        "extra_info": extra,
    }
    return FakeDataProto(batch, nt, {"timing": {"gen": 0.25}, "seed": seed})


class AgentLoopManager:
    """``AgentLoopManager.generate_sequences`` decorated for ``skip.rollout``."""

    def __init__(self, seed: int) -> None:
        self.seed, self.calls = seed, 0

    @SkipManager.annotate(role="rollout")
    def generate_sequences(self, prompts: FakeDataProto) -> FakeDataProto:
        self.calls += 1
        return generate(prompts, self.seed)


@dataclass
class SyncRun:
    outputs: dict[int, Any]
    calls: dict[int, int]
    prompts: dict[int, list[str]]


def run_sync(config: DictConfig, total_steps: int, seed: int, *, validate_at: Sequence[int] = ()) -> SyncRun:
    """Steps ``1..total_steps`` of a colocated trainer; validation before steps in ``validate_at``."""
    SkipManager.init(config)
    agent = AgentLoopManager(seed)
    loader = PromptLoader(int(config.data.gen_batch_size))
    run = SyncRun({}, {}, {})
    for step in range(1, total_steps + 1):
        SkipManager.set_step(step)
        if step in validate_at:
            before = agent.calls
            out = agent.generate_sequences(make_prompts(["val a", "val b"], validate=True))
            assert agent.calls == before + 1 and out.meta_info["seed"] == seed
        before = agent.calls
        texts = loader.next()
        run.outputs[step] = agent.generate_sequences(make_prompts(texts))
        run.calls[step] = agent.calls - before
        run.prompts[step] = texts
    return run


# ---------------------------------------------------------------------------------------------
# async_rollout


class Rollouter:
    """``FullyAsyncRollouter.generate_sequences_single`` decorated for ``skip.async_rollout``."""

    def __init__(self, seed: int) -> None:
        self.seed, self.calls = seed, []

    @SkipManager.annotate(role="async_rollout")
    async def generate_sequences_single(self, prompts: FakeDataProto) -> FakeDataProto:
        self.calls.append(str(prompts.non_tensor_batch["uid"][0]))
        await asyncio.sleep(0.001)
        return generate(prompts, self.seed)


def run_async(
    config: DictConfig, feed: Sequence[int], seed: int, *, epoch: int = 0
) -> tuple[dict[int, Any], list[str]]:
    """Feed one prompt per index concurrently; returns outputs by index and the generated uids."""
    SkipManager.init(config)
    rollouter = Rollouter(seed)

    async def main() -> list[Any]:
        jobs = [
            rollouter.generate_sequences_single(make_prompts([f"prompt {i}"], [f"uid_sample_{epoch}_{i}"]))
            for i in feed
        ]
        return await asyncio.gather(*jobs)

    outputs = asyncio.run(main())
    return dict(zip(feed, outputs, strict=True)), rollouter.calls


# ---------------------------------------------------------------------------------------------
# rollout_tq: a TransferQueue, an agent loop writing into it, a replay buffer, a V1 trainer


@dataclass
class KVBatchMeta:
    partition_id: str
    keys: list[str]
    tags: list[dict[str, Any]]
    extra_info: dict[str, Any] = field(default_factory=dict)


def _rows_of(value: Any, rows: int) -> tuple[str, list[Any]]:
    if isinstance(value, torch.Tensor):
        return ("nested", list(value.unbind())) if value.is_nested else ("dense", list(value.unbind(0)))
    if isinstance(value, NonTensorStack):
        return "object", list(value.tolist())
    return "object", [value[i] for i in range(rows)]


class FakeTQ:
    """An in-memory TransferQueue: per partition, key -> (per-row fields, tags)."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[str, dict[str, Any]]] = {}
        self.layout: dict[str, str] = {}
        self.puts = self.gets = 0

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> None:
        self.puts += 1
        part = self.parts.setdefault(partition_id, {})
        columns: dict[str, list[Any]] = {}
        if fields is not None:
            for name in fields.keys():
                kind, rows = _rows_of(fields.get(name), len(keys))
                assert len(rows) == len(keys), name
                self.layout[name], columns[name] = kind, rows
        for i, key in enumerate(keys):
            entry = part.setdefault(key, {"fields": {}, "tags": {}})
            entry["fields"].update({name: rows[i] for name, rows in columns.items()})
            if tags is not None:
                entry["tags"] = dict(tags[i])

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: Any = None) -> TensorDict:
        self.gets += 1
        entries = [self.parts[partition_id][k]["fields"] for k in keys]
        names = select_fields or list(entries[0])
        out: dict[str, Any] = {}
        for name in names:
            rows = [e[name] for e in entries]
            kind = self.layout[name]
            if kind == "nested":
                out[name] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
            elif kind == "dense":
                out[name] = torch.stack(rows)
            else:
                out[name] = NonTensorStack.from_list(rows)
        return TensorDict(out, batch_size=[len(keys)])

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for k in keys:
            self.parts.get(partition_id, {}).pop(k, None)


class V1AgentLoop:
    """Generates ``n`` trajectories per prompt straight into the TransferQueue."""

    def __init__(self, tq: FakeTQ, n: int, seed: int) -> None:
        self.tq, self.n, self.seed, self.calls = tq, n, seed, 0

    def generate_sequences(self, batch: TensorDict, step: int) -> None:
        self.calls += 1
        for uid, text in zip(batch["uid"], batch["raw_prompt"], strict=True):
            keys, rows = [f"{uid}_{s}_0" for s in range(self.n)], []
            for s in range(self.n):
                g = _rng(self.seed, text, s)
                length = int(torch.randint(1, 9, (1,), generator=g))
                rows.append(
                    {
                        "prompts": _tokens(text),
                        "responses": torch.randint(0, 32000, (length,), generator=g),
                        "rollout_log_probs": torch.randn(length, generator=g),
                        "rm_scores": torch.randn(2, generator=g).to(torch.bfloat16),
                        "raw_prompt": text,
                        "extra_info": {"session": s, "seed": self.seed},
                    }
                )
            fields = {
                name: (
                    torch.nested.as_nested_tensor([r[name] for r in rows], layout=torch.jagged)
                    if name in ("prompts", "responses", "rollout_log_probs")
                    else torch.stack([r[name] for r in rows])
                    if name == "rm_scores"
                    else NonTensorStack.from_list([r[name] for r in rows])
                )
                for name in rows[0]
            }
            tags = [
                {
                    "status": "finished",
                    "global_steps": step,
                    "min_global_steps": step,
                    "max_global_steps": step,
                    "seq_len": int(r["responses"].numel()),
                }
                for r in rows
            ]
            self.tq.kv_batch_put(
                keys=keys, partition_id="train", fields=TensorDict(fields, batch_size=[self.n]), tags=tags
            )
            self.tq.kv_batch_put(
                keys=[str(uid)],
                partition_id="train",
                tags=[{"is_prompt": True, "status": "finished", "global_steps": step}],
            )


class ReplayBuffer:
    """Hands out the trajectories of finished prompts, oldest prompts first."""

    def __init__(self, tq: FakeTQ) -> None:
        self.tq = tq

    @SkipManager.annotate_tq(role="rollout_tq", phase="sample")
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict[str, Any]]:
        part = self.tq.parts.get(partition_id, {})
        ready = [k for k, e in part.items() if e["tags"].get("is_prompt") and e["tags"].get("status") == "finished"]
        assert len(ready) >= batch_size, f"only {len(ready)} finished prompts, need {batch_size}"
        keys: list[str] = []
        for uid in ready[:batch_size]:
            mine = [k for k in part if k != uid and k.rsplit("_", 2)[0] == uid]
            keys.extend(sorted(mine, key=lambda k: int(k.rsplit("_", 2)[1])))
            self.tq.kv_clear([uid], partition_id)
        return KVBatchMeta(partition_id, keys, [dict(part[k]["tags"]) for k in keys]), {"sampled": len(keys)}


def normalize(data: TensorDict) -> dict[str, list[Any]]:
    """Per-row values of a kv_batch_get result, for exact comparisons."""
    return {name: _rows_of(data.get(name), int(data.batch_size[0]))[1] for name in sorted(data.keys())}


class V1Trainer:
    """V1 ``PPOTrainer``: submit a batch per step, then ``sync_steps`` samples of it."""

    def __init__(self, config: DictConfig, seed: int, tq: FakeTQ | None = None) -> None:
        self.config, self.tq = config, tq or FakeTQ()
        self.n = int(config.actor_rollout_ref.rollout.n)
        self.sync_steps = int(
            OmegaConf.select(config, f"trainer.v1.{config.trainer.v1.trainer_mode}.parameter_sync_step", default=1)
        )
        self.agent = V1AgentLoop(self.tq, self.n, seed)
        self.replay_buffer = ReplayBuffer(self.tq)
        self.loader = PromptLoader(int(config.data.train_batch_size))
        self.global_steps = 0
        # (step, sample index) -> (fields, tags, keys)
        self.records: dict[tuple[int, int], tuple[dict[str, list[Any]], list[dict[str, Any]], list[str]]] = {}
        self.calls: dict[int, int] = {}

    def _next_train_batch(self) -> TensorDict:
        texts = self.loader.next()
        uids = [str(uuid.uuid4()) for _ in texts]
        return TensorDict(
            {"uid": NonTensorStack.from_list(uids), "raw_prompt": NonTensorStack.from_list(texts)},
            batch_size=[len(texts)],
        )

    def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
        tags = [{"is_prompt": True, "status": "pending", "global_steps": self.global_steps} for _ in range(len(batch))]
        self.tq.kv_batch_put(keys=list(batch["uid"]), partition_id="train", tags=tags)
        self.agent.generate_sequences(batch, self.global_steps)
        return len(batch)

    @SkipManager.annotate_tq(role="rollout_tq", phase="submit")
    def _add_batch_to_generate(self) -> None:
        batch = self._next_train_batch()
        self._submit_batch_to_rollout(batch)

    def fit(
        self, total_steps: int, hook: Callable[[int, int], None] | None = None, transfer_queue: Any = "fake"
    ) -> None:
        SkipManager.init(self.config, transfer_queue=self.tq if transfer_queue == "fake" else transfer_queue)
        size = int(self.config.data.train_batch_size) // self.sync_steps
        for step in range(1, total_steps + 1):
            self.global_steps = step
            SkipManager.set_step(step)
            before = self.agent.calls
            self._add_batch_to_generate()
            self.calls[step] = self.agent.calls - before
            for i in range(self.sync_steps):
                meta, _ = self.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=size)
                data = self.tq.kv_batch_get(keys=meta.keys, partition_id="train")
                self.records[(step, i)] = (normalize(data), meta.tags, meta.keys)
                if hook is not None:
                    hook(step, i)
                self.tq.kv_clear(meta.keys, "train")


# ---------------------------------------------------------------------------------------------
# comparisons


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype != b.dtype:
            return False
        if a.is_nested or b.is_nested:
            ra, rb = a.unbind(), b.unbind()
            return a.is_nested == b.is_nested and len(ra) == len(rb) and all(map(torch.equal, ra, rb))
        return a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return list(a) == list(b)
    return a == b


def assert_dataproto_equal(a: Any, b: Any) -> None:
    """Every tensor (dtype and values), every non-tensor row and the meta_info agree."""
    assert isinstance(a, (FakeDataProto, DataProtoLike)) and isinstance(b, (FakeDataProto, DataProtoLike))
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for name in a.batch.keys():
        assert _same(a.batch[name], b.batch[name]), name
    assert sorted(a.non_tensor_batch) == sorted(b.non_tensor_batch)
    for name, value in a.non_tensor_batch.items():
        assert _same(value, b.non_tensor_batch[name]), name
    assert a.meta_info == b.meta_info


def assert_rows_equal(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert len(a[name]) == len(b[name]), name
        for i, (x, y) in enumerate(zip(a[name], b[name], strict=True)):
            assert _same(x, y), f"{name}[{i}]"


# ---------------------------------------------------------------------------------------------
# script entry point (the SIGKILL test)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dump_dir")
    parser.add_argument("--steps", default="1,2,3")
    parser.add_argument("--total-steps", type=int, default=3)
    parser.add_argument("--sync-steps", type=int, default=4)
    parser.add_argument("--train-batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-at", default="", help="STEP:INDEX: after storing it, write MARKER and hang")
    parser.add_argument("--marker", default="")
    args = parser.parse_args(argv)
    config = make_config(
        args.dump_dir,
        role="rollout_tq",
        steps=[int(s) for s in args.steps.split(",")],
        train_batch_size=args.train_batch_size,
        sync_steps=args.sync_steps,
    )
    stop = tuple(int(x) for x in args.kill_at.split(":")) if args.kill_at else None

    def hook(step: int, index: int) -> None:
        if (step, index) == stop:
            Path(args.marker).write_text(f"{step}:{index}")
            while True:  # wait for SIGKILL
                time.sleep(1)

    V1Trainer(config, args.seed).fit(args.total_steps, hook)


if __name__ == "__main__":
    main()
