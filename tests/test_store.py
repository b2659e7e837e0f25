"""The store suite: every test runs over each backend of the ``location`` fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from helpers import CountingStore, Keys, assert_equal, concat, make_batch, stored_bytes, write_sharded

import zarr_skip as zs
from zarr_skip.format import layout
from zarr_skip.store.reads import read_range


def test_single_minibatch_roundtrip(location: Any, fingerprint: dict, batch: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    info = cache.write(3, batch, meta_info={"global_steps": 3, "temperature": 1.0})
    assert info.step_complete and info.index == 0 and info.rows == 6
    view = zs.open_cache(location, fingerprint).load(3)
    assert len(view) == 6 and view.columns == list(batch)
    assert view.meta_info == {"global_steps": 3, "temperature": 1.0}
    assert_equal(view.to_dict(), batch)


def test_minibatches_merge_in_index_order(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint, chunk_bytes=16)
    parts = [make_batch(rows, seed=i, offset=10 * i) for i, rows in enumerate([3, 5, 0, 4])]
    for i, part in enumerate(parts):
        info = cache.write(7, part, expected=4, meta_info={"i": i})
        assert info.index == i and info.step_complete == (i == 3)
    view = cache.load(7)
    assert len(view) == 12
    assert_equal(view.to_dict(), concat(parts))
    assert [m.meta_info for m in view.minibatches] == [{"i": i} for i in range(4)]
    for i, mb in enumerate(view.minibatches):
        assert_equal(mb.to_dict(), parts[i], f"mini-batch {i}")
    merged = concat(parts)
    # rows straddling mini-batch and chunk boundaries, any order, repeats, negatives
    idx = np.array([11, 0, 3, 3, 8, -1, 2])
    for name in view.columns:
        got = view[name][idx]
        want = merged[name]
        if isinstance(want, torch.Tensor) and want.is_nested:
            rows = want.unbind()
            for g, i in zip(got.unbind(), idx, strict=True):
                assert torch.equal(g, rows[i])
        elif isinstance(want, list):
            assert got == [want[i] for i in idx]
        else:
            assert_equal(got, want[idx], name)
        assert_equal(view[name][2:9], _slice(want, 2, 9), f"{name}[2:9]")
        assert_equal(view[name][::3], _take(want, range(0, 12, 3)), f"{name}[::3]")


def _slice(v: Any, a: int, b: int) -> Any:
    return _take(v, range(a, b))


def _take(v: Any, rows: Any) -> Any:
    rows = list(rows)
    if isinstance(v, torch.Tensor) and v.is_nested:
        parts = [v.unbind()[i] for i in rows]
        lengths = torch.tensor([p.shape[0] for p in parts], dtype=torch.int64)
        offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
        offsets[1:] = lengths.cumsum(0)
        values = torch.cat(parts) if parts else v.values()[:0]
        return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    if isinstance(v, list):
        return [v[i] for i in rows]
    return v[np.array(rows, dtype=np.int64)] if isinstance(v, np.ndarray) else v[torch.tensor(rows, dtype=torch.int64)]


def test_single_row_indexing(location: Any, fingerprint: dict, batch: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(1, batch)
    view = cache.load(1)
    assert torch.equal(view["responses"][2], batch["responses"].unbind()[2])
    assert view["uid"][-1] == batch["uid"][-1]
    assert torch.equal(view["input_ids"][0], batch["input_ids"][0])
    with pytest.raises(IndexError, match="out of range"):
        view["uid"][6]
    with pytest.raises(KeyError, match="no column 'nope'"):
        view["nope"]


def test_lazy_reads_touch_only_needed_chunks(fingerprint: dict) -> None:
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint, chunk_bytes=64)
    parts = [make_batch(40, seed=i) for i in range(4)]
    for p in parts:
        cache.write(5, p, expected=4)
    store.reads.clear()
    view = zs.open_cache(store, fingerprint).load(5)
    assert not [k for k in store.reads if "/c." in k], "loading a view must read metadata only"
    store.reads.clear()
    store.bytes_read.clear()
    got = view["input_ids"][:3]
    chunk_reads = [k for k in store.reads if "/c." in k]
    assert chunk_reads and all("input_ids" in k for k in chunk_reads)
    stored = stored_bytes(store, "/input_ids/c.")
    read = sum(store.bytes_read[k] for k in chunk_reads)
    assert 0 < read < stored / 16, "3 rows of 160 must read a few chunks of a shard, not all"
    assert torch.equal(got, parts[0]["input_ids"][:3])
    store.reads.clear()
    rows = view["responses"][45:47]  # rows of mini-batch 1
    assert all("/responses/" in k for k in store.reads if "/c." in k)
    touched = {k.split("/w-")[0].rsplit("/", 1)[-1] for k in store.reads if "/c." in k}
    assert touched == {"1"}, f"read mini-batches {touched} for rows of mini-batch 1"
    assert [r.tolist() for r in rows.unbind()] == [r.tolist() for r in parts[1]["responses"].unbind()[5:7]]
    store.reads.clear()
    row = zs.open_cache(store, fingerprint).load(5)["responses"][86]  # one row: its mini-batch's lengths only
    touched = {k.split("/w-")[0].rsplit("/", 1)[-1] for k in store.reads if "/c." in k}
    assert touched == {"2"}, f"read mini-batches {touched} for a row of mini-batch 2"
    assert row.tolist() == parts[2]["responses"].unbind()[6].tolist()
    store.reads.clear()
    picked = zs.open_cache(store, fingerprint).load(5)["responses"][[88, 83, 88]]  # chosen rows: the same
    touched = {k.split("/w-")[0].rsplit("/", 1)[-1] for k in store.reads if "/c." in k}
    assert touched == {"2"}, f"read mini-batches {touched} for rows of mini-batch 2"
    want = parts[2]["responses"].unbind()
    assert [r.tolist() for r in picked.unbind()] == [want[8].tolist(), want[3].tolist(), want[8].tolist()]


@pytest.mark.parametrize("ends", [True, False], ids=["value_ends", "older_records"])
def test_a_few_jagged_rows_are_read_in_one_round(
    location: Any, fingerprint: dict, monkeypatch: Any, ends: bool
) -> None:
    """The record says where each row's values end, so a few rows fetch their values alone; a
    record of an older writer names the row each values chunk starts in, so a row range
    fetches its lengths and its values chunks in one round of requests (object stores) or, on
    local files, asks the kernel to read the values while the lengths are read; every range
    reads back exact."""
    from zarr_skip.format import records
    from zarr_skip.store.storage import Storage

    if not ends:
        monkeypatch.setattr(records, "MAX_VALUE_ENDS", 0)  # the writer keeps none

    cache = zs.open_cache(location, fingerprint, chunk_bytes=32)  # a few rows: at most 8 chunks
    parts = [make_batch(7, seed=i, offset=10 * i) for i in range(3)]
    for p in parts:
        cache.write(2, p, expected=3)
    merged = concat(parts)
    rounds: list[str] = []
    real_get_many, real_get_spans, real_read_ahead = Storage.get_many, Storage.get_spans, Storage.read_ahead
    monkeypatch.setattr(Storage, "get_many", lambda self, *a, **k: rounds.append("get") or real_get_many(self, *a, **k))
    monkeypatch.setattr(
        Storage, "get_spans", lambda self, *a, **k: rounds.append("get") or real_get_spans(self, *a, **k)
    )
    monkeypatch.setattr(
        Storage, "read_ahead", lambda self, items: rounds.append("ahead") or real_read_ahead(self, items)
    )
    local = cache._storage.root is not None
    view = cache.load(2)
    assert all(p.arrays["responses"]["values"].first_rows is not None for p in view._parts)
    assert _ends(view, "responses") is ends
    for name in ("responses", "uid", "tags"):
        want = merged[name]
        lengths = view[name].lengths()
        for start in range(0, 21, 2):
            for stop in range(start, 22, 3):
                step = cache.load(2)  # its records read (get_many) before the rounds of the read
                rounds.clear()
                got = step[name][start:stop]
                if name == "responses":
                    assert [r.tolist() for r in got.unbind()] == [r.tolist() for r in want.unbind()[start:stop]]
                else:
                    assert list(got) == list(want[start:stop]), (name, start, stop)
                if 0 < stop - start <= 3:  # a few rows: a handful of chunks
                    has_values = bool(lengths[start:stop].sum())
                    assert rounds == _few_rows_rounds(local, has_values, _ends(view, name)), (name, start, stop, rounds)
    rng = np.random.default_rng(0)
    for name in ("responses", "tags"):
        lengths = view[name].lengths()
        for size in (1, 3, 8, 30):
            idx = rng.integers(-21, 21, size)
            step = cache.load(2)
            rounds.clear()
            got = step[name][idx]
            want = merged[name].unbind() if name == "responses" else merged[name]
            if name == "responses":
                assert [r.tolist() for r in got.unbind()] == [want[i].tolist() for i in idx]
            else:
                assert list(got) == [want[i] for i in idx]
            if size <= 3:
                assert rounds == _few_rows_rounds(local, bool(lengths[idx].sum()), _ends(view, name)), (
                    name,
                    idx,
                    rounds,
                )


def _ends(view: zs.StepView, name: str) -> bool:
    """Whether every record of the step keeps the ``value_ends`` of column ``name``."""
    return all(p.arrays[name]["lengths"].value_ends is not None for p in view._parts)


def _few_rows_rounds(local: bool, has_values: bool, ends: bool) -> list[str]:
    """What reading a few rows of a jagged column asks of the storage. When the records keep
    where each row ends (``value_ends``): one batch of the values, if the rows hold any. Else
    the values chunks are named ahead (object stores decline, local files have the kernel read
    them), then one batch fetches the lengths (with the values, from an object store); local
    values are read after."""
    if ends:
        return ["get"] if has_values else []
    return ["ahead", "get"] + (["get"] if local and has_values else [])


def test_opening_reads_the_root_and_the_experiment_in_one_round(
    location: Any, fingerprint: dict, monkeypatch: Any
) -> None:
    from zarr_skip.store.storage import Storage

    zs.open_cache(location, fingerprint).write(1, make_batch(2))
    calls: list[tuple[str, list[str]]] = []
    for method in ("get", "get_many", "read_ahead"):
        real = getattr(Storage, method)

        def spy(self: Any, arg: Any, _real: Any = real, _name: str = method) -> Any:
            arg = arg if isinstance(arg, str) else list(arg)  # keys, or (key, span) pairs
            calls.append((_name, [arg] if isinstance(arg, str) else [k if isinstance(k, str) else k[0] for k in arg]))
            return _real(self, arg)

        monkeypatch.setattr(Storage, method, spy)
    cache = zs.open_cache(location, fingerprint)
    root, experiment = "zarr.json", f"{cache.experiment}/zarr.json"
    if cache._storage.root is not None:  # local files: the kernel reads the experiment meanwhile
        assert calls == [("read_ahead", [experiment]), ("get", [root]), ("get", [experiment])]
    else:
        assert calls == [("read_ahead", [experiment]), ("get_many", [root, experiment])]


def test_opening_without_a_fingerprint_reads_the_root_with_its_listing(
    location: Any, fingerprint: dict, monkeypatch: Any
) -> None:
    """Finding the one experiment stored: the root's document and listing in one round, then
    each level's documents and listings (an experiment may nest below a group)."""
    from zarr_skip.store.storage import Storage

    zs.open_cache(location, fingerprint).write(1, make_batch(2))
    calls: list[tuple[str, list[str], list[str]]] = []
    inside: list[bool] = []  # local files: list_and_get reads through get_many, not counted again
    real_lg, real_many = Storage.list_and_get, Storage.get_many

    def list_and_get(self: Any, prefixes: Any, keys: Any) -> Any:
        prefixes, keys = list(prefixes), list(keys)
        calls.append(("list_and_get", prefixes, keys))
        inside.append(True)
        try:
            return real_lg(self, prefixes, keys)
        finally:
            inside.pop()

    def get_many(self: Any, keys: Any) -> Any:
        keys = list(keys)
        if not inside:
            calls.append(("get_many", [], keys))
        return real_many(self, keys)

    monkeypatch.setattr(Storage, "list_and_get", list_and_get)
    monkeypatch.setattr(Storage, "get_many", get_many)
    cache = zs.open_cache(location)
    exp = cache.experiment
    assert exp is not None and cache.fingerprint == layout.normalize_fingerprint(fingerprint)
    group = exp.rsplit("/", 1)[0]  # the verl project, holding the experiment
    assert calls == [
        ("list_and_get", [""], ["zarr.json"]),
        ("get_many", [], [f"{group}/zarr.json"]),
        ("list_and_get", [group], []),
        ("get_many", [], [f"{exp}/zarr.json"]),
        ("list_and_get", [exp], []),
    ]


def test_load_and_status_wait_for_few_rounds_of_requests(fingerprint: dict, monkeypatch: Any) -> None:
    """On an object store (every request a round trip): load() of a complete step is two
    rounds (the step's listing with its summary, then its records), status() two (the steps,
    then every step's listing with its summary)."""
    from zarr_skip.store.storage import Storage

    store = CountingStore()
    cache = zs.open_cache(store, fingerprint)
    for step in (1, 2, 3):
        for _ in range(2):
            cache.write(step, make_batch(3), expected=2)
    rounds: list[int] = []
    real = Storage.run
    monkeypatch.setattr(Storage, "run", lambda self, coro: rounds.append(1) or real(self, coro))
    view = cache.load(2)
    assert len(rounds) == 2 and len(view) == 6
    rounds.clear()
    assert [i.step for i in cache.status()] == [1, 2, 3] and len(rounds) == 2


def test_status_reads_metadata_only(fingerprint: dict) -> None:
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint)
    for step in range(3):
        cache.write(step, make_batch(4, seed=step), expected=2)
        if step != 1:
            cache.write(step, make_batch(4, seed=step + 9), expected=2)
    store.reads.clear()
    infos = zs.open_cache(store).status()
    assert [(i.step, i.complete, i.done, i.expected, i.rows) for i in infos] == [
        (0, True, 2, 2, 8),
        (1, False, 1, 2, 4),
        (2, True, 2, 2, 8),
    ]
    assert all(k.endswith("zarr.json") for k in store.reads)
    assert infos[0].nbytes_stored > 0 and infos[0].nbytes > 0 and infos[0].ratio > 0


def test_partial_step_is_detected(location: Any, fingerprint: dict, batch: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(4, batch, expected=3)
    cache.write(4, batch, expected=3)
    reader = zs.open_cache(location)
    (info,) = reader.status()
    assert info.state == "writing" and not info.complete and (info.done, info.expected) == (2, 3)
    assert reader.steps() == []
    assert reader.resolve(4, action="cache") is None
    with pytest.raises(zs.IncompleteStepError, match=r"step 4 is writing: 2 of 3"):
        reader.load(4)


def test_missing_step(location: Any, fingerprint: dict, batch: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(2, batch)
    with pytest.raises(zs.StepNotFoundError, match=r"step 9 not found.*complete steps: 2") as exc:
        cache.load(9)
    assert isinstance(exc.value, KeyError)
    with pytest.raises(zs.StepNotFoundError):
        cache.info(9)


def test_complete_step_refuses_more_unless_overwrite(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    first, second = make_batch(3, seed=1), make_batch(5, seed=2)
    cache.write(1, first)
    with pytest.raises(zs.StepCompleteError, match="step 1 is complete.*overwrite=True"):
        cache.write(1, second)
    with pytest.raises(zs.StepCompleteError):
        zs.open_cache(location, fingerprint).write(1, second)
    assert_equal(cache.load(1).to_dict(), first)
    cache.write(1, second, overwrite=True)
    assert_equal(cache.load(1).to_dict(), second)


def test_a_new_runs_overwrite_replaces_the_step_once_it_completes_it(
    location: Any, fingerprint: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """Readers see the complete step until the run replacing it completes; then only the new
    one is stored. Another handle of the replacing run goes on without ``overwrite``."""
    old = zs.open_cache(location, fingerprint)
    first = make_batch(4, seed=1)
    old.write(2, first)
    new = zs.open_cache(location, fingerprint)
    fresh = [make_batch(3, seed=10 + i) for i in range(2)]
    assert not new.write(2, fresh[0], expected=2, overwrite=True).step_complete
    assert "is replaced once this run" in caplog.text
    reader = zs.open_cache(location)
    info = reader.info(2)
    assert info.complete and info.run == old.run_id and info.stale_runs == (new.run_id,)
    assert_equal(reader.load(2).to_dict(), first)
    with pytest.raises(zs.StepCompleteError, match="step 2 is complete"):
        zs.open_cache(location, fingerprint).write(2, make_batch(2))  # a newer run, without overwrite
    twin = zs.open_cache(location, fingerprint, run_id=new.run_id)  # another process of the run
    assert twin.write(2, fresh[1], expected=2).step_complete
    info = reader.info(2)
    assert info.run == new.run_id and info.stale_runs == ()
    assert_equal(reader.load(2).to_dict(), concat(fresh))
    assert Keys(location).list(f"{new.experiment}/2/{old.run_id}") == []
    with pytest.raises(zs.DisplacedWriterError, match="started after this run"):
        old.write(2, first, overwrite=True)


@pytest.mark.parametrize("damage", ["lost", "edited"], ids=["run_record_lost", "run_record_edited"])
def test_a_damaged_complete_step_refuses_writes_unless_overwrite(location: Any, fingerprint: dict, damage: str) -> None:
    """A complete step whose run record was lost or edited still reads (its summary names its
    mini-batches) and ``status`` calls it complete, but a write took it for an empty or
    unfinished step: another run replaced it without ``overwrite`` (the record lost), or
    deleted it as an older run's leftovers (the record edited to expect more)."""
    old = zs.open_cache(location, fingerprint)
    first = make_batch(3, seed=1)
    old.write(2, first)
    keys = Keys(location)
    record = f"{old.experiment}/2/{old.run_id}/zarr.json"
    if damage == "lost":
        keys.delete(record)
        (problem,) = old.verify().problems  # what verify says to do about it
        assert problem.error.endswith("a write replaces it only with overwrite=True (`zarr-skip rm` deletes it)")
    else:
        keys.edit(record, layout.RUN_ATTR, lambda run: run.update(expected=2))
    for writer in (zs.open_cache(location, fingerprint), old):  # another run, and the same one
        complete = rf"step 2 is complete \(its summary: 1 mini-batches of run {old.run_id}; damaged"
        with pytest.raises(zs.StepCompleteError, match=complete):
            writer.write(2, make_batch(2, seed=5))
        assert_equal(zs.open_cache(location).load(2).to_dict(), first)
    new = zs.open_cache(location, fingerprint)
    second = make_batch(2, seed=6)
    assert not new.write(2, second, expected=2, overwrite=True).step_complete
    assert keys.list(f"{old.experiment}/2/{old.run_id}/0")  # kept until replaced
    assert new.write(2, second, expected=2).step_complete
    assert_equal(zs.open_cache(location).load(2).to_dict(), concat([second, second]))


def test_schema_mismatch_writes_nothing(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    good = make_batch(4)
    cache.write(6, good, expected=2)
    before = cache.status()
    bad = dict(make_batch(4), input_ids=torch.zeros(4, 5, dtype=torch.int32))
    with pytest.raises(zs.SchemaMismatchError, match=r"step 6.*column 'input_ids': dtype 'int32' vs 'int64'"):
        cache.write(6, bad, expected=2)
    missing = {k: v for k, v in make_batch(4).items() if k != "uid"}
    with pytest.raises(zs.SchemaMismatchError, match=r"missing here: \['uid'\]"):
        cache.write(6, missing, expected=2)
    wider = dict(make_batch(4), input_ids=torch.zeros(4, 6, dtype=torch.int64))
    with pytest.raises(zs.SchemaMismatchError, match="shape"):
        cache.write(6, wider, expected=2)
    assert cache.status() == before
    cache.write(6, make_batch(2, seed=5), expected=2)
    assert cache.steps() == [6]


def test_fingerprint_mismatch(location: Any, fingerprint: dict, batch: dict) -> None:
    zs.open_cache(location, dict(fingerprint, seed=1)).write(1, batch)
    with pytest.raises(zs.FingerprintMismatchError, match=r"seed: stored 1, given 2"):
        zs.open_cache(location, dict(fingerprint, seed=2))
    other = zs.open_cache(location, dict(fingerprint, n=4))
    assert other.experiment != zs.open_cache(location, dict(fingerprint, seed=1)).experiment


def test_browse_without_fingerprint(location: Any, fingerprint: dict, batch: dict) -> None:
    zs.open_cache(location, fingerprint).write(1, batch)
    reader = zs.open_cache(location)
    assert reader.read_only and reader.experiment == "exp_proj/GBS4_N2_in8_out16"
    assert reader.experiments() == {"exp_proj/GBS4_N2_in8_out16": fingerprint}
    assert reader.steps() == [1]
    with pytest.raises(zs.ReadOnlyCacheError, match="read-only"):
        reader.write(2, batch)
    zs.open_cache(location, {"anything": "else"}).write(1, batch)
    several = zs.open_cache(location)
    assert len(several.experiments()) == 2
    with pytest.raises(zs.AmbiguousExperimentError, match="experiment=NAME"):
        several.steps()
    name = next(n for n in several.experiments() if n.startswith("fp-"))
    assert zs.open_cache(location, experiment=name).steps() == [1]
    with pytest.raises(zs.ExperimentNotFoundError):
        zs.open_cache(location, experiment="nope")


def test_newer_format_is_refused(tmp_path: Any, fingerprint: dict, batch: dict) -> None:
    zs.open_cache(tmp_path, fingerprint).write(1, batch)
    doc = json.loads((tmp_path / "zarr.json").read_text())
    doc["attributes"]["zarr_skip"]["version"] = 99
    (tmp_path / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(zs.FormatVersionError, match="version 99.*upgrade"):
        zs.open_cache(tmp_path)


def test_plain_zarr_group_is_not_a_cache(tmp_path: Any) -> None:
    zarr.open_group(tmp_path, mode="w")
    with pytest.raises(zs.MetadataError, match="not a zarr_skip cache"):
        zs.open_cache(tmp_path)


def test_zero_rows_and_empty_strings(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    empty = make_batch(0)
    cache.write(1, empty, expected=2)
    strings = {k: v for k, v in make_batch(2).items()}
    strings["uid"] = ["", ""]
    cache.write(1, strings, expected=2)
    view = cache.load(1)
    assert len(view) == 2
    assert view["uid"][:] == ["", ""]
    assert_equal(view.minibatches[0].to_dict(), empty)


@pytest.mark.parametrize("chunk_bytes", [None, 40], ids=["one-chunk", "many-chunks"])
def test_zarr_reads_the_same_arrays(tmp_path: Any, fingerprint: dict, chunk_bytes: int | None) -> None:
    batch = make_batch(11, seed=3)  # 11 rows: chunks of 40 bytes leave a partial last chunk
    cache = zs.open_cache(tmp_path, fingerprint, **({"chunk_bytes": chunk_bytes} if chunk_bytes else {}))
    info = cache.write(1, batch)
    (stored,) = cache.load(1)._parts
    for column, arrays in stored.arrays.items():  # every array, as zarr reads it, is what we read
        for name, array in arrays.items():
            if chunk_bytes and name in ("data", "values") and array.rows > array.chunk:
                assert array.rows % array.chunk, f"{column}/{name}: no partial last chunk"
                assert array.shard, f"{column}/{name}: several chunks, not one shard"
            ours = read_range(cache._storage, [array], 0, array.rows, array.dtype, array.shape[1:])
            assert array.file is not None and array.path.startswith(array.file + "/")
            with zarr.storage.ZipStore(tmp_path / array.file, mode="r") as zipped:  # the packed data file
                theirs = zarr.open_array(zipped, path=array.path[len(array.file) + 1 :], mode="r")[:]
            assert theirs.dtype == ours.dtype and np.array_equal(theirs, ours), f"{column}/{name}"
    part = zarr.open_group(tmp_path, mode="r")[info.path]
    assert sorted(p.name for p in (tmp_path / info.path).iterdir()) == sorted(
        [part.attrs["zarr_skip.part"]["data"], "zarr.json"]
    )
    data_name = part.attrs["zarr_skip.part"]["data"]
    assert (tmp_path / info.path / data_name).is_file() and data_name.endswith(".zip")
    with zarr.storage.ZipStore(tmp_path / info.path / data_name, mode="r") as zipped:
        group = zarr.open_group(zipped, mode="r")
        assert np.array_equal(group["input_ids"][:], batch["input_ids"].numpy())
        assert np.array_equal(group["responses/values"][:], batch["responses"].values().numpy())
        assert group["bf16"].dtype == np.dtype("uint16")


def test_dataproto_like_roundtrip(location: Any, fingerprint: dict) -> None:
    dp = zs.DataProtoLike(
        batch={"responses": torch.arange(6).reshape(3, 2), "mask": torch.ones(3, 2, dtype=torch.bool)},
        non_tensor_batch={
            "uid": np.array(["a", "b", "c"], dtype=object),
            "reward_model": np.array([{"ground_truth": "1"}] * 3, dtype=object),
        },
        meta_info={"global_steps": 2},
    )
    cache = zs.open_cache(location, fingerprint)
    cache.write(2, dp)
    back = cache.load(2).to_dataproto()
    assert back.meta_info == {"global_steps": 2}
    assert_equal(dict(back.batch.items()), dict(dp.batch.items()))
    assert_equal(back.non_tensor_batch, dp.non_tensor_batch)


def test_tensordict_roundtrip(location: Any, fingerprint: dict) -> None:
    from tensordict import TensorDict

    b = make_batch(4)
    td = TensorDict({k: v for k, v in b.items() if isinstance(v, torch.Tensor)}, batch_size=[4])
    cache = zs.open_cache(location, fingerprint)
    cache.write(1, td)
    back = cache.load(1).to_tensordict()
    assert back.batch_size == torch.Size([4])
    for k in td.keys():
        assert_equal(back[k], td[k], k)


def test_unsupported_column_stores_nothing(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    with pytest.raises(zs.UnsupportedColumnError, match=r"column 'x'"):
        cache.write(1, {"x": [object()]})
    assert cache.status() == []


def test_pickle_opt_in_through_the_store(location: Any, fingerprint: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    cache.write(1, {"x": [{1, 2}, {3}]}, allow_pickle=True)
    with pytest.raises(zs.UnsupportedColumnError, match="allow_pickle"):
        cache.load(1)["x"][:]
    assert cache.load(1, allow_pickle=True)["x"][:] == [{1, 2}, {3}]


def test_resolve_through_the_store(location: Any, fingerprint: dict, batch: dict) -> None:
    cache = zs.open_cache(location, fingerprint)
    for s in (2, 5):
        cache.write(s, batch)
    cache.write(4, batch, expected=2)  # partial
    assert [cache.resolve(s, action="cache") for s in (2, 4, 5)] == [2, None, 5]
    assert [cache.resolve(s, action="repeat") for s in (1, 2, 3, 4, 5, 9)] == [2, 2, 2, 2, 5, 5]
    with pytest.raises(zs.ConfigError, match="action"):
        cache.resolve(2, action="random")


def test_a_numpy_step_number_loads_and_resolves(tmp_path: Path, fingerprint: dict) -> None:
    """A step taken from an array or a table (``np.int64``) was refused by load() and resolve()
    ("expected a non-negative int, got np.int64(2)"), though info() and the datasets take it."""
    cache = zs.open_cache(tmp_path, fingerprint)
    cache.write(2, make_batch(3))
    steps = np.array(cache.steps())
    view = cache.load(steps[0])
    assert type(view.step) is int and view.step == 2 and len(view) == 3
    assert cache.resolve(np.int64(2)) == 2 and cache.resolve(np.uint8(7), action="repeat") == 2
    with pytest.raises(zs.ConfigError, match="non-negative int"):
        cache.load(np.int64(-1))


def test_new_run_replaces_an_interrupted_runs_leftovers(location: Any, fingerprint: dict, caplog: Any) -> None:
    old = zs.open_cache(location, fingerprint)
    old.write(3, make_batch(4, seed=1), expected=4)
    old.write(3, make_batch(4, seed=2), expected=4)
    new = zs.open_cache(location, fingerprint)
    fresh = [make_batch(3, seed=10 + i) for i in range(2)]
    info = new.write(3, fresh[0], expected=2)
    assert info.index == 0
    assert "discarding 2 mini-batch(es) left by run " + old.run_id in caplog.text
    new.write(3, fresh[1], expected=2)
    view = new.load(3)
    assert {p.run for p in view._parts} == {new.run_id}
    assert_equal(view.to_dict(), concat(fresh))
    with pytest.raises(zs.DisplacedWriterError, match="started after this run|took the step over while this run"):
        old.write(3, make_batch(4, seed=3), expected=4)
    assert new.status()[0].complete


def test_a_truncated_shard_is_missing_data(location: Any, fingerprint: dict) -> None:
    cache, batch, array = write_sharded(location, fingerprint)
    got = cache.load(3)["responses"][4:9]  # ranged reads within the shard
    assert [r.tolist() for r in got.unbind()] == [r.tolist() for r in batch["responses"].unbind()[4:9]]
    storage = cache._storage
    storage.set(array.key(0), storage.get(array.key(0))[: array.offset + sum(array.sizes[:2]) + 5])
    with pytest.raises(
        zs.MissingDataError, match=r"column 'responses', chunk \d+ \(bytes \d+\.\.\d+ of .*\.zip\): chunk has \d+ bytes"
    ):
        cache.load(3)["responses"][:]
    with pytest.raises(zs.MissingDataError, match=r"chunk \d+ \(bytes"):
        cache.load(3)["responses"][-1:]  # a range past the end of the object
    assert {p.kind for p in cache.verify(3).problems} == {"MissingDataError", "ChecksumError"}


def test_loading_a_complete_step_reads_its_summary_and_records_only(fingerprint: dict) -> None:
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint)
    parts = [make_batch(5, seed=i) for i in range(3)]
    for p in parts:
        cache.write(4, p, expected=3)
    store.reads.clear()
    view = cache.load(4)
    step_path = view._parts[0].path.rsplit("/", 2)[0]
    run = view._parts[0].run
    assert sorted(store.reads) == sorted(
        [f"{step_path}/zarr.json"] + [f"{step_path}/{run}/{i}/zarr.json" for i in range(3)]
    )
    assert_equal(view.to_dict(), concat(parts))
    # a new run rewriting the step: the summary no longer vouches, the full scan decides (the
    # step it replaces, until the new run completes it)
    info = zs.open_cache(store, fingerprint).write(4, make_batch(5, seed=9), expected=3, overwrite=True)
    store.reads.clear()
    assert_equal(cache.load(4).to_dict(), concat(parts))
    assert f"{step_path}/{info.run}/zarr.json" in store.reads


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None, [True]])
def test_a_flag_that_is_not_a_bool_is_refused_and_changes_nothing(
    tmp_path: Path, fingerprint: dict[str, Any], value: Any
) -> None:
    """``overwrite="false"`` replaced a complete step and ``allow_pickle="no"`` let pickles
    run (any truthy value counted as True): each flag that deletes, replaces or unpickles is
    True or False, else a ConfigTypeError naming it, before anything is read or written."""
    from zarr_skip.legacy.transfer import export_steps, import_legacy

    root = tmp_path / "cache"
    written = make_batch(6, seed=1)
    zs.open_cache(root, fingerprint).write(1, written)
    other = zs.open_cache(root, fingerprint)  # another run
    calls = {
        "overwrite": [
            lambda: other.write(1, make_batch(6, seed=2), overwrite=value),
            lambda: import_legacy(tmp_path / "no-dump", other, overwrite=value),
            lambda: export_steps(other, [1], tmp_path / "out", overwrite=value),
        ],
        "allow_pickle": [
            lambda: other.write(2, make_batch(6, seed=2), allow_pickle=value),
            lambda: other.load(1, allow_pickle=value),
            lambda: import_legacy(tmp_path / "no-dump", other, allow_pickle=value),
        ],
        "coerce_meta": [lambda: import_legacy(tmp_path / "no-dump", other, coerce_meta=value)],
        "dry_run": [lambda: other.gc(keep_last=0, dry_run=value)],
    }
    for name, tried in calls.items():
        for call in tried:
            with pytest.raises(zs.ConfigTypeError, match=f"{name}: expected True or False"):
                call()
    view = zs.open_cache(root).load(1)
    assert_equal(view.to_dict(), written)
    assert zs.open_cache(root).steps() == [1] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["x", 5, [print]])
def test_a_progress_that_is_not_callable_and_a_dump_dir_that_is_not_a_path_are_refused(
    tmp_path: Path, fingerprint: dict[str, Any], value: Any
) -> None:
    """They raised untyped TypeErrors once the work was under way (``verify``), or never
    (``import_legacy`` of no step); now a ConfigTypeError naming them, first."""
    from zarr_skip.legacy.transfer import export_steps, import_legacy

    cache = zs.open_cache(tmp_path / "cache", fingerprint)
    cache.write(1, make_batch(6, seed=1))
    for call in (
        lambda: cache.verify(progress=value),
        lambda: import_legacy(tmp_path, cache, progress=value),
        lambda: export_steps(cache, [1], tmp_path / "out", progress=value),
    ):
        with pytest.raises(zs.ConfigTypeError, match="progress: expected a callable or None"):
            call()
    if not isinstance(value, str):
        with pytest.raises(zs.ConfigTypeError, match="dump_dir: expected a path"):
            import_legacy(value, cache)
    assert not (tmp_path / "out").exists()
