"""``repr()`` of a cache, a step and a column is one line and makes no store request; the
listings are ``_repr_pretty_``'s (IPython) and ``_repr_html_``'s (Jupyter)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from IPython.lib.pretty import pretty
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import MemoryStore

import zarr_skip as zs


class RequestCountingStore(MemoryStore):
    """A MemoryStore counting every request made of it: reads, existence checks, listings."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: Counter[str] = Counter()

    def with_read_only(self, read_only: bool = False) -> RequestCountingStore:
        other = RequestCountingStore(self._store_dict, read_only=read_only)
        other.requests = self.requests
        return other

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        self.requests["get"] += 1
        return await super().get(key, prototype, byte_range)

    async def get_partial_values(self, prototype: BufferPrototype, key_ranges: Any) -> list[Buffer | None]:
        self.requests["get_partial_values"] += 1
        return await super().get_partial_values(prototype, key_ranges)

    async def exists(self, key: str) -> bool:
        self.requests["exists"] += 1
        return await super().exists(key)

    async def list(self) -> AsyncIterator[str]:
        self.requests["list"] += 1
        async for key in super().list():
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        self.requests["list_prefix"] += 1
        async for key in super().list_prefix(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        self.requests["list_dir"] += 1
        async for key in super().list_dir(prefix):
            yield key


def _written(fingerprint: dict[str, Any]) -> RequestCountingStore:
    store = RequestCountingStore()
    cache = zs.open_cache(store, fingerprint, chunk_bytes=64)
    for step in (1, 2):
        cache.write(step, {"scores": np.arange(40.0), "uid": [f"u{i}" for i in range(40)]})
    return store


def test_repr_makes_no_store_request(fingerprint: dict[str, Any]) -> None:
    store = _written(fingerprint)
    cache = zs.open_cache(store)
    view = cache.load(1)
    col = view["scores"]
    store.requests.clear()
    texts = [repr(cache), repr(view), repr(col), f"{cache!r} {view!r} {col!r}", str(cache), str(col)]
    assert store.requests == Counter()
    assert texts[0] == f"<zarr_skip.Cache {str(cache.location)!r} experiment={cache.experiment!r}>"
    assert texts[1] == "<zarr_skip.StepView step=1 rows=40 minibatches=1>"
    assert texts[2] == "<zarr_skip.LazyColumn 'scores' step=1 kind=ndarray dtype=<f8 rows=40>"
    assert all("\n" not in t for t in texts)


def test_the_listings_are_the_pretty_and_html_reprs(fingerprint: dict[str, Any]) -> None:
    store = _written(fingerprint)
    cache = zs.open_cache(store)
    view = cache.load(1)
    store.requests.clear()
    listing = pretty(cache)
    assert store.requests["list_dir"] >= 1  # the listing reads the steps' status
    assert listing.startswith(repr(cache) + "\n") and "2 steps: 2 complete" in listing
    assert "2 complete" in cache._repr_html_()
    assert pretty(view).startswith(repr(view) + "\n") and "meta_info" in pretty(view)
    column = pretty(view["scores"])
    assert column.startswith(repr(view["scores"]) + "\n") and "35 more rows" in column
