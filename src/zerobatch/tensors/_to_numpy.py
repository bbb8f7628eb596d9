"""NumPy views over tensor-file bytes: read-only, zero-copy.

bf16 and the fp8 types come from ``ml_dtypes``; the packed sub-byte types
(F4, F6_*) have no NumPy form and raise :class:`FormatError` when read.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.tensors._dtypes import DTYPES, numpy_dtype
from zerobatch.tensors._errors import SafetensorError
from zerobatch.tensors._header import Header
from zerobatch.tensors._slicing import basic_index

__all__ = ["ACCESS", "F4_PAIRS", "PACKED", "check_device", "convert", "take", "view"]

ACCESS = mmap.ACCESS_READ
"""How a file is mapped for this framework: shared and read-only."""


PACKED = False
"""Whether this framework takes packed 4-bit tensors (as :data:`F4_PAIRS` arrays)."""

F4_PAIRS = np.dtype("V1")
"""The NumPy dtype :func:`view` gives packed F4 data (two elements per byte)."""


def view(buffer: Any, header: Header, row: int, *, path: object, offset: int | None = None,
         packed: bool = False) -> np.ndarray[Any, Any]:
    """The tensor at ``row`` as an array over ``buffer`` (no copy); its bytes
    start at ``offset`` (default: where the header puts them in a whole-file
    buffer). With ``packed``, F4 comes back as :data:`F4_PAIRS` bytes, the
    last dimension halved."""
    info = header.info(row)
    code = int(header.codes[row])
    dtype = numpy_dtype(code)
    shape = info.shape
    if dtype is None and packed and DTYPES[code].bits == 4 and shape and shape[-1] % 2 == 0:
        dtype, shape = F4_PAIRS, (*shape[:-1], shape[-1] // 2)
    if dtype is None:
        raise FormatError(f"tensor {info.name!r}: dtype {info.dtype} packs "
                          f"{DTYPES[code].bits}-bit elements, which this framework cannot "
                          "view", path=path, field="dtype")
    count = (info.end - info.begin) // dtype.itemsize
    if count == 0:
        return np.empty(shape, dtype)
    if offset is None:
        offset = header.data_start + info.begin
    return np.frombuffer(buffer, dtype, count=count, offset=offset).reshape(shape)


def check_device(device: str | int) -> str | int:
    """``device`` if NumPy can live there (the CPU only)."""
    if device != "cpu":
        raise SafetensorError(f"device {device!r} is not supported: NumPy arrays live on the CPU",
                              field="device")
    return device


def convert(array: np.ndarray[Any, Any], device: str | int) -> np.ndarray[Any, Any]:
    """``array`` itself: NumPy lives on the CPU only."""
    return array


def take(array: np.ndarray[Any, Any], index: Any, device: str | int, *, path: object,
         name: str) -> Any:
    """``array[index]`` for the indexes safetensors 0.8.0 accepts for this
    framework (``_slicing``), placed as :func:`convert` places it."""
    spelled = basic_index(index, array.shape, path=path, name=name)
    # the trailing ... keeps all-int indexes a 0-d view, not a NumPy scalar
    return convert(array[(*spelled, Ellipsis)], device)
