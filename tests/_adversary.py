"""The adversarial sweep: damage a cache at random, read it, check nothing wrong comes back.

A pristine cache (three steps of two mini-batches, every column kind, small chunks so that
arrays are shards of several chunks and many chunk files have equal sizes) is copied for every
trial and damaged once: bit flips of any file or of a chunk, truncations and deletions of any
file, deletions of a record, swaps of chunks, mini-batch records, run records, data groups,
mini-batch and step directories, records edited with their checksums recomputed, forged
lengths chunks with their records updated, one-byte edits of the experiment record, and the
indexes a record keeps for reads of a few rows (block tables, ``first_rows``) edited with its
checksum recomputed. Then every step is read (whole, one row, a slice, chosen rows),
``status()`` and ``verify()`` run, and the trial records:

- ``wrong``: a read returned something else than what was written (must never happen);
- ``changed``: some read raised or was wrong (the damage changes what a reader gets);
- ``flagged``: ``verify()`` reported a problem, or opening the cache raised a typed error;
- ``untyped``: an exception outside the ``ZarrSkipError`` tree (must never happen).

Or, after the damage, gc runs (strays at any age), or a new run writes every step without
``overwrite`` (:func:`then_attack`), and every read right before must be right after: what
either took from a damaged cache is lost data nobody asked to delete or replace.

A second pristine cache (``blocked``) stores its token ids as a read of a few rows takes
them in part: ``Compression("auto", blocksize=...)``, longer rows in chunks of many small
blosc blocks, so that the reads fetch, check and decode some blocks of a chunk alone
(``zarr_skip/store/blockreads.py``, ``zarr_skip/format/zstd_blocks.py``).

Not drawn: ``value_ends`` rewritten with the record's checksum. Ends that still rise to the
values stored are a consistent record, which crc32c does not tell from a real one
(``docs/format.md``): a read of a few rows cuts them there, and whole reads and ``verify()``
find them against the stored lengths (``tests/test_value_ends.py``). Reading those lengths in
the same round and checking them would make such reads find it too, at 3.4% of a cold read of
64 random rows of the medium step (one mini-batch, 8 KiB blocks; 4.06 against 3.90 ms,
medians of 60 alternated reads, 2026-12-05), and would take from ``col.lengths()``,
iteration and tables the lengths they now have from the records without a read.

Used by ``tests/test_adversarial.py`` (a short run) and ``scripts/adversarial_sweep.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import _fixture_batch as fx
import numpy as np
import torch
from helpers import FINGERPRINT, ChunkRegion, assert_equal, concat, make_batch, members_of_file
from zarr.storage import LocalStore

import zarr_skip as zs
from zarr_skip.format import block_tables, chunks, layout

STEPS = (1, 2, 3)
#: the reads made of every step: (column, row selection); None selects everything
READS: tuple[tuple[str, Any], ...] = (
    ("responses", 2),
    ("responses", slice(3, 9)),
    ("uid", slice(1, 5)),
    ("tags", [7, 0, 3]),
    ("input_ids", [0, 11]),
    ("raw_prompt", 4),
    ("responses", [11, 0, 5, 6]),
    ("points", [1, 7]),  # the old formats' fixtures: ragged rows with a trailing dimension
    ("extra_info", slice(2, 8)),
)
#: the blocked cache's blosc blocks (the smallest blosc keeps: 16 token ids) and chunk target
BLOCK_BYTES = chunks.MIN_BLOCK_BYTES
BLOCKED_CHUNK_BYTES = 1 << 10


def _batch(step: int, i: int, blocked: bool) -> dict[str, Any]:
    """Mini-batch ``i`` of ``step``: every column kind; ``blocked``, with responses of 20-119
    tokens (several blocks a row, a few rows a chunk)."""
    batch = make_batch(6, seed=10 * step + i, offset=100 * step + 6 * i)
    if blocked:
        rng = np.random.default_rng(10 * step + i)
        offsets = torch.zeros(7, dtype=torch.int64)
        offsets[1:] = torch.from_numpy(rng.integers(20, 120, 6)).cumsum(0)
        values = torch.from_numpy(rng.integers(0, 151936, int(offsets[-1])))
        batch["responses"] = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    return batch


#: the pristine caches a sweep can attack: written now (``plain``; ``blocked``: token ids in
#: small zstd blocks; ``lz4``: every array in small lz4 blocks, which carry no checksum or magic
#: of their own), or the checked-in caches of older formats (``tests/fixtures``)
KINDS = ("plain", "blocked", "lz4", "format2", "format3")
FIXTURES = Path(__file__).parent / "fixtures"


def build(root: Path, kind: str = "plain") -> dict[tuple[int, str, str], Any]:
    """Make the pristine cache of ``kind`` (:data:`KINDS`) at ``root``; returns what every read
    of it gives."""
    if kind.startswith("format"):
        shutil.copytree(FIXTURES / kind, root)
        return _reads(zs.open_cache(root), fx.STEPS)
    if kind in ("blocked", "lz4"):
        compression = zs.Compression("auto" if kind == "blocked" else "lz4", blocksize=BLOCK_BYTES)
        cache = zs.open_cache(root, FINGERPRINT, chunk_bytes=BLOCKED_CHUNK_BYTES, compression=compression)
    else:
        cache = zs.open_cache(root, FINGERPRINT, chunk_bytes=48)
    for step in STEPS:
        batches = [_batch(step, i, kind in ("blocked", "lz4")) for i in range(2)]
        for b in batches:
            cache.write(step, b, expected=2)
        assert_equal(cache.load(step).to_dict(), concat(batches), f"step {step}")
    return _reads(zs.open_cache(root), STEPS)


def _reads(cache: zs.Cache, steps: tuple[int, ...]) -> dict[tuple[int, str, str], Any]:
    """Every read of :data:`READS` of every step (of the columns a step has)."""
    out: dict[tuple[int, str, str], Any] = {}
    for step in steps:
        view = cache.load(step)
        out[step, "*", "*"] = view.to_dict()
        for col, sel in READS:
            if col in view:
                out[step, col, repr(sel)] = view[col][sel]
    return out


class AsRemote(LocalStore):
    """zarr's LocalStore read as zarr_skip reads an object store (S3): through the Store's
    ranged gets, a few rows' blocks fetched in requests planned across holes
    (``Storage.hole_bytes``), not by the local files' own reads."""


@dataclass
class Trial:
    damage: str
    wrong: list[str] = field(default_factory=list)
    changed: bool = False
    flagged: bool = False
    untyped: list[str] = field(default_factory=list)
    #: verify() listed steps whose records do not name their place (formats 1 and 2)
    unbound: bool = False


def attack(
    pristine: Path,
    work: Path,
    expected: dict[tuple[int, str, str], Any],
    rng: random.Random,
    damage_fn: Callable[[random.Random, Path], str | None] | None = None,
    remote: bool = False,
) -> Trial:
    """Copy ``pristine`` to ``work``, damage it once (with ``damage_fn``, or one drawn at
    random), read it all back (``remote``: as an object store is read, :class:`AsRemote`)."""
    trial = Trial(_damaged_copy(pristine, work, rng, damage_fn))
    try:
        cache = zs.open_cache(AsRemote(work, read_only=True) if remote else work)
        cache.status()
    except zs.ZarrSkipError:
        trial.changed = trial.flagged = True  # the user is told at once
        return trial
    except Exception:  # noqa: BLE001 - what the sweep counts
        trial.untyped.append(f"open: {traceback.format_exc(limit=3)}")
        return trial
    for key, want in expected.items():
        try:
            got = _read(cache, key)
        except zs.ZarrSkipError:
            trial.changed = True
            continue
        except Exception:  # noqa: BLE001
            trial.changed = True
            trial.untyped.append(f"{key}: {traceback.format_exc(limit=4)}")
            continue
        try:
            assert_equal(got, want, str(key))
        except Exception as exc:  # noqa: BLE001 - a value that cannot even be compared is wrong too
            trial.changed = True
            trial.wrong.append(f"{key}: {type(exc).__name__}: {exc}")
    try:
        report = cache.verify()
        trial.flagged, trial.unbound = not report.ok, bool(report.unbound)
    except zs.ZarrSkipError:
        trial.flagged = True
    except Exception:  # noqa: BLE001
        trial.untyped.append(f"verify: {traceback.format_exc(limit=4)}")
    return trial


def _damaged_copy(
    pristine: Path, work: Path, rng: random.Random, damage_fn: Callable[[random.Random, Path], str | None] | None
) -> str:
    """``pristine`` copied to ``work`` and damaged once (with ``damage_fn``, or one drawn at
    random): what was done."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(pristine, work)
    return (damage_fn or rng.choice(DAMAGES))(rng, work) or "nothing to damage"


def _read(cache: zs.Cache, key: tuple[int, str, str]) -> Any:
    """The read ``key`` of :data:`READS` names (``"*"``: the whole step)."""
    step, col, sel = key
    view = cache.load(step)
    return view.to_dict() if col == "*" else view[col][eval(sel)]  # noqa: S307 - our own reprs


def _right(root: Path, expected: dict[tuple[int, str, str], Any]) -> set[tuple[int, str, str]]:
    """The reads of ``expected`` that give what was written (errors and wrong values left out)."""
    try:
        cache = zs.open_cache(root)
    except zs.ZarrSkipError:
        return set()
    right = set()
    for key, want in expected.items():
        try:
            assert_equal(_read(cache, key), want, str(key))
        except Exception:  # noqa: BLE001, S112 - only the reads that hold count
            continue
        right.add(key)
    return right


def _write_steps(steps: list[int], cache: zs.Cache) -> None:
    """Each of ``steps`` written by ``cache``'s run in two mini-batches, each write refused
    (a typed error) or not on its own."""
    for step in steps:
        for i in range(2):
            try:
                cache.write(step, _batch(step, 7 + i, blocked=False), expected=2)
            except zs.ZarrSkipError:
                pass


#: what :func:`then_attack` does after a damage, given the cache's steps and a new handle
#: (a new run): gc with no grace for strays, or that run's writes of every step
THEN: dict[str, Callable[[list[int], zs.Cache], object]] = {
    "gc": lambda steps, cache: cache.gc(partial_age=0.0),
    "write": _write_steps,
}


def then_attack(
    then: str,
    pristine: Path,
    work: Path,
    expected: dict[tuple[int, str, str], Any],
    rng: random.Random,
    kind: str,
    damage_fn: Callable[[random.Random, Path], str | None] | None = None,
) -> tuple[str, list[tuple[int, str, str]]]:
    """Copy ``pristine`` to ``work``, damage it once, then ``then`` (:data:`THEN`: ``gc``, or
    ``write``: a new run writes every step, without ``overwrite``): the damage, and the reads
    that gave what was written before and no longer do (what gc, or writes not asked to
    overwrite, took from a damaged cache: must be none; a step that did not read right may be
    removed, or written anew). A typed error from opening the cache or from ``then`` counts
    as nothing done."""
    damage = _damaged_copy(pristine, work, rng, damage_fn)
    before = _right(work, expected)
    fingerprint = fx.FINGERPRINT if kind.startswith("format") else FINGERPRINT
    try:
        THEN[then](sorted({step for step, _, _ in expected}), zs.open_cache(work, fingerprint))
    except zs.ZarrSkipError:
        pass  # refused: nothing done
    return damage, sorted(before - _right(work, expected))


#: zarr-skip's commands, run on a damaged cache by :func:`cli_attack` (``{cache}``: its path,
#: ``{out}``: a directory for the files they write)
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("ls", "{cache}"),
    ("ls", "{cache}", "--json"),
    ("show", "{cache}", "latest", "--rows", "3"),
    ("show", "{cache}", "latest", "--row", "1"),
    ("show", "{cache}", "latest", "--text"),
    ("verify", "{cache}", "--json"),
    ("export", "{cache}", "all", "{out}/rollouts.jsonl"),
    ("export", "{cache}", "all", "{out}/rollouts.parquet"),
    ("report", "{cache}", "-o", "{out}/report.html"),
    ("compare", "{cache}", "{cache}"),
)


def cli_attack(
    pristine: Path, work: Path, out: Path, rng: random.Random, damage_fn: Callable[[random.Random, Path], str | None]
) -> list[str]:
    """Copy ``pristine`` to ``work``, damage it once, and run every command of
    :data:`COMMANDS` in this process with ``-v``: what a user should never see. ``zarr-skip``
    answers a typed error with its message and status 1 or 2, and any other exception with
    its type and first line, status 1 (``-v`` raises it instead, with its traceback): a
    failure the library did not type, or an exit status other than 0, 1 and 2."""
    from zarr_skip.cli.main import main

    damage = _damaged_copy(pristine, work, rng, damage_fn)
    seen = []
    for command in COMMANDS:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        argv = [*(arg.format(cache=work, out=out) for arg in command), "-v"]
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                status = main(argv)
        except Exception:  # noqa: BLE001 - what escapes is the finding
            seen.append(f"{damage}: {' '.join(command)}: {traceback.format_exc(limit=-3)}")
            continue
        if status not in (0, 1, 2):
            seen.append(f"{damage}: {' '.join(command)}: exit status {status}")
    return seen


def _views(cache: zs.Cache, step: int) -> list[object]:
    """What a notebook makes of ``step``: the step's text and HTML, its pandas frame, messages,
    TensorDict and jagged lengths, and its rollout, group, find and page views as text and HTML."""
    view = cache.load(step)
    shown: list[Any] = [
        view.rollout(1),
        view.group(row=0),
        view.find(longest=3),
        view.find(best=2),
        view.page(0, size=4),
    ]
    jagged = [col.lengths() for col in view.values() if col.ndim > 1 and col.shape[1] is None]
    return [repr(view), view._repr_html_(), view.to_pandas(), view.messages(), view.to_tensordict(), jagged] + [
        f(x) for x in shown for f in (repr, lambda x: x._repr_html_())
    ]


def _datasets(location: Path) -> list[object]:
    """Items of the torch datasets over ``location``: two, a batch of three, and an epoch."""
    from zarr_skip.data import RolloutDataset, RolloutIterableDataset

    items = RolloutDataset(location)
    return [items[0], items[5], items.__getitems__([0, 3, 7]), list(RolloutIterableDataset(location))]


def api_attack(
    pristine: Path, work: Path, rng: random.Random, damage_fn: Callable[[random.Random, Path], str | None]
) -> list[str]:
    """Copy ``pristine`` to ``work``, damage it once, then use it as a notebook or a trainer
    does (``status``, ``table`` with and without ``reduce``, each step's views, the torch
    datasets): every failure that is not a typed error (must be none)."""
    damage = _damaged_copy(pristine, work, rng, damage_fn)
    uses: list[tuple[str, Callable[[], object]]] = [
        ("status", lambda: zs.open_cache(work).status()),
        ("table", lambda: zs.open_cache(work).table()),
        ("table(reduce)", lambda: zs.open_cache(work).table(reduce={"responses": "mean"})),
        ("datasets", lambda: _datasets(work)),
    ]
    try:
        steps = zs.open_cache(work).steps()
    except zs.ZarrSkipError:
        steps = []
    uses += [(f"step {step}", partial(lambda step: _views(zs.open_cache(work), step), step)) for step in steps]
    seen = []
    for name, use in uses:
        try:
            use()
        except zs.ZarrSkipError:
            continue
        except Exception:  # noqa: BLE001 - what escapes is the finding
            seen.append(f"{damage}: {name}: {traceback.format_exc(limit=-3)}")
    return seen


# -- the damages: each returns what it did (None: nothing of its kind to damage) ------------


def _files(root: Path, pred: Callable[[Path], bool] = lambda p: True) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and pred(p))


def _chunk(p: Path) -> bool:
    return p.name.startswith("c.") or p.parent.name == "c"


def _attr(p: Path, name: str) -> bool:
    return p.name == layout.METADATA and name in p.read_text(errors="replace")


def _flip_bit(rng: random.Random, target: Path | ChunkRegion) -> int:
    """One bit of ``target``'s bytes flipped: which."""
    data = bytearray(target.read_bytes())
    bit = rng.randrange(len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    target.write_bytes(bytes(data))
    return bit


def flip(rng: random.Random, root: Path) -> str:
    path = rng.choice(_files(root))
    return f"flip bit {_flip_bit(rng, path)} of {path.relative_to(root)}"


def flip_chunk(rng: random.Random, root: Path) -> str | None:
    """One bit of the chunks (and shards) flipped, any of their bits as likely: mostly of the
    token ids, whose blocks, in the blocked cache, a read of a few rows checks and decodes alone."""
    regions = _chunk_members(root)
    if not regions:
        return None
    (region,) = rng.choices(regions, weights=[r.length for r in regions])
    bit = _flip_bit(rng, region)
    return f"flip bit {bit} of the chunk at {region.offset} of {region.file.relative_to(root)}"


def truncate(rng: random.Random, root: Path) -> str:
    path = rng.choice(_files(root))
    data = path.read_bytes()
    cut = rng.randrange(len(data))
    path.write_bytes(data[:cut])
    return f"truncate {path.relative_to(root)} to {cut} of {len(data)} bytes"


def delete(rng: random.Random, root: Path) -> str:
    path = rng.choice(_files(root))
    path.unlink()
    return f"delete {path.relative_to(root)}"


def delete_record(rng: random.Random, root: Path) -> str | None:
    """One record deleted: a mini-batch's, a run's, a step's summary or the experiment's."""
    kinds = (layout.PART_ATTR, layout.RUN_ATTR, layout.STEP_ATTR, layout.EXPERIMENT_ATTR)
    found = _files(root, lambda p: any(_attr(p, f'"{k}"') for k in kinds))
    if not found:
        return None
    path = rng.choice(found)
    path.unlink()
    return f"delete the record {path.relative_to(root)}"


def _swap_files(a: Path, b: Path) -> None:
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


def _chunk_members(root: Path) -> list[ChunkRegion]:
    """Every chunk member (a chunk, or a shard) of every packed data file below ``root``, and
    every chunk file (formats 2 and 3) as a whole."""
    out = [ChunkRegion(p, 0, p.stat().st_size) for p in _data_files(root) if p.suffix != ".zip"]
    for file in _files(root, lambda p: p.suffix == ".zip"):
        out += [ChunkRegion(file, *span) for name, span in members_of_file(file).items() if _chunk(Path(name))]
    return out


def _data_files(root: Path) -> list[Path]:
    """The files holding chunks: the data files of format 4, else each chunk's file."""
    return _files(root, lambda p: p.suffix == ".zip") or _files(root, _chunk)


def swap_chunks(rng: random.Random, root: Path) -> str | None:
    """Two chunks of equal size when there are such (the hard case), else two data files."""
    regions = _chunk_members(root)
    by_size: dict[int, list[ChunkRegion]] = {}
    for r in regions:
        by_size.setdefault(r.length, []).append(r)
    pairs = [v for v in by_size.values() if len(v) > 1 and len({r.read_bytes() for r in v}) > 1]
    if pairs and rng.random() < 0.8:
        group = rng.choice(pairs)
        a, b = rng.sample(group, 2)
        while a.read_bytes() == b.read_bytes():
            a, b = rng.sample(group, 2)
        da, db = a.read_bytes(), b.read_bytes()
        a.write_bytes(db)
        b.write_bytes(da)
        return f"swap chunks at {a.offset} of {a.file.relative_to(root)} and {b.offset} of {b.file.relative_to(root)}"
    x, y = rng.sample(_data_files(root), 2)
    _swap_files(x, y)
    return f"swap data files {x.relative_to(root)} and {y.relative_to(root)}"


def _pick_pair(rng: random.Random, found: dict[str, list[Path]]) -> tuple[str, Path, Path] | None:
    """A kind of ``found`` that has two or more, and two of it (None: no such kind)."""
    kinds = [k for k, paths in found.items() if len(paths) > 1]
    if not kinds:
        return None
    kind = rng.choice(kinds)
    a, b = rng.sample(found[kind], 2)
    return kind, a, b


def swap_records(rng: random.Random, root: Path) -> str | None:
    """Two mini-batch records, two run records or two step summaries (of the kinds there are
    two of)."""
    found = {
        k: _files(root, lambda p, k=k: _attr(p, f'"{k}"'))
        for k in (layout.PART_ATTR, layout.RUN_ATTR, layout.STEP_ATTR)
    }
    picked = _pick_pair(rng, found)
    if picked is None:
        return None
    kind, a, b = picked
    _swap_files(a, b)
    return f"swap {kind} records {a.relative_to(root)} and {b.relative_to(root)}"


def _swap_dirs(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def swap_dirs(rng: random.Random, root: Path) -> str | None:
    """Two step directories, two mini-batch directories, or two mini-batches' data files (or
    data groups: directories of chunk files, formats 2 and 3), of the kinds there are two of."""
    parts = [p.parent for p in _files(root, lambda p: _attr(p, f'"{layout.PART_ATTR}"'))]
    found = {
        "step": sorted({p.parent.parent for p in parts}),
        "mini-batch": parts,
        "data group": [d for p in parts for d in sorted(p.iterdir()) if d.name.startswith("w-")],
    }
    picked = _pick_pair(rng, found)
    if picked is None:
        return None
    kind, a, b = picked
    _swap_dirs(a, b)
    return f"swap {kind} directories {a.relative_to(root)} and {b.relative_to(root)}"


def _part_records(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for p in _files(root, lambda p: _attr(p, f'"{layout.PART_ATTR}"')):
        out.append((p, json.loads(p.read_text())))
    return out


def _rewrite(path: Path, doc: dict[str, Any], attr: str) -> None:
    record = doc["attributes"][attr]
    record["checksum"] = layout.doc_checksum(record)
    path.write_text(json.dumps(doc))


def edit_record(rng: random.Random, root: Path) -> str:
    """A structural field of a mini-batch record edited, its checksum recomputed."""
    path, doc = rng.choice(_part_records(root))
    rec = doc["attributes"][layout.PART_ATTR]
    name = rng.choice(sorted(rec["columns"]))
    aname = rng.choice(sorted(rec["columns"][name]["arrays"]))
    arr = rec["columns"][name]["arrays"][aname]
    field_ = rng.choice(["shape0", "shape1", "size", "chunk", "rows", "index", "step", "crc", "expected", "nbytes"])
    delta = rng.choice([-2, -1, 1, 2, 1000, 10**9])
    if field_ == "shape0":
        arr["shape"][0] = max(0, arr["shape"][0] + delta)
    elif field_ == "shape1" and len(arr["shape"]) > 1:
        arr["shape"][1] = max(0, arr["shape"][1] + delta)
    elif field_ == "size" and arr["sizes"]:
        i = rng.randrange(len(arr["sizes"]))
        arr["sizes"][i] = max(0, arr["sizes"][i] + delta)
    elif field_ == "chunk":
        arr["chunk"] = max(1, arr["chunk"] + delta)
    elif field_ == "rows":
        rec["rows"] = max(0, rec["rows"] + delta)
    elif field_ == "index":
        rec["index"] = 1 - rec["index"]
    elif field_ == "step":
        rec["step"] = rng.choice([s for s in STEPS if s != rec.get("step")])
    elif field_ == "crc" and arr.get("crc32c"):
        i = rng.randrange(len(arr["crc32c"]))
        arr["crc32c"][i] ^= 1 << rng.randrange(32)
    elif field_ == "expected":
        rec["expected"] = max(1, rec.get("expected", 2) + delta)
    else:
        rec["nbytes"] = max(0, rec["nbytes"] + delta)
    _rewrite(path, doc, layout.PART_ATTR)
    return f"edit {field_} ({name}/{aname}, {delta:+}) of {path.relative_to(root)}, checksum recomputed"


def edit_other(rng: random.Random, root: Path) -> str:
    """A run record's or a step summary's numbers edited, its checksum recomputed."""
    attr = rng.choice([layout.RUN_ATTR, layout.STEP_ATTR])
    path = rng.choice(_files(root, lambda p: _attr(p, f'"{attr}"')))
    doc = json.loads(path.read_text())
    rec = doc["attributes"][attr]
    key = rng.choice(["expected", "step"] + (["rows", "nbytes"] if attr == layout.STEP_ATTR else []))
    if key == "step":
        rec["step"] = rng.choice([s for s in STEPS if s != rec.get("step")])
    else:
        rec[key] = rng.choice([1, 3, rec[key] + 1, 2_000_000, 10**8])
    _rewrite(path, doc, attr)
    return f"edit {key} of {attr} at {path.relative_to(root)} to {rec[key]}, checksum recomputed"


def forge_lengths(rng: random.Random, root: Path) -> str:
    """A lengths chunk (or a dictionary's codes) replaced by another valid one (right crc32c),
    its record updated to match (size, crc32c, nbytes, checksum): only the reader's own
    checks of the lengths against the values (and of the codes against the entries) can tell."""
    path, doc = rng.choice(_part_records(root))
    rec = doc["attributes"][layout.PART_ATTR]
    name = rng.choice(sorted(n for n, c in rec["columns"].items() if "lengths" in c["arrays"]))
    arrays = rec["columns"][name]["arrays"]
    which = "codes" if "codes" in arrays and rng.random() < 0.4 else "lengths"
    arr = arrays[which]
    data_file = path.parent / rec["data"]
    codec = chunks.Compression(**arr["codec"])
    data = np.zeros(arr["chunk"], dtype=np.dtype(arr["dtype"]))
    if which == "codes":  # one row pointing past the entries
        data[rng.randrange(arr["shape"][0])] = arrays["lengths"]["shape"][0]
        what = "a code past the entries"
    else:
        data[: arr["shape"][0]] = rng.choice([0, 1, 3, 200])
        what = f"all {int(data[0])}"
    blob = chunks.encode(data, codec)
    if "container" in rec:  # format 4: after the data file's end, the record moved to it
        offset = data_file.stat().st_size
        with open(data_file, "ab") as f:
            f.write(blob)
        rec["data_nbytes"] = offset + len(blob)
        arr["offset"] = offset
    else:  # formats 2 and 3: the chunk's own file
        (data_file / name / which / "c.0").write_bytes(blob)
    rec["nbytes"] += len(blob) - arr["sizes"][0]
    arr["sizes"] = [len(blob)]
    if "crc32c" in arr:  # (not in format 2)
        arr["crc32c"] = [int.from_bytes(blob[-4:], "little")]
    _rewrite(path, doc, layout.PART_ATTR)
    return f"forge the {which} of {name} in {path.relative_to(root)} ({what})"


def _indexes(root: Path) -> list[tuple[Path, str, str, str]]:
    """Every read index the mini-batch records keep: (record, column, array, field)."""
    out = []
    for path, doc in _part_records(root):
        for name, col in sorted(doc["attributes"][layout.PART_ATTR]["columns"].items()):
            for aname, arr in sorted(col["arrays"].items()):
                out += [(path, name, aname, key) for key in ("block_table", "first_rows") if key in arr]
    return out


def _edit_table(rng: random.Random, table: dict[str, Any], delta: int) -> str:
    """One count, block start or block checksum of a block table changed."""
    part = rng.choice(["counts", "starts", "crc32c"])
    if part == "counts":
        i = rng.randrange(len(table["counts"]))
        table["counts"][i] = max(0, table["counts"][i] + rng.choice([-1, 1]))
        return f"block_table counts[{i}]"
    values = block_tables.from_base64(table[part], part, "").astype(np.int64)
    i = rng.randrange(len(values))
    values[i] = values[i] ^ (1 << rng.randrange(32)) if part == "crc32c" else max(0, values[i] + delta)
    table[part] = block_tables.to_base64(values % (1 << 32))
    return f"block_table {part}[{i}]"


def edit_index(rng: random.Random, root: Path) -> str | None:
    """A read index of a mini-batch record (a block table's counts, starts or checksums, or a
    values array's ``first_rows``) edited, its checksum recomputed."""
    found = _indexes(root)
    if not found:
        return None
    path, name, aname, key = rng.choice(found)
    doc = json.loads(path.read_text())
    arr = doc["attributes"][layout.PART_ATTR]["columns"][name]["arrays"][aname]
    delta = rng.choice([-64, -16, -1, 1, 16, 64, 1 << 20])
    if key == "block_table":
        what = _edit_table(rng, arr["block_table"], delta)
    else:
        i = rng.randrange(len(arr["first_rows"]))
        arr["first_rows"][i] = max(0, arr["first_rows"][i] + delta)
        what = f"first_rows[{i}]"
    _rewrite(path, doc, layout.PART_ATTR)
    return f"edit {what} ({name}/{aname}, {delta:+}) of {path.relative_to(root)}, checksum recomputed"


def edit_experiment(rng: random.Random, root: Path) -> str:
    """One byte of the experiment record changed, still valid JSON."""
    path = rng.choice(_files(root, lambda p: _attr(p, f'"{layout.EXPERIMENT_ATTR}"')))
    text = path.read_text()
    while True:
        i = rng.randrange(len(text))
        if text[i].isalnum():
            new = text[:i] + ("x" if text[i] != "x" else "y") + text[i + 1 :]
            try:
                json.loads(new)
            except ValueError:
                continue
            path.write_text(new)
            return f"edit byte {i} of {path.relative_to(root)} ({text[i]!r})"


DAMAGES: tuple[Callable[[random.Random, Path], str | None], ...] = (
    flip,
    flip_chunk,
    truncate,
    delete,
    delete_record,
    swap_chunks,
    swap_chunks,
    swap_records,
    swap_dirs,
    edit_record,
    edit_other,
    forge_lengths,
    edit_index,
    edit_experiment,
)


def holds(trial: Trial, kind: str) -> bool:
    """What every trial of a cache of ``kind`` must show: no untyped error, no wrong read and
    every change flagged by verify(); except in format 2, whose records do not name their
    place: there a wrong read or a miss after a swap, on a step verify() lists as unbound."""
    if trial.untyped:
        return False
    if not trial.wrong and (trial.flagged or not trial.changed):
        return True
    return excused(trial, kind)


def excused(trial: Trial, kind: str) -> bool:
    """A swap in a format 2 cache, on a step verify() lists as unbound (:func:`holds`)."""
    return kind == "format2" and trial.unbound and trial.damage.startswith("swap")


@dataclass
class Figures:
    trials: list[Trial]
    kind: str = "plain"

    @property
    def wrong(self) -> int:
        return sum(bool(t.wrong) for t in self.trials)

    @property
    def untyped(self) -> int:
        return sum(len(t.untyped) for t in self.trials)

    @property
    def changed(self) -> int:
        return sum(t.changed for t in self.trials)

    @property
    def missed(self) -> list[Trial]:
        """Trials whose damage changed what a reader gets but that verify did not flag."""
        return [t for t in self.trials if t.changed and not t.flagged]

    @property
    def failed(self) -> list[Trial]:
        """Trials that break what a cache of this kind must show (:func:`holds`)."""
        return [t for t in self.trials if not holds(t, self.kind)]

    @property
    def excused(self) -> list[Trial]:
        """Trials wrong or missed that format 2 cannot tell (:func:`excused`)."""
        return [t for t in self.trials if (t.wrong or (t.changed and not t.flagged)) and excused(t, self.kind)]

    @property
    def detection(self) -> float:
        return 1.0 - len(self.missed) / self.changed if self.changed else 1.0


def then_sweep(
    base: Path, n: int, seed: int = 0, kind: str = "plain", then: str = "gc"
) -> list[tuple[str, list[tuple[int, str, str]]]]:
    """``n`` random damages of the pristine cache of ``kind``, each followed by ``then``
    (:func:`then_attack`): each damage, and the reads that were right and no longer are."""
    pristine = base / "pristine"
    expected = build(pristine, kind)
    rng = random.Random(seed)
    return [then_attack(then, pristine, base / "work", expected, rng, kind) for _ in range(n)]


def sweep(base: Path, n: int, seed: int = 0, kind: str = "plain", remote: bool = False) -> Figures:
    """``n`` random damages of the pristine cache of ``kind`` (:data:`KINDS`), each on a fresh
    copy (``remote``: read as an object store is, :class:`AsRemote`)."""
    pristine = base / "pristine"
    expected = build(pristine, kind)
    rng = random.Random(seed)
    trials = [attack(pristine, base / "work", expected, rng, remote=remote) for _ in range(n)]
    return Figures(trials, kind)
