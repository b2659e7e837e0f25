"""The closed sets are ``Literal`` types, and what reaches them at run time is checked."""

from __future__ import annotations

from typing import get_args

import pytest

import zarr_skip as zs
from zarr_skip.format import chunks, state
from zarr_skip.legacy import transfer
from zarr_skip.views import export


def test_the_literals_list_the_values_the_code_knows() -> None:
    assert get_args(state.StepState) == (state.COMPLETE, state.WRITING, state.ABANDONED)
    assert state.ACTIONS == get_args(state.ResolveAction) == ("cache", "repeat")
    assert chunks._NAMES == get_args(chunks.CompressionName) == ("auto", "zstd", "blosc-zstd", "lz4", "none")
    assert set(get_args(chunks.Shuffle)) == set(chunks._SHUFFLES)
    assert tuple(export.FORMATS) == get_args(export.ExportFormat) == ("parquet", "jsonl")
    assert transfer.LAYOUTS == get_args(transfer.ExportLayout) == ("auto", "flat", "nested")


def test_strings_from_outside_are_checked_against_them() -> None:
    assert state.check_action("repeat") == "repeat"
    for bad in ("Cache", "", None, 1):
        with pytest.raises(zs.ConfigError, match="expected 'cache' or 'repeat'"):
            state.check_action(bad)
    assert chunks.Compression.parse("zstd:5") == chunks.Compression("zstd", 5)
    with pytest.raises(zs.ConfigError, match="compression: expected one of 'auto'.*got 'gzip'"):
        chunks.Compression.parse("gzip:3")
    assert not chunks.is_compression_name("gzip") and chunks.is_compression_name("lz4")
