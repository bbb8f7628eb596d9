"""The wire codec: a batch of F fields is exactly F + 1 frames. Format version 1.

Frame 0, the header, is one msgpack map (no extension types, at most
:data:`~zerobatch.columnar.wire.MAX_HEADER_BYTES`):

* ``format``: ``"zerobatch.frames"``; ``version``: ``1``.
* ``meta``: :meth:`BatchMeta.to_wire` without jagged lengths: global indexes
  (``<i8`` bytes), partition names and codes (``<i4`` bytes), production
  status (``i1`` bytes), the fields in frame order as
  ``[name, kind, dtype, item_shape, nil]``, ``extra_info``, ``custom_meta``.
* ``columns``: one ``[nbytes, items]`` per field, in the same order.

Frame ``1 + f`` holds field ``f``:

* dense: the ``[B, *shape]`` array, C order, little-endian (``B * prod(shape) * itemsize`` bytes);
* jagged: ``B + 1`` offsets as ``<i8`` starting at 0 and ending at ``items``, then
  the ``[items, *item_shape]`` values; values start at byte ``8 * (B + 1)``, so
  both parts are 8-byte aligned when the frame is;
* objects: one msgpack array of B values.

Readers MUST check every size against the header before viewing a buffer and
MUST NOT unpickle. Decoding views the received buffers with ``np.frombuffer``:
keep the frames alive as long as the arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

import numpy as np

from zerobatch.columnar.jagged import Jagged, offsets_problem
from zerobatch.columnar.meta import BatchMeta
from zerobatch.columnar.schema import Column, FieldSchema
from zerobatch.columnar.wire import expect, pack, read_array, unpack
from zerobatch.errors import FormatError

__all__ = ["FORMAT", "VERSION", "decode", "encode"]

FORMAT = "zerobatch.frames"
"""The header's ``format`` value."""

VERSION = 1
"""The frame format version (independent of the package version)."""

_OFFSET = np.dtype("<i8")


def encode(meta: BatchMeta, columns: Mapping[str, Column]) -> list[Any]:
    """Header bytes plus one buffer per field of ``meta``, in schema order.

    Dense columns are sent as views of their memory (no copy); a jagged column
    is packed into one new buffer (one copy of its values); an objects column
    is msgpack-encoded (str, bytes, int, float, bool, None, lists, maps and types
    given to :func:`~zerobatch.columnar.wire.register_encoder`).
    Cost: O(B) + O(F) + the bytes of jagged and objects columns.
    """
    buffers: list[Any] = []
    layout: list[list[int]] = []
    for name, field in meta.field_schema.items():
        column = columns[name]
        if field.kind == "dense":
            array = np.ascontiguousarray(column)  # a copy only for non-contiguous views
            buffers.append(array.reshape(-1).view(np.uint8).data)
            layout.append([array.nbytes, 0])
        elif field.kind == "jagged":
            assert isinstance(column, Jagged)
            buffer, items = _pack_jagged(column.compact())
            buffers.append(buffer)
            layout.append([len(buffer), items])
        else:
            try:
                payload = pack(list(column))
            except (TypeError, ValueError, OverflowError) as exc:
                raise TypeError(f"field {name!r}: objects must be msgpack-able: {exc}") from exc
            buffers.append(payload)
            layout.append([len(payload), 0])
    try:
        header = pack(
            {
                "format": FORMAT,
                "version": VERSION,
                "meta": meta.to_wire(lengths=False),
                "columns": layout,
            }
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"extra_info and custom_meta must be msgpack-able: {exc}") from exc
    return [header, *buffers]


def _pack_jagged(column: Jagged) -> tuple[bytes | bytearray, int]:
    """One buffer: offsets (from 0) then values. Returns it and the item count."""
    head = len(column.offsets) * _OFFSET.itemsize
    values = np.ascontiguousarray(column.values)
    buffer = bytearray(head + values.nbytes)
    np.frombuffer(buffer, dtype=_OFFSET, count=len(column.offsets))[:] = column.offsets
    # The one copy of this codec: values and offsets must share a frame.
    np.frombuffer(buffer, dtype=np.uint8, offset=head)[:] = values.reshape(-1).view(np.uint8)
    return buffer, len(values)


def decode(frames: Sequence[Any]) -> tuple[BatchMeta, dict[str, Column]]:
    """Inverse of :func:`encode`: arrays view ``frames`` (no copy).

    Raises FormatError naming the frame and field for a wrong frame count, a
    truncated or crafted header, unknown dtypes or kinds, sizes that disagree
    with the schema, and offsets that are not monotonic or out of range.
    Cost: O(B) + O(F) checks + the bytes of objects columns.
    """
    if len(frames) < 1:
        raise FormatError("no frames; expected a header and one frame per field", path="frame 0")
    header = unpack(frames[0], where="frame 0", field="header")
    fmt = expect(header, "format", str, where="frame 0", field="format")
    version = expect(header, "version", int, where="frame 0", field="version")
    if fmt != FORMAT or version != VERSION:
        raise FormatError(
            f"expected {FORMAT!r} version {VERSION}, found {fmt!r} version {version}",
            path="frame 0",
            field="format",
        )
    meta = BatchMeta.from_wire(
        expect(header, "meta", dict, where="frame 0", field="meta"), where="frame 0"
    )
    layout = expect(header, "columns", list, where="frame 0", field="columns")
    schema = meta.field_schema
    if len(layout) != len(schema):
        raise FormatError(
            f"{len(layout)} column layouts for {len(schema)} fields",
            path="frame 0",
            field="columns",
        )
    if len(frames) != len(schema) + 1:
        missing = len(frames) < len(schema) + 1
        raise FormatError(
            f"{'missing' if missing else 'unexpected'}: {len(frames)} frames, expected "
            f"{len(schema) + 1} (a header + {len(schema)} fields)",
            path=f"frame {len(frames) if missing else len(schema) + 1}",
            field=list(schema)[len(frames) - 1] if missing else None,
        )
    rows = len(meta)
    columns: dict[str, Column] = {}
    fields: dict[str, FieldSchema] = {}
    for f, ((name, field), entry) in enumerate(zip(schema.items(), layout, strict=True)):
        where = f"frame {f + 1}"
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in entry)
        ):
            raise FormatError("column layout must be [nbytes, items]", path="frame 0", field=name)
        nbytes, items = entry
        frame = _byte_view(frames[f + 1], where=where, name=name)
        if frame.nbytes != nbytes:
            raise FormatError(
                f"{frame.nbytes} bytes, header says {nbytes}; truncated frame?",
                path=where,
                field=name,
            )
        column = _decode_column(frame, field, rows, items, where=where, name=name)
        columns[name] = column
        if isinstance(column, Jagged):
            field = FieldSchema(field.kind, field.dtype, field.item_shape, column.lengths)
        fields[name] = field
    return meta.with_schema(fields), columns


def _byte_view(frame: Any, *, where: str, name: str) -> memoryview:
    """A flat byte view of a received frame (bytes, memoryview, zmq.Frame, ...)."""
    try:
        return memoryview(frame).cast("B")
    except (TypeError, ValueError) as exc:
        raise FormatError(f"not a contiguous buffer: {exc}", path=where, field=name) from exc


def _decode_column(
    frame: memoryview, field: FieldSchema, rows: int, items: int, *, where: str, name: str
) -> Column:
    """One column over its frame, every size checked first."""
    if field.kind == "objects":
        values = unpack(frame, where=where, field=name)
        if not isinstance(values, list) or len(values) != rows:
            found = len(values) if isinstance(values, list) else type(values).__name__
            raise FormatError(
                f"expected a list of {rows} objects, found {found}", path=where, field=name
            )
        return values
    assert isinstance(field.dtype, np.dtype)
    row_items = prod(field.item_shape)
    if field.kind == "dense":
        array = read_array(frame, field.dtype, rows * row_items, where=where, field=name)
        return array.reshape(rows, *field.item_shape)
    head = (rows + 1) * _OFFSET.itemsize
    expected = head + items * row_items * field.dtype.itemsize
    if frame.nbytes != expected:
        raise FormatError(
            f"{frame.nbytes} bytes, expected {expected} ({rows + 1} offsets + {items} items "
            f"of {field.dtype.str}{list(field.item_shape)})",
            path=where,
            field=name,
        )
    offsets = np.frombuffer(frame, dtype=_OFFSET, count=rows + 1)
    problem = offsets_problem(offsets, items)
    if problem is None and (offsets[0] != 0 or offsets[-1] != items):
        problem = f"must run from 0 to {items}, found {int(offsets[0])} to {int(offsets[-1])}"
    if problem is not None:
        raise FormatError(f"offsets {problem}", path=where, field=name)
    values = np.frombuffer(frame, dtype=field.dtype, count=items * row_items, offset=head)
    return Jagged._unchecked(
        values.reshape(items, *field.item_shape), offsets.astype(np.int64, copy=False)
    )
