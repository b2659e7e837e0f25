"""Memory bounds for reading legacy files: what a file may make the reader allocate.

A pickle is a program; even with only data-only globals allowed, a few bytes can ask for
gigabytes (``bytearray(10**10)``, ``list(range(10**9))``, ``numpy.ndarray((10**5, 10**5))``, a
torch tensor rebuilt with stride 0 over a one-element storage, a deflated zip member that
inflates a thousandfold). A :class:`Budget` allows a file at most ``FACTOR`` times its size
plus ``CONSTANT`` bytes, charged before each allocation the file asks for; going over raises
:class:`~zarr_skip.errors.UnsafePickleError` naming the file and the request.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from zarr_skip.errors import UnsafePickleError

__all__ = ["CONSTANT", "FACTOR", "Budget", "check_archive", "check_tensors"]

#: bytes a file may make the reader allocate, per byte of the file ...
FACTOR = 8
#: ... plus this much (small files: metadata, empty batches)
CONSTANT = 16 << 20
#: globals of torch's weights-only allow-list that allocate from a small argument
#: (``bytearray(n)``, legacy constructors such as ``torch.FloatTensor(n)``); never in what
#: verl or tensordict save
_ALLOCATING = ("builtins.bytearray",)


class Budget:
    """What one file may still make the reader allocate."""

    def __init__(self, path: str | os.PathLike[str], size: int) -> None:
        self.path = os.fspath(path)
        self.size = size
        self.limit = FACTOR * size + CONSTANT
        self.used = 0

    def take(self, nbytes: float, what: str) -> None:
        if not nbytes <= self.limit - self.used:  # also refuses NaN and infinities
            raise self.error(what, nbytes)
        self.used += int(nbytes)

    def error(self, what: str, nbytes: float) -> UnsafePickleError:
        asked = f"{int(nbytes):,} bytes" if math.isfinite(nbytes) else "unbounded memory"
        err = UnsafePickleError(
            f"{self.path}: refused: {what} asks for {asked}; a file of {self.size:,} bytes may make "
            f"the reader allocate at most {self.limit:,} ({FACTOR}x its size + {CONSTANT >> 20} MiB)"
        )
        err.path = self.path  # type: ignore[attr-defined]
        err.refused = what  # type: ignore[attr-defined]
        return err

    def guard(self, name: str, fn: Callable[..., Any], cost: Callable[..., float]) -> Callable[..., Any]:
        """``fn``, charging ``cost(*args, **kwargs)`` bytes before each call."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            # a guarded class passed as an argument (numpy's _reconstruct(ndarray, ...)) is the class
            args = tuple(getattr(a, "__wrapped__", a) if getattr(a, "_zs_guard", False) else a for a in args)
            try:
                nbytes = float(cost(*args, **kwargs))
            except (OverflowError, TypeError, ValueError):
                nbytes = math.inf  # a length too large to compute, or a shape that is not one
            self.take(nbytes, f"{name}{_show(args)}")
            return fn(*args, **kwargs)

        guarded.__wrapped__ = fn  # type: ignore[attr-defined]
        guarded._zs_guard = True  # type: ignore[attr-defined]
        return guarded


def _show(args: tuple[Any, ...]) -> str:
    text = ", ".join(repr(a) if not isinstance(a, (bytes, bytearray, str)) else type(a).__name__ for a in args)
    return f"({text[:120]})"


def _length(value: Any, item: int) -> float:
    if isinstance(value, int) and not isinstance(value, bool):
        return value * item
    return len(value) * item if hasattr(value, "__len__") else 0


def _shape_bytes(shape: Any, itemsize: int) -> float:
    dims = [shape] if isinstance(shape, int) else list(shape)
    if any(not isinstance(d, int) or d < 0 for d in dims):
        raise ValueError("not a shape")
    return math.prod(dims) * max(itemsize, 1)


def _ndarray_cost(shape: Any = (), dtype: Any = float, *args: Any, **kwargs: Any) -> float:
    import numpy as np

    return _shape_bytes(shape, np.dtype(dtype).itemsize)


def _reconstruct_cost(cls: Any, shape: Any = (0,), dtype: Any = b"b", *args: Any) -> float:
    import numpy as np

    return _shape_bytes(shape, np.dtype(dtype).itemsize if not isinstance(dtype, bytes) else 1)


def _tensor_cost(storage: Any, offset: int, size: Any, stride: Any = None, *args: Any, **kwargs: Any) -> float:
    itemsize = getattr(getattr(storage, "dtype", None), "itemsize", 1)
    return _shape_bytes(tuple(size), itemsize)


#: cost of each allocating global the restricted unpickler allows, by its pickled name
COSTS: Mapping[str, Callable[..., float]] = {
    **{
        f"{mod}.{name}": (lambda v=b"", *a, **k: _length(v, 1))
        for mod in ("builtins", "__builtin__")
        for name in ("bytearray", "bytes")
    },
    **{
        f"{mod}.{name}": (lambda v=(), *a, **k: _length(v, 8) if not isinstance(v, int) else 0)
        for mod in ("builtins", "__builtin__")
        for name in ("list", "tuple", "set", "frozenset", "dict")
    },
    "numpy.ndarray": _ndarray_cost,
    "numpy.core.multiarray._reconstruct": _reconstruct_cost,
    "numpy._core.multiarray._reconstruct": _reconstruct_cost,
    "torch._utils._rebuild_tensor_v2": _tensor_cost,
    "torch._utils._rebuild_tensor": _tensor_cost,
}


def check_archive(source: str | os.PathLike[str] | BinaryIO, budget: Budget) -> None:
    """Before ``torch.load``: the zip's members may not inflate past the budget, and its pickle
    may not name a global that allocates from a small argument."""
    if isinstance(source, (str, os.PathLike)):
        _check_zip(os.fspath(source), budget)
        return
    start = source.tell()
    try:
        _check_zip(source, budget)
    finally:
        source.seek(start)


def _check_zip(source: str | BinaryIO, budget: Budget) -> None:
    from torch import _tensor_classes
    from torch._weights_only_unpickler import get_globals_in_pkl

    try:
        archive = zipfile.ZipFile(source)
    except zipfile.BadZipFile:
        return  # torch's legacy (pre-1.6) format: its records are read as stored, unexpanded
    with archive:
        infos = archive.infolist()
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                budget.take(info.file_size, f"zip member {info.filename!r} compressed to {info.compress_size:,} bytes")
        budget.take(sum(i.file_size for i in infos), "the zip's members")
        budget.used = 0  # the members are the file's own bytes: what they build is charged next
        allocating = {*_ALLOCATING, *(f"{t.__module__}.{t.__name__}" for t in _tensor_classes)}
        for info in infos:
            if info.filename.endswith(".pkl"):
                found = get_globals_in_pkl(io.BytesIO(archive.read(info)))
                bad = sorted(found & allocating)
                if bad:
                    raise budget.error(f"global {bad[0]} (it allocates from a small argument)", math.inf)


def check_tensors(value: Any, budget: Budget, depth: int = 0) -> None:
    """After ``torch.load``: every tensor's logical size (a stride-0 view of one element may
    claim terabytes, which a later copy would allocate) is charged to the budget."""
    import torch

    if depth > 64:
        return
    if isinstance(value, torch.Tensor):
        t = value.values() if value.is_nested else value
        budget.take(t.numel() * t.element_size(), f"tensor of shape {tuple(t.shape)} and dtype {t.dtype}")
        return
    items = getattr(value, "items", None)
    if callable(items) and type(value).__name__ in ("TensorDict", "LazyStackedTensorDict"):
        for _, leaf in value.items(include_nested=True, leaves_only=True):
            check_tensors(leaf, budget, depth + 1)
    elif isinstance(value, Mapping):
        for leaf in value.values():
            check_tensors(leaf, budget, depth + 1)
    elif isinstance(value, (list, tuple)):
        for leaf in value:
            check_tensors(leaf, budget, depth + 1)
