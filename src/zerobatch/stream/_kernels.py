"""Numba kernels of the read path: index math for a whole batch, GIL-free.

A *piece* is one contiguous read from one shard, a row of an ``(P, 5)`` int64
array: ``(observation, shard, first record in the shard, records, first record
in the batch buffer)``. Pieces are ordered by observation, then position.
Kernels report bad data as ``(code, shard)`` instead of raising, so the caller
can name the file; ``code == OK`` means no problem.

What runs once per window or piece is inlined (``inline="always"``): as a
call, ``read_request`` alone made a batch of 64 windows 30-40% slower. What
runs once per batch stays a call: Numba inlines by copying the callee's IR
into each caller and specialization, so a cold cache compiled the stream and
packing tests' kernels for 25% longer with the batch loops inlined.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from zerobatch._jit import njit
from zerobatch.storage.local import borrowed, prefetch_request, read_request
from zerobatch.stream._tables import bytes_at, offsets_at
from zerobatch.stream.manifest import (
    DOCS,
    META_ID,
    META_INDEX,
    META_SPANS,
    NO_METADATA,
    TOKENS,
)

__all__ = [
    "BAD_DOCS",
    "BAD_INDEX",
    "BAD_META_ID",
    "BAD_SPANS",
    "META_ORDER",
    "OK",
    "SPANS_META_ORDER",
    "SPAN_CROSSES",
    "SPAN_ORDER",
    "STATUS",
    "annotation_spans",
    "meta_spans",
    "no_segments",
    "plan_documents",
    "plan_window_rows",
    "plan_windows",
    "read_requests",
    "read_window_rows",
    "read_window_rows_segments",
    "read_windows",
    "read_windows_segments",
    "span_rows_status",
    "window_columns",
    "window_columns_meta",
    "window_segments",
    "window_tokens",
]

OK, BAD_DOCS, BAD_META_ID, META_ORDER, BAD_INDEX, BAD_SPANS = 0, 1, 2, 3, 4, 5
SPAN_CROSSES, SPAN_ORDER = 6, 7  # spec rules reads do not depend on (``span_rows_status``)
STATUS: dict[int, tuple[str, str, str]] = {
    BAD_DOCS: (DOCS, "offsets", "document offsets go backwards or past the end"),
    BAD_META_ID: (TOKENS, META_ID, "metadata id out of range of the metadata index"),
    META_ORDER: (TOKENS, META_ID, "metadata ids must rise by one from span to span"),
    BAD_INDEX: (META_INDEX, "offsets", "metadata index goes backwards or past its data file"),
    BAD_SPANS: (META_SPANS, "rows",
                "an entry's span is empty, past the shard's records, or of an unknown kind"),
}
"""Each code a kernel returns: (the shard file it blames, by suffix; the field;
the message). The one table the callers turn codes into ``FormatError`` with."""
SPANS_META_ORDER = "a metadata id names an entry that does not cover its token"
"""``META_ORDER``'s message for datasets with a spans table (version 2)."""
_NO_METADATA = np.uint32(NO_METADATA)
OBS, SHARD, START, LENGTH, DEST = 0, 1, 2, 3, 4


def _load_u64_typer(typingctx: Any, address: Any) -> Any:
    """``_load_u64(address)``: the uint64 at ``address`` (the caller checks
    that it lies in an array it holds)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        word = ir.IntType(64)
        return builder.load(builder.inttoptr(args[0], word.as_pointer()))

    return types.uint64(types.intp), codegen


_load_u64: Any = intrinsic(_load_u64_typer)


@njit(nogil=True, cache=True)
def plan_windows(
    indices: np.ndarray, stride: int, n: int, count: int, shard_starts: np.ndarray,
    handles: np.ndarray, bases: np.ndarray, itemsize: int,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Pieces for windows ``[i * stride, i * stride + n)`` and their reads
    (``bases``: the byte where each shard's records start in its file).

    Returns (pieces, ``read_requests``'s two values, the first bad position or -1).
    """
    total = 0
    for b in range(indices.shape[0]):
        i = indices[b]
        if i < 0 or i >= count:
            return np.empty((0, 5), np.int64), np.empty((4, 0), np.int64), -1, b
        g = i * stride
        s0 = count_at_or_below(shard_starts, g, 0, shard_starts.shape[0]) - 1
        s1 = count_at_or_below(shard_starts, g + n - 1, 0, shard_starts.shape[0]) - 1
        total += s1 - s0 + 1
    pieces = np.empty((total, 5), np.int64)
    p = 0
    for b in range(indices.shape[0]):
        g = indices[b] * stride
        end = g + n
        s = count_at_or_below(shard_starts, g, 0, shard_starts.shape[0]) - 1
        pos = g
        while pos < end:
            take = min(end, shard_starts[s + 1]) - pos
            if take > 0:
                pieces[p, OBS] = b
                pieces[p, SHARD] = s
                pieces[p, START] = pos - shard_starts[s]
                pieces[p, LENGTH] = take
                pieces[p, DEST] = b * n + pos - g
                p += 1
                pos += take
            s += 1
    requests, closed = read_requests(pieces[:p], handles, bases, itemsize)
    return pieces[:p], requests, closed, -1


@njit(nogil=True, cache=True)
def read_requests(
    pieces: np.ndarray, handles: np.ndarray, bases: np.ndarray, itemsize: int
) -> tuple[np.ndarray, int]:
    """The reads of ``pieces``, ``(4, P)``: file handle from ``handles`` (one per
    shard, -1 if not open yet), byte offset (from the shard's byte ``bases``),
    bytes, byte destination; and the first shard whose handle is -1, or -1."""
    requests = np.empty((4, pieces.shape[0]), np.int64)
    closed = -1
    for p in range(pieces.shape[0]):
        s = pieces[p, SHARD]
        requests[0, p] = handles[s]
        requests[1, p] = bases[s] + pieces[p, START] * itemsize
        requests[2, p] = pieces[p, LENGTH] * itemsize
        requests[3, p] = pieces[p, DEST] * itemsize
        if handles[s] < 0 and closed < 0:
            closed = s
    return requests, closed


@njit(nogil=True, cache=True)
def plan_documents(
    indices: np.ndarray, max_len: int, doc_starts: np.ndarray, docs: np.ndarray, records: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Pieces for whole documents (first ``max_len`` records; 0: no limit).

    Returns (pieces, offsets into the batch buffer, bad index position or -1,
    code, shard).
    """
    b_count = indices.shape[0]
    pieces = np.empty((b_count, 5), np.int64)
    offsets = np.zeros(b_count + 1, np.int64)
    total_docs = doc_starts[doc_starts.shape[0] - 1]
    for b in range(b_count):
        d = indices[b]
        if d < 0 or d >= total_docs:
            return pieces[:0], offsets, b, OK, 0
        s = count_at_or_below(doc_starts, d, 0, doc_starts.shape[0]) - 1
        k = d - doc_starts[s]
        if k + 1 >= docs[s, 1]:
            return pieces[:0], offsets, -1, BAD_DOCS, s
        start = np.int64(_load_u64(docs[s, 0] + 8 * k))
        end = np.int64(_load_u64(docs[s, 0] + 8 * (k + 1)))
        if not 0 <= start < end <= records[s]:
            return pieces[:0], offsets, -1, BAD_DOCS, s
        length = end - start
        if max_len > 0 and length > max_len:
            length = np.int64(max_len)
        pieces[b, OBS] = b
        pieces[b, SHARD] = s
        pieces[b, START] = start
        pieces[b, LENGTH] = length
        pieces[b, DEST] = offsets[b]
        offsets[b + 1] = offsets[b] + length
    return pieces, offsets, -1, OK, 0


@njit(nogil=True, cache=True, inline="always")
def _first_document(table: np.ndarray, record: int) -> int:
    """The document of ``table`` (a shard's offsets) holding ``record``, or -1
    when the offsets do not bracket it."""
    first = np.uint64(record)
    k0 = count_at_or_below(table, first, 0, table.shape[0]) - 1
    if k0 < 0 or k0 + 1 >= table.shape[0] or not table[k0] <= first < table[k0 + 1]:
        return -1
    return int(k0)


@njit(nogil=True, cache=True)
def _segments(
    pieces: np.ndarray, b_count: int, n: int, seq_len: int, docs: np.ndarray,
    doc_starts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The document segments of each window: (cu_seqlens offsets, values and
    per-window lengths, doc-id offsets, doc ids and per-window lengths, code,
    shard). ``cu`` ends each window with ``seq_len``."""
    nseg = np.zeros(b_count, np.int64)
    spans = np.zeros((pieces.shape[0], 2), np.int64)  # documents [k0, k1) of each piece
    for p in range(pieces.shape[0]):
        b, s, a = pieces[p, OBS], pieces[p, SHARD], pieces[p, START]
        m = min(pieces[p, LENGTH], seq_len - (pieces[p, DEST] - b * n))
        if m <= 0:
            continue
        table = offsets_at(docs, s)
        end = np.uint64(a + m)
        # Offsets must rise from k0 to k1 and bracket [a, a + m); else the file lies.
        k0 = _first_document(table, a)
        if k0 < 0:
            return nseg, np.empty(0, np.int32), nseg, nseg, nseg, nseg, BAD_DOCS, s
        k1 = k0 + 1  # a window spans few documents: walk instead of a second search
        while table[k1] < end:
            if k1 + 1 >= table.shape[0] or table[k1 + 1] <= table[k1]:
                return nseg, np.empty(0, np.int32), nseg, nseg, nseg, nseg, BAD_DOCS, s
            k1 += 1
        spans[p, 0], spans[p, 1] = k0, k1
        nseg[b] += k1 - k0
    doc_offsets = np.zeros(b_count + 1, np.int64)
    cu_offsets = np.zeros(b_count + 1, np.int64)
    cu_lengths = np.empty(b_count, np.int64)
    for b in range(b_count):
        doc_offsets[b + 1] = doc_offsets[b] + nseg[b]
        cu_offsets[b + 1] = cu_offsets[b] + nseg[b] + 1
        cu_lengths[b] = nseg[b] + 1
    cu = np.empty(cu_offsets[b_count], np.int32)
    ids = np.empty(doc_offsets[b_count], np.int64)
    filled = np.zeros(b_count, np.int64)
    for p in range(pieces.shape[0]):
        b, s, a = pieces[p, OBS], pieces[p, SHARD], pieces[p, START]
        c = pieces[p, DEST] - b * n
        m = min(pieces[p, LENGTH], seq_len - c)
        if m <= 0:
            continue
        table = offsets_at(docs, s)
        for j in range(spans[p, 0], spans[p, 1]):
            start = c if j == spans[p, 0] else c + np.int64(table[j]) - a
            cu[cu_offsets[b] + filled[b]] = start
            ids[doc_offsets[b] + filled[b]] = doc_starts[s] + j
            filled[b] += 1
    for b in range(b_count):
        cu[cu_offsets[b + 1] - 1] = seq_len
    return cu_offsets, cu, cu_lengths, doc_offsets, ids, nseg, OK, 0


@njit(nogil=True, cache=True, inline="always")
def _decode_tokens(
    b: int, source: np.ndarray, seq_len: int, inputs: np.ndarray, labels: np.ndarray,
    shift: int, bounds: np.ndarray,
) -> bool:
    """Row ``b`` of ``inputs = tokens[:, :seq_len]`` and ``labels`` (``shift``
    1: ``tokens[:, 1:]``; 0: the same tokens as ``inputs``) cast from ``source``
    (``tokens[b]``), each skipped when it has no rows. With ``bounds`` (two
    values of ``source``'s dtype: the smallest and largest id the output holds)
    the row's ids are checked in the same pass; False when one is outside."""
    if inputs.shape[0] > 0:
        decoded = inputs[b]
        for t in range(seq_len):  # row views: the loops vectorize
            decoded[t] = source[t]
        if labels.shape[0] > 0:  # from the decoded row: contiguous even when records are not
            target = labels[b]
            if shift == 0:
                for t in range(seq_len):
                    target[t] = decoded[t]
            else:
                for t in range(seq_len - 1):
                    target[t] = decoded[t + 1]
                target[seq_len - 1] = source[seq_len]
    elif labels.shape[0] > 0:
        target = labels[b]
        for t in range(seq_len):
            target[t] = source[t + shift]
    if bounds.shape[0] == 0:
        return True
    low = high = source[0]
    for t in range(seq_len + shift):  # min and max vectorize: one more pass over L1
        value = source[t]
        low = min(low, value)
        high = max(high, value)
    return bounds[0] <= low and high <= bounds[1]


@njit(nogil=True, cache=True)
def window_tokens(
    tokens: np.ndarray, seq_len: int, inputs: np.ndarray, labels: np.ndarray, shift: int,
    bounds: np.ndarray,
) -> int:
    """``inputs`` and ``labels`` of a window batch (``_decode_tokens``), when no
    column needs the documents. Returns the first row with an id outside
    ``bounds``, or -1."""
    for b in range(tokens.shape[0]):
        if not _decode_tokens(b, tokens[b], seq_len, inputs, labels, shift, bounds):
            return b
    return -1


@njit(nogil=True, cache=True)
def window_columns(
    pieces: np.ndarray, b_count: int, n: int, seq_len: int, docs: np.ndarray,
    doc_starts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The document segments of a window batch of ``b_count`` windows
    (``_segments``, which returns what this returns): for ``doc_ids``."""
    return _segments(pieces, b_count, n, seq_len, docs, doc_starts)


@njit(nogil=True, cache=True)
def _first_documents(
    pieces: np.ndarray, n: int, seq_len: int, docs: np.ndarray
) -> tuple[np.ndarray, int, int]:
    """Per piece that reaches into its window's first ``seq_len`` tokens, the
    document of its shard holding its first record (``_first_document``);
    (firsts, code, shard). The binary searches of all pieces advance together,
    one level per pass, so their cache misses overlap instead of following one
    another (the offsets of a large dataset do not fit the CPU caches)."""
    count = pieces.shape[0]
    lo = np.zeros(count, np.int64)
    hi = np.zeros(count, np.int64)
    tables = np.zeros(count, np.int64)  # each piece's table address
    for p in range(count):
        if min(pieces[p, LENGTH], seq_len - (pieces[p, DEST] - pieces[p, OBS] * n)) > 0:
            tables[p], hi[p] = docs[pieces[p, SHARD], 0], docs[pieces[p, SHARD], 1]
    searching = True
    while searching:
        searching = False
        for p in range(count):
            if lo[p] < hi[p]:  # so 0 <= middle < len(table)
                middle = (lo[p] + hi[p]) >> 1
                if _load_u64(tables[p] + 8 * middle) <= np.uint64(pieces[p, START]):
                    lo[p] = middle + 1
                else:
                    hi[p] = middle
                searching = True
    for p in range(count):
        if min(pieces[p, LENGTH], seq_len - (pieces[p, DEST] - pieces[p, OBS] * n)) <= 0:
            continue
        table = offsets_at(docs, pieces[p, SHARD])
        first, k0 = np.uint64(pieces[p, START]), lo[p] - 1
        if k0 < 0 or k0 + 1 >= table.shape[0] or not table[k0] <= first < table[k0 + 1]:
            return lo, BAD_DOCS, pieces[p, SHARD]
        lo[p] = k0
    return lo, OK, 0


@njit(nogil=True, cache=True, inline="always")
def _row_segments(
    b: int, p: int, pieces: np.ndarray, n: int, seq_len: int, docs: np.ndarray,
    firsts: np.ndarray, labels: np.ndarray, mask_starts: bool, out: tuple,
) -> tuple[int, int, int]:
    """Row ``b``'s document columns from its pieces, the first at ``p``, and
    their first documents (``_first_documents``), written as the document
    starts are found; nothing is allocated.

    ``out`` is ``(positions, seq_idx, cu, cu_offsets, cu_lengths, longest,
    cursor)``; ``positions``, ``seq_idx`` and ``longest`` are skipped when
    they have no rows, ``cu`` and its offsets and lengths are always written
    (room for ``seq_len + 1`` items a row). ``positions``
    restart at 0 at the window start and at each document start; ``seq_idx``
    numbers the segments of the batch from 0, row after row; ``cu`` gets the
    row's segment starts then ``seq_len`` (window columns) and ``cu_offsets[b
    + 1]``, ``cu_lengths[b]`` say where they end and how many; ``longest[b]``
    the row's longest segment; ``cursor`` carries (next ``cu`` item, next
    segment number) from row to row. With ``mask_starts``, ``labels[b]`` gets
    -100 at each segment start (the window's first token and each document's
    first token: no token of the row predicts them). Returns
    (the next row's first piece, code, shard)."""
    positions, seq_idx, cu, cu_offsets, cu_lengths, longest, cursor = out
    # Row views, contiguous (1-D slices of the flat planes: the loops vectorize);
    # empty when the column has no rows.
    position_row = positions.reshape(-1)[b * seq_len : (b + 1) * seq_len]
    seq_idx_row = seq_idx.reshape(-1)[b * seq_len : (b + 1) * seq_len]
    q, segment_id, most = cursor[0], cursor[1], 0
    row_start = q
    while p < pieces.shape[0] and pieces[p, OBS] == b:
        s, a = pieces[p, SHARD], pieces[p, START]
        c = pieces[p, DEST] - b * n  # a piece starts a segment (shards end documents)
        m = min(pieces[p, LENGTH], seq_len - c)
        k = firsts[p]
        p += 1
        if m <= 0:
            continue
        table = offsets_at(docs, s)
        end = np.uint64(a + m)
        segment = c
        while True:
            k += 1  # the next document starts at column c + table[k] - a
            stop = c + m if table[k] >= end else c + np.int64(table[k]) - a
            cu[q] = segment
            q += 1
            if mask_starts:
                labels[b, segment] = -100
            most = max(most, stop - segment)
            segment_id += 1
            if table[k] >= end:
                break
            if k + 1 >= table.shape[0] or table[k + 1] <= table[k]:
                return p, BAD_DOCS, s
            segment = stop
    cu[q] = seq_len
    q += 1
    cu_offsets[b + 1] = q
    cu_lengths[b] = q - row_start
    if longest.shape[0] > 0:
        longest[b] = most
    # Then the per-token columns from the row's segments, in tight loops that vectorize.
    first_id = cursor[1]
    for i in range(row_start, q - 1):
        if position_row.shape[0] > 0:
            values = position_row[np.int64(cu[i]) : np.int64(cu[i + 1])]
            for t in range(values.shape[0]):
                values[t] = t
        if seq_idx_row.shape[0] > 0:
            ids = seq_idx_row[np.int64(cu[i]) : np.int64(cu[i + 1])]
            for t in range(ids.shape[0]):
                ids[t] = first_id + i - row_start
    cursor[0], cursor[1] = q, segment_id
    return p, OK, 0


def no_segments(rows_dtype: Any = np.int64) -> tuple:
    """An ``out`` for ``_row_segments`` that computes nothing (every array empty)."""
    none2 = np.empty((0, 0), rows_dtype)
    return (none2, np.empty((0, 0), np.int32), np.empty(0, np.int32), np.empty(0, np.int64),
            np.empty(0, np.int64), np.empty(0, np.int32), np.zeros(2, np.int64))


@njit(nogil=True, cache=True)
def window_segments(
    tokens: np.ndarray, pieces: np.ndarray, n: int, seq_len: int, docs: np.ndarray,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, out: tuple,
) -> tuple[int, int, int]:
    """``inputs`` and ``labels`` (``_decode_tokens``) and the document columns
    (``_row_segments``; ``shift`` 0 masks the labels at document starts) of a
    window batch, row by row while the row is in cache. Returns (code, shard,
    the first row with an id outside ``bounds`` or -1)."""
    firsts, code, shard = _first_documents(pieces, n, seq_len, docs)
    if code != OK:
        return code, shard, -1
    p = 0
    for b in range(tokens.shape[0]):
        if not _decode_tokens(b, tokens[b], seq_len, inputs, labels, shift, bounds):
            return OK, 0, b
        p, code, shard = _row_segments(b, p, pieces, n, seq_len, docs, firsts, labels,
                                       shift == 0 and labels.shape[0] > 0, out)
        if code != OK:
            return code, shard, -1
    return OK, 0, -1


@njit(nogil=True, cache=True, inline="always")
def _read_row(
    b: int, p: int, pieces: np.ndarray, requests: np.ndarray, n: int, itemsize: int,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool,
    row: np.ndarray,
) -> tuple[int, int, int]:
    """Read window ``b`` (its pieces from ``p``, their ``read_requests``) into
    ``row`` (``n`` records) with ``read_request``. Returns (the next window's
    first piece, the failed request or -1, its status)."""
    base = row.ctypes.data - b * n * itemsize  # request destinations are batch offsets
    while p < pieces.shape[0] and pieces[p, OBS] == b:
        length, dest = requests[2, p], requests[3, p]
        if length < 0 or dest < b * n * itemsize or dest + length > (b + 1) * n * itemsize:
            return p, p, -2
        status = read_request(requests[0, p], requests[1, p], length, base + dest,
                              fds, addresses, sizes, use_pread)
        if status < 1:
            return p, p, status
        p += 1
    return p, -1, 1


@njit(nogil=True, cache=True, inline="always")
def _read_cast_row(
    b: int, p: int, ahead: int, pieces: np.ndarray, requests: np.ndarray, n: int,
    row: np.ndarray, fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray,
    use_pread: bool, seq_len: int, inputs: np.ndarray, labels: np.ndarray, shift: int,
    bounds: np.ndarray,
) -> tuple[int, int, int, int, bool]:
    """Window ``b`` of planned ``pieces`` (from ``p``; their ``requests``) read
    into ``row`` and cast (``_decode_tokens``), the next window's requests
    prefetched first (``ahead``: the first not prefetched yet). Returns (the
    next window's first piece, the next ``ahead``, the failed request or -1,
    its status, whether the row's ids are inside ``bounds``)."""
    while ahead < pieces.shape[0] and pieces[ahead, OBS] <= b + 1:  # the next window
        prefetch_request(requests[0, ahead], requests[1, ahead], requests[2, ahead],
                         addresses, sizes, use_pread)
        ahead += 1
    p, failed, status = _read_row(b, p, pieces, requests, n, row.itemsize, fds, addresses,
                                  sizes, use_pread, row)
    if failed >= 0:
        return p, ahead, failed, status, True
    return p, ahead, -1, 1, _decode_tokens(b, row, seq_len, inputs, labels, shift, bounds)


@njit(nogil=True, cache=True)
def _read_planned(
    pieces: np.ndarray, requests: np.ndarray, rows: int, n: int, row: np.ndarray,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray,
) -> tuple[int, int, int]:
    """The reading half of ``read_windows`` for planned ``pieces`` of ``rows``
    windows and their ``requests``: each window read into ``row`` and cast
    (``_read_cast_row``). Returns (failed request or -1, its status, the first
    row with an id outside ``bounds`` or -1)."""
    pieces, requests, fds = borrowed(pieces), borrowed(requests), borrowed(fds)
    addresses, sizes, row = borrowed(addresses), borrowed(sizes), borrowed(row)
    inputs, labels, bounds = borrowed(inputs), borrowed(labels), borrowed(bounds)
    p = ahead = 0
    for b in range(rows):
        p, ahead, failed, status, inside = _read_cast_row(
            b, p, ahead, pieces, requests, n, row, fds, addresses, sizes, use_pread, seq_len,
            inputs, labels, shift, bounds)
        if failed >= 0:
            return failed, status, -1
        if not inside:
            return -1, 1, b
    return -1, 1, -1


@njit(nogil=True, cache=True, inline="always")
def borrowed_columns(out: tuple) -> tuple:
    """``out``, ``_row_segments``' seven arrays, each ``borrowed``: unpacking
    an owned one a row costs two atomic reference counts (14 a row)."""
    positions, seq_idx, cu, cu_offsets, cu_lengths, longest, cursor = out
    return (borrowed(positions), borrowed(seq_idx), borrowed(cu), borrowed(cu_offsets),
            borrowed(cu_lengths), borrowed(longest), borrowed(cursor))


@njit(nogil=True, cache=True)
def _read_planned_segments(
    pieces: np.ndarray, requests: np.ndarray, rows: int, n: int, row: np.ndarray,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, docs: np.ndarray,
    out: tuple,
) -> tuple[int, int, int, int, int]:
    """``_read_planned`` with each window's document columns (``_row_segments``
    into ``out``), computed while the window is in cache. Returns (failed
    request or -1, its status, code, shard, the first row with an id outside
    ``bounds`` or -1)."""
    pieces, requests, fds = borrowed(pieces), borrowed(requests), borrowed(fds)
    addresses, sizes, row = borrowed(addresses), borrowed(sizes), borrowed(row)
    inputs, labels, bounds = borrowed(inputs), borrowed(labels), borrowed(bounds)
    docs, out = borrowed(docs), borrowed_columns(out)
    firsts, code, shard = _first_documents(pieces, n, seq_len, docs)
    if code != OK:
        return -1, 1, code, shard, -1
    mask_starts = shift == 0 and labels.shape[0] > 0
    p = ahead = 0
    for b in range(rows):
        first = p
        p, ahead, failed, status, inside = _read_cast_row(
            b, p, ahead, pieces, requests, n, row, fds, addresses, sizes, use_pread, seq_len,
            inputs, labels, shift, bounds)
        if failed >= 0:
            return failed, status, OK, 0, -1
        if not inside:
            return -1, 1, OK, 0, b
        _, code, shard = _row_segments(b, first, pieces, n, seq_len, docs, firsts, labels,
                                       mask_starts, out)
        if code != OK:
            return -1, 1, code, shard, -1
    return -1, 1, OK, 0, -1


@njit(nogil=True, cache=True)
def read_windows(
    indices: np.ndarray, stride: int, n: int, count: int, shard_starts: np.ndarray,
    handles: np.ndarray, bases: np.ndarray, row: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray,
) -> tuple[int, int, int, int, int, int, int]:
    """``plan_windows``, then each window read into ``row`` (``n`` token
    records, reused, so it stays in the L1 cache) and cast into ``inputs`` and
    ``labels`` at once (``_read_cast_row``): the batch's records are never
    written. Straight from local files (``fds``, ``addresses``, ``sizes``:
    ``LocalStorage.files``); from mappings, the next window is prefetched
    while this one is cast. No document columns (``read_windows_segments``):
    this kernel compiles in a third of its time.

    Returns (bad index position, shard not open yet, failed request of
    ``plan_windows``'s, its ``read_request`` status or -2, ``OK``, 0, the first
    row with an id outside ``bounds``); the first three and the last are -1
    when there is no such thing (the shape ``read_windows_segments`` returns).
    Nothing is read when an index is bad or a shard is not open.
    """
    pieces, requests, closed, bad = plan_windows(
        indices, stride, n, count, shard_starts, handles, bases, row.itemsize
    )
    if bad >= 0 or closed >= 0:
        return bad, closed, -1, 1, OK, 0, -1
    failed, status, wrong = _read_planned(pieces, requests, indices.shape[0], n, row, fds,
                                          addresses, sizes, use_pread, seq_len, inputs,
                                          labels, shift, bounds)
    return -1, -1, failed, status, OK, 0, wrong


@njit(nogil=True, cache=True)
def read_windows_segments(
    indices: np.ndarray, stride: int, n: int, count: int, shard_starts: np.ndarray,
    handles: np.ndarray, bases: np.ndarray, row: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, docs: np.ndarray,
    out: tuple,
) -> tuple[int, int, int, int, int, int, int]:
    """``read_windows`` with each window's document columns, computed while
    the window is in cache (``_row_segments`` into ``out``; ``docs``: every
    shard's document offsets). Returns what ``read_windows`` returns, a
    ``BAD_DOCS`` code and its shard in the fifth and sixth items."""
    pieces, requests, closed, bad = plan_windows(
        indices, stride, n, count, shard_starts, handles, bases, row.itemsize
    )
    if bad >= 0 or closed >= 0:
        return bad, closed, -1, 1, OK, 0, -1
    failed, status, code, shard, wrong = _read_planned_segments(
        pieces, requests, indices.shape[0], n, row, fds, addresses, sizes, use_pread, seq_len,
        inputs, labels, shift, bounds, docs, out)
    return -1, -1, failed, status, code, shard, wrong


@njit(nogil=True, cache=True)
def window_columns_meta(
    pieces: np.ndarray, b_count: int, n: int, seq_len: int, docs: np.ndarray,
    doc_starts: np.ndarray,
    meta_ids: np.ndarray, entries: np.ndarray, index: np.ndarray, data: np.ndarray, head: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
           np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """``window_columns`` and ``meta_spans`` in one call.

    Returns ``window_columns``'s six arrays, then ``meta_spans``'s five, then
    (code, shard).
    """
    cu_offsets, cu, cu_lengths, doc_offsets, ids, nseg, code, shard = _segments(
        pieces, b_count, n, seq_len, docs, doc_starts
    )
    obs_begin = np.arange(b_count) * n
    obs_len = np.full(b_count, seq_len, np.int64)
    first, count, starts, ends, run_offsets, out, bounds, meta_code, meta_shard = _meta_plan(
        meta_ids, pieces, obs_begin, obs_len, entries, index, data, head
    )
    if code == OK:
        code, shard = meta_code, meta_shard
    cursor = np.zeros(3, np.int64)
    p = 0
    for b in range(b_count if code == OK else 0):
        while code == OK and p < pieces.shape[0] and pieces[p, OBS] == b:
            code = _meta_fill(p, cursor, meta_ids, pieces, obs_begin, obs_len, entries, index,
                              data, head, first, count, starts, ends, run_offsets, out, bounds)
            shard = pieces[p, SHARD]
            p += 1
        if code != OK:
            break
    _spread(run_offsets)
    return (cu_offsets, cu, cu_lengths, doc_offsets, ids, nseg,
            starts, ends, run_offsets, out, bounds, code, shard if code != OK else 0)


@njit(nogil=True, cache=True)
def _run_end(meta_ids: np.ndarray, t: int, hi: int, mid: np.uint32, guess: int) -> int:
    """The end of the run of ``mid`` that starts at ``t`` (ends at most at ``hi``).

    Tries ``t + guess`` first (spans tend to repeat their length), then gallops
    and bisects: runs are contiguous, so a probe that still sees ``mid``
    vouches for every token before it (``verify`` checks each token).
    """
    end = t + guess
    if guess > 0 and end <= hi and meta_ids[end - 1] == mid and (
        end == hi or meta_ids[end] != mid
    ):
        return end
    known = t
    step = 1
    while known + step < hi and meta_ids[known + step] == mid:
        known += step
        step *= 2
    bad = min(known + step, hi)
    while bad - known > 1:
        middle = (known + bad) // 2
        if meta_ids[middle] == mid:
            known = middle
        else:
            bad = middle
    return bad


@njit(nogil=True, cache=True)
def _piece_bounds(
    pieces: np.ndarray, p: int, obs_begin: np.ndarray, obs_len: np.ndarray
) -> tuple[int, int]:
    """The tokens of piece ``p`` inside its observation: [lo, hi) of the batch buffer."""
    lo = pieces[p, DEST]
    return lo, min(lo + pieces[p, LENGTH], obs_begin[pieces[p, OBS]] + obs_len[pieces[p, OBS]])


@njit(nogil=True, cache=True)
def _meta_plan(
    meta_ids: np.ndarray, pieces: np.ndarray, obs_begin: np.ndarray, obs_len: np.ndarray,
    entries: np.ndarray, index: np.ndarray, data: np.ndarray, head: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
           np.ndarray, int, int]:
    """Each piece's entries from its first and last id, and the outputs sized
    for them: (first, count, starts, ends, run_offsets, bytes, bounds, code,
    shard)."""
    b_count = obs_begin.shape[0]
    n_pieces = pieces.shape[0]
    first = np.zeros(n_pieces, np.int64)
    count = np.zeros(n_pieces, np.int64)
    runs = np.int64(0)
    size = np.int64(0)
    code, shard = OK, 0
    for p in range(n_pieces):
        s = pieces[p, SHARD]
        t, hi = _piece_bounds(pieces, p, obs_begin, obs_len)
        while t < hi and meta_ids[t] == _NO_METADATA:
            t += 1
        if t == hi:
            continue
        u = hi - 1
        while meta_ids[u] == _NO_METADATA:
            u -= 1
        a, z = np.int64(meta_ids[t]), np.int64(meta_ids[u])
        if a >= entries[s] or z >= entries[s]:
            code, shard = BAD_META_ID, s
            break
        if z < a:
            code, shard = META_ORDER, s
            break
        offsets = offsets_at(index, s)
        if offsets[z + 1] < offsets[a] or offsets[z + 1] > np.uint64(data[s, 1]):
            code, shard = BAD_INDEX, s
            break
        first[p] = a
        count[p] = z - a + 1
        runs += z - a + 1
        size += np.int64(offsets[z + 1] - offsets[a])
    if code != OK:
        runs, size = np.int64(0), np.int64(0)
    return (first, count, np.empty(runs, np.int64), np.empty(runs, np.int64),
            np.zeros(b_count + 1, np.int64), np.empty(head + size, np.uint8),
            np.zeros(runs + 1, np.int64), code, shard)


@njit(nogil=True, cache=True, inline="always")
def _meta_fill(
    p: int, cursor: np.ndarray, meta_ids: np.ndarray, pieces: np.ndarray,
    obs_begin: np.ndarray, obs_len: np.ndarray, entries: np.ndarray, index: np.ndarray,
    data: np.ndarray,
    head: int, first: np.ndarray, count: np.ndarray, starts: np.ndarray, ends: np.ndarray,
    run_offsets: np.ndarray, out: np.ndarray, bounds: np.ndarray,
) -> int:
    """Walk piece ``p``'s runs and copy its entries; ``cursor`` holds (next
    run, next byte, last run length) across pieces. Returns a code."""
    b, s = pieces[p, OBS], pieces[p, SHARD]
    t, hi = _piece_bounds(pieces, p, obs_begin, obs_len)
    r, dest, guess = cursor[0], cursor[1], cursor[2]
    r0 = r
    origin = obs_begin[b]
    expect, last = first[p], first[p] + count[p]
    while t < hi:
        mid = meta_ids[t]
        if mid == _NO_METADATA:
            t += 1
            continue
        if np.int64(mid) != expect or expect >= last:
            return BAD_META_ID if np.int64(mid) >= entries[s] else META_ORDER
        expect += 1
        starts[r] = t - origin
        end = _run_end(meta_ids, t, hi, mid, guess)
        guess = end - t
        t = end
        ends[r] = t - origin
        r += 1
    run_offsets[b + 1] = r
    if count[p] > 0:
        offsets = offsets_at(index, s)
        a, z = first[p], first[p] + count[p]
        for e in range(a, z):
            if offsets[e + 1] < offsets[e]:
                return BAD_INDEX
            bounds[r0 + 1 + e - a] = dest + np.int64(offsets[e + 1] - offsets[a])
        length = np.int64(offsets[z] - offsets[a])
        source = bytes_at(data, s)
        start = np.int64(offsets[a])
        out[head + dest : head + dest + length] = source[start : start + length]
        dest += length
    cursor[0], cursor[1], cursor[2] = r, dest, guess
    return OK


@njit(nogil=True, cache=True)
def _spread(run_offsets: np.ndarray) -> None:
    """Observations without runs end where the previous one ends."""
    for b in range(1, run_offsets.shape[0]):
        run_offsets[b] = max(run_offsets[b], run_offsets[b - 1])


@njit(nogil=True, cache=True)
def meta_spans(
    meta_ids: np.ndarray, pieces: np.ndarray, obs_begin: np.ndarray, obs_len: np.ndarray,
    entries: np.ndarray, index: np.ndarray, data: np.ndarray, head: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Runs of one metadata entry inside each observation's tokens, and their
    entries' bytes.

    ``index`` holds each shard's ``.meta.index`` offsets (``entries + 1``) and
    ``data`` its ``.meta.data`` bytes. Within a piece entry ids must rise by
    exactly one from run to run, so a piece's entries are one contiguous range
    of its data file, found from its first and last id and copied at once.
    Returns (run starts and ends in observation coordinates, run offsets per
    observation, the entries' bytes after ``head`` spare bytes, entry bounds
    in them (runs + 1, from 0), code, shard).
    """
    first, count, starts, ends, run_offsets, out, bounds, code, shard = _meta_plan(
        meta_ids, pieces, obs_begin, obs_len, entries, index, data, head
    )
    cursor = np.zeros(3, np.int64)
    for p in range(pieces.shape[0] if code == OK else 0):
        code = _meta_fill(p, cursor, meta_ids, pieces, obs_begin, obs_len, entries, index,
                          data, head, first, count, starts, ends, run_offsets, out, bounds)
        if code != OK:
            return starts, ends, run_offsets, out, bounds, code, pieces[p, SHARD]
    _spread(run_offsets)
    return starts, ends, run_offsets, out, bounds, code, shard


@njit(nogil=True, cache=True)
def _first_entry_at(table: np.ndarray, lo: int, hi: int, record: int) -> int:
    """The first row in ``[lo, hi)`` of a ``meta.spans`` table (flat, three
    per row, sorted by start) whose start is at or after ``record``."""
    target = np.uint64(record)
    while lo < hi:
        middle = (lo + hi) // 2
        if table[3 * middle] < target:
            lo = middle + 1
        else:
            hi = middle
    return lo


@njit(nogil=True, cache=True, inline="always")
def _sound_row(table: np.ndarray, e: int, records: int) -> bool:
    """Whether row ``e`` is a non-empty span inside the shard, of a known kind."""
    return table[3 * e] < table[3 * e + 1] <= np.uint64(records) and table[3 * e + 2] <= 1


@njit(nogil=True, cache=True)
def _annotation_range(
    meta_ids: np.ndarray, pieces: np.ndarray, p: int, obs_begin: np.ndarray,
    obs_len: np.ndarray, entries: np.ndarray, records: np.ndarray, table: np.ndarray,
) -> tuple[int, int, int]:
    """The candidate entries ``[lo, hi)`` of piece ``p`` (empty when no token
    of it is covered) and a code: ``lo`` is the first covered token's id, the
    smallest of any entry overlapping the piece; ``hi`` the first entry that
    starts after the piece."""
    s = pieces[p, SHARD]
    t, end = _piece_bounds(pieces, p, obs_begin, obs_len)
    first = t
    while t < end and meta_ids[t] == _NO_METADATA:
        t += 1
    if t == end:
        return 0, 0, OK
    lo = int(meta_ids[t])
    if lo >= entries[s]:
        return 0, 0, BAD_META_ID
    a = pieces[p, START]
    x = np.uint64(a + t - first)  # the covered token, in shard records
    if not _sound_row(table, lo, records[s]):
        return 0, 0, BAD_SPANS
    if not table[3 * lo] <= x < table[3 * lo + 1]:
        return 0, 0, META_ORDER
    return lo, _first_entry_at(table, lo, int(entries[s]), a + end - first), OK


@njit(nogil=True, cache=True)
def annotation_spans(
    meta_ids: np.ndarray, pieces: np.ndarray, obs_begin: np.ndarray, obs_len: np.ndarray,
    entries: np.ndarray, records: np.ndarray, index: np.ndarray, data: np.ndarray,
    spans: np.ndarray, head: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Every entry overlapping each observation, in a version-2 dataset
    (``meta.spans`` tables in ``spans``, flat ``<u8``, three per entry).

    Per piece, the candidates are one contiguous id range (``_annotation_range``),
    so one index range and one data range per shard; those that overlap the
    piece are kept, clipped to it, and their bytes copied.
    Returns (starts and ends in observation coordinates, kinds, run offsets
    per observation, the entries' bytes after ``head`` spare bytes, entry
    bounds in them (runs + 1, from 0), code, shard).
    """
    n_pieces = pieces.shape[0]
    b_count = obs_begin.shape[0]
    lows = np.zeros(n_pieces, np.int64)
    highs = np.zeros(n_pieces, np.int64)
    runs = np.int64(0)
    size = np.int64(0)
    code, shard = OK, 0
    for p in range(n_pieces):
        s = pieces[p, SHARD]
        table = offsets_at(spans, s)
        lo, hi, code = _annotation_range(meta_ids, pieces, p, obs_begin, obs_len, entries,
                                         records, table)
        t, end = _piece_bounds(pieces, p, obs_begin, obs_len)
        a = np.uint64(pieces[p, START])
        b = np.uint64(pieces[p, START] + end - t)
        offsets = offsets_at(index, s)
        limit = np.uint64(data[s, 1])
        for e in range(lo, hi):  # empty when code != OK
            if not _sound_row(table, e, records[s]):
                code = BAD_SPANS
                break
            if table[3 * e + 1] > a and table[3 * e] < b:
                if not offsets[e] <= offsets[e + 1] <= limit:
                    code = BAD_INDEX
                    break
                runs += 1
                size += np.int64(offsets[e + 1] - offsets[e])
        if code != OK:
            shard = s
            break
        lows[p], highs[p] = lo, hi
    if code != OK:
        return (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64),
                np.zeros(b_count + 1, np.int64), np.empty(head, np.uint8),
                np.zeros(1, np.int64), code, shard)
    starts = np.empty(runs, np.int64)
    ends = np.empty(runs, np.int64)
    kinds = np.empty(runs, np.int64)
    run_offsets = np.zeros(b_count + 1, np.int64)
    out = np.empty(head + size, np.uint8)
    bounds = np.zeros(runs + 1, np.int64)
    r = 0
    dest = np.int64(head)
    for p in range(n_pieces):
        s, obs = pieces[p, SHARD], pieces[p, OBS]
        table, offsets = offsets_at(spans, s), offsets_at(index, s)
        source = bytes_at(data, s)
        t, end = _piece_bounds(pieces, p, obs_begin, obs_len)
        a = pieces[p, START]
        b = a + end - t
        shift = t - obs_begin[obs] - a  # shard records -> observation coordinates
        for e in range(lows[p], highs[p]):
            start, stop = np.int64(table[3 * e]), np.int64(table[3 * e + 1])
            if stop > a and start < b:
                starts[r] = max(start, a) + shift
                ends[r] = min(stop, b) + shift
                kinds[r] = np.int64(table[3 * e + 2])
                first, last = np.int64(offsets[e]), np.int64(offsets[e + 1])
                out[dest : dest + last - first] = source[first:last]
                dest += last - first
                r += 1
                bounds[r] = dest - head
        run_offsets[obs + 1] = r
    _spread(run_offsets)
    return starts, ends, kinds, run_offsets, out, bounds, OK, 0


@njit(nogil=True, cache=True)
def span_rows_status(table: np.ndarray, docs: np.ndarray, records: int) -> tuple[int, int]:
    """The first row of a shard's flat ``meta.spans`` table (three ``<u8`` per
    row) that breaks the spec, as ``(code, row)``; ``(OK, -1)`` when none does.

    ``BAD_SPANS``: what every read rejects (``_sound_row``: empty, past the
    shard's records, or of an unknown kind); ``SPAN_ORDER``: not sorted by
    start, then kind and end descending; ``SPAN_CROSSES``: not inside one
    document of ``docs`` (the shard's offsets, strictly increasing from 0 to
    ``records``). Compared as stored, unsigned: nothing can overflow. O(rows +
    documents).
    """
    d = 0
    last = docs.shape[0] - 1
    for e in range(table.shape[0] // 3):
        if not _sound_row(table, e, records):
            return BAD_SPANS, e
        start, end, kind = table[3 * e], table[3 * e + 1], table[3 * e + 2]
        if e > 0:
            before, before_end, before_kind = table[3 * e - 3], table[3 * e - 2], table[3 * e - 1]
            if before > start or (before == start and (
                    before_kind < kind or (before_kind == kind and before_end < end))):
                return SPAN_ORDER, e
        while d + 1 < last and docs[d + 1] <= start:
            d += 1
        if d + 1 > last or end > docs[d + 1]:
            return SPAN_CROSSES, e
    return OK, -1


@njit(nogil=True, cache=True, inline="always")
def count_at_or_below(table: np.ndarray, value: int, lo: int, hi: int) -> int:
    """How many entries of the sorted ``table[:hi]`` are at or below ``value``,
    knowing that the first ``lo`` are (a binary search of ``[lo, hi)``)."""
    while lo < hi:
        middle = (lo + hi) >> 1
        if table[middle] <= value:
            lo = middle + 1
        else:
            hi = middle
    return lo


@njit(nogil=True, cache=True, inline="always")
def _shard_from(shard_starts: np.ndarray, first: int, record: int) -> int:
    """``np.searchsorted(shard_starts, record, side="right") - 1`` when
    ``shard_starts[first] <= record``: a gallop from ``first``, then a binary
    search of the last stride. A window lies in its dataset's first shard
    or the next ones: one comparison where a search of every dataset's
    shard starts took a dozen, each a branch the CPU cannot predict."""
    top = shard_starts.shape[0]
    lo, step = first, 1  # shard_starts[lo] <= record
    while lo + step < top and shard_starts[lo + step] <= record:
        lo += step
        step *= 2
    return count_at_or_below(shard_starts, record, lo + 1, min(lo + step, top)) - 1


@njit(nogil=True, cache=True)
def plan_window_rows(
    sources: np.ndarray, indices: np.ndarray, table: np.ndarray, n: int,
    shard_starts: np.ndarray, live: np.ndarray, bases: np.ndarray, sizes: np.ndarray,
    itemsize: int,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``plan_windows`` for windows of many datasets laid end to end in one
    record space: row ``b`` is window ``indices[b]`` of source ``s =
    sources[b]``, records ``[base + indices[b] * stride, ... + n)`` where
    ``table[s]`` is ``(base, stride, windows, first)``: ``first`` the global
    shard where the source's dataset starts (``shard_starts[first] == base``;
    base -1: a source that cannot be read; one row a source, half a cache
    line); ``shard_starts`` are every dataset's shard starts in that space,
    and global shard ``g`` is handle ``g`` of the tables ``read_window_rows``
    takes. Shard ``g`` is open when ``sizes[g] >= 0`` and the int64 at
    address ``live[g]`` (its dataset's own handle of it, -1 once closed) is
    ``>= 0``; ``bases[g]`` is the byte where its records start in its file.

    Returns (pieces, requests, the first shard not open or -1, the first row
    whose source has no base (< 0) or whose index is out of range, or -1)."""
    rows = indices.shape[0]
    total = 0
    firsts = np.empty(rows, np.int64)  # each row's first shard
    for b in range(rows):
        s, i = sources[b], indices[b]
        if s < 0 or s >= table.shape[0] or table[s, 0] < 0 or i < 0 or i >= table[s, 2]:
            return np.empty((0, 5), np.int64), np.empty((4, 0), np.int64), -1, b
        g = table[s, 0] + i * table[s, 1]
        s0 = _shard_from(shard_starts, table[s, 3], g)
        firsts[b] = s0
        total += _shard_from(shard_starts, s0, g + n - 1) - s0 + 1
    pieces = np.empty((total, 5), np.int64)
    requests = np.empty((4, total), np.int64)
    p, closed = 0, -1
    for b in range(rows):
        g = table[sources[b], 0] + indices[b] * table[sources[b], 1]
        end = g + n
        s = firsts[b]
        pos = g
        while pos < end:
            take = min(end, shard_starts[s + 1]) - pos
            if take > 0:
                pieces[p, OBS] = b
                pieces[p, SHARD] = s
                pieces[p, START] = pos - shard_starts[s]
                pieces[p, LENGTH] = take
                pieces[p, DEST] = b * n + pos - g
                is_open = sizes[s] >= 0 and np.int64(_load_u64(live[s])) >= 0
                requests[0, p] = s if is_open else -1
                requests[1, p] = bases[s] + pieces[p, START] * itemsize
                requests[2, p] = take * itemsize
                requests[3, p] = pieces[p, DEST] * itemsize
                if not is_open and closed < 0:
                    closed = s
                p += 1
                pos += take
            s += 1
    return pieces[:p], requests[:, :p], closed, -1


@njit(nogil=True, cache=True)
def read_window_rows(
    sources: np.ndarray, indices: np.ndarray, table: np.ndarray, n: int,
    shard_starts: np.ndarray, live: np.ndarray, bases: np.ndarray, row: np.ndarray,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray,
) -> tuple[int, int, int, int, int, int, int]:
    """``read_windows`` over windows of many datasets (``plan_window_rows``),
    in row order, in one call: ``fds``, ``addresses`` and ``sizes`` are one
    table indexed by global shard. Returns (bad row, shard not open, the row of
    the failed request, its status, ``OK``, 0, the first row with an id
    outside ``bounds``), -1 for what did not happen, as ``read_windows``."""
    pieces, requests, closed, bad = plan_window_rows(
        sources, indices, table, n, shard_starts, live, bases, sizes, row.itemsize)
    if bad >= 0 or closed >= 0:
        return bad, closed, -1, 1, OK, 0, -1
    failed, status, wrong = _read_planned(pieces, requests, indices.shape[0], n, row, fds,
                                          addresses, sizes, use_pread, seq_len, inputs,
                                          labels, shift, bounds)
    if failed >= 0:
        failed = pieces[failed, OBS]
    return -1, -1, failed, status, OK, 0, wrong


@njit(nogil=True, cache=True)
def read_window_rows_segments(
    sources: np.ndarray, indices: np.ndarray, table: np.ndarray, n: int,
    shard_starts: np.ndarray, live: np.ndarray, bases: np.ndarray, row: np.ndarray,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, docs: np.ndarray,
    out: tuple,
) -> tuple[int, int, int, int, int, int, int]:
    """``read_window_rows`` with the document columns (``docs``: every global
    shard's document offsets; ``out`` as ``read_windows_segments``'s).
    Returns what ``read_window_rows`` returns, a ``BAD_DOCS`` code and its
    global shard in the fifth and sixth items."""
    pieces, requests, closed, bad = plan_window_rows(
        sources, indices, table, n, shard_starts, live, bases, sizes, row.itemsize)
    if bad >= 0 or closed >= 0:
        return bad, closed, -1, 1, OK, 0, -1
    failed, status, code, shard, wrong = _read_planned_segments(
        pieces, requests, indices.shape[0], n, row, fds, addresses, sizes, use_pread, seq_len,
        inputs, labels, shift, bounds, docs, out)
    if failed >= 0:
        failed = pieces[failed, OBS]
    return -1, -1, failed, status, code, shard, wrong
