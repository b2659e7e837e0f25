"""Exact JSON for per-row objects and batch metadata (pure: no store, no torch).

Plain JSON loses tuples (they come back as lists), numpy scalars (refused) and the payload
bits of NaNs. These are written as small tagged objects and restored on load::

    (1, 2)            -> {"$tuple": [1, 2]}
    np.float32(2.5)   -> {"$numpy": "<f4", "hex": "00002040"}
    NaN with payload  -> {"$float": "<f8", "hex": "..."}

A whole column is encoded row by row (rows that are one object, as verl repeats a prompt's
dicts for its ``n`` samples, once) and checked with one C-speed round trip; only a column that
fails it takes the slower exact path.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zarr_skip.errors import UnsupportedColumnError

_CANONICAL_NAN = struct.pack("<d", float("nan"))

NUMPY_TAG, TUPLE_TAG, FLOAT_TAG = "$numpy", "$tuple", "$float"
_TAGS = (NUMPY_TAG, TUPLE_TAG, FLOAT_TAG)


class _NotJSON(Exception):
    """A value :func:`_tagged` cannot represent; the message says what and where."""


def _tag_numpy(value: Any) -> Any:
    """JSON stand-in for a numpy scalar: its dtype and exact bytes (verl's timings are numpy)."""
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return {NUMPY_TAG: value.dtype.str, "hex": value.tobytes().hex()}
    raise TypeError(f"{type(value).__qualname__} is not JSON-able")


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) == 2 and "hex" in obj:
        if NUMPY_TAG in obj:
            return np.frombuffer(bytes.fromhex(obj["hex"]), dtype=np.dtype(obj[NUMPY_TAG]))[0]
        if FLOAT_TAG in obj:
            return struct.unpack("<d", bytes.fromhex(obj["hex"]))[0]
    if len(obj) == 1 and TUPLE_TAG in obj:
        return tuple(obj[TUPLE_TAG])
    return obj


def _tagged(value: Any) -> Any:
    """``value`` as exact JSON data: tuples, numpy scalars and NaN payloads tagged.

    Raises :class:`_NotJSON` naming the first value that cannot be represented.
    """
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        if value != value and struct.pack("<d", value) != _CANONICAL_NAN:
            return {FLOAT_TAG: "<f8", "hex": struct.pack("<d", value).hex()}
        return value
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return _tag_numpy(value)
    if t is list or t is tuple:
        items = [_tagged(v) for v in value]
        return items if t is list else {TUPLE_TAG: items}
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise _NotJSON(f"dict key {k!r} ({type(k).__qualname__}, JSON keys must be str)")
            if k in _TAGS:
                raise _NotJSON(f"dict key {k!r} (reserved by zarr_skip's JSON encoding)")
            out[k] = _tagged(v)
        return out
    raise _NotJSON(f"{t.__qualname__} value {value!r:.60}")


_TOO_DEEP = "a value that holds itself (a circular reference) or is nested too deeply"

_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_tag_numpy)


def _row_encoder() -> Any:
    """A function encoding like ``_JSON.encode``, for the rows of one column: CPython's C
    encoder made once and called per row (half the cost of ``_JSON.encode``, which builds one
    per call). After it raised, make a new one (its circle markers may be left set)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - a Python without the C accelerator
        return _JSON.encode
    # markers: a dict, so that a row holding itself is a ValueError as with _JSON.encode
    enc = make({}, _tag_numpy, json.encoder.encode_basestring, None, ":", ",", False, False, True)
    return lambda value: "".join(enc(value, 0)) if type(value) is not str else _JSON.encode(value)


def json_loads(text: str | bytes) -> Any:
    """Parse JSON written by this codec (tagged values come back as what they were)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogatepass")
    if '"$' not in text:
        return json.loads(text)
    return json.loads(text, object_hook=_untag)


def to_json_value(value: Any) -> Any:
    """``value`` as plain, exact JSON data, for metadata attributes (raises UnsupportedColumnError)."""
    try:
        return _tagged(value)
    except _NotJSON as exc:
        raise UnsupportedColumnError(f"meta_info: cannot store {exc}; it must be JSON-able") from None
    except RecursionError:
        raise UnsupportedColumnError(f"meta_info: cannot store it: {_TOO_DEEP}") from None


def from_json_value(value: Any) -> Any:
    """Inverse of :func:`to_json_value`."""
    if isinstance(value, dict):
        return _untag({k: from_json_value(v) for k, v in value.items()})
    if isinstance(value, list):
        return [from_json_value(v) for v in value]
    return value


def json_rows(rows: Sequence[Any]) -> tuple[list[bytes], str | None]:
    """Each row as UTF-8 JSON, or the first row's problem.

    Rows that are the same object (verl repeats a prompt's dicts for its ``n`` samples) are
    encoded once.
    """
    rows = list(rows)
    try:
        seen: dict[int, bytes] = {}
        unique: list[Any] = []
        encode = _row_encoder()
        for r in rows:
            if id(r) not in seen:
                seen[id(r)] = encode(r).encode("utf-8", "surrogatepass")
                unique.append(r)
        blobs = [seen[id(r)] for r in rows]
        # one C-speed round trip of the distinct rows catches tuples, non-str keys, reserved
        # keys, NaN payloads and the like; the exact (slower) row-by-row path runs only then
        if json_loads(b"[" + b",".join(seen[id(r)] for r in unique) + b"]") == unique:
            return blobs, None
    except (TypeError, ValueError, RecursionError):  # a row nested too deeply: found row by row below
        pass
    blobs = []
    for i, r in enumerate(rows):
        try:
            text = _JSON.encode(r)
            exact = json_loads(text) == r
        except (TypeError, ValueError, RecursionError):
            exact = False
        if not exact:
            try:
                text = _JSON.encode(_tagged(r))
            except _NotJSON as exc:
                return [], f"row {i}: {exc}"
            except RecursionError:
                return [], f"row {i}: {_TOO_DEEP}"
        blobs.append(text.encode("utf-8", "surrogatepass"))
    return blobs, None


def strict_json(value: Any) -> Any:
    """``value`` for strict JSON (jq, JavaScript, TRL's loader): every non-finite float (NaN,
    infinities, which JSON has not) as None, in mappings and lists at any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
