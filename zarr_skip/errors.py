"""The exception tree of zarr_skip.

Every error raised on purpose by the library is a :class:`ZarrSkipError`. Each class also
subclasses the builtin exception it refines, so callers may catch either::

    ZarrSkipError
    ├── ConfigError (ValueError)                 bad settings, naming the key
    │   └── ConfigTypeError (TypeError)          an argument of the wrong type
    ├── CacheNotFoundError (FileNotFoundError)   no cache at the location (read-only open)
    ├── ExperimentNotFoundError (KeyError)       no experiment of that name or fingerprint
    ├── AmbiguousExperimentError (ValueError)    several experiments, none chosen
    ├── FingerprintMismatchError (ValueError)    same experiment name, other settings
    ├── FormatVersionError (ValueError)          a cache written by a newer zarr_skip
    ├── ReadOnlyCacheError (PermissionError)     writing through a read-only handle or location
    ├── StorageError (OSError)                   the store failed (disk full, server gone, ...)
    │   ├── StorageAccessError                   credentials refused, or none to give
    │   └── StorageConnectionError               the endpoint cannot be reached
    ├── AtomicityError (RuntimeError)            the store cannot create a key exclusively
    ├── StepNotFoundError (KeyError)             no such step
    ├── ColumnNotFoundError (KeyError)           no column of that name in the step
    ├── RowIndexError (IndexError)               a row (or page) outside the step
    ├── GroupNotFoundError (KeyError)            no GRPO group (uid) of that name in the step
    ├── IncompleteStepError (LookupError)        the step exists but is not complete
    ├── StepCompleteError (FileExistsError)      writing into a complete step
    ├── DisplacedWriterError (RuntimeError)      a newer run took the step over
    ├── SchemaMismatchError (ValueError)         mini-batches of one step disagree
    ├── UnsupportedColumnError (TypeError)       a column the codec cannot store exactly
    ├── GroupMismatchError (ValueError)          cached and new prompt groups disagree
    ├── RemapError (ValueError)                  cached trajectories cannot map onto new prompts
    │   └── KeyFormatError                       a trajectory key not ``{uid}_{session}_{index}``
    ├── SampleIdError (ValueError)               a uid not ``sample_{epoch}_{index}``
    ├── UnsafePickleError (pickle.UnpicklingError)  a legacy pickle asked for a refused global
    ├── TokenizerNotFoundError (FileNotFoundError)  no local tokenizer at that path, or none known
    ├── MissingExtraError (ImportError)          an optional dependency is not installed
    ├── VerlNotInstalledError (ImportError)      verl cannot be imported (the verl integration)
    ├── CachedStepMissingError (RuntimeError, FileNotFoundError)  a cached step to load is gone
    └── CorruptCacheError (ValueError)           stored data is damaged
        ├── ChecksumError                        a chunk's crc32c does not match
        ├── MissingDataError (FileNotFoundError) a chunk or metadata document is missing
        ├── MetadataError                        a metadata document cannot be parsed
        └── OutsideCacheError (PermissionError)  a key or a link leads outside the cache root
"""

from __future__ import annotations

import pickle

__all__ = [
    "AmbiguousExperimentError",
    "AtomicityError",
    "CacheNotFoundError",
    "CachedStepMissingError",
    "ChecksumError",
    "ColumnNotFoundError",
    "ConfigError",
    "ConfigTypeError",
    "CorruptCacheError",
    "DisplacedWriterError",
    "ExperimentNotFoundError",
    "FingerprintMismatchError",
    "FormatVersionError",
    "GroupMismatchError",
    "GroupNotFoundError",
    "IncompleteStepError",
    "KeyFormatError",
    "MetadataError",
    "MissingDataError",
    "MissingExtraError",
    "OutsideCacheError",
    "ReadOnlyCacheError",
    "RemapError",
    "RowIndexError",
    "SampleIdError",
    "SchemaMismatchError",
    "StepCompleteError",
    "StepNotFoundError",
    "StorageAccessError",
    "StorageConnectionError",
    "StorageError",
    "TokenizerNotFoundError",
    "UnsafePickleError",
    "UnsupportedColumnError",
    "VerlNotInstalledError",
    "ZarrSkipError",
]


class ZarrSkipError(Exception):
    """Base class of every error zarr_skip raises on purpose."""

    def __str__(self) -> str:
        # KeyError quotes its message; every class here prints the message as written.
        return str(self.args[0]) if self.args else ""


class ConfigError(ZarrSkipError, ValueError):
    """A setting has an invalid value; the message names the key."""


class ConfigTypeError(ConfigError, TypeError):
    """An argument has the wrong type (a list as fingerprint, None as location); nothing was
    read or written."""


class CacheNotFoundError(ZarrSkipError, FileNotFoundError):
    """No zarr_skip cache exists at the location (opening read-only never creates one)."""


class ExperimentNotFoundError(ZarrSkipError, KeyError):
    """No experiment of that name (or fingerprint) exists in the cache."""


class AmbiguousExperimentError(ZarrSkipError, ValueError):
    """The cache holds several experiments and none was chosen."""


class FingerprintMismatchError(ZarrSkipError, ValueError):
    """An experiment of the same name was written with other settings."""


class FormatVersionError(ZarrSkipError, ValueError):
    """The cache was written in a format this version cannot read."""


class ReadOnlyCacheError(ZarrSkipError, PermissionError):
    """A write through a read-only handle, or to a location that refuses writes."""


class StorageError(ZarrSkipError, OSError):
    """The store failed a write (disk full, I/O error); nothing was marked complete."""


class StorageAccessError(StorageError):
    """The object store refused the credentials, or there are none to give it."""


class StorageConnectionError(StorageError):
    """The object store's endpoint cannot be reached."""


class AtomicityError(ZarrSkipError, RuntimeError):
    """The store cannot create a key exclusively, so concurrent writers are unsafe."""


class StepNotFoundError(ZarrSkipError, KeyError):
    """The step does not exist in the cache."""


class ColumnNotFoundError(ZarrSkipError, KeyError):
    """The step holds no column of that name; the message lists those it holds."""


class RowIndexError(ZarrSkipError, IndexError):
    """A row (or a page of rows) outside the step; the message names the argument and the range."""


class GroupNotFoundError(ZarrSkipError, KeyError):
    """No row of the step has that uid (GRPO group)."""


class IncompleteStepError(ZarrSkipError, LookupError):
    """The step exists but not all of its mini-batches are complete."""


class StepCompleteError(ZarrSkipError, FileExistsError):
    """The step is complete; writing more needs ``overwrite=True``."""


class DisplacedWriterError(ZarrSkipError, RuntimeError):
    """A newer run took the step over; this writer's mini-batches no longer count."""


class SchemaMismatchError(ZarrSkipError, ValueError):
    """Columns of a mini-batch disagree with each other or with the step's other mini-batches."""


class UnsupportedColumnError(ZarrSkipError, TypeError):
    """A column holds values the codec cannot store exactly (and pickle was not allowed)."""


class GroupMismatchError(ZarrSkipError, ValueError):
    """Cached prompt groups cannot be mapped onto the new prompts under the chosen policy."""


class RemapError(ZarrSkipError, ValueError):
    """Cached trajectories cannot be mapped onto the new prompts."""


class KeyFormatError(RemapError):
    """A trajectory key that is not ``{uid}_{session}_{index}``."""


class SampleIdError(ZarrSkipError, ValueError):
    """A uid that is not ``sample_{epoch}_{index}`` (optionally ``uid_``-prefixed)."""


class UnsafePickleError(ZarrSkipError, pickle.UnpicklingError):
    """A legacy pickle referenced a global outside the allow-list."""


class TokenizerNotFoundError(ZarrSkipError, FileNotFoundError):
    """No tokenizer at a path (nothing is downloaded), or none given and none recorded."""


class MissingExtraError(ZarrSkipError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (``pip install 'zarr-skip[pandas]'``)."""


class CorruptCacheError(ZarrSkipError, ValueError):
    """Stored data is damaged: the cache must not be trusted where this was raised."""


class ChecksumError(CorruptCacheError):
    """A chunk's stored crc32c does not match its bytes."""


class MissingDataError(CorruptCacheError, FileNotFoundError):
    """A chunk or metadata document recorded as written is missing or truncated."""


class MetadataError(CorruptCacheError):
    """A metadata document cannot be parsed or lacks what the format requires."""


class OutsideCacheError(CorruptCacheError, PermissionError):
    """A key (from a record or a caller) or a symbolic link would reach outside the cache root;
    nothing was read or written there."""


class VerlNotInstalledError(ZarrSkipError, ImportError):
    """verl (``verl.utils.skip``) cannot be imported: ``pip install verl``."""


class CachedStepMissingError(ZarrSkipError, RuntimeError, FileNotFoundError):
    """A cached step was to be loaded but none is there (deleted meanwhile, or never written).

    A ``RuntimeError`` like verl's ``RolloutSkip.warp_function`` raises and a
    ``FileNotFoundError`` like verl's ``RolloutTqSkip.load_dump_data`` raises.
    """
