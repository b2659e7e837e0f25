"""A hostile record cannot size an allocation: every count that sizes one is checked against
what the data can hold before anything is allocated (issue 26, point 2).

The forged record here is the one the issue found: a dictionary-encoded column whose 9 KB
lengths chunk (valid, right crc32c, its record re-checksummed) claims 3x10^8 entries for 16
rows. Read in a subprocess whose address space is capped at 1 GiB above its size after the
imports, it is a MetadataError naming the column and the counts, with a peak RSS far below
what the claim asks for (before the check: 4.7 GB and 13 s for two rows).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip.format import chunks, layout, records

ENTRIES = 3 * 10**8
ROWS = 16


def _write(root: Path) -> Path:
    """A one-step cache whose ``uid`` column is dictionary-encoded; its mini-batch record."""
    cache = zs.open_cache(root, {"model": "m"})
    cache.write(1, {"uid": [f"u{i // 4}" for i in range(ROWS)], "x": np.arange(ROWS)})
    (record,) = root.rglob("1/*/0/zarr.json")
    return record


def forge_entries(root: Path, entries: int = ENTRIES) -> int:
    """The dictionary lengths of ``uid`` replaced by a valid chunk of ``entries`` lengths (the
    first four right, the rest 0, so they still add to the stored values) and the record
    updated to match (shape, chunk, size, crc32c, nbytes, checksum); the chunk's size."""
    path = _write(root)
    doc = json.loads(path.read_text())
    rec = doc["attributes"][layout.PART_ATTR]
    arr = rec["columns"]["uid"]["arrays"]["lengths"]
    assert "codes" in rec["columns"]["uid"]["arrays"] and arr["shape"] == [4]
    data = np.zeros(entries, dtype=np.dtype(arr["dtype"]))
    data[:4] = 2
    blob = chunks.encode(data, chunks.Compression(**arr["codec"]))
    del data
    file = path.parent / rec["data"]  # the mini-batch's data file: the forged chunk after its end
    offset = file.stat().st_size
    with open(file, "ab") as f:
        f.write(blob)
    rec["nbytes"] += len(blob) - arr["sizes"][0]
    rec["data_nbytes"] = offset + len(blob)
    arr.update(shape=[entries], chunk=entries, raw=entries * np.dtype(arr["dtype"]).itemsize)
    arr.update(sizes=[len(blob)], crc32c=[chunks.trailer(blob)], offset=offset)
    rec["checksum"] = layout.doc_checksum(rec)
    path.write_text(json.dumps(doc))
    return len(blob)


_READ = r"""
import json, resource, sys
import zarr_skip as zs
import numpy, torch  # imported before the cap and the peak are taken
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = {}
view = zs.open_cache(sys.argv[1]).load(1)
for name, read in (("two rows", lambda: view["uid"][[0, 5]]), ("whole", lambda: view["uid"][:]),
                   ("lengths", lambda: view["uid"].lengths()), ("to_dict", view.to_dict)):
    try:
        read()
        out[name] = "read"
    except zs.MetadataError as exc:
        out[name] = str(exc)
    except MemoryError:
        out[name] = "MemoryError"
out["x"] = view["x"][:].tolist()
out["peak_delta"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print(json.dumps(out))
"""


def test_a_9kb_lengths_chunk_claiming_3e8_entries_is_refused_within_bounds(tmp_path: Path) -> None:
    size = forge_entries(tmp_path)
    assert size < 10_000  # the whole attack: 9 KB on disk
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for name in ("two rows", "whole", "lengths", "to_dict"):
        assert f"{ENTRIES} dictionary entries recorded for {ROWS} rows" in out[name], (name, out[name])
        assert "column" in out[name] or "uid/lengths" in out[name], out[name]
    assert out["x"] == list(range(ROWS))  # the other columns still read
    assert out["peak_delta"] < 64 << 20, out["peak_delta"]


def test_verify_flags_the_forged_entries(tmp_path: Path) -> None:
    forge_entries(tmp_path, 10**6)
    problems = zs.open_cache(tmp_path).verify().problems
    assert problems
    assert any("dictionary entries recorded for 16 rows" in p.error for p in problems)


def _column(entries: int, rows: int = 8) -> dict[str, Any]:
    def array(n: int) -> dict[str, Any]:
        return {"dtype": "|u1", "shape": [n], "chunk": max(n, 1), "sizes": [20] if n else []}

    arrays = {"codes": array(rows), "values": array(4), "lengths": array(entries)}
    return {"columns": {"c": {"arrays": arrays}}, "rows": rows}


@pytest.mark.parametrize(("entries", "ok"), [(0, True), (1, True), (8, True), (9, False), (10**6, False)])
def test_dictionary_entries_are_bounded_by_the_rows(entries: int, ok: bool) -> None:
    doc = _column(entries)
    if ok:
        records.check_column(doc, "c", "here")
    else:
        with pytest.raises(zs.MetadataError, match=rf"here, c/lengths: {entries} dictionary entries recorded for 8"):
            records.check_column(doc, "c", "here")


def test_a_dictionary_without_values_is_refused() -> None:
    doc = _column(2)
    del doc["columns"]["c"]["arrays"]["values"]
    with pytest.raises(zs.MetadataError, match="lengths but no values"):
        records.check_column(doc, "c", "here")
