"""zarr_skip: cache the rollouts of LLM reinforcement-learning training in Zarr.

>>> import zarr_skip as zs
>>> cache = zs.open_cache("runs/cache", fingerprint={"experiment_name": "e", ...})  # doctest: +SKIP
>>> cache.write(12, batch, expected=2)                                               # doctest: +SKIP
>>> view = cache.load(12)                                                            # doctest: +SKIP
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from zarr_skip import errors
from zarr_skip._deprecation import warn_renamed as _warn_renamed
from zarr_skip.cache import Cache, open_cache
from zarr_skip.errors import (
    AmbiguousExperimentError,
    AtomicityError,
    CachedStepMissingError,
    CacheNotFoundError,
    ChecksumError,
    ColumnNotFoundError,
    ConfigError,
    ConfigTypeError,
    CorruptCacheError,
    DisplacedWriterError,
    ExperimentNotFoundError,
    FingerprintMismatchError,
    FormatVersionError,
    GroupMismatchError,
    GroupNotFoundError,
    IncompleteStepError,
    KeyFormatError,
    MetadataError,
    MissingDataError,
    MissingExtraError,
    OutsideCacheError,
    ReadOnlyCacheError,
    RemapError,
    RowIndexError,
    SampleIdError,
    SchemaMismatchError,
    StepCompleteError,
    StepNotFoundError,
    StorageAccessError,
    StorageConnectionError,
    StorageError,
    TokenizerNotFoundError,
    UnsafePickleError,
    UnsupportedColumnError,
    VerlNotInstalledError,
    ZarrSkipError,
)
from zarr_skip.format.chunks import Compression
from zarr_skip.format.specs import ColumnSpec, DataProtoLike
from zarr_skip.format.state import StepInfo
from zarr_skip.lazy import LazyColumn, StepView
from zarr_skip.maintenance import GcReport, VerifyReport
from zarr_skip.store.writer import MinibatchInfo
from zarr_skip.views.export import ExportReport
from zarr_skip.views.groups import GroupView
from zarr_skip.views.rollouts import RolloutList, RolloutView
from zarr_skip.views.text import Message

if TYPE_CHECKING:
    from zarr_skip.trainer.manager import SkipManager

try:  # one source: the version in pyproject.toml, as installed
    __version__ = _metadata.version("zarr-skip")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AmbiguousExperimentError",
    "AtomicityError",
    "Cache",
    "CacheNotFoundError",
    "CachedStepMissingError",
    "ChecksumError",
    "ColumnNotFoundError",
    "ColumnSpec",
    "Compression",
    "ConfigError",
    "ConfigTypeError",
    "CorruptCacheError",
    "DataProtoLike",
    "DisplacedWriterError",
    "ExperimentNotFoundError",
    "ExportReport",
    "FingerprintMismatchError",
    "FormatVersionError",
    "GcReport",
    "GroupMismatchError",
    "GroupNotFoundError",
    "GroupView",
    "IncompleteStepError",
    "KeyFormatError",
    "LazyColumn",
    "Message",
    "MetadataError",
    "MinibatchInfo",
    "MissingDataError",
    "MissingExtraError",
    "OutsideCacheError",
    "ReadOnlyCacheError",
    "RemapError",
    "RolloutList",
    "RolloutView",
    "RowIndexError",
    "SampleIdError",
    "SchemaMismatchError",
    "SkipManager",
    "StepCompleteError",
    "StepInfo",
    "StepNotFoundError",
    "StepView",
    "StorageAccessError",
    "StorageConnectionError",
    "StorageError",
    "TokenizerNotFoundError",
    "UnsafePickleError",
    "UnsupportedColumnError",
    "VerifyReport",
    "VerlNotInstalledError",
    "ZarrSkipError",
    "__version__",
    "errors",
    "open_cache",
]


def __getattr__(name: str) -> Any:
    # the SkipManager loads with its trainer wing on first use, not at ``import zarr_skip``
    if name == "SkipManager":
        from zarr_skip.trainer.manager import SkipManager

        return SkipManager
    if name == "PartInfo":
        _warn_renamed("zarr_skip.PartInfo", "zarr_skip.MinibatchInfo")
        return MinibatchInfo
    raise AttributeError(f"module 'zarr_skip' has no attribute {name!r}")
