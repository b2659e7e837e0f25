"""The stored arrays of complete mini-batches, and reading rows of them.

A :class:`Part` is one complete mini-batch as its completion record describes it; an
:class:`ArrayPart` one of its arrays (a file per chunk, or one shard). :func:`read_ranges` and
a :class:`Batch` fetch the chunks holding the wanted rows of arrays concatenated across
mini-batches, concurrently, and decode each straight into the output when it can (a narrowed
chunk into the back of its rows, widened in place).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Any

import numpy as np

from zarr_skip.errors import MetadataError, SchemaMismatchError
from zarr_skip.format import chunks, layout, records
from zarr_skip.format.block_tables import BlockIndex
from zarr_skip.format.jsonvalues import from_json_value
from zarr_skip.format.specs import ColumnSpec
from zarr_skip.store import blockreads, fetching
from zarr_skip.store.fetching import fetch_chunks
from zarr_skip.store.memo import ChunkMemo
from zarr_skip.store.storage import Storage


@dataclass(frozen=True, slots=True)
class ArrayPart:
    """One stored array of one mini-batch."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunk: int
    sizes: tuple[int, ...]
    compression: chunks.Compression
    where: str
    separator: str = "/"
    shard: bool = False  # the chunks lie back to back in one file, chunk key 0
    #: of a jagged column's values: the row each chunk's first value belongs to (None if unknown)
    first_rows: tuple[int, ...] | None = None
    #: each chunk's crc32c as the record names it (None in records of older writers)
    crcs: tuple[int, ...] | None = None
    #: of a packed mini-batch (format 4): the key of its data file, and where chunk 0 of
    #: this array lies in it (its chunks follow back to back)
    file: str | None = None
    offset: int = 0
    #: of a chunk of several blosc blocks (in a record that indexes them, else None): where each
    #: block begins in the chunk (empty: read whole), and the crc32c of its header then of each
    #: block (see :mod:`zarr_skip.store.blockreads`)
    blocks: tuple[tuple[int, ...], ...] | None = None
    block_crcs: tuple[tuple[int, ...], ...] | None = None
    #: of a jagged column's lengths (in a record that keeps them, else None): where each row's
    #: values end, the lengths' running sums (:func:`records.value_ends`)
    value_ends: np.ndarray | None = field(default=None, repr=False, compare=False)
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)  # of chunks in a shard
    first_key: str = field(init=False, repr=False, compare=False)  # of chunk 0 (or the shard)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", tuple(accumulate(self.sizes, initial=0)))
        first = self.file if self.file is not None else layout.chunk_key(self.path, 0, len(self.shape), self.separator)
        object.__setattr__(self, "first_key", first)

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def chunk_bytes(self) -> int:
        """The bytes a full chunk decodes to."""
        return self.chunk * math.prod(self.shape[1:]) * self.dtype.itemsize

    def key(self, i: int) -> str:
        """The key holding chunk ``i``."""
        if i == 0 or self.shard or self.file is not None:
            return self.first_key
        return layout.chunk_key(self.path, i, len(self.shape), self.separator)

    def span(self, i: int) -> tuple[int, int] | None:
        """Where chunk ``i`` lies in its data file or shard (``(start, length)``), None if it
        is a file of its own."""
        if self.file is not None:
            return (self.offset + self.starts[i], self.sizes[i])
        return (self.starts[i], self.sizes[i]) if self.shard else None

    def chunks_of_rows(self, start: int, stop: int) -> range | None:
        """The chunks of these values that hold rows ``start:stop`` of their column (at most one
        more), known without the rows' lengths; None when this array does not say."""
        if len(self.sizes) <= 1:
            return range(len(self.sizes) if start < stop else 0)
        if self.first_rows is None:
            return None
        return chunks.chunks_of_rows(self.first_rows, start, stop)

    def describe(self, storage: Storage, i: int) -> str:
        """Chunk ``i`` for messages: its file, and its place in the shard."""
        path = storage.key_path(self.key(i))
        if self.file is not None:
            start = self.offset + self.starts[i]
            return f"{self.where}, chunk {i} (bytes {start}..{start + self.sizes[i]} of {path})"
        return f"{self.where}, chunk {i} of shard {path}" if self.shard else f"{self.where}, chunk {path}"

    def crc(self, i: int) -> int | None:
        """The crc32c chunk ``i`` must have (None: not recorded)."""
        return None if self.crcs is None else self.crcs[i]


@dataclass(frozen=True, slots=True)
class Part:
    """One complete mini-batch: where it is and what its metadata says."""

    step: int
    index: int
    run: str
    path: str
    rows: int
    meta_info: dict[str, Any]
    batch_type: str
    specs: dict[str, ColumnSpec]
    arrays: Mapping[str, dict[str, ArrayPart]]
    nbytes: int
    raw_nbytes: int
    #: of a packed mini-batch (format 4): the key and size of its data file
    data_file: tuple[str, int] | None = None
    #: each column's logical size (numpy's ``nbytes`` as it reads back) where the record holds it
    #: (records written before it was recorded count a column's stored arrays instead)
    logical: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_doc(
        cls, step: int, path: str, doc: Mapping[str, Any], experiment: str | None = None, *, sealed: bool = False
    ) -> Part:
        """The mini-batch a complete record at ``path`` describes, every number in it checked
        (:mod:`zarr_skip.format.records`); ``experiment``: the one it must belong to;
        ``sealed``: its checksum already checked on the bytes it was read from.

        Raises
        ------
        MetadataError
            The record's checksum does not match, it belongs to another place, or a count,
            shape or size in it is out of bounds or inconsistent.
        """
        where = f"step {step}, mini-batch {doc.get('index')!r:.20}: {path}"
        if not sealed:
            _check_checksum(doc, step, path, where)
        records.check_place(doc, records.Place(experiment, step), where)
        records.check_frame(doc, where)
        try:
            index = int(doc["index"])
            data = layout.join(path, _contained(doc["data"], "data group", path))
            packed = doc.get("container") == layout.CONTAINER
            specs, logical = {}, {}
            for name, entry in doc["columns"].items():
                _contained(name, "column", path, layout.column_name_problem)
                specs[name] = ColumnSpec.from_json(name, entry)
                if "nbytes" in entry:
                    logical[name] = records.count(entry["nbytes"], f"column {name!r} nbytes", where)
            return cls(
                step,
                index,
                str(doc["run"]),
                path,
                int(doc["rows"]),
                from_json_value(doc.get("meta_info", {})),
                str(doc.get("batch_type", "mapping")),
                specs,
                ColumnArrays(
                    doc,
                    data,
                    chunks.Compression(**doc["compression"]),
                    where,
                    f"step {step}, mini-batch {index}",
                    packed,
                ),
                int(doc["nbytes"]),
                int(doc.get("raw_nbytes", 0)),
                (data, int(doc["data_nbytes"])) if packed else None,  # bounded by check_frame
                logical,
            )
        except MetadataError:
            raise
        except (KeyError, TypeError, ValueError, RecursionError, MemoryError) as exc:
            raise MetadataError(f"step {step}, {path}: malformed mini-batch metadata ({exc!r:.200})") from None

    def check_columns(self) -> None:
        """Check every column's entries now (MetadataError for the first one that is off),
        not when each is first used."""
        for name in self.arrays:
            self.arrays[name]


def _check_checksum(doc: Mapping[str, Any], step: int, path: str, where: str) -> None:
    """MetadataError unless the record's ``checksum`` is that of its canonical JSON."""
    try:
        checksum = layout.doc_checksum(doc)
    except (RecursionError, MemoryError, TypeError, ValueError) as exc:
        raise MetadataError(f"{where}: metadata cannot be checked ({type(exc).__name__})") from None
    if doc.get("checksum") != checksum:
        raise MetadataError(
            f"step {step}, mini-batch {doc.get('index')}: metadata checksum mismatch at {path} "
            "(the zarr.json was altered after it was written)"
        )


class ColumnArrays(Mapping[str, dict[str, ArrayPart]]):
    """A mini-batch's stored arrays, column by column: each column's entries in the record are
    checked (:func:`records.check_column`) and made into :class:`ArrayPart` when the column is
    first used, so reading a few columns of many steps costs those columns alone."""

    __slots__ = ("_built", "_data", "_default", "_doc", "_label", "_packed", "_where")

    def __init__(
        self,
        doc: Mapping[str, Any],
        data: str,
        default: chunks.Compression,
        where: str,
        label: str,
        packed: bool = False,
    ) -> None:
        self._doc, self._data, self._default, self._where, self._label = doc, data, default, where, label
        self._packed = packed  # ``data`` is the key of the mini-batch's data file
        self._built: dict[str, dict[str, ArrayPart]] = {}

    def __getitem__(self, name: str) -> dict[str, ArrayPart]:
        built = self._built.get(name)
        if built is None:
            if name not in self._doc["columns"]:
                raise KeyError(name)
            built = self._built[name] = self._build(name)
        return built

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc["columns"])

    def __len__(self) -> int:
        return len(self._doc["columns"])

    def _build(self, name: str) -> dict[str, ArrayPart]:
        doc, where = self._doc, self._where
        indexes = records.check_column(doc, name, where)
        ends = records.value_ends(doc, name, where)
        entry = doc["columns"][name]
        multi = len(entry["arrays"]) > 1
        for aname in entry["arrays"]:
            _contained(aname, f"array of column {name!r}", where)
        try:
            return {
                aname: self._array(name, aname, a, multi, indexes[aname], ends if aname == "lengths" else None)
                for aname, a in entry["arrays"].items()
            }
        except MetadataError:
            raise
        except (KeyError, TypeError, ValueError, RecursionError, MemoryError) as exc:
            raise MetadataError(f"{where}, column {name!r}: malformed metadata ({exc!r:.200})") from None

    def _array(
        self,
        name: str,
        aname: str,
        a: Mapping[str, Any],
        multi: bool,
        index: BlockIndex | None,
        ends: np.ndarray | None,
    ) -> ArrayPart:
        """Array ``aname`` of column ``name`` (``multi``: one of several) from its record entry
        ``a``, block ``index`` and value ``ends``, all checked (:func:`records.check_column`,
        :func:`records.value_ends`)."""
        blocks = index if self._packed else None
        return ArrayPart(
            path=layout.join(self._data, name, aname) if multi else layout.join(self._data, name),
            dtype=records.parse_dtype(a["dtype"]),
            shape=tuple(a["shape"]),
            chunk=int(a["chunk"]),
            sizes=tuple(a["sizes"]),
            compression=_compression(a["codec"]) if "codec" in a else self._default,
            where=f"{self._label}, column {name!r}",
            separator=_separator(a.get("separator", "/")),
            shard=a.get("shard", False) is True,
            first_rows=_first_rows(a.get("first_rows"), len(a["sizes"])),
            crcs=None if a.get("crc32c") is None else tuple(a["crc32c"]),
            file=self._data if self._packed else None,
            offset=int(a.get("offset", 0)) if self._packed else 0,
            blocks=None if blocks is None else blocks[0],
            block_crcs=None if blocks is None else blocks[1],
            value_ends=ends,
        )


@functools.lru_cache(maxsize=256)
def _compression_of(items: tuple[tuple[str, Any], ...]) -> chunks.Compression:
    return chunks.Compression(**dict(items))


def _compression(codec: Any) -> chunks.Compression:
    """``Compression(**codec)`` of a record's codec entry, made (and checked) once per setting."""
    if isinstance(codec, dict) and all(type(v) in (str, int) for v in codec.values()):
        return _compression_of(tuple(sorted(codec.items())))
    return chunks.Compression(**codec)


def checked_lengths(lengths: np.ndarray, parts: Sequence[Mapping[str, ArrayPart]]) -> np.ndarray:
    """``lengths`` of the plain mini-batches ``parts`` concatenated, once each mini-batch's are
    known to be non-negative, to add to the values its record says it stored, and to be the
    ones its record's ``value_ends`` say (else a MetadataError, never rows cut from the wrong
    values)."""
    records.split_lengths(
        lengths,
        [a["lengths"].rows for a in parts],
        [a["values"].rows for a in parts],
        [a["lengths"].where for a in parts],
        [a["lengths"].value_ends for a in parts],
    )
    return lengths


def checked_entries(a: Mapping[str, ArrayPart], codes: np.ndarray | None, lengths: np.ndarray) -> None:
    """The ``lengths`` (and ``codes``, of a dictionary-encoded mini-batch) of one mini-batch's
    column, checked against its stored values, its record's ``value_ends`` and its entries."""
    records.check_lengths(lengths, a["values"].rows, a["lengths"].where)
    records.check_ends_agree(lengths, a["lengths"].value_ends, a["lengths"].where)
    if codes is not None:
        records.check_codes(codes, len(lengths), a["codes"].where)


def _contained(name: Any, what: str, path: str, problem: Callable[[object], str | None] = layout.name_problem) -> str:
    """``name`` from a stored record, refused unless it is one key segment inside the cache
    (a crafted ``../../x`` must not make a reader open files elsewhere)."""
    why = problem(name)
    if why is not None:
        raise MetadataError(f"{path}: the record's {what} name {name!r} is not a name inside the cache ({why})")
    return str(name)


def _first_rows(value: Any, count: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    first = tuple(int(r) for r in value)
    if len(first) != count or any(b < a for a, b in pairwise(first)):
        raise ValueError(f"first_rows {value!r} for {count} chunks")
    return first


def _separator(value: Any) -> str:
    if value not in ("/", "."):
        raise ValueError(f"chunk key separator {value!r}")
    return str(value)


def _check_shape(parts: Sequence[ArrayPart], trailing: tuple[int, ...]) -> None:
    for a in parts:
        if tuple(a.shape[1:]) != tuple(trailing):
            raise SchemaMismatchError(
                f"{a.where}: stored array {a.path} has trailing shape {a.shape[1:]}, expected {trailing}"
            )


def _alloc(shape: tuple[int, ...], dtype: np.dtype, parts: Sequence[ArrayPart]) -> np.ndarray:
    """The output of a read; a shape the memory cannot hold (a record lying about its size,
    past the bounds :func:`records.check_part` can see) is a MetadataError, not a MemoryError."""
    try:
        return np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError) as exc:
        where = parts[0].where if parts else "a read"
        raise MetadataError(
            f"{where}: the stored shapes ask for {shape} of {dtype}, which cannot be allocated ({exc})"
        ) from None


#: chunks decoding to at most this many bytes are decoded in the calling thread (see
#: :func:`_decode_jobs`)
SMALL_CHUNK_BYTES = 64 << 10

#: rows ``start:stop`` of arrays concatenated along axis 0, as ``dtype`` with ``trailing`` shape
Range = tuple[Sequence[ArrayPart], int, int, np.dtype, tuple[int, ...]]

#: stored bytes of chunks fetched ahead of their decoding, by (array path, chunk index)
Fetched = dict[tuple[str, int], "bytes | None"]


def read_range(
    storage: Storage,
    parts: Sequence[ArrayPart],
    start: int,
    stop: int,
    dtype: np.dtype,
    trailing: tuple[int, ...],
    *,
    fetched: Fetched | None = None,
) -> np.ndarray:
    """Rows ``start:stop`` of arrays concatenated along axis 0, decoded into one output."""
    return read_ranges(storage, [(parts, start, stop, dtype, trailing)], fetched=fetched)[0]


def read_ranges(
    storage: Storage,
    ranges: Sequence[Range],
    *,
    prefetch: Sequence[tuple[ArrayPart, int]] = (),
    fetched: Fetched | None = None,
) -> list[np.ndarray]:
    """Several :func:`read_range` at once: their chunks are fetched and decoded together.

    ``prefetch``: chunks (of other arrays) a later call will decode: from an object store they
    are fetched in this batch into ``fetched`` (the later call decodes them from there); from
    local files the kernel is asked to read them meanwhile (:meth:`Storage.read_ahead`).
    """
    batch = Batch()
    outs = [batch.range(*r) for r in ranges]
    batch.prefetch += prefetch
    batch.run(storage, fetched)
    return outs


@dataclass(frozen=True, slots=True)
class Runs:
    """Runs of rows of one chunk and where each goes in the output: ``(rows in the chunk, rows
    of the output)`` slice pairs (the values of chosen rows of a jagged column)."""

    pairs: tuple[tuple[slice, slice], ...]


#: :meth:`Batch.runs` is given at most this many runs (more: value by value, with :meth:`Batch.index`)
MAX_RUNS = 4096


class Batch:
    """Reads of rows of several arrays gathered, then fetched and decoded in one round.

    :meth:`range`, :meth:`index` and :meth:`runs` each hand back their output at once, filled
    by :meth:`run`: so the rows of many columns (of many steps) wait for one round of requests
    and each chunk is fetched and decoded once, however many of them want its rows.
    """

    __slots__ = ("few", "jobs", "prefetch")

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, ...]] = []
        self.prefetch: list[tuple[ArrayPart, int]] = []
        self.few = False  # chosen rows among them (decoded in the pool from a smaller size on)

    def range(
        self, parts: Sequence[ArrayPart], start: int, stop: int, dtype: np.dtype, trailing: tuple[int, ...]
    ) -> np.ndarray:
        """Rows ``start:stop`` of ``parts`` concatenated (as :func:`read_range`)."""
        _check_shape(parts, trailing)
        out = _alloc((stop - start, *trailing), dtype, parts)
        base = 0
        for a in parts:
            lo, hi = max(start, base), min(stop, base + a.rows)
            if lo < hi and a.sizes:
                for c in range((lo - base) // a.chunk, (hi - base - 1) // a.chunk + 1):
                    c0 = base + c * a.chunk
                    c1 = min(c0 + a.chunk, base + a.rows)
                    s0, s1 = max(lo, c0), min(hi, c1)
                    self.jobs.append((a, c, c1 - c0, slice(s0 - c0, s1 - c0), slice(s0 - start, s1 - start), out))
            base += a.rows
        return out

    def index(
        self, parts: Sequence[ArrayPart], idx: np.ndarray, dtype: np.dtype, trailing: tuple[int, ...]
    ) -> np.ndarray:
        """Rows ``idx`` (any order, repeats allowed) of ``parts`` concatenated along axis 0."""
        _check_shape(parts, trailing)
        out = _alloc((len(idx), *trailing), dtype, parts)
        if not len(idx):
            return out
        self.few = True
        starts = np.cumsum([0] + [a.rows for a in parts])
        which = np.searchsorted(starts, idx, side="right") - 1
        # one global chunk number per row (mini-batch by mini-batch), grouped by a stable sort: a
        # few hundred thousand values of a few rows group in one pass, not one per chunk
        firsts = np.cumsum([0] + [len(a.sizes) for a in parts])
        per = np.array([max(1, a.chunk) for a in parts], dtype=np.int64)
        local = idx - starts[which]
        glob = firsts[which] + local // per[which]
        order = np.argsort(glob, kind="stable")
        grouped = glob[order]
        cuts = np.flatnonzero(np.diff(grouped)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(order)], strict=True):
            sel = order[lo:hi]
            p = int(which[sel[0]])
            a = parts[p]
            c = int(grouped[lo] - firsts[p])
            n = min(a.chunk, a.rows - c * a.chunk)
            self.jobs.append((a, c, n, local[sel] - c * a.chunk, sel, out))
        return out

    def runs(
        self,
        parts: Sequence[ArrayPart],
        starts: np.ndarray,
        lengths: np.ndarray,
        dtype: np.dtype,
        trailing: tuple[int, ...],
    ) -> np.ndarray:
        """Rows ``starts[i] : starts[i] + lengths[i]`` of ``parts`` concatenated, run after run
        (the values of chosen rows of a jagged column): each run is copied from its chunks as
        slices, not gathered row by row as :meth:`index` does (at most :data:`MAX_RUNS`)."""
        _check_shape(parts, trailing)
        out = _alloc((int(lengths.sum()), *trailing), dtype, parts)
        self.few = True
        bases = list(accumulate((a.rows for a in parts), initial=0))
        found: dict[tuple[int, int], list[tuple[slice, slice]]] = {}
        at = 0
        for start, n in zip(starts.tolist(), lengths.tolist(), strict=True):
            stop = start + n
            while start < stop:
                p = bisect.bisect_right(bases, start) - 1
                a, base = parts[p], bases[p]
                c = (start - base) // a.chunk
                first = base + c * a.chunk
                end = min(stop, first + a.chunk)
                found.setdefault((p, c), []).append((slice(start - first, end - first), slice(at, at + end - start)))
                at, start = at + end - start, end
        self.jobs += [
            (parts[p], c, min(parts[p].chunk, parts[p].rows - c * parts[p].chunk), Runs(tuple(pairs)), None, out)
            for (p, c), pairs in found.items()
        ]
        return out

    def run(self, storage: Storage, fetched: Fetched | None = None, memo: ChunkMemo | None = None) -> None:
        """Fetch and decode every read gathered (and fetch the ``prefetch`` chunks into
        ``fetched``), then start anew. With a ``memo``, small chunks it holds are copied from
        it, and those it may hold that are decoded here are kept in it."""
        if self.jobs or self.prefetch:
            jobs, kept = (self.jobs, []) if memo is None else _through_memo(storage, self.jobs, memo)
            _decode_jobs(storage, jobs, self.prefetch, fetched, few=self.few)
            for key, whole, (_, _, _, src, dst, out) in kept:
                memo.put(key, whole)  # type: ignore[union-attr]  # kept is empty without a memo
                _put(out, dst, whole, src)
        self.jobs, self.prefetch, self.few = [], [], False


def _through_memo(
    storage: Storage, jobs: list[tuple[Any, ...]], memo: ChunkMemo
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, np.ndarray, tuple[Any, ...]]]]:
    """The jobs left to decode once those of chunks ``memo`` holds are copied from it, and, for
    each chunk it may hold (small, with a recorded crc32c), its key, the array it is decoded
    into whole (its job made to do that) and its job (whose rows are copied from that array)."""
    left, kept = [], []
    for job in jobs:
        a, c, n = job[0], job[1], job[2]
        if a.crc(c) is None or a.chunk_bytes > memo.max_chunk_bytes:
            left.append(job)
            continue
        key = (storage.key_path(a.key(c)), a.span(c), a.sizes[c], a.crc(c))
        found = memo.get(key)
        if found is not None:
            _put(job[5], job[4], found, job[3])
            continue
        whole = _alloc((n, *a.shape[1:]), a.dtype, [a])
        left.append((a, c, n, slice(0, n), slice(0, n), whole))
        kept.append((key, whole, job))
    return left, kept


#: a read in rounds (see :func:`read_rounds`): a generator that yields each round's reads (a
#: :class:`Batch`), resumed once they are done, and returns what it read
Reader = Generator[Batch, None, Any]


def read_rounds(storage: Storage, readers: Sequence[Reader], *, memo: ChunkMemo | None = None) -> list[Any]:
    """What each reader returns, the readers run together: the batches they yield in their
    first round are run as one (one round of requests, each chunk decoded once), then each is
    resumed and the batches of their second round run as one, and so on. So many reads in two
    rounds (the lengths of jagged columns, then their values) take two rounds together. Chunks
    fetched ahead in one round (``prefetch``) are decoded from there in a later one. ``memo``:
    small decoded chunks kept across reads (see :mod:`zarr_skip.store.memo`)."""
    fetched: Fetched = {}
    results: list[Any] = [None] * len(readers)
    live = list(enumerate(readers))
    while live:
        merged, still = Batch(), []
        for k, reader in live:
            try:
                batch = next(reader)
            except StopIteration as stop:
                results[k] = stop.value
                continue
            merged.jobs += batch.jobs
            merged.prefetch += batch.prefetch
            merged.few |= batch.few
            still.append((k, reader))
        merged.run(storage, fetched, memo)
        live = still
    return results


def _decode_jobs(
    storage: Storage,
    jobs: list[tuple[Any, ...]],
    prefetch: Sequence[tuple[ArrayPart, int]] = (),
    fetched: Fetched | None = None,
    *,
    few: bool = False,
) -> None:
    """Fetch and decode chunks concurrently, each straight into its output when it can (and
    fetch the ``prefetch`` chunks into ``fetched``; chunks found there are not fetched again).
    A few rows of a chunk of several blosc blocks fetch and decode only the blocks holding them
    (:mod:`zarr_skip.store.blockreads`). ``few``: chosen rows (:meth:`Batch.runs`,
    :meth:`Batch.index`), decoded in the pool from a smaller size on."""
    fetched = {} if fetched is None else fetched
    ready = [job for job in jobs if (job[0].path, job[1]) in fetched]
    todo: list[tuple[Any, ...]] = [job for job in jobs if (job[0].path, job[1]) not in fetched]
    ahead = [(a, c) for a, c in prefetch if (a.path, c) not in fetched]
    if ahead and not storage.read_ahead([(a.key(c), a.span(c)) for a, c in ahead]):
        todo += ahead
    gap = storage.hole_bytes  # an object store's: some blocks of chunks read in few requests
    plans = [blockreads.plan(job[0], job[1], _rows_wanted(job[3]), gap) if len(job) > 2 else None for job in todo]
    whole = [job for job, p in zip(todo, plans, strict=True) if p is None]
    pieces = [(piece, 0) for p in plans if p is not None for piece in p.pieces]
    hole = gap if gap is not None and (few or pieces) else fetching.MAX_HOLE_BYTES
    blobs = iter(fetch_chunks(storage, [*whole, *pieces], hole))
    work: list[tuple[tuple[Any, ...], Any]] = []
    for job, blob in zip(whole, blobs, strict=False):
        if len(job) == 2:  # fetched ahead: a later call decodes it
            fetched[job[0].path, job[1]] = blob
        else:
            work.append((job, blob))
    for job, p in zip(todo, plans, strict=True):
        if p is not None:
            work.append((job, (p, [next(blobs) for _ in p.pieces])))
    work += [(job, fetched[job[0].path, job[1]]) for job in ready]
    # a read of whole chunks of up to a MiB (of chosen rows: 256 KiB) costs less than waking
    # the pool's threads for it; in larger ones, small chunks cost more to hand to a thread than
    # to decode (Python work, under the GIL): they are decoded here while the pool's threads
    # start on the others, and this thread then pulls the rest with them (a static share per
    # thread left this one idle: 64 random rows of the medium step took 16.5-17 ms that way,
    # 13-14 ms this way, quiet)
    costs = [blob[0].nbytes if isinstance(blob, tuple) else job[0].chunk_bytes for job, blob in work]
    if sum(costs) <= (PARALLEL_DECODE_BYTES if few else SERIAL_DECODE_BYTES):
        for job, blob in work:
            _decode(storage, job, blob)
        return
    mine = [item for item, cost in zip(work, costs, strict=True) if cost <= HANDOFF_BYTES]
    shared = [item for item, cost in zip(work, costs, strict=True) if cost > HANDOFF_BYTES]
    storage.share_out(lambda item: _decode(storage, *item), shared, mine)


def _decode(storage: Storage, job: tuple[Any, ...], blob: Any) -> None:
    """Decode rows ``src`` of chunk ``c`` of ``a`` (its ``n`` rows) into ``out[dst]``, from
    its stored bytes or (a tuple) the plan and pieces of some of its blocks."""
    a, c, n, src, dst, out = job
    where = a.describe(storage, c)
    if isinstance(blob, tuple):
        block_plan, pieces = blob
        moved = (
            Runs(tuple((block_plan.moved(s), d) for s, d in src.pairs))
            if isinstance(src, Runs)
            else block_plan.moved(src)
        )
        _put(out, dst, blockreads.decode(block_plan, pieces, where), moved)
        return
    size, crc = a.sizes[c], a.crc(c)
    if n < a.chunk:  # the last chunk: zarr stores it at the full chunk shape
        rows = chunks.decode_rows(
            blob, a.dtype, a.shape[1:], n, a.compression, stored_size=size, where=where, crc=crc, chunk=a.chunk
        )
        _put(out, dst, rows, src)
        return
    whole = isinstance(src, slice) and src == slice(0, n) and isinstance(dst, slice)
    if whole and a.dtype == out.dtype:
        chunks.decode_into(blob, out[dst], a.compression, stored_size=size, where=where, crc=crc)
    elif whole and a.dtype.kind in "iu" and out.dtype.kind in "iu" and a.dtype.itemsize < out.dtype.itemsize:
        region = out[dst]
        if region.nbytes <= SMALL_CHUNK_BYTES:  # decoded apart and widened in one copy
            tmp = np.empty((n, *a.shape[1:]), dtype=a.dtype)
            chunks.decode_into(blob, tmp, a.compression, stored_size=size, where=where, crc=crc)
            np.copyto(region, tmp, casting="safe")
            return
        # a narrowed chunk decodes into the back of its rows and widens there
        narrow = chunks.decode_into(
            blob, chunks.narrow_view(region, a.dtype), a.compression, stored_size=size, where=where, crc=crc
        )
        chunks.widen_in_place(region, narrow)
    else:
        tmp = np.empty((n, *a.shape[1:]), dtype=a.dtype)
        chunks.decode_into(blob, tmp, a.compression, stored_size=size, where=where, crc=crc)
        _put(out, dst, tmp, src)


def _rows_wanted(src: Any) -> Any:
    """The rows of a chunk a job wants, as :func:`blockreads.plan` takes them."""
    return tuple((s.start, s.stop) for s, _ in src.pairs) if isinstance(src, Runs) else src


def _put(out: np.ndarray, dst: Any, rows: np.ndarray, src: Any) -> None:
    """``out[dst] = rows[src]``, or each run of ``src`` (a :class:`Runs`) to its place."""
    if isinstance(src, Runs):
        for s, d in src.pairs:
            out[d] = rows[s]
    else:
        out[dst] = rows[src]


#: the most bytes a read of chosen rows decodes in the calling thread (more go to the pool)
PARALLEL_DECODE_BYTES = 256 << 10
#: the most bytes a read of whole chunks decodes in the calling thread alone (more are shared
#: with the pool). Waking the pool's threads costs more than it saves below: the first whole
#: read of the small realistic step in a fresh process (600 KiB to decode, two chunks of
#: 244 KiB) took 8.8 ms of CPU (9.4 ms wall) decoded here against 10.9 ms (10.2 ms wall)
#: shared from 256 KiB on (medians of 21 cold reads, loaded machine)
SERIAL_DECODE_BYTES = 1 << 20
#: in a read shared with the pool, chunks decoding to at most this many bytes are decoded by
#: the calling thread: handing one over costs more than decoding it
HANDOFF_BYTES = 16 << 10
