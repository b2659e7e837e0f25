"""The codec alone (no store): exact round trips of every supported column, clear refusals."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from zarr_skip.errors import SchemaMismatchError, UnsupportedColumnError
from zarr_skip.format.columns import encode_batch, encode_column, narrow
from zarr_skip.format.restore import restore

ALL_TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]


def roundtrip(value: Any, **kw: Any) -> Any:
    col = encode_column("c", value, **kw)
    widened = {
        k: v.astype(np.int64 if k in ("lengths", "codes") else col.spec.storage_dtype) for k, v in col.arrays.items()
    }
    return restore(col.spec, widened, allow_pickle=kw.get("allow_pickle", False))


def random_bits(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Any bit pattern of ``dtype`` (NaNs, infinities, subnormals included)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
        dtype.itemsize if not dtype.is_complex else dtype.itemsize // 2
    ]
    n = math.prod(shape) * (2 if dtype.is_complex else 1)
    raw = torch.randint(0, 256, (n * width.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(width).view(dtype).reshape(shape) if not dtype.is_complex else raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_every_torch_dtype_roundtrips_bit_exact(dtype: torch.dtype) -> None:
    for shape in [(5,), (4, 3), (0, 2), (3, 0), (2, 2, 2)]:
        t = random_bits(dtype, shape, seed=len(shape))
        back = roundtrip(t)
        assert_equal(back, t, f"{dtype}{shape}")


@given(
    st.lists(st.integers(0, 9), min_size=0, max_size=12),
    st.sampled_from([torch.int64, torch.int32, torch.bfloat16, torch.float32, torch.bool]),
    st.sampled_from([(), (2,)]),
    st.integers(0, 2**31),
)
@settings(max_examples=60, deadline=None)
def test_nested_roundtrip(lengths: list[int], dtype: torch.dtype, trailing: tuple[int, ...], seed: int) -> None:
    offsets = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    values = random_bits(dtype, (int(offsets[-1]), *trailing), seed)
    nt = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    col = encode_column("c", nt)
    if "codes" not in col.arrays:
        assert col.arrays["values"].shape[0] == sum(lengths)  # no padding stored
    assert_equal(roundtrip(nt), nt)


def test_nested_with_holes_is_compacted() -> None:
    values = torch.arange(10)
    nt = torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 4, 8]), lengths=torch.tensor([2, 3]))
    back = roundtrip(nt)
    assert [r.tolist() for r in back.unbind()] == [[0, 1], [4, 5, 6]]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text()
    | st.integers(-(2**63), 2**63 - 1).map(np.int64)
    | st.floats(width=32).map(np.float32),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.lists(kids, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=5).filter(lambda k: not k.startswith("$")), kids, max_size=4)
    ),
    max_leaves=12,
)


@given(st.lists(json_values, max_size=8), st.sampled_from(["list", "object"]))
@settings(max_examples=100, deadline=None)
def test_json_rows_roundtrip(rows: list[Any], container: str) -> None:
    value: Any = rows
    if container == "object":
        value = np.empty(len(rows), dtype=object)
        for i, r in enumerate(rows):
            value[i] = r
    assert_equal(roundtrip(value), value)


@given(st.lists(json_values, max_size=8))
@settings(max_examples=100, deadline=None)
def test_the_row_encoder_writes_what_the_json_encoder_writes(rows: list[Any]) -> None:
    from zarr_skip.format.jsonvalues import _JSON, _row_encoder

    encode = _row_encoder()  # one per column, called per row
    for r in rows:
        try:
            expected = _JSON.encode(r)
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)):
                encode(r)
            encode = _row_encoder()  # its markers may be left set after an error
            continue
        assert encode(r) == expected


def test_a_row_holding_itself_is_a_typed_error_and_later_rows_still_encode() -> None:
    row: dict[str, Any] = {"a": 1}
    row["self"] = row
    with pytest.raises(UnsupportedColumnError, match="column 'c'"):
        encode_column("c", [{"x": 1}, row])
    with pytest.raises(UnsupportedColumnError, match="meta_info: .*circular"):
        encode_batch({"a": torch.zeros(1)}, {"m": row})
    assert roundtrip([{"x": 1}, {"y": [2]}]) == [{"x": 1}, {"y": [2]}]


@given(st.lists(st.text(), max_size=10))
@settings(max_examples=100, deadline=None)
def test_strings_roundtrip_including_empty_and_surrogates(rows: list[str]) -> None:
    rows = rows + ["", "\ud800lone surrogate", "naïve ✓"]
    col = encode_column("c", rows)
    assert col.spec.kind == "str"
    assert roundtrip(rows) == rows


@given(
    st.sampled_from(["<i2", ">i4", "<u8", "<f2", ">f8", "<c8", "?", "<U7", "|S3", "<M8[ns]", "<m8[s]"]),
    st.integers(0, 5),
    st.integers(0, 2**31),
)
@settings(max_examples=60, deadline=None)
def test_numpy_arrays_roundtrip(dtype: str, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=rows * 2 * np.dtype(dtype).itemsize, dtype=np.uint8)
    a = (
        raw.view(dtype).reshape(rows, 2)
        if np.dtype(dtype).kind not in "US"
        else np.array([["ab", "c"]] * rows, dtype=dtype).reshape(rows, 2)
    )
    back = roundtrip(a)
    assert back.dtype == a.dtype and back.shape == a.shape
    assert back.tobytes() == a.tobytes()


def test_structured_numpy_dtype_roundtrips() -> None:
    a = np.zeros(3, dtype=[("x", "<i4"), ("y", "<f8", (2,))])
    a["x"] = [1, 2, 3]
    back = roundtrip(a)
    assert back.dtype == a.dtype and back.tobytes() == a.tobytes()


def test_per_row_numeric_arrays_are_stored_jagged() -> None:
    rows = np.empty(3, dtype=object)
    rows[0], rows[1], rows[2] = np.arange(3, dtype=np.int16), np.arange(0, dtype=np.int16), np.ones(2, np.int16)
    col = encode_column("c", rows)
    assert col.spec.kind == "rows" and col.arrays["values"].shape == (5,)
    assert_equal(roundtrip(rows), rows)


def test_integers_are_narrowed_and_widened_back() -> None:
    ids = torch.tensor([[0, 151935], [151643, 7]])
    col = encode_column("ids", ids)
    assert col.arrays["data"].dtype == np.dtype("u4")
    mask = encode_column("m", torch.ones(4, 3, dtype=torch.int64))
    assert mask.arrays["data"].dtype == np.dtype("u1")
    assert narrow(np.array([-1, 200], dtype=np.int64)).dtype == np.dtype("i2")
    assert_equal(roundtrip(ids), ids)


@pytest.mark.parametrize("dtype", ["i2", "i4", "i8", "u2", "u4", "u8"])
def test_narrowing_picks_the_smallest_type_holding_min_and_max(dtype: str) -> None:
    # narrow() finds the width in one pass (an OR of the values) unless a value is negative;
    # the type must be the one min() and max() ask for, at every edge
    from zarr_skip.format.specs import NARROW_ORDER

    info = np.iinfo(dtype)
    edges = [0, 1, 127, 128, 255, 256, 32767, 32768, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1]
    values = [v for v in edges if v <= info.max] + [-v for v in edges if -v >= info.min]
    rng = np.random.default_rng(0)
    for lo in values:
        for hi in values:
            if lo > hi:
                continue
            a = np.concatenate([np.array([hi, lo], dtype=dtype), rng.integers(lo, hi, 50, endpoint=True, dtype=dtype)])
            fits = [t for t in NARROW_ORDER if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max]
            want = fits[0] if fits[0].itemsize < a.dtype.itemsize else a.dtype
            got = narrow(a)
            assert got.dtype == want, (dtype, lo, hi)
            assert_equal(np.asarray(got[:], dtype=dtype), a)


def test_unsupported_values_name_the_column_and_type() -> None:
    with pytest.raises(UnsupportedColumnError, match=r"column 'bad'.*set"):
        encode_column("bad", [{1, 2}])
    with pytest.raises(UnsupportedColumnError, match=r"column 'keys'.*dict key 1"):
        encode_column("keys", [{1: "x"}])
    with pytest.raises(UnsupportedColumnError, match=r"column 'obj'.*object.*allow_pickle"):
        encode_column("obj", object())
    with pytest.raises(UnsupportedColumnError, match="0-d"):
        encode_column("scalar", torch.tensor(3))
    with warnings.catch_warnings():  # torch's "prototype stage" warning, once per process
        warnings.simplefilter("ignore", UserWarning)
        strided = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(UnsupportedColumnError, match="layout"):
        encode_column("strided", strided)
    ragged_2 = torch.nested.nested_tensor_from_jagged(torch.zeros(2, 5), offsets=torch.tensor([0, 2, 5]), jagged_dim=2)
    with pytest.raises(UnsupportedColumnError, match=r"column 'wide'.*ragged dimension must be dim 1"):
        encode_column("wide", ragged_2)


def test_pickle_is_opt_in_on_write_and_on_read() -> None:
    rows = [{1, 2}, frozenset()]
    col = encode_column("p", rows, allow_pickle=True)
    assert col.spec.kind == "pickle"
    with pytest.raises(UnsupportedColumnError, match="allow_pickle"):
        restore(col.spec, col.arrays)
    assert restore(col.spec, col.arrays, allow_pickle=True) == rows


def test_batch_rows_must_agree() -> None:
    with pytest.raises(SchemaMismatchError, match=r"a=3, b=2"):
        encode_batch({"a": torch.zeros(3), "b": torch.zeros(2)})


def test_meta_info_must_be_json() -> None:
    with pytest.raises(UnsupportedColumnError, match="meta_info"):
        encode_batch({"a": torch.zeros(3)}, {"t": torch.zeros(1)})


def test_dataproto_like_sections_are_recorded() -> None:
    from zarr_skip import DataProtoLike

    dp = DataProtoLike(
        batch={"x": torch.zeros(2)}, non_tensor_batch={"y": np.array(["a", "b"], dtype=object)}, meta_info={"k": 1}
    )
    enc = encode_batch(dp)
    assert enc.batch_type == "dataproto" and enc.meta_info == {"k": 1}
    assert [c.spec.section for c in enc.columns] == ["batch", "non_tensor_batch"]


def test_tuples_and_nan_payloads_in_json_rows_roundtrip_exactly() -> None:
    import struct

    odd = struct.unpack("<d", struct.pack("<Q", 0x7FFEA81828BA1A13))[0]
    rows = [{"a": (1, [2, (3,)])}, (4, "x"), [odd], float("nan")]
    back = roundtrip(rows)
    assert back[0] == {"a": (1, [2, (3,)])} and type(back[0]["a"][1][1]) is tuple
    assert back[1] == (4, "x") and type(back[1]) is tuple
    assert struct.pack("<d", back[2][0]) == struct.pack("<d", odd)
    assert math.isnan(back[3])


def test_numpy_scalars_in_json_rows_and_meta_info_roundtrip_exactly() -> None:
    odd_nan = np.frombuffer(bytes.fromhex("0100807f"), dtype="<f4")[0]
    rows = [{"t": np.float64(0.1), "n": np.int64(3), "b": np.bool_(True)}, np.float32(2.5), [odd_nan]]
    back = roundtrip(rows)
    # np.float64 subclasses float, so JSON writes it as a float: same value, plain float back
    assert type(back[0]["t"]) is float and back[0]["t"] == 0.1 and type(back[0]["n"]) is np.int64
    assert type(back[0]["b"]) is np.bool_
    assert type(back[1]) is np.float32 and back[2][0].tobytes() == odd_nan.tobytes()
    enc = encode_batch({"a": torch.zeros(1)}, {"timing": {"gen": np.float64(1.25)}})
    from zarr_skip.format.jsonvalues import from_json_value

    meta = from_json_value(enc.meta_info)
    assert meta["timing"]["gen"] == 1.25
    enc = encode_batch({"a": torch.zeros(1)}, {"timing": {"gen": np.float32(1.25)}})
    assert type(from_json_value(enc.meta_info)["timing"]["gen"]) is np.float32
    with pytest.raises(UnsupportedColumnError, match="reserved"):
        encode_column("r", [{"$numpy": "<f8", "hex": "00"}])


def test_jagged_tensor_is_the_public_constructors_nested_tensor() -> None:
    from zarr_skip.format.specs import jagged_tensor

    values, offsets = torch.arange(10).bfloat16(), torch.tensor([0, 3, 3, 10])
    mine, theirs = jagged_tensor(values, offsets), torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    assert type(mine) is type(theirs) and mine.layout == theirs.layout == torch.jagged
    assert mine.dtype == theirs.dtype and mine._ragged_idx == theirs._ragged_idx == 1
    assert mine.values().data_ptr() == values.data_ptr()  # a view, as the public one gives
    assert torch.equal(mine.offsets(), theirs.offsets())
    assert [r.tolist() for r in mine.unbind()] == [r.tolist() for r in theirs.unbind()]


def test_jagged_tensor_is_made_as_torch_load_makes_a_saved_one() -> None:
    """The NestedTensor class called on values and offsets (as ``torch.load`` does), not a view
    of the values made through torch's dispatcher: same rows, no view bookkeeping."""
    import io

    from zarr_skip.format.specs import jagged_tensor

    values, offsets = torch.arange(10), torch.tensor([0, 3, 3, 10])
    buf = io.BytesIO()
    torch.save(torch.nested.nested_tensor_from_jagged(values, offsets=offsets), buf)
    buf.seek(0)
    loaded, mine = torch.load(buf, weights_only=False), jagged_tensor(values, offsets)
    assert type(mine) is type(loaded) and mine._is_view() is loaded._is_view() is False
    assert mine.offsets() is offsets and mine.values().data_ptr() == values.data_ptr()
    assert [r.tolist() for r in mine.unbind()] == [r.tolist() for r in loaded.unbind()]
