"""Caches written by older versions of the format (checked in under ``tests/fixtures``, made by
``tests/fixtures/make_fixture.py`` with the code of that version) read and verify exactly."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import _fixture_batch as fx
import pytest
from helpers import assert_equal

import zarr_skip as zs
from zarr_skip.format import layout

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(params=[2, 3])
def old_cache(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[int, Path]:
    version: int = request.param
    where = tmp_path / f"format{version}"
    shutil.copytree(FIXTURES / f"format{version}", where)
    return version, where


def _root_version(where: Path) -> int:
    import json

    doc: dict[str, Any] = json.loads((where / "zarr.json").read_text())
    return int(doc["attributes"]["zarr_skip"]["version"])


def test_an_old_cache_reads_every_minibatch_exactly(old_cache: tuple[int, Path]) -> None:
    version, where = old_cache
    assert _root_version(where) == version
    cache = zs.open_cache(where)
    for step in fx.STEPS:
        view = cache.load(step)
        assert len(view.minibatches) == fx.MINIBATCHES
        for index, part in enumerate(view.minibatches):
            assert_equal(part.to_dict(), fx.batch(step, index), f"format {version}, step {step}, mini-batch {index}")
    assert _root_version(where) == version  # reading never writes


def test_an_old_cache_reads_a_few_rows_exactly(old_cache: tuple[int, Path]) -> None:
    _, where = old_cache
    view = zs.open_cache(where).load(0)
    whole = [fx.batch(0, i) for i in range(fx.MINIBATCHES)]
    rows = len(whole[0]["uid"])
    for name in ("uid", "raw_prompt", "extra_info", "points"):
        assert_equal(view[name][[1, rows + 2]], [whole[0][name][1], whole[1][name][2]], name)
    got = view["responses"][[rows + 3]]
    assert_equal(got.unbind()[0].contiguous(), whole[1]["responses"].unbind()[3].contiguous())


def test_an_old_cache_verifies_clean_and_takes_new_steps(old_cache: tuple[int, Path]) -> None:
    version, where = old_cache
    report = zs.open_cache(where).verify()
    assert report.ok, report.problems
    assert report.steps == fx.STEPS
    assert report.chunks > 0
    cache = zs.open_cache(where, fx.FINGERPRINT, chunk_bytes=fx.CHUNK_BYTES)
    cache.write(5, fx.batch(5, 0))
    assert _root_version(where) == layout.FORMAT_VERSION > version
    assert_equal(cache.load(5).to_dict(), fx.batch(5, 0))
    assert_equal(cache.load(0).minibatches[1].to_dict(), fx.batch(0, 1))
    assert zs.open_cache(where).verify().ok
