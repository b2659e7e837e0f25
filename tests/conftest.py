"""Shared fixtures: one ``location`` fixture runs the store suite over every backend."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from zarr.core.buffer import BufferPrototype
from zarr.storage import MemoryStore

import zarr_skip as zs

FINGERPRINT = {
    "experiment_name": "exp",
    "project_name": "proj",
    "gen_batch_size": 4,
    "n": 2,
    "max_prompt_length": 8,
    "max_response_length": 16,
}

logging.getLogger("zarr_skip").setLevel(logging.DEBUG)


class CountingStore(MemoryStore):
    """A MemoryStore that counts the keys read, to prove lazy reads touch only what they need."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: Counter[str] = Counter()
        self.bytes_read: Counter[str] = Counter()

    async def get(self, key: str, prototype: BufferPrototype, byte_range: Any = None) -> Any:
        buf = await super().get(key, prototype, byte_range)
        if key.endswith(".zip") and buf is not None and members(self, key):  # a data file: count what it holds
            start = 0 if byte_range is None else byte_range.start
            end = start + len(buf)
            for name, (offset, length) in members(self, key).items():
                overlap = min(end, offset + length) - max(start, offset)
                if overlap > 0 or (length == 0 and start <= offset < end):
                    self.reads[f"{key}/{name}"] += 1
                    self.bytes_read[f"{key}/{name}"] += max(0, overlap)
            return buf
        self.reads[key] += 1
        self.bytes_read[key] += 0 if buf is None else len(buf)
        return buf

    def with_read_only(self, read_only: bool = False) -> CountingStore:
        other = CountingStore(self._store_dict, read_only=read_only)
        other.reads = self.reads
        other.bytes_read = self.bytes_read
        return other


def members(store: MemoryStore, key: str) -> dict[str, tuple[int, int]]:
    """``(offset, length)`` of every member of the packed data file at ``key`` of ``store``."""
    import zipfile

    from zarr_skip.store.packed import members_of

    try:
        return members_of(store._store_dict[key].to_bytes())
    except (zipfile.BadZipFile, ValueError):  # damaged on purpose: counted as one key
        return {}


def zarr_array(root: Path, array: Any) -> Any:
    """The zarr array of a stored array (:class:`zarr_skip.store.reads.ArrayPart`), opened with
    plain zarr: from its mini-batch's data file (a ZIP, format 4) or its own directory."""
    import zarr

    if array.file is None:
        return zarr.open_array(str(root / array.path), mode="r")
    zipped = zarr.storage.ZipStore(root / array.file, mode="r")
    return zarr.open_array(zipped, path=array.path[len(array.file) + 1 :], mode="r")


class ChunkRegion:
    """The bytes of one array's chunk member (a chunk, or a shard with its index) inside a
    packed mini-batch's data file, handled like the chunk file it was in format 3: reading and
    overwriting it in place (a shorter value truncates the data file there), unlinking it
    (the data file goes), its path (the data file's, as error messages name it)."""

    def __init__(self, file: Path, offset: int, length: int) -> None:
        self.file, self.offset, self.length = file, offset, length

    def __fspath__(self) -> str:
        return str(self.file)

    def __str__(self) -> str:
        return str(self.file)

    def read_bytes(self) -> bytes:
        with open(self.file, "rb") as f:
            f.seek(self.offset)
            return f.read(self.length)

    def write_bytes(self, data: bytes) -> None:
        assert len(data) <= self.length, "a chunk cannot grow inside its data file"
        with open(self.file, "r+b") as f:
            f.seek(self.offset)
            f.write(data)
            if len(data) < self.length:
                f.truncate(self.offset + len(data))

    def unlink(self) -> None:
        self.file.unlink()


def chunk_region(part_dir: Path, column: str) -> ChunkRegion:
    """The chunk member of ``column`` (``name`` or ``name/values``) of the packed mini-batch
    whose directory is ``part_dir`` (its record names the data file)."""
    import json

    from zarr_skip.format import layout

    record = json.loads((part_dir / "zarr.json").read_text())["attributes"][layout.PART_ATTR]
    file = part_dir / record["data"]
    found = members_of_file(file)
    (name,) = [n for n in found if n.rpartition("/")[0] == column and n.rpartition("/")[2].startswith("c.")]
    return ChunkRegion(file, *found[name])


def members_of_file(file: Path) -> dict[str, tuple[int, int]]:
    """``(offset, length)`` of every member of a packed data file."""
    from zarr_skip.store.packed import members_of

    return members_of(file.read_bytes())


def unpack_to_tree(root: Path) -> int:
    """Rewrite every packed mini-batch below ``root`` the way format 3 laid it out: its data
    file's members as files of a data group directory (``w-{writer}/``), the record without
    ``container``, ``data_nbytes`` and offsets (re-checksummed). Returns the mini-batches
    unpacked."""
    import json
    import zipfile

    from zarr_skip.format import layout

    done = 0
    for meta in sorted(root.rglob("zarr.json")):
        doc = json.loads(meta.read_text())
        part = doc.get("attributes", {}).get(layout.PART_ATTR)
        if not part or part.get("container") != "zip":
            continue
        data = meta.parent / part["data"]
        tree = data.with_name(data.name.removesuffix(".zip"))
        with zipfile.ZipFile(data) as zf:
            zf.extractall(tree)
        data.unlink()
        part["data"] = tree.name
        del part["container"], part["data_nbytes"]
        for column in part["columns"].values():
            for array in column["arrays"].values():
                array.pop("offset", None)
        part["checksum"] = layout.doc_checksum(part)
        meta.write_text(json.dumps(doc))
        done += 1
    return done


def stored_bytes(store: MemoryStore, part: str) -> int:
    """Bytes stored under keys holding ``part``, members of packed data files included (as
    ``{data file}/{member}``)."""
    total = 0
    for key, value in store._store_dict.items():
        if key.endswith(".zip"):
            total += sum(n for name, (_, n) in members(store, key).items() if part in f"{key}/{name}")
        elif part in key:
            total += len(value)
    return total


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server (SeaweedFS) on loopback for the whole session."""
    from _s3server import seaweedfs_fixture_server

    with seaweedfs_fixture_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(params=["memory", "local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Where a cache lives: a zarr MemoryStore, a local directory, an s3:// URL on SeaweedFS.

    Tests open it as users do: ``zs.open_cache(location, ...)``; for S3 the location is a
    store object built from the URL and the server's credentials.
    """
    if request.param == "memory":
        return CountingStore()
    if request.param == "local":
        return tmp_path / "cache"
    server = request.getfixturevalue("s3_server")
    from zarr_skip.store._s3 import open_s3_store

    return open_s3_store(server.s3_url(f"t-{uuid.uuid4().hex[:12]}"), server.storage_options)


@pytest.fixture
def fingerprint() -> dict[str, Any]:
    return dict(FINGERPRINT)


def make_batch(rows: int = 6, seed: int = 0, *, offset: int = 0) -> dict[str, Any]:
    """A small rollout batch with every kind of column."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    lengths = torch.randint(0, 7, (rows,), generator=g)
    offsets = torch.zeros(rows + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    values = torch.randint(0, 151936, (int(offsets[-1]),), generator=g)
    return {
        "input_ids": torch.randint(0, 151936, (rows, 5), generator=g),
        "attention_mask": torch.randint(0, 2, (rows, 5), generator=g),
        "old_log_probs": torch.randn(rows, 5, generator=g),
        "bf16": torch.randn(rows, 3, generator=g).bfloat16(),
        "responses": torch.nested.nested_tensor_from_jagged(values, offsets=offsets),
        "uid": [f"uid-{offset + i // 2}" for i in range(rows)],
        "tags": [{"global_steps": 1, "status": "finished", "seq_len": int(n)} for n in lengths],
        "raw_prompt": np.array(
            [[{"role": "user", "content": f"q{offset + i}é"}] for i in range(rows)] + [None], dtype=object
        )[:rows],
        "scores": rng.standard_normal(rows).astype(np.float32),
    }


def write_sharded(location: Any, fingerprint: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """A cache whose step 3 stores ``responses`` values as a shard of many chunks: the cache,
    the batch written and that array's :class:`zarr_skip.store.reads.ArrayPart`."""
    cache = zs.open_cache(location, fingerprint, chunk_bytes=16)
    batch = make_batch(12, seed=5)
    cache.write(3, batch)
    (part,) = cache.load(3).parts
    array = part.arrays["responses"]["values"]
    assert array.shard and len(array.sizes) > 4
    return cache, batch, array


def assert_equal(a: Any, b: Any, where: str = "") -> None:
    """Bit-exact equality of restored values: same type, dtype, shape and bits."""
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.is_nested == b.is_nested, where
        if a.is_nested:
            la, lb = a.unbind(), b.unbind()
            assert len(la) == len(lb), where
            for i, (x, y) in enumerate(zip(la, lb, strict=True)):
                assert_equal(x.contiguous(), y.contiguous(), f"{where}[{i}]")
            return
        assert a.shape == b.shape, f"{where}: {a.shape} vs {b.shape}"
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        if a.dtype.is_complex or a.dtype.itemsize not in width:
            assert torch.equal(a, b), where
        else:
            assert torch.equal(
                a.contiguous().view(width[a.dtype.itemsize]), b.contiguous().view(width[b.dtype.itemsize])
            ), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                assert_equal(x, y, f"{where}[{i}]")
        else:
            assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, float):
        assert np.float64(a).tobytes() == np.float64(b).tobytes(), where
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def concat(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """What a step of several mini-batches loads as."""
    out: dict[str, Any] = {}
    for name, first in batches[0].items():
        vals = [b[name] for b in batches]
        if isinstance(first, torch.Tensor) and first.is_nested:
            lengths = torch.cat([v.offsets().diff() for v in vals])
            offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
            offsets[1:] = lengths.cumsum(0)
            values = torch.cat([v.values() for v in vals])
            out[name] = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
        elif isinstance(first, torch.Tensor):
            out[name] = torch.cat(vals)
        elif isinstance(first, np.ndarray):
            out[name] = np.concatenate(vals)
        else:
            out[name] = [x for v in vals for x in v]
    return out


@pytest.fixture
def chunk_jobs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``ChunkJobs`` made while the test runs (a write makes one), in order."""
    from zarr_skip.store import chunkjobs

    made: list[Any] = []
    init = chunkjobs.ChunkJobs.__init__

    def traced_init(self: chunkjobs.ChunkJobs, *args: Any) -> None:
        init(self, *args)
        made.append(self)

    monkeypatch.setattr(chunkjobs.ChunkJobs, "__init__", traced_init)
    return made


@pytest.fixture
def batch() -> dict[str, Any]:
    return make_batch()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fuse: needs FUSE mounts")
