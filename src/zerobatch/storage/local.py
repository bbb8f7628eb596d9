"""``LocalStorage``: files on a local or network file system, read with ``pread``.

Each file is opened once (``os.open``) and advised ``POSIX_FADV_RANDOM`` so the
kernel does not read ahead of shuffled reads. A batch of reads runs in one
GIL-free Numba loop over ``pread(2)``, straight into the caller's buffer: no
intermediate bytes objects, no per-read Python call.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit, types

__all__ = ["LocalStorage"]

_pread: Any = types.ExternalFunction(
    "pread", types.intp(types.intc, types.voidptr, types.uintp, types.int64)
)


@njit(nogil=True, cache=True)
def _read_all(
    handles: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
    buffer: np.ndarray, destinations: np.ndarray,
) -> tuple[int, int]:
    """Run every request; returns (-1, 0), or (request, status): status 0 means
    the file ended early, -1 that pread failed, -2 that the request does not
    fit the buffer."""
    base = buffer.ctypes.data
    for i in range(handles.shape[0]):
        if lengths[i] < 0 or destinations[i] < 0 or destinations[i] + lengths[i] > buffer.size:
            return i, -2
        done = 0
        while done < lengths[i]:
            got = _pread(
                np.intc(handles[i]), base + destinations[i] + done,
                lengths[i] - done, offsets[i] + done,
            )
            if got <= 0:
                return i, got
            done += got
    return -1, 0


class LocalStorage:
    """Read-only access to the files under ``root``.

    Thread-safe: handles are opened under a lock; reads share nothing mutable.
    ``close()`` is idempotent; reads after it raise ``OSError``.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root)
        self._handles: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        """The folder the names are relative to."""
        return self._root

    def __repr__(self) -> str:
        return f"LocalStorage({str(self._root)!r})"

    def size(self, name: str) -> int:
        """The size of ``name`` in bytes."""
        return os.stat(self._root / name).st_size

    def open(self, name: str) -> int:
        """The file descriptor of ``name``, opened once with ``POSIX_FADV_RANDOM``."""
        handle = self._handles.get(name)
        if handle is not None:
            return handle
        with self._lock:
            handle = self._handles.get(name)
            if handle is None:
                handle = os.open(self._root / name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_RANDOM)
                self._handles[name] = handle
            return handle

    def read_into(
        self,
        handles: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        buffer: npt.NDArray[np.uint8],
        destinations: npt.NDArray[np.int64],
    ) -> int:
        """Run all requests in one GIL-free loop; -1, or the first short request."""
        if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.c_contiguous:
            raise ValueError("buffer must be a C-contiguous uint8 vector")
        short, status = _read_all(handles, offsets, lengths, buffer, destinations)
        if status == -2:
            raise ValueError(f"request {short} does not fit the buffer")
        if status < 0:
            raise OSError(f"pread failed for request {short} (handle {int(handles[short])})")
        return int(short)

    def readinto(
        self, handle: int, offset: int, buffer: bytearray | memoryview | np.ndarray
    ) -> int:
        """``os.preadv`` of up to ``len(buffer)`` bytes at ``offset``."""
        view = (buffer.data if isinstance(buffer, np.ndarray) else memoryview(buffer)).cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(handle, [view[done:]], offset + done)
            if got == 0:
                break
            done += got
        return done

    def map(self, name: str) -> npt.NDArray[np.uint8]:
        """``name`` mapped read-only (an empty array for an empty file)."""
        with open(self._root / name, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                return np.zeros(0, dtype=np.uint8)
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(mapping, dtype=np.uint8)

    def close(self) -> None:
        """Close every handle; idempotent."""
        with self._lock:
            handles, self._handles = self._handles, {}
        for handle in handles.values():
            os.close(handle)
