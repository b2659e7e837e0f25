"""Arguments are checked at the API boundary, before anything is read or written: a wrong
type is a ConfigTypeError (a TypeError), a wrong value a ConfigError (a ValueError); tensors
the codec cannot store are UnsupportedColumnError. Every one is a ZarrSkipError."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_batch

import zarr_skip as zs


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"location": None}, zs.ConfigTypeError, "location"),
        ({"location": 3}, zs.ConfigTypeError, "location"),
        ({"location": ""}, zs.ConfigError, "location"),
        ({"fingerprint": ["a", 1]}, zs.ConfigTypeError, "fingerprint"),
        ({"fingerprint": "exp"}, zs.ConfigTypeError, "fingerprint"),
        ({"chunk_bytes": 0}, zs.ConfigError, "chunk_bytes"),
        ({"chunk_bytes": -4096}, zs.ConfigError, "chunk_bytes"),
        ({"chunk_bytes": 1.5}, zs.ConfigTypeError, "chunk_bytes"),
        ({"lease": -1}, zs.ConfigError, "lease"),
        ({"lease": math.nan}, zs.ConfigError, "lease"),
        ({"lease": math.inf}, zs.ConfigError, "lease"),
        ({"lease": "60"}, zs.ConfigTypeError, "lease"),
        ({"claim_settle": -0.5}, zs.ConfigError, "claim_settle"),
        ({"storage_options": ["key"]}, zs.ConfigTypeError, "storage_options"),
        ({"read_only": "yes"}, zs.ConfigTypeError, "read_only"),
        ({"experiment": 7}, zs.ConfigError, "experiment"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, type) else v.__name__,
)
def test_open_cache_checks_its_arguments(
    tmp_path: Path, fingerprint: dict, kwargs: dict[str, Any], error: type, match: str
) -> None:
    args: dict[str, Any] = {"location": tmp_path / "cache", "fingerprint": fingerprint, **kwargs}
    with pytest.raises(error, match=match) as exc:
        zs.open_cache(args.pop("location"), args.pop("fingerprint"), **args)
    assert isinstance(exc.value, zs.ZarrSkipError)
    assert _files(tmp_path / "cache") == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"expected": 10**9}, zs.ConfigError, "expected"),
        ({"expected": 0}, zs.ConfigError, "expected"),
        ({"expected": 2.0}, zs.ConfigTypeError, "expected"),
        ({"expected": True}, zs.ConfigTypeError, "expected"),
        ({"meta_info": [1, 2]}, zs.ConfigTypeError, "meta_info"),
    ],
    ids=repr,
)
def test_write_checks_its_arguments_before_writing(
    tmp_path: Path, fingerprint: dict, kwargs: dict[str, Any], error: type, match: str
) -> None:
    cache = zs.open_cache(tmp_path / "cache", fingerprint)
    with pytest.raises(error, match=match):
        cache.write(1, make_batch(2), **kwargs)
    assert _files(tmp_path / "cache") == []


@pytest.mark.parametrize("step", [-1, "1", 1.0, None, True])
def test_step_arguments_are_checked(tmp_path: Path, fingerprint: dict, step: Any) -> None:
    cache = zs.open_cache(tmp_path / "cache", fingerprint)
    cache.write(1, make_batch(2))
    for call in (cache.load, cache.info, cache.delete, cache.resolve, lambda s: cache.write(s, make_batch(2))):
        with pytest.raises(zs.ConfigError, match="step"):
            call(step)
    with pytest.raises(zs.ConfigError, match="step"):
        cache.status([step])
    assert cache.steps() == [1]


@pytest.mark.parametrize("steps", [["x"], "12", 5, [1, "2"]], ids=repr)
def test_status_refuses_what_is_not_a_list_of_steps(tmp_path: Path, fingerprint: dict, steps: Any) -> None:
    cache = zs.open_cache(tmp_path / "cache", fingerprint)
    cache.write(1, make_batch(2))
    with pytest.raises(zs.ConfigTypeError, match="steps"):
        cache.status(steps)


def _unsupported() -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sparse CSR is "beta", quantization deprecated
        return {
            "sparse_coo": torch.eye(3).to_sparse(),
            "sparse_csr": torch.eye(3).to_sparse_csr(),
            "meta": torch.empty(3, 2, device="meta"),
            "quantized": torch.quantize_per_tensor(torch.rand(3, 2), 0.1, 0, torch.qint8),
        }


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "meta", "quantized"])
def test_tensors_the_codec_cannot_store_are_refused_typed(tmp_path: Path, fingerprint: dict, kind: str) -> None:
    cache = zs.open_cache(tmp_path / "cache", fingerprint)
    with pytest.raises(zs.UnsupportedColumnError, match=kind):
        cache.write(1, {kind: _unsupported()[kind], "ok": torch.zeros(3)})
    assert _files(tmp_path / "cache") == []
