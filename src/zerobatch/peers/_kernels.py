"""Numba kernels of the peer readers: a format's boundary table to document
offsets in one pass. They return a status code and never raise; the callers
turn it into a ``FormatError`` naming the file and field."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["BAD_INDICES", "BAD_LENGTH", "BAD_POINTER", "OK", "gather", "megatron_offsets",
           "search_right"]

OK, BAD_LENGTH, BAD_POINTER, BAD_INDICES = 0, 1, 2, 3


@njit(nogil=True, cache=True)
def megatron_offsets(
    lengths: np.ndarray, pointers: np.ndarray, indices: np.ndarray, itemsize: int,
    records: int,
) -> tuple[np.ndarray, int, int]:
    """Token offsets of the documents of at least one token, from Megatron's
    ``lengths`` (``<i4``), ``pointers`` (``<i8`` bytes) and ``document_indices``
    (``<i8``): ``(offsets[:count + 1], code, at)``; ``at`` is the first bad
    entry when ``code`` is not ``OK``. Checks every length non-negative, each
    pointer the previous one's end (the first 0, the last ending at
    ``records``), and the indices non-decreasing from 0 to the sequences."""
    sequences = lengths.shape[0]
    out = np.empty(indices.shape[0], np.uint64)
    end = np.int64(0)
    for i in range(sequences):
        if lengths[i] < 0:
            return out[:0], BAD_LENGTH, i
        if pointers[i] != end:
            return out[:0], BAD_POINTER, i
        end += np.int64(lengths[i]) * itemsize
    if end != records * itemsize:
        return out[:0], BAD_POINTER, sequences
    count = 0
    previous = np.int64(0)
    for d in range(indices.shape[0]):
        s = indices[d]
        if s < previous or s > sequences or (d == 0 and s != 0):
            return out[:0], BAD_INDICES, d
        previous = s
        start = np.uint64(records) if s == sequences else np.uint64(pointers[s] // itemsize)
        if count == 0 or start > out[count - 1]:
            out[count] = start
            count += 1
    if indices[indices.shape[0] - 1] != sequences:
        return out[:0], BAD_INDICES, indices.shape[0] - 1
    if count == 0 or out[count - 1] != np.uint64(records):
        out[count] = np.uint64(records)
        count += 1
    return out[:count], OK, 0


@njit(nogil=True, cache=True)
def search_right(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per value, how many entries of the sorted ``table`` are at or below it
    (``np.searchsorted(side="right")``). Unlike NumPy's, it reads a table that
    is not aligned (Megatron's ``.idx`` tables lie at odd offsets) in place,
    touching O(log n) entries per value, where NumPy copies the whole table."""
    out = np.empty(values.shape[0], np.int64)
    for q in range(values.shape[0]):
        lo, hi = 0, table.shape[0]
        value = values[q]
        while lo < hi:
            middle = (lo + hi) >> 1
            if table[middle] <= value:
                lo = middle + 1
            else:
                hi = middle
        out[q] = lo
    return out


@njit(nogil=True, cache=True)
def gather(table: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``table[positions]``, read in place even when ``table`` is not aligned."""
    out = np.empty(positions.shape[0], table.dtype)
    for i in range(positions.shape[0]):
        out[i] = table[positions[i]]
    return out
