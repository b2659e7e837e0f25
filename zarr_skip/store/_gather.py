"""A file written in few large writes, for a writer that appends and goes back to patch.

``zipfile`` writes a member's local header, its data piece by piece, then seeks back to the
header to fill in the CRC and sizes, and asks where it is (``tell``) all along: through a plain
buffered file that is two ``lseek`` and a ``write`` per member and a flush per seek, ~700 calls
for one mini-batch's data file of the medium preset. On a network or FUSE file system every call
is a round trip. :class:`GatheredFile` keeps the appended pieces (references, not copies: a
chunk is never copied) until :data:`FLUSH_BYTES` are gathered and writes them with one
``pwritev``; a patch of bytes still gathered costs no call (the piece it falls in, a small
header, is copied and patched), a patch of bytes already written one ``pwrite``; ``tell`` and
``seek`` cost none. The bytes in the file are the same as through a plain file.
"""

from __future__ import annotations

import os

#: bytes gathered before they are written (references to chunks already encoded, no copies).
#: Holding more costs CPU on a local disk: a medium mini-batch's write took ~5 ms more with
#: 4 MiB (the chunks' memory is freed later, so new chunks fault in fresh pages), none with 512 KiB
FLUSH_BYTES = 512 << 10
#: pieces written by one ``pwritev`` at most (Linux's ``IOV_MAX``)
_IOV_MAX = 1024


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


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
        self._pieces: list[bytes | bytearray] = []  # what follows the bytes in the file
        self._gathered = 0  # their bytes
        self._written = 0  # bytes in the file
        self._pos = 0
        self.closed = False

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._written + self._gathered}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if type(data) is bytes and self._pos == self._written + self._gathered:  # the common case
            if data:
                self._pieces.append(data)
                self._gathered += len(data)
                self._pos += len(data)
                if self._gathered >= self._flush_bytes or len(self._pieces) >= _IOV_MAX:
                    self.flush()
            return len(data)
        if type(data) is not bytes:  # an own copy of what the caller may change (not our chunks)
            data = bytes(memoryview(data).cast("B"))
        n = len(data)
        if not n:
            return 0
        end = self._written + self._gathered
        if self._pos > end:  # past the end: the gap reads as zeros, as in a file
            gap, self._pos = self._pos - end, end
            self._append(bytes(gap))
            end = self._pos
        if self._pos < end:  # a patch (zipfile's local header, once a member is written)
            k = min(n, end - self._pos)
            self._patch(data[:k])
            data = data[k:]
        if data:
            self._append(data)
        return n

    def _append(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._gathered += len(piece)
        self._pos += len(piece)
        if self._gathered >= self._flush_bytes or len(self._pieces) >= _IOV_MAX:
            self.flush()

    def _patch(self, data: bytes) -> None:
        """Overwrite ``data`` at the position, which lies before the end."""
        if self._pos < self._written:  # bytes already in the file
            k = min(len(data), self._written - self._pos)
            _pwrite_all(self._fd, data[:k], self._pos)
            data, self._pos = data[k:], self._pos + k
        stop = self._pos + len(data)
        at = self._written + self._gathered
        for i in range(len(self._pieces) - 1, -1, -1):  # from the end: a patch is of recent bytes
            piece = self._pieces[i]
            at -= len(piece)
            lo, hi = max(self._pos, at), min(stop, at + len(piece))
            if lo < hi:
                patched = piece if isinstance(piece, bytearray) else bytearray(piece)
                patched[lo - at : hi - at] = data[lo - self._pos : hi - self._pos]
                self._pieces[i] = patched
            if at <= self._pos:
                break
        self._pos = stop

    def flush(self) -> None:
        """Write what is gathered."""
        pieces, offset, i = self._pieces, self._written, 0
        while i < len(pieces):
            n = os.pwritev(self._fd, pieces[i : i + _IOV_MAX], offset)
            offset += n
            while i < len(pieces) and n >= len(pieces[i]):
                n -= len(pieces[i])
                i += 1
            if n:  # a short write inside a piece
                pieces[i] = pieces[i][n:]
        self._pieces = []
        self._written += self._gathered
        self._gathered = 0

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
