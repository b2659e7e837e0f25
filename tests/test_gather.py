"""The data file's writer: few large writes, the same bytes as through a plain file."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarr_skip.store import _gather, packed
from zarr_skip.store._gather import GatheredFile
from zarr_skip.store.packed import Member

#: (seek position or None: append, bytes to write)
_OPS = st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 300)), st.binary(max_size=120)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS, flush_bytes=st.integers(1, 200))
def test_writes_seeks_and_patches_give_the_bytes_of_a_plain_file(
    tmp_path_factory: Any, ops: Any, flush_bytes: int
) -> None:
    path = tmp_path_factory.mktemp("g") / "f"
    plain = io.BytesIO()
    with GatheredFile(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), flush_bytes) as f:
        for at, data in ops:
            for out in (f, plain):
                out.seek(0, os.SEEK_END) if at is None else out.seek(at)
                out.write(data)
            assert f.tell() == plain.tell()
    assert path.read_bytes() == plain.getvalue()


def _members(n: int) -> list[Member]:
    return [Member(f"a{i}/c.0", (lambda i=i: [bytes([i]) * 5000, bytes([i + 1]) * 3000])) for i in range(n)]


def test_a_zip_of_many_members_is_written_in_a_few_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    pwrite, pwritev = os.pwrite, os.pwritev
    monkeypatch.setattr(_gather.os, "pwrite", lambda fd, data, at: calls.append(len(data)) or pwrite(fd, data, at))
    monkeypatch.setattr(_gather.os, "pwritev", lambda fd, bufs, at: calls.append(len(bufs)) or pwritev(fd, bufs, at))
    path = tmp_path / "d.zip"
    with GatheredFile(os.open(path, os.O_WRONLY | os.O_CREAT), flush_bytes=64 << 10) as f:
        spans = packed.write_zip(f, _members(40))  # type: ignore[arg-type]
    blob, expected = packed.zip_bytes(_members(40))
    assert path.read_bytes() == blob and spans == expected
    # 40 members of 8 kB: 5 flushes of 64 kB, the rest, and the header patch of each member a
    # flush cut (its header already written); a plain buffered file made ~200 calls
    assert len(calls) <= 11, calls
    assert packed.members_of(blob) == expected
