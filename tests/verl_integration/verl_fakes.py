"""Stand-ins around verl's real SkipManager: a TransferQueue module, trainers, data, comparisons.

Deterministic data: what a step generates depends on the step and the row, never on the
random prompt uids, so a cache-hit run can be compared with the run that filled the cache.
"""

from __future__ import annotations

import random
import sys
import types
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict
from verl.protocol import DataProto
from verl.utils.skip import SkipManager

# ------------------------------------------------------------------------------- config


def make_config(
    dump_dir: Any,
    *,
    role: str = "rollout",
    steps: list[int] | None = None,
    action: str = "cache",
    n: int = 2,
    prompts: int = 4,
    psync: int = 1,
    mode: str = "separate_async",
) -> Any:
    """A trainer configuration as verl's Hydra would give it, with ``skip.<role>`` enabled."""
    skip = {
        r: {"enable": r == role, "dump_dir": str(dump_dir), "steps": list(steps or [1]), "action": action}
        for r in ("rollout", "rollout_tq", "async_rollout")
    }
    return OmegaConf.create(
        {
            "skip": skip,
            "actor_rollout_ref": {"rollout": {"n": n, "skip": {"enable": False}}},
            "trainer": {
                "experiment_name": "it_exp",
                "project_name": "it_proj",
                "v1": {"trainer_mode": mode, mode: {"parameter_sync_step": psync}},
            },
            "data": {
                "train_batch_size": prompts,
                "gen_batch_size": prompts,
                "max_prompt_length": 6,
                "max_response_length": 5,
            },
        }
    )


def reset_skip_manager() -> None:
    SkipManager.config = None
    SkipManager.step = -1
    SkipManager.skip_instances = {}


# ------------------------------------------------------------------------------- rollout data


def generated_dataproto(step: int, rows: int = 8) -> DataProto:
    """What a ``generate_sequences`` call returns at ``step``: every kind of column verl uses."""
    g = torch.Generator().manual_seed(1000 + step)
    rng = np.random.default_rng(step)
    num_turns = rng.integers(1, 4, rows).astype(np.int32)
    dp = DataProto.from_dict(
        tensors={
            "prompts": torch.randint(0, 151_000, (rows, 6), generator=g),
            "responses": torch.randint(0, 151_000, (rows, 5), generator=g),
            "attention_mask": torch.randint(0, 2, (rows, 11), generator=g),
            "response_mask": torch.randint(0, 2, (rows, 5), generator=g).to(torch.int32),
            "rollout_log_probs": torch.randn(rows, 5, generator=g),
            "rm_scores": torch.randn(rows, 5, generator=g).bfloat16(),
        },
        non_tensors={
            "uid": np.array([f"uid-{step}-{i // 2}" for i in range(rows)], dtype=object),
            "data_source": np.array(["openai/gsm8k"] * rows, dtype=object),
            "raw_prompt": np.array(
                [[{"role": "user", "content": f"q{step}.{i} é"}] for i in range(rows)] + [None], dtype=object
            )[:rows],
            "reward_model": np.array([{"ground_truth": str(i), "style": "rule"} for i in range(rows)], dtype=object),
            "__num_turns__": num_turns,
        },
        meta_info={
            "timing": {
                "agent_loop/generate_sequences/mean": np.float64(0.25 * step),
                "agent_loop/num_preempted/max": np.int64(step),
            },
            "global_token_num": [int(x) for x in range(rows)],
            "shape": (rows, 11),
        },
    )
    return dp


def prompts_dataproto(rows: int = 8, *, uids: list[str] | None = None, validate: bool = False) -> DataProto:
    dp = DataProto.from_dict(tensors={"input_ids": torch.zeros(rows, 6, dtype=torch.long)})
    if uids is not None:
        dp.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    if validate:
        dp.meta_info["validate"] = True
    return dp


class RolloutWorker:
    """``AgentLoopManager.generate_sequences`` (rollout) and the rollouter's async one (async_rollout)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    @SkipManager.annotate(role="rollout")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        step = SkipManager.step
        self.calls.append(step)
        return generated_dataproto(step)

    @SkipManager.annotate(role="async_rollout")
    async def generate_sequences_single(self, prompts: DataProto) -> DataProto:
        index = int(str(prompts.non_tensor_batch["uid"][0]).rsplit("_", 1)[1])
        self.calls.append(index)
        return generated_dataproto(index, rows=2)


# ------------------------------------------------------------------------------- TransferQueue


@dataclass
class KVBatchMeta:
    """What ``ReplayBuffer.sample`` returns (``transfer_queue.KVBatchMeta``'s fields used here)."""

    keys: list[str]
    tags: list[dict[str, Any]]
    partition_id: str | None = "train"
    fields: list[str] | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)


class FakeTransferQueue(types.ModuleType):
    """An in-memory ``transfer_queue`` module: ``kv_batch_put``, ``kv_batch_get``, ``kv_clear``.

    Rows are kept per key; ``kv_batch_get`` stacks them back: fields put as jagged
    NestedTensors as one again, other tensors stacked, other values as a ``NonTensorStack``.
    Every put is recorded in :attr:`puts`.
    """

    KVBatchMeta = KVBatchMeta

    def __init__(self) -> None:
        super().__init__("transfer_queue")
        self.rows: dict[str, dict[str, dict[str, Any]]] = {}
        self.tags: dict[str, dict[str, dict[str, Any]]] = {}
        self.puts: list[dict[str, Any]] = []
        self.nested: set[str] = set()  # fields put as jagged NestedTensors come back jagged

    def kv_batch_put(
        self,
        keys: list[str],
        partition_id: str,
        fields: Any = None,
        tags: list[dict[str, Any]] | None = None,
        data_parser: Any = None,
    ) -> KVBatchMeta:
        keys = list(keys)
        self.puts.append(
            {
                "keys": keys,
                "partition_id": partition_id,
                "fields": fields,
                "tags": None if tags is None else [dict(t) for t in tags],
            }
        )
        rows = self.rows.setdefault(partition_id, {})
        store_tags = self.tags.setdefault(partition_id, {})
        if fields is not None:
            assert fields.batch_size[0] == len(keys)
            for name in fields.keys():  # noqa: SIM118 - iterating a TensorDict walks its rows
                value = fields.get(name)
                if isinstance(value, torch.Tensor) and value.is_nested:
                    self.nested.add(name)
                per_row = value.unbind() if isinstance(value, torch.Tensor) else value.tolist()
                for key, row in zip(keys, per_row, strict=True):
                    rows.setdefault(key, {})[name] = row
        for i, key in enumerate(keys):
            store_tags[key] = dict(tags[i]) if tags is not None else store_tags.get(key, {})
        return KVBatchMeta(keys, [store_tags[k] for k in keys], partition_id)

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: Any = None) -> TensorDict:
        rows = [self.rows[partition_id][k] for k in keys]
        names = select_fields or list(rows[0])
        out: dict[str, Any] = {}
        for name in names:
            values = [r[name] for r in rows]
            if all(isinstance(v, torch.Tensor) for v in values):
                if name not in self.nested:
                    out[name] = torch.stack(values)
                else:
                    out[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                out[name] = NonTensorStack.from_list(values)
        return TensorDict(out, batch_size=[len(keys)])

    def kv_clear(self, keys: Any = None, partition_id: str = "train") -> None:
        """Drop ``keys`` (all keys when None) of a partition."""
        for table in (self.rows, self.tags):
            part = table.get(partition_id, {})
            for key in list(part) if keys is None else [keys] if isinstance(keys, str) else keys:
                part.pop(key, None)

    def install(self) -> FakeTransferQueue:
        sys.modules["transfer_queue"] = self
        return self


def trajectory_fields(step: int, rows: list[tuple[int, int]]) -> TensorDict:
    """Trajectory fields for (prompt index, session) pairs at ``step``: jagged, dense and non-tensor."""
    prompts, responses, mask, scores, raw = [], [], [], [], []
    for p, s in rows:
        g = torch.Generator().manual_seed(step * 10_000 + p * 100 + s)
        prompts.append(torch.randint(0, 151_000, (3 + p % 3,), generator=g))
        length = 1 + (p + s) % 4
        responses.append(torch.randint(0, 151_000, (length,), generator=g))
        mask.append(torch.ones(4, dtype=torch.int64))
        scores.append(torch.randn((), generator=g))
        raw.append([{"role": "user", "content": f"s{step} p{p}"}])
    return TensorDict(
        {
            "prompts": torch.nested.as_nested_tensor(prompts, layout=torch.jagged),
            "responses": torch.nested.as_nested_tensor(responses, layout=torch.jagged),
            "attention_mask": torch.stack(mask),
            "rm_scores": torch.stack(scores),
            "raw_prompt": NonTensorStack.from_list(raw),
        },
        batch_size=[len(rows)],
    )


class TqTrainer:
    """The V1 trainer's submit phase (``_add_batch_to_generate``) around a fake TransferQueue."""

    def __init__(self, tq: FakeTransferQueue, *, prompts: int, n: int, seed: int) -> None:
        self.tq, self.prompts, self.n = tq, prompts, n
        self.rng = random.Random(seed)
        self.generated: list[int] = []
        self.last_uids: list[str] = []

    def _next_train_batch(self) -> TensorDict:
        uids = [str(uuid.UUID(int=self.rng.getrandbits(128), version=4)) for _ in range(self.prompts)]
        self.last_uids = uids
        return TensorDict(
            {"uid": NonTensorStack.from_list(uids), "input_ids": torch.zeros(self.prompts, 3, dtype=torch.long)},
            batch_size=[self.prompts],
        )

    def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
        step = SkipManager.step
        self.generated.append(step)
        uids = list(batch["uid"])
        pairs = [(p, s) for p in range(len(uids)) for s in range(self.n)]
        keys = [f"{uids[p]}_{s}_0" for p, s in pairs]
        tags = [{"global_steps": step, "status": "finished", "seq_len": 4 + (p + s) % 4} for p, s in pairs]
        self.tq.kv_batch_put(keys=keys, partition_id="train", fields=trajectory_fields(step, pairs), tags=tags)
        self.tq.kv_batch_put(
            keys=uids,
            partition_id="train",
            tags=[{"is_prompt": True, "status": "finished", "global_steps": step}] * len(uids),
        )
        return len(uids)

    @SkipManager.annotate_tq(role="rollout_tq", phase="submit")
    def _add_batch_to_generate(self) -> None:
        batch = self._next_train_batch()
        self._submit_batch_to_rollout(batch)


def partition_tags(tq: Any, partition_id: str = "train") -> dict[str, dict[str, Any]]:
    """Every key's tags in a partition, from the fake or the real TransferQueue."""
    if isinstance(tq, FakeTransferQueue):
        return dict(tq.tags.get(partition_id, {}))
    return dict(tq.kv_list(partition_id).get(partition_id, {}))


def clear_partition(tq: Any, partition_id: str = "train") -> None:
    """What ``PPOTrainer.fit`` does at the end of a step (``tq.kv_clear``)."""
    keys = list(partition_tags(tq, partition_id))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition_id)


class ReplayBuffer:
    """``ReplayBuffer.sample``: finished trajectories in a shuffled (but seeded) order."""

    def __init__(self, tq: Any, seed: int = 7) -> None:
        self.tq = tq
        self.rng = random.Random(seed)
        self.sampled: set[str] = set()

    @SkipManager.annotate_tq(role="rollout_tq", phase="sample")
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        tags = partition_tags(self.tq, partition_id)
        ready = sorted(k for k, t in tags.items() if not t.get("is_prompt") and k not in self.sampled)
        self.rng.shuffle(ready)
        keys = ready[:batch_size]
        self.sampled.update(keys)
        return KVBatchMeta(keys, [dict(tags[k]) for k in keys], partition_id), {}


def run_tq_step(trainer: TqTrainer, buffer: ReplayBuffer, step: int, psync: int) -> list[KVBatchMeta]:
    """One V1 training step: submit, ``psync`` samples, then TransferQueue is cleared."""
    SkipManager.set_step(step)
    trainer._add_batch_to_generate()
    per = trainer.prompts * trainer.n // psync
    metas = [buffer.sample(step, "train", per)[0] for _ in range(psync)]
    clear_partition(trainer.tq)
    buffer.sampled.clear()
    return metas


class TqWriter:
    """A Ray actor body: one rank of a run writing its own mini-batch of each step.

    ``install()`` is expected to have run already (Ray's ``worker_process_setup_hook``).
    """

    def __init__(self, rank: int, config: dict[str, Any]) -> None:
        import zarr_skip.integrations.verl as zv

        self.hooked = zv.installed()
        self.rank = rank
        self.tq = FakeTransferQueue().install()
        SkipManager.init(OmegaConf.create(config))
        self.buffer = ReplayBuffer(self.tq)

    def write(self, step: int, prompts: int, n: int) -> dict[str, Any]:
        SkipManager.set_step(step)
        pairs = [(self.rank * prompts + p, s) for p in range(prompts) for s in range(n)]
        keys = [f"r{self.rank}p{p}_{s}_0" for p, s in pairs]
        tags = [{"global_steps": step, "status": "finished", "rank": self.rank} for _ in pairs]
        self.tq.kv_batch_put(keys=keys, partition_id="train", fields=trajectory_fields(step, pairs), tags=tags)
        self.buffer.sample(step, "train", len(keys))
        self.tq.kv_clear(partition_id="train")
        self.buffer.sampled.clear()
        role = SkipManager.skip_instances["rollout_tq"]
        return {
            "keys": keys,
            "pairs": pairs,
            "run": role.cache().run_id,
            "hooked": self.hooked,
            "role_class": type(role).__name__,
        }


# ------------------------------------------------------------------------------- comparison


def assert_same(a: Any, b: Any, path: str = "value") -> None:
    """Equal values of the same types, recursively (tensors by dtype, layout and content)."""
    if isinstance(a, DataProto) or isinstance(b, DataProto):
        assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
        assert_same(a.batch, b.batch, f"{path}.batch")
        assert_same(a.non_tensor_batch, b.non_tensor_batch, f"{path}.non_tensor_batch")
        assert_same(a.meta_info, b.meta_info, f"{path}.meta_info")
        return
    if isinstance(a, TensorDict) or isinstance(b, TensorDict):
        assert isinstance(a, TensorDict) and isinstance(b, TensorDict), f"{path}: {type(a)} vs {type(b)}"
        assert a.batch_size == b.batch_size, f"{path}: batch_size {a.batch_size} vs {b.batch_size}"
        assert sorted(a.keys()) == sorted(b.keys()), f"{path}: keys {sorted(a.keys())} vs {sorted(b.keys())}"
        for k in a.keys():  # noqa: SIM118 - iterating a TensorDict walks its rows
            assert_same(a.get(k), b.get(k), f"{path}[{k!r}]")
        return
    if isinstance(a, NonTensorStack) or isinstance(b, NonTensorStack):
        assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
        assert_same(a.tolist(), b.tolist(), path)
        return
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.is_nested) == (b.dtype, b.is_nested), (
            f"{path}: {a.dtype}/{a.is_nested} vs {b.dtype}/{b.is_nested}"
        )
        if a.is_nested:
            assert a.layout == b.layout, f"{path}: layout {a.layout} vs {b.layout}"
            ra, rb = a.unbind(), b.unbind()
            assert len(ra) == len(rb), f"{path}: {len(ra)} vs {len(rb)} rows"
            for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
                assert torch.equal(x, y), f"{path}[{i}] differs"
        else:
            assert a.shape == b.shape and torch.equal(a, b), f"{path}: tensors differ"
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                assert_same(x, y, f"{path}[{i}]")
        else:
            assert np.array_equal(a, b), f"{path}: arrays differ"
    elif isinstance(a, dict):
        assert list(a) == list(b) or sorted(a) == sorted(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"
