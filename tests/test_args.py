"""The argument checks of the reading API (``zarr_skip/format/args.py``), alone: each bad value
is the typed error refining the right builtin, naming the argument and the value."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip.format import args


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3), (-1, 9), (np.int64(2), 2), (slice(1, 3), slice(1, 3)), (None, None), ([], []), ([1, -1], [1, 9])],
)
def test_rows_accepts_and_normalises(value: Any, expected: Any) -> None:
    got = args.rows(value, 10)
    assert (got.tolist() if isinstance(got, np.ndarray) else got) == expected


def test_a_mask_is_rows() -> None:
    assert args.rows(np.arange(10) % 3 == 0, 10).tolist() == [0, 3, 6, 9]
    with pytest.raises(zs.RowIndexError, match="boolean mask"):
        args.rows(np.array([True, False]), 10)


@pytest.mark.parametrize(
    ("value", "error", "builtin"),
    [
        (10, zs.RowIndexError, IndexError),
        (-11, zs.RowIndexError, IndexError),
        (10**20, zs.RowIndexError, IndexError),
        ([0, 10**20], zs.RowIndexError, IndexError),
        (np.array([10], dtype=np.uint64), zs.RowIndexError, IndexError),
        (True, zs.ConfigTypeError, TypeError),
        (1.5, zs.ConfigTypeError, TypeError),
        ("1", zs.ConfigTypeError, TypeError),
        ([0.5], zs.ConfigTypeError, TypeError),
        ([[0]], zs.ConfigTypeError, TypeError),
        ({0}, zs.ConfigTypeError, TypeError),
        (slice("a", None), zs.ConfigTypeError, TypeError),
        (slice(0, 3, 0), zs.ConfigError, ValueError),
    ],
)
def test_bad_rows(value: Any, error: type, builtin: type) -> None:
    with pytest.raises(error, match="here: rows") as exc:
        args.rows(value, 10, "rows", "here")
    assert isinstance(exc.value, builtin)


def test_none_may_be_refused() -> None:
    with pytest.raises(zs.ConfigTypeError, match="rows"):
        args.rows(None, 3, none=False)


def test_counts_flags_columns_dtypes_paths() -> None:
    assert args.count(3, "size", low=1) == 3 and args.maybe_count(None, "limit") is None
    with pytest.raises(zs.ConfigError, match=r"size: expected an int in 1 \.\."):
        args.count(0, "size", low=1)
    with pytest.raises(zs.ConfigTypeError, match="limit: expected an int, got str"):
        args.maybe_count("3", "limit")
    assert args.flag(np.bool_(True), "case") is True and args.maybe_flag(None, "copy") is None
    with pytest.raises(zs.ConfigTypeError, match="case: expected True or False"):
        args.flag("yes", "case")
    assert args.column("a", ["a", "b"]) == "a"
    with pytest.raises(zs.ColumnNotFoundError, match=r"column: no column 'c' \(columns: a, b\)"):
        args.column("c", ["a", "b"])
    with pytest.raises(zs.ConfigTypeError, match="wrap one name in a list"):
        args.columns("a", ["a"])
    assert args.columns(("a",), ["a"]) == ["a"] and args.columns(None) is None
    assert args.dtype("f4") == np.float32 and args.dtype(None) is None
    with pytest.raises(zs.ConfigTypeError, match="dtype: expected a numpy dtype"):
        args.dtype("nope")
    with pytest.raises(zs.ConfigError, match="cannot hold a column"):
        args.dtype([("a", "f4")])
    assert args.path("x.jsonl") == "x.jsonl"
    for bad, error in ((3, zs.ConfigTypeError), ("", zs.ConfigError), (b"x", zs.ConfigTypeError)):
        with pytest.raises(error, match="path"):
            args.path(bad)


def test_steps_one_check_for_every_entry_point(tmp_path: Any) -> None:
    """``checks.check_steps`` serves the datasets, export, verify and gc alike: numpy ints are
    steps, one step is taken where the call says so, and the errors name the argument."""
    from zarr_skip.format import checks

    assert checks.check_steps(None) is None
    assert checks.check_steps([np.int64(3), 5]) == [3, 5]
    assert checks.check_steps(np.int32(4), one=True) == [4]
    got = checks.check_steps((np.uint8(1), np.int64(2)))
    assert got == [1, 2] and {type(s) for s in got} == {int}
    with pytest.raises(zs.ConfigTypeError, match="steps: expected an iterable of ints or None, got int 3"):
        checks.check_steps(3)
    with pytest.raises(zs.ConfigTypeError, match="steps: expected a step .an int., steps or None, got str '12'"):
        checks.check_steps("12", one=True)
    with pytest.raises(zs.ConfigTypeError, match="steps: expected a step"):
        checks.check_steps(True, one=True)
    with pytest.raises(zs.ConfigTypeError, match="steps: expected an int, got float 1.5"):
        checks.check_steps([1, 1.5])
    with pytest.raises(zs.ConfigTypeError, match="steps: expected an int, got bool"):
        checks.check_steps([np.bool_(True)])
    with pytest.raises(zs.ConfigError, match="steps: expected non-negative ints, got -2"):
        checks.check_steps([1, np.int64(-2)])


@pytest.mark.parametrize(
    ("location", "scheme"),
    [
        ("s3://b/p", "s3"),
        ("S3://b/p", "s3"),
        ("s3a://b/p", "s3a"),
        ("File:///tmp/x", "file"),
        ("git+ssh://h/r", "git+ssh"),
        ("/data/run://1", None),
        ("./a://b", None),
        ("rel/dir", None),
        ("1s3://b", None),
        ("://b", None),
    ],
)
def test_url_scheme_tells_urls_from_paths(location: str, scheme: str | None) -> None:
    assert args.url_scheme(location) == scheme
