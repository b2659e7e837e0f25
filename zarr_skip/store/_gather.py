"""A file written in few large writes, for a writer that appends and goes back to patch.

``zipfile`` writes a member's local header, its data piece by piece, then seeks back to the
header to fill in the CRC and sizes, and asks where it is (``tell``) all along: through a plain
buffered file that is two ``lseek`` and a ``write`` per member and a flush per seek, ~700 calls
for one mini-batch's data file of the medium preset. On a network or FUSE file system every call
is a round trip. :class:`GatheredFile` keeps the appended bytes in memory up to
:data:`FLUSH_BYTES` and writes them with one ``pwrite``; a patch of bytes still in memory costs
no call, a patch of bytes already written one ``pwrite``; ``tell`` and ``seek`` cost none. The
bytes in the file are the same as through a plain file.
"""

from __future__ import annotations

import os

#: bytes gathered in memory before they are written (the memory a data file's write holds
#: beyond the chunks being encoded); a larger piece is written at once, without a copy
FLUSH_BYTES = 4 << 20


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


class GatheredFile:
    """A write-only, seekable file over the open descriptor ``fd`` (closed by :meth:`close`).

    Parameters
    ----------
    fd : a descriptor open for writing, at offset 0 of an empty file.
    flush_bytes : bytes gathered before they are written.
    """

    def __init__(self, fd: int, flush_bytes: int = FLUSH_BYTES) -> None:
        self._fd = fd
        self._flush_bytes = flush_bytes
        self._buf = bytearray()
        self._written = 0  # bytes in the file; the buffer follows them
        self._pos = 0
        self.closed = False

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._written + len(self._buf)}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def write(self, data: bytes | bytearray | memoryview) -> int:
        buf = self._buf
        if type(data) is bytes and self._pos == self._written + len(buf) and len(buf) + len(data) < self._flush_bytes:
            buf += data  # the common case (an append that stays in memory), without a view
            self._pos += len(data)
            return len(data)
        view = memoryview(data).cast("B")
        n = len(view)
        if not n:
            return 0
        end = self._written + len(self._buf)
        if self._pos > end:  # past the end: the gap reads as zeros, as in a file
            self._buf += bytes(self._pos - end)
            end = self._pos
        if self._pos < self._written:  # a patch of bytes already in the file
            k = min(n, self._written - self._pos)
            _pwrite_all(self._fd, view[:k], self._pos)
            view, self._pos = view[k:], self._pos + k
        if view:
            at = self._pos - self._written
            inside = min(len(view), len(self._buf) - at)
            self._buf[at : at + inside] = view[:inside]  # a patch of bytes still gathered
            rest = view[inside:]
            if len(rest) >= self._flush_bytes:  # a large piece: written as it is
                self.flush()
                _pwrite_all(self._fd, rest, self._written)
                self._written += len(rest)
            else:
                self._buf += rest
            self._pos += len(view)
            if len(self._buf) >= self._flush_bytes:
                self.flush()
        return n

    def flush(self) -> None:
        """Write what is gathered."""
        if self._buf:
            _pwrite_all(self._fd, memoryview(self._buf), self._written)
            self._written += len(self._buf)
            self._buf = bytearray()

    def close(self) -> None:
        """Write what is gathered and close the descriptor (also when the write fails)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            os.close(self._fd)

    def __enter__(self) -> GatheredFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
