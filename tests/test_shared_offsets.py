"""Jagged columns of the same rows come back on one offsets tensor, as verl makes them: torch
matches two jagged tensors' ragged dimension by their offsets tensor, so ``old_log_probs *
response_mask`` works on what was written and must work on what is read, collated or replayed."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import zarr_skip as zs
from zarr_skip.data import RolloutIterableDataset, collate_rollouts
from zarr_skip.format import specs
from zarr_skip.format.specs import jagged_parts, jagged_tensor, nested_rows, share_offsets
from zarr_skip.trainer.manager import inject_step

RESPONSE_LENGTHS = [3, 1, 4, 2, 5, 2, 3, 1]
PROMPT_LENGTHS = [2, 3, 6, 5, 1, 4, 3, 7]  # in batches of 3, never the responses' lengths


def nested(lengths: list[int], offsets: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    values = torch.arange(sum(lengths), dtype=dtype) + 1
    if offsets is None:
        offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return jagged_tensor(values, offsets)


def verl_like(rows: slice = slice(None)) -> dict[str, Any]:
    """Responses, their mask and log-probs on one offsets tensor (as verl makes them); prompts
    on their own; keys and tags as a TransferQueue step holds them."""
    lengths = RESPONSE_LENGTHS[rows]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    start = rows.start or 0
    return {
        "prompts": nested(PROMPT_LENGTHS[rows], dtype=torch.int64),
        "responses": nested(lengths, offsets, torch.int64),
        "response_mask": nested(lengths, offsets, torch.int64),
        "old_log_probs": nested(lengths, offsets),
        "keys": [f"u{(start + i) // 2}_{(start + i) % 2}_0" for i in range(len(lengths))],
        "tags": [{"global_steps": 1, "status": "finished"} for _ in lengths],
    }


def assert_shared(columns: dict[str, Any]) -> None:
    """The response columns share their offsets tensor (pointwise ops work), the prompts keep theirs."""
    got = columns["old_log_probs"] * columns["response_mask"]
    assert torch.equal(got.values(), columns["old_log_probs"].values() * columns["response_mask"].values())
    assert columns["responses"].offsets() is columns["response_mask"].offsets() is columns["old_log_probs"].offsets()
    assert columns["prompts"].offsets() is not columns["responses"].offsets()


def test_share_offsets_joins_equal_offsets_only() -> None:
    a, b = nested([2, 3]), nested([2, 3], dtype=torch.int64)
    other, dense = nested([3, 2]), torch.ones(2, 3)
    holes = torch.nested.nested_tensor_from_jagged(
        torch.arange(5.0), torch.tensor([0, 2, 5]), lengths=torch.tensor([1, 3])
    )
    with pytest.raises(RuntimeError):
        a * b.float()  # equal offsets, two tensors: torch refuses
    out = share_offsets({"a": a, "b": b, "other": other, "dense": dense, "holes": holes, "text": ["x", "y"]})
    assert out["b"].offsets() is a.offsets() and out["b"].dtype == b.dtype
    assert torch.equal(out["b"].values(), b.values())
    assert out["other"] is other and out["dense"] is dense and out["holes"] is holes and out["text"] == ["x", "y"]
    assert torch.equal((out["a"] * out["b"].float()).values(), a.values() * b.values())


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    cache = zs.open_cache(tmp_path / "c", {"t": "offsets"})
    cache.write(1, verl_like(slice(0, 4)), expected=2)  # a step of two mini-batches
    cache.write(1, verl_like(slice(4, 8)), expected=2)
    return tmp_path / "c"


def test_a_loaded_step_shares_the_offsets_of_its_response_columns(cache_dir: Path) -> None:
    view = zs.open_cache(cache_dir).load(1)
    columns = view.to_dict()
    assert_shared(columns)
    assert [len(r) for r in columns["responses"].unbind()] == RESPONSE_LENGTHS


@pytest.mark.parametrize("how", ["items", "batches", "batches through workers"])
def test_nested_batches_share_the_offsets_of_equal_rows(cache_dir: Path, how: str) -> None:
    names = ["prompts", "responses", "response_mask", "old_log_probs"]
    if how == "items":
        items = list(RolloutIterableDataset(cache_dir, columns=names))
        batches = [collate_rollouts(items[i : i + 3], jagged="nested") for i in range(0, 8, 3)]
    else:
        ds = RolloutIterableDataset(cache_dir, columns=names, batch_size=3, jagged="nested")
        workers = 2 if how == "batches through workers" else 0
        batches = list(DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=collate_rollouts))
    assert sum(len(b["row"]) for b in batches) == 8
    nested_batches = [b for b in batches if b["responses"].is_nested]  # one row: stacked, not nested
    assert len(nested_batches) >= 2
    for batch in nested_batches:
        assert_shared(batch)


def test_a_replayed_transfer_queue_step_shares_the_offsets(cache_dir: Path) -> None:
    class TQ:
        fields: list[Any] = []

        def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> None:
            if fields is not None:
                self.fields.append(fields)

    tq = TQ()
    view = zs.open_cache(cache_dir).load(1)
    inject_step(view, [f"new{i}" for i in range(4)], 2, 5, "cycle", tq, "train", "test")
    (fields,) = tq.fields
    assert_shared({name: fields[name] for name in ("prompts", "responses", "response_mask", "old_log_probs")})


@pytest.mark.parametrize("way", ["fields", "no class", "no fields"])
def test_jagged_parts_gives_values_and_offsets_of_plain_jagged_tensors_only(
    way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fields of torch's class, or (a torch without the class or with other fields) its
    public methods: the same answer."""
    if way == "no class":
        monkeypatch.setattr(specs, "_nested_class", lambda: None)
    if way == "no fields":
        monkeypatch.setattr(specs, "_FIELDS", ("_values_renamed", "_offsets", "_lengths", "_ragged_idx"))
    made = nested([2, 0, 3])
    parts = jagged_parts(made)
    assert parts is not None
    assert torch.equal(parts[0], torch.arange(5.0) + 1) and parts[1].tolist() == [0, 2, 2, 5]
    from_public = torch.nested.nested_tensor_from_jagged(torch.arange(4), offsets=torch.tensor([0, 1, 4]))
    assert jagged_parts(from_public) is not None and jagged_parts(from_public)[1].tolist() == [0, 1, 4]  # type: ignore[index]
    holes = torch.nested.nested_tensor_from_jagged(
        torch.arange(6), offsets=torch.tensor([0, 3, 6]), lengths=torch.tensor([2, 1])
    )
    with warnings.catch_warnings():  # torch: "the PyTorch API of nested tensors is in prototype stage"
        warnings.simplefilter("ignore", UserWarning)
        strided = torch.nested.nested_tensor([torch.arange(2), torch.arange(3)])
    ragged_2 = torch.nested.nested_tensor_from_jagged(torch.zeros(2, 5), offsets=torch.tensor([0, 2, 5]), jagged_dim=2)
    for other in (holes, strided, ragged_2, torch.zeros(3, 2), [1, 2], None):
        assert jagged_parts(other) is None


@pytest.mark.parametrize("way", ["fields", "no class", "no fields"])
def test_nested_rows_are_the_rows_unbind_gives(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if way == "no class":
        monkeypatch.setattr(specs, "_nested_class", lambda: None)
    if way == "no fields":
        monkeypatch.setattr(specs, "_FIELDS", ("_values", "_offsets_renamed", "_lengths", "_ragged_idx"))
    values = torch.arange(24.0).reshape(12, 2)
    cases = [  # (tensor, its rows as (start, stop) in values)
        (jagged_tensor(values, torch.tensor([0, 3, 3, 7])), [(0, 3), (3, 3), (3, 7)]),  # values beyond the rows
        (jagged_tensor(values, torch.tensor([2, 5, 11])), [(2, 5), (5, 11)]),  # the first row not at 0
        (
            torch.nested.nested_tensor_from_jagged(
                values, offsets=torch.tensor([0, 4, 8]), lengths=torch.tensor([1, 3])
            ),
            [(0, 1), (4, 7)],  # holes: torch's unbind
        ),
        (jagged_tensor(values[:0], torch.tensor([0])), []),  # no rows
    ]
    for nt, spans in cases:
        got = nested_rows(nt)
        assert len(got) == len(spans) and all(not r.is_nested for r in got)
        assert all(torch.equal(r, values[a:b]) for r, (a, b) in zip(got, spans, strict=True))
