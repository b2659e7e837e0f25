"""One vocabulary (issue 23): the new names, and the old ones kept for one release, each with a
DeprecationWarning naming the new one (docs/deprecations.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import make_batch

import zarr_skip as zs
from zarr_skip._deprecation import keyword_only
from zarr_skip.cli.main import main


class WordDecoder:
    """ids -> ``w{id}`` words."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"w{int(i)}" for i in ids)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return [f"w{int(i)} " for i in ids]


@pytest.fixture
def cache(tmp_path: Path, fingerprint: dict[str, Any]) -> zs.Cache:
    c = zs.open_cache(tmp_path / "c", fingerprint)
    for step in (1, 2):
        c.write(step, make_batch(6, seed=step), expected=2)
        c.write(step, make_batch(6, seed=step + 10, offset=3), expected=2)
    return c


def test_nbytes_is_what_numpy_says_of_the_column_read_back(tmp_path: Path) -> None:
    """Narrowed integers (token ids, a 0/1 mask) and dictionary-encoded repeats (a GRPO group's
    prompt) count as they read back, not as stored: ``show`` said 360 B for 5.4 KB of prompts."""
    import torch

    from zarr_skip.synthetic import text_rollouts

    cache = zs.open_cache(tmp_path / "c", {"n": 4})
    batch = dict(text_rollouts(4, 4, seed=2, max_response=40))
    info = cache.write(1, batch)
    view = cache.load(1)
    read = view.to_dict()
    for name, value in read.items():
        if isinstance(value, torch.Tensor):
            want = value.values().nbytes if value.is_nested else value.nbytes
            assert view[name].nbytes == want, name
    prompts = view["prompts"]
    assert (
        prompts.nbytes
        == read["prompts"].values().nbytes
        > 4
        * sum(  # stored once per group, narrowed
            int(np.prod(a.shape)) * a.dtype.itemsize for part in prompts._parts for a in part.values()
        )
    )
    assert view.nbytes == sum(view[n].nbytes for n in view.columns) == info.nbytes == cache.info(1).nbytes


def test_a_record_without_column_sizes_counts_the_stored_arrays(tmp_path: Path) -> None:
    """Mini-batches written before records held each column's logical size (the fixtures of
    older formats) count their stored arrays, as they always did."""
    from zarr_skip.store.reads import Part

    cache = zs.open_cache(tmp_path / "c", {"n": 1})
    cache.write(1, make_batch(6, seed=1))
    part = cache.load(1)._parts[0]
    older = Part(**{f: getattr(part, f) for f in Part.__dataclass_fields__ if f != "logical"})
    column = zs.lazy.LazyColumn(cache.storage, 1, [older], "input_ids", False)
    stored = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in older.arrays["input_ids"].values())
    assert column.nbytes == stored and cache.load(1)["input_ids"].nbytes == part.logical["input_ids"]


def test_nbytes_is_the_logical_size_and_nbytes_stored_the_stored_one(cache: zs.Cache) -> None:
    view = cache.load(1)
    col = view["scores"]
    assert col.nbytes == col[:].nbytes == 12 * 4  # as numpy: the decoded array's bytes
    assert col.nbytes_stored > 0
    assert view.nbytes == sum(view[n].nbytes for n in view.columns)
    assert view.nbytes_stored == sum(view[n].nbytes_stored for n in view.columns)
    info = cache.info(1)
    assert (info.nbytes, info.nbytes_stored) == (view.nbytes, view.nbytes_stored)
    assert info.ratio == pytest.approx(view.nbytes / view.nbytes_stored)
    assert [(m.index, m.rows) for m in view.minibatch_info] == [(0, 6), (1, 6)]
    assert sum(m.nbytes for m in view.minibatch_info) == view.nbytes
    assert sum(m.nbytes_stored for m in view.minibatch_info) == view.nbytes_stored
    report = cache.verify()
    assert report.nbytes_stored == view.nbytes_stored + cache.load(2).nbytes_stored


def test_the_old_size_names_warn_and_name_the_new_ones(cache: zs.Cache) -> None:
    view, info = cache.load(1), cache.info(1)
    for obj, new in ((view, "StepView.nbytes"), (view["scores"], "LazyColumn.nbytes"), (info, "StepInfo.nbytes")):
        with pytest.warns(DeprecationWarning, match=f"raw_nbytes is deprecated.*use {new}"):
            assert obj.raw_nbytes == obj.nbytes
    report = cache.verify()
    with pytest.warns(DeprecationWarning, match="VerifyReport.nbytes is deprecated.*nbytes_stored"):
        assert report.nbytes == report.nbytes_stored


def test_a_minibatch_is_a_minibatch_in_public_names(cache: zs.Cache) -> None:
    written = cache.write(3, make_batch(2))
    assert isinstance(written, zs.MinibatchInfo) and written.step_complete
    assert written.nbytes > 0 and written.nbytes_stored > 0
    with pytest.warns(DeprecationWarning, match="MinibatchInfo.raw_nbytes is deprecated.*MinibatchInfo.nbytes"):
        assert written.raw_nbytes == written.nbytes
    with pytest.warns(DeprecationWarning, match="zarr_skip.PartInfo is deprecated.*zarr_skip.MinibatchInfo"):
        assert zs.PartInfo is zs.MinibatchInfo
    assert "PartInfo" not in zs.__all__
    view = cache.load(1)
    with pytest.warns(DeprecationWarning, match="StepView.parts is deprecated.*minibatch_info"):
        parts = view.parts
    assert [p.index for p in parts] == [m.index for m in view.minibatch_info]
    assert [len(mb) for mb in view.minibatches] == [m.rows for m in view.minibatch_info]


def test_verify_takes_steps_and_step_warns(cache: zs.Cache) -> None:
    assert cache.verify(steps=[1]).steps == (1,) and cache.verify(steps=2).steps == (2,)
    with pytest.warns(DeprecationWarning, match=r"verify\(step=...\) is deprecated.*verify\(steps=...\)"):
        assert cache.verify(step=1).steps == (1,)
    with pytest.warns(DeprecationWarning), pytest.raises(zs.ConfigError, match="steps= only"):
        cache.verify(steps=1, step=1)


def test_arguments_after_the_first_are_keywords_and_positions_warn(cache: zs.Cache, tmp_path: Path) -> None:
    view = cache.load(1)
    decoder = WordDecoder()
    assert view.text("responses", rows=[0], tokenizer=decoder) == view.text(rows=[0], tokenizer=decoder)
    with pytest.warns(DeprecationWarning, match=r"passing rows, tokenizer to StepView.text\(\) by position"):
        assert view.text("responses", [0], decoder) == view.text(rows=[0], tokenizer=decoder)
    with pytest.warns(DeprecationWarning, match=r"steps to Cache.table\(\) by position.*steps=\.\.\."):
        assert cache.table(["scores"], [2]).equals(cache.table(["scores"], steps=[2]))
    with pytest.warns(DeprecationWarning, match=r"action to Cache.resolve\(\)"):
        assert cache.resolve(5, "repeat") == cache.resolve(5, action="repeat") == 2
    with pytest.warns(DeprecationWarning, match=r"size to StepView.page\(\)"):
        assert view.page(1, 4).rows.tolist() == view.page(1, size=4).rows.tolist() == [4, 5, 6, 7]
    with pytest.warns(DeprecationWarning, match=r"steps to Cache.export\(\)"):
        assert cache.export(tmp_path / "old.jsonl", [1]).rows == cache.export(tmp_path / "new.jsonl", steps=[1]).rows


def test_keyword_only_still_refuses_what_python_refuses() -> None:
    @keyword_only
    def f(a: int, *, b: int = 0, c: int = 0) -> tuple[int, int, int]:
        return a, b, c

    assert f(1, b=2) == (1, 2, 0)
    with pytest.warns(DeprecationWarning):
        assert f(1, 2, 3) == (1, 2, 3)
    with pytest.raises(TypeError, match="takes 1 positional arguments but 4 were given"):
        f(1, 2, 3, 4)
    with pytest.raises(TypeError, match="multiple values for argument 'b'"):
        f(1, 2, b=3)  # found before any warning: nothing is called
    assert f.__wrapped__(1, c=5) == (1, 0, 5)  # type: ignore[attr-defined]


def test_one_pickle_flag_and_trust_pickle_warns(tmp_path: Path) -> None:
    from zarr_skip.legacy.dumps import read_minibatch, write_legacy_dp
    from zarr_skip.legacy.transfer import import_legacy

    batch = zs.DataProtoLike(None, {"x": np.arange(3)}, {})
    step_dir = tmp_path / "dumps" / "e_p" / "GBS1_N1_in4_out4" / "1"
    write_legacy_dp(step_dir, batch)
    assert read_minibatch(step_dir, allow_pickle=True).non_tensor_batch["x"].tolist() == [0, 1, 2]
    with pytest.warns(DeprecationWarning, match=r"read_minibatch\(trust_pickle=...\).*allow_pickle"):
        assert read_minibatch(step_dir, trust_pickle=True).non_tensor_batch["x"].tolist() == [0, 1, 2]
    with pytest.warns(DeprecationWarning, match=r"import_legacy\(trust_pickle=...\).*import_legacy\(allow_pickle"):
        report = import_legacy(tmp_path / "dumps", tmp_path / "cache", trust_pickle=True)
    assert [r.action for r in report.steps] == ["imported"]


def test_ls_json_names_both_sizes(cache: zs.Cache, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(cache.location), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    steps = [s for exp in doc["experiments"] for s in exp["steps"]] if "experiments" in doc else doc["steps"]
    info = cache.info(steps[0]["step"])
    assert (steps[0]["nbytes"], steps[0]["nbytes_stored"]) == (info.nbytes, info.nbytes_stored)
    assert steps[0]["raw_nbytes"] == info.nbytes  # the deprecated key, for one release
