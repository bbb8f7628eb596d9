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
from zerobatch.tensors._header import Header

__all__ = ["ACCESS", "convert", "view"]

ACCESS = mmap.ACCESS_READ
"""How a file is mapped for this framework: shared and read-only."""


def view(buffer: Any, header: Header, row: int, *, path: object) -> np.ndarray[Any, Any]:
    """The tensor at ``row`` as an array over ``buffer`` (no copy)."""
    info = header.info(row)
    dtype = numpy_dtype(int(header.codes[row]))
    if dtype is None:
        raise FormatError(f"tensor {info.name!r}: dtype {info.dtype} packs "
                          f"{DTYPES[int(header.codes[row])].bits}-bit elements, which NumPy "
                          "cannot view", path=path, field="dtype")
    count = (info.end - info.begin) // dtype.itemsize
    if count == 0:
        return np.empty(info.shape, dtype)
    offset = header.data_start + info.begin
    return np.frombuffer(buffer, dtype, count=count, offset=offset).reshape(info.shape)


def convert(array: np.ndarray[Any, Any], device: str | int) -> np.ndarray[Any, Any]:
    """``array`` itself: NumPy lives on the CPU only."""
    if device != "cpu":
        raise ValueError(f"NumPy arrays live on the CPU, got device {device!r}")
    return array
