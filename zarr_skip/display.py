"""Text and HTML renderings of caches, steps and columns (metadata and a few rows only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cache import Cache
    from .lazy import LazyColumn, StepView


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def cache_repr(cache: Cache) -> str:
    head = f"<zarr_skip.Cache {cache.location!r} experiment={cache.experiment!r}"
    if cache.experiment is None:
        return head + f" experiments={list(cache.experiments())}>"
    infos = cache.status()
    done = sum(i.complete for i in infos)
    return head + f" steps={len(infos)} complete={done}>"


def cache_html(cache: Cache) -> str:
    return f"<pre>{_esc(cache_repr(cache))}</pre>"


def step_repr(view: StepView) -> str:
    cols = ", ".join(f"{n}:{s.kind}[{s.dtype}]" for n, s in view.schema.items())
    return f"<zarr_skip.StepView step={view.step} rows={len(view)} minibatches={len(view.parts)} columns=({cols})>"


def step_html(view: StepView) -> str:
    return f"<pre>{_esc(step_repr(view))}</pre>"


def column_repr(col: LazyColumn) -> str:
    s = col.spec
    return f"<zarr_skip.LazyColumn {col.name!r} step={col.step} kind={s.kind} dtype={s.dtype} rows={len(col)} shape={list(s.shape)}>"


def column_html(col: LazyColumn) -> str:
    return f"<pre>{_esc(column_repr(col))}</pre>"


def _esc(text: Any) -> str:
    import html

    return html.escape(str(text))
