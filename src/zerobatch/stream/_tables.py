"""Per-shard tables (document offsets, metadata offsets and bytes) as the
kernels take them: one ``int64`` array of ``(address, length)`` rows, row
``s`` for shard ``s``, beside the arrays it points into.

A kernel views row ``s`` with ``offsets_at`` (``<u8`` items) or ``bytes_at``
(bytes). Numba's typed lists did this job before: their module and its
imports cost a fresh process 18-28 ms before its first batch, and each list
passed to a kernel ~0.8 us a call, against ~0.1 us for an array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from zerobatch._jit import njit
from zerobatch.storage.local import _pointer

__all__ = ["bytes_at", "join_tables", "offsets_at", "shard_tables", "table_slices"]


class _Holder:
    """What a rows array is a view of: the rows' own memory, and the tables
    they point into, so that holding the rows holds the tables."""

    def __init__(self, rows: np.ndarray, tables: tuple[Any, ...]) -> None:
        self.rows, self.tables = rows, tables
        self.__array_interface__ = rows.__array_interface__


def _held(rows: npt.NDArray[np.int64], tables: tuple[Any, ...]) -> npt.NDArray[np.int64]:
    """``rows`` as a plain read-only array that keeps ``tables`` alive."""
    rows.setflags(write=False)
    return np.asarray(_Holder(rows, tables))


def shard_tables(tables: Sequence[np.ndarray], dtype: npt.DTypeLike) -> npt.NDArray[np.int64]:
    """The rows of ``tables``: ``rows[s] = (address, items)`` of table ``s``,
    an ``int64`` array of shape ``(len(tables), 2)`` that holds the tables.
    Each table must be 1-D, C-contiguous and of ``dtype`` (mappings and
    slices of one are): a table is never copied."""
    want = np.dtype(dtype)
    rows = np.zeros((len(tables), 2), np.int64)
    for s, table in enumerate(tables):
        if table.dtype != want or table.ndim != 1 or not table.flags.c_contiguous:
            raise ValueError(f"table {s} is {table.dtype} of shape {table.shape}: a shard "
                             f"table must be a 1-D contiguous {want}")
        rows[s, 0], rows[s, 1] = table.ctypes.data, table.shape[0]
    return _held(rows, tuple(tables))


def table_slices(values: np.ndarray, starts: npt.NDArray[np.int64],
                 ends: npt.NDArray[np.int64], dtype: npt.DTypeLike) -> npt.NDArray[np.int64]:
    """The rows of tables ``values[starts[i]:ends[i]]``, with no Python call a
    table (``values`` 1-D contiguous ``dtype``, ``0 <= starts <= ends <=
    len(values)``)."""
    if values.dtype != np.dtype(dtype) or values.ndim != 1 or not values.flags.c_contiguous:
        raise ValueError(f"values are {values.dtype} of shape {values.shape}: they must be "
                         f"a 1-D contiguous {np.dtype(dtype)}")
    rows = np.empty((starts.shape[0], 2), np.int64)
    rows[:, 0] = values.ctypes.data + starts * values.itemsize
    rows[:, 1] = ends - starts
    return _held(rows, (values,))


def join_tables(parts: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """The rows of every table of ``parts`` (rows arrays), in order."""
    rows = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    return _held(rows, tuple(parts))


@njit(nogil=True, cache=True, inline="always")
def offsets_at(rows: np.ndarray, s: int) -> Any:
    """Table ``s`` of ``rows`` as ``uint64`` items (a view; no bounds check
    beyond the table's own length)."""
    return numba.carray(_pointer(rows[s, 0]), rows[s, 1], np.uint64)


@njit(nogil=True, cache=True, inline="always")
def bytes_at(rows: np.ndarray, s: int) -> Any:
    """Table ``s`` of ``rows`` as bytes (a view)."""
    return numba.carray(_pointer(rows[s, 0]), rows[s, 1], np.uint8)
