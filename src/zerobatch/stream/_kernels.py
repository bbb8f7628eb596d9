"""Numba kernels of the read path: index math for a whole batch, GIL-free.

A *piece* is one contiguous read from one shard, a row of an ``(P, 5)`` int64
array: ``(observation, shard, first record in the shard, records, first record
in the batch buffer)``. Pieces are ordered by observation, then position.
Kernels report bad data as ``(code, shard)`` instead of raising, so the caller
can name the file; ``code == OK`` means no problem.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "BAD_DOCS",
    "BAD_INDEX",
    "BAD_META_ID",
    "META_ORDER",
    "OK",
    "meta_data_requests",
    "meta_runs",
    "plan_documents",
    "plan_windows",
    "window_columns",
]

OK, BAD_DOCS, BAD_META_ID, META_ORDER, BAD_INDEX = 0, 1, 2, 3, 4
_NO_METADATA = np.uint32(2**32 - 1)
OBS, SHARD, START, LENGTH, DEST = 0, 1, 2, 3, 4
_OFFSET_BYTES = 8  # one <u8 of a .docs or .meta.index file


@njit(nogil=True, cache=True)
def plan_windows(
    indices: np.ndarray, stride: int, n: int, count: int, shard_starts: np.ndarray
) -> tuple[np.ndarray, int]:
    """Pieces for windows ``[i * stride, i * stride + n)``; -1 or the first bad position."""
    total = 0
    for b in range(indices.shape[0]):
        i = indices[b]
        if i < 0 or i >= count:
            return np.empty((0, 5), np.int64), b
        g = i * stride
        s0 = np.searchsorted(shard_starts, g, side="right") - 1
        s1 = np.searchsorted(shard_starts, g + n - 1, side="right") - 1
        total += s1 - s0 + 1
    pieces = np.empty((total, 5), np.int64)
    p = 0
    for b in range(indices.shape[0]):
        g = indices[b] * stride
        end = g + n
        s = np.searchsorted(shard_starts, g, side="right") - 1
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
    return pieces[:p], -1


@njit(nogil=True, cache=True)
def plan_documents(
    indices: np.ndarray, max_len: int, doc_starts: np.ndarray, docs: list, records: np.ndarray
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
        s = np.searchsorted(doc_starts, d, side="right") - 1
        k = d - doc_starts[s]
        table = docs[s]
        start = np.int64(table[k])
        end = np.int64(table[k + 1])
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


@njit(nogil=True, cache=True)
def window_columns(
    tokens: np.ndarray, pieces: np.ndarray, n: int, seq_len: int,
    docs: list, doc_starts: np.ndarray,
    inputs: np.ndarray, labels: np.ndarray, positions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Every column of a window batch in one pass over ``tokens`` (``[B, n]``).

    Writes ``inputs = tokens[:, :seq_len]`` and ``labels = tokens[:, 1:]`` cast
    (skipped when ``inputs`` has no rows; ``labels`` may have none) and
    ``positions`` (0 at the window start and at each document start), row by
    row, so each row is read once while it is in cache. Returns (cu_seqlens
    offsets, values and per-window lengths, doc-id offsets, doc ids and
    per-window lengths, code, shard).
    """
    b_count = tokens.shape[0]
    nseg = np.zeros(b_count, np.int64)
    for p in range(pieces.shape[0]):
        b, s, a = pieces[p, OBS], pieces[p, SHARD], pieces[p, START]
        m = min(pieces[p, LENGTH], seq_len - (pieces[p, DEST] - b * n))
        if m <= 0:
            continue
        table = docs[s]
        k0 = np.searchsorted(table, a, side="right") - 1
        k1 = np.searchsorted(table, a + m, side="left")
        # Offsets must rise from k0 to k1 and bracket [a, a + m); else the file lies.
        if k0 < 0 or k1 <= k0 or k1 >= table.shape[0]:
            return nseg, np.empty(0, np.int32), nseg, nseg, nseg, nseg, BAD_DOCS, s
        if not table[k0] <= a < table[k0 + 1] or not table[k1 - 1] < a + m <= table[k1]:
            return nseg, np.empty(0, np.int32), nseg, nseg, nseg, nseg, BAD_DOCS, s
        for j in range(k0, k1):
            if table[j] >= table[j + 1]:
                return nseg, np.empty(0, np.int32), nseg, nseg, nseg, nseg, BAD_DOCS, s
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
        table = docs[s]
        k0 = np.searchsorted(table, a, side="right") - 1
        k1 = np.searchsorted(table, a + m, side="left")
        for j in range(k0, k1):
            start = c if j == k0 else c + np.int64(table[j]) - a
            cu[cu_offsets[b] + filled[b]] = start
            ids[doc_offsets[b] + filled[b]] = doc_starts[s] + j
            filled[b] += 1
    decode = inputs.shape[0] > 0
    shifted = labels.shape[0] > 0
    for b in range(b_count):
        last = cu_offsets[b + 1] - 1
        cu[last] = seq_len
        source = tokens[b]
        if decode:
            target = inputs[b]
            for t in range(seq_len):  # row views: the loops vectorize
                target[t] = source[t]
            if shifted:
                target = labels[b]
                for t in range(seq_len):
                    target[t] = source[t + 1]
        row = positions[b]
        for q in range(cu_offsets[b], last):
            segment = row[np.int64(cu[q]) : np.int64(cu[q + 1])]
            for t in range(segment.shape[0]):
                segment[t] = t
    return cu_offsets, cu, cu_lengths, doc_offsets, ids, nseg, OK, 0


@njit(nogil=True, cache=True)
def _run_end(meta_ids: np.ndarray, t: int, hi: int, mid: np.uint32) -> int:
    """The end of the run of ``mid`` that starts at ``t`` (ends at most at ``hi``).

    Gallops, then bisects: runs are contiguous, so a probe that still sees
    ``mid`` vouches for every token before it (``verify`` checks each token).
    """
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
def meta_runs(
    meta_ids: np.ndarray, pieces: np.ndarray, obs_begin: np.ndarray, obs_len: np.ndarray,
    entries: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.int64 | int, int, int]:
    """Runs of one metadata entry inside each observation's tokens.

    Returns (run starts and ends in observation coordinates, run offsets per
    observation, requests ``(Q, 5)``: shard, first entry, entries, index byte
    offset, destination in the index buffer; index bytes in all, code, shard).
    Within a piece entry ids must rise by exactly one from run to run.
    """
    b_count = obs_begin.shape[0]
    starts = np.empty(64 + b_count * 64, np.int64)  # grown by doubling when full
    ends = np.empty(starts.shape[0], np.int64)
    run_offsets = np.zeros(b_count + 1, np.int64)
    requests = np.empty((pieces.shape[0], 5), np.int64)
    r = 0
    q = 0
    index_bytes = np.int64(0)
    for p in range(pieces.shape[0]):
        b, s = pieces[p, OBS], pieces[p, SHARD]
        lo = pieces[p, DEST]
        hi = min(lo + pieces[p, LENGTH], obs_begin[b] + obs_len[b])
        first = np.int64(-1)
        last = np.int64(-1)
        t = lo
        while t < hi:
            mid = meta_ids[t]
            if mid == _NO_METADATA:
                t += 1
                continue
            value = np.int64(mid)
            if value >= entries[s]:
                return starts, ends, run_offsets, requests, 0, BAD_META_ID, s
            if first < 0:
                first = value
            elif value != last + 1:
                return starts, ends, run_offsets, requests, 0, META_ORDER, s
            last = value
            if r == starts.shape[0]:
                starts = np.concatenate((starts, np.empty(r, np.int64)))
                ends = np.concatenate((ends, np.empty(r, np.int64)))
            starts[r] = t - obs_begin[b]
            t = _run_end(meta_ids, t, hi, mid)
            ends[r] = t - obs_begin[b]
            r += 1
        if first >= 0:
            requests[q, 0] = s
            requests[q, 1] = first
            requests[q, 2] = last - first + 1
            requests[q, 3] = first * _OFFSET_BYTES
            requests[q, 4] = index_bytes
            index_bytes += (last - first + 2) * _OFFSET_BYTES
            q += 1
        run_offsets[b + 1] = r
    for b in range(1, b_count + 1):
        run_offsets[b] = max(run_offsets[b], run_offsets[b - 1])
    return starts[:r], ends[:r], run_offsets, requests[:q], index_bytes, OK, 0


@njit(nogil=True, cache=True)
def meta_data_requests(
    index: np.ndarray, requests: np.ndarray, data_sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Data reads for the index ranges read for ``requests``.

    ``index`` holds, per request, its ``count + 1`` byte offsets, back to back.
    Returns (data reads ``(Q, 3)`` offset/length/destination, entry offsets into
    the data buffer (entries + 1), code, shard).
    """
    total = 0
    for q in range(requests.shape[0]):
        total += requests[q, 2]
    reads = np.empty((requests.shape[0], 3), np.int64)
    bounds = np.zeros(total + 1, np.int64)
    pos = 0
    e = 0
    dest = np.int64(0)
    for q in range(requests.shape[0]):
        s, count = requests[q, 0], requests[q, 2]
        first = index[pos]
        for k in range(count):
            if index[pos + k + 1] < index[pos + k]:
                return reads, bounds, BAD_INDEX, s
        end = index[pos + count]
        if end > np.uint64(data_sizes[s]):
            return reads, bounds, BAD_INDEX, s
        for k in range(count):
            bounds[e + 1] = dest + np.int64(index[pos + k + 1] - first)
            e += 1
        reads[q, 0] = np.int64(first)
        reads[q, 1] = np.int64(end - first)
        reads[q, 2] = dest
        dest += np.int64(end - first)
        pos += count + 1
    return reads, bounds, OK, 0
