"""``Jagged``: B variable-length samples as one values array plus B+1 offsets.

Sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``: a view, never a copy.
``offsets`` is int64, non-decreasing, ``0 <= offsets[0]`` and
``offsets[-1] <= len(values)``, so a Jagged may point into a larger buffer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any, overload

import numpy as np
import numpy.typing as npt

__all__ = ["Jagged", "as_positions", "offsets_problem"]


def as_positions(indices: Any, length: int) -> slice | npt.NDArray[np.int64]:
    """Normalize row selectors to a slice or int64 positions in ``[0, length)``.

    Accepts a slice, a boolean mask of ``length``, or ints (negative ones count
    from the end). Raises IndexError for positions out of range. Cost: O(k).
    """
    if isinstance(indices, slice):
        return indices
    positions = np.asarray(indices)
    if positions.dtype == np.bool_:
        if positions.shape != (length,):
            raise IndexError(f"boolean mask has shape {positions.shape}, expected ({length},)")
        return np.flatnonzero(positions)
    if positions.size == 0:
        return np.zeros(0, dtype=np.int64)
    if positions.ndim != 1 or not np.issubdtype(positions.dtype, np.integer):
        raise IndexError(f"expected a slice, a boolean mask or 1-D ints, got {positions.dtype}")
    positions = positions.astype(np.int64, copy=False)
    low, high = int(positions.min()), int(positions.max())
    if low < -length or high >= length:
        raise IndexError(f"index out of range for {length} rows: {low if low < 0 else high}")
    if low < 0:
        positions = np.where(positions < 0, positions + length, positions)
    return positions


class Jagged:
    """B samples of varying length: ``values[N, ...]`` and int64 ``offsets[B + 1]``.

    ``len(j)`` is B; ``j[i]`` is sample i's rows of ``values`` (a view);
    ``j[a:b]`` is a Jagged sharing ``values``. Construction validates the
    offsets in O(B) and copies nothing when they are already int64.

    Example: ``Jagged(np.arange(5), np.array([0, 2, 5]))[1].tolist() == [2, 3, 4]``.
    """

    __slots__ = ("offsets", "values")

    values: np.ndarray
    offsets: npt.NDArray[np.int64]

    def __init__(self, values: Any, offsets: Any) -> None:
        values = np.asarray(values)
        offsets = np.asarray(offsets)
        if values.ndim < 1:
            raise ValueError("Jagged values must have at least one dimension (items)")
        if offsets.ndim != 1 or offsets.size < 1:
            raise ValueError(f"Jagged offsets must be 1-D of length B+1, got shape {offsets.shape}")
        if not np.issubdtype(offsets.dtype, np.integer):
            raise ValueError(f"Jagged offsets must be integers, got {offsets.dtype}")
        offsets = offsets.astype(np.int64, copy=False)
        problem = offsets_problem(offsets, len(values))
        if problem is not None:
            raise ValueError(f"Jagged offsets {problem}")
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_arrays(cls, arrays: Sequence[Any], *, dtype: Any = None) -> Jagged:
        """Concatenate B arrays (each ``[n_i, ...]``) into one Jagged. Cost: O(B + N), a copy."""
        parts = [np.asarray(a, dtype=dtype) for a in arrays]
        lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if parts:
            values = np.concatenate(parts)
        else:
            values = np.zeros(0, dtype=np.dtype(dtype) if dtype is not None else np.float64)
        return cls(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Items per sample, shape (B,). Cost: O(B)."""
        return np.diff(self.offsets)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of ``values``."""
        return self.values.dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one item (``values.shape[1:]``)."""
        return tuple(self.values.shape[1:])

    @overload
    def __getitem__(self, key: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, key: slice) -> Jagged: ...
    def __getitem__(self, key: int | slice) -> np.ndarray | Jagged:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self.take(np.arange(start, stop, step))
            return self._unchecked(self.values, self.offsets[start : max(start, stop) + 1])
        n = len(self)
        i = int(key)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i %= n
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        """Each sample's view, in order (one Python object per sample: not for hot paths)."""
        values, offsets = self.values, self.offsets.tolist()
        return (values[a:b] for a, b in pairwise(offsets))

    def __repr__(self) -> str:
        return (
            f"Jagged(samples={len(self)}, items={self.num_items}, "
            f"dtype={self.dtype}, item_shape={self.item_shape})"
        )

    @property
    def num_items(self) -> int:
        """Items referenced by the offsets (``offsets[-1] - offsets[0]``)."""
        return int(self.offsets[-1] - self.offsets[0])

    def compact(self) -> Jagged:
        """The same samples with ``offsets[0] == 0`` and no unreferenced values.

        Cost: O(1) when already compact, else O(B) for new offsets; values stay a view.
        """
        first, last = int(self.offsets[0]), int(self.offsets[-1])
        if first == 0 and last == len(self.values):
            return self
        return self._unchecked(self.values[first:last], self.offsets - first)

    def take(self, indices: Any) -> Jagged:
        """The samples at ``indices`` (ints, mask or slice), in that order.

        Cost: O(k + items taken), one vectorized gather of values (a copy).
        """
        positions = as_positions(indices, len(self))
        if isinstance(positions, slice):
            return self[positions]
        starts = self.offsets[positions]
        lengths = self.offsets[positions + 1] - starts
        offsets = np.zeros(len(positions) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        # Item i of the result comes from values[starts[s] + (i - offsets[s])] for its sample s.
        source = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
        return self._unchecked(self.values[source], offsets)

    @classmethod
    def concat(cls, parts: Sequence[Jagged]) -> Jagged:
        """Samples of all ``parts`` in order. Cost: O(B + N), one copy of values."""
        if not parts:
            raise ValueError("Jagged.concat needs at least one part")
        compact = [p.compact() for p in parts]
        shapes = {p.item_shape for p in compact}
        if len(shapes) != 1:
            raise ValueError(f"Jagged.concat: item shapes differ: {sorted(shapes)}")
        values = np.concatenate([p.values for p in compact])
        offsets = np.zeros(sum(len(p) for p in compact) + 1, dtype=np.int64)
        at, base = 1, 0
        for p in compact:
            offsets[at : at + len(p)] = p.offsets[1:] + base
            at += len(p)
            base += len(p.values)
        return cls._unchecked(values, offsets)

    @classmethod
    def _unchecked(cls, values: np.ndarray, offsets: npt.NDArray[np.int64]) -> Jagged:
        """Build without validation, for offsets derived from valid ones."""
        obj = cls.__new__(cls)
        obj.values = values
        obj.offsets = offsets
        return obj


def offsets_problem(offsets: npt.NDArray[np.int64], num_values: int) -> str | None:
    """What is wrong with int64 ``offsets`` over ``num_values`` items, or None. Cost: O(B)."""
    if offsets[0] < 0:
        return f"start at {int(offsets[0])}, expected >= 0"
    if offsets[-1] > num_values:
        return f"end at {int(offsets[-1])}, past the {num_values} values"
    if len(offsets) > 1 and not (offsets[1:] >= offsets[:-1]).all():
        at = int(np.argmax(offsets[1:] < offsets[:-1]))
        return f"decrease at sample {at}: {int(offsets[at])} -> {int(offsets[at + 1])}"
    return None
