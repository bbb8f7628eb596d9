"""Field schemas, stored once per field, and the column kinds they describe.

A column is one of three kinds:

* ``dense``: an array ``[B, *shape]``; every sample has the same ``shape``.
* ``jagged``: a :class:`Jagged`; sample ``i`` is ``[lengths[i], *item_shape]``.
* ``objects``: a list of B Python objects (strings, dicts, ...).

Only the dtypes in :data:`DTYPES` travel: bool, signed and unsigned 8 to 64-bit
integers, float16/32/64, all little-endian. Inference looks at a column's
dtype, shape and offsets, never at its samples one by one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from zerobatch.columnar.jagged import Jagged

__all__ = ["DTYPES", "KINDS", "Column", "FieldSchema", "PerSampleShapes", "normalize_column"]

DTYPES: dict[str, np.dtype] = {
    np.dtype("<" + code).str: np.dtype("<" + code)
    for code in ("b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8")
}
"""The wire names (``dtype.str``, e.g. ``'<f4'``, ``'|b1'``) of the dtypes a column may hold."""

KINDS = ("dense", "jagged", "objects")
"""The column kinds, in the order the frame header names them."""

Column = np.ndarray | Jagged | list
"""What a :class:`Batch` stores per field."""


_SEED_KEYS = ("dtype", "shape", "is_nested", "is_non_tensor", "per_sample_shapes")


class PerSampleShapes(Sequence[tuple[int, ...]]):
    """Read-only list of per-sample shapes of a jagged field, computed on access.

    Backed by the lengths array: ``shapes[i] == (lengths[i], *item_shape)``.
    """

    __slots__ = ("_item_shape", "_lengths")

    def __init__(self, lengths: npt.NDArray[np.int64], item_shape: tuple[int, ...]) -> None:
        self._lengths = lengths
        self._item_shape = item_shape

    def __len__(self) -> int:
        return len(self._lengths)

    @overload
    def __getitem__(self, i: int) -> tuple[int, ...]: ...
    @overload
    def __getitem__(self, i: slice) -> PerSampleShapes: ...
    def __getitem__(self, i: int | slice) -> tuple[int, ...] | PerSampleShapes:
        if isinstance(i, slice):
            return PerSampleShapes(self._lengths[i], self._item_shape)
        return (int(self._lengths[i]), *self._item_shape)

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return ((n, *self._item_shape) for n in self._lengths.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(
            a == tuple(b) for a, b in zip(self, other, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking sequence, like list

    def __repr__(self) -> str:
        return f"PerSampleShapes({list(self)!r})"


@dataclass(frozen=True, eq=False)
class FieldSchema:
    """What one field holds, stored once per batch (seed 002's ``field_schema``).

    Attributes:
        kind: ``'dense'``, ``'jagged'`` or ``'objects'``.
        dtype: a NumPy dtype from :data:`DTYPES`; for objects, the type name of
            the first sample (``'str'``), or ``'object'`` for an empty column.
        item_shape: dense: the per-sample shape; jagged: the shape of one item
            (``values.shape[1:]``); objects: ``()``.
        lengths: jagged only: items per sample, int64 shape (B,).

    The seed's keys read as attributes and as items: ``s.shape``, ``s['is_nested']``.
    """

    kind: str
    dtype: np.dtype | str
    item_shape: tuple[int, ...] = ()
    lengths: npt.NDArray[np.int64] | None = None

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The per-sample shape of a dense field; None for jagged and objects."""
        return self.item_shape if self.kind == "dense" else None

    @property
    def is_nested(self) -> bool:
        """True for jagged fields (samples of different lengths)."""
        return self.kind == "jagged"

    @property
    def is_non_tensor(self) -> bool:
        """True for objects fields."""
        return self.kind == "objects"

    @property
    def per_sample_shapes(self) -> PerSampleShapes | None:
        """Jagged fields: the list of sample shapes, computed on access. Else None."""
        if self.lengths is None:
            return None
        return PerSampleShapes(self.lengths, self.item_shape)

    def __getitem__(self, key: str) -> Any:
        if key not in _SEED_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """``self[key]`` for the seed's keys, else ``default`` (dict-style reads)."""
        return getattr(self, key) if key in _SEED_KEYS else default

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldSchema):
            return NotImplemented
        same_lengths = (self.lengths is None and other.lengths is None) or (
            self.lengths is not None
            and other.lengths is not None
            and np.array_equal(self.lengths, other.lengths)
        )
        return self.same_layout(other) and same_lengths

    __hash__ = None  # type: ignore[assignment]  # holds an array

    def same_layout(self, other: FieldSchema) -> bool:
        """Same kind, dtype and item shape (per-sample lengths aside). Cost: O(1).

        The type name of an objects field is informational and not compared.
        """
        return (
            self.kind == other.kind
            and (self.kind == "objects" or self.dtype == other.dtype)
            and self.item_shape == other.item_shape
        )

    def take(self, positions: slice | npt.NDArray[np.int64]) -> FieldSchema:
        """The schema of the selected rows (only jagged lengths change). Cost: O(k)."""
        if self.lengths is None:
            return self
        return FieldSchema(self.kind, self.dtype, self.item_shape, self.lengths[positions])


def _canonical_dtype(dtype: np.dtype, name: str) -> np.dtype:
    """The little-endian dtype from :data:`DTYPES` equal to ``dtype``, or TypeError."""
    little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    found = DTYPES.get(little.str)
    if found is None:
        raise TypeError(
            f"field {name!r}: dtype {dtype} cannot travel; use one of {sorted(DTYPES)} "
            "or a list for Python objects"
        )
    return found


def _from_torch(tensor: Any, name: str) -> np.ndarray:
    """A NumPy view of a CPU tensor (a device-to-host copy for others)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        raise TypeError(f"field {name!r}: bfloat16 has no NumPy dtype; cast to float32")
    return tensor.detach().cpu().numpy()


def normalize_column(name: str, column: Any) -> tuple[Column, FieldSchema]:
    """Convert one input column to a stored column and infer its schema.

    Accepts a NumPy array ``[B, ...]`` (object and string arrays become lists),
    a torch tensor (dense, or nested in the jagged layout: its values and
    offsets are used as they are, never unbound), a :class:`Jagged`, or a list
    or tuple of Python objects. Cost: O(1) for arrays and tensors (CPU tensors
    are shared, not copied), O(B) for jagged lengths and for tuples.
    """
    if isinstance(column, Jagged):
        dtype = _canonical_dtype(column.dtype, name)
        if dtype != column.dtype:
            # Big-endian input: one copy so every column is little-endian on the wire.
            column = Jagged(column.values.astype(dtype), column.offsets)
        return column, FieldSchema("jagged", dtype, column.item_shape, column.lengths)
    if isinstance(column, list | tuple):
        column = list(column)
        head = type(column[0]).__name__ if column else "object"
        return column, FieldSchema("objects", head)
    if type(column).__module__.startswith("torch"):
        if type(column).__name__ == "NestedTensor" or column.is_nested:
            return normalize_column(name, _nested_to_jagged(column, name))
        column = _from_torch(column, name)
    if not isinstance(column, np.ndarray):
        raise TypeError(
            f"field {name!r}: expected an ndarray, a torch tensor, a Jagged or a list, "
            f"got {type(column).__name__}"
        )
    if column.ndim == 0:
        raise ValueError(f"field {name!r}: a 0-d array has no batch dimension")
    if column.dtype.kind in "OUS":
        return normalize_column(name, list(column))
    dtype = _canonical_dtype(column.dtype, name)
    if dtype != column.dtype:
        column = column.astype(dtype)  # big-endian input: one copy, as above
    return column, FieldSchema("dense", dtype, tuple(column.shape[1:]))


def _nested_to_jagged(tensor: Any, name: str) -> Jagged:
    """A Jagged over a jagged-layout nested tensor's values and offsets (no unbind).

    Reads the tensor's ``_values``/``_offsets`` slots where they exist: the public
    ``values()`` goes through torch dispatch and costs ~100 µs per call.
    """
    import torch

    if type(tensor).__name__ != "NestedTensor" and tensor.layout != torch.jagged:
        raise TypeError(
            f"field {name!r}: nested tensors must use layout=torch.jagged "
            "(torch.nested.as_nested_tensor(..., layout=torch.jagged))"
        )
    values = getattr(tensor, "_values", None)
    offsets = getattr(tensor, "_offsets", None)
    if values is None or offsets is None:
        values, offsets = tensor.values(), tensor.offsets()
    if getattr(tensor, "_ragged_idx", 1) != 1 or getattr(tensor, "_lengths", None) is not None:
        raise ValueError(
            f"field {name!r}: only nested tensors ragged in dim 1 without holes are supported; "
            "call .contiguous() first"
        )
    return Jagged(_from_torch(values, name), _from_torch(offsets, name))
