"""A mini-batch's record keeps where each row of a jagged column ends in its values
(``value_ends`` of its lengths entry), so that a read of a few rows goes straight to their
values: one round of requests, no lengths read. Records without them (older writers, a
values array read whole anyway) read their lengths as before; ends that do not add up are
typed errors naming the column, and ends that disagree with the stored lengths are found by
whole reads and ``verify``."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FINGERPRINT, CountingStore, Keys
from zarr.storage import MemoryStore

import zarr_skip as zs
from zarr_skip import lazy
from zarr_skip.errors import MetadataError
from zarr_skip.format import layout, records

#: small chunks, so that a mini-batch's token ids are several chunks
CHUNK_BYTES = 8 << 10


def _batch(lengths: list[int], seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    total = int(offsets[-1])
    return {
        "responses": torch.nested.nested_tensor_from_jagged(torch.randint(0, 151936, (total,), generator=g), offsets),
        "old_log_probs": torch.nested.nested_tensor_from_jagged(torch.randn(total, generator=g), offsets),
        "data_source": ["gsm8k" if i % 3 else "math" for i in range(len(lengths))],  # repeated: a dictionary
    }


def _lengths(n: int, seed: int) -> list[int]:
    lengths: list[int] = np.random.default_rng(seed).integers(0, 300, n).tolist()
    lengths[1] = 0  # an empty row
    return lengths


def _write(location: Any, batches: list[dict[str, Any]], **options: Any) -> zs.StepView:
    cache = zs.open_cache(location, FINGERPRINT, chunk_bytes=CHUNK_BYTES, **options)
    for b in batches:
        cache.write(1, b, expected=len(batches))
    return zs.open_cache(location).load(1)


def _rows(batches: list[dict[str, Any]], name: str = "responses") -> list[torch.Tensor]:
    return [row for b in batches for row in b[name].unbind()]


def _same(got: Any, want: list[torch.Tensor]) -> None:
    rows = got.unbind()
    assert len(rows) == len(want) and all(torch.equal(a, b) for a, b in zip(rows, want, strict=True))


def _record(keys: Keys, part: Any) -> dict[str, Any]:
    import json

    doc: dict[str, Any] = json.loads(keys.read(f"{part.path}/zarr.json"))["attributes"][layout.PART_ATTR]
    return doc


def _lengths_read(store: CountingStore, name: str = "responses") -> int:
    return sum(n for key, n in store.reads.items() if f"/{name}/lengths/" in key)


def test_records_keep_value_ends_where_rows_are_read_in_part() -> None:
    store = MemoryStore()
    batches = [_batch(_lengths(64, i), i) for i in range(2)]
    view = _write(store, batches)
    keys = Keys(store)
    for part, batch in zip(view._parts, batches, strict=True):
        columns = _record(keys, part)["columns"]
        for name in ("responses", "old_log_probs"):  # several chunks of values each
            arrays = columns[name]["arrays"]
            assert len(arrays["values"]["sizes"]) > 1
            ends = np.frombuffer(base64.b64decode(arrays["lengths"]["value_ends"]), dtype="<u4")
            assert ends.tolist() == batch[name].offsets()[1:].tolist()
        assert "value_ends" not in columns["data_source"]["arrays"]["lengths"]  # dictionary-encoded
    short = _write(MemoryStore(), [_batch([3, 0, 5], 0)])  # one chunk of one block: read whole anyway
    assert short._parts[0].arrays["responses"]["lengths"].value_ends is None


def test_a_few_rows_read_their_values_and_no_lengths() -> None:
    store = CountingStore()
    batches = [_batch(_lengths(96, i), i) for i in range(3)]
    want = _rows(batches)
    view = _write(store, batches)
    store.reads.clear()
    idx = np.array([5, 1, 100, 287, 100])
    col = view["responses"]
    _same(col[idx], [want[i] for i in idx])
    _same(col[90:110], want[90:110])
    assert torch.equal(col[200], want[200])
    assert torch.equal(view["old_log_probs"][7], _rows(batches, "old_log_probs")[7])
    assert _lengths_read(store) == 0 and _lengths_read(store, "old_log_probs") == 0
    assert sum(store.reads.values()) > 0  # the values were read
    lengths = view["responses"].lengths()  # from the records: no read
    assert lengths.tolist() == [len(r) for r in want] and _lengths_read(store) == 0
    _same(view["responses"][:], want)  # a whole read reads them, and checks them against the ends
    assert _lengths_read(store) > 0


def test_a_few_rows_skip_the_lengths_on_every_backend(location: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [_batch(_lengths(80, i), i) for i in range(2)]
    want = _rows(batches)
    _write(location, batches)

    def refuse(*_: Any) -> Any:
        raise AssertionError("the lengths were read")

    monkeypatch.setattr(lazy.LazyColumn, "_read_lengths", refuse)
    col = zs.open_cache(location).load(1)["responses"]
    _same(col[np.array([3, 150, 79])], [want[3], want[150], want[79]])
    _same(col[70:90], want[70:90])


def _forge(keys: Keys, part: Any, fn: Callable[[dict[str, Any]], None]) -> None:
    """``fn`` applied to the ``responses`` arrays of ``part``'s record, its checksum recomputed."""
    keys.edit(f"{part.path}/zarr.json", layout.PART_ATTR, lambda r: fn(r["columns"]["responses"]["arrays"]))


def test_records_without_value_ends_read_the_lengths_first() -> None:
    store = CountingStore()
    batches = [_batch(_lengths(96, i), i) for i in range(2)]
    want = _rows(batches)
    view = _write(store, batches)
    for part in view._parts:  # as an older writer left them
        _forge(Keys(store), part, lambda a: a["lengths"].pop("value_ends"))
    store.reads.clear()
    col = zs.open_cache(store).load(1)["responses"]
    _same(col[np.array([2, 150])], [want[2], want[150]])
    assert _lengths_read(store) > 0
    _same(col[100:120], want[100:120])


def test_value_ends_are_written_only_for_values_that_uint32_can_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "MAX_VALUE_ENDS", 100)
    batches = [_batch(_lengths(64, 0), 0)]
    view = _write(MemoryStore(), batches)
    assert view._parts[0].arrays["responses"]["lengths"].value_ends is None
    _same(view["responses"][np.array([0, 63])], [_rows(batches)[0], _rows(batches)[63]])


def _b64(values: list[int]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<u4").tobytes()).decode()


def test_value_ends_that_do_not_add_up_are_metadata_errors() -> None:
    store = MemoryStore()
    batches = [_batch(_lengths(64, 0), 0)]
    view = _write(store, batches)
    part, keys = view._parts[0], Keys(store)
    original = keys.read(f"{part.path}/zarr.json")
    ends = batches[0]["responses"].offsets()[1:].tolist()
    falling = [*ends[:10], ends[9] - 1, *ends[11:]]
    cases: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (lambda a: a["lengths"].__setitem__("value_ends", ends), "value_ends must be a base64 string"),
        (lambda a: a["lengths"].__setitem__("value_ends", "@@@@"), "value_ends is not base64"),
        (lambda a: a["lengths"].__setitem__("value_ends", "AAA="), "value_ends is not a whole number"),
        (lambda a: a["lengths"].__setitem__("value_ends", _b64(ends[:-1])), "one end per row"),
        (lambda a: a["lengths"].__setitem__("value_ends", _b64([*ends[:-1], ends[-1] + 1])), "one end per row"),
        (lambda a: a["lengths"].__setitem__("value_ends", _b64(falling)), "must not fall"),
    ]
    for fn, message in cases:
        keys.write(f"{part.path}/zarr.json", original)
        _forge(keys, part, fn)
        with pytest.raises(MetadataError, match=message) as caught:
            zs.open_cache(store).load(1)["responses"][np.array([1])]
        assert "responses" in str(caught.value), caught.value
    keys.write(f"{part.path}/zarr.json", original)

    def on_a_dictionary(r: dict[str, Any]) -> None:
        r["columns"]["data_source"]["arrays"]["lengths"]["value_ends"] = _b64([1] * 64)

    keys.edit(f"{part.path}/zarr.json", layout.PART_ATTR, on_a_dictionary)
    with pytest.raises(MetadataError, match="data_source/lengths: value_ends belong to a plain jagged column"):
        zs.open_cache(store).load(1)["data_source"][0]


def test_value_ends_that_disagree_with_the_stored_lengths_are_found() -> None:
    store = MemoryStore()
    lengths = _lengths(64, 0)
    lengths[4], lengths[5] = 10, 20
    batches = [_batch(lengths, 0)]
    view = _write(store, batches)
    part = view._parts[0]
    ends = np.cumsum([*lengths[:4], 20, 10, *lengths[6:]]).tolist()  # rows 4 and 5 swapped: still sound
    _forge(Keys(store), part, lambda a: a["lengths"].__setitem__("value_ends", _b64(ends)))
    with pytest.raises(MetadataError, match="disagree with the record's value_ends"):
        zs.open_cache(store).load(1)["responses"][:]
    report = zs.open_cache(store).verify()
    assert not report.ok and "value_ends" in str(report) and "responses" in str(report)
