"""Layout checks shared by both formats: every byte of the data section
belongs to exactly one tensor, in order, and each tensor's byte range is exactly
``prod(shape) * dtype size`` long."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from zerobatch.errors import FormatError
from zerobatch.tensors._dtypes import DTYPES
from zerobatch.tensors._header import BINTENSORS, Header

__all__ = ["MAX_DIMS", "check_layout"]

_OK = 0
_OVERFLOW = 1
_PARTIAL_BYTE = 2
_REVERSED = 3
_HOLE = 4
_OVERLAP = 5
_SIZE = 6
_TOO_MANY_DIMS = 7

MAX_DIMS = 64
"""Most dimensions a tensor may have: NumPy's limit."""

_BITS = np.array([d.bits for d in DTYPES], np.uint64)
_BIT_LIMIT = np.uint64(2**63 - 1)
"""Largest shape x dtype size in bits (zero dimensions left out), so that every
accepted shape, empty ones included, is one NumPy and PyTorch can represent."""


@numba.njit(cache=True, nogil=True)
def _walk(order: Any, bits: Any, codes: Any, dims: Any, starts: Any, begins: Any,
          ends: Any) -> Any:
    """(error, row, end of the last tensor) walking rows in ``order`` from offset 0."""
    expected = np.uint64(0)
    for row in order:
        if starts[row + 1] - starts[row] > MAX_DIMS:
            return _TOO_MANY_DIMS, row, np.uint64(0)
        span = bits[codes[row]]
        empty = False
        for k in range(starts[row], starts[row + 1]):
            dim = dims[k]
            if dim == 0:
                empty = True
            elif span > _BIT_LIMIT // dim:
                return _OVERFLOW, row, np.uint64(0)
            else:
                span *= dim
        total = np.uint64(0) if empty else span
        if total % np.uint64(8) != 0:
            return _PARTIAL_BYTE, row, np.uint64(0)
        begin = begins[row]
        end = ends[row]
        if end < begin:
            return _REVERSED, row, np.uint64(0)
        if begin > expected:
            return _HOLE, row, np.uint64(0)
        if begin < expected:
            return _OVERLAP, row, np.uint64(0)
        if end - begin != total // np.uint64(8):
            return _SIZE, row, np.uint64(0)
        expected = end
    return _OK, -1, expected


def _message(code: int, header: Header, row: int) -> tuple[str, str]:
    if code == _TOO_MANY_DIMS:
        ndim = int(header.dim_starts[row + 1] - header.dim_starts[row])
        return (f"tensor {header.names[row]!r}: {ndim} dimensions, more than the "
                f"{MAX_DIMS} NumPy supports", "shape")
    info = header.info(row)
    where = f"tensor {info.name!r} ({info.dtype}, shape {list(info.shape)})"
    if code == _OVERFLOW:
        return (f"{where}: shape too large (integer overflow): its elements, zero dimensions "
                "left out, would need 2**63 bits or more", "shape")
    if code == _PARTIAL_BYTE:
        return f"{where}: packed elements do not fill whole bytes", "shape"
    if code == _REVERSED:
        return f"{where}: data offsets [{info.begin}, {info.end}] end before they begin", (
            "data_offsets"
        )
    if code in (_HOLE, _OVERLAP):
        problem = "leave a hole before them" if code == _HOLE else "overlap the previous tensor"
        walk = "in stored order" if header.format == BINTENSORS else "sorted by offset"
        return (
            f"{where}: data offsets [{info.begin}, {info.end}] {problem}; "
            f"tensors must be contiguous from offset 0 ({walk})",
            "data_offsets",
        )
    count = 1
    for dim in info.shape:
        count *= dim
    return (
        f"{where}: data offsets [{info.begin}, {info.end}] hold {info.end - info.begin} bytes, "
        f"shape x dtype needs {count * DTYPES[int(header.codes[row])].bits // 8}",
        "data_offsets",
    )


def check_layout(header: Header, data_len: int, *, path: object) -> None:
    """Raise :class:`FormatError` unless the tensors tile ``data_len`` bytes exactly.

    bintensors is walked in stored order, safetensors sorted by (begin, end),
    as each reference reader does.
    """
    if header.format == BINTENSORS:
        order = np.arange(len(header.names))
    else:
        order = np.lexsort((header.ends, header.begins))
    code, row, end = _walk(
        order, _BITS, header.codes, header.dims, header.dim_starts, header.begins, header.ends
    )
    if code != _OK:
        message, field = _message(code, header, row)
        raise FormatError(message, path=path, field=field)
    if end != data_len:
        hint = "trailing bytes after the last tensor" if data_len > end else (
            "file seems not fully written?"
        )
        raise FormatError(
            f"tensors cover {end} data bytes but the file holds {data_len}: {hint}",
            path=path,
            field="data_offsets",
        )
