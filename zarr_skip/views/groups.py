"""A GRPO group: the ``n`` responses to one prompt (rows sharing a ``uid``), side by side.

``view.group(uid)`` (or ``view.group(row=i)``, the group of row ``i``) returns a
:class:`GroupView`. Finding the rows reads the ``uid`` column; showing the group reads those
rows only. Scores and advantages are shown when columns hold them; the best and the worst
scored responses are marked (none when every response scored the same).
"""

from __future__ import annotations

import numpy as np

from zarr_skip.errors import ConfigTypeError, GroupNotFoundError, RowIndexError
from zarr_skip.format.escapes import terminal_text
from zarr_skip.views._html import Markup, badge, esc, wrap
from zarr_skip.views._rows import Rollout, RolloutReader
from zarr_skip.views.limits import clip_text
from zarr_skip.views.rollouts import (
    TEXT_IDS,
    Rows,
    badge_items,
    badges,
    ids_text,
    prompt_html,
    response_html,
    tokens_html,
    wrapped,
)

__all__ = ["GroupView", "group_html", "group_rows", "group_text", "marks"]


def group_rows(reader: RolloutReader, uid: object = None, *, row: int | None = None) -> tuple[str, np.ndarray]:
    """``(uid, rows)`` of the group named by ``uid``, or of the group holding ``row``.

    Raises
    ------
    KeyError
        No ``uid`` column, or no row has this uid.
    """
    if (uid is None) == (row is None):
        raise ConfigTypeError("group: give a uid or row=, not both")
    uids = reader.uids()  # the uid column, whole: a few bytes per row
    if row is not None:
        n = len(uids)
        if not -n <= row < n:
            raise RowIndexError(f"step {reader.view.step}: row {row} out of range for {n} rows")
        uid = uids[row]
    key = str(uid)
    rows = np.flatnonzero(uids == key)
    if not rows.size:
        raise GroupNotFoundError(
            f"step {reader.view.step}: no row has uid {key!r} ({len(set(uids.tolist()))} uids in the step)"
        )
    return key, rows


def marks(rollouts: list[Rollout]) -> dict[int, str]:
    """Row -> ``best`` / ``worst`` for the highest and lowest scored rollouts (ties all marked);
    empty without scores or when every score is the same."""
    scored = [(r.row, r.score) for r in rollouts if r.score is not None and np.isfinite(r.score)]
    if not scored:
        return {}
    values = [s for _, s in scored]
    hi, lo = max(values), min(values)
    if hi == lo:
        return {}
    return {row: "best" if s == hi else "worst" for row, s in scored if s in (hi, lo)}


def _summary(uid: str, rollouts: list[Rollout]) -> list[str]:
    out = [f"{len(rollouts)} responses"]
    scores = [r.score for r in rollouts if r.score is not None and np.isfinite(r.score)]
    if scores:
        out.append(f"mean score {np.mean(scores):.4g}, from {min(scores):.4g} to {max(scores):.4g}")
    unscored = sum(r.score is not None and not np.isfinite(r.score) for r in rollouts)
    if unscored:
        out.append(f"{unscored} without a finite score")
    if rollouts and rollouts[0].max_length is not None:
        out.append(f"{sum(r.truncated for r in rollouts)} truncated")
    lengths = [r.length for r in rollouts]
    if lengths:
        span = f"{min(lengths)}–{max(lengths)}" if min(lengths) != max(lengths) else f"all {lengths[0]}"
        out.append(f"lengths {span} tokens")
    return out


def group_html(uid: str, rollouts: list[Rollout], *, style: bool = True) -> Markup:
    """The group: its prompt once, then one card per response with its badges, best and worst
    marked (and, for rollouts read with their tokens, the tokens by log-prob, folded)."""
    tokens = bool(rollouts) and all(r.response_tokens is not None for r in rollouts)
    step = rollouts[0].step if rollouts else "?"
    head = f'<div class="zs-head">step {esc(step)}, group {esc(uid)}</div>'
    head += f'<div class="zs-muted">{esc("; ".join(_summary(uid, rollouts)))}</div>'
    prompt = prompt_html(rollouts[0]) if rollouts else Markup("")
    marked = marks(rollouts)
    if rollouts and not marked and rollouts[0].score is not None:
        head += f'<div class="zs-muted">{esc("every response scored the same: no best or worst")}</div>'
    cards = []
    for r in rollouts:
        mark = marked.get(r.row, "")
        flag = badge("★ best", "ok") if mark == "best" else badge("✗ worst", "bad") if mark == "worst" else ""
        cls = f"zs-card zs-{mark}" if mark else "zs-card"
        cards.append(
            f'<div class="{cls}" data-row="{r.row}"><div><b>row {r.row}</b> {flag}</div>'
            f"<div>{badges(r)}</div>{response_html(r)}{tokens_html(r, opened=False, key=False) if tokens else ''}</div>"
        )
    return wrap(f'{head}{prompt}<div class="zs-grid">{"".join(cards)}</div>', style=style)


def group_text(uid: str, rollouts: list[Rollout]) -> str:
    """The group as text: the prompt once, each response with its badges and mark."""
    step = rollouts[0].step if rollouts else "?"
    lines = [f"step {step}, group {uid}: " + "; ".join(_summary(uid, rollouts))]
    if rollouts and rollouts[0].prompt_messages:
        for role, content in rollouts[0].prompt_messages:
            lines += [f"  [{role}]"] + wrapped("".join(clip_text(content)), "    ")
    elif rollouts and rollouts[0].prompt_text is not None:
        lines += wrapped("".join(clip_text(rollouts[0].prompt_text)))
    marked = marks(rollouts)
    for r in rollouts:
        mark = {"best": "  ★ best", "worst": "  ✗ worst"}.get(marked.get(r.row, ""), "")
        lines.append(f"- row {r.row}: " + " · ".join(t for t, _, _ in badge_items(r)) + mark)
        text = r.response_text if r.response_text is not None else ids_text(r.response_ids, TEXT_IDS)
        lines += wrapped("".join(clip_text(text)), "    ")
    return "\n".join(lines)


class GroupView(Rows):
    """The responses of one GRPO group (``view.group(uid)``); reads its rows when first shown.

    Attributes
    ----------
    uid : the group's uid.
    rows : its rows in the step, in order.
    """

    def __init__(self, reader: RolloutReader, uid: object = None, *, row: int | None = None) -> None:
        self.uid, rows = group_rows(reader, uid, row=row)
        super().__init__(reader, rows)

    @property
    def best(self) -> list[int]:
        """Rows of the highest scored responses (empty without scores or when all tie)."""
        return [row for row, m in marks(self.rollouts()).items() if m == "best"]

    @property
    def worst(self) -> list[int]:
        """Rows of the lowest scored responses (empty without scores or when all tie)."""
        return [row for row, m in marks(self.rollouts()).items() if m == "worst"]

    def _repr_html_(self) -> str:
        return group_html(self.uid, self.rollouts())

    def __repr__(self) -> str:
        return terminal_text(group_text(self.uid, self.rollouts()))
