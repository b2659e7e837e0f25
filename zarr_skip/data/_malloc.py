"""A DataLoader worker keeps the memory it frees for its next block (glibc's ``mallopt``).

A worker reads block after block: each a few arrays of megabytes (a medium step's token ids,
masks and log-probs of 256 rows), freed once the block's rows are handed on. glibc gives such
arrays back to the kernel as they are freed: one above its mmap threshold (which starts at
128 KiB and follows the arrays freed) is mapped on its own and unmapped, and a free top of the
heap above twice that threshold is trimmed. So the next block faults its memory in again, page
by page, each page zeroed: over an 8-step medium epoch through two workers, ~2800 page faults
every other block, 20-26k a worker, ~60 ms of the ~220 ms each worker spent reading.

:func:`keep_freed_memory` fixes the threshold at its largest (32 MiB: arrays up to that size
come from the heap) and trims only above 256 MiB, so freed arrays are reused by the next block;
a worker's memory then stays near its peak instead of going down between blocks. It is called
once in each DataLoader worker of the datasets (:func:`zarr_skip.data._iterable._settle_worker`),
never in the main process: the thresholds are the process's, and that one is the user's.
"""

from __future__ import annotations

import ctypes
import logging
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

logger = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: allocations below this come from the heap (glibc's largest threshold on 64-bit systems)
MMAP_THRESHOLD = 32 << 20
#: a free top of the heap is given back to the kernel only above this
TRIM_THRESHOLD = 256 << 20


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # not a glibc system (musl, macOS, Windows)
        return False


def keep_freed_memory() -> bool:
    """Make this process's allocator keep what it frees for reuse (see the module docstring);
    True if glibc took both settings, False where there is no glibc (nothing is changed)."""
    if not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a glibc without a symbol table
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not done:  # pragma: no cover - a glibc that refuses these values
        logger.debug("glibc refused mallopt's thresholds; a worker's freed memory goes back to the kernel")
    return done
