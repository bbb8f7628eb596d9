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
import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zerobatch.errors import FormatError

__all__ = ["FILE_MAGIC", "MAX_METADATA", "ListBatches", "ListColumn", "read_batches"]

FILE_MAGIC = b"ARROW1"
CONTINUATION = 0xFFFFFFFF
MAX_METADATA = 16 << 20  # bytes of one message's flatbuffer
_AHEAD = 1024  # bytes read with a message's prefix: a record batch's header fits
_MAX_AHEAD = 64 << 10  # bytes read at once: a message with its list offsets, or the offsets
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
class ListBatches:
    """Every record batch's list column, one ``int64`` entry per batch:
    ``rows``; the byte of its offsets buffer and of its values buffer in the
    file; the values buffer's length; its values' null count; its first and
    last list offset (0 and 0 for a batch of no rows). Checked by the walk:
    the buffers lie in their message's body, the offsets buffer holds
    ``rows + 1`` offsets."""

    rows: np.ndarray
    offsets_at: np.ndarray
    values_at: np.ndarray
    values_bytes: np.ndarray
    null_values: np.ndarray
    first: np.ndarray
    last: np.ndarray


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

    def slot(self, index: int) -> int:
        """The byte of field ``index`` in the table, or 0 when absent."""
        if 4 + 2 * index >= self.vsize:
            return 0
        offset, = self._unpack("<H", self.vtable + 4 + 2 * index)
        return self.at + offset if offset else 0

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self.slot(index)
        return int(self._unpack(fmt, at)[0]) if at else default

    def _target(self, index: int) -> int:
        at = self.slot(index)
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
                 ) -> tuple[ListColumn, ListBatches]:
    """Walk the IPC stream (or file) read by ``read`` (``size`` bytes): the
    layout of list column ``column`` and each record batch's buffers and end
    offsets, checked. O(messages) small reads, one a record batch where its
    header and the column's list offsets lie close (no token is read).

    Each message's place comes from the one before it, so the reads are in
    turn. The first record batch's header is parsed as a flatbuffer; the
    next ones whose bytes equal it outside the numbers that vary from batch
    to batch (the body's length, the rows, the nodes and buffers) are read
    by one precompiled ``struct`` (``_Template``): the same parse, as every
    byte it would follow is the same."""
    head = read(0, 8)
    at = 8 if head[:6] == FILE_MAGIC else 0
    layout: ListColumn | None = None
    template: _Template | None = None
    found: list[tuple[int, ...]] = []  # per batch: rows, offsets' byte, values' byte
    #   and length, null values, first and last list offset
    ahead = _AHEAD
    while at + 4 <= size:
        chunk = read(at, ahead)
        numbers = None
        if template is not None and (numbers := template.match(chunk)) is not None:
            metadata_end = template.end
        else:
            message = _message(read, chunk, at, size, path)
            if message is None:
                if layout is None:
                    raise FormatError("no schema message", path=path, field="message")
                return layout, ListBatches(*np.array(found, np.int64).reshape(-1, 7).T)
            kind, root, header, metadata_end, body = message
            if kind == SCHEMA:
                if header.scalar(0, "<h") != 0:
                    raise FormatError("a big-endian stream", path=path, field="endianness")
                layout = _layout(header.tables(1, "fields"), column, path)
                template = None  # (a stream has one schema; another starts afresh)
            elif kind == RECORD_BATCH:
                if layout is None:
                    raise FormatError("a record batch before the schema", path=path,
                                      field="message")
                numbers, candidate = _record_batch(chunk, at, root, header, layout,
                                                   metadata_end, body, path)
                template = template or candidate
            elif kind != DICTIONARY_BATCH:
                raise FormatError(f"a message of type {kind} in a table stream", path=path,
                                  field="message")
            if numbers is None:
                at += metadata_end + body
                continue
        assert layout is not None  # a template or a record batch needs the schema
        batch, at, need = _checked_batch(read, chunk, at, metadata_end, size, numbers, layout,
                                         len(found), column, path)
        found.append(batch)
        ahead = max(_AHEAD, min(need + need // 4, _MAX_AHEAD))
    raise FormatError("the stream has no end-of-stream marker; truncated or not fully "
                      "written?", path=path, field="message")


def _message(read: Read, chunk: bytes, at: int, size: int, path: str | Path
             ) -> tuple[int, _Table, _Table, int, int] | None:
    """The message at byte ``at`` (``chunk``: bytes read there): its header
    type, its ``Message`` and header tables, where its metadata ends (bytes
    from ``at``) and its body's length; None at the end-of-stream marker."""
    prefix = chunk[:8].ljust(8, b"\0")
    first, = struct.unpack_from("<I", prefix, 0)
    if first == CONTINUATION:
        length, = struct.unpack_from("<i", prefix, 4)
        skip = 8
    else:
        length, skip = struct.unpack_from("<i", prefix, 0)[0], 4
    if length == 0:
        return None
    start = at + skip
    if not 8 <= length <= MAX_METADATA or start + length > size:
        raise FormatError(f"a message of {length} metadata bytes at byte {at}, in a "
                          f"{size}-byte file; truncated or not fully written?",
                          path=path, field="message")
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
    return kind, message, header, skip + length, body


def _record_batch(chunk: bytes, at: int, message: _Table, header: _Table, layout: ListColumn,
                  metadata_end: int, body: int, path: str | Path
                  ) -> tuple[tuple[int, ...], _Template | None]:
    """The numbers of the record batch at byte ``at`` (``chunk``: bytes read
    there; ``body``: its body's length), parsed, as ``_Template.match`` gives
    them; and the template its bytes make (None where they miss its
    metadata, it has no body length, or the numbers overlap)."""
    field = f"record batch at byte {at + metadata_end}"
    if header.table(3, "compression") is not None:
        raise FormatError("compressed record batches are not read in place", path=path,
                          field=field)
    nodes = header.structs(1, 16, "<qq")
    buffers = header.structs(2, 16, "<qq")
    if layout.values_node >= len(nodes) or layout.values_buffer >= len(buffers):
        raise FormatError(f"{len(nodes)} nodes and {len(buffers)} buffers, fewer than the "
                          "schema needs", path=path, field=field)
    numbers = (body, nodes[layout.node][0], nodes[layout.values_node][1],
               *buffers[layout.offsets_buffer], *buffers[layout.values_buffer])
    body_at, rows_at = message.slot(3), header.slot(0)
    (node_at, node_count), (buffer_at, buffer_count) = header.vector(1), header.vector(2)
    if not body_at or len(chunk) < metadata_end:
        return numbers, None
    skip = metadata_end - len(message.buf)  # positions in the chunk: after the prefix
    body_at, node_at, buffer_at = body_at + skip, node_at + skip, buffer_at + skip
    rows_at = rows_at + skip if rows_at else 0
    varying = [(body_at, 8), (node_at, 16 * node_count), (buffer_at, 16 * buffer_count)]
    if rows_at:
        varying.append((rows_at, 8))
    read_at = [(body_at, "q"), (node_at + 16 * layout.node, "q"),
               (node_at + 16 * layout.values_node + 8, "q"),
               (buffer_at + 16 * layout.offsets_buffer, "qq"),
               (buffer_at + 16 * layout.values_buffer, "qq")]
    spans = sorted((at, 8 * len(kind)) for at, kind in read_at)
    if any(at + count > after for (at, count), (after, _) in itertools.pairwise(spans)):
        return numbers, None  # (a crafted header whose fields overlap: parsed every time)
    return numbers, _Template(chunk[:metadata_end], varying, read_at)


class _Template:
    """A record batch message's bytes (its prefix and metadata), with the spans
    that vary from batch to batch (the body's length, the rows, the nodes and
    buffers) and where the numbers read from them lie. ``match(chunk)``: a
    message of the same bytes elsewhere, read in one ``unpack``."""

    def __init__(self, message: bytes, varying: list[tuple[int, int]],
                 read_at: list[tuple[int, str]]) -> None:
        self.end = len(message)
        self.fixed: list[tuple[int, int, bytes]] = []
        cursor = 0
        for at, count in sorted(varying):
            if at > cursor:
                self.fixed.append((cursor, at, message[cursor:at]))
            cursor = max(cursor, at + count)
        if cursor < self.end:
            self.fixed.append((cursor, self.end, message[cursor:]))
        # read_at lists the numbers in match's order; the struct reads them in
        # file order, and order maps its items back
        places = list(itertools.accumulate((len(kind) for _, kind in read_at), initial=0))
        layout, cursor, self.order = "<", 0, [0] * places[-1]
        item = 0
        for i in sorted(range(len(read_at)), key=lambda i: read_at[i][0]):
            at, kind = read_at[i]
            layout += f"{at - cursor}x{kind}"
            cursor = at + 8 * len(kind)
            for k in range(len(kind)):
                self.order[places[i] + k] = item
                item += 1
        self.numbers = struct.Struct(layout)

    def match(self, chunk: bytes) -> tuple[int, ...] | None:
        """(body length, rows, null values, offsets buffer offset and length,
        values buffer offset and length) of the record batch ``chunk`` starts
        with, or None when its bytes differ from the template's."""
        if len(chunk) < self.end:
            return None
        for start, stop, same in self.fixed:
            if chunk[start:stop] != same:
                return None
        items = self.numbers.unpack_from(chunk)
        return tuple(items[i] for i in self.order)


def _checked_batch(read: Read, chunk: bytes, at: int, metadata_end: int, size: int,
                   numbers: tuple[int, ...], layout: ListColumn, index: int, column: str,
                   path: str | Path) -> tuple[tuple[int, ...], int, int]:
    """The record batch at ``at`` (``numbers`` from ``_Template.match``; its
    body ``metadata_end`` bytes after ``at``), its
    buffers checked and its list offsets' ends read (from ``chunk`` when they
    lie in it): its row of ``ListBatches``, the next message's byte, and the
    bytes from ``at`` to its last list offset's end."""
    body, rows, nulls, offsets_offset, offsets_bytes, values_offset, values_bytes = numbers
    body_at = at + metadata_end
    if body < 0 or body_at + body > size:
        raise FormatError(f"a message at byte {at} with a body of {body} bytes past the "
                          f"file's {size}; truncated or not fully written?", path=path,
                          field="message")
    for offset, count in ((offsets_offset, offsets_bytes), (values_offset, values_bytes)):
        if offset < 0 or count < 0 or offset + count > body:
            raise FormatError(f"a buffer at {offset} of {count} bytes outside the "
                              f"{body}-byte body", path=path,
                              field=f"record batch at byte {body_at}")
    field = f"{column}[batch {index}]"
    width = layout.width
    span = (rows + 1) * width
    if rows < 0 or (rows and offsets_bytes < span):
        raise FormatError(f"{rows} rows need {span} bytes of offsets, the buffer has "
                          f"{offsets_bytes}", path=path, field=field)
    offsets_at = body_at + offsets_offset
    first = last = 0
    need = metadata_end
    if rows:
        here = offsets_at - at
        need = here + span
        if need <= len(chunk):
            ends = chunk[here:here + width] + chunk[need - width:need]
        elif span <= _MAX_AHEAD:
            whole = read(offsets_at, span)
            ends = whole[:width] + whole[span - width:] if len(whole) == span else b""
        else:
            ends = read(offsets_at, width) + read(offsets_at + span - width, width)
        if len(ends) != 2 * width:
            raise FormatError(f"file ends inside the list offsets at byte {offsets_at}; "
                              "truncated or not fully written?", path=path, field=field)
        first, last = _struct("<ii" if width == 4 else "<qq").unpack(ends)
    return ((rows, offsets_at, body_at + values_offset, values_bytes, nulls, first, last),
            body_at + body, need)

