"""The paired functions of both formats: ``save``/``load`` for bytes,
``save_file``/``load_file`` for paths (and object-store URLs), checksums."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from zerobatch.tensors._frameworks import adapter, view
from zerobatch.tensors._open import safe_open
from zerobatch.tensors._write import plan, write_atomic
from zerobatch.tensors.format import BINTENSORS, encode_header, read_header

__all__ = ["checksum", "load", "load_file", "save", "save_file", "save_with_checksum"]

_CHUNK = 8 << 20


def save(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None, *,
         format: str = BINTENSORS) -> bytes:
    """The file bytes for ``tensors`` (NumPy, PyTorch or JAX arrays by name).

    ``format`` is ``"bintensors"`` or ``"safetensors"``; the bytes equal what
    the reference package of that name writes.
    """
    planned, entries = plan(tensors, metadata, format)
    head = encode_header(format, None if metadata is None else dict(metadata), entries)
    return b"".join([head, *(item.data.data for item in planned)])


def save_with_checksum(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None,
                       hasher: Callable[..., Any] = hashlib.sha1, *,
                       format: str = BINTENSORS) -> tuple[bytes, bytes]:
    """``(hasher(file bytes).digest(), file bytes)``, as bintensors does."""
    data = save(tensors, metadata, format=format)
    return hasher(data).digest(), data


def save_file(tensors: Mapping[str, Any], path: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None, *, format: str = BINTENSORS,
              storage_options: Mapping[str, Any] | None = None) -> None:
    """Write ``tensors`` to ``path`` atomically (``zerobatch.storage.publish``):
    locally a temporary file in the same folder is written, fsynced, then
    renamed over ``path``; an object-store URL (``storage_options`` as for
    ``open_storage``) is uploaded whole. Nothing is written when any tensor is
    invalid. Contiguous little-endian arrays are written from their own memory
    with ``os.writev``, without a copy."""
    planned, entries = plan(tensors, metadata, format)
    head = encode_header(format, None if metadata is None else dict(metadata), entries)
    write_atomic(path, [head, *(item.data for item in planned)],
                 storage_options=storage_options)


def load(data: bytes | bytearray, framework: str = "np") -> dict[str, Any]:
    """All tensors in ``data`` (file bytes), in file order.

    NumPy arrays are read-only views of ``data``; other frameworks get one
    copy of the bytes so their tensors are writable.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"argument 'data': expected bytes, not {type(data).__name__}")
    chosen = adapter(framework)
    if framework not in ("np", "numpy"):
        data = bytearray(data)  # copy: torch and JAX want writable memory
    header = read_header(data)
    rows = [header.index[name] for name in header.offset_order()]
    return {
        header.names[row]: chosen.convert(
            view(data, header, row, path=None, packed=chosen.packed), "cpu")
        for row in rows
    }


def load_file(path: str | os.PathLike[str], framework: str = "np",
              device: str | int = "cpu", *, backend: str = "mmap",
              storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """All tensors in the file at ``path`` (a binary file object, or an
    object-store URL read with ``storage_options``), in file order; zero-copy
    on the CPU with ``backend="mmap"``, one read per tensor with ``"pread"``
    (and for URLs)."""
    with safe_open(path, framework, device, backend=backend,
                   storage_options=storage_options) as file:
        return file.get_tensors()


def checksum(path: str | os.PathLike[str], hasher: Callable[..., Any] = hashlib.sha1) -> bytes:
    """``hasher`` digest of the whole file: equals the first item of
    :func:`save_with_checksum` for the same bytes. Reads 8 MiB at a time."""
    state = hasher()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            state.update(chunk)
    digest: bytes = state.digest()
    return digest
