"""The ``Storage`` protocol: what a dataset reader needs from where bytes live."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Storage", "byte_view", "check_buffer"]


class Storage(Protocol):
    """Read-only access to the files of one dataset folder or prefix.

    Files are named relative to the root (``"00000.tokens"``) and opened once
    into integer handles. Implementations are thread-safe: ``open`` may race
    with reads, and any number of threads may read at once.
    """

    def size(self, name: str) -> int:
        """The size of ``name`` in bytes; ``FileNotFoundError`` if absent."""
        ...

    def open(self, name: str) -> int:
        """A handle for ``name``, opened on the first call and cached."""
        ...

    def read_into(
        self,
        handles: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        buffer: npt.NDArray[np.uint8],
        destinations: npt.NDArray[np.int64],
    ) -> int:
        """Read request ``i`` (``lengths[i]`` bytes at ``offsets[i]`` of file
        ``handles[i]``) into ``buffer[destinations[i]:]``, all requests in one
        call. Returns -1, or the index of the first request that came back short
        (the file ends early); other errors raise ``OSError``."""
        ...

    def readinto(
        self, handle: int, offset: int, buffer: bytearray | memoryview | np.ndarray
    ) -> int:
        """Read up to ``len(buffer)`` bytes at ``offset``; returns bytes read."""
        ...

    def map(self, name: str) -> npt.NDArray[np.uint8]:
        """The whole file as a read-only byte array (index files only: document
        offsets, metadata index; 8 bytes per entry)."""
        ...

    def close(self) -> None:
        """Release every handle; idempotent. Reads after ``close`` fail."""
        ...


def check_buffer(buffer: np.ndarray) -> None:
    """``ValueError`` unless ``buffer`` is what ``read_into`` writes into: a
    C-contiguous uint8 vector."""
    if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.c_contiguous:
        raise ValueError("buffer must be a C-contiguous uint8 vector")


def byte_view(buffer: bytearray | memoryview | np.ndarray) -> memoryview:
    """The bytes of ``buffer`` (what ``readinto`` fills) as a flat writable view."""
    return (buffer.data if isinstance(buffer, np.ndarray) else memoryview(buffer)).cast("B")
