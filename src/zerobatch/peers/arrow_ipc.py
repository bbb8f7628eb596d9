"""The Arrow IPC framing and the few flatbuffer fields zerobatch needs to find a
list column's buffers in each record batch, read by range (no pyarrow): how
Hugging Face Arrow files are opened in place, on local disks and on object
storage.

An Arrow IPC stream is a sequence of messages, each:

=================  ========================================================
bytes              content
=================  ========================================================
4                  ``0xFFFFFFFF`` (continuation; absent before Arrow 0.15)
4                  ``<i4`` metadata size M (flatbuffer plus padding to 8);
                   0 ends the stream
M                  a flatbuffer ``Message``
bodyLength         the message body (the buffers), 8-byte aligned
=================  ========================================================

An IPC *file* starts with ``ARROW1\\0\\0`` and holds a stream after it (then a
footer, not read here). ``Message``: ``version`` (0), ``header_type`` (1:
1 Schema, 2 DictionaryBatch, 3 RecordBatch), ``header`` (2), ``bodyLength``
(3). ``Schema``: ``endianness`` (0; 0 little), ``fields`` (1). ``Field``:
``name`` (0), ``type_type`` (2), ``type`` (3), ``dictionary`` (4),
``children`` (5). ``Int``: ``bitWidth`` (0), ``is_signed`` (1).
``RecordBatch``: ``length`` (0), ``nodes`` (1; structs ``<q length, <q
null_count``), ``buffers`` (2; structs ``<q offset, <q length`` from the
body's start), ``compression`` (3). Nodes and buffers list the schema's
fields depth first; a field's buffer count depends on its type
(``_BUFFERS``). Flatbuffers: a table starts with an ``<i4`` offset back to
its vtable (``<u2`` vtable size, table size, then one ``<u2`` offset per
field, 0 when absent); offsets to tables, vectors and strings are ``<u4``
relative to where they are stored; a vector is ``<u4`` count then items.

Every read is bounded: a message's metadata is at most ``MAX_METADATA``
bytes and lies inside the file, every flatbuffer offset is checked against
the metadata's size, and a malformed one raises ``FormatError`` naming the
file and the field.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zerobatch.errors import FormatError

__all__ = ["FILE_MAGIC", "MAX_METADATA", "ListColumn", "RecordBatch", "read_batches"]

FILE_MAGIC = b"ARROW1"
CONTINUATION = 0xFFFFFFFF
MAX_METADATA = 16 << 20  # bytes of one message's flatbuffer
_AHEAD = 1024  # bytes read with a message's prefix: a record batch's header fits
_MAX_DEPTH = 64  # nesting of fields in a schema
SCHEMA, DICTIONARY_BATCH, RECORD_BATCH = 1, 2, 3
_INT, _LIST, _LARGE_LIST, _UNION = 2, 12, 21, 14
_BUFFERS = {1: 0, 2: 2, 3: 2, 4: 3, 5: 3, 6: 2, 7: 2, 8: 2, 9: 2, 10: 2, 11: 2, 12: 2, 13: 1,
            15: 2, 16: 1, 17: 2, 18: 2, 19: 3, 20: 3, 21: 2, 22: 0, 25: 3, 26: 3}
"""Buffers of one field node by ``Type`` union code (unions: 1 sparse, 2 dense;
the view types 23 and 24 have variadic buffers and are refused)."""

Read = Callable[[int, int], bytes]
"""``read(offset, count)``: ``count`` bytes of the file at ``offset`` (fewer at its end)."""


@dataclass(frozen=True)
class ListColumn:
    """Where a list column sits in each record batch: its node and buffer
    positions, its offsets' width (4 list, 8 large list) and token dtype."""

    node: int
    offsets_buffer: int
    values_node: int
    values_buffer: int
    width: int
    dtype: np.dtype


@dataclass(frozen=True)
class RecordBatch:
    """One record batch's list column: ``rows``, the byte of its offsets
    buffer and of its values buffer in the file, and the buffers' lengths."""

    rows: int
    offsets_at: int
    offsets_bytes: int
    values_at: int
    values_bytes: int
    null_values: int


_struct = functools.cache(struct.Struct)  # format -> its Struct (~20 unpacks a record batch)


class _Table:
    """A flatbuffer table at ``at`` of ``buf`` (bounds checked, errors naming
    ``path`` and ``field``)."""

    def __init__(self, buf: bytes, at: int, path: str | Path, field: str) -> None:
        self.buf, self.at, self.path, self.field = buf, at, path, field
        back, = self._unpack("<i", at)
        self.vtable = at - back
        self.vsize, = self._unpack("<H", self.vtable)
        if self.vsize < 4 or self.vsize % 2:
            raise self.error(f"vtable of {self.vsize} bytes")

    def error(self, what: str) -> FormatError:
        return FormatError(f"malformed Arrow metadata: {what}", path=self.path, field=self.field)

    def _unpack(self, fmt: str, at: int) -> tuple[int, ...]:
        layout = _struct(fmt)
        if not 0 <= at <= len(self.buf) - layout.size:
            raise self.error(f"offset {at} outside the {len(self.buf)}-byte message")
        return layout.unpack_from(self.buf, at)

    def _slot(self, index: int) -> int:
        """The byte of field ``index`` in the table, or 0 when absent."""
        if 4 + 2 * index >= self.vsize:
            return 0
        offset, = self._unpack("<H", self.vtable + 4 + 2 * index)
        return self.at + offset if offset else 0

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self._slot(index)
        return int(self._unpack(fmt, at)[0]) if at else default

    def _target(self, index: int) -> int:
        at = self._slot(index)
        if not at:
            return 0
        offset, = self._unpack("<I", at)
        return at + offset

    def table(self, index: int, field: str) -> _Table | None:
        at = self._target(index)
        return _Table(self.buf, at, self.path, field) if at else None

    def vector(self, index: int) -> tuple[int, int]:
        """(first item's byte, count) of a vector field ((0, 0) when absent)."""
        at = self._target(index)
        if not at:
            return 0, 0
        count, = self._unpack("<I", at)
        return at + 4, count

    def tables(self, index: int, field: str) -> list[_Table]:
        first, count = self.vector(index)
        if count > (len(self.buf) - first) // 4:
            raise self.error(f"a vector of {count} tables in a {len(self.buf)}-byte message")
        out = []
        for i in range(count):
            at = first + 4 * i
            offset, = self._unpack("<I", at)
            out.append(_Table(self.buf, at + offset, self.path, f"{field}[{i}]"))
        return out

    def structs(self, index: int, size: int, fmt: str) -> list[tuple[int, ...]]:
        first, count = self.vector(index)
        if count > (len(self.buf) - first) // size:
            raise self.error(f"a vector of {count} items in a {len(self.buf)}-byte message")
        return [self._unpack(fmt, first + size * i) for i in range(count)]

    def string(self, index: int) -> str:
        first, count = self.vector(index)
        if count > len(self.buf) - first:
            raise self.error("a string past the message's end")
        return self.buf[first:first + count].decode("utf-8", "replace")


def _messages(read: Read, size: int, path: str | Path
              ) -> Iterator[tuple[int, _Table, int, int]]:
    """(header type, header table, body byte, body length) of each message."""
    head = read(0, 8)
    at = 8 if head[:6] == FILE_MAGIC else 0
    while at + 4 <= size:
        chunk = read(at, _AHEAD)  # the prefix and, mostly, the whole header: one read
        prefix = chunk[:8].ljust(8, b"\0")
        first, = struct.unpack_from("<I", prefix, 0)
        if first == CONTINUATION:
            length, = struct.unpack_from("<i", prefix, 4)
            start = at + 8
        else:
            length, start = struct.unpack_from("<i", prefix, 0)[0], at + 4
        if length == 0:
            return
        if not 8 <= length <= MAX_METADATA or start + length > size:
            raise FormatError(f"a message of {length} metadata bytes at byte {at}, in a "
                              f"{size}-byte file; truncated or not fully written?",
                              path=path, field="message")
        skip = start - at
        buf = (chunk[skip:skip + length] if len(chunk) >= skip + length
               else read(start, length))
        if len(buf) != length:
            raise FormatError(f"file ends inside the message at byte {at}", path=path,
                              field="message")
        root, = struct.unpack_from("<I", buf, 0)
        message = _Table(buf, root, path, "message")
        kind = message.scalar(1, "<B")
        body = message.scalar(3, "<q")
        header = message.table(2, "message.header")
        if header is None or body < 0 or start + length + body > size:
            raise FormatError(f"a message at byte {at} with a body of {body} bytes past the "
                              f"file's {size}; truncated or not fully written?", path=path,
                              field="message")
        yield kind, header, start + length, body
        at = start + length + body
    raise FormatError("the stream has no end-of-stream marker; truncated or not fully "
                      "written?", path=path, field="message")


def _layout(fields: list[_Table], name: str, path: str | Path) -> ListColumn:
    """Where column ``name`` (a list of integers) sits among the nodes and
    buffers of a record batch of ``fields``."""
    node = buffer = 0
    found: ListColumn | None = None

    def walk(field: _Table, top: bool, depth: int) -> None:
        nonlocal node, buffer, found
        if depth > _MAX_DEPTH:
            raise FormatError(f"fields nested deeper than {_MAX_DEPTH}", path=path,
                              field="schema")
        kind = field.scalar(2, "<B")
        if field.table(4, "dictionary") is not None:
            kind = _INT  # dictionary-encoded: the node holds the indices
        if kind == _UNION:
            mode = field.table(3, "type")
            count = 2 if mode is not None and mode.scalar(0, "<h") == 1 else 1
        elif kind in _BUFFERS:
            count = _BUFFERS[kind]
        else:
            raise FormatError(f"a field of Arrow type code {kind}, which zerobatch does not "
                              "lay out", path=path, field=field.string(0) or "schema")
        if top and found is None and field.string(0) == name:
            found = _list_column(field, kind, node, buffer, path)
        node += 1
        buffer += count
        for child in field.tables(5, "children"):
            walk(child, False, depth + 1)

    for field in fields:
        walk(field, True, 0)
    if found is None:
        names = [f.string(0) for f in fields]
        raise FormatError(f"no column {name!r}; columns: {names} (pass column=)", path=path,
                          field="column")
    return found


def _list_column(field: _Table, kind: int, node: int, buffer: int,
                 path: str | Path) -> ListColumn:
    name = field.string(0)
    children = field.tables(5, "children")
    values = children[0] if len(children) == 1 else None
    integer = values.table(3, "type") if values is not None else None
    if kind not in (_LIST, _LARGE_LIST) or values is None or integer is None or \
            values.scalar(2, "<B") != _INT or values.table(4, "dictionary") is not None:
        raise FormatError("expected a list of integers", path=path, field=name)
    bits, signed = integer.scalar(0, "<i"), integer.scalar(1, "<B")
    if bits not in (8, 16, 32, 64):
        raise FormatError(f"an integer of {bits} bits", path=path, field=name)
    dtype = np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")
    return ListColumn(node, buffer + 1, node + 1, buffer + 3, 8 if kind == _LARGE_LIST else 4,
                      dtype)


def read_batches(read: Read, size: int, column: str, path: str | Path
                 ) -> tuple[ListColumn, list[RecordBatch]]:
    """Walk the IPC stream (or file) read by ``read`` (``size`` bytes): the
    layout of list column ``column`` and each record batch's buffers.
    O(messages) small reads, no body byte."""
    layout: ListColumn | None = None
    batches = []
    for kind, header, body, length in _messages(read, size, path):
        if kind == SCHEMA:
            if header.scalar(0, "<h") != 0:
                raise FormatError("a big-endian stream", path=path, field="endianness")
            layout = _layout(header.tables(1, "fields"), column, path)
        elif kind == RECORD_BATCH:
            if layout is None:
                raise FormatError("a record batch before the schema", path=path,
                                  field="message")
            batches.append(_record_batch(header, layout, body, length, path))
        elif kind != DICTIONARY_BATCH:
            raise FormatError(f"a message of type {kind} in a table stream", path=path,
                              field="message")
    if layout is None:
        raise FormatError("no schema message", path=path, field="message")
    return layout, batches


def _record_batch(header: _Table, layout: ListColumn, body: int, length: int,
                  path: str | Path) -> RecordBatch:
    field = f"record batch at byte {body}"
    if header.table(3, "compression") is not None:
        raise FormatError("compressed record batches are not read in place", path=path,
                          field=field)
    nodes = header.structs(1, 16, "<qq")
    buffers = header.structs(2, 16, "<qq")
    if layout.values_node >= len(nodes) or layout.values_buffer >= len(buffers):
        raise FormatError(f"{len(nodes)} nodes and {len(buffers)} buffers, fewer than the "
                          "schema needs", path=path, field=field)
    for offset, count in (buffers[layout.offsets_buffer], buffers[layout.values_buffer]):
        if offset < 0 or count < 0 or offset + count > length:
            raise FormatError(f"a buffer at {offset} of {count} bytes outside the "
                              f"{length}-byte body", path=path, field=field)
    rows = nodes[layout.node][0]
    return RecordBatch(rows, body + buffers[layout.offsets_buffer][0],
                       buffers[layout.offsets_buffer][1],
                       body + buffers[layout.values_buffer][0], buffers[layout.values_buffer][1],
                       nodes[layout.values_node][1])
