"""``zarr-skip show --text``: decoded rollouts, wrapped, with their badges as text."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from zarr_skip.cli._format import clip

if TYPE_CHECKING:
    from zarr_skip.cli._context import Context

__all__ = ["badges", "cmd_show_text", "render_rollout"]

WRAP = 100  # characters of a wrapped line
INDENT = "    "


def _number(x: float) -> str:
    return f"{x:.4g}"


def badges(record: dict[str, Any], limit: int | None) -> list[str]:
    """The record's badges: data source, length (of the limit), truncated, score, reward, acc."""
    out = []
    if record.get("data_source"):
        out.append(str(record["data_source"]))
    length = record.get("response_length")
    if length is not None:
        out.append(f"{length}/{limit} tokens" if limit else f"{length} tokens")
    if record.get("truncated"):
        out.append(f"TRUNCATED at {limit}")
    for name in ("score", "reward", "advantage"):
        value = record.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(f"{name} {_number(value)}")
    if record.get("acc") is not None:
        out.append("correct" if record["acc"] else "wrong")
    return out


def _wrapped(text: str, width: int) -> list[str]:
    lines = []
    for line in text.splitlines() or [""]:
        lines += textwrap.wrap(line, width - len(INDENT), replace_whitespace=False, drop_whitespace=True) or [""]
    return [INDENT + line for line in lines]


def render_rollout(record: dict[str, Any], limit: int | None, width: int = WRAP) -> list[str]:
    """One rollout as text lines: a header with its badges, the prompt (chat messages when the
    step has them), the response; ids instead of text when there is no tokenizer."""
    head = f"── row {record.get('zs_row', record['row'])}"
    if record.get("uid") is not None:
        head += f" · uid {record['uid']}"
    lines = [head, INDENT + " ".join(f"[{b}]" for b in badges(record, limit))]
    messages = record.get("messages") or []
    for m in messages:
        lines.append(f"{m['role'] or 'message'}:")
        lines += _wrapped(str(m["content"]), width)
    for field in ("prompt", "response"):
        if field == "prompt" and messages:
            continue
        if record.get(field) is not None:
            lines.append(f"{field}:")
            lines += _wrapped(record[field], width)
        elif record.get(f"{field}_ids") is not None:
            lines.append(f"{field} ids ({record[f'{field}_length']}):")
            lines.append(INDENT + clip(str(record[f"{field}_ids"]), width - len(INDENT)))
    return lines


def cmd_show_text(ctx: Context, name: str, cache: Any, step: int) -> int:
    """Decoded rollouts of one step: ``--rows N`` first rows, ``--row N`` or the ``--uid`` group."""
    from zarr_skip.errors import TokenizerNotFoundError
    from zarr_skip.views.records import max_response_length, rollouts, select
    from zarr_skip.views.text import require_tokenizer
    from zarr_skip.views.tokenizers import tokenizer_for

    view = cache.load(step)
    try:
        rows = select(view, rows=ctx.args.rows, uid=ctx.args.uid, row=ctx.args.row)
    except (KeyError, IndexError) as exc:  # no such uid (or no uid column), no such row
        from zarr_skip.cli._context import UsageError

        raise UsageError(exc.args[0]) from None
    decoder = tokenizer_for(view, ctx.tokenizer())
    if decoder is None:
        try:
            require_tokenizer(view)
        except TokenizerNotFoundError as exc:  # say why, then show the ids
            ctx.warn(f"{str(exc).split('; pass')[0]}: showing token ids; pass --tokenizer PATH to read text")
    records = rollouts(view, rows, decoder=decoder)
    limit = max_response_length(view)
    if ctx.json:
        ctx.emit(
            {
                "location": str(ctx.args.location),
                "experiment": name,
                "step": step,
                "rows": len(view),
                "max_response_length": limit,
                "tokenizer": None if decoder is None else repr(decoder),
                "rollouts": records,
            }
        )
        return 0
    what = f"first {len(records)}"
    if ctx.args.row is not None:
        what = f"row {ctx.args.row % len(view)}"
    elif ctx.args.uid is not None:
        what = f"uid {records[0]['uid'] if records else ctx.args.uid}"
    ctx.say(f"step {step} of {name}: {len(view)} rows, {what} shown")
    for record in records:
        ctx.say()
        for line in render_rollout(record, limit):
            ctx.say(line)
    return 0
