"""Text and HTML renderings: the right states and numbers, escaped, and reading almost nothing.

The listings are what IPython's pretty printer (``pretty(obj)``, a terminal's ``obj``) and
Jupyter show; ``repr(obj)`` is one line that reads nothing (tests/test_reprs.py)."""

from __future__ import annotations

import time
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest
import torch
from helpers import CountingStore, make_batch
from IPython.lib.pretty import pretty

import zarr_skip as zs
from zarr_skip.format import layout
from zarr_skip.store import fetching
from zarr_skip.views import display


class TagChecker(HTMLParser):
    """Fails on a closing tag that does not close the innermost open one."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, tag


def assert_balanced(page: str) -> None:
    checker = TagChecker()
    checker.feed(page)
    assert not checker.open, checker.open


def chunk_reads(store: CountingStore) -> set[str]:
    return {k for k in store.reads if "/c." in k and not k.endswith("zarr.json")}


@pytest.fixture
def store(fingerprint: dict[str, Any]) -> CountingStore:
    """Step 1 complete (2 mini-batches of 12 rows, several chunks per array), step 2 at 1/2."""
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint, chunk_bytes=64)
    cache.write(1, make_batch(12, seed=1), expected=2, meta_info={"note": "<script>alert(1)</script>"})
    cache.write(1, make_batch(12, seed=2, offset=6), expected=2, meta_info={"note": "<script>alert(1)</script>"})
    other = zs.open_cache(store, fingerprint, chunk_bytes=64)  # another run, still at work
    other.write(2, make_batch(12, seed=3), expected=2)
    return store


def test_cache_repr_shows_states_counts_and_bytes(store: CountingStore) -> None:
    cache = zs.open_cache(store)
    text = pretty(cache)
    info = cache.status()
    assert [i.state for i in info] == ["complete", "writing"]
    assert "2 steps: 1 complete, 1 writing; 36 rows" in text
    lines = text.splitlines()
    step1 = next(line for line in lines if line.split()[:2] == ["1", "complete"])
    assert "2/2" in step1 and " 24 " in step1 and display.human_bytes(info[0].nbytes_stored) in step1
    assert f"{info[0].ratio:.1f}x" in step1
    step2 = next(line for line in lines if line.split()[:2] == ["2", "writing"])
    assert "1/2" in step2 and " 12 " in step2
    # a writer that stopped sending heartbeats: with no lease left its step reads as abandoned
    time.sleep(0.01)
    assert "2  abandoned" in pretty(zs.open_cache(store, lease=0.0))


def test_cache_html_has_a_badge_per_state_and_reads_only_metadata(store: CountingStore) -> None:
    cache = zs.open_cache(store)
    store.reads.clear()
    page = cache._repr_html_()
    assert store.reads and all(k.endswith("zarr.json") for k in store.reads), sorted(store.reads)
    for state in ("complete", "writing"):
        fg, bg = display.STATE_COLOURS[state]
        assert f"color:{fg};background:{bg}" in page and f">{state}</span>" in page
    assert "1/2" in page and "2/2" in page and cache.experiment in page
    assert "<script" not in page and "http" not in page  # no scripts, no external assets
    abandoned = zs.open_cache(store, lease=0.0)._repr_html_()
    assert ">abandoned</span>" in abandoned and display.STATE_COLOURS["abandoned"][1] in abandoned
    view = cache.load(1)
    for html in (page, abandoned, view._repr_html_(), *(view[n]._repr_html_() for n in view.columns)):
        assert_balanced(html)


def test_large_cache_shows_first_and_last_steps_and_reads_only_those(
    fingerprint: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CountingStore()
    cache = zs.open_cache(store, fingerprint)
    for step in range(1, 10):
        cache.write(step, {"x": torch.arange(2)})
    monkeypatch.setattr(display, "MAX_STEPS", 6)
    reader = zs.open_cache(store)
    store.reads.clear()
    page = reader._repr_html_()
    shown = [1, 2, 3, 7, 8, 9]
    for step in range(1, 10):
        read = any(f"/{step}/" in k for k in store.reads)
        assert read == (step in shown), (step, sorted(store.reads))
    assert page.count(">complete</span>") == 6 and "3 more steps" in page and "9 steps" in page
    text = pretty(reader)
    assert "9 steps" in text and "…" in text and len([line for line in text.splitlines() if "complete" in line]) == 6


def test_several_experiments_are_listed_with_their_fingerprints(fingerprint: dict[str, Any]) -> None:
    store = CountingStore()
    zs.open_cache(store, fingerprint).write(1, {"x": torch.arange(2)})
    zs.open_cache(store, {"name": "<b>other</b>", "n": 4}).write(1, {"x": torch.arange(2)})
    cache = zs.open_cache(store)
    assert cache.experiment is None
    page, text = cache._repr_html_(), pretty(cache)
    names = list(cache.experiments())
    assert len(names) == 2 and all(n in page and n in text for n in names)
    assert "<b>other</b>" not in page and "&lt;b&gt;other&lt;/b&gt;" in page
    assert '"max_response_length":16' in text and "experiment=NAME" in text


def test_a_cache_without_experiments_says_so(fingerprint: dict[str, Any]) -> None:
    store = CountingStore()
    zs.open_cache(store, fingerprint).write(0, {"x": np.zeros(1)})
    for key in [k for k in store._store_dict if k != "zarr.json"]:  # keep the root group only
        del store._store_dict[key]
    cache = zs.open_cache(store)
    assert "no experiments" in pretty(cache) and "no experiments" in cache._repr_html_()


def test_step_rendering_reads_nothing_and_lists_columns_parts_meta(store: CountingStore) -> None:
    view = zs.open_cache(store).load(1)
    store.reads.clear()
    page, text = view._repr_html_(), pretty(view)
    assert not store.reads, sorted(store.reads)
    for name, spec in view.schema.items():
        assert f">{name}</td>" in page and name in text
        assert f">{display.row_shape(spec)}</td>" in page
    assert ">nested</td>" in page and ">bfloat16</td>" in page and ">(5,)</td>" in page and ">(*)</td>" in page
    assert display.human_bytes(view["responses"].nbytes_stored) in page
    for p in view.minibatch_info:
        assert p.run in page and p.run in text
    assert "2 mini-batches" in page and "24 rows" in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "meta_info: {" in text


def test_column_preview_reads_only_the_chunks_of_its_rows(
    store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the chunks asked for alone: not the few bytes between them a ranged read steps over (in
    # this tiny step, other chunks; test_packed pins those holes)
    monkeypatch.setattr(fetching, "MAX_HOLE_BYTES", 0)
    view = zs.open_cache(store).load(1)
    k = display.PREVIEW_ROWS
    for name in ("responses", "input_ids", "raw_prompt"):  # rows that do not repeat (stored plain)
        col = view[name]
        arrays = col._parts  # one {array name: ArrayPart} per mini-batch
        data = "values" if col.spec.jagged else "data"
        store.reads.clear()
        page = col._repr_html_()
        read = chunk_reads(store)
        first = arrays[0][data]
        member = layout.chunk_key(first.path, 0, len(first.shape), first.separator)  # in the data file
        if col.spec.jagged:
            ends = np.cumsum(col.lengths())
            count = (int(ends[k - 1]) - 1) // first.chunk + 1
            lengths = {layout.chunk_key(a["lengths"].path, 0, 1, a["lengths"].separator) for a in arrays}
        else:
            count = (k - 1) // first.chunk + 1
            lengths = set()
        assert read - lengths == {member}, (name, sorted(read))
        assert store.bytes_read[member] == sum(first.sizes[:count])  # the chunks of its rows alone
        assert len(first.sizes) > count, f"{name}: test needs more chunks than previewed"
        assert f"{len(view) - k} more rows" in page


def test_column_preview_formats_rows_compactly_and_escaped(fingerprint: dict[str, Any]) -> None:
    long = "<i>" + "x" * 500
    values = torch.arange(30)
    batch = {
        "responses": torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 20, 20, 30])),
        "text": [long, "a & b", "short"],
        "tags": [{"k": "<v>", "n": [1, 2]}, None, {"deep": {"x": 1.5}}],
        "bf16": torch.tensor([0.5, -1.25, 3.0]).bfloat16(),
        "obj": np.array([{1, 2}, {3}, set()], dtype=object),
    }
    cache = zs.open_cache(CountingStore(), fingerprint)
    cache.write(1, batch, allow_pickle=True)
    view = cache.load(1)
    text = pretty(view["responses"])
    assert "len    20  [0, 1, 2, 3, 4, 5, 6, 7, …]" in text and "len     0  []" in text
    page = view["text"]._repr_html_()
    assert "x" * 500 not in page and "…" in page and "&lt;i&gt;" in page and "a &amp; b" in page
    tags = pretty(view["tags"])
    assert '{"k":"<v>","n":[1,2]}' in tags and "null" in tags
    assert "&lt;v&gt;" in view["tags"]._repr_html_()
    assert "-1.25" in pretty(view["bf16"])
    assert "allow_pickle=True" in pretty(view["obj"])
    assert "{1, 2}" in pretty(cache.load(1, allow_pickle=True)["obj"])


def test_human_units() -> None:
    assert display.human_bytes(512) == "512 B"
    assert display.human_bytes(1536) == "1.5 KiB"
    assert display.human_bytes(3 * 1024**3) == "3.0 GiB"
    assert display.human_age(42) == "42 s"
    assert display.human_age(90) == "1.5 min"
    assert display.human_age(7200) == "2.0 h"
    assert display.human_age(-1) == "-"
