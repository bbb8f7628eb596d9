"""Writing a tensor file: caller tensors (NumPy, PyTorch, JAX) planned into
header entries and raw little-endian C-order bytes, without copying arrays
that already are contiguous and little-endian; then the header and each
tensor's own memory written straight to the file with ``os.writev`` (no joined
copy, no Python-side buffering), published atomically.

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
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from zerobatch.storage.publish import AtomicFile, publisher
from zerobatch.storage.url import is_url
from zerobatch.tensors.format import (
    BINTENSORS,
    BINTENSORS_ID,
    DTYPES,
    FORMATS,
    METADATA_KEY,
    SAFETENSORS,
    code_of_numpy,
)

__all__ = ["F4_TORCH", "Planned", "plan", "write_atomic"]

F4_TORCH = "float4_e2m1fn_x2"
"""torch's packed F4 dtype: two elements per byte, where the file counts elements."""

_BATCH = 512
"""Buffers per ``writev`` call (Linux accepts up to 1024)."""

_STEP = 64 << 20
"""Bytes per ``writev`` step (buffers are cut to fit); the disk write of each
step starts as soon as it is in the page cache."""

_SYNC_FILE_RANGE_WRITE = 2
"""``sync_file_range`` flag: start writing the range out, do not wait for it."""


_RESERVE_FROM = 1 << 20
"""Files at least this large get their blocks reserved before writing."""


@dataclass(frozen=True)
class Planned:
    """One tensor ready to write: ``data`` is a flat uint8 view of its bytes."""

    name: str
    code: int
    shape: tuple[int, ...]
    data: np.ndarray[Any, np.dtype[np.uint8]]


def _from_torch(tensor: Any) -> tuple[int | None, tuple[int, ...], Any]:
    import torch

    if tensor.layout != torch.strided:
        raise ValueError(f"is a sparse tensor ({tensor.layout}); make it dense with "
                         ".to_dense() before saving")
    name = str(tensor.dtype).removeprefix("torch.")
    code = next((c for c, dtype in enumerate(DTYPES) if dtype.torch_name == name), None)
    shape = tuple(tensor.shape)
    if name == F4_TORCH:  # two 4-bit elements per byte: the file counts elements
        if not shape:
            raise ValueError("is a 0-d float4_e2m1fn_x2 tensor; F4 needs a last dimension")
        shape = (*shape[:-1], shape[-1] * 2)
        tensor = tensor.view(torch.uint8)
    flat = tensor.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return code, shape, flat.view(torch.uint8).numpy()


def _from_numpy(array: np.ndarray[Any, Any]) -> tuple[int | None, tuple[int, ...], Any]:
    code = code_of_numpy(array.dtype)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))  # copy: files are little-endian
    # ascontiguousarray copies only arrays that are not C-contiguous already
    flat = np.ascontiguousarray(array).reshape(-1)
    return code, tuple(array.shape), flat.view(np.uint8) if code is not None else flat


def _convert(value: Any) -> tuple[int | None, tuple[int, ...], Any]:
    module = type(value).__module__
    if module.startswith("torch"):
        return _from_torch(value)
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)  # JAX and other array-likes: one copy to host
    return _from_numpy(value)


def _check_metadata(metadata: Mapping[str, str] | None) -> list[str]:
    if metadata is None:
        return []
    if not isinstance(metadata, Mapping):
        return [f"metadata must be a dict of str to str, got {type(metadata).__name__}"]
    return [f"metadata {k!r}: keys and values must be str" for k, v in metadata.items()
            if type(k) is not str or type(v) is not str]


def plan(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None,
         fmt: str) -> tuple[list[Planned], list[tuple[str, int, tuple[int, ...], int, int]]]:
    """The tensors in write order, and header entries (name, code, shape, begin, end).

    Writers sort by dtype (largest id first) then name, as the reference
    writers do. Raises ValueError naming every offending tensor at once.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if not isinstance(tensors, Mapping):
        raise ValueError(f"argument 'tensors': expected a dict of names to tensors, got "
                         f"{type(tensors).__name__}")
    problems = _check_metadata(metadata)
    planned = []
    for name, value in tensors.items():
        if type(name) is not str:
            problems.append(f"tensor name {name!r} is not a str")
            continue
        if fmt == SAFETENSORS and name == METADATA_KEY:
            problems.append(f"{METADATA_KEY!r} is reserved for metadata in safetensors")
            continue
        try:
            code, shape, data = _convert(value)
        except ValueError as error:
            problems.append(f"tensor {name!r} {error}")
            continue
        if code is None or (fmt == BINTENSORS and code not in BINTENSORS_ID):
            dtype = getattr(value, "dtype", type(value).__name__)
            problems.append(f"tensor {name!r}: {fmt} cannot store dtype {dtype}")
            continue
        planned.append(Planned(name, code, shape, data))
    if problems:
        raise ValueError("cannot save: " + "; ".join(problems))

    def rank(item: Planned) -> tuple[int, str]:
        return -(BINTENSORS_ID[item.code] if fmt == BINTENSORS else item.code), item.name

    planned.sort(key=rank)
    entries = []
    offset = 0
    for item in planned:
        entries.append((item.name, item.code, item.shape, offset, offset + item.data.size))
        offset += item.data.size
    return planned, entries


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
