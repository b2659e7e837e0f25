"""One rollout, and a list of them (a page of a step, the rows a search found), as HTML and text.

``view.rollout(i)``, ``view.page(k)`` and ``view.find(...)`` return the objects defined here.
They are lazy: making one reads nothing (a search reads the columns it filters on); showing
one reads the rows it shows, once. Every string is escaped; the HTML needs no JavaScript.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from zarr_skip.errors import RowIndexError
from zarr_skip.format import args
from zarr_skip.format.escapes import terminal_text
from zarr_skip.views._html import Markup, badge, esc, legend, message, token_spans, wrap
from zarr_skip.views._rows import Rollout, RolloutReader
from zarr_skip.views.limits import IDS_SHOWN, PAGE_CHARS, TOKENS_SHOWN, clip_text, more

if TYPE_CHECKING:
    from zarr_skip.lazy import StepView

__all__ = [
    "RolloutList",
    "RolloutView",
    "badge_items",
    "badges",
    "ids_text",
    "prompt_html",
    "response_html",
    "rollout_html",
    "rollout_text",
    "summary_html",
    "wrapped",
]

#: characters of a response shown in a list's one-line summary
PREVIEW_CHARS = 160
#: width of the text rendering
WIDTH = 100
#: token ids a text rendering shows of a prompt or response without a tokenizer
TEXT_IDS = 64
NO_TOKENIZER = (
    "token ids shown: pass tokenizer= (a tokenizers.Tokenizer, a transformers tokenizer, or the path "
    "of a local tokenizer.json or tokenizer directory) to read the text"
)


def _number(x: float) -> str:
    return f"{x:.4g}"


def badge_items(r: Rollout) -> list[tuple[str, str, str]]:
    """``(text, kind, title)`` of a rollout's badges: length, truncation, score, advantage,
    data source."""
    out = [(f"{r.length} tokens", "", "response length")]
    if r.max_length is not None:
        if r.truncated:
            out.append((f"truncated at {r.max_length}", "warn", "the response reached the maximum length"))
        else:
            out.append(("finished", "ok", f"ended before the maximum length ({r.max_length})"))
    if r.score is not None:
        out.append((f"score {_number(r.score)}", "info", "score of the row"))
    if r.advantage is not None:
        out.append((f"advantage {r.advantage:+.3g}", "", "advantage (mean over the response tokens)"))
    if r.data_source:
        out.append((r.data_source, "", "data source"))
    return out


def badges(r: Rollout) -> Markup:
    """The rollout's badges as HTML."""
    return Markup("".join(badge(t, k, title) for t, k, title in badge_items(r)))


def ids_text(ids: np.ndarray | None, limit: int | None = None) -> str:
    """Token ids as text; ``limit`` keeps the first ones and says how many more there are."""
    if ids is None:
        return ""
    text = " ".join(str(int(i)) for i in ids[:limit])
    return text + (more(len(ids) - limit, "ids") if limit is not None and len(ids) > limit else "")


def text_html(text: str) -> Markup:
    """``text`` escaped, cut to :data:`~zarr_skip.views.limits.TEXT_CHARS` with a visible marker."""
    shown, rest = clip_text(text)
    return Markup(esc(shown) + (f'<span class="zs-muted zs-more">{esc(rest)}</span>' if rest else ""))


def prompt_html(r: Rollout) -> Markup:
    if r.prompt_messages:
        body = "".join(message(role, text_html(content)) for role, content in r.prompt_messages)
        what = f"{len(r.prompt_messages)} message{'s' if len(r.prompt_messages) != 1 else ''}"
    elif r.prompt_text is not None:
        body, what = f'<div class="zs-text">{text_html(r.prompt_text)}</div>', "decoded"
    elif r.prompt_ids is not None:
        body, what = f'<div class="zs-text">{text_html(ids_text(r.prompt_ids, IDS_SHOWN))}</div>', "token ids"
    else:
        return Markup("")
    n = "" if r.prompt_ids is None else f", {len(r.prompt_ids)} tokens"
    return Markup(f"<details open><summary>prompt ({what}{n})</summary>{body}</details>")


def response_html(r: Rollout) -> Markup:
    text = r.response_text if r.response_text is not None else ids_text(r.response_ids, IDS_SHOWN)
    return Markup(f'<div class="zs-text zs-response">{text_html(text)}</div>')


def tokens_html(r: Rollout, *, opened: bool = True, key: bool = True) -> Markup:
    """The response's tokens coloured by log-prob (exact values on hover), folded unless
    ``opened``, under the colours' legend when ``key``."""
    ids = r.response_ids[:TOKENS_SHOWN]
    tokens = list(r.response_tokens)[:TOKENS_SHOWN] if r.response_tokens is not None else [f"{int(i)} " for i in ids]
    lp = None if r.log_probs is None else r.log_probs[:TOKENS_SHOWN].tolist()
    title = "response tokens" + (" coloured by log-prob" if lp is not None else " (no log-prob column)")
    spans = token_spans(tokens, lp, ids.tolist())
    if len(r.response_ids) > TOKENS_SHOWN:
        spans = Markup(
            spans + f'<span class="zs-muted zs-more">{esc(more(len(r.response_ids) - TOKENS_SHOWN, "tokens"))}</span>'
        )
    shown = legend() if lp is not None and key else Markup("")
    return Markup(
        f"<details{' open' if opened else ''}><summary>{esc(title)}</summary>{shown}"
        f"<div class='zs-text zs-tokens'>{spans}</div></details>"
    )


def _where(r: Rollout) -> str:
    return f"step {r.step}, row {r.row}" + (f", uid {r.uid}" if r.uid else "")


def rollout_html(r: Rollout, *, tokens: bool = True, style: bool = True) -> Markup:
    """One rollout: where it is, its badges, the prompt (as chat messages when stored), the
    response text and (``tokens``) its tokens coloured by log-prob."""
    parts = [f'<div class="zs-head">{esc(_where(r))}</div><div>{badges(r)}</div>', prompt_html(r)]
    parts.append(f"<div class='zs-head'>response</div>{response_html(r)}")
    if tokens:
        parts.append(tokens_html(r))
    if r.response_text is None:
        parts.append(f'<div class="zs-muted">{esc(NO_TOKENIZER)}</div>')
    return wrap(f'<div class="zs-rollout" data-row="{r.row}">{"".join(parts)}</div>', style=style)


def _preview(r: Rollout) -> str:
    text = r.response_text if r.response_text is not None else ids_text(r.response_ids[:40])
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def summary_html(r: Rollout) -> Markup:
    """A rollout folded to one line (row, badges, the response's start) that opens on its
    prompt and full response."""
    head = f"<b>row {r.row}</b> {badges(r)} <span class='zs-muted'>{esc(_preview(r))}</span>"
    body = prompt_html(r) + Markup(f"<div class='zs-head'>response</div>{response_html(r)}")
    return Markup(f'<details class="zs-rollout" data-row="{r.row}"><summary>{head}</summary>{body}</details>')


def page_html(drawn: Sequence[str], rows: Sequence[int], budget: int = PAGE_CHARS) -> Markup:
    """Rows drawn one after the other until the page holds ``budget`` characters; the rows past
    it are named in a marker (see :data:`~zarr_skip.views.limits.PAGE_CHARS`)."""
    out: list[str] = []
    size = 0
    for k, html in enumerate(drawn):
        if out and size + len(html) > budget:
            left = [str(r) for r in rows[k:]]
            note = f"{more(len(left), 'rows')} not drawn (the page reached its size limit): rows {', '.join(left[:20])}"
            out.append(f'<div class="zs-muted zs-more">{esc(note + (" …" if len(left) > 20 else ""))}</div>')
            break
        out.append(html)
        size += len(html)
    return Markup("".join(out))


def wrapped(text: str, indent: str = "  ") -> list[str]:
    lines = []
    for line in text.splitlines() or [""]:
        lines += textwrap.wrap(line, WIDTH, initial_indent=indent, subsequent_indent=indent) or [indent]
    return lines


def rollout_text(r: Rollout) -> str:
    """One rollout as text: the same badges, the prompt and the response, wrapped."""
    lines = [" · ".join([_where(r)] + [t for t, _, _ in badge_items(r)])]
    if r.prompt_messages:
        lines.append("prompt:")
        for role, content in r.prompt_messages:
            lines += [f"  [{role}]"] + wrapped("".join(clip_text(content)), "    ")
    elif r.prompt_text is not None or r.prompt_ids is not None:
        lines.append("prompt:")
        text = r.prompt_text if r.prompt_text is not None else ids_text(r.prompt_ids, TEXT_IDS)
        lines += wrapped("".join(clip_text(text)))
    lines.append("response:")
    text = r.response_text if r.response_text is not None else ids_text(r.response_ids, TEXT_IDS)
    lines += wrapped("".join(clip_text(text)))
    if r.response_text is None:
        lines.append(f"({NO_TOKENIZER})")
    return "\n".join(lines)


class RolloutView:
    """One row of a step, drawn in full (``view.rollout(i)``); reads the row when first shown."""

    def __init__(self, reader: RolloutReader, row: int) -> None:
        n = len(reader)
        i = row + n if row < 0 else row
        if not 0 <= i < n:
            raise RowIndexError(f"step {reader.view.step}: row {row} out of range for {n} rows")
        self._reader = reader
        self.row = i
        self._rollout: Rollout | None = None

    @property
    def rollout(self) -> Rollout:
        """The row's :class:`Rollout` (read once)."""
        if self._rollout is None:
            (self._rollout,) = self._reader.read([self.row], tokens=True)
        return self._rollout

    def _repr_html_(self) -> str:
        return rollout_html(self.rollout)

    def __repr__(self) -> str:
        return terminal_text(rollout_text(self.rollout))


class Rows:
    """Some rows of a step, read together (one read per column) when first needed.

    Attributes
    ----------
    rows : the row numbers, in the order shown.
    """

    def __init__(self, reader: RolloutReader, rows: Sequence[int] | np.ndarray) -> None:
        self._reader = reader
        self.rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        self._rollouts: list[Rollout] | None = None

    @property
    def view(self) -> StepView:
        return self._reader.view

    def __len__(self) -> int:
        return len(self.rows)

    def rollouts(self) -> list[Rollout]:
        """The :class:`Rollout` of every row (read once, in one read per column)."""
        if self._rollouts is None:
            self._rollouts = self._reader.read(self.rows)
        return self._rollouts

    def rollout(self, k: int) -> RolloutView:
        """The ``k``-th of these rows in full (negative ``k`` from the end)."""
        k = args.row(k, len(self.rows), "k", f"step {self.view.step}: rollout")
        return RolloutView(self._reader, int(self.rows[k]))


class RolloutList(Rows):
    """Rows of a step (a page, or what :meth:`StepView.find` found), each folded to one line.

    Attributes
    ----------
    rows : the row numbers, in the order shown.
    title : what the list is.
    note : a remark shown under the title (the next page, how many more matched).
    """

    def __init__(self, reader: RolloutReader, rows: Sequence[int] | np.ndarray, title: str, note: str = "") -> None:
        super().__init__(reader, rows)
        self.title = title
        self.note = note

    def _repr_html_(self) -> str:
        items = self.rollouts()
        head = f'<div class="zs-head">{esc(self.title)}</div>'
        if self.note:
            head += f'<div class="zs-muted">{esc(self.note)}</div>'
        if items and items[0].response_text is None:
            head += f'<div class="zs-muted">{esc(NO_TOKENIZER)}</div>'
        body = (
            page_html([summary_html(r) for r in items], [r.row for r in items]) or '<div class="zs-muted">no rows</div>'
        )
        return wrap(head + f'<div class="zs-list">{body}</div>')

    def __repr__(self) -> str:
        lines = [self.title] + ([self.note] if self.note else [])
        if self.rollouts() and self.rollouts()[0].response_text is None:
            lines.append(f"({NO_TOKENIZER})")
        for r in self.rollouts():
            lines.append(f"  row {r.row:>6}  " + " · ".join(t for t, _, _ in badge_items(r)))
            lines.append("          " + _preview(r))
        return terminal_text("\n".join(lines))
