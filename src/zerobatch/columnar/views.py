"""Read-only list views over NumPy columns, for fields seed 002 types as lists.

``IndexList`` reads like ``list[int]`` and ``PartitionIds`` like ``list[str]``;
both keep one array inside (``np.asarray(view)`` shares it) and build a Python
object only for the element that is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

__all__ = ["IndexList", "PartitionIds"]


class IndexList(Sequence[int]):
    """A read-only ``list[int]`` over an int64 array (``np.asarray`` shares it)."""

    __slots__ = ("_array",)

    def __init__(self, array: npt.NDArray[np.int64]) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> IndexList: ...
    def __getitem__(self, i: int | slice) -> int | IndexList:
        if isinstance(i, slice):
            return IndexList(self._array[i])
        return int(self._array[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self._array.tolist())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy or (dtype is not None and np.dtype(dtype) != self._array.dtype):
            return self._array.astype(self._array.dtype if dtype is None else dtype)
        view = self._array.view()
        view.flags.writeable = False
        return view

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence | np.ndarray) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and bool(np.array_equal(self._array, np.asarray(other)))

    __hash__ = None  # type: ignore[assignment]  # compares like a list

    def tolist(self) -> list[int]:
        """A plain list (O(B) Python ints)."""
        return list(self._array.tolist())

    def __repr__(self) -> str:
        return f"IndexList({self._array.tolist()!r})"


class PartitionIds(Sequence[str]):
    """A read-only ``list[str]`` stored as int32 codes into a few distinct names."""

    __slots__ = ("codes", "names")

    codes: npt.NDArray[np.int32]
    names: tuple[str, ...]

    def __init__(self, codes: npt.NDArray[np.int32], names: tuple[str, ...]) -> None:
        self.codes = codes
        self.names = names

    @classmethod
    def of(cls, values: str | Sequence[str], rows: int) -> PartitionIds:
        """From one name for all ``rows``, or ``rows`` names. Cost: O(1) / O(B log B) in C."""
        if isinstance(values, PartitionIds) and len(values) == rows:
            return values
        if isinstance(values, str):
            return cls(np.zeros(rows, dtype=np.int32), (values,))
        if len(values) != rows:
            raise ValueError(f"partition_ids has {len(values)} entries, expected {rows}")
        if rows == 0:
            return cls(np.zeros(0, dtype=np.int32), ())
        if not all(isinstance(v, str) for v in values):
            raise TypeError("partition_ids must be strings")
        names, codes = np.unique(np.asarray(values, dtype=object), return_inverse=True)
        return cls(codes.astype(np.int32).reshape(-1), tuple(names.tolist()))

    def same_as(self, other: PartitionIds) -> bool:
        """True if both hold the same ids in the same order. Cost: O(B) vectorized."""
        if len(self) != len(other):
            return False
        if self.names == other.names:
            return bool(np.array_equal(self.codes, other.codes))
        mine = {name: code for code, name in enumerate(self.names)}
        mapping = np.array([mine.get(name, -1) for name in other.names], dtype=np.int32)
        return bool(np.array_equal(mapping[other.codes], self.codes)) if len(self) else True

    def take(self, positions: slice | npt.NDArray[np.int64]) -> PartitionIds:
        """The ids of the selected rows. Cost: O(k)."""
        return PartitionIds(self.codes[positions], self.names)

    @classmethod
    def concat(cls, parts: Sequence[PartitionIds]) -> PartitionIds:
        """All parts' ids in order, with the names merged. Cost: O(B + distinct names)."""
        names: dict[str, int] = {}
        remapped = []
        for part in parts:
            mapping = np.array([names.setdefault(n, len(names)) for n in part.names], np.int32)
            remapped.append(mapping[part.codes] if len(mapping) else part.codes)
        codes = np.concatenate(remapped) if remapped else np.zeros(0, dtype=np.int32)
        return cls(codes.astype(np.int32, copy=False), tuple(names))

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> PartitionIds: ...
    def __getitem__(self, i: int | slice) -> str | PartitionIds:
        if isinstance(i, slice):
            return self.take(i)
        return self.names[int(self.codes[i])]

    def __iter__(self) -> Iterator[str]:
        names = self.names
        return (names[c] for c in self.codes.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # compares like a list

    def __repr__(self) -> str:
        return f"PartitionIds({list(self)!r})"
