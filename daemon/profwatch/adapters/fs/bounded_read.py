"""Reading lines from a file or pipe in bounded memory (I/O).

``for line in open(path)`` holds a whole line in memory, whatever its length: a line without end (a symlink to
``/dev/zero``, a runaway log, a pipe that never writes a newline) grows until the machine runs out of memory.
:func:`iter_lines` reads fixed-size chunks and never holds more than ``max_line_bytes`` of one line: a longer line
is yielded as an :class:`OverlongLine` (its length; the bytes are skipped), and a line still without end after
``max_skip_bytes`` ends the reading with :class:`EndlessInput` (the input is unusable: nothing after it could be
read anyway). :func:`read_capped` reads a whole small file (a key, a token, a JSON document, a config) in bounded
memory, refusing anything that is not a regular file. A pipe or device read once has no size to check up front: :class:`CappedReader` stops it after
``max_bytes`` with :class:`StreamTooLarge` (``/dev/urandom``, ``yes | ...``: an input that never ends).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

CHUNK_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class OverlongLine:
    """A line longer than the cap, skipped: ``length`` bytes (without the newline)."""

    length: int


class EndlessInput(Exception):
    """A line ran past ``max_skip_bytes`` without a newline: reading stopped (the input has no usable end)."""


class StreamTooLarge(Exception):
    """More than ``max_bytes`` were read from a :class:`CappedReader` (the input may never end)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"more than {max_bytes} bytes ({max_bytes / (1 << 20):.0f} MiB) read")
        self.max_bytes = max_bytes


class CappedReader:
    """A binary stream that raises :class:`StreamTooLarge` once more than ``max_bytes`` (> 0) were read from it."""

    def __init__(self, f: BinaryIO, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.f, self.max_bytes, self.read_bytes = f, max_bytes, 0

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (``f.read``). Raises :class:`StreamTooLarge` past the cap, ``OSError`` as ``f``."""
        chunk = self.f.read(n if n >= 0 else self.max_bytes + 1 - self.read_bytes)
        self.read_bytes += len(chunk)
        if self.read_bytes > self.max_bytes:
            raise StreamTooLarge(self.max_bytes)
        return chunk


def iter_lines(f: BinaryIO | CappedReader, max_line_bytes: int, max_skip_bytes: int | None = None,
               encoding: str = "utf-8") -> Iterator[str | OverlongLine]:
    """Lines of a binary stream, decoded (``errors="replace"``), without their newline; a line over
    ``max_line_bytes`` is an :class:`OverlongLine`.

    Args:
        f: an open binary file or pipe.
        max_line_bytes: longest line held (bytes, > 0).
        max_skip_bytes: an overlong line longer than this stops the reading (default 64 x ``max_line_bytes``).
    Raises:
        EndlessInput: a line longer than ``max_skip_bytes``.
        OSError: the read fails.
    """
    cap_skip = max_skip_bytes if max_skip_bytes is not None else 64 * max_line_bytes
    buf = bytearray()
    skipping = 0  # > 0: inside an overlong line, this many bytes of it seen
    while True:
        chunk = f.read(CHUNK_BYTES)
        if not chunk:
            break
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            piece = chunk[start:end]
            if skipping:
                skipping += len(piece)
            elif len(buf) + len(piece) > max_line_bytes:
                skipping = len(buf) + len(piece)
                buf.clear()
            else:
                buf += piece
            if skipping > cap_skip:
                raise EndlessInput(f"a line ran past {cap_skip} bytes without a newline")
            if nl < 0:
                break
            if skipping:
                yield OverlongLine(skipping)
                skipping = 0
            else:
                yield buf.decode(encoding, errors="replace")
                buf.clear()
            start = nl + 1
    if skipping:
        yield OverlongLine(skipping)
    elif buf:
        yield buf.decode(encoding, errors="replace")


class InputTooLarge(ValueError):
    """A file holds more bytes than its reader's cap (or is not a regular file): nothing of it was used."""


def read_capped(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, read with at most ``max_bytes + 1`` bytes in memory.

    The file is opened with ``O_NONBLOCK`` (a FIFO never blocks the open) and must be a regular file after the
    open (``fstat``: a device such as ``/dev/zero``, a FIFO or a directory is refused, whatever its name or a
    symlink to it says). ``st_size`` is checked first and the read is capped too (a file that grows meanwhile).

    Args:
        path: the file.
        max_bytes: largest accepted size, bytes (> 0).
        what: how the error names the file (``"key file"``, ``"config file"``).
    Raises:
        InputTooLarge: not a regular file, or over ``max_bytes``; the message names ``what``, the path and the cap.
        OSError: it cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputTooLarge(f"{what} {os.fspath(path)} is not a regular file (a device, FIFO or directory): "
                                "not read")
        if st.st_size > max_bytes:
            raise InputTooLarge(f"{what} {os.fspath(path)} is {st.st_size} bytes, over the {max_bytes}-byte cap: "
                                "not read")
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, min(CHUNK_BYTES, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise InputTooLarge(f"{what} {os.fspath(path)} grew over the {max_bytes}-byte cap while read: not read")
        return b"".join(chunks)
    finally:
        os.close(fd)
