"""Shared test helpers: batches, a counting store, bit-exact comparison (fixtures stay in conftest.py).

Test modules import these as ``from helpers import make_batch`` (``tests/`` is on ``sys.path``
under pytest's default import mode); conftest.py holds only fixtures and hooks.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from zarr.core.buffer import BufferPrototype
from zarr.storage import MemoryStore

import zarr_skip as zs

__all__ = [
    "FINGERPRINT",
    "ChunkRegion",
    "CountingStore",
    "KeyRegion",
    "Keys",
    "assert_equal",
    "chunk_region",
    "concat",
    "make_batch",
    "members",
    "members_of_file",
    "split",
    "stored_bytes",
    "unpack_to_tree",
    "write_sharded",
    "zarr_array",
]

FINGERPRINT = {
    "experiment_name": "exp",
    "project_name": "proj",
    "gen_batch_size": 4,
    "n": 2,
    "max_prompt_length": 8,
    "max_response_length": 16,
}


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
    (part,) = cache.load(3)._parts
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


class Keys:
    """The raw keys of a cache wherever it lives (a MemoryStore, a directory, S3), to damage,
    move or inspect what it stored the same way on every backend, as a disk, a copy tool or
    another program would.

    Parameters
    ----------
    location : what the test passed to ``zs.open_cache`` (a Store, a path).
    """

    def __init__(self, location: Any) -> None:
        from zarr_skip.store.storage import Storage, open_store

        self.storage = Storage(open_store(location))

    def list(self, prefix: str = "") -> list[str]:
        """Every key below ``prefix`` (a 'directory'; ``""``: the whole cache), sorted."""
        prefix = prefix.rstrip("/")
        keys = self.storage.list_prefix(prefix)
        return sorted(k for k in keys if not prefix or k.startswith(prefix + "/"))

    def read(self, key: str) -> bytes:
        data = self.storage.get(key)
        assert data is not None, f"no key {key!r}"
        return data

    def write(self, key: str, data: bytes) -> None:
        self.storage.set(key, data)

    def delete(self, key: str) -> None:
        self.storage.delete(key)

    def exists(self, key: str) -> bool:
        return self.storage.get(key) is not None

    def path(self, key: str) -> str:
        """``key`` as messages name it: a file path for a directory, ``store/key`` otherwise."""
        return self.storage.key_path(key)

    def swap(self, a: str, b: str) -> None:
        """Exchange two keys, or everything below two prefixes ('directories')."""
        if self.exists(a) and self.exists(b):
            da, db = self.read(a), self.read(b)
            self.write(a, db)
            self.write(b, da)
            return
        moved = {k: self.read(k) for k in self.list(a) + self.list(b)}
        for key in moved:
            self.delete(key)
        for key, data in moved.items():
            target = b + key[len(a) :] if key.startswith(a + "/") else a + key[len(b) :]
            self.write(target, data)

    def edit(self, key: str, attr: str, fn: Any) -> None:
        """Change attribute ``attr`` of the zarr.json at ``key`` with ``fn`` (in place) and
        recompute its checksum, as a forger would."""
        from zarr_skip.format import layout

        doc = json.loads(self.read(key))
        fn(doc["attributes"][attr])
        doc["attributes"][attr]["checksum"] = layout.doc_checksum(doc["attributes"][attr])
        self.write(key, json.dumps(doc).encode())

    def dirs(self, prefix: str) -> list[str]:
        """The 'directories' right below ``prefix`` (those holding keys)."""
        depth = prefix.rstrip("/").count("/") + 1 if prefix else 0
        return sorted({"/".join(k.split("/")[: depth + 1]) for k in self.list(prefix) if k.count("/") > depth})

    def chunks(self, part_path: str, column: str) -> list[str]:
        """The chunk (or shard) keys of ``column`` (``name`` or ``name/values``) of the
        mini-batch at ``part_path``, in its writer's data group."""
        (data,) = self.dirs(part_path)
        array = f"{data}/{column}/"
        found = [k for k in self.list(array) if re.fullmatch(r"c([./]\d+)*", k[len(array) :])]
        assert found, f"no chunk of {column!r} below {data}"
        return found

    def data_file(self, part_path: str) -> str:
        """The key of the packed data file of the mini-batch at ``part_path`` (its record names it)."""
        from zarr_skip.format import layout

        record = json.loads(self.read(f"{part_path}/zarr.json"))["attributes"][layout.PART_ATTR]
        return f"{part_path}/{record['data']}"

    def region(self, part_path: str, column: str) -> KeyRegion:
        """The chunk member of ``column`` (``name`` or ``name/values``) inside the data file of
        the mini-batch at ``part_path``: ``(key, offset, length)`` with read and splice."""
        from zarr_skip.store.packed import members_of

        key = self.data_file(part_path)
        found = members_of(self.read(key))
        (name,) = [n for n in found if n.rpartition("/")[0] == column and n.rpartition("/")[2].startswith("c.")]
        return KeyRegion(self, key, *found[name])

    def member(self, part_path: str, name: str) -> KeyRegion:
        """Member ``name`` (e.g. ``input_ids/zarr.json``) of the data file of the mini-batch at
        ``part_path``, as a :class:`KeyRegion`."""
        from zarr_skip.store.packed import members_of

        key = self.data_file(part_path)
        return KeyRegion(self, key, *members_of(self.read(key))[name])

    def splice(self, key: str, offset: int, length: int, data: bytes) -> None:
        """Replace ``length`` bytes at ``offset`` of the object at ``key`` with ``data`` by
        reading it, splicing and writing it back (a shorter ``data`` cuts the object there)."""
        assert len(data) <= length, "a region cannot grow inside its object"
        whole = self.read(key)
        tail = whole[offset + length :] if len(data) == length else b""
        self.write(key, whole[:offset] + data + tail)


class KeyRegion:
    """A byte range of one object (a chunk member of a packed data file) on any backend,
    handled like the chunk file it was in format 3: read, overwritten (a shorter value cuts
    the object there), unlinked (the whole object goes), named as error messages name it."""

    def __init__(self, keys: Keys, key: str, offset: int, length: int) -> None:
        self.keys, self.key, self.offset, self.length = keys, key, offset, length

    def __str__(self) -> str:
        return self.keys.path(self.key)

    def read_bytes(self) -> bytes:
        return self.keys.read(self.key)[self.offset : self.offset + self.length]

    def write_bytes(self, data: bytes) -> None:
        self.keys.splice(self.key, self.offset, self.length, data)

    def unlink(self) -> None:
        self.keys.delete(self.key)


def split(batch: dict[str, Any], sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """``batch`` cut into mini-batches of ``sizes`` rows."""
    out, start = [], 0
    for size in sizes:
        part = {}
        for name, value in batch.items():
            if isinstance(value, torch.Tensor) and value.is_nested:
                rows = list(value.unbind())[start : start + size]
                part[name] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
            else:
                part[name] = value[start : start + size]
        out.append(part)
        start += size
    return out


def refaults(mib: int = 72) -> int:
    """Page faults of allocating ``mib`` MiB of 3 MiB arrays (below numpy's huge-page size)
    again after freeing them: about none where the allocator keeps what it frees (a settled
    DataLoader worker, ``zarr_skip.data._malloc``), thousands where it gives it back, as glibc
    does by default (it trims a free heap top above at most 64 MiB, and maps larger arrays on
    their own)."""
    import resource

    def touch() -> None:
        arrays = [np.ones(3 << 20, np.uint8) for _ in range(mib // 3)]
        del arrays

    touch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    touch()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


#: :func:`refaults` of each process, measured once (after its first items were read)
_REFAULTS: dict[int, int] = {}


def worker_state(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A collate function that reports the process it runs in: how many objects its garbage
    collector has frozen, its :func:`refaults` (measured once a process) and the batch's rows."""
    import gc
    import os

    if os.getpid() not in _REFAULTS:
        _REFAULTS[os.getpid()] = refaults()
    return {"frozen": gc.get_freeze_count(), "refaults": _REFAULTS[os.getpid()], "rows": len(items)}


def block_values(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` values of a kind blosc's blocks hold: ``tokens`` (uint32 ids), ``logprobs``
    (float32), ``lengths`` (uint16), ``mask`` (uint8, mostly ones), ``noise`` (uint64 that no
    compressor shrinks: blosc stores each block as it is) or ``mixed`` (uint64, blocks of zeros
    beside blocks of noise)."""
    rng = np.random.default_rng(seed)
    if kind == "tokens":
        return rng.integers(0, 151936, n).astype("<u4")
    if kind == "logprobs":
        return rng.normal(-1, 1, n).astype("<f4")
    if kind == "lengths":
        return rng.integers(1, 4000, n).astype("<u2")
    if kind == "mask":
        return (rng.random(n) < 0.9).astype("u1")
    noisy = rng.integers(0, 2**63, n, dtype=np.uint64)
    if kind == "noise":
        return noisy
    if kind != "mixed":
        raise ValueError(f"no values of kind {kind!r}")
    out = np.zeros(n, dtype="<u8")
    noise = (np.arange(n) // 2048) % 2 == 1  # every other 16 KiB
    out[noise] = noisy[noise]
    return out
