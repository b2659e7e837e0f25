"""The public surface: a sorted, pinned ``__all__`` and an exception tree that refines builtins."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import zarr_skip
from zarr_skip import errors

PUBLIC = [
    "AmbiguousExperimentError",
    "AtomicityError",
    "Cache",
    "CacheNotFoundError",
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
    "FingerprintMismatchError",
    "FormatVersionError",
    "GroupMismatchError",
    "GroupNotFoundError",
    "IncompleteStepError",
    "LazyColumn",
    "MetadataError",
    "MissingDataError",
    "MissingExtraError",
    "OutsideCacheError",
    "PartInfo",
    "ReadOnlyCacheError",
    "RowIndexError",
    "SchemaMismatchError",
    "SkipManager",
    "StepCompleteError",
    "StepInfo",
    "StepNotFoundError",
    "StepView",
    "StorageAccessError",
    "StorageConnectionError",
    "StorageError",
    "UnsafePickleError",
    "UnsupportedColumnError",
    "ZarrSkipError",
    "__version__",
    "errors",
    "open_cache",
]


def test_all_is_sorted_and_pinned() -> None:
    assert zarr_skip.__all__ == sorted(zarr_skip.__all__)
    assert zarr_skip.__all__ == PUBLIC
    for name in zarr_skip.__all__:
        assert hasattr(zarr_skip, name)


def test_every_error_is_a_zarr_skip_error_and_its_builtin() -> None:
    pairs = {
        errors.StepNotFoundError: KeyError,
        errors.SchemaMismatchError: ValueError,
        errors.UnsupportedColumnError: TypeError,
        errors.ReadOnlyCacheError: PermissionError,
        errors.StorageError: OSError,
        errors.MissingDataError: FileNotFoundError,
        errors.StepCompleteError: FileExistsError,
        errors.UnsafePickleError: pickle.UnpicklingError,
        errors.IncompleteStepError: LookupError,
        errors.ChecksumError: ValueError,
        errors.OutsideCacheError: PermissionError,
        errors.ConfigTypeError: TypeError,
        errors.TokenizerNotFoundError: FileNotFoundError,
        errors.MissingExtraError: ImportError,
    }
    for cls, builtin in pairs.items():
        assert issubclass(cls, errors.ZarrSkipError) and issubclass(cls, builtin)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.ZarrSkipError)
    assert str(errors.StepNotFoundError("step 3 not found")) == "step 3 not found"  # no KeyError quotes


def test_importing_zarr_skip_imports_no_optional_heavyweights() -> None:
    heavy = (
        "verl",
        "tensordict",
        "matplotlib",
        "s3fs",
        "obstore",
        "ray",
        "transfer_queue",
        "tokenizers",
        "pyarrow",
        "duckdb",
        "pandas",
    )
    code = f"import sys, zarr_skip; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_version_has_one_source() -> None:
    from importlib.metadata import version

    assert zarr_skip.__version__ == version("zarr-skip")
    init = (Path(zarr_skip.__file__).parent / "__init__.py").read_text()
    assert version("zarr-skip") not in init  # not written twice


def test_skip_manager_is_public_and_loads_lazily() -> None:
    code = (
        "import sys, zarr_skip; before = 'zarr_skip.trainer.manager' in sys.modules; "
        "from zarr_skip import SkipManager; "
        "print(before, SkipManager.__module__, SkipManager is zarr_skip.SkipManager)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "zarr_skip.trainer.manager", "True"]


def test_unknown_attributes_raise_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = zarr_skip.nope  # type: ignore[attr-defined]
