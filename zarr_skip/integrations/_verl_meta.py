"""Keep the Python types of verl's ``meta_info`` through the cache's JSON metadata.

verl's rollout output carries numpy scalars in ``meta_info`` (``AgentLoopManager`` fills
``meta_info["timing"]`` with ``np.float64`` minima, maxima and means), and verl's own cache
pickles them. zarr_skip stores ``meta_info`` as JSON, so :func:`encode_meta` turns numpy
scalars, numeric numpy arrays and tuples into their JSON values and records, under the one
top-level key :data:`TYPES_KEY`, where each was and what it was; :func:`decode_meta` puts the
original types back. A ``meta_info`` that is JSON already is stored unchanged, without the key.
Other readers of the cache see plain JSON values plus that key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr_skip.errors import MetadataError

__all__ = ["TYPES_KEY", "decode_meta", "encode_meta"]

#: the top-level ``meta_info`` key listing the values whose type JSON does not keep
TYPES_KEY = "__zarr_skip_types__"

_Path = list[Any]  # dict keys (str) and list indices (int) from the top level down


def encode_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """A JSON-able copy of ``meta`` plus, when needed, the record of numpy and tuple values.

    Values JSON cannot hold (and this function does not know) are left as they are: the
    cache then refuses the ``meta_info``, naming the value.

    Parameters
    ----------
    meta : mapping or None
        A DataProto's ``meta_info``.

    Returns
    -------
    dict
        The copy, with :data:`TYPES_KEY` when a numpy scalar, numpy array or tuple was converted.
    """
    types: list[dict[str, Any]] = []
    out: dict[str, Any] = _encode(dict(meta or {}), [], types)  # a dict encodes to a dict
    if types:
        if TYPES_KEY in out:
            raise MetadataError(f"meta_info: the key {TYPES_KEY!r} is reserved by zarr_skip")
        out[TYPES_KEY] = types
    return out


def _encode(value: Any, path: _Path, types: list[dict[str, Any]]) -> Any:
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        types.append({"path": path, "type": "scalar", "dtype": value.dtype.str})
        return _encode(value.item(), path, [])
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        types.append({"path": path, "type": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape)})
        return value.ravel().tolist()
    if isinstance(value, tuple):
        types.append({"path": path, "type": "tuple"})
        return [_encode(v, [*path, i], types) for i, v in enumerate(value)]
    if type(value) is list:
        return [_encode(v, [*path, i], types) for i, v in enumerate(value)]
    if type(value) is dict:
        return {k: _encode(v, [*path, k], types) if isinstance(k, str) else v for k, v in value.items()}
    return value


def decode_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """Undo :func:`encode_meta`: the ``meta_info`` as it was written.

    Raises
    ------
    MetadataError
        If the type record is malformed or points at nothing.
    """
    out = dict(meta or {})
    types = out.pop(TYPES_KEY, None)
    if not types:
        return out
    if not isinstance(types, list):
        raise MetadataError(f"meta_info[{TYPES_KEY!r}]: expected a list, got {type(types).__name__}")
    # deepest first: a tuple's items are restored before the tuple itself is made
    for entry in sorted(types, key=lambda e: -len(e.get("path", ())) if isinstance(e, dict) else 0):
        try:
            path, kind = list(entry["path"]), entry["type"]
            parent, key = _walk(out, path)
            value = parent[key] if parent is not None else out
            if kind == "scalar":
                new: Any = np.dtype(entry["dtype"]).type(value)
            elif kind == "ndarray":
                new = np.asarray(value, dtype=np.dtype(entry["dtype"])).reshape(entry["shape"])
            elif kind == "tuple":
                new = tuple(value)
            else:
                raise ValueError(f"unknown type {kind!r}")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetadataError(f"meta_info[{TYPES_KEY!r}]: cannot restore {entry!r} ({exc})") from None
        if parent is None:
            raise MetadataError(f"meta_info[{TYPES_KEY!r}]: an entry points at meta_info itself")
        parent[key] = new
    return out


def _walk(root: Any, path: _Path) -> tuple[Any, Any]:
    """The container holding ``path`` and the key within it (``None, None`` for the root)."""
    if not path:
        return None, None
    node = root
    for part in path[:-1]:
        node = node[part]
    return node, path[-1]
