"""zarr_skip.integrations.ray: the Ray Data reader, on a real local Ray cluster (local disk, S3)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_data import MINIBATCHES, fill

import zarr_skip as zs
from zarr_skip.errors import MissingExtraError

ray = pytest.importorskip("ray")
pd = pytest.importorskip("pandas")
pytest.importorskip("ray.data")

from zarr_skip.integrations.ray import read_rollouts  # noqa: E402

#: Ray's own deprecations (its context warns of its own settings), not ours
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")
COLUMNS = ["responses", "old_log_probs", "hidden", "score", "uid", "response_length"]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster of two CPUs for the session; its workers import this worktree."""
    here = str(Path(zs.__file__).parent.parent)
    path = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}}, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


def check_rows(rows: list[dict[str, Any]], cache: zs.Cache) -> None:
    want = [(s, r) for s, sizes in MINIBATCHES.items() for r in range(sum(sizes))]
    assert sorted((int(x["step"]), int(x["row"])) for x in rows) == want
    for x in rows:
        view = cache.load(int(x["step"]))
        sizes = np.cumsum([0] + [len(m) for m in view.minibatches])
        assert sizes[x["minibatch"]] <= x["row"] < sizes[x["minibatch"] + 1]
        for name in COLUMNS:
            stored = view[name][int(x["row"])]
            got = x[name]
            if isinstance(stored, torch.Tensor) and stored.dim() == 0:
                assert got == stored.item(), name
            elif isinstance(stored, torch.Tensor):
                assert isinstance(got, np.ndarray) and np.array_equal(got, stored.numpy()), name
            elif isinstance(stored, np.generic):
                assert got == stored.item(), name
            else:
                assert got == stored, name


def per_step_means(cache: zs.Cache) -> dict[int, float]:
    return {s: float(np.mean(cache.load(s)["score"][:])) for s in cache.steps()}


@pytest.mark.slow
def test_rows_and_per_step_figures_equal_load(ray_cluster: None, tmp_path: Path) -> None:
    fill(tmp_path / "cache")
    cache = zs.open_cache(tmp_path / "cache")
    ds = read_rollouts(tmp_path / "cache", columns=COLUMNS).materialize()
    assert ds.count() == 36
    check_rows(ds.take_all(), cache)
    means = ds.groupby("step", num_partitions=1).mean("score").to_pandas()
    got = dict(zip(means["step"].tolist(), means["mean(score)"].tolist(), strict=True))
    assert got == pytest.approx(per_step_means(cache))
    rescored = ds.map(lambda r: {"step": r["step"], "n": len(r["responses"])}).sum("n")  # the rescore recipe
    assert rescored == sum(len(cache.load(s)["responses"][i]) for s in cache.steps() for i in range(12))
    projected = read_rollouts(tmp_path / "cache", steps=[3], columns=["uid", "extra_info", "responses"])
    assert projected.columns() == ["step", "minibatch", "row", "uid", "extra_info", "responses"]
    projected.write_parquet(str(tmp_path / "parquet"))
    back = pd.concat([pd.read_parquet(f) for f in sorted((tmp_path / "parquet").glob("*.parquet"))])
    back = back.sort_values("row")
    view = cache.load(3)
    assert back["row"].tolist() == list(range(12))
    assert [dict(x) for x in back["extra_info"]] == list(view["extra_info"][:])
    # jagged rows are Ray's variable-shaped tensors in parquet (read back as its tensor elements)
    responses = [np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x).tolist() for x in back["responses"]]
    assert responses == [r.tolist() for r in view["responses"][:].unbind()]


def test_a_read_task_per_minibatch_or_per_run_of_them(tmp_path: Path) -> None:
    from zarr_skip.data._source import RolloutSource
    from zarr_skip.integrations._ray_source import RolloutDatasource

    fill(tmp_path / "cache")
    source = RolloutDatasource(RolloutSource(tmp_path / "cache", columns=["uid"]))
    tasks = source.get_read_tasks(200)
    assert [t.metadata.num_rows for t in tasks] == [n for sizes in MINIBATCHES.values() for n in sizes]
    assert [t.metadata.num_rows for t in source.get_read_tasks(2)] == [5 + 7 + 12, 3 + 4 + 5]
    blocks = list(source.get_read_tasks(2)[1]())  # run here: one block per mini-batch
    assert [b.num_rows for b in blocks] == [3, 4, 5] and blocks[0].column_names == ["step", "minibatch", "row", "uid"]


@pytest.mark.s3
@pytest.mark.slow
def test_on_s3(ray_cluster: None, s3_server: Any) -> None:
    from zarr_skip.store._s3 import open_s3_store

    url = s3_server.s3_url(f"t-{uuid.uuid4().hex[:12]}")
    fill(open_s3_store(url, s3_server.storage_options))
    cache = zs.open_cache(url, storage_options=s3_server.storage_options)
    ds = read_rollouts(url, columns=COLUMNS, storage_options=s3_server.storage_options)
    check_rows(ds.take_all(), cache)


def test_without_ray_a_missing_extra_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtraError, match=r"zarr-skip\[ray\]"):
        read_rollouts(tmp_path)


def test_a_step_named_twice_is_read_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Its rows once, as the CLI and the exports read `2 2` (no cluster: the datasource's tasks)."""
    fill(tmp_path / "cache")
    monkeypatch.setattr(ray.data, "read_datasource", lambda source, **kw: source)
    source: Any = read_rollouts(tmp_path / "cache", steps=[2, 3, 2], columns=["uid"])
    assert [t.metadata.num_rows for t in source.get_read_tasks(200)] == [*MINIBATCHES[2], *MINIBATCHES[3]]
