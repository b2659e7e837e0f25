"""What each stored array is, written on the array itself (pure: no store).

Every array document (``zarr.json`` of an array) carries ``dimension_names`` and an attribute
``zarr_skip.array`` naming its column, its role and the logical dtype it decodes to, so that a
zarr or xarray user who never heard of zarr_skip knows what the bytes mean. Dimension names are
per column (``responses.row``, ``responses.value``): arrays of different columns never share a
dimension, so xarray does not try to align them (rows of a dictionary-encoded column are not
values of another one).

========================= =============================== ======================================
role                      array                           dimension names
========================= =============================== ======================================
``data``                  a dense column, rows x shape    ``{c}.row``, ``{c}.dim1`` ...
``values``                a jagged column's values        ``{c}.value``, ``{c}.dim1`` ...
``lengths``               values per row                  ``{c}.row``
``codes``                 per row, its dictionary entry   ``{c}.row``
``dictionary_values``     values of the distinct rows     ``{c}.value``, ``{c}.dim1`` ...
``dictionary_lengths``    values per distinct row         ``{c}.entry``
========================= =============================== ======================================

A raw-bytes view of a non-numeric numpy dtype has a last dimension ``{c}.itembyte``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zarr_skip.format.specs import ColumnSpec

ARRAY_ATTR = "zarr_skip.array"

#: what the bytes of a bytes column's values are, by column kind
_BYTES_CONTENT = {
    "str": "utf-8 text",
    "json": "utf-8 JSON (zarr_skip's tagged JSON, see docs/format.md)",
    "pickle": "pickle protocol 5",
}


@dataclass(frozen=True, slots=True)
class ArrayAbout:
    """The self-description of one stored array: its dimension names and attributes."""

    dimension_names: tuple[str, ...]
    attributes: dict[str, Any]


def array_role(array: str, dictionary: bool) -> str:
    """The role of the stored array named ``array`` (``data``, ``values``, ``lengths``,
    ``codes``) in a column, dictionary-encoded or not."""
    if dictionary and array in ("values", "lengths"):
        return f"dictionary_{array}"
    return array


def describe_array(
    spec: ColumnSpec, array: str, ndim: int, stored_dtype: str, *, dictionary: bool = False
) -> ArrayAbout:
    """The dimension names and ``zarr_skip.array`` attribute of a column's stored array.

    Parameters
    ----------
    spec : the column.
    array : the stored array's name (``data``, ``values``, ``lengths``, ``codes``).
    ndim : its number of dimensions.
    stored_dtype : its numpy dtype on disk (after narrowing), e.g. ``uint32``.
    dictionary : whether the column is dictionary-encoded in this mini-batch.
    """
    role = array_role(array, dictionary)
    c = spec.name
    doc: dict[str, Any] = {"column": c, "role": role, "kind": spec.kind, "stored_dtype": stored_dtype}
    if role in ("lengths", "codes", "dictionary_lengths"):
        first = f"{c}.entry" if role == "dictionary_lengths" else f"{c}.row"
        doc["dtype"] = "int64"
        doc["description"] = {
            "lengths": f"values per row of column {c!r} (row i holds the next lengths[i] values)",
            "codes": f"per row of column {c!r}, the index of its entry in the dictionary",
            "dictionary_lengths": f"values per distinct row (dictionary entry) of column {c!r}",
        }[role]
        return ArrayAbout((first,), {ARRAY_ATTR: doc})
    first = f"{c}.row" if role == "data" else f"{c}.value"
    names = [first] + [f"{c}.dim{k}" for k in range(1, ndim)]
    if spec.kind in _BYTES_CONTENT:
        doc["dtype"] = spec.kind
        doc["content"] = _BYTES_CONTENT[spec.kind]
    else:
        doc["dtype"] = spec.dtype
        if len(spec.storage_shape) > len(spec.shape):
            names[-1] = f"{c}.itembyte"
    if role == "data":
        doc["description"] = f"column {c!r}, one row per rollout"
    else:
        whose = "distinct rows (dictionary entries)" if dictionary else "rows"
        doc["description"] = f"values of column {c!r}: its {whose} back to back, split by the lengths"
    return ArrayAbout(tuple(names), {ARRAY_ATTR: doc})
