"""Cached rollouts as a Ray Data dataset: ``read_rollouts(location)`` (needs ``zarr-skip[ray]``).

Ray Data's own ``read_zarr`` reads Zarr v2 only; this reader opens our v3 caches through the
public handle. Each read task reads one mini-batch (or a run of them, when Ray asks for fewer
tasks) in whole slices of the columns asked for, in the Ray worker that runs it (the task
carries the location, not an open store). Rows hold ``step``, ``minibatch``, ``row`` (the row
within its step) and the columns: jagged rows as 1-d numpy arrays, dense rows as arrays,
scalars as numbers, strings and JSON values as Python values. So ``map``, ``filter``,
``groupby`` and ``write_parquet`` work as on any Ray dataset.

Re-scoring at scale (what :meth:`zarr_skip.Cache.rescore` does on one machine)::

    ds = read_rollouts("s3://bucket/cache", columns=["responses", "score", "reward_model"])
    ds = ds.map(lambda r: {**r, "new_score": my_verifier(r["responses"], r["reward_model"])})
    ds.groupby("step").mean("new_score").to_pandas()
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zarr_skip.data._source import RolloutSource
from zarr_skip.errors import MissingExtraError

if TYPE_CHECKING:
    import ray.data

__all__ = ["read_rollouts"]


def _require_ray() -> None:
    try:
        import ray.data  # noqa: F401 - the Data library (the 'data' extra of ray)
    except ImportError:
        raise MissingExtraError(
            "read_rollouts needs Ray Data, which is not installed: pip install 'zarr-skip[ray]'"
        ) from None


def read_rollouts(
    location: str | os.PathLike[str],
    *,
    experiment: str | None = None,
    steps: int | Iterable[int] | None = None,
    columns: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **ray_kwargs: Any,
) -> ray.data.Dataset:
    """The rows of the complete steps of a cache as a ``ray.data.Dataset``.

    Parameters
    ----------
    location : a path or an ``s3://bucket/prefix`` URL (every Ray worker opens it itself).
    experiment, steps, columns, storage_options : as for :class:`zarr_skip.data.RolloutDataset`;
        ``columns`` are the only ones read (projection).
    ray_kwargs : passed to ``ray.data.read_datasource`` (``override_num_blocks``,
        ``ray_remote_args``, ...).

    Raises
    ------
    MissingExtraError
        Ray Data is not installed.
    StepNotFoundError, IncompleteStepError, KeyError
        No complete step, a step asked for is not complete, a column is missing (raised here,
        before any task runs).
    """
    _require_ray()
    from ray.data import read_datasource

    from zarr_skip.integrations._ray_source import RolloutDatasource

    source = RolloutSource(
        location, experiment=experiment, steps=steps, columns=columns, storage_options=storage_options
    )
    source.blocks()  # every step and column checked on the driver
    dataset: ray.data.Dataset = read_datasource(RolloutDatasource(source), **ray_kwargs)
    return dataset
