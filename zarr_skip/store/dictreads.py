"""Reading rows of a jagged column some of whose mini-batches are dictionary-encoded.

A dictionary-encoded mini-batch stores ``codes`` (one per row) and its distinct rows (``values``
and ``lengths``, see :mod:`zarr_skip.format.dictionary`); a plain one its rows. A read of rows
fetches, in a first round, the codes and lengths of the mini-batches holding them (small
arrays), and in a second the values of the entries those rows use, each entry once; each
entry is decoded once, and rows that share it share the decoded object (as after verl's
``repeat``). A whole column is read in one round (:func:`whole_ranges`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zarr_skip.format import dictionary
from zarr_skip.format.restore import restore
from zarr_skip.format.specs import BYTES_KINDS, ColumnSpec
from zarr_skip.store.reads import (
    ArrayPart,
    Batch,
    Range,
    Reader,
    checked_entries,
    checked_lengths,
    read_ranges,
    read_rounds,
)
from zarr_skip.store.storage import Storage

_INT64 = np.dtype(np.int64)


def is_dictionary(arrays: dict[str, ArrayPart]) -> bool:
    """Whether a mini-batch's column is dictionary-encoded (it has ``codes``)."""
    return "codes" in arrays


@dataclass(frozen=True, slots=True)
class DictColumn:
    """A jagged column across mini-batches, some dictionary-encoded.

    ``arrays`` and ``specs`` per mini-batch, ``spec`` the merged spec.
    """

    storage: Storage
    spec: ColumnSpec
    specs: Sequence[ColumnSpec]
    arrays: Sequence[dict[str, ArrayPart]]
    allow_pickle: bool

    @property
    def part_rows(self) -> list[int]:
        return [a["codes" if is_dictionary(a) else "lengths"].rows for a in self.arrays]

    def _small(self, p: int) -> list[Range]:
        """The codes (of a dictionary part) and lengths of mini-batch ``p``, read whole."""
        a = self.arrays[p]
        names = ("codes", "lengths") if is_dictionary(a) else ("lengths",)
        return [([a[n]], 0, a[n].rows, _INT64, ()) for n in names]

    def whole_ranges(self) -> list[Range]:
        """Everything a read of the whole column takes, per mini-batch: codes (if any), lengths
        and values, to be fetched in one round."""
        out = []
        for p, a in enumerate(self.arrays):
            v = a["values"]
            out += [*self._small(p), ([v], 0, v.rows, self.spec.storage_dtype, self.spec.storage_shape)]
        return out

    def restore_whole(self, arrays: Sequence[np.ndarray]) -> Any:
        """The column from the arrays :meth:`whole_ranges` named."""
        it = iter(arrays)
        entries, row_part, row_code = [], [], []
        for p, a in enumerate(self.arrays):
            codes = next(it) if is_dictionary(a) else None
            lengths, values = next(it), next(it)
            checked_entries(a, codes, lengths)
            codes = np.arange(len(lengths), dtype=np.int64) if codes is None else codes.astype(np.int64)
            entries.append((values, lengths))
            row_part.append(np.full(len(codes), p, dtype=np.int64))
            row_code.append(codes)
        return self._assemble(entries, _cat(row_part), _cat(row_code))

    def lengths_ranges(self) -> list[Range]:
        """What reading the lengths of every row takes (codes and lengths of each mini-batch)."""
        return [r for p in range(len(self.arrays)) for r in self._small(p)]

    def lengths_of(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Per-row lengths from the arrays :meth:`lengths_ranges` named."""
        it = iter(arrays)
        out = []
        for a in self.arrays:
            if is_dictionary(a):
                codes, lengths = next(it), next(it)
                checked_entries(a, codes, lengths)
                out.append(lengths[codes])
            else:
                out.append(checked_lengths(next(it), [a]))
        return _cat(out)

    def lengths(self) -> np.ndarray:
        """Per-row lengths of every row."""
        return self.lengths_of(read_ranges(self.storage, self.lengths_ranges()))

    def expand_whole(self, arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Per-row ``lengths`` and ``values`` of every row (entries expanded by their codes) from
        the arrays :meth:`whole_ranges` named: the column as a plain one stores it."""
        it = iter(arrays)
        lengths, values = [], []
        for a in self.arrays:
            codes = next(it) if is_dictionary(a) else None
            ln, v = next(it), next(it)
            checked_entries(a, codes, ln)
            if codes is not None:
                v, ln = dictionary.gather_rows(v, ln, codes)
            lengths.append(ln)
            values.append(v.reshape(-1, *self.spec.storage_shape))
        shape = (0, *self.spec.storage_shape)
        return {"lengths": _cat(lengths), "values": _cat(values, self.spec.storage_dtype, shape)}

    def rows(self, idx: np.ndarray) -> Any:
        """Rows ``idx`` (any order, repeats allowed): the mini-batches' codes and lengths in one
        round, then the values of the entries they use (of every mini-batch) in another."""
        return read_rounds(self.storage, [self.reader(idx)])[0]

    def reader(self, idx: np.ndarray) -> Reader:
        """:meth:`rows` as a reader for :func:`read_rounds` (read in the rounds of others)."""
        starts = np.cumsum([0, *self.part_rows])
        which = np.searchsorted(starts, idx, side="right") - 1
        touched = [int(p) for p in np.unique(which)]
        batch = Batch()
        small = [[batch.range(*r) for r in self._small(p)] for p in touched]
        yield batch  # the codes and lengths
        row_code = np.empty(len(idx), dtype=np.int64)
        used_lengths, positions = [], []
        value_starts = np.cumsum([0] + [a["values"].rows for a in self.arrays])
        for p, got in zip(touched, small, strict=True):
            a = self.arrays[p]
            codes, lengths = (got[0], got[1]) if is_dictionary(a) else (None, got[0])
            checked_entries(a, codes, lengths)
            mine = which == p
            local = idx[mine] - starts[p]
            used, row_code[mine] = np.unique(local if codes is None else codes[local], return_inverse=True)
            positions.append(dictionary.gather_positions(lengths, used) + value_starts[p])
            used_lengths.append(lengths[used])
        batch = Batch()  # the values of the entries used, of every mini-batch at once
        shape = self.spec.storage_shape
        values = batch.index([a["values"] for a in self.arrays], _cat(positions), self.spec.storage_dtype, shape)
        yield batch
        none = (np.empty((0, *shape), self.spec.storage_dtype), np.empty(0, np.int64))
        entries: list[tuple[np.ndarray, np.ndarray]] = [none] * len(self.arrays)
        cuts = np.cumsum([0] + [len(pos) for pos in positions]).tolist()
        for p, lengths, lo, hi in zip(touched, used_lengths, cuts, cuts[1:], strict=False):
            entries[p] = (values[lo:hi], lengths)
        return self._assemble(entries, which.astype(np.int64), row_code)

    def _assemble(
        self, entries: Sequence[tuple[np.ndarray, np.ndarray]], row_part: np.ndarray, row_code: np.ndarray
    ) -> Any:
        """Rows from per mini-batch entries: row ``i`` is entry ``row_code[i]`` of mini-batch
        ``row_part[i]``. Bytes kinds decode each entry once (with its mini-batch's own spec: a
        step may mix ``str`` and ``json`` mini-batches); the others gather values."""
        base = np.cumsum([0] + [len(lengths) for _, lengths in entries])
        if self.spec.kind in BYTES_KINDS:
            decoded: list[Any] = []
            for p, (values, lengths) in enumerate(entries):
                if len(lengths):
                    spec = self.specs[p]
                    decoded += list(
                        restore(spec, {"values": values, "lengths": lengths}, allow_pickle=self.allow_pickle)
                    )
            return dictionary.expand_objects(decoded, base[row_part] + row_code, self.spec.container)
        shape = (0, *self.spec.storage_shape)
        values = _cat([v.reshape(-1, *self.spec.storage_shape) for v, _ in entries], self.spec.storage_dtype, shape)
        lengths = _cat([ln for _, ln in entries])
        values, lengths = dictionary.gather_rows(values, lengths, base[row_part] + row_code)
        return restore(self.spec, {"values": values, "lengths": lengths}, allow_pickle=self.allow_pickle)


def _cat(arrays: Sequence[np.ndarray], dtype: np.dtype = _INT64, empty: tuple[int, ...] = (0,)) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(empty, dtype)
