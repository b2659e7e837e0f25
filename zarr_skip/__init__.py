"""zarr_skip: cache the rollouts of LLM reinforcement-learning training in Zarr.

>>> import zarr_skip as zs
>>> cache = zs.open_cache("runs/cache", fingerprint={"experiment_name": "e", ...})  # doctest: +SKIP
>>> cache.write(12, batch, expected=2)                                               # doctest: +SKIP
>>> view = cache.load(12)                                                            # doctest: +SKIP
"""

from __future__ import annotations

from . import errors
from .cache import Cache, open_cache
from .chunks import Compression
from .columns import ColumnSpec, DataProtoLike
from .errors import (
    AmbiguousExperimentError,
    AtomicityError,
    CacheNotFoundError,
    ChecksumError,
    ConfigError,
    CorruptCacheError,
    DisplacedWriterError,
    ExperimentNotFoundError,
    FingerprintMismatchError,
    FormatVersionError,
    GroupMismatchError,
    IncompleteStepError,
    MetadataError,
    MissingDataError,
    ReadOnlyCacheError,
    SchemaMismatchError,
    StepCompleteError,
    StepNotFoundError,
    StorageError,
    UnsafePickleError,
    UnsupportedColumnError,
    ZarrSkipError,
)
from .lazy import LazyColumn, StepView
from .state import StepInfo
from .writer import PartInfo

__version__ = "0.1.0"

__all__ = [
    "AmbiguousExperimentError",
    "AtomicityError",
    "Cache",
    "CacheNotFoundError",
    "ChecksumError",
    "ColumnSpec",
    "Compression",
    "ConfigError",
    "CorruptCacheError",
    "DataProtoLike",
    "DisplacedWriterError",
    "ExperimentNotFoundError",
    "FingerprintMismatchError",
    "FormatVersionError",
    "GroupMismatchError",
    "IncompleteStepError",
    "LazyColumn",
    "MetadataError",
    "MissingDataError",
    "PartInfo",
    "ReadOnlyCacheError",
    "SchemaMismatchError",
    "StepCompleteError",
    "StepInfo",
    "StepNotFoundError",
    "StepView",
    "StorageError",
    "UnsafePickleError",
    "UnsupportedColumnError",
    "ZarrSkipError",
    "__version__",
    "errors",
    "open_cache",
]
