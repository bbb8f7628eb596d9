"""Numba kernels of ``zerobatch.packing``: pieces, best-fit decreasing, a batch's rows.

Kernels never raise: they return what the Python caller checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from zerobatch._jit import njit
from zerobatch.storage.local import mapped_records, prefetch_request, read_request
from zerobatch.stream.manifest import TOKEN

__all__ = ["DROP", "POLICIES", "SPLIT", "TRUNCATE", "best_fit_decreasing", "fill_batch",
           "kernel_records", "make_pieces", "read_contract", "reorder_rows", "row_windows",
           "scatter_rows", "window_rows"]

_ctz: Any = trailing_zeros  # a Numba intrinsic: the zero bits below a word's lowest 1

TRUNCATE, SPLIT, DROP = 0, 1, 2
POLICIES = {"truncate": TRUNCATE, "split": SPLIT, "drop": DROP}

@njit(cache=True, nogil=True)
def make_pieces(lengths: np.ndarray, seq_len: int, policy: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of the documents of ``lengths`` under ``policy``: (doc, start,
    length) per piece, documents in order, and stats ``[dropped documents,
    dropped tokens, cut documents (truncated or split), tokens placed]``."""
    n = lengths.shape[0]
    count = 0
    for j in range(n):
        length = lengths[j]
        if length <= seq_len:
            count += 1 if length > 0 else 0
        elif policy == SPLIT:
            count += (length + seq_len - 1) // seq_len
        elif policy == TRUNCATE:
            count += 1
    doc = np.empty(count, np.int64)
    start = np.empty(count, np.int64)
    size = np.empty(count, np.int64)
    stats = np.zeros(4, np.int64)
    p = 0
    for j in range(n):
        length = lengths[j]
        if length <= 0:
            continue
        if length <= seq_len:
            doc[p], start[p], size[p] = j, 0, length
            p += 1
            stats[3] += length
        elif policy == SPLIT:
            at = 0
            while at < length:
                doc[p], start[p], size[p] = j, at, min(seq_len, length - at)
                at += seq_len
                p += 1
            stats[2] += 1
            stats[3] += length
        elif policy == TRUNCATE:
            doc[p], start[p], size[p] = j, 0, seq_len
            p += 1
            stats[1] += length - seq_len
            stats[2] += 1
            stats[3] += seq_len
        else:
            stats[0] += 1
            stats[1] += length
    return doc, start, size, stats


@njit(cache=True, nogil=True)
def best_fit_decreasing(size: np.ndarray, seq_len: int) -> tuple[np.ndarray, int]:
    """Best-fit decreasing of pieces of ``size`` (each in ``[1, seq_len]``) into
    rows of ``seq_len``: pieces go longest first (ties in input order) into the
    open row with the least room that fits them (ties: the row that reached
    that room last), else a new row. A two-level bitmap of the rooms that have
    an open row finds that row in O(1 + seq_len / 4096) word operations.
    Returns each piece's row and the row count."""
    n = size.shape[0]
    # counting sort, longest first, stable
    counts = np.zeros(seq_len + 2, np.int64)
    for i in range(n):
        counts[size[i]] += 1
    first = np.empty(seq_len + 2, np.int64)
    at = 0
    for length in range(seq_len, 0, -1):
        first[length] = at
        at += counts[length]
    order = np.empty(n, np.int64)
    for i in range(n):
        order[first[size[i]]] = i
        first[size[i]] += 1
    # Rooms with an open row: bit r of ``bits`` (one bit per room 0..seq_len),
    # bit w of ``summary`` when word w of ``bits`` has one: the smallest room
    # >= length is a trailing-zero count in one word, or after a short scan.
    words = (seq_len >> 6) + 1
    bits = np.zeros(words, np.uint64)
    summary = np.zeros((words >> 6) + 1, np.uint64)
    one = np.uint64(1)
    head = np.full(seq_len + 1, -1, np.int64)  # room -> last row with that room
    below = np.empty(n, np.int64)  # row -> the next row with the same room
    row_of = np.empty(n, np.int64)
    rows = 0
    for k in range(n):
        piece = order[k]
        length = size[piece]
        room = -1
        w = length >> 6
        word = bits[w] & ~((one << np.uint64(length & 63)) - one)
        if word != 0:
            room = (w << 6) + _ctz(word)
        else:  # the first word above w with a room, from the summary
            s = (w + 1) >> 6
            if s < summary.shape[0]:
                above = summary[s] & ~((one << np.uint64((w + 1) & 63)) - one)
                while above == 0 and s + 1 < summary.shape[0]:
                    s += 1
                    above = summary[s]
                if above != 0:
                    w = (s << 6) + _ctz(above)
                    room = (w << 6) + _ctz(bits[w])
        if room < 0:
            row = rows
            rows += 1
            left = seq_len - length
        else:
            row = head[room]
            head[room] = below[row]
            if head[room] < 0:  # no open row has this room any more
                w = room >> 6
                bits[w] &= ~(one << np.uint64(room & 63))
                if bits[w] == 0:
                    summary[w >> 6] &= ~(one << np.uint64(w & 63))
            left = room - length
        row_of[piece] = row
        if left > 0:
            below[row] = head[left]
            head[left] = row
            w = left >> 6
            bits[w] |= one << np.uint64(left & 63)
            summary[w >> 6] |= one << np.uint64(w & 63)
    return row_of, rows


@njit(cache=True, nogil=True)
def reorder_rows(row_of: np.ndarray, rows: int, rank: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Pieces grouped by row, row ``r`` of the output being packed row
    ``rank[r]``, pieces in input order within a row: (piece order, row offsets)."""
    n = row_of.shape[0]
    where = np.empty(rows, np.int64)  # packed row -> output row
    for r in range(rows):
        where[rank[r]] = r
    offsets = np.zeros(rows + 1, np.int64)
    for p in range(n):
        offsets[where[row_of[p]] + 1] += 1
    for r in range(rows):
        offsets[r + 1] += offsets[r]
    fill = offsets[:-1].copy()
    order = np.empty(n, np.int64)
    for p in range(n):
        r = where[row_of[p]]
        order[fill[r]] = p
        fill[r] += 1
    return order, offsets


@njit(cache=True, nogil=True)
def scatter_rows(sel: np.ndarray, lo: np.ndarray, hi: np.ndarray, row_offsets: np.ndarray,
                 doc: np.ndarray, start: np.ndarray, size: np.ndarray, out_doc: np.ndarray,
                 out_start: np.ndarray, out_size: np.ndarray) -> None:
    """Batch row ``sel[j]`` gets a window's pieces ``lo[j]:hi[j]`` at
    ``row_offsets[sel[j]]`` of the output piece arrays."""
    for j in range(sel.shape[0]):
        at = row_offsets[sel[j]]
        for p in range(lo[j], hi[j]):
            out_doc[at] = doc[p]
            out_start[at] = start[p]
            out_size[at] = size[p]
            at += 1


@njit(cache=True, nogil=True)
def window_rows(rows: np.ndarray, row_offsets: np.ndarray, doc: np.ndarray,
                start: np.ndarray, size: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The pieces of rows ``rows`` of one window (``row_offsets``, ``doc``,
    ``start``, ``size``: the window's), in that order: (row offsets ``[B + 1]``,
    doc, start, size, the first ``j`` with ``rows[j]`` out of range or -1)."""
    count = rows.shape[0]
    limit = row_offsets.shape[0] - 1
    out_offsets = np.zeros(count + 1, np.int64)
    for j in range(count):
        r = rows[j]
        if r < 0 or r >= limit:
            return out_offsets, doc[:0], start[:0], size[:0], j
        out_offsets[j + 1] = out_offsets[j] + row_offsets[r + 1] - row_offsets[r]
    total = out_offsets[count]
    out_doc = np.empty(total, np.int64)
    out_start = np.empty(total, np.int64)
    out_size = np.empty(total, np.int64)
    for j in range(count):
        at = out_offsets[j]
        for p in range(row_offsets[rows[j]], row_offsets[rows[j] + 1]):
            out_doc[at] = doc[p]
            out_start[at] = start[p]
            out_size[at] = size[p]
            at += 1
    return out_offsets, out_doc, out_start, out_size, -1


@njit(cache=True, nogil=True)
def fill_batch(values: np.ndarray, mask: np.ndarray, has_mask: bool, offsets: np.ndarray,
               start: np.ndarray, size: np.ndarray, row_offsets: np.ndarray, pad_id: int,
               out: np.ndarray, out_mask: np.ndarray) -> None:
    """Every token of ``out`` (and, with ``has_mask``, of ``out_mask``): row
    ``b`` gets pieces ``row_offsets[b]:row_offsets[b + 1]`` back to back (piece
    ``p`` is ``values[offsets[p] + start[p]:][:size[p]]``), then ``pad_id``
    (mask 0) to the row's end."""
    seq_len = out.shape[1]
    for b in range(row_offsets.shape[0] - 1):
        at = 0
        for p in range(row_offsets[b], row_offsets[b + 1]):
            begin = offsets[p] + start[p]
            n = size[p]
            if has_mask:
                for i in range(n):
                    out[b, at + i] = values[begin + i]
                    out_mask[b, at + i] = mask[begin + i]
            else:
                for i in range(n):
                    out[b, at + i] = values[begin + i]
            at += n
        for i in range(at, seq_len):
            out[b, i] = pad_id
            if has_mask:
                out_mask[b, i] = 0


@njit(cache=True, nogil=True)
def row_windows(ids: np.ndarray, row_bits: int, window_mask: int, windows: int
                ) -> tuple[int, int]:
    """(the first ``j`` whose row id ``ids[j]`` is negative or names a window
    ``>= windows``, or -1; the ``epoch << window bits | window`` key all the
    ids share, or -1 when they come from several windows or there are none)."""
    key = -1
    for j in range(ids.shape[0]):
        i = ids[j]
        if i < 0 or ((i >> row_bits) & window_mask) >= windows:
            return j, -1
        k = i >> row_bits
        if j == 0:
            key = k
        elif k != key:
            key = -2
    return -1, max(key, -1)


@njit(cache=True, nogil=True)
def _count_pieces(ids: np.ndarray, key: int, row_bits: int, row_offsets: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(the rows of ``ids`` in window ``key`` (``id >> row_bits``), their
    batch piece offsets ``[B + 1]``, the first ``j`` with ``ids[j]`` in
    another window (or negative) or with its row out of range, else -1, and
    -5 for the first case, 1 otherwise)."""
    count = ids.shape[0]
    limit = row_offsets.shape[0] - 1
    rows = np.empty(count, np.int64)
    out = np.zeros(count + 1, np.int64)
    for j in range(count):
        if ids[j] >> row_bits != key:
            return rows, out, j, -5
        r = ids[j] & ((1 << row_bits) - 1)
        if r >= limit:
            return rows, out, j, 1
        rows[j] = r
        out[j + 1] = out[j] + row_offsets[r + 1] - row_offsets[r]
    return rows, out, -1, 1


@njit(cache=True, nogil=True)
def read_contract(
    ids: np.ndarray, key: int, row_bits: int, row_offsets: np.ndarray, doc: np.ndarray,
    size: np.ndarray, shard: np.ndarray, record: np.ndarray, handles: np.ndarray, bases: np.ndarray,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool,
    records: np.ndarray, has_mask: bool, padding: np.ndarray, options: np.ndarray,
    input_ids: np.ndarray, labels: np.ndarray, position_ids: np.ndarray, seq_idx: np.ndarray,
    segment_ids: np.ndarray, attention_mask: np.ndarray, cu: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int, int, int, int, int, int]:
    """Rows ``ids`` (row ids: window ``key`` above ``row_bits``, the row below)
    of a packed window (``row_offsets``, ``doc``, ``size``, ``shard``,
    ``record``: its pieces grouped by row, each piece's shard and first
    record there) read straight from the local token files and written
    as the varlen contract in one pass. Every piece of the batch is
    prefetched first; then each piece's records (only its range of its
    document) are read where the file is mapped (``mapped_records``: no
    copy), else into ``records`` (``read_request``), both over
    ``LocalStorage.files``; cast into ``input_ids``, turned into labels, and
    the piece's position_ids, seq_idx (and ``segment_ids``/``attention_mask``
    when they have rows) written.

    ``records`` is a structured array of ``seq_len`` records whose dtype
    (:func:`kernel_records`) has a ``token`` and a ``mask`` field at their
    offsets in the stored record (``mask`` read only with ``has_mask``):
    Numba then knows the record stride and field types at compile time (one
    compiled kernel per record layout), and each loop runs over contiguous
    slices of the outputs, so the stores vectorize. ``handles`` and
    ``bases``: every shard's open handle (-1: not yet) and byte base.
    ``options``: (label mode 1 shifted / 2 aligned, pad_id). Rows with
    ``padding[j]`` get labels -100 throughout.

    Returns (batch piece offsets ``[B + 1]``, their documents, segments in
    ``cu``, max_seqlen, bad row position or -1, shard not open or -1, failed
    piece or -1, a status: its ``read_request`` status, -4 a piece that does
    not fit its row, -5 the bad row is in another window). Nothing is read
    when a row is bad or a shard is not open.
    """
    rows, out_offsets, bad, code = _count_pieces(ids, key, row_bits, row_offsets)
    count = rows.shape[0]
    out_doc = np.empty(out_offsets[count], np.int64)
    if bad >= 0:
        return out_offsets, out_doc, 0, 0, bad, -1, -1, code
    seq_len = input_ids.shape[1]
    itemsize = records.itemsize
    q = 0
    for j in range(count):  # check and prefetch every piece before reading any
        for p in range(row_offsets[rows[j]], row_offsets[rows[j] + 1]):
            sh = shard[p]
            if handles[sh] < 0:
                return out_offsets, out_doc, 0, 0, -1, sh, -1, 1
            if size[p] < 1 or size[p] > seq_len:
                return out_offsets, out_doc, 0, 0, -1, -1, p, -4
            out_doc[q] = doc[p]
            q += 1
            prefetch_request(handles[sh], bases[sh] + record[p] * itemsize, size[p] * itemsize,
                             addresses, sizes, use_pread)
    mode, pad_id = options[0], options[1]
    address = records.ctypes.data
    jax = segment_ids.shape[0] > 0
    attention = attention_mask.shape[0] > 0
    s = 0
    longest = 0
    cu[0] = 0
    for j in range(count):
        base = j * seq_len
        at = 0
        local = 1
        masked = padding.shape[0] > 0 and padding[j]
        for p in range(row_offsets[rows[j]], row_offsets[rows[j] + 1]):
            n = size[p]
            sh = shard[p]
            if at + n > seq_len:
                return out_offsets, out_doc, 0, 0, -1, -1, p, -4
            start = bases[sh] + record[p] * itemsize
            src, status = mapped_records(handles[sh], start, n, records, addresses, sizes,
                                         use_pread)
            if status == -2:  # no mapping: read into the buffer
                status = read_request(handles[sh], start, n * itemsize, address, fds,
                                      addresses, sizes, use_pread)
                src = records[:n]
            if status < 1:
                return out_offsets, out_doc, 0, 0, -1, -1, p, status
            # Slices of the outputs (indices from 0, never negative: no wraparound
            # checks), one simple loop per column: each vectorizes.
            ids = input_ids[j, at:at + n]
            for i in range(n):
                ids[i] = src[i].token
            lab = labels[j, at:at + n]
            if masked:
                lab[:] = -100
            elif mode == 1:  # shifted: the next token, where its mask takes the loss
                following = ids[1:]
                if has_mask:
                    ahead = src[1:n]
                    for i in range(n - 1):
                        lab[i] = following[i] if ahead[i].mask != 0 else -100
                else:
                    for i in range(n - 1):
                        lab[i] = following[i]
                lab[n - 1] = -100
            elif mode == 2:  # aligned: this token, not the first, where the mask takes it
                if has_mask:
                    for i in range(n):
                        lab[i] = ids[i] if src[i].mask != 0 else -100
                else:
                    for i in range(n):
                        lab[i] = ids[i]
                lab[0] = -100
            pos = position_ids[j, at:at + n]
            for i in range(n):
                pos[i] = i
            seq_idx[j, at:at + n] = s
            if jax:
                segment_ids[j, at:at + n] = local
            if attention:
                attention_mask[j, at:at + n] = 1
            at += n
            s += 1
            local += 1
            cu[s] = base + at
            longest = max(longest, n)
        if at < seq_len:  # the padding tail: a segment of its own
            input_ids[j, at:] = pad_id
            pos = position_ids[j, at:]
            for i in range(seq_len - at):
                pos[i] = i
            seq_idx[j, at:] = s
            if mode != 0:
                labels[j, at:] = -100
            if jax:
                segment_ids[j, at:] = 0
            if attention:
                attention_mask[j, at:] = 0
            longest = max(longest, seq_len - at)
            s += 1
            cu[s] = base + seq_len
    return out_offsets, out_doc, s, longest, -1, -1, -1, 1


def kernel_records(record_dtype: np.dtype, mask_field: str | None) -> np.dtype:
    """The dtype :func:`read_contract` reads records as: the stored record's
    bytes (its itemsize), a ``token`` field at the token's offset and a
    ``mask`` field at ``mask_field``'s (the token's own bytes when None: then
    never read). Records without fields (tokens alone) are their token."""
    fields: Any = record_dtype.fields
    if fields is None:
        token, token_at = record_dtype, 0
    else:
        token, token_at = fields[TOKEN][:2]
    mask, mask_at = (token, token_at) if mask_field is None else fields[mask_field][:2]
    return np.dtype({"names": ["token", "mask"], "formats": [token, mask],
                     "offsets": [token_at, mask_at], "itemsize": record_dtype.itemsize})
