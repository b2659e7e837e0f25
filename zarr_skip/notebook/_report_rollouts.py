"""The report's rollouts of one step: a list of every shown rollout (answer beside the ground
truth, sortable and filterable with the page's optional script), then the GRPO groups' cards.

Only the shown rows are read (the ``uid`` column whole, to form the groups).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_skip.views._html import Markup, esc, legend
from zarr_skip.views._rows import Rollout, RolloutReader, take
from zarr_skip.views.groups import group_html
from zarr_skip.views.rollouts import page_html, summary_html

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = ["chosen_rows", "ground_truths", "step_section"]

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
LIST_HEADERS = ("row", "group", "data source", "length", "truncated", "score", "advantage", "answer", "ground truth")


def chosen_rows(reader: RolloutReader, limit: int) -> list[tuple[str | None, np.ndarray]]:
    """Whole GRPO groups, in the order they first appear, until ``limit`` rows are chosen (at
    least one group); without a ``uid`` column the first ``limit`` rows, ungrouped."""
    n = len(reader)
    if "uid" not in reader.view:
        return [(None, np.arange(min(n, limit), dtype=np.int64))]
    uids = reader.uids()
    _, first = np.unique(uids, return_index=True)
    out: list[tuple[str | None, np.ndarray]] = []
    taken = 0
    for start in np.sort(first):
        if out and taken >= limit:
            break
        rows = np.flatnonzero(uids == uids[start])
        out.append((str(uids[start]), rows))
        taken += len(rows)
    return out


def _truth_text(value: Any) -> str | None:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        value = value.get("ground_truth")
    if value is None:
        return None
    if isinstance(value, str | int | float | bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def ground_truths(view: StepView, rows: np.ndarray) -> dict[int, str | None]:
    """Each row's ``reward_model["ground_truth"]`` as text (rows without one: ``None``)."""
    if "reward_model" not in view or not len(rows):
        return {int(r): None for r in rows}
    order = np.sort(rows)
    values = take(view["reward_model"], order)
    return {int(r): _truth_text(v) for r, v in zip(order.tolist(), values, strict=True)}


def _answer(r: Rollout) -> str:
    """What the response answered: its last ``\\boxed{}``, else its last line (clipped)."""
    text = r.response_text
    if text is None:
        return " ".join(map(str, r.response_ids[-12:].tolist()))
    found = _BOXED.findall(text)
    if found:
        return str(found[-1])
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= 100 else "…" + last[-99:]


def _list_row(r: Rollout, truth: str | None) -> str:
    answer = _answer(r)
    correct = "" if r.score is None or not np.isfinite(r.score) else "yes" if r.score > 0 else "no"
    cells: list[tuple[object, str, bool]] = [
        (r.row, str(r.row), True),
        ((r.uid or "")[:8], r.uid or "", False),
        (r.data_source or "", r.data_source or "", False),
        (r.length, str(r.length), True),
        ("yes" if r.truncated else "", "1" if r.truncated else "0", False),
        ("-" if r.score is None else f"{r.score:.4g}", "" if r.score is None else f"{r.score:.6g}", True),
        (
            "-" if r.advantage is None else f"{r.advantage:.4g}",
            "" if r.advantage is None else f"{r.advantage:.6g}",
            True,
        ),
        (answer, answer, False),
        (truth if truth is not None else "-", truth or "", False),
    ]
    tds = "".join(
        f'<td class="zs-num" data-v="{esc(v)}">{esc(t)}</td>' if num else f'<td data-v="{esc(v)}">{esc(t)}</td>'
        for t, v, num in cells
    )
    flags = f' data-correct="{correct}" data-truncated="{"yes" if r.truncated else "no"}"'
    return f'<tr data-row="{r.row}"{flags}>{tds}</tr>'


def _rollout_list(step: int, rollouts: list[Rollout], truths: dict[int, str | None]) -> Markup:
    head = "".join(f"<th>{esc(h)}</th>" for h in LIST_HEADERS)
    body = "".join(_list_row(r, truths.get(r.row)) for r in rollouts)
    return Markup(
        f'<table class="zs-table zs-sortable zs-filterable" data-table="rollouts-{step}">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def _head(view: StepView, groups: list[tuple[str | None, np.ndarray]], rollouts: list[Rollout]) -> str:
    shown = sum(len(r) for _, r in groups)
    what = f"{len(groups)} group{'s' if len(groups) != 1 else ''}" if groups and groups[0][0] is not None else "rows"
    head = f"{len(view)} rows; showing {shown} ({what})"
    scores = [r.score for r in rollouts if r.score is not None and np.isfinite(r.score)]
    if scores:
        head += f"; mean score of those shown {np.mean(scores):.4g}"
    limit = rollouts[0].max_length if rollouts else None
    if limit is not None:
        head += f"; {np.mean([r.truncated for r in rollouts]):.0%} truncated at {limit}"
    return head


def step_section(view: StepView, dec: Any, max_length: int | None, rows: int, tokens: bool) -> Markup:
    """One step's rollouts: the list, then the groups (each with its ground truth)."""
    start = (
        f'<section class="zs-step" id="step-{view.step}" data-step="{view.step}"><h2>rollouts of step {view.step}</h2>'
    )
    if "responses" not in view:
        columns = ", ".join(view.columns)
        return Markup(f'{start}<div class="zs-muted">no responses column (columns: {esc(columns)})</div></section>')
    reader = RolloutReader(view, dec, max_length)
    groups = chosen_rows(reader, rows)
    every = np.concatenate([r for _, r in groups]) if groups else np.empty(0, np.int64)
    read = reader.read(every, tokens=tokens and dec is not None)  # a read per column
    by_row = {r.row: r for r in read}
    truths = ground_truths(view, every)
    hint = legend() if tokens and dec is not None else Markup("")
    if dec is None:
        hint = Markup('<div class="zs-muted">no tokenizer: token ids shown (pass --tokenizer PATH)</div>')
    body = [f'<div class="zs-muted">{esc(_head(view, groups, read))}</div>{hint}']
    body.append(_rollout_list(view.step, [by_row[int(i)] for i in every], truths))
    drawn: list[str] = []
    firsts: list[int] = []
    for uid, group in groups:
        items = [by_row[int(i)] for i in group]
        if uid is None:
            drawn += [summary_html(r) for r in items]
            firsts += [r.row for r in items]
            continue
        truth = truths.get(int(group[0]))
        said = f'<div class="zs-truth">ground truth: <b>{esc(truth)}</b></div>' if truth is not None else ""
        drawn.append(f'<div class="zs-group" data-uid="{esc(uid)}">{said}{group_html(uid, items, style=False)}</div>')
        firsts.append(int(group[0]))
    body.append(page_html(drawn, firsts))  # at most PAGE_CHARS of rows per step
    return Markup(f"{start}{''.join(body)}</section>")
