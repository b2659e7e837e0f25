"""Legacy import reads within bounds: a small hostile file that calls only allowed globals
cannot make the reader allocate more than a fixed multiple of its size; it is refused with
UnsafePickleError naming the file and the request. The files are built here, and read in a
subprocess whose address space is capped, so a request that got through would fail the test
with a MemoryError instead of taking the machine's memory; its peak RSS is measured too."""

from __future__ import annotations

import collections
import io
import json
import pickle
import resource
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from zarr_skip.legacy import _bounds
from zarr_skip.legacy.dumps import read_minibatch

#: bytes a hostile file may add to the reader's peak RSS in the memory check
RSS_SLACK = 96 << 20


def _long(n: int) -> bytes:
    """The pickle opcode pushing the int ``n`` (LONG1)."""
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


TUPLE1, TUPLE2, REDUCE, STOP = b"\x85", b"\x86", b"R", b"."


class _StrideZero:
    """Pickles as a torch tensor of 10**5 x 10**5 float32 over a one-element storage."""

    def __reduce__(self) -> tuple[Any, ...]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TypedStorage is deprecated
            storage = torch.zeros(1).storage()
        return torch._utils._rebuild_tensor_v2, (storage, 0, (10**5, 10**5), (0, 0), False, collections.OrderedDict())


def _deflated(payload: Any) -> bytes:
    """``torch.save(payload)`` with its zip members deflated (torch itself stores them)."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def _saved(payload: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def hostile_files(root: Path) -> dict[str, Path]:
    """name -> a small file that asks for gigabytes."""
    files = {
        "bytearray.dp": b"\x80\x02" + _global("builtins", "bytearray") + _long(8 * 10**9) + TUPLE1 + REDUCE + STOP,
        "list_range.dp": b"\x80\x02"
        + _global("builtins", "list")
        + _global("builtins", "range")
        + _long(10**9)
        + TUPLE1
        + REDUCE
        + TUPLE1
        + REDUCE
        + STOP,
        "ndarray.dp": b"\x80\x02"
        + _global("numpy", "ndarray")
        + _long(10**5)
        + _long(10**5)
        + TUPLE2
        + TUPLE1
        + REDUCE
        + STOP,
        "stride_zero.dp": pickle.dumps(_StrideZero(), protocol=4),
        "deflated.pt": _deflated({"tensordict": torch.zeros(16 << 20), "tags": [], "keys": []}),
        "stride_zero.pt": _saved({"tensordict": torch.zeros(1).expand(10**5, 10**5), "tags": [], "keys": []}),
        "bytearray.pt": _saved({"tensordict": {}, "tags": [bytearray(4)], "keys": []}),
    }
    out = {}
    for name, blob in files.items():
        (root / name).write_bytes(blob)
        out[name] = root / name
    return out


@pytest.fixture
def capped_memory() -> Iterator[None]:
    """This process's address space capped at 3 GiB above its current size: a request that
    got through fails with MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = int(next(line for line in f if line.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return hostile_files(tmp_path_factory.mktemp("hostile"))


def test_hostile_files_are_small(hostile: dict[str, Path]) -> None:
    sizes = {name: path.stat().st_size for name, path in hostile.items()}
    assert max(s for n, s in sizes.items() if n != "deflated.pt") < 2000, sizes
    assert sizes["deflated.pt"] < 200_000  # 64 MiB of zeros, deflated


@pytest.mark.parametrize(
    ("name", "asked"),
    [
        ("bytearray.dp", "builtins.bytearray"),
        ("list_range.dp", "builtins.list"),
        ("ndarray.dp", "numpy.ndarray"),
        ("stride_zero.dp", "torch._utils._rebuild_tensor_v2"),
        ("deflated.pt", "compressed"),
        ("stride_zero.pt", "tensor of shape (100000, 100000)"),
        ("bytearray.pt", "builtins.bytearray"),
    ],
)
def test_a_hostile_file_is_refused_naming_file_and_request(
    hostile: dict[str, Path], capped_memory: None, name: str, asked: str
) -> None:
    path = hostile[name]
    with pytest.raises(zs_errors().UnsafePickleError) as exc:
        read_minibatch(path)
    assert str(path) in str(exc.value) and asked in str(exc.value)
    assert exc.value.path == str(path)


def zs_errors() -> Any:
    import zarr_skip

    return zarr_skip


def test_the_budget_is_a_multiple_of_the_size_plus_a_constant() -> None:
    budget = _bounds.Budget("f", 1000)
    assert budget.limit == _bounds.FACTOR * 1000 + _bounds.CONSTANT
    budget.take(budget.limit, "all of it")
    with pytest.raises(zs_errors().UnsafePickleError, match="one more byte"):
        budget.take(1, "one more byte")


_CHECK = r"""
import json, resource, sys
from zarr_skip.errors import UnsafePickleError
from zarr_skip.legacy.dumps import read_minibatch
import torch, numpy, tensordict  # imported before the peak is taken
read_minibatch(sys.argv[1])  # warm: a small legitimate file
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), resource.RLIM_INFINITY))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = {}
for path in sys.argv[2:]:
    try:
        read_minibatch(path)
        out[path] = "read"
    except UnsafePickleError:
        out[path] = "refused"
    except MemoryError:
        out[path] = "MemoryError"
out["peak_delta"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print(json.dumps(out))
"""


@pytest.mark.slow  # a real process, its peak RSS measured
def test_hostile_files_stay_under_their_memory_bound(hostile: dict[str, Path], tmp_path: Path) -> None:
    from test_legacy import dump_tq, tq_payload

    files = hostile
    good = dump_tq(tmp_path / "good", 1, tq_payload(rows=2), minibatch=None) / "tq_batch.pt"
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, str(good), *map(str, files.values())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert {Path(p).name: r for p, r in got.items() if p != "peak_delta"} == dict.fromkeys(files, "refused")
    assert got["peak_delta"] < RSS_SLACK, f"peak RSS grew by {got['peak_delta'] / 2**20:.0f} MiB"
    print(f"peak RSS while refusing {len(files)} hostile files: +{got['peak_delta'] / 2**20:.1f} MiB")
