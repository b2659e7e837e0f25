"""The plain-dump baseline: the one definition ``bench.py``, ``write_floor.py`` and the peer
comparison share.

What it is
----------
:func:`plain_dump` writes the step's flat mapping (``zarr_skip.synthetic.as_mapping`` of the
realistic jagged payload, built untimed: the tensors, NestedTensors and lists zarr_skip
stores) with ``torch.save`` into one file, :data:`DUMP_FILE`, in the given directory. The file
is closed and **not fsynced**: the bytes are in the page cache, as after zarr_skip's
``cache.write`` (which does not fsync either); what durability costs is measured separately,
for every format alike, by ``bench.py``'s ``write_fsync`` (fsync of every file and directory
written).

How it is timed (:func:`timed_dump`, the same in every script): ``os.sync()`` first, untimed,
so that the writeback of earlier writes does not land in the measurement, then the
``torch.save`` alone. ``bench.py`` runs each sample in a fresh process (so the time includes
the first touch of that process's memory); ``write_floor.py`` times it in its one process next
to the write it is compared with. Ratios are only ever taken between figures measured the same
way in the same run.

:func:`plain_load` reads it back (``torch.load``, ``weights_only=False``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DUMP_FILE = "dump.pt"
#: one sentence for reports
DEFINITION = (
    "plain dump = `torch.save` of the step's flat mapping (tensors, NestedTensors, lists) to one file "
    f"`{DUMP_FILE}`, not fsynced, after an untimed `os.sync()` (`benchmarks/baseline.py`)"
)


def plain_dump(mapping: Mapping[str, Any], directory: Path) -> Path:
    """``torch.save(mapping, directory / DUMP_FILE)``; no fsync. Returns the file's path."""
    import torch

    path = Path(directory) / DUMP_FILE
    torch.save(mapping, path)
    return path


def plain_load(directory: Path) -> dict[str, Any]:
    """The mapping :func:`plain_dump` wrote into ``directory``."""
    import torch

    out: dict[str, Any] = torch.load(Path(directory) / DUMP_FILE, weights_only=False)
    return out


def timed_dump(mapping: Mapping[str, Any], directory: Path) -> float:
    """Seconds :func:`plain_dump` takes, after an untimed ``os.sync()``."""
    os.sync()
    t0 = time.perf_counter()
    plain_dump(mapping, directory)
    return time.perf_counter() - t0
