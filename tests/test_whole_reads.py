"""Reading a whole step (``load(step).to_dict()``): what it costs beyond decoding, counted.

A small step is many tiny chunks (codes, lengths and values of every per-row object column)
and a few large ones (token ids, log-probs): the tiny ones are decoded in the calling thread
(handing each to a thread costs more than decoding it), the large ones by the pool's threads
and the calling thread together.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_equal, make_batch

import zarr_skip as zs
from zarr_skip.store import _localfs, reads


def _batch(rows: int = 64) -> dict[str, Any]:
    """Per-row objects (tiny chunks), two jagged columns of ~600 KiB (large chunks) and one of
    300 KiB (``hidden``, at 64 rows)."""
    batch = make_batch(rows)
    g = torch.Generator().manual_seed(3)
    batch["hidden"] = torch.randn(rows, 1200, generator=g)
    offsets = torch.arange(rows + 1, dtype=torch.int64) * 2500
    for name in ("responses", "old_log_probs"):
        values = torch.randint(0, 151936, (rows * 2500,), generator=g)
        batch[name] = torch.nested.nested_tensor_from_jagged(
            values if name == "responses" else values.float(), offsets=offsets
        )
    return batch


def test_small_chunks_are_decoded_in_the_calling_thread_large_ones_shared(
    tmp_path: Path, fingerprint: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = _batch()
    zs.open_cache(tmp_path, fingerprint).write(1, batch)
    view = zs.open_cache(tmp_path, fingerprint).load(1)
    decoded: list[tuple[int, bool]] = []  # (bytes the chunk decodes to, in the calling thread?)
    submitted: list[str] = []
    caller = threading.get_ident()
    decode, submit = reads._decode, _localfs.submit

    def traced(storage: Any, job: tuple[Any, ...], blob: Any) -> None:
        decoded.append((job[0].chunk_bytes, threading.get_ident() == caller))
        decode(storage, job, blob)

    def counted(fn: Any, *args: Any) -> Any:
        submitted.append(getattr(fn, "__name__", ""))
        return submit(fn, *args)

    monkeypatch.setattr(reads, "_decode", traced)
    monkeypatch.setattr(_localfs, "submit", counted)
    got = view.to_dict()
    small = [here for size, here in decoded if size <= reads.HANDOFF_BYTES]
    large = [size for size, _ in decoded if size > reads.HANDOFF_BYTES]
    assert len(small) > 10 and all(small), decoded  # every tiny chunk: no hand-over to a thread
    assert len(large) >= 2 and sum(large) > reads.SERIAL_DECODE_BYTES
    assert len(submitted) == min(len(large), _localfs.workers() - 1), submitted  # one task per helper
    assert_equal(got, batch)
    decoded.clear()
    submitted.clear()
    small_step = zs.open_cache(tmp_path, fingerprint).load(1).to_dict(["uid", "tags", "hidden"])
    assert 256 << 10 < sum(size for size, _ in decoded) <= reads.SERIAL_DECODE_BYTES
    assert all(here for _, here in decoded) and not submitted  # a small read wakes no thread
    assert_equal(small_step["hidden"], batch["hidden"])


def test_sharing_out_runs_each_item_once_and_raises_the_first_failure() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def run(x: int) -> None:
        if x == 7:
            raise ValueError("item 7")
        with lock:
            done.append(x)

    _localfs.share_out(run, list(range(20, 40)), list(range(5)))
    assert sorted(done) == [*range(5), *range(20, 40)]
    for items, mine in ((list(range(5, 30)), [1, 2]), (list(range(20, 30)), [1, 7, 2])):
        done.clear()
        with pytest.raises(ValueError, match="item 7"):
            _localfs.share_out(run, items, mine)
        assert len(done) == len(set(done)) and 7 not in done  # nothing twice
    assert 2 not in done  # this thread stopped at its own failure


def test_a_whole_read_equals_the_columns_read_one_by_one(tmp_path: Path, fingerprint: dict[str, Any]) -> None:
    cache = zs.open_cache(tmp_path, fingerprint)
    for i in range(3):
        cache.write(2, dict(_batch(32), scores=np.full(32, i, np.float32)), expected=3)
    view = zs.open_cache(tmp_path, fingerprint).load(2)
    got = view.to_dict()
    for name, value in got.items():
        assert_equal(value, view[name][:], name)


def test_reading_every_column_asks_the_kernel_for_the_data_files_first(
    tmp_path: Path, fingerprint: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold read's data files come from the disk while the columns' records are checked,
    not after: each is hinted (whole) before the first column is set up; a read of some rows
    or columns hints no whole data file."""
    from zarr_skip import lazy

    cache = zs.open_cache(tmp_path, fingerprint)
    for i in range(2):
        cache.write(1, make_batch(16, seed=i), expected=2)
    view = zs.open_cache(tmp_path, fingerprint).load(1)
    events: list[tuple[str, Any]] = []
    will_need, column = _localfs.Tree.will_need, lazy.LazyColumn.__init__

    def hinted(self: Any, key: str, start: int, length: int) -> None:
        events.append(("hint", (key, start, length)))
        will_need(self, key, start, length)

    def made(self: Any, *args: Any) -> None:
        events.append(("column", args[3]))
        column(self, *args)

    monkeypatch.setattr(_localfs.Tree, "will_need", hinted)
    monkeypatch.setattr(lazy.LazyColumn, "__init__", made)
    keys = {p.arrays["uid"]["values"].file for p in view._parts}
    files = {(key, 0, (tmp_path / key).stat().st_size) for key in keys if key}
    assert len(files) == 2 and all(n > 1000 for _, _, n in files)
    view["responses"][:5]
    view.to_dict(["uid"])
    assert not [e for e in events if e[1] in files], events
    fresh = zs.open_cache(tmp_path, fingerprint).load(1)
    events.clear()
    fresh.to_dict()
    assert {e[1] for e in events[:2]} == files and events[2][0] == "column", events[:3]


def test_to_dict_of_no_columns_reads_none_and_one_name_is_refused(tmp_path: Path, fingerprint: dict[str, Any]) -> None:
    """``to_dict([])`` is no column (it was every column: an iterable dataset made with
    ``columns=[]`` gave items of every column); a bare name is a typed error naming it."""
    from zarr_skip.data import RolloutIterableDataset

    cache = zs.open_cache(tmp_path, fingerprint)
    cache.write(1, make_batch(4))
    view = cache.load(1)
    assert view.to_dict([]) == {}
    with pytest.raises(zs.ConfigTypeError, match="wrap one name in a list"):
        view.to_dict("uid")  # type: ignore[arg-type]
    assert [list(item) for item in RolloutIterableDataset(tmp_path, columns=[])] == [["step", "minibatch", "row"]] * 4
