"""Writing a tensor file: the header, then each tensor's own memory, straight
to the file with ``os.writev`` (no joined copy, no Python-side buffering),
published atomically.

Locally, the file's blocks are reserved first (``fallocate``), and the disk
write of each 64 MiB step is started (``sync_file_range``) as soon as the
step is in the page cache, so the fsync of the publish overlaps with the
copying instead of following it."""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from zerobatch.storage.publish import AtomicFile, publisher
from zerobatch.storage.url import is_url

__all__ = ["write_atomic"]

_BATCH = 512
"""Buffers per ``writev`` call (Linux accepts up to 1024)."""

_STEP = 64 << 20
"""Bytes per ``writev`` step (buffers are cut to fit); the disk write of each
step starts as soon as it is in the page cache."""

_SYNC_FILE_RANGE_WRITE = 2
"""``sync_file_range`` flag: start writing the range out, do not wait for it."""


_RESERVE_FROM = 1 << 20
"""Files at least this large get their blocks reserved before writing."""


@cache
def _linux_call(name: str, *argtypes: Any) -> Any:
    """The Linux system call wrapper ``name`` from libc with ``argtypes``
    (never a glibc emulation), or None elsewhere or when libc lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), name, None)
    if function is not None:
        function.argtypes = list(argtypes)
    return function


def _fallocate() -> Any:
    """Linux ``fallocate(2)`` (never glibc's byte-writing emulation), or None."""
    return _linux_call("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def _sync_file_range() -> Any:
    """Linux ``sync_file_range(2)``, or None."""
    return _linux_call("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_uint)


def _reserve(descriptor: int, size: int) -> None:
    """Reserve ``size`` bytes of blocks up front: a full disk fails before any
    data is written, and the filesystem allocates one extent instead of many.
    Best effort: filesystems without ``fallocate`` just skip it."""
    function = _fallocate()
    if size < _RESERVE_FROM or function is None:
        return
    if function(descriptor, 0, 0, size) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise OSError(code, os.strerror(code))


def _pieces(buffers: Iterable[Any]) -> Iterable[memoryview]:
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        for start in range(0, len(view), _STEP):
            yield view[start : start + _STEP]


def _write_all(descriptor: int, buffers: Iterable[Any]) -> None:
    """Write ``buffers`` in steps of at most ``_BATCH`` buffers and about
    ``_STEP`` bytes, starting each step's disk write once it is written."""
    start_writeback = _sync_file_range()
    batch: list[memoryview] = []
    written = pending = 0
    for piece in _pieces(buffers):
        batch.append(piece)
        pending += len(piece)
        if len(batch) == _BATCH or pending >= _STEP:
            _drain(descriptor, batch)
            if start_writeback is not None:
                start_writeback(descriptor, written, pending, _SYNC_FILE_RANGE_WRITE)
            written += pending
            pending = 0
    _drain(descriptor, batch)


def _drain(descriptor: int, batch: list[memoryview]) -> None:
    """Write every byte of ``batch`` (short writes resumed), then empty it."""
    while batch:
        written = os.writev(descriptor, batch)
        while batch and written >= len(batch[0]):
            written -= len(batch[0])
            batch.pop(0)
        if batch and written:
            batch[0] = batch[0][written:]


def write_atomic(path: str | os.PathLike[str], buffers: Sequence[Any], *,
                 storage_options: Mapping[str, Any] | None = None) -> None:
    """Publish ``buffers`` (bytes-likes, in order) as the file at ``path``
    through ``zerobatch.storage.publish``: locally a temporary file in the same
    folder is written by ``writev``, fsynced and renamed over ``path`` (on any
    error it is removed and ``path`` is untouched); an object-store URL
    (``storage_options`` as for ``open_storage``) is uploaded whole."""
    location = os.fspath(path)
    if is_url(location):
        folder, _, name = location.rstrip("/").rpartition("/")
    else:
        folder, name = os.path.split(os.path.abspath(location))
    out = publisher(folder, **(storage_options or {}))
    try:
        file = out.file(name)
        try:
            if isinstance(file, AtomicFile):
                _reserve(file.fileno(), sum(memoryview(b).nbytes for b in buffers))
                _write_all(file.fileno(), buffers)
            else:
                for piece in _pieces(buffers):
                    file.write(piece)
        except BaseException:
            file.abort()
            raise
        file.commit()
        out.wait()
    finally:
        out.close()
