"""``Batch``: a :class:`BatchMeta` plus one column per field; what every reader returns.

Columns are stored as they came (after :func:`normalize_column`): dense
``[B, ...]`` arrays, :class:`Jagged` values + offsets, or lists of objects.
Selecting, chunking and concatenating apply to columns and meta together, at
O(B) per column and no Python object per sample (lists aside). Thread safety:
no Batch method changes the batch, so sharing one between threads is safe as
long as nobody calls ``set_ready``/``add_fields`` on its ``meta``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from zerobatch._column_hints import missing_column
from zerobatch.columnar import frames
from zerobatch.columnar.jagged import Jagged, as_positions
from zerobatch.columnar.meta import BatchMeta, chunk_bounds
from zerobatch.columnar.schema import Column, FieldSchema, normalize_column
from zerobatch.columnar.views import PartitionIds

__all__ = ["Batch", "columns_to_torch"]


class Batch:
    """Columns of B samples and their :class:`BatchMeta` (``batch.meta``).

    Example: ``Batch.from_columns({"x": np.zeros((2, 3))})["x"].shape == (2, 3)``.
    """

    __slots__ = ("_columns", "meta")

    meta: BatchMeta

    def __init__(self, meta: BatchMeta, columns: Mapping[str, Column]) -> None:
        """Pair ``meta`` with ``columns`` already normalized; they must match its schema.

        Prefer :meth:`from_columns`, which infers the schema. Cost: O(F).
        """
        if list(columns) != meta.field_names:
            raise ValueError(f"columns {list(columns)} do not match fields {meta.field_names}")
        for name, column in columns.items():
            _check_column(name, column, meta.field_schema[name], len(meta))
        self.meta = meta
        self._columns = dict(columns)

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any], meta: BatchMeta | None = None) -> Batch:
        """Build from columns, inferring each field's schema from the column itself.

        Columns: NumPy arrays or torch tensors ``[B, ...]`` (CPU memory is shared,
        not copied), jagged-layout nested tensors or :class:`Jagged`, lists of
        objects. All must have the same B. Without ``meta``, samples get global
        indexes 0..B-1, partition ``""`` and are ready; with ``meta`` (B samples),
        its samples, status and extras are kept and its schema replaced.
        Cost: O(F) + O(B) per jagged column.
        """
        stored: dict[str, Column] = {}
        schema: dict[str, FieldSchema] = {}
        for name, column in columns.items():
            stored[name], schema[name] = normalize_column(name, column)
        rows = {name: len(c) for name, c in stored.items()}
        if len(set(rows.values())) > 1:
            raise ValueError(f"columns disagree on the batch size: {rows}")
        size = next(iter(rows.values()), 0 if meta is None else len(meta))
        if meta is None:
            meta = BatchMeta(np.arange(size, dtype=np.int64), production_status=np.ones(size))
        elif len(meta) != size:
            raise ValueError(f"meta has {len(meta)} samples, columns have {size}")
        return cls(meta.with_schema(schema), stored)

    @classmethod
    def _trusted(
        cls, columns: dict[str, Column], indexes: np.ndarray, schema: dict[str, FieldSchema]
    ) -> Batch:
        """Internal fast path for readers that build columns known to be valid.

        ``columns`` must be stored columns (what :func:`normalize_column` returns:
        little-endian ndarrays, :class:`Jagged` with valid int64 offsets, lists),
        ``schema`` exactly what :meth:`from_columns` would infer for them, in the
        same order, and ``indexes`` an int64 vector of their B global indexes.
        Samples are ready, in partition ``""``. Nothing is checked or copied:
        the caller owns correctness, so tests must compare its batches with
        ``from_columns``. Cost: O(1) + one int8 and one int32 array of B.
        """
        rows = indexes.shape[0]
        ready = np.empty(rows, dtype=np.int8)
        ready.fill(1)  # np.ones, without its Python-level wrapper (~0.4 us)
        partitions = PartitionIds(np.zeros(rows, dtype=np.int32), ("",))  # .of("", rows)
        meta = BatchMeta._build(indexes, partitions, ready, schema, {}, {})
        batch = cls.__new__(cls)
        batch.meta = meta
        batch._columns = columns
        return batch

    def __len__(self) -> int:
        return len(self.meta)

    def __getitem__(self, name: str) -> Column:
        """The column ``name`` as stored: an ndarray, a Jagged or a list."""
        try:
            return self._columns[name]
        except KeyError:
            raise KeyError(missing_column(name, self.fields)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    @property
    def fields(self) -> list[str]:
        """Field names in column order."""
        return list(self._columns)

    def __repr__(self) -> str:
        return f"Batch(size={len(self)}, fields={self.fields})"

    def to_numpy(self) -> dict[str, Column]:
        """name -> column (ndarray, Jagged or list), shared with the batch. Cost: O(F)."""
        return dict(self._columns)

    def to_torch(
        self,
        *,
        pin_memory: bool = False,
        device: Any = None,
        jagged: Literal["nested", "offsets"] = "nested",
    ) -> dict[str, Any]:
        """name -> tensor; lists stay lists.

        Dense columns share memory with the batch (``torch.from_numpy``) unless
        ``pin_memory`` (one copy into pinned memory) or ``device`` asks for a
        copy. Jagged columns become nested tensors in the jagged layout, or with
        ``jagged="offsets"`` a ``(values, offsets)`` pair of tensors. Tensors
        over received frames are read-only memory: do not write into them.
        Cost: O(F), plus the copies asked for.
        """
        return columns_to_torch(self._columns, pin_memory=pin_memory, device=device,
                                jagged=jagged)

    def select(self, indices: Any) -> Batch:
        """The samples at positions ``indices`` (ints, mask or slice), in that order.

        Cost: O(k) per dense column (a view for a slice), O(k + items) per
        jagged column, O(k) per list.
        """
        positions = as_positions(indices, len(self))
        columns: dict[str, Column] = {}
        for name, column in self._columns.items():
            if isinstance(column, Jagged):
                columns[name] = column.take(positions)
            elif isinstance(column, list):
                if isinstance(positions, slice):
                    columns[name] = column[positions]
                else:
                    columns[name] = [column[i] for i in positions.tolist()]
            else:
                columns[name] = column[positions]
        return Batch(self.meta.select(positions), columns)

    def select_fields(self, names: Sequence[str]) -> Batch:
        """Only the fields ``names``, in that order (columns shared). Cost: O(F)."""
        meta = self.meta.select_fields(names)
        return Batch(meta, {n: self._columns[n] for n in names})

    def chunk(self, n: int) -> list[Batch]:
        """``n`` consecutive parts, sizes as :meth:`BatchMeta.chunk`; all columns are views.

        Cost: O(n * F) (list columns: O(B) in total).
        """
        return [self.select(slice(a, b)) for a, b in chunk_bounds(len(self), n)]

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        """All samples of ``batches`` in order; fields must agree (as BatchMeta.concat).

        Cost: O(B) per column (one copy of each).
        """
        meta = BatchMeta.concat([b.meta for b in batches])
        columns: dict[str, Column] = {}
        for name in meta.field_names:
            parts = [b._columns[name] for b in batches]
            first = parts[0]
            if isinstance(first, Jagged):
                columns[name] = Jagged.concat(parts)  # type: ignore[arg-type]
            elif isinstance(first, list):
                columns[name] = [x for part in parts for x in part]
            else:
                columns[name] = np.concatenate(parts)  # type: ignore[arg-type]
        return cls(meta, columns)

    def to_frames(self) -> list[Any]:
        """Exactly ``len(fields) + 1`` buffers: a msgpack header, then one per column.

        See :mod:`zerobatch.columnar.frames` for the layout. Dense columns are not
        copied; each jagged column is packed once. Cost: O(B) + O(F) + jagged bytes.
        """
        return frames.encode(self.meta, self._columns)

    @classmethod
    def from_frames(cls, buffers: Sequence[Any]) -> Batch:
        """Rebuild from :meth:`to_frames`'s buffers; arrays view them (no copy).

        Raises FormatError naming the frame and field for anything malformed.
        """
        meta, columns = frames.decode(buffers)
        return cls(meta, columns)


def _check_column(name: str, column: Column, field: FieldSchema, rows: int) -> None:
    """ValueError unless ``column`` is what ``field`` describes, with ``rows`` samples."""
    if field.kind == "dense":
        ok = isinstance(column, np.ndarray) and column.shape[1:] == field.item_shape
    elif field.kind == "jagged":
        ok = isinstance(column, Jagged) and column.item_shape == field.item_shape
    else:
        ok = isinstance(column, list)
    if not ok or (field.kind != "objects" and column.dtype != field.dtype):  # type: ignore[union-attr]
        raise ValueError(f"field {name!r}: column {column!r:.80} does not match {field}")
    if len(column) != rows:
        raise ValueError(f"field {name!r}: {len(column)} samples, expected {rows}")


def _quiet_fx_notice() -> None:
    """Spend torch's one-time ``is_fx_tracing`` log line (printed on the first
    nested tensor built, a notice about torch's own API) with the logger muted:
    zerobatch's default path prints nothing."""
    global _fx_notice_spent
    if _fx_notice_spent:
        return
    _fx_notice_spent = True
    import importlib
    import logging

    try:
        module = importlib.import_module("torch.fx._symbolic_trace")
    except ImportError:
        return
    notice = getattr(module, "is_fx_tracing_warning", None)
    if notice is None:
        return
    log = logging.getLogger(module.__name__)
    disabled, log.disabled = log.disabled, True
    try:
        notice()
    finally:
        log.disabled = disabled


_fx_notice_spent = False


def columns_to_torch(
    columns: Mapping[str, Any],
    *,
    pin_memory: bool = False,
    device: Any = None,
    jagged: Literal["nested", "offsets"] = "nested",
) -> dict[str, Any]:
    """``Batch.to_torch`` of a name -> column mapping (ndarrays, ``Jagged``,
    lists); anything else (a host int) is passed through as it is. Cost: ~1.5
    us a C-contiguous writable column on the CPU (a view: nothing is copied)."""
    if jagged not in ("nested", "offsets"):
        raise ValueError(f"jagged must be 'nested' or 'offsets', got {jagged!r}")
    import torch

    moved = pin_memory or device is not None
    result: dict[str, Any] = {}
    for name, column in columns.items():
        if isinstance(column, np.ndarray):
            flags = column.flags
            if moved or not (flags.c_contiguous and flags.writeable):
                result[name] = _tensor(torch, column, pin_memory, device)
            else:  # the Loader's columns: a view of its arena, nothing to check
                try:
                    result[name] = torch.from_numpy(column)
                except ValueError:  # "contiguous" with odd strides (a dimension of 1)
                    result[name] = _tensor(torch, column, pin_memory, device)
        elif isinstance(column, Jagged):
            compact = column.compact()
            values = _tensor(torch, np.ascontiguousarray(compact.values), pin_memory, device)
            offsets = _tensor(torch, compact.offsets, pin_memory, device)
            if jagged == "offsets":
                result[name] = (values, offsets)
            else:
                _quiet_fx_notice()
                result[name] = torch.nested.nested_tensor_from_jagged(values, offsets)
        else:
            result[name] = column
    return result


def _tensor(torch: Any, array: np.ndarray, pin_memory: bool, device: Any) -> Any:
    """``array`` as a tensor (a view where torch can hold one), pinned, on ``device``."""
    if any(s < 0 or s % array.itemsize for s in array.strides):
        # torch cannot view negative strides, nor strides that are not whole
        # items (a token column of records with other fields, dtype="stored");
        # a copy, as NumPy calls an array with a dimension of 1 contiguous
        # whatever its strides (np.ascontiguousarray would return it as it is)
        array = array.copy()
    if array.flags.writeable:  # the usual case: no warnings state to touch (~3 us)
        out = torch.from_numpy(array)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            out = torch.from_numpy(array)
    if pin_memory:
        out = out.pin_memory()
    if device is not None:
        out = out.to(device, non_blocking=pin_memory)
    return out
