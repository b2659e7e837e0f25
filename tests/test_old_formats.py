"""Caches written by older versions of the format (checked in under ``tests/fixtures``, made by
``tests/fixtures/make_fixture.py`` with the code of that version) read and verify exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import _fixture_batch as fx
import pytest
from helpers import assert_equal

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.format import layout

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(params=[2, 3])
def old_cache(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[int, Path]:
    version: int = request.param
    where = tmp_path / f"format{version}"
    shutil.copytree(FIXTURES / f"format{version}", where)
    return version, where


def _root_version(where: Path) -> int:
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


def test_verify_names_the_steps_whose_records_do_not_name_their_place(
    old_cache: tuple[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Format 2 records do not name their place (format 3 on do): a chunk swapped between two
    mini-batches reads as if it belonged. verify lists such steps as unbound, and the CLI says
    so beside its "ok" (which it printed alone)."""
    version, where = old_cache
    want = list(fx.STEPS) if version < 3 else []
    assert list(zs.open_cache(where).verify().unbound) == want
    code = main(["verify", str(where)])
    out = capsys.readouterr().out
    assert code == 0 and out.count(": ok") == 1 and out.count("unbound") == len(want)
    if want:
        assert "unbound: step(s) 0 written by an older zarr_skip (format 1 or 2)" in out
    code = main(["verify", str(where), "--json"])
    (exp,) = json.loads(capsys.readouterr().out)["experiments"]
    assert code == 0 and exp["ok"] and exp["unbound"] == want


def test_an_old_chunk_file_grown_far_past_its_record_is_refused_without_being_read_whole(
    old_cache: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Formats 2 and 3 keep each chunk in a file of its own: a reader (and verify) reads one
    byte more than the record names, so a file grown by 64 MiB (a hostile or replaced cache)
    is refused, naming it, without 64 MiB read or held."""
    from zarr_skip.store.storage import Storage

    version, where = old_cache
    chunk = sorted(where.rglob("responses/values/c*"))[0]
    size = chunk.stat().st_size
    with chunk.open("ab") as f:
        f.truncate(size + (64 << 20))
    spans, get_spans, get_many = [], Storage.get_spans, Storage.get_many

    def counted_spans(self: Storage, requests: Any, **kwargs: Any) -> Any:
        spans.extend(n for _, wanted in requests for _, n in wanted)
        return get_spans(self, requests, **kwargs)

    def counted_many(self: Storage, keys: Any) -> Any:
        keys = list(keys)
        assert not [k for k in keys if k.rsplit("/", 1)[-1].startswith("c.")], keys  # no chunk file read whole
        return get_many(self, keys)

    monkeypatch.setattr(Storage, "get_spans", counted_spans)
    monkeypatch.setattr(Storage, "get_many", counted_many)
    cache = zs.open_cache(where)
    with pytest.raises(zs.MissingDataError, match=r"chunk holds more than the \d+ bytes written") as exc:
        cache.load(0)["responses"][:]
    assert f"column 'responses', chunk {chunk}" in str(exc.value)
    problems = cache.verify([0]).problems
    assert [p.kind for p in problems] == ["MissingDataError"] and "holds more than" in problems[0].error
    assert spans and max(spans) <= 1 << 20  # no read of the grown file past its record
