"""The public surface: a sorted, pinned ``__all__`` and an exception tree that refines builtins."""

from __future__ import annotations

import pickle
import re
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

ERRORS = [
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


def test_all_is_sorted_and_pinned() -> None:
    assert zarr_skip.__all__ == sorted(zarr_skip.__all__)
    assert zarr_skip.__all__ == PUBLIC
    for name in zarr_skip.__all__:
        assert hasattr(zarr_skip, name)


def test_errors_all_is_sorted_pinned_and_holds_every_error_class() -> None:
    assert errors.__all__ == sorted(errors.__all__) == ERRORS
    defined = {
        name
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, errors.ZarrSkipError) and obj.__module__ == errors.__name__
    }
    assert defined == set(ERRORS)
    assert set(ERRORS) <= set(zarr_skip.__all__)  # every error is also at the public door
    for name in ERRORS:
        assert getattr(zarr_skip, name) is getattr(errors, name)


def _drawn_tree() -> dict[str, str | None]:
    """The exception tree drawn in ``errors``' docstring: class -> its parent there."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^    [\s│├└─]*([A-Z][A-Za-z]+Error)\b", line)
        if not found:
            continue
        depth = found.start(1)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[found.group(1)] = stack[-1][1] if stack else None
        stack.append((depth, found.group(1)))
    return parents


def test_the_drawn_tree_has_every_error_under_its_parent() -> None:
    tree = _drawn_tree()
    assert set(tree) == set(ERRORS)
    for name, parent in tree.items():
        ours = [b.__name__ for b in getattr(errors, name).__bases__ if issubclass(b, errors.ZarrSkipError)]
        assert ours == ([parent] if parent else []), name


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
