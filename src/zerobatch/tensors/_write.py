"""Writing a tensor file: the header, then each tensor's own memory, straight
to the file with ``os.writev`` (no joined copy, no Python-side buffering),
published atomically."""

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

_MOST = 1 << 30
"""Largest buffer handed to one ``writev``: Linux writes at most ~2 GiB per call."""


_RESERVE_FROM = 1 << 20
"""Files at least this large get their blocks reserved before writing."""


@cache
def _fallocate() -> Any:
    """Linux ``fallocate(2)`` (never glibc's byte-writing emulation), or None."""
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "fallocate", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return function


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
        for start in range(0, len(view), _MOST):
            yield view[start : start + _MOST]


def _write_all(descriptor: int, buffers: Iterable[Any]) -> None:
    batch: list[memoryview] = []
    for piece in _pieces(buffers):
        batch.append(piece)
        if len(batch) == _BATCH:
            _drain(descriptor, batch)
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
