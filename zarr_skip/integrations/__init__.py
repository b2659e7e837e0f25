"""Integrations of zarr_skip with training frameworks.

Each integration is a submodule imported explicitly; importing this package imports no
framework:

``zarr_skip.integrations.verl``
    ``install()`` registers Zarr-backed classes in verl's own ``SKIP_REGISTRY``, so verl's
    ``SkipManager`` and its ``skip.*`` Hydra keys cache rollouts in Zarr.

``zarr_skip.integrations.ray``
    ``read_rollouts(location)``: the cached rows as a Ray Data dataset (``zarr-skip[ray]``).
"""

from __future__ import annotations

__all__: list[str] = []
