"""Sorted tables inside peer files, read entry by entry: the boundary tables
(Megatron's pointers and document indices, datatrove's ends, LitData's item
offsets, Arrow list offsets) are searched and sliced where a batch needs
them, never read or derived whole.

A ``Column`` is ``count`` little-endian entries of one dtype at a byte of a
file, non-decreasing when the file is sound. ``Lookup`` reads them through
a storage:

- local files: the file is mapped once; ``search`` is a binary search of
  the mapping (O(log entries) pages touched), ``take`` a gather, both in
  Numba kernels that read unaligned tables in place (NumPy would copy them);
- object storage (``storage.blocks``, a ``BlockCache``): ``take`` fetches the
  blocks holding the entries asked for, all in one concurrent round;
  ``search`` narrows each query's range one block per round (interpolation
  between known values, then bisection, in turns; usually one or two rounds),
  every query's block of a round fetched together.

Nothing here checks that a column is sorted: on an unsound file a search
returns some position, and the caller's checks of the entries it then reads
(or the read kernels' checks of the offsets) report the file and field.
Thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.peers._kernels import gather, search_right
from zerobatch.storage import Storage

__all__ = ["Column", "Lookup"]


@dataclass(frozen=True)
class Column:
    """``count`` entries of ``dtype`` at byte ``at`` of file ``name``, whose
    values lie in ``[low, high]`` when the file is sound (the search's first
    guess)."""

    name: str
    at: int
    count: int
    dtype: np.dtype
    low: int
    high: int


class Lookup:
    """Searches and gathers in ``Column``s of files of ``storage`` (see the
    module docstring)."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._blocks = getattr(storage, "blocks", None)
        self._maps: dict[str, np.ndarray] = {}
        self._lock = _forksafe.lock()

    @property
    def ranged(self) -> bool:
        """Whether entries are fetched by range (object storage) rather than mapped."""
        return self._blocks is not None

    def _map(self, name: str) -> np.ndarray:
        raw = self._maps.get(name)
        if raw is None:
            with self._lock:
                raw = self._maps.get(name)
                if raw is None:
                    raw = self._storage.map(name)
                    self._maps[name] = raw
        return raw

    def _view(self, column: Column) -> np.ndarray:
        size = column.dtype.itemsize
        return self._map(column.name)[column.at:column.at + column.count * size].view(
            column.dtype)

    def whole(self, name: str, dtype: np.dtype) -> np.ndarray:
        """File ``name`` as one array of ``dtype`` entries (entry ``i`` at byte
        ``i * dtype.itemsize``), for many columns of one file at once: mapped
        files only."""
        if self._blocks is not None:
            raise TypeError("whole maps local files; over object storage use take")
        raw = self._map(name)
        return raw[:raw.shape[0] - raw.shape[0] % dtype.itemsize].view(dtype)

    def take(self, column: Column, positions: npt.NDArray[np.int64]) -> np.ndarray:
        """The entries at ``positions`` (each in ``[0, count)``)."""
        if self._blocks is None:
            return gather(self._view(column), positions.astype(np.int64))
        if positions.size == 0:
            return np.zeros(0, column.dtype)
        size = column.dtype.itemsize
        per = max(1, self._blocks.block_size // size)
        blocks = np.unique(positions // per)
        first = blocks * per
        end = np.minimum(first + per, column.count)
        raw = self._blocks.read([(column.name, column.at + int(a) * size, column.at + int(b) * size)
                                 for a, b in zip(first.tolist(), end.tolist(), strict=True)])
        joined = np.concatenate([r.view(column.dtype) for r in raw])
        starts = np.concatenate([[0], np.cumsum(end - first)[:-1]])
        which = np.searchsorted(blocks, positions // per)
        return joined[starts[which] + positions - first[which]]

    def search(self, column: Column, values: np.ndarray) -> npt.NDArray[np.int64]:
        """Per value, how many entries are at or below it (``np.searchsorted``,
        ``side="right"``, over the column)."""
        wanted = np.asarray(values).astype(column.dtype)
        if self._blocks is None:
            return search_right(self._view(column), wanted)
        return self._search_ranged(column, wanted)

    def _search_ranged(self, column: Column, values: np.ndarray) -> npt.NDArray[np.int64]:
        """Invariant: entries before ``lo`` are <= the value, from ``hi`` on > it."""
        assert self._blocks is not None
        size = column.dtype.itemsize
        per = max(1, self._blocks.block_size // size)
        count = values.shape[0]
        lo = np.zeros(count, np.int64)
        hi = np.full(count, column.count, np.int64)
        low = np.full(count, float(column.low))
        high = np.full(count, float(column.high))
        target = values.astype(np.float64)
        step = 0
        while True:
            open_ = np.flatnonzero(lo < hi)
            if not open_.size:
                return lo
            a, b = lo[open_], hi[open_]
            if step % 2 == 0:
                span = np.maximum(high[open_] - low[open_], 1.0)
                fraction = np.clip((target[open_] - low[open_]) / span, 0.0, 1.0)
                guess = a + (fraction * (b - a)).astype(np.int64)
            else:
                guess = (a + b) // 2
            guess = np.clip(guess, a, b - 1)
            first = np.maximum(guess // per * per, a)
            end = np.minimum(guess // per * per + per, b)
            raw = self._blocks.read([
                (column.name, column.at + int(x) * size, column.at + int(y) * size)
                for x, y in zip(first.tolist(), end.tolist(), strict=True)])
            for q, x, got in zip(open_.tolist(), first.tolist(), raw, strict=True):
                entries = got.view(column.dtype)
                j = int(np.searchsorted(entries, values[q], side="right"))
                if j == 0:
                    hi[q], high[q] = x, float(entries[0])
                elif j == entries.shape[0]:
                    lo[q], low[q] = x + j, float(entries[-1])
                else:
                    lo[q] = hi[q] = x + j
            step += 1
