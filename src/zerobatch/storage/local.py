"""``LocalStorage``: files on a local or network file system.

Each file is opened once (``os.open``) and advised ``POSIX_FADV_RANDOM`` so the
kernel does not read ahead of shuffled reads. A batch of reads runs in one
GIL-free Numba loop straight into the caller's buffer, in one of two ways:

- ``method="pread"`` (default): one ``pread(2)`` per request. Right for network
  file systems (one request per read, no page-sized faults), and a file that
  shrinks under a running job only makes reads come back short.
- ``method="mmap"``: ``memcpy`` from a read-only mapping (``MADV_RANDOM``), no
  system call per read once pages are mapped. Faster from the local page cache,
  but, like any mapping (``np.memmap`` included), a file truncated by another
  process *while open* makes reads past its new end fault (SIGBUS). zerobatch
  datasets are written once and replaced by rename, never truncated in place.

Measured (``benchmarks/stream_read.py`` windows, 32 reads of 4 KiB from the
page cache): ~42 us per batch with ``pread``, ~16 us with ``mmap``.

A file is checked against the size it had when opened: a read past that size
comes back short.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from numba import njit, types

__all__ = ["LocalStorage"]

_memcpy: Any = types.ExternalFunction(
    "memcpy", types.voidptr(types.voidptr, types.voidptr, types.uintp)
)
_pread: Any = types.ExternalFunction(
    "pread", types.intp(types.intc, types.voidptr, types.uintp, types.int64)
)


@njit(nogil=True, cache=True)
def _read_all(
    handles: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
    buffer: np.ndarray, destinations: np.ndarray,
    descriptors: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool,
) -> tuple[int, int]:
    """Run every request, by ``pread(2)`` or by ``memcpy`` from the mappings.

    Returns (-1, 0), or (request, status): status 0 means the file ended early
    (or shrank, with pread), -1 that the handle is not open, -2 that the request
    does not fit the buffer, -3 that ``pread`` failed."""
    base = buffer.ctypes.data
    for i in range(handles.shape[0]):
        h, start, length = handles[i], offsets[i], lengths[i]
        if length < 0 or destinations[i] < 0 or destinations[i] + length > buffer.size:
            return i, -2
        if h < 0 or h >= sizes.shape[0] or sizes[h] < 0:
            return i, -1
        if start < 0 or start + length > sizes[h]:
            return i, 0
        if not use_pread:
            if length > 0:
                _memcpy(base + destinations[i], addresses[h] + start, length)
            continue
        done = 0
        while done < length:
            got = _pread(np.intc(descriptors[h]), base + destinations[i] + done,
                         length - done, start + done)
            if got == 0:
                return i, 0
            if got < 0:
                return i, -3
            done += got
    return -1, 0


class _Files:
    """The open files of one LocalStorage: handle -> descriptor, mapping, size.

    Slots are only ever added (a size of -1 marks a free slot), and a full
    table is replaced by a copy twice its size, so opening is amortized O(1);
    a read holds the table it started with, whose mappings stay alive until
    it returns even if ``close()`` runs meanwhile.
    """

    __slots__ = ("addresses", "descriptors", "fds", "maps", "sizes")

    def __init__(self, capacity: int = 16) -> None:
        self.descriptors: list[int] = []
        self.maps: list[np.ndarray | None] = []
        self.fds = np.full(capacity, -1, dtype=np.int64)
        self.addresses = np.zeros(capacity, dtype=np.int64)
        self.sizes = np.full(capacity, -1, dtype=np.int64)

    def add(self, descriptor: int, size: int, mapping: np.ndarray | None) -> _Files:
        """This table, or a larger copy, with one more file (call under a lock)."""
        files, handle = self, len(self.descriptors)
        if handle == self.sizes.shape[0]:
            files = _Files(2 * handle)
            files.descriptors, files.maps = list(self.descriptors), list(self.maps)
            files.fds[:handle] = self.fds
            files.addresses[:handle] = self.addresses
            files.sizes[:handle] = self.sizes
        files.descriptors.append(descriptor)
        files.maps.append(mapping)
        files.fds[handle] = descriptor
        files.addresses[handle] = 0 if mapping is None else mapping.ctypes.data
        files.sizes[handle] = size  # last: the slot is valid from here on
        return files


def _map(descriptor: int) -> np.ndarray:
    """The whole file read-only, as uint8 (an empty array for an empty file)."""
    if os.fstat(descriptor).st_size == 0:
        empty = np.zeros(0, dtype=np.uint8)
        empty.setflags(write=False)  # like a mapping: one array type for Numba
        return empty
    mapping = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
    if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapping.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapping, dtype=np.uint8)


class LocalStorage:
    """Read-only access to the files under ``root``, by ``pread`` or ``mmap``
    (``method``; see the module docstring for the trade-off).

    Handles are small ints, one per opened file. Thread-safe: files are opened
    under a lock; reads share nothing mutable. ``close()`` is idempotent;
    reads after it raise ``OSError`` (a read already running finishes first).
    """

    def __init__(
        self, root: str | os.PathLike[str], *, method: Literal["pread", "mmap"] = "pread"
    ) -> None:
        if method not in ("pread", "mmap"):
            raise ValueError(f"method must be 'pread' or 'mmap', got {method!r}")
        self._root = Path(root)
        self._method = method
        self._handles: dict[str, int] = {}
        self._files = _Files()
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        """The folder the names are relative to."""
        return self._root

    def __repr__(self) -> str:
        return f"LocalStorage({str(self._root)!r}, method={self._method!r})"

    def size(self, name: str) -> int:
        """The size of ``name`` in bytes."""
        return os.stat(self._root / name).st_size

    def open(self, name: str) -> int:
        """The handle of ``name``: opened (and mapped) once, ``POSIX_FADV_RANDOM``."""
        handle = self._handles.get(name)
        if handle is not None:
            return handle
        with self._lock:
            handle = self._handles.get(name)
            if handle is None:
                descriptor = os.open(self._root / name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)
                    size = os.fstat(descriptor).st_size
                    mapping = _map(descriptor) if self._method == "mmap" else None
                except BaseException:
                    os.close(descriptor)
                    raise
                handle = len(self._files.descriptors)
                self._files = self._files.add(descriptor, size, mapping)
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
        files = self._files  # holds the mappings alive until the copies are done
        short, status = _read_all(handles, offsets, lengths, buffer, destinations,
                                  files.fds, files.addresses, files.sizes,
                                  self._method == "pread")
        if status == -3:
            raise OSError(f"request {short}: pread failed on handle {int(handles[short])}")
        if status == -2:
            raise ValueError(f"request {short} does not fit the buffer")
        if status < 0:
            raise OSError(f"request {short}: handle {int(handles[short])} is not open")
        return int(short)

    def readinto(
        self, handle: int, offset: int, buffer: bytearray | memoryview | np.ndarray
    ) -> int:
        """``os.preadv`` of up to ``len(buffer)`` bytes at ``offset``."""
        descriptors = self._files.descriptors
        if not 0 <= handle < len(descriptors):
            raise OSError(f"handle {handle} is not open")
        view = (buffer.data if isinstance(buffer, np.ndarray) else memoryview(buffer)).cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(descriptors[handle], [view[done:]], offset + done)
            if got == 0:
                break
            done += got
        return done

    def map(self, name: str) -> npt.NDArray[np.uint8]:
        """``name`` mapped read-only (an empty array for an empty file)."""
        with open(self._root / name, "rb") as file:
            return _map(file.fileno())

    def close(self) -> None:
        """Close every handle; idempotent. Mappings are released once no read uses them."""
        with self._lock:
            files, self._files, self._handles = self._files, _Files(), {}
        for descriptor in files.descriptors:
            os.close(descriptor)
