"""The cache handle: open a location, write mini-batches, read status, load steps."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import numpy as np
from zarr.abc.store import Store

from zarr_skip import maintenance, tables
from zarr_skip._deprecation import keyword_only, warn_renamed
from zarr_skip.errors import (
    AmbiguousExperimentError,
    CacheNotFoundError,
    ConfigError,
    ExperimentNotFoundError,
    FormatVersionError,
    IncompleteStepError,
    MetadataError,
    MissingDataError,
    ReadOnlyCacheError,
    StepNotFoundError,
)
from zarr_skip.format import args, checks, chunks, layout, writetokens
from zarr_skip.format.columns import encode_batch
from zarr_skip.format.state import PartRecord, ResolveAction, StepInfo, resolve
from zarr_skip.lazy import StepView
from zarr_skip.maintenance import GcReport, VerifyReport
from zarr_skip.store import experiments as exps
from zarr_skip.store.catalog import (
    attribute,
    check_experiment,
    delete_step,
    experiment_info,
    group_doc,
    list_steps,
    scan_step,
    step_infos,
    summarized_parts,
    summarized_steps,
    update_experiment_info,
)
from zarr_skip.store.chunkjobs import ChunkJobs
from zarr_skip.store.reads import Part
from zarr_skip.store.storage import Storage, open_store, parse_json
from zarr_skip.store.writer import MinibatchInfo, RunContext, StepMemo, write_part
from zarr_skip.views import display, schema
from zarr_skip.views.export import FORMATS as EXPORT_FORMATS
from zarr_skip.views.export import ExportFormat, ExportReport, export_rollouts
from zarr_skip.views.rescore import rescore_rollouts
from zarr_skip.views.schema import Reduce
from zarr_skip.views.training import TrainingExport, export_training

if TYPE_CHECKING:
    import pandas


logger = logging.getLogger(__name__)

#: the formats of training records (:func:`zarr_skip.views.training.export_training`)
TrainingFormat = Literal["sft", "dpo"]
#: the export options that only choose training records (format "sft" or "dpo")
_TRAINING_DEFAULTS: dict[str, object] = {
    "score": "score",
    "min_score": None,
    "best_of": 1,
    "pairs": 1,
    "token_ids": False,
}

#: seconds a writer may go without a heartbeat before its mini-batch counts as abandoned
DEFAULT_LEASE = 60.0


def _step(step: Any) -> int:
    """``step`` as a step number: a numpy integer (from an array or a table) as its int;
    ConfigError unless a non-negative int."""
    if isinstance(step, np.integer):
        step = int(step)
    layout.step_name(step)
    return cast(int, step)


def open_cache(
    location: str | os.PathLike[str] | Store,
    fingerprint: Mapping[str, Any] | None = None,
    *,
    experiment: str | None = None,
    run_id: str | None = None,
    read_only: bool | None = None,
    compression: str | chunks.Compression | None = "auto",
    level: int | None = None,
    chunk_bytes: int = chunks.DEFAULT_CHUNK_BYTES,
    storage_options: Mapping[str, Any] | None = None,
    lease: float = DEFAULT_LEASE,
    claim_settle: float = 0.0,
) -> Cache:
    """Open (or create) a rollout cache.

    Parameters
    ----------
    location : a path, a ``file://`` or ``s3://bucket/prefix`` URL, or a zarr Store.
    fingerprint : the settings that identify the data (for verl: experiment and project names,
        gen batch size, n, max prompt and response length). It names the experiment group and
        is checked against the stored one. Without it the cache opens read-only.
    experiment : open this experiment by name (read-only browsing); with one experiment
        stored, it is chosen by default.
    run_id : the run this handle writes as; share it between the ranks or processes of one
        training run. A fresh id by default.
    read_only : force read-only (default: read-only exactly when no fingerprint is given).
    compression, level : ``"auto"`` (default: blosc-zstd level 1 with byte shuffling for types
        wider than a byte, zstd level 1 for bytes), ``"blosc-zstd"``, ``"zstd"`` (level 3),
        ``"lz4"`` (blosc), ``None``; ``"zstd:1"`` also works; or a :class:`Compression`, such
        as ``Compression("auto", blocksize=32 << 10)`` for a cache read mostly a few rows at a
        time (token ids in small blocks that such reads fetch and decode alone; whole reads
        slower), or ``Compression("lz4", blocksize=8 << 10)`` for the fastest such reads (every
        array in small lz4 blocks; ~1.25x the bytes).
    chunk_bytes : uncompressed bytes per chunk aimed for.
    storage_options : for URLs: endpoint, credentials, ... (passed to the object store).
    lease : seconds without a heartbeat after which another host's unfinished mini-batch
        counts as abandoned.
    claim_settle : seconds between claiming an index and checking the claim; raise it on
        shared filesystems whose exclusive create is unreliable.
    """
    if not isinstance(location, Store):
        checks.check_location(location)
    lease, claim_settle = checks.check_open(
        fingerprint,
        storage_options,
        read_only,
        chunk_bytes,
        lease,
        claim_settle,
        experiment,
    )
    codec = chunks.Compression.parse(compression, level)
    ro = fingerprint is None if read_only is None else read_only
    store = open_store(location, storage_options=storage_options, read_only=ro)
    storage = Storage(store, claim_settle=claim_settle)
    return Cache(
        storage,
        fingerprint=fingerprint,
        experiment=experiment,
        run_id=run_id,
        compression=codec,
        chunk_bytes=chunk_bytes,
        lease=lease,
    )


class Cache:
    """A rollout cache at one location, bound to one experiment. Use :func:`open_cache`."""

    def __init__(
        self,
        storage: Storage,
        *,
        fingerprint: Mapping[str, Any] | None,
        experiment: str | None,
        run_id: str | None,
        compression: chunks.Compression,
        chunk_bytes: int,
        lease: float,
    ) -> None:
        self._storage = storage
        self.compression = compression
        self.chunk_bytes = int(chunk_bytes)
        self.lease = float(lease)
        self.location = storage.where
        self.read_only = storage.read_only
        self._run = RunContext(
            layout.check_run_id(run_id) if run_id is not None else layout.new_run_id(),
            time.time(),
            layout.new_writer_id(),
        )
        #: the step this handle wrote last, as it left it: the next write there goes on from it
        self._memo = StepMemo()
        self.fingerprint: dict[str, Any] | None = None
        self.experiment: str | None = None
        #: what the first write must create: the root, the experiment (opening never writes)
        self._create_root = self._create_experiment = False
        #: experiment groups found damaged by :meth:`experiments`: path -> why
        self._damaged: dict[str, str] = {}
        #: the experiment's recorded attributes, read on first use
        self._attributes: dict[str, Any] | None = None
        if fingerprint is not None:
            fp = layout.normalize_fingerprint(fingerprint)
            name = layout.check_experiment_name(experiment) if experiment else layout.experiment_name(fp)
            early = self._read_early([layout.meta_key(name)])
            self._open_root(early)
            self._open_experiment(name, fp, early)
        else:  # the root and its listing in one round of requests: experiments are found below it
            listings, blobs = storage.list_and_get([""], [layout.METADATA])
            self._open_root({layout.METADATA: blobs[0]})
            found = self._experiments(listings[0])
            if experiment is not None:
                name = exps.match_experiment(experiment, list(found), self.location)
                self.experiment, self.fingerprint = name, found[name]
            elif len(found) == 1:
                ((self.experiment, self.fingerprint),) = found.items()

    # -- opening ----------------------------------------------------------------------------

    def _read_early(self, keys: list[str]) -> dict[str, bytes | None]:
        """The root document with ``keys`` in one round of requests (an object store), or
        the root alone while the kernel reads ``keys`` (local files: no thread hand-off)."""
        if self._storage.read_ahead([(k, None) for k in keys]):
            return {}
        every = [layout.METADATA, *keys]
        return dict(zip(every, self._storage.get_many(every), strict=True))

    def _get_early(self, early: dict[str, bytes | None], key: str) -> bytes | None:
        """``key``'s bytes, from ``early`` if :meth:`_read_early` read them (once: a second
        read of it, after a create, must see the store)."""
        return early.pop(key) if key in early else self._storage.get(key)

    def _open_root(self, early: dict[str, bytes | None]) -> None:
        key = layout.METADATA
        doc = parse_json(self._get_early(early, key), self._storage.key_path(key))
        if doc is None:
            if self.read_only:
                exps.refuse_inside(self._storage.root, self.location)
                raise CacheNotFoundError(
                    f"{self.location}: no zarr_skip cache here (the location does not exist or "
                    "holds no cache); open it with a fingerprint to create one"
                )
            self._create_root = True  # by the first write
            self._root: dict[str, Any] = {}
            self._version = layout.FORMAT_VERSION
            return
        self._check_root(doc)

    def _check_root(self, doc: dict[str, Any]) -> None:
        where = self._storage.key_path(layout.METADATA)
        info = attribute(doc, layout.ROOT_ATTR, where)
        if info is None or info.get("format") != layout.FORMAT_NAME:
            exps.refuse_inside(self._storage.root, self.location)
            raise MetadataError(f"{where}: not a zarr_skip cache (the root group lacks the format attribute)")
        version = info.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version > layout.FORMAT_VERSION:
            raise FormatVersionError(
                f"{where}: written in zarr_skip format version {version}; this zarr_skip reads "
                f"up to version {layout.FORMAT_VERSION}: upgrade zarr_skip"
            )
        self._root = doc
        self._version = version

    def _upgrade_root(self) -> None:
        """Before the first write to a cache of an older format version, raise the root's
        version: what this zarr_skip writes, older readers would not read right."""
        if self._version >= layout.FORMAT_VERSION:
            return
        attrs = dict(self._root.get("attributes") or {})
        attrs[layout.ROOT_ATTR] = dict(attrs[layout.ROOT_ATTR], version=layout.FORMAT_VERSION)
        self._storage.set(layout.METADATA, group_doc(attrs))
        logger.info("%s: format version %d -> %d", self.location, self._version, layout.FORMAT_VERSION)
        self._version = layout.FORMAT_VERSION

    def _open_experiment(self, name: str, fp: dict[str, Any], early: dict[str, bytes | None]) -> None:
        key = layout.meta_key(name)
        where = self._storage.key_path(key)
        doc = parse_json(self._get_early(early, key), where)
        stored = attribute(doc, layout.EXPERIMENT_ATTR, where)
        if doc is not None and stored is None:
            exps.parent_of_experiments(self._storage, name, fp)
        if stored is None:
            if self.read_only:
                near = "" if self._create_root else exps.nearest(fp, self.experiments())
                raise ExperimentNotFoundError(
                    f"experiment {name!r} not found at {self.location}" + (f" ({near})" if near else "")
                )
            self._create_experiment = True  # by the first write
        else:
            check_experiment(stored, name, where)
            exps.check_fingerprint(name, fp, stored, self.location)
        self.experiment, self.fingerprint = name, fp

    def _create(self) -> None:
        """Create what opening found missing: the root, then the experiment group."""
        if self._create_root:
            self._check_root(exps.create_root(self._storage))
            self._create_root = False
        if self._create_experiment and self.experiment is not None and self.fingerprint is not None:
            stored = exps.create_experiment(self._storage, self.experiment, self.fingerprint)
            # another writer may have created it meanwhile, with other settings
            exps.check_fingerprint(self.experiment, self.fingerprint, stored or {}, self.location)
            self._create_experiment = False

    def experiments(self) -> dict[str, dict[str, Any]]:
        """Experiment names stored at this location, with their fingerprints."""
        return self._experiments()

    def _experiments(self, root_listing: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """:meth:`experiments`, the root's listing already read (None: list it)."""
        if self._create_root:
            self._damaged = {}
            return {}
        found, self._damaged = exps.find_experiments(self._storage, first=root_listing)
        return found

    def damaged_experiments(self) -> dict[str, str]:
        """Experiment groups whose record is damaged or missing beside stored steps: path -> why."""
        self.experiments()
        return dict(self._damaged)

    @property
    def run_id(self) -> str:
        """The run this handle writes as."""
        return self._run.run

    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def attributes(self) -> dict[str, Any]:
        """What the experiment records beyond its fingerprint (the trainer's ``tokenizer`` and
        ``model`` paths, ...), from its group's attributes: read once, on first use."""
        if self._attributes is None:
            self._attributes = experiment_info(self._storage, self.experiment) if self.experiment else {}
        return dict(self._attributes)

    def set_attributes(self, values: Mapping[str, Any]) -> None:
        """Record ``values`` (str keys, strict JSON values) in the experiment's attributes, merged
        over those stored (writers recording the same values may race; of different values the
        last one wins). Anything else is a ConfigError, before anything is written."""
        if self.read_only or self.experiment is None:
            raise ReadOnlyCacheError(f"{self.location}: opened read-only; pass a fingerprint to open_cache to write")
        values = checks.check_json_mapping(values, "values")
        self._create()  # opening wrote nothing: like a write, recording creates the experiment
        self._attributes = update_experiment_info(self._storage, self.experiment, values)

    def _exp(self) -> str:
        if self.experiment is None:
            names = list(self.experiments())
            if names:
                raise AmbiguousExperimentError(
                    f"{self.location} holds several experiments ({', '.join(names)}); open one "
                    "with open_cache(location, experiment=NAME)"
                )
            if self._damaged:
                raise MetadataError(f"{self.location}: damaged experiment record: {'; '.join(self._damaged.values())}")
            return ""
        return self.experiment

    # -- writing ----------------------------------------------------------------------------

    def write(
        self,
        step: int,
        batch: Any,
        *,
        expected: int = 1,
        overwrite: bool = False,
        meta_info: Mapping[str, Any] | None = None,
        allow_pickle: bool = False,
        token: str | bool | None = None,
    ) -> MinibatchInfo:
        """Store ``batch`` as the next mini-batch of ``step``; the step completes at ``expected``;
        a retry with the same ``token`` (a str, or True: from the content) returns the stored one.

        ``overwrite=True`` replaces a complete step. A new run's replacement is atomic: readers
        see the old step until this run completes the new one, which then removes the old; a
        write that fails halfway leaves the old step whole (``gc`` removes the rest once its
        writers are gone). A run overwriting a step it completed itself deletes it first.

        Raises
        ------
        StepCompleteError
            The step is complete (or this run already wrote ``expected`` mini-batches).
        SchemaMismatchError, UnsupportedColumnError
            The batch disagrees with the step's other mini-batches or cannot be stored
            exactly; raised before anything is written.
        DisplacedWriterError
            A newer run owns the step.
        """
        if self.read_only or self.experiment is None:
            raise ReadOnlyCacheError(f"{self.location}: opened read-only; pass a fingerprint to open_cache to write")
        layout.step_name(step)
        checks.check_whole(expected, "expected", maximum=checks.MAX_EXPECTED)
        overwrite, allow_pickle = args.flag(overwrite, "overwrite"), args.flag(allow_pickle, "allow_pickle")
        checks.check_mapping(meta_info, "meta_info")
        token = writetokens.check_token(token)
        # the pool compresses the large arrays while the rest is encoded, then every chunk
        # while the step is taken over and an index claimed (store/chunkjobs.py)
        jobs = ChunkJobs(self._storage, self.compression, self.chunk_bytes)
        try:
            encoded = encode_batch(batch, meta_info, allow_pickle=allow_pickle, on_column=jobs.add)
            jobs.spread()
            self._create()
            self._upgrade_root()
            return write_part(
                self._storage,
                self.experiment,
                step,
                encoded,
                ctx=self._run,
                expected=expected,
                overwrite=overwrite,
                compression=self.compression,
                lease=self.lease,
                jobs=jobs,
                token=writetokens.content_token(encoded) if token is True else token,
                memo=self._memo,
            )
        finally:
            jobs.cancel()  # whatever a failed write did not take (nothing after a success)

    def delete(self, step: int) -> None:
        """Remove a step, whatever its state."""
        if self.read_only:
            raise ReadOnlyCacheError(f"{self.location}: opened read-only")
        path = layout.join(self._exp(), layout.step_name(step))
        logger.info("deleting step %d at %s", step, self._storage.key_path(path))
        self._memo.forget()  # a next write to the step scans it anew
        delete_step(self._storage, path)

    # -- reading ----------------------------------------------------------------------------

    def status(self, steps: Iterable[int] | None = None) -> list[StepInfo]:
        """Every step's state, ascending, from attribute metadata alone (no chunk reads)."""
        wanted = checks.check_steps(steps)
        exp = self._exp()
        if not exp:
            return []
        return step_infos(self._storage, exp, time.time(), self.lease, wanted)

    def info(self, step: int) -> StepInfo:
        """One step's :class:`StepInfo`; StepNotFoundError if it has no group."""
        exp = self._exp()
        found = self.status([step]) if exp else []
        if not found:
            raise StepNotFoundError(self._missing(step))
        return found[0]

    def steps(self) -> list[int]:
        """Complete steps, ascending."""
        return [i.step for i in self.status() if i.complete]

    @keyword_only
    def resolve(self, step: int, *, action: ResolveAction = "cache") -> int | None:
        """The step to load for ``step``: see :func:`zarr_skip.format.state.resolve`."""
        step = _step(step)
        if action == "cache":
            found = self.status([step]) if self._exp() else []
            return step if found and found[0].complete else None
        return resolve(step, action, self.steps())

    def load(self, step: int, *, allow_pickle: bool = False) -> StepView:
        """A lazy view of a complete step.

        Raises
        ------
        StepNotFoundError
            No such step.
        IncompleteStepError
            The step exists but is not complete.
        """
        step, exp = _step(step), self._exp()
        allow_pickle = args.flag(allow_pickle, "allow_pickle")
        path = layout.join(exp, layout.step_name(step))
        if not exp:
            raise StepNotFoundError(self._missing(step))
        fast = summarized_parts(self._storage, exp, step)
        if fast is not None:
            return self._view(step, path, *fast, allow_pickle=allow_pickle)
        scan = scan_step(self._storage, exp, step)
        if scan.misplaced:
            _, why = scan.misplaced[0]
            more = f" (and {len(scan.misplaced) - 1} more)" if len(scan.misplaced) > 1 else ""
            raise MetadataError(f"step {step}: {why}{more}")
        if not scan.exists:
            raise StepNotFoundError(self._missing(step))
        info = scan.info(time.time(), self.lease)
        if not info.complete and scan.summary is not None and scan.summary_run == info.run:
            lost = [
                self._storage.key_path(layout.meta_key(layout.join(path, run, name)))
                for run, name in scan.broken + scan.missing
                if run == info.run
            ]
            raise MissingDataError(
                f"step {step} was recorded complete but {info.expected - info.done} mini-batch(es) "
                f"lost their metadata: {', '.join(lost) or 'deleted'}"
            )
        if not info.complete:
            raise IncompleteStepError(
                f"step {step} is {info.state}: {info.done} of {info.expected} mini-batches complete "
                f"at {self._storage.key_path(path)}"
            )
        parts = sorted(
            (p for p in scan.parts if p.run == info.run and p.complete and p.index < info.expected),
            key=lambda p: p.index,
        )
        return self._view(step, path, info.run, parts, allow_pickle=allow_pickle)

    @keyword_only
    def table(
        self, columns: Sequence[str] | None = None, *, steps: int | Iterable[int] | None = None, reduce: Reduce = None
    ) -> pandas.DataFrame:
        """One row per rollout of every complete step (or of ``steps``, one or several, each of
        which must be complete) as a pandas DataFrame (``zarr-skip[pandas]``), named as the exports name them
        (:mod:`zarr_skip.views.schema`); ``reduce={"advantages": "mean"}`` adds each row's mean
        of a token column as ``advantages_mean``. See :mod:`zarr_skip.tables`. Reads the steps'
        records and those columns' chunks (jagged ones shown as ``{column}_len``: their lengths
        alone), each in one batch of requests across the steps."""
        tables.pandas_module()  # before any I/O
        schema.check_reduce(reduce)
        asked = checks.check_steps(steps, one=True, unique=True)
        exp = self._exp()
        wanted = (list_steps(self._storage, exp) if exp else []) if asked is None else asked
        with tables.gc_paused():
            found = summarized_steps(self._storage, exp, wanted) if exp else [None] * len(wanted)
            views = []
            for step, fast in zip(wanted, found, strict=True):
                if fast is not None:
                    views.append(self._view(step, layout.join(exp, layout.step_name(step)), *fast, allow_pickle=False))
                elif steps is not None or self.info(step).complete:  # else: skip the steps not complete
                    views.append(self.load(step))
            return tables.views_table(self._storage, views, columns, reduce)

    def _view(self, step: int, path: str, run: str, parts: list[PartRecord], *, allow_pickle: bool) -> StepView:
        run_path = layout.join(path, run)
        return StepView(
            self._storage,
            step,
            [
                Part.from_doc(step, layout.join(run_path, str(p.index)), p.doc, self.experiment, sealed=p.sealed)
                for p in parts
            ],
            allow_pickle=allow_pickle,
            cache=self,
        )

    def _missing(self, step: int) -> str:
        if self._create_experiment and self.fingerprint is not None:
            near = exps.nearest(self.fingerprint, self.experiments())
            return f"step {step} not found: experiment {self.experiment!r} holds nothing yet at {self.location}" + (
                f" ({near})" if near else f" (stored experiments: {', '.join(self.experiments()) or 'none'})"
            )
        have = self.steps() if self.experiment else []
        near = ", ".join(map(str, have[:20])) + (" ..." if len(have) > 20 else "")
        return (
            f"step {step} not found in experiment {self.experiment!r} at {self.location} "
            f"(complete steps: {near or 'none'})"
        )

    @keyword_only
    def export(
        self,
        path: str | os.PathLike[str],
        *,
        steps: int | Iterable[int] | None = None,
        format: ExportFormat | TrainingFormat | None = None,
        tokenizer: Any = None,
        score: str = "score",
        min_score: float | None = None,
        best_of: int = 1,
        pairs: int | str = 1,
        token_ids: bool = False,
    ) -> ExportReport | TrainingExport:
        """One record per rollout of ``steps`` (default: all complete) as parquet or JSON Lines,
        with decoded text when a tokenizer is known: see
        :func:`zarr_skip.views.export.export_rollouts`.

        ``format="sft"`` or ``"dpo"`` writes training records in TRL's conversational formats
        instead (``.jsonl`` or ``.parquet`` by the suffix), chosen by ``score``, ``min_score``,
        ``best_of`` (SFT) and ``pairs`` (DPO), with the token ids too when ``token_ids``: see
        :func:`zarr_skip.views.training.export_training`.
        """
        if format in ("sft", "dpo"):
            return export_training(
                self,
                path,
                steps,
                format=format,
                tokenizer=tokenizer,
                score=score,
                min_score=min_score,
                best_of=best_of,
                pairs=pairs,
                token_ids=token_ids,
            )
        if format is not None and format not in EXPORT_FORMATS:
            known = ", ".join([*EXPORT_FORMATS, *get_args(TrainingFormat)])
            raise ConfigError(f"format {format!r}: choose one of {known}")
        chosen = {"score": score, "min_score": min_score, "best_of": best_of, "pairs": pairs, "token_ids": token_ids}
        given = [name for name, value in chosen.items() if value != _TRAINING_DEFAULTS[name]]
        if given:
            raise ConfigError(f"{', '.join(given)}: these choose training records; pass format='sft' or 'dpo'")
        return export_rollouts(self, path, steps, format=cast("ExportFormat | None", format), tokenizer=tokenizer)

    def rescore(
        self,
        fn: Callable[[dict[str, Any]], float | Mapping[str, float]],
        *,
        steps: int | Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
        score: str = "score",
        tokenizer: Any = None,
    ) -> pandas.DataFrame:
        """New scores beside the stored ones: ``fn`` called on each rollout (its prompt's chat
        ``messages``, decoded ``response`` and row's ``columns``), as a pandas DataFrame keyed by
        ``step``, ``minibatch``, ``row`` (``pip install 'zarr-skip[pandas]'``): see
        :func:`zarr_skip.views.rescore.rescore_rollouts`."""
        return rescore_rollouts(self, fn, steps, columns=columns, score=score, tokenizer=tokenizer)

    # -- maintenance ------------------------------------------------------------------------

    def verify(
        self,
        steps: int | Iterable[int] | None = None,
        *,
        progress: Callable[[int, int], Any] | None = None,
        step: int | Iterable[int] | None = None,
    ) -> VerifyReport:
        """Read every chunk of ``steps`` (one, several, or None: every complete step) and check
        sizes, checksums and places: see :func:`zarr_skip.maintenance.verify`. ``step=`` is the
        deprecated name of ``steps``."""
        if step is not None:
            warn_renamed("Cache.verify(step=...)", "Cache.verify(steps=...)")
            if steps is not None:
                raise ConfigError("verify: pass steps= only (step= is its deprecated name)")
            steps = step
        progress = args.maybe_callable(progress, "progress")
        damaged = self.damaged_experiments()
        exp = self._exp() if not damaged else self.experiment or ""
        wanted = checks.check_steps([steps] if isinstance(steps, int) else steps)
        return maintenance.verify(
            self._storage, exp, lease=self.lease, steps=wanted, damaged=damaged, progress=progress
        )

    def gc(
        self,
        *,
        keep_last: int | None = None,
        pin: int | Iterable[int] = (),
        dry_run: bool = False,
        partial_age: float | None = None,
    ) -> GcReport:
        """Remove abandoned mini-batches, temp files and steps past retention: see
        :func:`zarr_skip.maintenance.gc` (its policy: :func:`zarr_skip.maintenance.plan_gc`)."""
        return maintenance.gc(
            self._storage,
            self._exp(),
            lease=self.lease,
            keep_last=keep_last,
            pin=pin,
            dry_run=dry_run,
            partial_age=partial_age,
        )

    def __repr__(self) -> str:
        return display.cache_head(self)  # no store request: the listing is _repr_pretty_'s

    def _repr_pretty_(self, p: display.PrettyPrinter, cycle: bool) -> None:
        p.text(display.cache_head(self) if cycle else display.cache_text(self))

    def _repr_html_(self) -> str:
        return display.cache_html(self)
