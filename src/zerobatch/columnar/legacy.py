"""Seed 002's compatibility layer (option B): read-only per-sample views of a BatchMeta.

Built on access, one small object per sample read; for migrating code that
iterated ``batch.samples``, never for hot paths.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol, overload

import numpy as np
import numpy.typing as npt

from zerobatch.columnar.schema import FieldSchema

__all__ = ["SampleField", "SampleView", "Samples"]


class _Rows(Protocol):
    """What the views read of a ``BatchMeta`` (which imports this module)."""

    def __len__(self) -> int: ...
    @property
    def global_indexes(self) -> Sequence[int]: ...
    @property
    def partition_ids(self) -> Sequence[str]: ...
    @property
    def production_status(self) -> npt.NDArray[np.int8]: ...
    @property
    def field_schema(self) -> Mapping[str, FieldSchema]: ...
    @property
    def custom_meta(self) -> Mapping[int, Mapping[str, Any]]: ...
    def select(self, indices: Any) -> _Rows: ...
    def __getitem__(self, key: int) -> SampleView: ...


class SampleField:
    """One field as seen by one sample (legacy ``FieldMeta``): a snapshot."""

    __slots__ = ("dtype", "is_nested", "is_non_tensor", "name", "shape")

    def __init__(self, name: str, field: FieldSchema, row: int) -> None:
        self.name = name
        self.dtype = field.dtype
        self.is_nested = field.is_nested
        self.is_non_tensor = field.is_non_tensor
        shapes = field.per_sample_shapes
        self.shape = shapes[row] if shapes is not None else field.shape

    def __repr__(self) -> str:
        return f"SampleField({self.name!r}, dtype={self.dtype}, shape={self.shape})"


class SampleView:
    """One sample of a BatchMeta (legacy ``SampleMeta``): read-only, built on access."""

    __slots__ = ("_meta", "_row")

    def __init__(self, meta: _Rows, row: int) -> None:
        self._meta = meta
        self._row = row

    @property
    def global_index(self) -> int:
        """The sample's global index."""
        return self._meta.global_indexes[self._row]

    @property
    def partition_id(self) -> str:
        """The sample's partition."""
        return self._meta.partition_ids[self._row]

    @property
    def production_status(self) -> int:
        """1 if produced, else 0."""
        return int(self._meta.production_status[self._row])

    @property
    def is_ready(self) -> bool:
        """True if produced."""
        return self.production_status != 0

    @property
    def fields(self) -> Mapping[str, SampleField]:
        """Read-only name -> this sample's view of the field. Cost: O(F)."""
        schema = self._meta.field_schema
        return MappingProxyType({n: SampleField(n, f, self._row) for n, f in schema.items()})

    @property
    def custom_meta(self) -> Mapping[str, Any]:
        """Read-only: the backend's entry for this sample's global index (empty if none)."""
        return MappingProxyType(self._meta.custom_meta.get(self.global_index, {}))

    def __repr__(self) -> str:
        return f"SampleView(global_index={self.global_index}, ready={self.is_ready})"


class Samples(Sequence[SampleView]):
    """The lazy list behind :attr:`BatchMeta.samples`."""

    __slots__ = ("_meta",)

    def __init__(self, meta: _Rows) -> None:
        self._meta = meta

    def __len__(self) -> int:
        return len(self._meta)

    @overload
    def __getitem__(self, i: int) -> SampleView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[SampleView]: ...
    def __getitem__(self, i: int | slice) -> SampleView | Sequence[SampleView]:
        if isinstance(i, slice):
            return Samples(self._meta.select(i))
        return self._meta[i]

    def __iter__(self) -> Iterator[SampleView]:
        return (SampleView(self._meta, r) for r in range(len(self._meta)))
