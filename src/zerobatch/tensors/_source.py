"""Where ``safe_open`` gets its bytes: a path or a binary file object, read
through one memory map or by ``pread`` per tensor.

A source answers ``read(begin, end)`` (bytes, for the header) and
``span(begin, end)`` (a buffer and the offset of ``begin`` in it, for a
tensor). Other readers (object stores) only need the same three methods.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Mapping
from typing import Any, Protocol

from zerobatch.errors import FormatError
from zerobatch.storage.url import is_url
from zerobatch.tensors.format import SafetensorError

__all__ = ["BACKENDS", "Source", "open_source"]

BACKENDS = ("mmap", "pread")
"""How tensor bytes are read: one memory map (zero-copy) or ``pread(2)`` per tensor (a copy)."""


class Source(Protocol):
    """A tensor file's bytes. ``label`` names it in errors; ``size`` is in bytes."""

    label: str
    size: int

    def read(self, begin: int, end: int) -> bytes:
        """Bytes ``[begin, end)`` of the file."""

    def span(self, begin: int, end: int) -> tuple[Any, int]:
        """A buffer holding bytes ``[begin, end)``, and where ``begin`` sits in it."""

    def close(self) -> None:
        """Release the file; buffers already handed out stay valid."""


class _Mapped:
    """The whole file mapped once with ``access`` (``mmap.ACCESS_READ`` or ``ACCESS_COPY``)."""

    def __init__(self, descriptor: int, label: str, access: int) -> None:
        self.label = label
        self.size = os.fstat(descriptor).st_size
        self._map: Any = mmap.mmap(descriptor, 0, access=access) if self.size else b""

    def read(self, begin: int, end: int) -> bytes:
        return bytes(self._map[begin:end])

    def span(self, begin: int, end: int) -> tuple[Any, int]:
        return self._map, begin

    def close(self) -> None:
        self._map = b""  # tensors already returned keep the mapping alive


class _Pread:
    """Reads by ``os.preadv`` into a fresh ``bytearray`` per tensor, from our own descriptor."""

    def __init__(self, descriptor: int, label: str) -> None:
        self.label = label
        self.size = os.fstat(descriptor).st_size
        self._descriptor = descriptor

    def read(self, begin: int, end: int) -> bytes:
        return bytes(self.span(begin, end)[0])

    def span(self, begin: int, end: int) -> tuple[Any, int]:
        buffer = bytearray(end - begin)
        view = memoryview(buffer)
        done = 0
        while done < len(buffer):
            count = os.preadv(self._descriptor, [view[done:]], begin + done)
            if count == 0:
                raise FormatError(f"file ends at byte {begin + done} while reading bytes "
                                  f"{begin}..{end} (truncated after it was opened?)",
                                  path=self.label, field="data")
            done += count
        return buffer, 0

    def close(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1


class _InMemory:
    """A file object without a descriptor (``io.BytesIO``): its bytes, copied once."""

    def __init__(self, data: bytearray, label: str) -> None:
        self.label = label
        self.size = len(data)
        self._data = data

    def read(self, begin: int, end: int) -> bytes:
        return bytes(self._data[begin:end])

    def span(self, begin: int, end: int) -> tuple[Any, int]:
        return self._data, begin

    def close(self) -> None:
        self._data = bytearray()


class _Object:
    """A file in an object store (``s3://``, ``gs://``, ``az://``): the first
    ``HEAD_BYTES`` in one range GET (the header, usually), then one range GET
    per tensor into its own writable memory."""

    HEAD_BYTES = 1 << 16

    def __init__(self, url: str, storage_options: Mapping[str, Any]) -> None:
        from zerobatch.storage import ObjectStorage

        folder, _, name = url.rstrip("/").rpartition("/")
        self.label = url
        self._storage = ObjectStorage(folder, **storage_options)
        try:
            self._handle = self._storage.open(name)
        except BaseException:
            self._storage.close()
            raise
        self.size = self._storage.size(name)
        self._head: bytearray | None = None

    def read(self, begin: int, end: int) -> bytes:
        if self._head is None:
            self._head = bytearray(min(self.size, self.HEAD_BYTES))
            self._storage.readinto(self._handle, 0, self._head)
        if end <= len(self._head):
            return bytes(self._head[begin:end])
        return bytes(self.span(begin, end)[0])

    def span(self, begin: int, end: int) -> tuple[Any, int]:
        buffer = bytearray(end - begin)
        if self._storage.readinto(self._handle, begin, buffer) != len(buffer):
            raise OSError(f"{self.label}: object shrank while reading bytes {begin}..{end}")
        return buffer, 0

    def close(self) -> None:
        self._storage.close()


def _descriptor_of(file: Any) -> int | None:
    try:
        return int(file.fileno())
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None


def open_source(target: Any, backend: str, access: int,
                storage_options: Mapping[str, Any] | None = None) -> Source:
    """The source for ``target``: a path (str, bytes, ``os.PathLike``), an
    object-store URL (``s3://``, ``gs://``, ``az://``; read by range GETs with
    ``storage_options``, whatever the backend) or a binary file object (read
    from its start; the caller keeps it open and owns it). ``access`` is the
    mmap access for the ``"mmap"`` backend."""
    if backend not in BACKENDS:
        raise SafetensorError(f"backend {backend!r} is invalid: expected one of {BACKENDS}",
                              field="backend")
    if isinstance(target, str) and is_url(target):
        return _Object(target, storage_options or {})
    if isinstance(target, (str, bytes, os.PathLike)):
        label = os.fsdecode(target)
        descriptor = os.open(target, os.O_RDONLY)
    elif callable(getattr(target, "read", None)):
        label = str(getattr(target, "name", f"<{type(target).__name__}>"))
        own = _descriptor_of(target)
        if own is None:
            if callable(getattr(target, "seek", None)):
                target.seek(0)
            data = target.read()
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"argument 'filename': file object {label} must be opened in "
                                f"binary mode ('rb'), its read() gave {type(data).__name__}")
            return _InMemory(bytearray(data), label)
        descriptor = os.dup(own)
    else:
        raise TypeError("argument 'filename': expected str, bytes, os.PathLike or a binary "
                        f"file object, not {type(target).__name__}")
    if backend == "pread":
        return _Pread(descriptor, label)
    try:
        return _Mapped(descriptor, label, access)
    finally:
        os.close(descriptor)
