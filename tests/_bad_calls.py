"""A generated table of bad calls to the reading API: every public method with bad rows,
columns, steps, criteria, dtypes, paths and tokenizers (issue 26, point 7); and to the calls
that write, replace, delete or unpickle: bad flags, pins, ages, attributes and callbacks.

:func:`bad_calls` lists ``(name, argument, call)``; :func:`run` makes every call and sorts the
outcomes: ``typed`` (a ``ZarrSkipError`` that also subclasses a builtin), ``untyped`` (any
other exception: must never happen), ``unnamed`` (typed, but the message names neither the
argument nor the value), ``ok`` (accepted: a value the API takes, such as an empty list).
Used by ``tests/test_bad_calls.py``.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import zarr_skip as zs

Call = tuple[str, str, Callable[[], Any]]

#: bad row selections: huge, negative, out of range, of the wrong type or shape
BAD_ROWS: tuple[Any, ...] = (
    10**20,
    -(10**20),
    2**63,
    16,
    -17,
    1.5,
    math.nan,
    "0",
    b"0",
    [0, 99],
    [0, 10**20],
    [-17],
    [0.5],
    ["a"],
    [[0, 1]],
    np.array([[0]]),
    np.array([1.5]),
    np.array(["a"]),
    np.array([99]),
    slice("a", None),
    slice(0, 4, 0),
    slice(0.5, 2),
    object(),
    {0},
    {"row": 0},
    complex(1, 0),
    (0, 99),
    np.float64(1.0),
    torch.tensor([0.5]),
    True,
)
BAD_COLUMNS: tuple[Any, ...] = ("nope", 3, b"responses", ["responses"], "", "../x", object(), 1.5, ("responses",))
BAD_TOKENIZERS: tuple[Any, ...] = (3, "/nonexistent/tok.json", "/etc/passwd", "/", object(), b"x", 1.5, ["a"])
BAD_MAX_LENGTH: tuple[Any, ...] = (-1, "10", 1.5, 10**20, object(), [1], math.nan)
BAD_STEPS: tuple[Any, ...] = (-1, "1", 1.5, 10**20, None, 99, True, [1], object(), math.nan, b"1")
BAD_INTS: tuple[Any, ...] = (-1, "a", 1.5, 10**20, None, object(), [1], math.nan, True)
#: flags (only True or False is taken: "false" or 1 are refused, not read as truthy)
BAD_FLAGS: tuple[Any, ...] = ("yes", "false", "no", 0, 1, None, object(), [True])
BAD_DTYPES: tuple[Any, ...] = ("nope", "int4", object(), 3.5, "U", [("a", "f4")], "bfloat16", torch.float32)
BAD_CRITERIA: tuple[tuple[str, Any], ...] = (
    ("nope", 1),
    ("score", "a"),
    ("score", (1,)),
    ("score", (1, 2, 3)),
    ("score", ("a", "b")),
    ("score", object()),
    ("truncated", "yes"),
    ("truncated", 2),
    ("text", 3),
    ("text", b"x"),
    ("regex", "yes"),
    ("longest", -1),
    ("longest", "a"),
    ("longest", 1.5),
    ("longest", 10**20),
    ("shortest", -1),
    ("best", "a"),
    ("worst", object()),
    ("limit", -1),
    ("limit", "a"),
    ("limit", 10**20),
    ("uid", object()),
    ("case", "yes"),
)


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@dataclass
class Outcomes:
    """What the calls did."""

    ok: list[str] = field(default_factory=list)
    typed: list[str] = field(default_factory=list)
    unnamed: list[str] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return len(self.ok) + len(self.typed) + len(self.untyped)


BUILTINS = (LookupError, ValueError, TypeError, OSError, ImportError, RuntimeError)


def run(calls: list[Call]) -> Outcomes:
    """Make every call; sort the outcomes (see the module docstring)."""
    out = Outcomes()
    for name, arg, call in calls:
        try:
            call()
        except zs.ZarrSkipError as exc:
            if not isinstance(exc, BUILTINS):
                out.untyped.append(f"{name}: {type(exc).__name__} refines no builtin")
                continue
            out.typed.append(name)
            text = str(exc)
            if arg and arg not in text:
                out.unnamed.append(f"{name}: {type(exc).__name__}: {text[:200]}")
        except Exception as exc:  # noqa: BLE001 - what the table is for
            where = traceback.extract_tb(exc.__traceback__)[-1]
            out.untyped.append(f"{name}: {type(exc).__name__}: {str(exc)[:160]} ({where.filename}:{where.lineno})")
        else:
            out.ok.append(name)
    return out


def bad_calls(cache: zs.Cache, step: int, root: Path) -> list[Call]:
    """The table: ``(name, argument, call)`` for a cache whose ``step`` holds 16 rows of
    ``text_rollouts`` and a ``bf16`` column; ``root`` is the cache's directory."""
    view = cache.load(step)
    return list(_row_calls(view)) + list(_other_calls(cache, view, step, root))


def _row_calls(view: Any) -> Iterator[Call]:
    col = view["responses"]
    for r in BAD_ROWS:
        tag = f"{r!r:.30}"
        yield f"text(rows={tag})", "rows", lambda r=r: view.text(rows=r)
        yield f"text(prompts, rows={tag})", "rows", lambda r=r: view.text("prompts", rows=r)
        yield f"messages(rows={tag})", "rows", lambda r=r: view.messages(r)
        yield f"rollout({tag})", "row", lambda r=r: view.rollout(r).rollout
        yield f"group(row={tag})", "row", lambda r=r: view.group(row=r)._repr_html_()
        yield f"responses[{tag}]", "rows", lambda r=r: col[r]
        yield f"uid[{tag}]", "rows", lambda r=r: view["uid"][r]
        yield f"score[{tag}]", "rows", lambda r=r: view["score"][r]
        yield f"bf16[{tag}]", "rows", lambda r=r: view["bf16"][r]
        yield f"page({tag})", "k", lambda r=r: view.page(r)._repr_html_()
        yield f"page(0, size={tag})", "size", lambda r=r: view.page(0, size=r)._repr_html_()
        yield f"find(limit={tag})", "limit", lambda r=r: view.find(limit=r)._repr_html_()


def _other_calls(cache: zs.Cache, view: Any, step: int, root: Path) -> Iterator[Call]:
    yield from _column_calls(cache, view)
    yield from _tokenizer_calls(view)
    for k, v in BAD_CRITERIA:
        yield f"find({k}={v!r:.20})", k, lambda k=k, v=v: view.find(**{k: v})._repr_html_()
    for uid in (object(), ["a", object()], 3.5, b"u", "no-such-uid"):
        yield f"group({uid!r:.20})", "uid", lambda uid=uid: view.group(uid)._repr_html_()
    yield "group(uid, row=0)", "row", lambda: view.group(view["uid"][0], row=0)._repr_html_()
    for s in BAD_STEPS:
        yield f"load({s!r:.20})", "step", lambda s=s: cache.load(s)
        yield f"status([{s!r:.20}])", "step", lambda s=s: cache.status([s])
        yield f"table(steps=[{s!r:.20}])", "step", lambda s=s: cache.table(steps=[s])
        yield f"export(steps={s!r:.20})", "step", lambda s=s: cache.export(root.parent / "x.jsonl", steps=s)
        yield f"verify({s!r:.20})", "step", lambda s=s: cache.verify(s)
        yield f"resolve({s!r:.20})", "step", lambda s=s: cache.resolve(s)
    yield from _array_calls(view)
    yield from _path_calls(cache, root)
    yield from _training_calls(cache, root)
    yield from _dataset_calls(root)
    yield from write_calls(cache, step, root)
    for depth in (1100, 3000, 20000):
        yield f"write(nested {depth})", "", lambda d=depth: cache.write(step + 1, {"x": [_nested(d)]})
    for v in BAD_INTS:
        yield f"rollout(0, max_length={v!r:.20})", "max_length", lambda v=v: view.rollout(0, max_length=v).rollout
        yield f"find(longest={v!r:.20})", "longest", lambda v=v: view.find(longest=v)._repr_html_()
    for m in BAD_MAX_LENGTH:
        yield f"page(max_length={m!r:.20})", "max_length", lambda m=m: view.page(0, max_length=m)._repr_html_()
        group = f"group(row=0, max_length={m!r:.20})"
        yield group, "max_length", lambda m=m: view.group(row=0, max_length=m)._repr_html_()
    for sk in ("yes", 3, None, object()):
        yield (
            f"text(skip_special_tokens={sk!r:.20})",
            "skip_special_tokens",
            lambda sk=sk: view.text(rows=0, skip_special_tokens=sk),
        )


BAD_PINS: tuple[Any, ...] = ("1", 1.5, [-1], ["1"], [object()], object())
BAD_AGES: tuple[Any, ...] = ("0", -1, math.nan, math.inf, object())
BAD_ATTRIBUTES: tuple[Any, ...] = (None, "x", [("a", 1)], {1: "x"}, {"a": math.nan}, {"a": b"x"}, {"a": object()})


def write_calls(cache: zs.Cache, step: int, root: Path) -> Iterator[Call]:
    """Bad calls that would write, replace, delete or unpickle: each must be refused before
    anything happens (the test checks that the step is still there, whole)."""
    from zarr_skip.legacy.transfer import export_steps, import_legacy

    batch = {"x": torch.zeros(2)}
    nowhere, out = root.parent / "no-dumps", root.parent / "legacy-out"
    for v in BAD_FLAGS:
        tag = f"{v!r:.20}"
        yield f"write(overwrite={tag})", "overwrite", lambda v=v: cache.write(step, batch, overwrite=v)
        yield f"write(allow_pickle={tag})", "allow_pickle", lambda v=v: cache.write(step + 1, batch, allow_pickle=v)
        yield f"load(allow_pickle={tag})", "allow_pickle", lambda v=v: cache.load(step, allow_pickle=v)
        yield f"gc(dry_run={tag})", "dry_run", lambda v=v: cache.gc(keep_last=0, dry_run=v)
        yield f"import_legacy(overwrite={tag})", "overwrite", lambda v=v: import_legacy(nowhere, cache, overwrite=v)
        yield f"export_steps(overwrite={tag})", "overwrite", lambda v=v: export_steps(cache, [step], out, overwrite=v)
    for v in BAD_PINS:
        yield f"gc(pin={v!r:.20})", "pin", lambda v=v: cache.gc(keep_last=0, pin=v)
    for v in BAD_AGES:
        yield f"gc(partial_age={v!r:.20})", "partial_age", lambda v=v: cache.gc(partial_age=v)
    for v in BAD_ATTRIBUTES:
        yield f"set_attributes({v!r:.20})", "values", lambda v=v: cache.set_attributes(v)
    for v in ("x", 5, [print]):
        yield f"verify(progress={v!r:.20})", "progress", lambda v=v: cache.verify(progress=v)
        yield f"import_legacy(progress={v!r:.20})", "progress", lambda v=v: import_legacy(nowhere, cache, progress=v)
        yield f"export_steps(progress={v!r:.20})", "progress", lambda v=v: export_steps(cache, [step], out, progress=v)
    for v in (5, None, [".."], object()):
        yield f"import_legacy({v!r:.20})", "dump_dir", lambda v=v: import_legacy(v, cache)


def _column_calls(cache: zs.Cache, view: Any) -> Iterator[Call]:
    for c in BAD_COLUMNS:
        tag = f"{c!r:.20}"
        yield f"view[{tag}]", "column", lambda c=c: view[c]
        yield f"text({tag})", "column", lambda c=c: view.text(c, rows=0)
        yield f"to_pandas([{tag}])", "column", lambda c=c: view.to_pandas([c])
        yield f"to_pandas({tag})", "columns", lambda c=c: view.to_pandas(c)
        yield f"to_dict([{tag}])", "column", lambda c=c: view.to_dict([c])
        yield f"table([{tag}])", "column", lambda c=c: cache.table([c])
        yield f"get({tag})", "column", lambda c=c: view.get(c)
    for c in ("uid", "score", "raw_prompt", "bf16", "response_length"):  # not token ids
        yield f"text({c!r})", "column", lambda c=c: view.text(c, rows=0)
    yield "to_pandas(['input_ids-like'])", "column", lambda: view.to_pandas(["prompts"])


def _tokenizer_calls(view: Any) -> Iterator[Call]:
    for t in BAD_TOKENIZERS:
        tag = f"{t!r:.20}"
        yield f"text(tokenizer={tag})", "tokenizer", lambda t=t: view.text(rows=0, tokenizer=t)
        yield f"rollout(0, tokenizer={tag})", "tokenizer", lambda t=t: view.rollout(0, tokenizer=t).rollout
        yield f"page(tokenizer={tag})", "tokenizer", lambda t=t: view.page(0, tokenizer=t)._repr_html_()
        yield f"find(tokenizer={tag})", "tokenizer", lambda t=t: view.find(tokenizer=t)._repr_html_()
        yield f"group(row=0, tokenizer={tag})", "tokenizer", lambda t=t: view.group(row=0, tokenizer=t)._repr_html_()
        yield (
            f"export(tokenizer={tag})",
            "tokenizer",
            lambda t=t: view.cache.export(Path("/tmp") / "zs-bad-calls-never.jsonl", tokenizer=t),
        )


def _array_calls(view: Any) -> Iterator[Call]:
    for name in ("score", "bf16", "responses", "uid", "raw_prompt", "response_length"):
        col = view[name]
        for d in BAD_DTYPES:
            if _parses(d):  # else numpy refuses the dtype itself, before the column is asked
                yield f"asarray({name}, {d!r:.20})", "dtype", lambda col=col, d=d: np.asarray(col, dtype=d)
            yield f"{name}.__array__({d!r:.20})", "dtype", lambda col=col, d=d: col.__array__(d)
        for d in ("int8", "uint8", "float16", "bool", "S1", "M8[s]"):
            yield f"asarray({name}, {d})", "dtype", lambda col=col, d=d: np.asarray(col, dtype=d)
        yield f"asarray({name}, copy=False)", "copy", lambda col=col: np.asarray(col, copy=False)
        yield f"array({name}, copy='x')", "copy", lambda col=col: col.__array__(None, "x")
        yield f"asarray({name})", "", lambda col=col: np.asarray(col)
        for key in ((0, 1), ..., None, (slice(None), 0), "a"):
            yield f"{name}[{key!r:.20}]", "rows", lambda col=col, key=key: col[key]


def _parses(d: Any) -> bool:
    """Whether numpy hands ``d`` to ``__array__`` (an unsized 'U' it casts to by itself)."""
    try:
        parsed = np.dtype(d)
    except TypeError:
        return False
    return not (parsed.itemsize == 0 and parsed.kind in "SUV")


def _path_calls(cache: zs.Cache, root: Path) -> Iterator[Call]:
    inside = root / "inside.jsonl"
    for p in ("/nonexistent/cache", "/etc/passwd", "/proc", str(root.parent), 3, None, b"/tmp", "", object()):
        yield f"open_cache({p!r:.30})", "location", lambda p=p: zs.open_cache(p)
        yield f"open_cache({p!r:.30}, fp)", "location", lambda p=p: zs.open_cache(p, {"n": 1}, read_only=True)
    for p in ("/", "/proc/x.jsonl", str(root.parent), str(inside), "/etc/passwd", 3, None, b"x", ""):
        yield f"export({p!r:.30})", "path", lambda p=p: cache.export(p)
    for fmt in ("xml", 3, "PARQUET-X", b"jsonl"):
        yield f"export(format={fmt!r})", "format", lambda fmt=fmt: cache.export(root.parent / "y.out", format=fmt)


BAD_SCORES: tuple[Any, ...] = ("1", True, math.nan, math.inf, [1], object(), b"1", None)
BAD_NAMES: tuple[Any, ...] = (3, "", b"score", ["score"], object(), None, "nope")


def _training_calls(cache: zs.Cache, root: Path) -> Iterator[Call]:
    """SFT and DPO exports and rescoring (``None`` is a value some of them take)."""
    n = iter(range(10**6))

    def export(**kw: Any) -> Any:  # each call its own file: an accepted one is not in the next one's way
        return cache.export(root.parent / f"t{next(n)}.jsonl", **kw)

    for fmt in ("sft", "dpo"):
        for v in BAD_SCORES:
            yield f"export({fmt}, min_score={v!r:.20})", "min_score", lambda f=fmt, v=v: export(format=f, min_score=v)
        for v in BAD_NAMES:
            yield f"export({fmt}, score={v!r:.20})", "score", lambda f=fmt, v=v: export(format=f, score=v)
        for v in BAD_FLAGS:
            yield f"export({fmt}, token_ids={v!r:.20})", "token_ids", lambda f=fmt, v=v: export(format=f, token_ids=v)
        for s in BAD_STEPS:
            yield f"export({fmt}, steps={s!r:.20})", "step", lambda f=fmt, s=s: export(format=f, steps=s)
    for v in (*BAD_INTS, "all"):
        yield f"export(sft, best_of={v!r:.20})", "best_of", lambda v=v: export(format="sft", best_of=v)
        yield f"export(dpo, pairs={v!r:.20})", "pairs", lambda v=v: export(format="dpo", pairs=v)
    for fn in ("boxed", 3, None, object()):
        yield f"rescore({fn!r:.20})", "fn", lambda fn=fn: cache.rescore(fn)
    for c in BAD_COLUMNS:
        yield f"rescore(columns={c!r:.20})", "column", lambda c=c: cache.rescore(len, columns=c)
    for v in BAD_NAMES:
        yield f"rescore(score={v!r:.20})", "score", lambda v=v: cache.rescore(len, score=v)
    for s in BAD_STEPS:
        yield f"rescore(steps={s!r:.20})", "step", lambda s=s: cache.rescore(len, steps=s)
    for e in (3, "", ["a"], object(), "no-such-experiment"):
        yield f"open_cache(experiment={e!r:.20})", "experiment", lambda e=e: zs.open_cache(root, experiment=e)


def _dataset_calls(root: Path) -> Iterator[Call]:
    """The torch datasets' arguments (each checked where the dataset is made, not in a worker)."""
    from zarr_skip.data import RolloutDataset, RolloutIterableDataset

    for ds in (RolloutDataset, RolloutIterableDataset):
        for s in BAD_STEPS:
            yield f"{ds.__name__}(steps={s!r:.20})", "step", lambda ds=ds, s=s: ds(root, steps=s)
        for c in BAD_COLUMNS:
            yield f"{ds.__name__}(columns={c!r:.20})", "column", lambda ds=ds, c=c: ds(root, columns=c)
        for e in (3, "", ["a"], object(), "no-such-experiment"):
            yield f"{ds.__name__}(experiment={e!r:.20})", "experiment", lambda ds=ds, e=e: ds(root, experiment=e)
        for o in ("anon", [("anon", True)], 3, object()):
            yield (
                f"{ds.__name__}(storage_options={o!r:.20})",
                "storage_options",
                lambda ds=ds, o=o: ds(root, storage_options=o),
            )
    for arg in ("seed", "block_rows", "buffer_blocks", "batch_size", "rank", "world_size"):
        for v in BAD_INTS:
            yield (
                f"RolloutIterableDataset({arg}={v!r:.20})",
                arg,
                lambda a=arg, v=v: RolloutIterableDataset(root, **{a: v}),
            )
    for arg in ("shuffle", "drop_last"):
        for v in BAD_FLAGS:
            yield (
                f"RolloutIterableDataset({arg}={v!r:.20})",
                arg,
                lambda a=arg, v=v: RolloutIterableDataset(root, **{a: v}),
            )
    for v in BAD_SCORES:
        yield (
            f"RolloutIterableDataset(pad_value={v!r:.20})",
            "pad_value",
            lambda v=v: RolloutIterableDataset(root, batch_size=4, pad_value=v),
        )
