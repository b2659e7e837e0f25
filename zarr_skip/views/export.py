"""Rollouts as a table for the tools people already use: parquet (pandas, pyarrow, DuckDB,
polars) or JSON Lines, one record per rollout (see :mod:`zarr_skip.views.records`).

The file is written next to its destination and renamed into place when complete, so a reader
never sees half an export.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zarr_skip.errors import ConfigError, MissingExtraError, StepNotFoundError, StorageError
from zarr_skip.format import args, checks
from zarr_skip.format.escapes import utf8_value
from zarr_skip.views.records import rollout_columns
from zarr_skip.views.tokenizers import tokenizer_for

if TYPE_CHECKING:
    from zarr_skip.cache import Cache

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "ExportReport", "export_rollouts"]

FORMATS = ("parquet", "jsonl")
#: columns whose values keep their nested type in parquet (others holding dicts or lists, whose
#: shape may change from row to row, are stored as JSON text)
_NESTED = {"messages", "prompt_ids", "response_ids"}


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What an export wrote."""

    path: str
    format: str
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


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is None:
        suffix = path.suffix.lower().lstrip(".")
        fmt = {"parquet": "parquet", "pq": "parquet", "jsonl": "jsonl", "ndjson": "jsonl"}.get(suffix)
        if fmt is None:
            raise ConfigError(
                f"export: path {str(path)!r}: cannot tell the format from the name; pass format='parquet' or 'jsonl'"
            )
    if fmt not in FORMATS:
        raise ConfigError(f"export: format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return fmt


def export_rollouts(
    cache: Cache,
    path: str | os.PathLike[str],
    steps: int | Iterable[int] | None = None,
    *,
    format: str | None = None,
    tokenizer: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Write one record per rollout of ``steps`` (default: every complete step) to ``path``.

    Each record has the step, row, uid, data source, decoded prompt and response (when a
    tokenizer is known: ``tokenizer``, else the one the experiment recorded; else the token
    ids), chat messages, lengths, truncation, score, reward, acc, advantage, and every other
    column holding one scalar, string or JSON value per row.

    Parameters
    ----------
    format : ``"parquet"`` (needs ``pyarrow``: ``pip install 'zarr-skip[export]'``) or
        ``"jsonl"``; by default from the file name's suffix.
    progress : called as ``progress(done, total)`` after each step.

    Raises
    ------
    StepNotFoundError, IncompleteStepError
        A step asked for is not there or not complete (nothing is written).
    """
    out = Path(args.path(path, "path", "export"))
    fmt = _format_of(out, format)
    if fmt == "parquet":
        _pyarrow()  # fail before reading anything
    chosen = cache.steps() if steps is None else checks.check_steps([steps] if isinstance(steps, int) else steps)
    if not chosen:
        raise StepNotFoundError(f"no complete steps to export in experiment {cache.experiment!r} at {cache.location}")
    decoder = tokenizer_for(cache, tokenizer)
    if decoder is None:
        logger.warning(
            "%s: no tokenizer known; exporting token ids instead of text (pass tokenizer=PATH, on the CLI --tokenizer)",
            cache.location,
        )
    views = [cache.load(s) for s in chosen]  # every step is checked before anything is written
    tables = []
    for done, view in enumerate(views, start=1):
        tables.append(rollout_columns(view, decoder=decoder))
        if progress is not None:
            progress(done, len(views))
    tmp = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        columns = _write_parquet(tables, tmp) if fmt == "parquet" else _write_jsonl(tables, tmp)
        os.replace(tmp, out)
    except OSError as exc:
        raise StorageError(f"export: path {str(out)!r}: cannot write it ({exc})") from exc
    finally:
        tmp.unlink(missing_ok=True)
    rows = sum(len(t["row"]) for t in tables)
    logger.info("exported %d rollouts of %d step(s) to %s", rows, len(chosen), out)
    return ExportReport(str(out), fmt, tuple(chosen), rows, tuple(columns), None if decoder is None else repr(decoder))


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - the writer
    except ImportError:
        raise MissingExtraError(
            "writing parquet needs the 'pyarrow' package: pip install 'zarr-skip[export]'"
        ) from None
    return pyarrow


def _clean(value: Any) -> Any:
    """A JSON value with NaN and infinities as null (JSON has none; DuckDB refuses them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _names(tables: Sequence[dict[str, list[Any]]]) -> list[str]:
    return list(dict.fromkeys(name for t in tables for name in t))


def _write_jsonl(tables: Sequence[dict[str, list[Any]]], path: Path) -> list[str]:
    names = _names(tables)
    # a lone surrogate is written \udxxx inside its JSON string: json.loads gives it back exactly
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
        for t in tables:
            count = len(t["row"])
            for i in range(count):
                record = {name: _clean(t[name][i]) if name in t else None for name in names}
                f.write(json.dumps(record, ensure_ascii=False, allow_nan=False, default=str) + "\n")
    return names


def _write_parquet(tables: Sequence[dict[str, list[Any]]], path: Path) -> list[str]:
    pa = _pyarrow()
    names = _names(tables)
    nested = {n for n in names if any(isinstance(v, (dict, list)) for t in tables for v in t.get(n, ()))}
    as_text = nested - _NESTED
    arrow = []
    for t in tables:
        count = len(t["row"])
        data = {}
        for name in names:
            values = t.get(name, [None] * count)
            if name in as_text:
                values = [None if v is None else json.dumps(_clean(v), ensure_ascii=False, default=str) for v in values]
            data[name] = [utf8_value(v) for v in values]  # arrow strings are UTF-8: lone surrogates escaped
        arrow.append(pa.table(data))
    table = pa.concat_tables(arrow, promote_options="permissive") if len(arrow) > 1 else arrow[0]
    meta = {"zarr_skip.json_columns": json.dumps(sorted(as_text))}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    pa.parquet.write_table(table, str(path), compression="zstd")
    return names
