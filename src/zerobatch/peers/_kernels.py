"""Numba kernels of the peer readers: a format's boundary table to document
offsets in one pass; an MDS batch's reads split at sample bounds, and their
sample headers checked. They return a status code and never raise; the callers
turn it into a ``FormatError`` naming the file and field."""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, typed

from zerobatch.storage.local import _pointer
from zerobatch.stream import _kernels as stream_kernels

__all__ = ["BAD_INDICES", "BAD_LENGTH", "BAD_POINTER", "OK", "gather", "mds_check", "mds_pieces",
           "megatron_offsets", "piece_tables", "plan_mapped_documents", "search_right"]

_OBS, _SHARD, _START, _LENGTH, _DEST = (stream_kernels.OBS, stream_kernels.SHARD,
                                        stream_kernels.START, stream_kernels.LENGTH,
                                        stream_kernels.DEST)
_DOCS_OK, _BAD_DOCS = stream_kernels.OK, stream_kernels.BAD_DOCS

OK, BAD_LENGTH, BAD_POINTER, BAD_INDICES = 0, 1, 2, 3


@njit(nogil=True, cache=True)
def megatron_offsets(
    lengths: np.ndarray, pointers: np.ndarray, indices: np.ndarray, itemsize: int,
    records: int,
) -> tuple[np.ndarray, int, int]:
    """Token offsets of the documents of at least one token, from Megatron's
    ``lengths`` (``<i4``), ``pointers`` (``<i8`` bytes) and ``document_indices``
    (``<i8``): ``(offsets[:count + 1], code, at)``; ``at`` is the first bad
    entry when ``code`` is not ``OK``. Checks every length non-negative, each
    pointer the previous one's end (the first 0, the last ending at
    ``records``), and the indices non-decreasing from 0 to the sequences."""
    sequences = lengths.shape[0]
    out = np.empty(indices.shape[0], np.uint64)
    end = np.int64(0)
    for i in range(sequences):
        if lengths[i] < 0:
            return out[:0], BAD_LENGTH, i
        if pointers[i] != end:
            return out[:0], BAD_POINTER, i
        end += np.int64(lengths[i]) * itemsize
    if end != records * itemsize:
        return out[:0], BAD_POINTER, sequences
    count = 0
    previous = np.int64(0)
    for d in range(indices.shape[0]):
        s = indices[d]
        if s < previous or s > sequences or (d == 0 and s != 0):
            return out[:0], BAD_INDICES, d
        previous = s
        start = np.uint64(records) if s == sequences else np.uint64(pointers[s] // itemsize)
        if count == 0 or start > out[count - 1]:
            out[count] = start
            count += 1
    if indices[indices.shape[0] - 1] != sequences:
        return out[:0], BAD_INDICES, indices.shape[0] - 1
    if count == 0 or out[count - 1] != np.uint64(records):
        out[count] = np.uint64(records)
        count += 1
    return out[:count], OK, 0


@njit(nogil=True, cache=True, inline="always")
def _count_at_or_below(table: np.ndarray, value: int) -> int:
    """How many entries of the sorted ``table`` are at or below ``value``."""
    lo, hi = 0, table.shape[0]
    while lo < hi:
        middle = (lo + hi) >> 1
        if table[middle] <= value:
            lo = middle + 1
        else:
            hi = middle
    return lo


@njit(nogil=True, cache=True)
def search_right(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per value, how many entries of the sorted ``table`` are at or below it
    (``np.searchsorted(side="right")``). Unlike NumPy's, it reads a table that
    is not aligned (Megatron's ``.idx`` tables lie at odd offsets) in place,
    touching O(log n) entries per value, where NumPy copies the whole table."""
    out = np.empty(values.shape[0], np.int64)
    for q in range(values.shape[0]):
        out[q] = _count_at_or_below(table, values[q])
    return out


@njit(nogil=True, cache=True)
def gather(table: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``table[positions]``, read in place even when ``table`` is not aligned."""
    out = np.empty(positions.shape[0], table.dtype)
    for i in range(positions.shape[0]):
        out[i] = table[positions[i]]
    return out


@njit(nogil=True, cache=True)
def mds_pieces(
    shards: np.ndarray, first: np.ndarray, count: np.ndarray, handles: np.ndarray,
    dest: np.ndarray, itemsize: int, total: int, first_len: int, entries: bool, per: int,
    size: int, fixed_first: np.ndarray, before: int, tokens: np.ndarray, values: np.ndarray,
    begins: np.ndarray, ends: np.ndarray, headers: np.ndarray, shard_samples: np.ndarray,
    shard_tokens: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """An MDS batch's reads: requests ``(shard, first record, count)`` over each
    shard's tokens (with a handle and a byte destination) split at sample
    bounds. With ``per > 0`` every sample holds ``per`` tokens in ``size``
    bytes (``fixed_first``: each shard's first sample byte, ``before``: bytes
    before the values); else the global tables (``tokens``: ``[samples + 1]``
    token offsets over all shards, per sample its ``values``, ``begins``,
    ``ends`` and ``headers`` bytes; ``shard_samples``/``shard_tokens``: each
    shard's first sample and token).

    Returns ``(requests (4, 3n), pieces (7, n), bytes)``: ``n`` value reads into
    the batch buffer (bytes ``[0, total)``), then ``n`` reads of ``first_len``
    bytes (a sample's size prefix at its start, or with ``entries`` its two
    offsets-table entries), then ``n`` shape-header reads, into one scratch
    buffer of ``bytes``; per piece its shard, sample in the shard, token
    count, start and end bytes, value byte and header bytes."""
    requests_in = shards.shape[0]
    low_sample = np.zeros(requests_in, np.int64)
    high_sample = np.zeros(requests_in, np.int64)
    n = 0
    for p in range(requests_in):
        if count[p] <= 0:
            continue
        if per > 0:
            low_sample[p] = first[p] // per
            high_sample[p] = (first[p] + count[p] - 1) // per + 1
        else:
            at = shard_tokens[shards[p]] + first[p]
            low_sample[p] = np.searchsorted(tokens, at, side="right") - 1
            high_sample[p] = np.searchsorted(tokens, at + count[p], side="left")
        n += high_sample[p] - low_sample[p]
    requests = np.empty((4, 3 * n), np.int64)
    pieces = np.empty((7, n), np.int64)
    header_at = total + n * first_len
    k = 0
    for p in range(requests_in):
        s = shards[p]
        for g in range(low_sample[p], high_sample[p]):
            if per > 0:
                local, start, tokens_in = g, g * per, per
                begin = fixed_first[s] + g * size
                end, value, head = begin + size, begin + before, 0
            else:
                local = g - shard_samples[s]
                start = tokens[g] - shard_tokens[s]
                tokens_in = tokens[g + 1] - tokens[g]
                begin, end, value, head = begins[g], ends[g], values[g], headers[g]
            low = max(start, first[p])
            high = min(start + tokens_in, first[p] + count[p])
            requests[0, k] = handles[p]
            requests[1, k] = value + (low - start) * itemsize
            requests[2, k] = (high - low) * itemsize
            requests[3, k] = dest[p] + (low - first[p]) * itemsize
            requests[0, n + k] = handles[p]
            requests[1, n + k] = 4 * (1 + local) if entries else begin
            requests[2, n + k] = first_len
            requests[3, n + k] = total + k * first_len
            requests[0, 2 * n + k] = handles[p]
            requests[1, 2 * n + k] = value - head
            requests[2, 2 * n + k] = head
            requests[3, 2 * n + k] = header_at
            header_at += head
            pieces[0, k], pieces[1, k], pieces[2, k] = s, local, tokens_in
            pieces[3, k], pieces[4, k], pieces[5, k], pieces[6, k] = begin, end, value, head
            k += 1
    return requests, pieces, header_at


@njit(nogil=True, cache=True)
def _le(data: np.ndarray, at: int, count: int) -> int:
    """The unsigned little-endian integer of ``count`` bytes at ``at``."""
    value = np.int64(0)
    for i in range(count):
        value |= np.int64(data[at + i]) << (8 * i)
    return int(value)


@njit(nogil=True, cache=True)
def mds_check(
    scratch: np.ndarray, requests: np.ndarray, pieces: np.ndarray, first_len: int,
    sizes: np.ndarray, variable: np.ndarray, position: int, itemsize: int,
) -> int:
    """The first piece of ``mds_pieces`` whose sample's checked bytes (read into
    ``scratch``) disagree with the tables, or -1: the offsets-table entries
    (no variable-size column), or the size prefix (``sizes``: each column's
    fixed size; ``variable``: the columns with a prefix; the token column at
    ``position``) and the 1-D shape header."""
    n = pieces.shape[1]
    column_sizes = sizes.copy()
    for k in range(n):
        at = requests[3, n + k]
        begin, end, value, head = pieces[3, k], pieces[4, k], pieces[5, k], pieces[6, k]
        if variable.shape[0] == 0:
            if _le(scratch, at, 4) != begin or _le(scratch, at + 4, 4) != end:
                return k
        else:
            for v in range(variable.shape[0]):
                column_sizes[variable[v]] = _le(scratch, at + 4 * v, 4)
            before = np.int64(0)
            for c in range(position):
                before += column_sizes[c]
            if (first_len + column_sizes.sum() != end - begin
                    or begin + first_len + before + head != value
                    or column_sizes[position] != head + pieces[2, k] * itemsize):
                return k
        if head > 0:
            where = requests[3, 2 * n + k]
            width = head - 1
            code = 0 if width == 1 else 1 if width == 2 else 2 if width == 4 else 3
            if scratch[where] != (1 << 2 | code) or _le(scratch, where + 1, width) != pieces[2, k]:
                return k
    return -1


@njit(cache=True)
def piece_tables(values: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 example: np.ndarray) -> typed.List:
    """The typed list of ``values[starts[i]:ends[i]]`` (read-only views, the
    type of ``example``), built in one call: the read kernels' per-piece
    offset tables without one Python call per table."""
    out = typed.List()
    out.append(example)  # types the list
    out.pop()
    for i in range(starts.shape[0]):
        out.append(values[starts[i]:ends[i]])
    return out


@njit(nogil=True, cache=True)
def plan_mapped_documents(
    indices: np.ndarray, starts: np.ndarray, files: np.ndarray, entries: np.ndarray,
    firsts: np.ndarray, records: np.ndarray, addresses: np.ndarray, counts: np.ndarray,
    like: np.ndarray, max_len: int,
) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """``stream._kernels.plan_documents``'s result for documents whose offsets
    lie in mapped files: shard ``s``'s documents are ``starts[s]`` to
    ``starts[s + 1]`` (global ids), and document ``d`` of it spans tokens
    ``table[entries[s] + d] - firsts[s]`` to the next entry's, where ``table``
    is the ``counts[files[s]]`` entries of ``like``'s dtype mapped at
    ``addresses[files[s]]`` (Hugging Face's record batches: a list-offset
    table each; the caller keeps the mappings alive). Returns ``(pieces,
    offsets, bad index or -1, code, shard)``; an entry outside its table, an
    offset below the shard's first, going back or past its ``records`` is
    ``BAD_DOCS``; an empty document gets no piece and an empty row."""
    count = indices.shape[0]
    offsets = np.zeros(count + 1, np.int64)
    pieces = np.empty((count, 5), np.int64)
    documents = starts[starts.shape[0] - 1]
    for b in range(count):
        if indices[b] < 0 or indices[b] >= documents:
            return pieces[:0], offsets, b, _DOCS_OK, 0
    kept = 0
    for b in range(count):
        i = indices[b]
        s = _count_at_or_below(starts, i) - 1  # the last shard starting at or below i
        f = files[s]
        at = entries[s] + i - starts[s]
        if at < 0 or at + 1 >= counts[f]:
            offsets[:] = 0
            return pieces[:0], offsets, -1, _BAD_DOCS, s
        table = numba.carray(_pointer(addresses[f]), counts[f], like.dtype)
        begin = np.int64(table[at]) - firsts[s]
        end = np.int64(table[at + 1]) - firsts[s]
        if begin < 0 or end < begin or end > records[s]:
            offsets[:] = 0
            return pieces[:0], offsets, -1, _BAD_DOCS, s
        length = end - begin
        if 0 < max_len < length:
            length = max_len
        offsets[b + 1] = offsets[b] + length
        if length > 0:
            pieces[kept, _OBS] = b
            pieces[kept, _SHARD] = s
            pieces[kept, _START] = begin
            pieces[kept, _LENGTH] = length
            pieces[kept, _DEST] = offsets[b]
            kept += 1
    return pieces[:kept], offsets, -1, _DOCS_OK, 0
