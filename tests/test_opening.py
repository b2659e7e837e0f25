"""Opening never writes: the root and the experiment come with the first write; a cache of
several experiments stays browsable; a near-miss fingerprint says which keys differ; a refused
write leaves nothing that reads as data or as ``writing``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import FINGERPRINT, make_batch
from test_failures import FullStore

import zarr_skip as zs
from zarr_skip.cli.main import main as cli


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_opening_a_new_location_writes_nothing(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    cache = zs.open_cache(root, fingerprint)
    assert cache.status() == [] and cache.steps() == [] and _files(root) == []
    with pytest.raises(zs.StepNotFoundError, match="holds nothing yet"):
        cache.load(1)
    cache.write(1, make_batch(2))
    assert zs.open_cache(root).steps() == [1]


def test_opening_with_another_fingerprint_writes_nothing(location: Any, fingerprint: dict) -> None:
    zs.open_cache(location, fingerprint).write(1, make_batch(2))
    other = dict(fingerprint, max_response_length=32)
    for _ in range(3):  # e.g. a notebook re-run with a typo: no experiment appears
        cache = zs.open_cache(location, other)
        assert cache.steps() == []
    reader = zs.open_cache(location)  # still one experiment: browsing needs no name
    assert reader.steps() == [1]
    assert list(reader.experiments()) == [zs.open_cache(location, fingerprint).experiment]


def test_a_near_miss_fingerprint_names_the_keys_that_differ(location: Any, fingerprint: dict) -> None:
    zs.open_cache(location, fingerprint).write(1, make_batch(2))
    other = dict(fingerprint, max_response_length=32)
    with pytest.raises(zs.StepNotFoundError, match=r"max_response_length: stored 16, given 32") as exc:
        zs.open_cache(location, other).load(1)
    assert "experiment_name" not in str(exc.value)
    with pytest.raises(zs.ExperimentNotFoundError, match=r"max_response_length: stored 16, given 32"):
        zs.open_cache(location, other, read_only=True)


def test_leaving_the_role_out_names_the_real_cause(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    zs.open_cache(root, dict(fingerprint, role="rollout")).write(1, make_batch(2))
    zs.open_cache(root, dict(fingerprint, role="rollout_tq")).write(1, make_batch(2))
    with pytest.raises(zs.FingerprintMismatchError) as exc:
        zs.open_cache(root, fingerprint)
    text = str(exc.value)
    assert "role" in text and "rollout_tq" in text and "stored None" not in text


def test_a_cache_of_several_experiments_is_browsable(tmp_path: Path, fingerprint: dict, capsys: Any) -> None:
    root = tmp_path / "cache"
    for n in (2, 3, 4):
        zs.open_cache(root, dict(fingerprint, n=n)).write(1, make_batch(2))
    reader = zs.open_cache(root)
    names = list(reader.experiments())
    assert len(names) == 3
    with pytest.raises(zs.AmbiguousExperimentError) as exc:
        reader.steps()
    assert all(name in str(exc.value) for name in names)
    assert cli(["ls", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(e["name"] for e in doc["experiments"]) == sorted(names)
    assert all(len(e["steps"]) == 1 for e in doc["experiments"])


def test_a_refused_column_name_leaves_nothing(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    with pytest.raises(zs.UnsupportedColumnError):
        zs.open_cache(root, fingerprint).write(1, {"zarr.json": torch.zeros(2)})
    assert _files(root) == []


def test_a_full_disk_keeps_the_runs_earlier_minibatches(tmp_path: Path, fingerprint: dict) -> None:
    store = FullStore(tmp_path)
    cache = zs.open_cache(store, fingerprint)
    cache.write(2, make_batch(4), expected=2)
    store.armed = True
    with pytest.raises(zs.StorageError):
        cache.write(2, make_batch(4), expected=2)
    store.armed = False
    (info,) = zs.open_cache(tmp_path).status()
    assert info.done == 1  # the complete mini-batch stays: the run may go on
    cache.write(2, make_batch(4), expected=2)
    assert zs.open_cache(tmp_path).steps() == [2]


def test_a_plain_fingerprint_cache_opens_read_only_by_name(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    zs.open_cache(root, {"a": 1}).write(0, make_batch(2))
    assert zs.open_cache(root, {"a": 1}, read_only=True).steps() == [0]
    with pytest.raises(zs.ExperimentNotFoundError, match=r"a: stored 1, given 2"):
        zs.open_cache(root, {"a": 2}, read_only=True)
    assert FINGERPRINT  # the verl fingerprint of the other tests is unaffected


def _two_roles(root: Path, fingerprint: dict) -> tuple[str, str]:
    a = zs.open_cache(root, dict(fingerprint, role="rollout"))
    a.write(1, make_batch(2))
    b = zs.open_cache(root, dict(fingerprint, role="rollout_tq"))
    b.write(2, make_batch(2))
    assert a.experiment is not None and b.experiment is not None
    return a.experiment, b.experiment


def test_open_cache_takes_what_the_cli_e_takes(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    rollout, tq = _two_roles(root, fingerprint)
    assert zs.open_cache(root, experiment="rollout").experiment == rollout  # the last part
    assert zs.open_cache(root, experiment="rollout_tq").steps() == [2]
    assert zs.open_cache(root, experiment=rollout).experiment == rollout
    zs.open_cache(root, dict(fingerprint, role="other_rollout")).write(1, make_batch(2))
    with pytest.raises(zs.AmbiguousExperimentError, match="several experiments") as err:
        zs.open_cache(root, experiment="GBS4")
    assert all(name in str(err.value) for name in (rollout, tq))
    with pytest.raises(zs.ExperimentNotFoundError, match="'nope' not found"):
        zs.open_cache(root, experiment="nope")


def test_a_part_of_an_experiment_name_is_a_whole_word_or_number() -> None:
    """``-e exp1`` names ``exp1_p/...``, never ``exp10_p/...`` (``rm -e exp1 5`` would remove
    another experiment's step); ``GBS4`` is not ``GBS48``."""
    from zarr_skip.store.experiments import match_experiment

    names = ["exp10_p/GBS4_N2_in8_out16", "exp1_p/GBS48_N2_in8_out16"]
    assert match_experiment("exp1", names, "loc") == names[1]
    assert match_experiment("exp10", names, "loc") == names[0]
    assert match_experiment("GBS4", names, "loc") == names[0]
    assert match_experiment("GBS4_N2", names, "loc") == names[0]
    with pytest.raises(zs.AmbiguousExperimentError, match="several experiments"):
        match_experiment("N2", names, "loc")
    for part in ("exp", "GBS", "in8_out1"):
        with pytest.raises(zs.ExperimentNotFoundError, match="not found"):
            match_experiment(part, names, "loc")


def test_opening_a_group_inside_a_cache_names_the_root(tmp_path: Path, fingerprint: dict) -> None:
    root = tmp_path / "cache"
    rollout, _ = _two_roles(root, fingerprint)
    for below in (root / rollout, root / rollout / "1", root / rollout.split("/")[0]):
        with pytest.raises(zs.CacheNotFoundError, match=f"is inside the cache at {root} .*; open {root}"):
            zs.open_cache(below)
    with pytest.raises(zs.CacheNotFoundError, match="no zarr_skip cache here"):
        zs.open_cache(tmp_path / "elsewhere")


@pytest.mark.parametrize("foreign", ['{"attributes": [1]}', '{"attributes": "x"}', "[]", "7"])
def test_a_foreign_zarr_json_above_is_no_cache(tmp_path: Path, foreign: str) -> None:
    (tmp_path / "zarr.json").write_text(foreign)  # any JSON: another tool's (was a bare AttributeError)
    with pytest.raises(zs.CacheNotFoundError, match="no zarr_skip cache here"):
        zs.open_cache(tmp_path / "elsewhere")


def test_the_cli_hint_for_a_group_inside_a_cache_runs(tmp_path: Path, fingerprint: dict, capsys: Any) -> None:
    import shlex

    root = tmp_path / "cache"
    rollout, _ = _two_roles(root, fingerprint)
    assert cli(["show", str(root / rollout), "1", "--rows", "1"]) == 2
    err = capsys.readouterr().err
    hint = err.split("run: ", 1)[1].strip()
    assert hint == f"zarr-skip show {root} 1 --rows 1 -e {rollout}"
    assert cli(shlex.split(hint)[1:]) == 0
    assert "step 1 of" in capsys.readouterr().out
    assert cli(["ls", str(root), "-e", "GBS4"]) == 2  # both experiments: the candidates are named
    err = capsys.readouterr().err
    assert "matches several experiments" in err and rollout in err


def test_a_path_holding_colon_slashes_is_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    odd = "runs/exp://1"  # what precedes :// is no URL scheme: a directory name
    zs.open_cache(odd, FINGERPRINT).write(1, make_batch(2))
    assert (tmp_path / "runs" / "exp:" / "1").is_dir()
    assert zs.open_cache(tmp_path / odd).steps() == [1]


def test_a_url_scheme_in_capitals_is_the_same_url(tmp_path: Path, s3_server: Any) -> None:
    url = s3_server.s3_url("caps")
    zs.open_cache(url, FINGERPRINT, storage_options=s3_server.storage_options).write(1, make_batch(2))
    upper = "S3" + url[2:]
    assert zs.open_cache(upper, storage_options=s3_server.storage_options).steps() == [1]
    file_url = "FILE://" + str(tmp_path / "local")
    zs.open_cache(file_url, FINGERPRINT).write(2, make_batch(2))
    assert zs.open_cache(tmp_path / "local").steps() == [2]
