"""HTML building blocks of the rollout views: one stylesheet, badges, tokens coloured by log-prob.

Pure functions of what they draw (strings and numbers), no I/O. Every value is escaped here;
callers pass plain text and get markup back as :class:`Markup`, which is never escaped again.

The stylesheet scopes everything under ``.zs-r`` and draws with CSS variables: Jupyter's own
theme variables where they exist (``--jp-*``, so JupyterLab's light and dark themes are
followed), otherwise the colours of the page's colour scheme (``prefers-color-scheme``, and
JupyterLab's ``data-jp-theme-light`` or VS Code's ``vscode-dark`` on ``<body>``). A view paints
its own background with its text colour, so it stays readable on a page whose colours it
cannot know (a light notebook on a system that prefers dark). Nothing needs JavaScript: long
texts sit in ``<details>`` elements and scrolling boxes.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

from zarr_skip.format.escapes import utf8_text

__all__ = [
    "CSS",
    "LOGPROB_BINS",
    "Markup",
    "badge",
    "esc",
    "legend",
    "logprob_class",
    "message",
    "table",
    "token_spans",
    "wrap",
]


class Markup(str):
    """Text that is already HTML: :func:`esc` passes it through unchanged."""


def esc(value: object) -> Markup:
    """``value`` as HTML text (quotes escaped too, so it is safe inside attributes; a lone
    surrogate shown as ``\\ud800``, so the page can be encoded)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(utf8_text(str(value)), quote=True))


#: upper bounds of the probability bins tokens are coloured by (p = exp(log-prob)), most
#: surprising first; a token with p above the last bound is not coloured
LOGPROB_BINS = (0.01, 0.1, 0.5, 0.9)

_LIGHT = """
  --zs-fg: var(--jp-content-font-color1, #1f2328);
  --zs-muted: var(--jp-content-font-color2, #59636e);
  --zs-bg: var(--jp-layout-color0, #ffffff);
  --zs-panel: var(--jp-layout-color1, #f6f8fa);
  --zs-border: var(--jp-border-color2, #d1d9e0);
  --zs-user: #ddf4ff; --zs-assistant: #f6f8fa; --zs-system: #fff8c5;
  --zs-ok-fg: #116329; --zs-ok-bg: #dafbe1;
  --zs-warn-fg: #7d4e00; --zs-warn-bg: #fff1c2;
  --zs-bad-fg: #a40e26; --zs-bad-bg: #ffebe9;
  --zs-info-fg: #0550ae; --zs-info-bg: #ddf4ff;
  --zs-p0: rgba(215, 38, 56, 0.55); --zs-p1: rgba(244, 109, 67, 0.45);
  --zs-p2: rgba(253, 174, 97, 0.45); --zs-p3: rgba(254, 224, 139, 0.5);
"""
_DARK = """
  --zs-fg: var(--jp-content-font-color1, #e6edf3);
  --zs-muted: var(--jp-content-font-color2, #9198a1);
  --zs-bg: var(--jp-layout-color0, #0d1117);
  --zs-panel: var(--jp-layout-color1, #161b22);
  --zs-border: var(--jp-border-color2, #3d444d);
  --zs-user: #0c2d48; --zs-assistant: #1c2128; --zs-system: #3b2e00;
  --zs-ok-fg: #7ee2a8; --zs-ok-bg: #0f3d24;
  --zs-warn-fg: #f2cc60; --zs-warn-bg: #4a3500;
  --zs-bad-fg: #ffa198; --zs-bad-bg: #5c1a1a;
  --zs-info-fg: #9ecbff; --zs-info-bg: #0c2d48;
  --zs-p0: rgba(248, 81, 73, 0.65); --zs-p1: rgba(240, 136, 62, 0.55);
  --zs-p2: rgba(210, 153, 34, 0.5); --zs-p3: rgba(187, 128, 9, 0.35);
"""
_RULES = """
.zs-r { color: var(--zs-fg); background: var(--zs-bg); font-size: 13px; line-height: 1.45; max-width: 100%;
  font-family: var(--jp-ui-font-family, system-ui, -apple-system, "Segoe UI", Roboto, sans-serif);
  box-sizing: border-box; padding: 2px 4px; border-radius: 4px; }
.zs-r *, .zs-r *::before, .zs-r *::after { box-sizing: border-box; }
.zs-r .zs-r { padding: 0; }
.zs-r .zs-head { font-weight: 600; margin: 4px 0; }
.zs-r .zs-muted { color: var(--zs-muted); }
.zs-r .zs-badge { display: inline-block; border-radius: 9px; padding: 0 7px; margin: 1px 3px 1px 0;
  font-size: 11px; font-weight: 600; border: 1px solid var(--zs-border); color: var(--zs-fg); }
.zs-r .zs-ok { color: var(--zs-ok-fg); background: var(--zs-ok-bg); border-color: transparent; }
.zs-r .zs-warn { color: var(--zs-warn-fg); background: var(--zs-warn-bg); border-color: transparent; }
.zs-r .zs-bad { color: var(--zs-bad-fg); background: var(--zs-bad-bg); border-color: transparent; }
.zs-r .zs-info { color: var(--zs-info-fg); background: var(--zs-info-bg); border-color: transparent; }
.zs-r .zs-text { white-space: pre-wrap; word-break: break-word; overflow-wrap: anywhere;
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px;
  background: var(--zs-panel); border: 1px solid var(--zs-border); border-radius: 6px;
  padding: 6px 8px; margin: 3px 0; max-height: 28em; overflow: auto; }
.zs-r .zs-msg { border-radius: 6px; padding: 4px 8px; margin: 3px 0; border: 1px solid var(--zs-border); }
.zs-r .zs-msg .zs-role { font-size: 11px; font-weight: 700; text-transform: uppercase; color: var(--zs-muted); }
.zs-r .zs-msg-user { background: var(--zs-user); }
.zs-r .zs-msg-assistant { background: var(--zs-assistant); }
.zs-r .zs-msg-system, .zs-r .zs-msg-tool { background: var(--zs-system); }
.zs-r .zs-t { border-radius: 2px; }
.zs-r .zs-p0 { background: var(--zs-p0); } .zs-r .zs-p1 { background: var(--zs-p1); }
.zs-r .zs-p2 { background: var(--zs-p2); } .zs-r .zs-p3 { background: var(--zs-p3); }
.zs-r .zs-legend { font-size: 11px; color: var(--zs-muted); margin: 2px 0; }
.zs-r .zs-legend span.zs-t { padding: 0 6px; margin-right: 4px; color: var(--zs-fg); }
.zs-r table.zs-table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
.zs-r table.zs-table th, .zs-r table.zs-table td { padding: 2px 8px; text-align: left; vertical-align: top;
  border-bottom: 1px solid var(--zs-border); }
.zs-r table.zs-table td.zs-num { text-align: right; font-variant-numeric: tabular-nums; }
.zs-r .zs-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 8px; }
.zs-r .zs-card { border: 1px solid var(--zs-border); border-radius: 8px; padding: 6px 8px; background: var(--zs-bg); }
.zs-r .zs-card.zs-best { border: 2px solid var(--zs-ok-fg); }
.zs-r .zs-card.zs-worst { border: 2px solid var(--zs-bad-fg); }
.zs-r .zs-card .zs-text { max-height: 18em; }
.zs-r details > summary { cursor: pointer; }
.zs-r .zs-rollout { border-top: 1px solid var(--zs-border); padding: 4px 0; }
"""
_DARK_WHERE = 'body[data-jp-theme-light="false"] .zs-r, body.vscode-dark .zs-r, .zs-r.zs-dark'
_LIGHT_WHERE = 'body[data-jp-theme-light="true"] .zs-r, body.vscode-light .zs-r'
#: the stylesheet every view carries (repeating it in each output keeps outputs self-contained)
CSS = (
    f".zs-r {{{_LIGHT}}}\n"
    f"@media (prefers-color-scheme: dark) {{ .zs-r {{{_DARK}}} {_LIGHT_WHERE} {{{_LIGHT}}} }}\n"
    f"{_DARK_WHERE} {{{_DARK}}}\n"
    f"{_RULES}"
)


def wrap(body: str, *, style: bool = True, cls: str = "") -> Markup:
    """A view's outer element (with the classes ``cls`` too), with the stylesheet unless
    ``style`` is false (a page that has it once in its head)."""
    css = f"<style>{CSS}</style>" if style else ""
    return Markup(f'<div class="{" ".join(["zs-r", *cls.split()])}">{css}{body}</div>')


def badge(text: object, kind: str = "", title: str | None = None) -> Markup:
    """A small rounded label; ``kind`` is ``ok``, ``warn``, ``bad``, ``info`` or plain."""
    cls = f"zs-badge zs-{kind}" if kind else "zs-badge"
    tip = f' title="{esc(title)}"' if title else ""
    return Markup(f'<span class="{cls}"{tip}>{esc(text)}</span>')


def message(role: object, content: object) -> Markup:
    """One chat message: its role above its text."""
    r = str(role)
    known = r if r in ("user", "assistant", "system", "tool") else "system"
    return Markup(
        f'<div class="zs-msg zs-msg-{known}"><div class="zs-role">{esc(r)}</div>'
        f'<div class="zs-text" style="background:transparent;border:0;padding:0;margin:0">{esc(content)}</div></div>'
    )


def logprob_class(logprob: float) -> str:
    """The colour class of a token of this log-prob: ``zs-p0`` (least likely) .. ``zs-p3``, or
    ``""`` for a likely token (and for a NaN)."""
    if math.isnan(logprob):
        return ""
    p = math.exp(min(logprob, 0.0))
    for i, bound in enumerate(LOGPROB_BINS):
        if p < bound:
            return f"zs-p{i}"
    return ""


def token_spans(tokens: Sequence[str], logprobs: Sequence[float] | None, ids: Sequence[int] | None = None) -> Markup:
    """Tokens one after the other, each coloured by its log-prob, its exact value (and id) in
    the hover title. ``logprobs`` may be shorter than ``tokens`` (or missing): the rest stay
    uncoloured."""
    out = []
    n = 0 if logprobs is None else len(logprobs)
    for i, tok in enumerate(tokens):
        tip = [f"#{i}"]
        if ids is not None and i < len(ids):
            tip.append(f"id {int(ids[i])}")
        cls = "zs-t"
        if i < n:
            lp = float(logprobs[i])  # type: ignore[index]
            cls = f"zs-t {logprob_class(lp)}".rstrip()
            tip.append(f"logprob {lp:.4f} (p={math.exp(min(lp, 0.0)):.3f})" if not math.isnan(lp) else "logprob nan")
        out.append(f'<span class="{cls}" title="{esc(" · ".join(tip))}">{esc(tok)}</span>')
    return Markup("".join(out))


def legend() -> Markup:
    """What the token colours mean."""
    labels = [f"p < {LOGPROB_BINS[0]:g}"]
    labels += [f"{lo:g} ≤ p < {hi:g}" for lo, hi in zip(LOGPROB_BINS, LOGPROB_BINS[1:], strict=False)]
    swatches = "".join(f'<span class="zs-t zs-p{i}">{esc(t)}</span>' for i, t in enumerate(labels))
    return Markup(
        f'<div class="zs-legend">token probability under the sampling policy: {swatches}'
        f"<span>p ≥ {LOGPROB_BINS[-1]:g}: plain</span> (hover a token for its exact log-prob)</div>"
    )


def table(headers: Iterable[object], rows: Iterable[Sequence[object]], numeric: Sequence[int] = ()) -> Markup:
    """A plain table; the columns numbered in ``numeric`` are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="zs-num">{esc(v)}</td>' if i in numeric else f"<td>{esc(v)}</td>" for i, v in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return Markup(f'<table class="zs-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
