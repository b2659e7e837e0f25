"""Restricted unpickling of legacy verl rollout dumps, and the matching DataProto writer.

Nothing here runs plain ``pickle.load`` or ``torch.load(weights_only=False)`` unless the
caller passes ``trust=True``. ``.dp`` pickles go through :class:`RestrictedUnpickler`,
whose ``find_class`` admits only data-only globals (numpy array reconstruction, data
builtins, torch tensor rebuilds, tensordict's reducers); ``verl.protocol.DataProto``
maps to :class:`DataProtoState`, which keeps the pickled state for
:func:`decode_dataproto_state`. ``torch.save`` archives (``tq_batch.pt``, and the bytes a
DataProto pickle embeds for its batch) go through ``torch.load(weights_only=True)`` with
the few tensordict / jagged-tensor classes added (:func:`torch_load`). A refused global
raises :class:`~zarr_skip.errors.UnsafePickleError` naming the file and the global; so does
a file that asks for more memory than a fixed multiple of its size (:mod:`._bounds`).

verl's ``DataProto.__getstate__`` returns ``(batch, non_tensor_batch, meta_info)`` where
``batch`` is the bytes of ``torch.save(batch.contiguous().consolidate())``, or, under
``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy``, ``(batch_size, device, {key: (dtype,
shape, uint8 array) | (layout, [such triples])})``.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import re
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np
import torch

from zarr_skip.errors import MissingExtraError, UnsafePickleError
from zarr_skip.legacy._bounds import COSTS, Budget, check_archive, check_tensors

__all__ = [
    "DataProtoState",
    "RestrictedUnpickler",
    "decode_dataproto_state",
    "encode_dataproto",
    "load_pickle",
    "torch_load",
    "unsafe_pickle_error",
]

logger = logging.getLogger(__name__)

_VERL_MODULE = "verl.protocol"
_VERL_CLASS = "DataProto"


def unsafe_pickle_error(path: str | os.PathLike[str], refused: str, detail: str = "") -> UnsafePickleError:
    """Build an :class:`UnsafePickleError` naming ``path`` and the refused global.

    The returned error carries ``path`` and ``refused`` attributes.
    """
    msg = (
        f"{os.fspath(path)}: refused to unpickle global {refused!r}; it is not on the "
        "allow-list of data-only types. Pass allow_pickle=True (zarr-skip import --allow-pickle) "
        "only if you trust this file."
    )
    if detail:
        msg += f" ({detail})"
    err = UnsafePickleError(msg)
    err.path = os.fspath(path)  # type: ignore[attr-defined]
    err.refused = refused  # type: ignore[attr-defined]
    return err


class DataProtoState:
    """Stand-in for ``verl.protocol.DataProto`` while unpickling: it only keeps the state.

    verl pickles a DataProto as ``NEWOBJ(DataProto) + BUILD(state)``; running verl's own
    ``__setstate__`` would call ``torch.load(weights_only=False)`` on embedded bytes, so
    the state is kept raw here and decoded by :func:`decode_dataproto_state`.
    """

    __slots__ = ("state",)

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _tensordict_globals() -> dict[str, Any]:
    try:
        import tensordict.utils as td_utils
    except ImportError:
        raise MissingExtraError(
            "reading verl's tq_batch.pt dumps needs the 'tensordict' package: pip install 'zarr-skip[tensordict]'"
        ) from None
    from tensordict import (
        LazyStackedTensorDict,
        NonTensorData,
        NonTensorStack,
        TensorDict,
        _reductions,
    )

    found: dict[str, Any] = {
        "tensordict._td.TensorDict": TensorDict,
        "tensordict._lazy.LazyStackedTensorDict": LazyStackedTensorDict,
        "tensordict.tensorclass.NonTensorData": NonTensorData,
        "tensordict.tensorclass.NonTensorStack": NonTensorStack,
        "tensordict._reductions._make_td": _reductions._make_td,
        "tensordict._reductions._rebuild_tensordict_files_consolidated": (
            _reductions._rebuild_tensordict_files_consolidated
        ),
        "tensordict.utils._StringOnlyDict": dict,  # tensordict<=0.4's dict subclass
    }
    if hasattr(td_utils, "_LockedSchema"):
        found["tensordict.utils._LockedSchema"] = td_utils._LockedSchema
    return found


def _torch_globals() -> dict[str, Any]:
    import torch._dynamo.decorators as dyn_dec
    from torch.nested._internal import nested_tensor as njt

    found = {
        "torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
        "torch._utils._rebuild_tensor": torch._utils._rebuild_tensor,
        "torch._utils._rebuild_parameter": torch._utils._rebuild_parameter,
        "torch._tensor._rebuild_from_type_v2": torch._tensor._rebuild_from_type_v2,
        "torch.Size": torch.Size,
        "torch.device": torch.device,
        "torch.Tensor": torch.Tensor,
        "torch.nn.parameter.Parameter": torch.nn.Parameter,
        "torch.nested._internal.nested_tensor.NestedTensor": njt.NestedTensor,
        "torch.nested._internal.nested_tensor._rebuild_njt": njt._rebuild_njt,
    }
    if hasattr(dyn_dec, "_DimRange"):
        found["torch._dynamo.decorators._DimRange"] = dyn_dec._DimRange
    return found


def _data_globals() -> dict[str, Any]:
    import builtins
    import collections
    import datetime

    try:  # numpy>=2; numpy 1.x pickles name numpy.core
        from numpy._core import multiarray
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    found: dict[str, Any] = {
        "numpy.dtype": np.dtype,
        "numpy.ndarray": np.ndarray,
        "collections.OrderedDict": collections.OrderedDict,
    }
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found[f"{mod}._reconstruct"] = multiarray._reconstruct
        found[f"{mod}.scalar"] = multiarray.scalar
    for name in (
        "set",
        "frozenset",
        "list",
        "dict",
        "tuple",
        "bytearray",
        "bytes",
        "str",
        "int",
        "float",
        "complex",
        "bool",
        "slice",
        "range",
    ):
        found[f"builtins.{name}"] = found[f"__builtin__.{name}"] = getattr(builtins, name)
    for name in ("datetime", "date", "time", "timedelta", "timezone"):
        found[f"datetime.{name}"] = getattr(datetime, name)
    return found


_ALLOWED: dict[str, Any] = {}


def _allowed() -> dict[str, Any]:
    if not _ALLOWED:
        for part in (_data_globals, _torch_globals, _tensordict_globals):
            _ALLOWED.update(part())
    return _ALLOWED


def _torch_safe_globals() -> list[Any]:
    """Extra globals ``torch.load(weights_only=True)`` needs for tensordict and NJT payloads."""
    extra: list[Any] = []
    for key, obj in {**_tensordict_globals(), **_torch_globals()}.items():
        if key == "tensordict.utils._StringOnlyDict":
            extra.append((dict, key))
        elif key.startswith(("tensordict.", "torch.nested.", "torch._dynamo.")):
            extra.append(obj)
    return extra


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` whose ``find_class`` admits only data-only globals.

    Parameters
    ----------
    file
        Binary file object to read the pickle from.
    path
        The file's name, used in error messages.
    trust
        If ``True``, every global is admitted (plain pickle semantics), except that
        ``verl.protocol.DataProto`` still maps to :class:`DataProtoState`.
    """

    def __init__(self, file: BinaryIO, *, path: str | os.PathLike[str], trust: bool = False) -> None:
        super().__init__(file)
        self._path = path
        self._trust = trust
        #: what the file may make this reader allocate (see zarr_skip.legacy._bounds)
        self.budget = Budget(path, _size_of(file))

    def _load_storage_bytes(self, data: bytes) -> Any:
        # Replaces torch.storage._load_from_bytes, which calls torch.load(weights_only=False).
        return torch_load(io.BytesIO(data), path=self._path, trust=self._trust)

    def find_class(self, module: str, name: str) -> Any:
        """Return the global ``module.name`` if allowed, else raise UnsafePickleError."""
        full = f"{module}.{name}"
        if module == _VERL_MODULE and name == _VERL_CLASS:
            return DataProtoState
        if full == "torch.storage._load_from_bytes":
            return self._load_storage_bytes
        if self._trust:
            return super().find_class(module, name)
        table = _allowed()
        if full in table:
            cost = COSTS.get(full)
            return table[full] if cost is None else self.budget.guard(full, table[full], cost)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise unsafe_pickle_error(self._path, full)


def _size_of(file: BinaryIO) -> int:
    """The size of a file object (its bytes from the current position to the end)."""
    where = file.tell()
    end = file.seek(0, os.SEEK_END)
    file.seek(where)
    return end - where


def load_pickle(path: str | os.PathLike[str], *, trust: bool = False) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler` (or permissively if ``trust``)."""
    with open(path, "rb") as fh:
        return RestrictedUnpickler(fh, path=path, trust=trust).load()


_REFUSED_RE = re.compile(r"GLOBAL ([\w.]+)")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def torch_load(source: str | os.PathLike[str] | BinaryIO, *, path: str | os.PathLike[str], trust: bool = False) -> Any:
    """``torch.load`` with ``weights_only=True`` plus tensordict/NJT classes, on CPU.

    Parameters
    ----------
    source
        File path or binary file object holding a ``torch.save`` archive.
    path
        Name used in error messages (the file, or the file that embeds the archive).
    trust
        If ``True`` use ``weights_only=False`` (runs whatever the archive names).

    Raises
    ------
    UnsafePickleError
        If the archive names a global outside torch's weights-only set and the extras.
    """
    if trust:
        return torch.load(source, weights_only=False, map_location="cpu")
    budget = Budget(path, os.path.getsize(source) if isinstance(source, (str, os.PathLike)) else _size_of(source))
    check_archive(source, budget)
    try:
        with torch.serialization.safe_globals(_torch_safe_globals()):
            loaded = torch.load(source, weights_only=True, map_location="cpu")
        check_tensors(loaded, budget)
        return loaded
    except UnsafePickleError:
        raise
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "Weights only load failed" not in text and "WeightsUnpickler" not in text:
            raise
        text = _ANSI_RE.sub("", text)
        match = _REFUSED_RE.search(text)
        refused = match.group(1) if match else "<unsupported pickle operation>"
        if "." not in refused and match:  # torch names builtins without their module
            refused = f"builtins.{refused}"
        line = next((ln for ln in text.splitlines() if "GLOBAL" in ln), text.splitlines()[-1])
        detail = line.split("WeightsUnpickler error:", 1)[-1].strip()[:200]
        raise unsafe_pickle_error(path, refused, detail=f"torch weights-only load: {detail}") from None


# --------------------------------------------------------------------------- decoding


def _tensor_from_numpy_encoding(item: Any, path: str | os.PathLike[str]) -> torch.Tensor:
    dtype_name, shape, data = item
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{os.fspath(path)}: unknown tensor dtype {dtype_name!r} in DataProto batch")  # noqa: TRY004
    raw = bytearray(memoryview(data).cast("B"))
    if not raw:
        return torch.empty(tuple(shape), dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(tuple(shape))


def _decode_numpy_batch(raw: tuple[Any, ...], path: str | os.PathLike[str]) -> Any:
    from tensordict import TensorDict

    batch_size, device, items = raw
    decoded: dict[str, torch.Tensor] = {}
    for key, item in items.items():
        if len(item) == 3:
            decoded[key] = _tensor_from_numpy_encoding(item, path)
        elif len(item) == 2 and item[0] in ("jagged", "strided"):
            parts = [_tensor_from_numpy_encoding(t, path) for t in item[1]]
            decoded[key] = torch.nested.as_nested_tensor(parts, layout=getattr(torch, item[0]))
        else:
            raise ValueError(f"{os.fspath(path)}: bad tensor encoding for batch key {key!r}")
    if device is not None and str(device) != "cpu":
        logger.info("%s: batch was on %s; loading it on the CPU", os.fspath(path), device)
    return TensorDict(decoded, batch_size=list(batch_size))


def decode_dataproto_state(
    state: Any, *, path: str | os.PathLike[str], trust: bool = False
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Turn a pickled DataProto state into ``(batch, non_tensor_batch, meta_info)``.

    Accepts verl's three-tuple state (torch bytes or numpy encoding of ``batch``) and the
    plain ``__dict__`` state of verl versions without a custom ``__getstate__``.
    """
    if isinstance(state, dict):
        return state.get("batch"), state.get("non_tensor_batch") or {}, state.get("meta_info") or {}
    if not (isinstance(state, tuple) and len(state) == 3):
        raise TypeError(f"{os.fspath(path)}: not a verl DataProto pickle state ({type(state).__name__})")
    raw, non_tensor_batch, meta_info = state
    if raw is None:
        batch = None
    elif isinstance(raw, (bytes, bytearray)):
        batch = torch_load(io.BytesIO(bytes(raw)), path=path, trust=trust)
    elif isinstance(raw, tuple) and len(raw) == 3:
        batch = _decode_numpy_batch(raw, path)
    else:
        raise ValueError(f"{os.fspath(path)}: unknown DataProto batch encoding {type(raw).__name__}")
    return batch, dict(non_tensor_batch or {}), dict(meta_info or {})


# --------------------------------------------------------------------------- encoding


class _PortableConsolidated:
    """Pickles a consolidated TensorDict exactly as tensordict does, with portable metadata.

    tensordict>=0.11 records a sixth ``ragged_idx`` field for jagged leaves, which the
    tensordict<=0.10 that verl pins cannot unpack; the default value (1) is dropped.
    """

    def __init__(self, td: Any) -> None:
        self._metadata = _portable_metadata(td._consolidated["metadata"])
        self._storage = td._consolidated["storage"]

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        from tensordict._reductions import _rebuild_tensordict_files_consolidated

        return _rebuild_tensordict_files_consolidated, (self._metadata, self._storage)


def _portable_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "leaves":
            out[key] = {
                leaf: tuple(spec[:5]) if len(spec) == 6 and spec[5] == 1 else spec for leaf, spec in value.items()
            }
        elif isinstance(value, dict) and key not in ("non_tensors", "cls_metadata"):
            out[key] = _portable_metadata(value)
        else:
            out[key] = value
    return out


def _encode_torch_batch(batch: Any) -> bytes:
    obj: Any = batch
    if batch is not None and len(batch.keys()) > 0:
        obj = _PortableConsolidated(batch.contiguous().consolidate())
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def encode_dataproto(batch: Any, non_tensor_batch: dict[str, Any], meta_info: dict[str, Any]) -> bytes:
    """Pickle bytes that ``pickle.load`` turns into a ``verl.protocol.DataProto``.

    The stream is ``GLOBAL verl.protocol DataProto; NEWOBJ; <state>; BUILD`` with the state
    verl's own ``__getstate__`` produces by default (``batch`` as ``torch.save`` bytes of
    the consolidated TensorDict), so verl's ``__setstate__`` restores it. verl is not
    imported here.
    """
    body = pickle.dumps((_encode_torch_batch(batch), non_tensor_batch, meta_info), protocol=4)
    if body[:2] != b"\x80\x04" or body[-1:] != pickle.STOP:
        raise AssertionError("unexpected pickle framing")  # pragma: no cover
    # The state's opcodes keep their own memo numbering (the header memoizes nothing), and
    # BUILD takes STOP's place inside the last frame, so every frame length stays right.
    header = pickle.PROTO + b"\x04" + pickle.GLOBAL + f"{_VERL_MODULE}\n{_VERL_CLASS}\n".encode()
    header += pickle.EMPTY_TUPLE + pickle.NEWOBJ
    return header + body[2:-1] + pickle.BUILD + pickle.STOP
