"""Training exports in the conversational formats TRL's trainers read: SFT and DPO records.

``format="sft"``: one record per chosen answer, ``{"messages": [...the prompt's messages...,
{"role": "assistant", "content": answer}], "step", "row", "uid", "score"}``: the ``best_of``
highest scored answers of each group (rows sharing a ``uid``) that reach ``min_score``.

``format="dpo"``: per group whose scores differ, ``{"prompt": [...messages...], "chosen":
[{"role": "assistant", "content": ...}], "rejected": [...], "score_chosen", "score_rejected",
"step", "uid", "chosen_row", "rejected_row"}``, chosen among the best and rejected among the
worst answers (:func:`zarr_skip.views.choosing.preference_pairs`).

With ``token_ids`` the token ids travel too (``prompt_ids`` and ``completion_ids``, or
``prompt_ids``, ``chosen_ids`` and ``rejected_ids``), for training without re-tokenising. The
file is JSON Lines or parquet by its suffix, written beside its destination and renamed into
place when complete.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.errors import ColumnNotFoundError, ConfigError, MissingExtraError, StorageError
from zarr_skip.format import args
from zarr_skip.format.escapes import utf8_value
from zarr_skip.format.jsonvalues import strict_json
from zarr_skip.views.choosing import best_answers, check_best_of, check_pairs, group_rows, preference_pairs
from zarr_skip.views.export import check_outside
from zarr_skip.views.records import chosen_steps, rollout_columns
from zarr_skip.views.text import require_tokenizer, token_ids
from zarr_skip.views.tokenizers import Decoder

if TYPE_CHECKING:
    from zarr_skip.cache import Cache
    from zarr_skip.lazy import StepView

logger = logging.getLogger(__name__)

__all__ = ["TRAINING_FORMATS", "TrainingExport", "export_training", "row_scores", "step_records"]

TRAINING_FORMATS = ("sft", "dpo")
_FILES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True, slots=True)
class TrainingExport:
    """What a training export wrote: ``records`` records of ``format`` from ``groups`` groups."""

    path: str
    format: str
    file_format: str
    steps: tuple[int, ...]
    records: int
    groups: int
    tokenizer: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "file_format": self.file_format,
            "steps": list(self.steps),
            "records": self.records,
            "groups": self.groups,
            "tokenizer": self.tokenizer,
        }


@dataclass(frozen=True, slots=True)
class Choice:
    """How records are chosen (see :func:`export_training`)."""

    format: str
    score: str = "score"
    min_score: float | None = None
    best_of: int = 1
    pairs: int | str = 1
    token_ids: bool = False


def check_choice(format: Any, score: Any, min_score: Any, best_of: Any, pairs: Any, token_ids: Any) -> Choice:
    """The arguments of :func:`export_training` that choose the records, checked (typed errors
    naming the argument, before anything is read)."""
    if format not in TRAINING_FORMATS:
        raise ConfigError(f"format {format!r}: choose one of {', '.join(TRAINING_FORMATS)}")
    return Choice(
        format,
        args.name(score, "score"),
        None if min_score is None else args.number(min_score, "min_score", finite=True),
        check_best_of(best_of),
        check_pairs(pairs),
        args.flag(token_ids, "token_ids"),
    )


def file_format(path: Path) -> str:
    """``"jsonl"`` or ``"parquet"`` from the file's suffix."""
    found = _FILES.get(path.suffix.lower())
    if found is None:
        raise ConfigError(
            f"{path}: name the file .jsonl or .parquet (the suffix says how training records are written)"
        )
    return found


def export_training(
    cache: Cache,
    path: str | os.PathLike[str],
    steps: int | Iterable[int] | None = None,
    *,
    format: str = "sft",
    score: str = "score",
    min_score: float | None = None,
    best_of: int = 1,
    pairs: int | str = 1,
    tokenizer: Any = None,
    token_ids: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> TrainingExport:
    """Write SFT or DPO records of ``steps`` (default: every complete step) to ``path``.

    Parameters
    ----------
    format : ``"sft"`` or ``"dpo"`` (see the module docstring).
    score : the per-row column that ranks the answers (``"score"`` falls back to the sum of
        ``token_level_scores`` when there is no such column).
    min_score : SFT keeps answers scoring at least this; DPO keeps pairs whose chosen answer does.
    best_of : SFT: answers kept per group, best first.
    pairs : DPO: most pairs per group, or ``"all"`` (every best answer with every worst one).
    tokenizer : decodes the token ids (default: the one the experiment recorded).
    token_ids : keep the token ids in ``*_ids`` columns too.

    Raises
    ------
    StepNotFoundError, IncompleteStepError
        A step asked for is not there or not complete (nothing is written).
    TokenizerNotFoundError
        No tokenizer given and none recorded.
    ColumnNotFoundError
        A step has no ``score`` column (or no ``uid`` column, for DPO); a ``KeyError``.
    ConfigError, ConfigTypeError
        A bad argument (checked before anything is read), or ``path`` is a directory or inside
        the cache's own tree (nothing is written).
    StorageError
        The file could not be written (no partial file is left).
    """
    choice = check_choice(format, score, min_score, best_of, pairs, token_ids)
    out = Path(args.path(path, "path", "export"))
    kind = file_format(out)
    if out.is_dir():
        raise ConfigError(f"export: path {str(out)!r} is a directory; name the .jsonl or .parquet file to write")
    check_outside(cache, out)
    if kind == "parquet":
        _pyarrow()  # fail before reading anything
    chosen = chosen_steps(cache, steps, "export")
    views = [cache.load(s) for s in chosen]  # every step is checked before anything is written
    decoder = require_tokenizer(views[0], tokenizer)
    records: list[dict[str, Any]] = []
    groups = 0
    for done, view in enumerate(views, start=1):
        found, count = step_records(view, choice, decoder)
        records += found
        groups += count
        if progress is not None:
            progress(done, len(views))
    _write(records, out, kind)
    if not records:
        logger.warning("%s: no %s records (no group met the choice) in steps %s", out, format, chosen)
    logger.info("exported %d %s records of %d group(s) to %s", len(records), format, groups, out)
    return TrainingExport(str(out), format, kind, tuple(chosen), len(records), groups, repr(decoder))


def row_scores(view: StepView, score: str = "score") -> np.ndarray:
    """Each row's score as float64 (NaN where there is none): the per-row column ``score``, else
    for ``"score"`` the sum of ``token_level_scores``."""
    if score in view and view[score].spec.shape == () and not view[score].spec.jagged:
        values = view[score][:]
        return np.array([_number(v) for v in (values.tolist() if hasattr(values, "tolist") else values)])
    if score == "score" and "token_level_scores" in view:
        return np.array([float(np.sum(r)) for r in token_ids(view, "token_level_scores")], dtype=np.float64)
    raise ColumnNotFoundError(
        f"step {view.step}: no per-row column {score!r} to rank answers by (columns: {', '.join(view.columns)}); "
        "pass score=NAME (on the CLI --score NAME)"
    )


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def step_records(view: StepView, choice: Choice, decoder: Decoder) -> tuple[list[dict[str, Any]], int]:
    """The records of one step and the number of its groups."""
    scores = row_scores(view, choice.score)
    if "uid" in view:
        uids: list[Any] = list(view["uid"][:])
        # a row without a uid is a group of its own: it belongs to no known prompt
        groups = group_rows([("row", r) if u is None else ("uid", str(u)) for r, u in enumerate(uids)])
    elif choice.format == "dpo":
        raise ColumnNotFoundError(
            f"step {view.step}: no 'uid' column: DPO pairs the answers of one prompt (a GRPO group)"
        )
    else:  # no groups: each answer is its own
        uids = [None] * len(view)
        groups = [[r] for r in range(len(view))]
    picks: list[tuple[list[int], int | None]] = []  # (rows, rejected row) per record
    for rows in groups:
        group_scores = [float(scores[r]) for r in rows]
        if choice.format == "sft":
            picks += [([rows[i]], None) for i in best_answers(group_scores, choice.best_of, choice.min_score)]
        else:
            for c, r in preference_pairs(group_scores, choice.pairs):
                if choice.min_score is None or group_scores[c] >= choice.min_score:
                    picks.append(([rows[c]], rows[r]))
    needed = sorted({r for rows, rej in picks for r in rows + ([] if rej is None else [rej])})
    texts = _texts(view, needed, decoder, choice.token_ids)
    out = []
    for (row,), rejected in picks:
        uid = None if uids[row] is None else str(uids[row])
        if rejected is None:
            out.append(_sft(view.step, row, uid, float(scores[row]), texts[row], choice.token_ids))
        else:
            out.append(_dpo(view.step, uid, (row, rejected), (scores[row], scores[rejected]), texts, choice.token_ids))
    return out, len(groups)


def _texts(view: StepView, rows: Sequence[int], decoder: Decoder, ids: bool) -> dict[int, dict[str, Any]]:
    """Per row asked for: its prompt ``messages``, ``response`` text and (with ``ids``) token ids."""
    if not rows:
        return {}
    cols = rollout_columns(view, rows=list(rows), decoder=decoder, extra=False)
    prompt_ids = token_ids(view, "prompts", rows=list(rows)) if ids and "prompts" in view else None
    response_ids = token_ids(view, "responses", rows=list(rows)) if ids else None
    found = {}
    for k, row in enumerate(rows):
        messages = cols["messages"][k]
        if messages is None:  # no chat prompt stored: the decoded prompt is the user's turn
            messages = [{"role": "user", "content": cols["prompt"][k] or ""}]
        entry: dict[str, Any] = {"messages": messages, "response": cols["response"][k] or ""}
        if prompt_ids is not None:
            entry["prompt_ids"] = prompt_ids[k].tolist()
        if response_ids is not None:
            entry["response_ids"] = response_ids[k].tolist()
        found[row] = entry
    return found


def _sft(step: int, row: int, uid: str | None, score: float, text: dict[str, Any], ids: bool) -> dict[str, Any]:
    record = {
        "messages": [*text["messages"], {"role": "assistant", "content": text["response"]}],
        "step": step,
        "row": row,
        "uid": uid,
        "score": score,
    }
    if ids:
        record["prompt_ids"] = text.get("prompt_ids")
        record["completion_ids"] = text["response_ids"]
    return record


def _dpo(
    step: int,
    uid: str | None,
    rows: tuple[int, int],
    scores: tuple[float, float],
    texts: dict[int, dict[str, Any]],
    ids: bool,
) -> dict[str, Any]:
    chosen, rejected = texts[rows[0]], texts[rows[1]]
    record = {
        "prompt": chosen["messages"],
        "chosen": [{"role": "assistant", "content": chosen["response"]}],
        "rejected": [{"role": "assistant", "content": rejected["response"]}],
        "score_chosen": float(scores[0]),
        "score_rejected": float(scores[1]),
        "step": step,
        "uid": uid,
        "chosen_row": rows[0],
        "rejected_row": rows[1],
    }
    if ids:
        record["prompt_ids"] = chosen.get("prompt_ids")
        record["chosen_ids"] = chosen["response_ids"]
        record["rejected_ids"] = rejected["response_ids"]
    return record


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - the writer
    except ImportError:
        raise MissingExtraError(
            "writing parquet needs the 'pyarrow' package: pip install 'zarr-skip[export]'"
        ) from None
    return pyarrow


def _utf8(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its text encodable as UTF-8: a lone surrogate written ``\\udxxx``
    (:mod:`zarr_skip.format.escapes`), as rollout exports write it; token ids as they are."""
    return {k: v if k.endswith("_ids") else utf8_value(v) for k, v in record.items()}


def _write(records: list[dict[str, Any]], out: Path, kind: str) -> None:
    records = [_utf8(r) for r in records]
    tmp = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if kind == "parquet":
            pa = _pyarrow()
            pa.parquet.write_table(pa.Table.from_pylist(records), str(tmp), compression="zstd")
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(strict_json(record), ensure_ascii=False, allow_nan=False) + "\n")
        os.replace(tmp, out)
    except OSError as exc:
        raise StorageError(f"export: path {str(out)!r}: cannot write it ({exc})") from exc
    finally:
        with contextlib.suppress(OSError):  # no place for it: nothing to remove
            tmp.unlink(missing_ok=True)
