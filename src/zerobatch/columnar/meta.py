"""``BatchMeta``: seed 002's columnar batch metadata, O(B) + O(F) in every operation.

Per-sample facts live in three NumPy arrays of length B (global indexes,
partition codes, production status); per-field facts live once per field in a
:class:`FieldSchema`. No operation builds a Python object per sample, except
the deprecated :attr:`BatchMeta.samples` view, which builds them on access.

Instances share arrays with the metas they were sliced from, so no method
writes into an array in place: ``set_ready`` and ``add_fields`` replace it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from itertools import pairwise
from types import MappingProxyType
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from zerobatch.columnar.jagged import as_positions
from zerobatch.columnar.legacy import Samples, SampleView
from zerobatch.columnar.schema import DTYPES, KINDS, FieldSchema, normalize_column
from zerobatch.columnar.views import IndexList, PartitionIds
from zerobatch.columnar.wire import expect, pack, read_array, unpack
from zerobatch.errors import FormatError

__all__ = ["BatchMeta", "chunk_bounds"]

_MAX_NDIM = 32
_MAX_SAMPLE_ITEMS = 1 << 48  # product of the non-zero dims a header may declare (NumPy overflows)
_warned_samples = False


class BatchMeta:
    """Which samples a batch holds, whether each is produced, and each field's schema.

    Args:
        global_indexes: int per sample (B of them), kept as an int64 array.
        partition_ids: one partition name for all samples, or one per sample.
        production_status: int8 per sample, 1 = ready, 0 = not; all 0 if omitted.
        field_schema: name -> :class:`FieldSchema`.
        extra_info: batch-level payload (msgpack-able to travel).
        custom_meta: global index -> dict, for storage backends (sparse).

    Reads like the seed: ``meta.global_indexes`` and ``meta.partition_ids`` are
    read-only lists backed by arrays, ``meta.production_status`` a read-only
    int8 array, ``meta.field_schema[name]['dtype']`` works.

    Thread safety: reading is safe; ``set_ready`` and ``add_fields`` change this
    object (never the arrays it shares), so do not call them while another
    thread uses it. Metas made from it by ``select``/``chunk`` are unaffected.
    """

    __slots__ = (
        "_indexes",
        "_partitions",
        "_ready",
        "_schema",
        "_status",
        "custom_meta",
        "extra_info",
    )

    def __init__(
        self,
        global_indexes: Any,
        *,
        partition_ids: str | Sequence[str] = "",
        production_status: Any = None,
        field_schema: Mapping[str, FieldSchema] | None = None,
        extra_info: dict[str, Any] | None = None,
        custom_meta: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        indexes = np.asarray(global_indexes)
        if indexes.size == 0:
            indexes = indexes.astype(np.int64).reshape(0)
        if indexes.ndim != 1 or not np.issubdtype(indexes.dtype, np.integer):
            raise ValueError(
                f"global_indexes must be 1-D ints, got {indexes.dtype} {indexes.shape}"
            )
        rows = len(indexes)
        if production_status is None:
            status = np.zeros(rows, dtype=np.int8)
        else:
            status = np.asarray(production_status).astype(np.int8, copy=False)
            if status.shape != (rows,):
                raise ValueError(f"production_status has shape {status.shape}, expected ({rows},)")
        schema = dict(field_schema or {})
        for name, field in schema.items():
            if field.lengths is not None and len(field.lengths) != rows:
                raise ValueError(f"field {name!r}: {len(field.lengths)} lengths for {rows} samples")
        self._indexes: npt.NDArray[np.int64] = indexes.astype(np.int64, copy=False)
        self._partitions = PartitionIds.of(partition_ids, rows)
        self._status: npt.NDArray[np.int8] = status
        self._schema: dict[str, FieldSchema] = schema
        self._ready: bool | None = None
        self.extra_info: dict[str, Any] = dict(extra_info or {})
        self.custom_meta: dict[int, dict[str, Any]] = dict(custom_meta or {})

    @classmethod
    def _build(
        cls,
        indexes: npt.NDArray[np.int64],
        partitions: PartitionIds,
        status: npt.NDArray[np.int8],
        schema: dict[str, FieldSchema],
        extra_info: dict[str, Any],
        custom_meta: dict[int, dict[str, Any]],
    ) -> BatchMeta:
        """Assemble from parts already checked (no validation, no copies)."""
        meta = cls.__new__(cls)
        meta._indexes = indexes
        meta._partitions = partitions
        meta._status = status
        meta._schema = schema
        meta._ready = None
        meta.extra_info = extra_info
        meta.custom_meta = custom_meta
        return meta

    # -- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._indexes)

    @property
    def size(self) -> int:
        """B, the number of samples."""
        return len(self._indexes)

    @property
    def global_indexes(self) -> IndexList:
        """Read-only ``list[int]`` view; ``np.asarray`` of it shares the int64 array."""
        return IndexList(self._indexes)

    @property
    def partition_ids(self) -> PartitionIds:
        """Read-only ``list[str]`` view (int32 codes into a few names)."""
        return self._partitions

    @property
    def production_status(self) -> npt.NDArray[np.int8]:
        """Read-only int8 array (B,): 1 = ready. Change it with :meth:`set_ready`."""
        view = self._status.view()
        view.flags.writeable = False
        return view

    @property
    def field_schema(self) -> Mapping[str, FieldSchema]:
        """Read-only name -> :class:`FieldSchema`, in field order."""
        return MappingProxyType(self._schema)

    @property
    def field_names(self) -> list[str]:
        """Field names in order. Cost: O(F)."""
        return list(self._schema)

    @property
    def is_ready(self) -> bool:
        """True when every sample is produced (True for B = 0). Cost: O(B) once, then cached."""
        if self._ready is None:
            self._ready = bool(np.all(self._status != 0))
        return self._ready

    def __repr__(self) -> str:
        return (
            f"BatchMeta(size={len(self)}, fields={self.field_names}, "
            f"ready={int(np.count_nonzero(self._status))}/{len(self)})"
        )

    # -- changing ------------------------------------------------------------------------

    def set_ready(self, indices: Any = None, *, ready: bool = True) -> None:
        """Mark the samples at positions ``indices`` (all if None) ready, or not ready.

        Positions are 0..B-1 (ints, a boolean mask or a slice), not global indexes.
        Cost: O(B) (the status array is replaced, never written in place).
        """
        status = self._status.copy()
        status[slice(None) if indices is None else as_positions(indices, len(self))] = int(ready)
        self._status = status
        self._ready = None

    def add_fields(self, columns: Mapping[str, Any], *, ready: bool = True) -> BatchMeta:
        """Add (or replace) fields, inferring each schema from its column; returns self.

        Columns: NumPy arrays or torch tensors ``[B, ...]``, jagged-layout nested
        tensors, :class:`Jagged`, or lists of objects (see ``normalize_column``).
        Marks every sample ready unless ``ready=False``.
        Cost: O(F) for dense and object columns, plus O(B) per jagged column
        (its lengths, one vectorized ``diff``).
        """
        schema = dict(self._schema)
        for name, column in columns.items():
            stored, field = normalize_column(name, column)
            if len(stored) != len(self):
                raise ValueError(f"field {name!r}: {len(stored)} samples, expected {len(self)}")
            schema[name] = field
        self._schema = schema
        if ready:
            self._status = np.ones(len(self), dtype=np.int8)
            self._ready = True
        return self

    def with_schema(self, field_schema: Mapping[str, FieldSchema]) -> BatchMeta:
        """The same samples with ``field_schema`` in place of this schema. Cost: O(F)."""
        for name, field in field_schema.items():
            if field.lengths is not None and len(field.lengths) != len(self):
                raise ValueError(
                    f"field {name!r}: {len(field.lengths)} lengths for {len(self)} samples"
                )
        return BatchMeta._build(
            self._indexes,
            self._partitions,
            self._status,
            dict(field_schema),
            dict(self.extra_info),
            dict(self.custom_meta),
        )

    # -- selecting -----------------------------------------------------------------------

    def select(self, indices: Any) -> BatchMeta:
        """The samples at positions ``indices`` (ints, mask or slice), in that order.

        Cost: O(k) for the arrays (views for a slice) + O(F) + O(len(custom_meta)).
        """
        positions = as_positions(indices, len(self))
        indexes = self._indexes[positions]
        custom: dict[int, dict[str, Any]] = {}
        if self.custom_meta:
            keys = np.fromiter(self.custom_meta, dtype=np.int64, count=len(self.custom_meta))
            kept = keys[np.isin(keys, indexes)].tolist()
            custom = {k: self.custom_meta[k] for k in kept}
        return BatchMeta._build(
            indexes,
            self._partitions.take(positions),
            self._status[positions],
            {name: field.take(positions) for name, field in self._schema.items()},
            dict(self.extra_info),
            custom,
        )

    def select_fields(self, names: Sequence[str]) -> BatchMeta:
        """Only the fields ``names``, in that order; samples are shared. Cost: O(F)."""
        missing = [n for n in names if n not in self._schema]
        if missing:
            raise KeyError(f"unknown fields {missing}; fields are {self.field_names}")
        return BatchMeta._build(
            self._indexes,
            self._partitions,
            self._status,
            {n: self._schema[n] for n in names},
            dict(self.extra_info),
            dict(self.custom_meta),
        )

    @overload
    def __getitem__(self, key: int) -> SampleView: ...
    @overload
    def __getitem__(self, key: slice) -> BatchMeta: ...
    def __getitem__(self, key: int | slice) -> SampleView | BatchMeta:
        """An int gives a lazy read-only sample view; a slice gives a BatchMeta (views)."""
        if isinstance(key, slice):
            return self.select(key)
        n = len(self)
        if not -n <= key < n:
            raise IndexError(f"sample {key} out of range for {n} samples")
        return SampleView(self, key % n)

    def chunk(self, n: int) -> list[BatchMeta]:
        """Split into ``n`` consecutive parts whose sizes differ by at most one.

        The first ``B % n`` parts get one more sample (like ``np.array_split``);
        parts may be empty when ``n > B``. Cost: O(n * F) plus the split of
        ``custom_meta``; arrays are sliced, not copied.
        """
        return [self.select(slice(a, b)) for a, b in chunk_bounds(len(self), n)]

    @classmethod
    def concat(cls, metas: Sequence[BatchMeta]) -> BatchMeta:
        """All samples of ``metas`` in order; their fields must agree.

        ``extra_info`` and ``custom_meta`` are merged, later metas winning.
        Cost: O(B) array concatenation + O(len(metas) * F).
        """
        if not metas:
            raise ValueError("BatchMeta.concat needs at least one meta")
        first = metas[0]
        schema: dict[str, FieldSchema] = {}
        for name, field in first._schema.items():
            parts: list[Any] = []
            for i, meta in enumerate(metas):
                other = meta._schema.get(name)
                if other is None or not other.same_layout(field):
                    raise ValueError(
                        f"BatchMeta.concat: field {name!r} of meta {i} is {other}, expected {field}"
                    )
                parts.append(other.lengths)
            if field.lengths is not None:
                lengths = np.concatenate(parts)
                field = FieldSchema(field.kind, field.dtype, field.item_shape, lengths)
            schema[name] = field
        for i, meta in enumerate(metas):
            if len(meta._schema) != len(schema):
                extra = sorted(set(meta._schema) - set(schema))
                raise ValueError(f"BatchMeta.concat: meta {i} has fields {extra} the first lacks")
        extra_info: dict[str, Any] = {}
        custom: dict[int, dict[str, Any]] = {}
        for meta in metas:
            extra_info.update(meta.extra_info)
            custom.update(meta.custom_meta)
        return cls._build(
            np.concatenate([m._indexes for m in metas]),
            PartitionIds.concat([m._partitions for m in metas]),
            np.concatenate([m._status for m in metas]),
            schema,
            extra_info,
            custom,
        )

    def union(self, other: BatchMeta) -> BatchMeta:
        """The fields of both over the same samples; a sample is ready only if ready in both.

        ``other``'s fields, ``extra_info`` and ``custom_meta`` entries win.
        Both must hold the same global indexes and partition ids in the same order.
        Cost: O(B) + O(F) + O(len(custom_meta)).
        """
        if not np.array_equal(self._indexes, other._indexes):
            raise ValueError(
                f"BatchMeta.union: global indexes differ ({len(self)} vs {len(other)} samples)"
            )
        if not self._partitions.same_as(other._partitions):
            raise ValueError("BatchMeta.union: partition ids differ")
        custom = {k: dict(v) for k, v in self.custom_meta.items()}
        for key, value in other.custom_meta.items():
            custom.setdefault(key, {}).update(value)
        status = ((self._status != 0) & (other._status != 0)).astype(np.int8)
        return BatchMeta._build(
            self._indexes,
            self._partitions,
            status,
            {**self._schema, **other._schema},
            {**self.extra_info, **other.extra_info},
            custom,
        )

    # -- compatibility -------------------------------------------------------------------

    @property
    def samples(self) -> Sequence[SampleView]:
        """Deprecated: a lazy list of read-only per-sample views (seed 002, option B).

        Warns once per process. Each access builds one view: O(F) per sample read.
        """
        global _warned_samples
        if not _warned_samples:
            _warned_samples = True
            warnings.warn(
                "BatchMeta.samples is deprecated; read the columns instead "
                "(global_indexes, production_status, field_schema)",
                DeprecationWarning,
                stacklevel=2,
            )
        return Samples(self)

    # -- wire ----------------------------------------------------------------------------

    def to_wire(self, *, lengths: bool = True) -> dict[str, Any]:
        """A msgpack-able dict: arrays as raw little-endian bytes, schema as lists.

        ``lengths=False`` leaves out jagged lengths (a Batch's offsets carry them).
        Cost: O(B) bytes copied + O(F) + O(len(custom_meta)).
        """
        fields = [
            [
                name,
                f.kind,
                f.dtype if isinstance(f.dtype, str) else f.dtype.str,
                list(f.item_shape),
                f.lengths.astype("<i8", copy=False).tobytes()
                if lengths and f.lengths is not None
                else None,
            ]
            for name, f in self._schema.items()
        ]
        return {
            "global_indexes": self._indexes.astype("<i8", copy=False).tobytes(),
            "partition_names": list(self._partitions.names),
            "partition_codes": self._partitions.codes.astype("<i4", copy=False).tobytes(),
            "production_status": self._status.tobytes(),
            "fields": fields,
            "extra_info": self.extra_info,
            "custom_meta": [[k, v] for k, v in self.custom_meta.items()],
        }

    @classmethod
    def from_wire(cls, wire: Any, *, where: str) -> BatchMeta:
        """Rebuild from :meth:`to_wire`'s dict, checking every key and size.

        Arrays view the received bytes (no copy). Jagged fields sent without
        lengths get ``lengths=None``; the caller fills them in.
        Raises FormatError naming ``where`` and the field.
        """
        raw = expect(wire, "global_indexes", bytes, where=where, field="global_indexes")
        rows, rest = divmod(len(raw), 8)
        if rest:
            raise FormatError(
                f"{len(raw)} bytes is not a whole number of int64",
                path=where,
                field="global_indexes",
            )
        indexes = read_array(raw, np.dtype("<i8"), rows, where=where, field="global_indexes")
        status = read_array(
            expect(wire, "production_status", bytes, where=where, field="production_status"),
            np.dtype("i1"),
            rows,
            where=where,
            field="production_status",
        )
        names = expect(wire, "partition_names", list, where=where, field="partition_names")
        if not all(isinstance(n, str) for n in names):
            raise FormatError(
                "partition names must be strings", path=where, field="partition_names"
            )
        codes = read_array(
            expect(wire, "partition_codes", bytes, where=where, field="partition_codes"),
            np.dtype("<i4"),
            rows,
            where=where,
            field="partition_codes",
        )
        if rows and int(codes.view(np.uint32).max()) >= len(names):  # negatives wrap high
            raise FormatError(
                f"partition codes outside [0, {len(names)})", path=where, field="partition_codes"
            )
        extra_info = expect(wire, "extra_info", dict, where=where, field="extra_info")
        custom: dict[int, dict[str, Any]] = {}
        for entry in expect(wire, "custom_meta", list, where=where, field="custom_meta"):
            if (
                not isinstance(entry, list)
                or len(entry) != 2
                or not isinstance(entry[0], int)
                or not isinstance(entry[1], dict)
            ):
                raise FormatError("entries must be [int, map]", path=where, field="custom_meta")
            custom[entry[0]] = entry[1]
        schema: dict[str, FieldSchema] = {}
        for entry in expect(wire, "fields", list, where=where, field="fields"):
            name, field = _field_from_wire(entry, rows, where=where)
            if name in schema:
                raise FormatError("field listed twice", path=where, field=name)
            schema[name] = field
        return cls._build(
            indexes.astype(np.int64, copy=False),
            PartitionIds(codes.astype(np.int32, copy=False), tuple(names)),
            status.astype(np.int8, copy=False),
            schema,
            extra_info,
            custom,
        )

    def to_bytes(self) -> bytes:
        """The metadata alone as one msgpack message (no pickle). Cost: O(B) + O(F)."""
        return pack(self.to_wire())

    @classmethod
    def from_bytes(cls, buffer: Any) -> BatchMeta:
        """Inverse of :meth:`to_bytes`; FormatError for anything malformed."""
        return cls.from_wire(unpack(buffer, where="meta", field="meta"), where="meta")


def _field_from_wire(entry: Any, rows: int, *, where: str) -> tuple[str, FieldSchema]:
    """One ``[name, kind, dtype, item_shape, lengths]`` schema entry, checked."""
    if not isinstance(entry, list) or len(entry) != 5 or not isinstance(entry[0], str):
        raise FormatError(
            "field entries must be [name, kind, dtype, shape, lengths]", path=where, field="fields"
        )
    name, kind, dtype_name, shape, raw_lengths = entry
    if not isinstance(kind, str) or kind not in KINDS:
        raise FormatError(
            f"unknown kind {kind!r:.80}, expected one of {KINDS}", path=where, field=name
        )
    if type(shape) is not list or len(shape) > _MAX_NDIM:
        raise FormatError(f"bad shape {shape!r}", path=where, field=name)
    items = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise FormatError(f"bad shape {shape!r}", path=where, field=name)
        items *= d or 1
    if items > _MAX_SAMPLE_ITEMS:
        raise FormatError(f"bad shape {shape!r}: too many items", path=where, field=name)
    dtype: np.dtype | str
    if kind == "objects":
        if not isinstance(dtype_name, str) or shape:
            raise FormatError(
                "objects fields have a type name and no shape", path=where, field=name
            )
        dtype = dtype_name
    else:
        if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
            raise FormatError(
                f"unknown dtype {dtype_name!r:.80}, expected one of {sorted(DTYPES)}",
                path=where,
                field=name,
            )
        dtype = DTYPES[dtype_name]
    lengths = None
    if kind == "jagged" and raw_lengths is not None:
        if not isinstance(raw_lengths, bytes):
            raise FormatError("lengths must be bytes", path=where, field=name)
        lengths = read_array(raw_lengths, np.dtype("<i8"), rows, where=where, field=name)
        if rows and int(lengths.min()) < 0:
            raise FormatError("negative sample length", path=where, field=name)
        lengths = lengths.astype(np.int64, copy=False)
    elif raw_lengths is not None:
        raise FormatError(f"{kind} fields carry no lengths", path=where, field=name)
    return name, FieldSchema(kind, dtype, tuple(shape), lengths)


def chunk_bounds(rows: int, n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``n`` consecutive parts of ``rows``; the first ``rows % n`` are
    one larger."""
    if n < 1:
        raise ValueError(f"chunk count must be >= 1, got {n}")
    base, extra = divmod(rows, n)
    bounds = [0]
    for i in range(n):
        bounds.append(bounds[-1] + base + (i < extra))
    return list(pairwise(bounds))
