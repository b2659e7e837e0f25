"""Rollouts as a table for the tools people already use: parquet (pandas, pyarrow, DuckDB,
polars) or JSON Lines, one record per rollout (see :mod:`zarr_skip.views.records`).

The file is written next to its destination and renamed into place when complete, so a reader
never sees half an export.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from zarr_skip.errors import ConfigError, MissingExtraError, StorageError
from zarr_skip.format import args
from zarr_skip.format.escapes import utf8_value
from zarr_skip.views.records import chosen_steps, rollout_columns
from zarr_skip.views.tokenizers import tokenizer_for

if TYPE_CHECKING:
    from zarr_skip.cache import Cache

logger = logging.getLogger(__name__)

__all__ = [
    "FORMATS",
    "SUFFIXES",
    "ExportFormat",
    "ExportReport",
    "Writer",
    "check_outside",
    "export_rollouts",
    "format_of",
    "suffix_of",
    "write_jsonl",
    "write_parquet",
]

#: a writer of record tables: ``write(tables, path, gzip)`` writes them to ``path`` (gzip-compressed
#: when asked) and returns the column names written, in order
Writer = Callable[[Sequence[Mapping[str, Sequence[Any]]], Path, bool], list[str]]
#: OUT's suffix -> (format, gzip); the longest matching suffix wins
SUFFIXES = {
    ".parquet": ("parquet", False),
    ".pq": ("parquet", False),
    ".jsonl": ("jsonl", False),
    ".ndjson": ("jsonl", False),
    ".jsonl.gz": ("jsonl", True),
    ".ndjson.gz": ("jsonl", True),
}
#: suffixes of compressed files: only JSON Lines are written compressed, as gzip
_PACKED = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zip": "a ZIP archive"}
#: the formats rollouts export to
ExportFormat = Literal["parquet", "jsonl"]


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What an export wrote."""

    path: str
    format: ExportFormat
    steps: tuple[int, ...]
    rows: int
    columns: tuple[str, ...]
    tokenizer: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "steps": list(self.steps),
            "rows": self.rows,
            "columns": list(self.columns),
            "tokenizer": self.tokenizer,
        }


def format_of(
    path: str | os.PathLike[str], fmt: str | None, formats: Collection[str] | None = None
) -> tuple[str, bool]:
    """The format (and whether to gzip) of writing ``path``: ``fmt``, else from the name's
    suffix (:data:`SUFFIXES`). A ``fmt`` that a suffix of another format contradicts, an
    unknown ``fmt`` or (without ``fmt``) an unknown suffix is a ConfigError naming both."""
    known = tuple(FORMATS) if formats is None else tuple(formats)
    found = suffix_of(path)
    by_name = SUFFIXES[found] if found is not None else None
    if fmt is None:
        if by_name is None:
            raise ConfigError(
                f"path {path}: cannot tell the format from the name; name it {', '.join(SUFFIXES)} "
                f"or pass format= (one of {', '.join(known)})"
            )
        return by_name
    if fmt not in known:
        raise ConfigError(f"format {fmt!r}: choose one of {', '.join(known)}")
    if by_name is not None and by_name[0] != fmt:
        raise ConfigError(
            f"format {fmt!r} but path {path} is named as {by_name[0]} ({found}); rename it or drop the format to use "
            f"{by_name[0]}"
        )
    packed = Path(path).suffix.lower()
    if by_name is None and packed in _PACKED:  # out.gz: the file is what its name says
        if (fmt, packed) != ("jsonl", ".gz"):
            raise ConfigError(f"format {fmt!r} but path {path} is named as {_PACKED[packed]} ({packed}); rename it")
        return fmt, True
    return fmt, bool(by_name and by_name[1])


def suffix_of(path: str | os.PathLike[str]) -> str | None:
    """The longest of :data:`SUFFIXES` that ``path``'s name ends with (None: none)."""
    name = Path(path).name.lower()
    return max((s for s in SUFFIXES if name.endswith(s) and len(name) > len(s)), key=len, default=None)


def check_outside(cache: Cache, path: str | os.PathLike[str]) -> None:
    """ConfigError when ``path`` lies in the tree of ``cache`` (a local cache): an export there
    would overwrite what it reads."""
    root = cache.storage.root
    if root is None:
        return
    out, base = Path(path).resolve(), root.resolve()
    if out == base or base in out.parents:
        raise ConfigError(
            f"path {path} is inside the cache at {root} that it exports; write it outside the cache "
            "(nothing was written)"
        )


def export_rollouts(
    cache: Cache,
    path: str | os.PathLike[str],
    steps: int | Iterable[int] | None = None,
    *,
    format: ExportFormat | None = None,
    tokenizer: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Write one record per rollout of ``steps`` (default: every complete step) to ``path``.

    Each record has the fields of :mod:`zarr_skip.views.schema` (the names
    :meth:`zarr_skip.Cache.table` uses): experiment, step, mini-batch, row, uid, data source,
    the prompt as the model saw it and the response (decoded when a tokenizer is known:
    ``tokenizer``, else the one the experiment recorded; else their token ids), the chat
    messages, lengths, truncation, score, reward, acc, advantage; then every stored column
    holding one scalar, string or JSON value per row, under its own name and as stored (a
    computed field whose name a stored column takes is ``zs_{name}``).

    Parameters
    ----------
    format : ``"parquet"`` (needs ``pyarrow``: ``pip install 'zarr-skip[export]'``) or
        ``"jsonl"``; by default from the file name's suffix (:data:`SUFFIXES`: ``.parquet``,
        ``.jsonl``, ``.jsonl.gz`` ...); a suffix of another format is an error.
    progress : called as ``progress(done, total)`` after each step.

    Raises
    ------
    StepNotFoundError, IncompleteStepError
        A step asked for is not there or not complete (nothing is written).
    ConfigError
        The format is unknown or contradicts the name, or ``path`` is inside the cache's own
        tree (nothing is written).
    """
    out = Path(args.path(path, "path", "export"))
    if out.is_dir():
        raise ConfigError(f"export: path {str(out)!r} is a directory; name the file to write ({', '.join(SUFFIXES)})")
    check_outside(cache, out)
    fmt, gz = format_of(out, format)
    if fmt == "parquet":
        _pyarrow()  # fail before reading anything
    chosen = chosen_steps(cache, steps, "export")
    decoder = tokenizer_for(cache, tokenizer)
    if decoder is None:
        logger.warning(
            "%s: no tokenizer known; exporting token ids instead of text (pass tokenizer=PATH, on the CLI --tokenizer)",
            cache.location,
        )
    views = [cache.load(s) for s in chosen]  # every step is checked before anything is written
    tables = []
    for done, view in enumerate(views, start=1):
        tables.append(rollout_columns(view, decoder=decoder, arrays=fmt == "parquet"))
        if progress is not None:
            progress(done, len(views))
    tmp = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        columns = FORMATS[fmt](tables, tmp, gz)
        os.replace(tmp, out)
    except OSError as exc:
        raise StorageError(f"export: path {str(out)!r}: cannot write it ({exc})") from exc
    finally:
        with contextlib.suppress(OSError):  # no place for it: nothing to remove
            tmp.unlink(missing_ok=True)
    rows = sum(_rows(t) for t in tables)
    logger.info("exported %d rollouts of %d step(s) to %s", rows, len(chosen), out)
    return ExportReport(
        str(out),
        cast(ExportFormat, fmt),
        tuple(chosen),
        rows,
        tuple(columns),
        None if decoder is None else repr(decoder),
    )


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - the writer
    except ImportError:
        raise MissingExtraError(
            "writing parquet needs the 'pyarrow' package: pip install 'zarr-skip[export]'"
        ) from None
    return pyarrow


def _names(tables: Sequence[Mapping[str, Sequence[Any]]]) -> list[str]:
    return list(dict.fromkeys(name for t in tables for name in t))


def _rows(table: Mapping[str, Sequence[Any]]) -> int:
    return len(next(iter(table.values()))) if table else 0


def _plain(value: Any) -> Any:
    """A value as JSON sees it (numpy scalars and arrays as Python numbers and lists)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def write_jsonl(tables: Sequence[Mapping[str, Sequence[Any]]], path: Path, gzip: bool = False) -> list[str]:
    """JSON Lines, one object per row with every column of ``tables`` (None where a table
    lacks one); JSON values as objects. Non-finite floats are written as the tokens ``NaN``,
    ``Infinity`` and ``-Infinity``, as Python's :mod:`json` writes and reads them back
    (``json.loads``, ``pandas.read_json``); readers of strict JSON (DuckDB, jq) refuse such
    lines. Integers of any size are written exactly."""
    import gzip as gzip_module

    names = _names(tables)
    # a lone surrogate is written \udxxx inside its JSON string: json.loads gives it back exactly
    if gzip:
        opened: Any = gzip_module.open(path, "wt", encoding="utf-8", errors="backslashreplace")
    else:
        opened = open(path, "w", encoding="utf-8", errors="backslashreplace")
    with opened as f:
        for t in tables:
            for i in range(_rows(t)):
                record = {name: _plain(t[name][i]) if name in t else None for name in names}
                f.write(json.dumps(record, ensure_ascii=False, allow_nan=True, default=str) + "\n")
    return names


def write_parquet(tables: Sequence[Mapping[str, Sequence[Any]]], path: Path, gzip: bool = False) -> list[str]:
    """Parquet (zstd). Numbers keep their dtype (numpy arrays given) with NaN and infinities as
    they are; JSON columns are nested types (struct, list) when pyarrow's type for the column
    gives every value back as it was, else JSON text (exact), named in the schema metadata
    ``zarr_skip.json_columns`` (mixed types, keys that change from row to row, integers beyond
    int64, or another type in another step; floats of other widths widen to the widest, signed
    integers too). ``gzip`` must be False (parquet compresses its pages)."""
    if gzip:
        raise ConfigError(f"{path}: parquet compresses its own pages; name the file .parquet")
    pa = _pyarrow()
    names = _names(tables)
    # arrow strings are UTF-8: lone surrogates escaped
    tables = [{n: v if isinstance(v, np.ndarray) else [utf8_value(x) for x in v] for n, v in t.items()} for t in tables]
    as_text = {n for n in names if not all(_nested_ok(pa, t[n]) for t in tables if n in t)}
    arrays = [{n: _arrow(pa, t[n], n in as_text) for n in t} for t in tables]
    for name in names:  # a column of other types in other steps: JSON text throughout (no nulls made up)
        kinds = {a[name].type for a in arrays if name in a and a[name].type != pa.null()}
        widened = all(map(pa.types.is_floating, kinds)) or all(map(pa.types.is_signed_integer, kinds))
        if len(kinds) > 1 and not widened and name not in as_text:
            as_text.add(name)
            for a, t in zip(arrays, tables, strict=True):
                if name in a:
                    a[name] = _arrow(pa, t[name], True)
    arrow = [pa.table({n: a.get(n, pa.nulls(_rows(t))) for n in names}) for a, t in zip(arrays, tables, strict=True)]
    table = pa.concat_tables(arrow, promote_options="permissive") if len(arrow) > 1 else arrow[0]
    meta = {"zarr_skip.json_columns": json.dumps(sorted(as_text))}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    pa.parquet.write_table(table, str(path), compression="zstd")
    return names


def _arrow(pa: Any, values: Sequence[Any], text: bool) -> Any:
    """``values`` as an arrow array: as JSON text with ``text``."""
    if text:
        values = [None if v is None else json.dumps(_plain(v), ensure_ascii=False, default=str) for v in values]
    return pa.array(values)


def _nested_ok(pa: Any, values: Sequence[Any]) -> bool:
    """Whether pyarrow's own type for ``values`` gives each back exactly (same types, keys,
    NaN where NaN was)."""
    if isinstance(values, np.ndarray):
        return True
    try:
        back = pa.array(values).to_pylist()
    except (pa.lib.ArrowException, OverflowError, TypeError, ValueError):
        return False
    return all(_same(a, b) for a, b in zip(values, back, strict=True))


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


#: format name -> writer (another format plugs in by adding its writer here)
FORMATS: dict[str, Writer] = {"parquet": write_parquet, "jsonl": write_jsonl}
