"""Bad calls to the reading API are typed errors naming the argument (issue 26, point 7): a
generated table of more than 600 calls (``tests/_bad_calls.py``), 0 untyped; and calls that
write, replace, delete or unpickle refuse bad values before acting, none taken."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _bad_calls import bad_calls, run, write_calls

import zarr_skip as zs
from zarr_skip.synthetic import TOKENIZER_PATH, text_rollouts

pytest.importorskip("tokenizers")
pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[zs.Cache, Path]:
    root = tmp_path_factory.mktemp("bad") / "cache"
    cache = zs.open_cache(root, {"n": 4, "max_response_length": 48})
    batch = text_rollouts(4, 4, seed=2, max_response=48)
    batch["bf16"] = torch.randn(16, 3).bfloat16()
    cache.write(1, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    return cache, root


def test_bad_calls_are_typed_errors_naming_the_argument(cache: tuple[zs.Cache, Path]) -> None:
    handle, root = cache
    calls = bad_calls(handle, 1, root)
    out = run(calls)
    assert out.calls >= 600, out.calls
    assert out.untyped == [], f"{len(out.untyped)} untyped of {out.calls}:\n" + "\n".join(out.untyped)
    assert out.unnamed == [], f"{len(out.unnamed)} unnamed:\n" + "\n".join(out.unnamed)
    assert len(out.typed) > 0.8 * out.calls
    assert handle.steps() == [1] and len(handle.load(1)) == 16  # nothing stored changed


def test_calls_that_write_delete_or_unpickle_refuse_bad_values_before_acting(cache: tuple[zs.Cache, Path]) -> None:
    handle, root = cache
    out = run(list(write_calls(handle, 1, root)))
    assert out.calls >= 60, out.calls
    assert out.ok == [], f"taken: {out.ok}"
    assert out.untyped == [] and out.unnamed == [], out.untyped + out.unnamed
    assert handle.steps() == [1] and len(handle.load(1)) == 16
    assert not (root.parent / "legacy-out").exists()


def test_the_cases_the_issue_names(cache: tuple[zs.Cache, Path]) -> None:
    import numpy as np

    handle, root = cache
    view = handle.load(1)
    with pytest.raises(zs.RowIndexError, match=r"rows 100000000000000000000 out of range for 16 rows") as exc:
        view.text(rows=10**20)
    assert isinstance(exc.value, IndexError)
    assert np.asarray(view["bf16"]).dtype == np.float32  # numpy has no bfloat16: exact float32
    nested: object = 0
    for _ in range(3000):
        nested = [nested]
    with pytest.raises(zs.UnsupportedColumnError, match="nested too deeply"):
        handle.write(5, {"x": [nested]})
    with pytest.raises(zs.CacheNotFoundError):
        zs.open_cache(root.parent / "missing")
    with pytest.raises(zs.ConfigError, match="path"):
        handle.export(root.parent)  # a directory
    with pytest.raises(zs.ColumnNotFoundError, match="no column 'nope'") as key:
        view["nope"]
    assert isinstance(key.value, KeyError)
    with pytest.raises(zs.ConfigTypeError, match="expected a list of column names") as typ:
        view.to_pandas("uid")
    assert isinstance(typ.value, TypeError)
    with pytest.raises(zs.GroupNotFoundError):
        view.group("no-such-uid")
    assert handle.steps() == [1]


def test_a_column_named_twice_is_refused_by_name(cache: tuple[zs.Cache, Path]) -> None:
    """A dict of columns holds each once: the second name was most likely meant as another."""
    from zarr_skip.data import RolloutDataset

    handle, root = cache
    calls = {
        "to_dict": lambda: handle.load(1).to_dict(["uid", "responses", "uid"]),
        "table": lambda: handle.table(columns=["uid", "uid"]),
        "rescore": lambda: handle.rescore(len, columns=["uid", "uid"]),
        "RolloutDataset": lambda: RolloutDataset(root, columns=["uid", "uid"]),
    }
    for what, call in calls.items():
        with pytest.raises(zs.ConfigError, match=r"columns: 'uid' named twice"):
            call()
            pytest.fail(what)
