"""Numba kernels of the peer readers: a format's boundary table to document
offsets in one pass; an MDS batch's reads split at sample bounds, and their
sample headers checked (or, from local files, windows read, checked and cast
in one call). They return a status code and never raise; the callers
turn it into a ``FormatError`` naming the file and field."""

from __future__ import annotations

import numba
import numpy as np

from zerobatch._jit import njit
from zerobatch.storage.local import (
    _LINE,
    _pointer,
    _prefetch,
    borrowed,
    mapped_records,
    prefetch_request,
    read_request,
)
from zerobatch.stream import _kernels as stream_kernels
from zerobatch.stream._kernels import count_at_or_below

__all__ = ["BAD_INDICES", "BAD_LENGTH", "BAD_POINTER", "BAD_SAMPLE", "MDS_ARRAYS",
           "MDS_BACKWARDS", "MDS_NOT_1D", "MDS_NOT_WHOLE", "MDS_OK", "MDS_SCALARS", "MDS_SHORT",
           "MDS_SIZES", "OK", "gather", "mds_check", "mds_header", "mds_pieces",
           "mds_read_requests", "mds_read_windows", "mds_read_windows_segments",
           "mds_sample_table", "megatron_offsets", "plan_mapped_documents", "search_right"]

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


@njit(nogil=True, cache=True)
def search_right(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per value, how many entries of the sorted ``table`` are at or below it
    (``np.searchsorted(side="right")``). Unlike NumPy's, it reads a table that
    is not aligned (Megatron's ``.idx`` tables lie at odd offsets) in place,
    touching O(log n) entries per value, where NumPy copies the whole table."""
    out = np.empty(values.shape[0], np.int64)
    for q in range(values.shape[0]):
        out[q] = count_at_or_below(table, values[q], 0, table.shape[0])
    return out


@njit(nogil=True, cache=True)
def gather(table: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``table[positions]``, read in place even when ``table`` is not aligned."""
    out = np.empty(positions.shape[0], table.dtype)
    for i in range(positions.shape[0]):
        out[i] = table[positions[i]]
    return out


@njit(nogil=True, cache=True, inline="always")
def _le(data: np.ndarray, at: int, count: int) -> int:
    """The unsigned little-endian integer of ``count`` bytes at ``at``."""
    value = np.int64(0)
    for i in range(count):
        value |= np.int64(data[at + i]) << (8 * i)
    return int(value)


@njit(nogil=True, cache=True, inline="always")
def _sample_ok(
    data: np.ndarray, at: int, where: int, first_len: int, begin: int, end: int, value: int,
    head: int, tokens_in: int, column_sizes: np.ndarray, variable: np.ndarray, position: int,
    itemsize: int,
) -> bool:
    """Whether one sample's checked bytes in ``data`` agree with its table
    entry (``begin``, ``end``, ``value``, ``head`` bytes, ``tokens_in``): at
    ``at`` its two offsets-table entries (no variable-size column) or its
    size prefix (``column_sizes``: each column's fixed size, overwritten with
    the prefix; ``variable``: the columns with one; the token column at
    ``position``), at ``where`` its 1-D shape header (``head`` bytes)."""
    if variable.shape[0] == 0:
        if _le(data, at, 4) != begin or _le(data, at + 4, 4) != end:
            return False
    else:
        for v in range(variable.shape[0]):
            column_sizes[variable[v]] = _le(data, at + 4 * v, 4)
        before = np.int64(0)
        for c in range(position):
            before += column_sizes[c]
        every = before  # (a loop, not .sum(): see zerobatch._jit)
        for c in range(position, column_sizes.shape[0]):
            every += column_sizes[c]
        if (first_len + every != end - begin
                or begin + first_len + before + head != value
                or column_sizes[position] != head + tokens_in * itemsize):
            return False
    if head > 0:
        width = head - 1
        code = 0 if width == 1 else 1 if width == 2 else 2 if width == 4 else 3
        if data[where] != (1 << 2 | code) or _le(data, where + 1, width) != tokens_in:
            return False
    return True


@njit(nogil=True, cache=True)
def mds_check(
    scratch: np.ndarray, requests: np.ndarray, pieces: np.ndarray, first_len: int,
    sizes: np.ndarray, variable: np.ndarray, position: int, itemsize: int,
) -> int:
    """The first piece of ``mds_pieces`` whose sample's checked bytes (read into
    ``scratch``) disagree with the tables (``_sample_ok``), or -1."""
    n = pieces.shape[1]
    column_sizes = sizes.copy()
    for k in range(n):
        if not _sample_ok(scratch, requests[3, n + k], requests[3, 2 * n + k], first_len,
                          pieces[3, k], pieces[4, k], pieces[5, k], pieces[6, k], pieces[2, k],
                          column_sizes, variable, position, itemsize):
            return k
    return -1


MDS_OK, MDS_BACKWARDS, MDS_SHORT, MDS_SIZES, MDS_NOT_WHOLE, MDS_NOT_1D = 0, 1, 2, 3, 4, 5
"""``mds_sample_table``'s codes: sound; a sample offset going backwards; a
sample shorter than its size prefix; column sizes that disagree with the
sample's bytes; a bytes column not a whole number of tokens; a column not a
1-D ndarray of at least one value."""


@njit(nogil=True, cache=True, inline="always")
def mds_header(count: int) -> int:
    """Bytes of MDS's shape header of a 1-D ndarray of ``count`` values: a
    ``ndim << 2 | code`` byte, then the size in the smallest unsigned width
    that holds it."""
    if count < 1 << 8:
        return 2
    if count < 1 << 16:
        return 3
    if count < 1 << 32:
        return 5
    return 9


@njit(nogil=True, cache=True, inline="always")
def _mds_head(column: int, itemsize: int) -> tuple[int, int]:
    """The shape header bytes (2, 3, 5 or 9) that a 1-D ndarray column of
    ``column`` bytes can have, and the fewest values it then needs (1, 256,
    65,536 or 2**32): the header width follows from the bytes, branch-free."""
    wide = (np.int64(column >= 2 + (1 << 8) * itemsize)
            + np.int64(column >= 3 + (1 << 16) * itemsize)
            + np.int64(column >= 5 + (1 << 32) * itemsize))
    low = np.int64(1) << (8 * ((1 << wide) // 2))
    return int(2 + wide + (wide >= 2) + 3 * (wide >= 3)), int(low)


@njit(nogil=True, cache=True, inline="always")
def _mds_tokens(offsets: np.ndarray, overhead: int, itemsize: int, shift: int
                ) -> tuple[int, bool]:
    """The tokens of a shard's samples whose only variable-size column is a
    1-D ndarray (``overhead``: each sample's other bytes), and whether every
    sample holds one: ``mds_sample_table``'s count without a branch per
    sample."""
    total = np.int64(0)
    sound = True
    for j in range(offsets.shape[0] - 1):
        column = np.int64(offsets[j + 1]) - np.int64(offsets[j]) - overhead
        head, low = _mds_head(column, itemsize)
        values = (column - head) >> shift
        sound &= ((column - head) & (itemsize - 1)) == 0
        sound &= values >= low
        total += values
    return int(total), sound


@njit(nogil=True, cache=True)
def mds_sample_table(
    offsets: np.ndarray, prefixes: np.ndarray, column_sizes: np.ndarray, variable: np.ndarray,
    position: int, itemsize: int, mode: int, per: int, token_base: int, tokens: np.ndarray,
    samples: np.ndarray,
) -> tuple[int, int, int, int]:
    """One MDS shard's samples from its offsets table (``offsets``: ``<u4
    [n + 1]``, checked to lie inside the file) and, with several
    variable-size columns, every sample's size prefix (``prefixes``, ``[n,
    variable]``; with fewer rows only the offsets are checked). ``mode``: 0
    a 1-D ndarray token column with a shape header, 1 a bytes column, 2 a
    fixed shape of ``per`` values. With room (``tokens`` ``[n + 1]``,
    ``samples`` ``[n, 2]``) writes each sample's first token (from
    ``token_base``) and its start and first value bytes.

    Returns ``(tokens, first value byte or -1, code, sample)``: ``code`` is
    ``MDS_OK`` or what is wrong with ``sample``."""
    n = offsets.shape[0] - 1
    width = 4 * variable.shape[0]
    shift = 0  # itemsize is 1, 2, 4 or 8: shifts, not divisions, in the loop
    while (1 << shift) < itemsize:
        shift += 1
    for j in range(n):  # (int64 first: uint32 against int64 compares as float64)
        length = np.int64(offsets[j + 1]) - np.int64(offsets[j])
        if length < 0:
            return 0, -1, MDS_BACKWARDS, j
        if length < width:
            return 0, -1, MDS_SHORT, j
    if variable.shape[0] > 1 and prefixes.shape[0] < n:
        return 0, -1, MDS_OK, 0
    fixed = np.int64(0)
    for c in range(column_sizes.shape[0]):
        fixed += column_sizes[c]
    single = variable.shape[0] == 1  # the common case: no loop over the columns per sample
    fixed_before = np.int64(0)
    for c in range(position):
        fixed_before += column_sizes[c]
    own = single and variable[0] == position  # the token column is the variable one
    after = single and variable[0] > position
    sizes = column_sizes.copy()
    write = tokens.shape[0] > 0
    if own and mode == 0 and not write and n > 0:  # opening: the count alone
        total, sound = _mds_tokens(offsets, width + fixed, itemsize, shift)
        if sound:
            head = _mds_head(np.int64(offsets[1]) - np.int64(offsets[0]) - width - fixed,
                             itemsize)[0]
            return int(total), int(offsets[0]) + width + fixed_before + head, MDS_OK, 0
    total = np.int64(0)
    first = np.int64(-1)
    for j in range(n):  # (the loop that names what is wrong, where _mds_tokens found it)
        begin = np.int64(offsets[j])
        length = np.int64(offsets[j + 1]) - begin
        if single:
            size = length - width - fixed
            if size < 0:
                return 0, -1, MDS_SIZES, j
            before = begin + width + fixed_before + (0 if own or after else size)
            column = size if own else column_sizes[position]
        else:
            every = np.int64(width)
            wrong = False
            for v in range(variable.shape[0]):
                sizes[variable[v]] = prefixes[j, v]
            for c in range(sizes.shape[0]):
                wrong |= sizes[c] < 0
                every += sizes[c]
            if wrong or every != length:
                return 0, -1, MDS_SIZES, j
            before = begin + width
            for c in range(position):
                before += sizes[c]
            column = sizes[position]
        head = 0
        if mode == 1:
            if column & (itemsize - 1):
                return 0, -1, MDS_NOT_WHOLE, j
            count = column >> shift
        elif mode == 2:
            count = np.int64(per)
        else:
            head, low = _mds_head(column, itemsize)
            count = (column - head) >> shift
            if (column - head) & (itemsize - 1) or count < low:
                return 0, -1, MDS_NOT_1D, j
        if write:
            tokens[j] = token_base + total
            samples[j, 0] = begin
            samples[j, 1] = before + head
        if j == 0:
            first = before + head
        total += count
    if write:
        tokens[n] = token_base + total
    return int(total), int(first), MDS_OK, 0


COARSE = 32
"""Samples per entry of the MDS tables' first search level (``coarse``): 8
bytes a 32 samples (a million samples' level is 250 KB, which stays in the
CPU's caches), then a search within 32 entries (four cache lines)."""

BAD_SAMPLE = -4
"""The ``read_request``-style status of the MDS read kernels for a sample
whose header disagrees with its table (the scattered read names it)."""


MDS_SCALARS = (0, 1, 2, 3, 4, 12, 13)
MDS_ARRAYS = (5, 6, 7, 8, 9, 10, 11, 14, 15)
"""An MDS kernel descriptor (``MDSFiles.kernel_descriptor``): the scalars of
``MDSFiles.kernel_tables`` at ``MDS_SCALARS`` (``first_len, entries, per,
size, before, position, header``), then the address and length of each of
its arrays at ``MDS_ARRAYS`` (``samples``: its rows of two)."""


@njit(nogil=True, cache=True, inline="always")
def _int64s(descriptor: np.ndarray, at: int) -> np.ndarray:
    """The int64 array whose address and length are ``descriptor[at:at + 2]``."""
    return numba.carray(_pointer(descriptor[at]), descriptor[at + 1], np.int64)


@njit(nogil=True, cache=True, inline="always")
def _tables(descriptor: np.ndarray) -> tuple:
    """``MDSFiles.kernel_tables`` from its descriptor, its arrays as views that
    own no reference (``numba.carray``): one int64 array crosses into the
    kernel, where the tuple of arrays had the dispatcher type and unbox each
    (~2 us a call), and handing the tuple down per row, piece and sample
    counts no reference."""
    d, at = descriptor, len(MDS_SCALARS)
    samples = numba.carray(_pointer(d[at + 4]), (d[at + 5], 2), np.int64)
    return (d[0], d[1] != 0, d[2], d[3], d[4], _int64s(d, at), _int64s(d, at + 2), samples,
            _int64s(d, at + 6), _int64s(d, at + 8), _int64s(d, at + 10), _int64s(d, at + 12),
            d[5], d[6] != 0, _int64s(d, at + 14), _int64s(d, at + 16))


@njit(nogil=True, cache=True)
def _sample_spans(shards: np.ndarray, requests: np.ndarray, itemsize: int, mds: tuple
                  ) -> np.ndarray:
    """Per request over shard ``shards[p]``'s tokens (``requests``: handle,
    byte offset, bytes and destination), the samples ``[lo, hi)``
    (``spans[:, p]``; global with a dynamic shape, else of the shard) holding
    its records (``mds``: ``MDSFiles.kernel_tables``). With a dynamic shape
    each request's sample is found in two levels: among every ``COARSE``-th
    sample of its shard (``coarse``: in the CPU's caches), then among the
    ``COARSE`` samples that leaves (a few cache lines of a large corpus's
    tables, which do not fit the caches); at each level the binary searches
    of all requests advance together, one step per pass, so their cache
    misses overlap. Then a walk over the samples each request covers."""
    count = shards.shape[0]
    spans = np.zeros((2, count), np.int64)
    per, tokens, shard_samples, shard_tokens = mds[2], mds[6], mds[9], mds[10]
    at = np.empty(count, np.int64)
    high = np.zeros(count, np.int64)
    lows = np.empty(count, np.int64)  # the coarse level: (lows, highs) exclusive of both
    highs = np.empty(count, np.int64)
    for p in range(count):
        first, length = requests[1, p] // itemsize, requests[2, p] // itemsize
        lows[p] = highs[p] = 0
        if length <= 0:
            continue
        if per > 0:
            spans[0, p], spans[1, p] = first // per, (first + length - 1) // per + 1
        else:  # tokens[lo] <= at < tokens[high], inside the shard's samples (its table)
            at[p] = shard_tokens[shards[p]] + first
            spans[0, p] = shard_samples[shards[p]]
            high[p] = shard_samples[shards[p] + 1]
            # coarse entries c with c * COARSE in [lo, high): the last with a value <= at
            lows[p] = (spans[0, p] + COARSE - 1) // COARSE - 1
            highs[p] = (high[p] - 1) // COARSE + 1
    if per > 0:
        return spans
    _search(mds[15], at, lows, highs)
    for p in range(count):
        if highs[p] - lows[p] > 0:  # the samples between coarse entries lows[p] and + 1
            spans[0, p] = max(spans[0, p], lows[p] * COARSE)
            high[p] = min(high[p], (lows[p] + 1) * COARSE)
    _search(tokens, at, spans[0], high)
    for p in range(count):
        if requests[2, p] // itemsize <= 0:  # no records
            continue
        end = at[p] + requests[2, p] // itemsize
        hi = spans[0, p] + 1
        last = shard_samples[shards[p] + 1]
        while hi < last and tokens[hi] < end:
            hi += 1
        spans[1, p] = hi
    return spans


@njit(nogil=True, cache=True, inline="always")
def _search(table: np.ndarray, at: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> None:
    """For every ``p``, the last index in ``[lows[p], highs[p])`` whose
    ``table`` value is at most ``at[p]``, into ``lows[p]`` (``table[lows[p]]``
    is never read: taken to be at most ``at[p]``, as ``table[highs[p]]``
    above it): binary searches advancing together, one step a pass, so
    that their cache misses overlap; ``highs[p]`` ends one past it."""
    searching = True
    while searching:
        searching = False
        for p in range(at.shape[0]):
            lo, hi = lows[p], highs[p]
            if hi - lo > 1:
                middle = (lo + hi) // 2
                if table[middle] <= at[p]:
                    lows[p] = middle
                else:
                    highs[p] = middle
                searching = True


@njit(nogil=True, cache=True, inline="always")
def _sample_at(s: int, g: int, mds: tuple) -> tuple[int, int, int, int, int, int, int]:
    """Sample ``g`` (global with a dynamic shape, else of shard ``s``), from
    ``mds`` (``MDSFiles.kernel_tables``): its index in the shard, its first
    token in the shard's tokens, its tokens, its start and end bytes, the
    byte of its first value and its shape header's bytes."""
    per, size = mds[2], mds[3]
    if per > 0:
        begin = mds[5][s] + g * size
        return g, g * per, per, begin, begin + size, begin + mds[4], 0
    tokens, samples, first = mds[6], mds[7], mds[9][s]
    count = tokens[g + 1] - tokens[g]
    end = samples[g + 1, 0] if g + 1 < mds[9][s + 1] else mds[14][s]
    return (g - first, tokens[g] - mds[10][s], count, samples[g, 0], end, samples[g, 1],
            mds_header(count) if mds[13] else 0)


@njit(nogil=True, cache=True)
def mds_pieces(shards: np.ndarray, requests: np.ndarray, itemsize: int, total: int,
               mds: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """An MDS batch's reads, for any storage: ``requests`` (handle, byte offset,
    bytes and destination over shard ``shards[p]``'s tokens) split at sample
    bounds (``mds``: ``MDSFiles.kernel_descriptor``).

    Returns ``(requests (4, 3n), pieces (7, n), bytes)``: ``n`` value reads into
    the batch buffer (bytes ``[0, total)``), then ``n`` reads of ``first_len``
    bytes (a sample's size prefix at its start, or with ``entries`` its two
    offsets-table entries), then ``n`` shape-header reads, into one scratch
    buffer of ``bytes``; per piece its shard, sample in the shard, token
    count, start and end bytes, value byte and header bytes."""
    tables = _tables(mds)
    first_len, entries = tables[0], tables[1]
    spans = _sample_spans(shards, requests, itemsize, tables)
    n = 0
    for p in range(shards.shape[0]):
        n += spans[1, p] - spans[0, p]
    reads = np.empty((4, 3 * n), np.int64)
    pieces = np.empty((7, n), np.int64)
    header_at = total + n * first_len
    k = 0
    for p in range(shards.shape[0]):
        s, handle = shards[p], requests[0, p]
        first, count = requests[1, p] // itemsize, requests[2, p] // itemsize
        for g in range(spans[0, p], spans[1, p]):
            local, start, tokens_in, begin, end, value, head = _sample_at(s, g, tables)
            low = max(start, first)
            high = min(start + tokens_in, first + count)
            reads[0, k] = handle
            reads[1, k] = value + (low - start) * itemsize
            reads[2, k] = (high - low) * itemsize
            reads[3, k] = requests[3, p] + (low - first) * itemsize
            reads[0, n + k] = handle
            reads[1, n + k] = 4 * (1 + local) if entries else begin
            reads[2, n + k] = first_len
            reads[3, n + k] = total + k * first_len
            reads[0, 2 * n + k] = handle
            reads[1, 2 * n + k] = value - head
            reads[2, 2 * n + k] = head
            reads[3, 2 * n + k] = header_at
            header_at += head
            pieces[0, k], pieces[1, k], pieces[2, k] = s, local, tokens_in
            pieces[3, k], pieces[4, k], pieces[5, k], pieces[6, k] = begin, end, value, head
            k += 1
    return reads, pieces, header_at


@njit(nogil=True, cache=True, inline="always")
def _read_samples(
    s: int, handle: int, first: int, count: int, lo: int, hi: int, address: int,
    check: np.ndarray, column_sizes: np.ndarray, fds: np.ndarray, addresses: np.ndarray,
    sizes: np.ndarray, use_pread: bool, itemsize: int, mds: tuple,
) -> int:
    """Records ``[first, first + count)`` of shard ``s``'s tokens (file
    ``handle``; in samples ``[lo, hi)``, ``_sample_spans``) to memory at
    ``address``, one ``read_request`` a sample piece, each sample's size
    prefix (or offsets-table entries) and shape header checked first
    (``_sample_ok``): in place in a mapped file, else read into ``check``.
    Returns 1, a ``read_request`` status, or ``BAD_SAMPLE``."""
    first_len, entries, variable, position = mds[0], mds[1], mds[11], mds[12]
    at = check.ctypes.data
    size = sizes[handle] if 0 <= handle < sizes.shape[0] else -1
    data, status = mapped_records(handle, 0, size, check, addresses, sizes, use_pread)
    mapped = status == 1  # the whole file as a view of its mapping
    for g in range(lo, hi):
        local, start, tokens_in, begin, end, value, head = _sample_at(s, g, mds)
        prefix = 4 * (1 + local) if entries else begin
        if mapped:  # read_request's bounds, then the bytes where they lie
            if (prefix < 0 or prefix + first_len > size
                    or (head > 0 and (value - head < 0 or value > size))):
                return 0
            sound = _sample_ok(data, prefix, value - head, first_len, begin, end, value, head,
                               tokens_in, column_sizes, variable, position, itemsize)
        else:
            status = read_request(handle, prefix, first_len, at, fds, addresses, sizes,
                                  use_pread)
            if status == 1 and head > 0:
                status = read_request(handle, value - head, head, at + first_len, fds,
                                      addresses, sizes, use_pread)
            if status < 1:
                return status
            sound = _sample_ok(check, 0, first_len, first_len, begin, end, value, head,
                               tokens_in, column_sizes, variable, position, itemsize)
        if not sound:
            return BAD_SAMPLE
        low = max(start, first)
        high = min(start + tokens_in, first + count)
        status = read_request(handle, value + (low - start) * itemsize, (high - low) * itemsize,
                              address + (low - first) * itemsize, fds, addresses, sizes,
                              use_pread)
        if status < 1:
            return status
    return 1


@njit(nogil=True, cache=True, inline="always")
def _scratch(mds: tuple) -> tuple[np.ndarray, np.ndarray]:
    """What ``_read_samples`` checks a sample in: room for a size prefix (or two
    offsets-table entries) and a shape header, and the column sizes."""
    return np.empty(mds[0] + 9, np.uint8), mds[8].copy()


@njit(nogil=True, cache=True, inline="always")
def _prefetch_samples(p: int, s: int, requests: np.ndarray, spans: np.ndarray,
                      addresses: np.ndarray, sizes: np.ndarray, use_pread: bool,
                      itemsize: int, mds: tuple) -> None:
    """``prefetch_request`` of the file bytes request ``p`` reads (in the
    samples ``spans[:, p]`` of shard ``s``, end to end in the file: from the
    first one's size prefix to the last value read), and with a dynamic
    shape of their entries in the tables ``_read_samples`` reads."""
    lo, hi = spans[0, p], spans[1, p]
    if hi <= lo:
        return
    if mds[2] > 0:
        begin = mds[5][s] + lo * mds[3]
        end = mds[5][s] + hi * mds[3]
    else:
        first = mds[7].ctypes.data + 16 * lo  # [samples, 2] int64
        for line in range(first - first % _LINE, mds[7].ctypes.data + 16 * hi, _LINE):
            _prefetch(line)
        begin = mds[7][lo, 0]
        last = (mds[6][hi - 1] - mds[10][s]) * itemsize  # the last sample's first value
        end = mds[7][hi - 1, 1] + requests[1, p] + requests[2, p] - last
    prefetch_request(requests[0, p], begin, end - begin, addresses, sizes, use_pread)


@njit(nogil=True, cache=True, inline="always")
def _read_request(
    p: int, s: int, requests: np.ndarray, spans: np.ndarray, base: int, low: int, high: int,
    check: np.ndarray, column_sizes: np.ndarray, fds: np.ndarray, addresses: np.ndarray,
    sizes: np.ndarray, use_pread: bool, itemsize: int, mds: tuple,
) -> int:
    """Request ``p`` (over shard ``s``'s tokens, in the samples ``spans[:, p]``)
    read by ``_read_samples`` to ``base`` plus its destination, which must lie
    in ``[low, high)``. Returns ``_read_samples``' status, or -2 for a
    destination outside."""
    length, dest = requests[2, p], requests[3, p]
    if length < 0 or dest < low or dest + length > high:
        return -2
    return _read_samples(s, requests[0, p], requests[1, p] // itemsize, length // itemsize,
                         spans[0, p], spans[1, p], base + dest, check, column_sizes, fds,
                         addresses, sizes, use_pread, itemsize, mds)


@njit(nogil=True, cache=True, inline="always")
def _read_mds_row(
    b: int, p: int, ahead: int, pieces: np.ndarray, requests: np.ndarray, spans: np.ndarray,
    n: int, row: np.ndarray, check: np.ndarray, column_sizes: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, mds: tuple,
) -> tuple[int, int, int, int]:
    """Window ``b`` of planned ``pieces`` (from ``p``; their ``requests`` over
    each shard's tokens, in the samples ``spans``) read into ``row`` by
    ``_read_request``, the next window's samples prefetched first
    (``ahead``: the first request not prefetched yet). Returns (the next
    window's first piece, the next ``ahead``, the failed request or -1, its
    status)."""
    itemsize = row.itemsize
    while ahead < pieces.shape[0] and pieces[ahead, _OBS] <= b + 1:
        _prefetch_samples(ahead, pieces[ahead, _SHARD], requests, spans, addresses, sizes,
                          use_pread, itemsize, mds)
        ahead += 1
    base = row.ctypes.data - b * n * itemsize  # request destinations are batch offsets
    while p < pieces.shape[0] and pieces[p, _OBS] == b:
        status = _read_request(p, pieces[p, _SHARD], requests, spans, base, b * n * itemsize,
                               (b + 1) * n * itemsize, check, column_sizes, fds, addresses,
                               sizes, use_pread, itemsize, mds)
        if status < 1:
            return p, ahead, p, status
        p += 1
    return p, ahead, -1, 1


@njit(nogil=True, cache=True, inline="always")
def _row_scratch(pieces: np.ndarray, requests: np.ndarray, row: np.ndarray, mds: tuple
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the window kernels read planned ``pieces`` with: ``_scratch``'s two
    arrays and each request's samples (``_sample_spans``)."""
    check, column_sizes = _scratch(mds)
    return check, column_sizes, _sample_spans(pieces[:, _SHARD].copy(), requests, row.itemsize,
                                              mds)


@njit(nogil=True, cache=True, inline="always")
def _read_cast_mds_row(
    b: int, p: int, ahead: int, pieces: np.ndarray, requests: np.ndarray, spans: np.ndarray,
    n: int, row: np.ndarray, check: np.ndarray, column_sizes: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, mds: tuple,
) -> tuple[int, int, int, int, bool]:
    """``_read_mds_row``, then the row cast into ``inputs`` and ``labels``
    (``stream._kernels._decode_tokens``). Returns ``_read_mds_row``'s four
    values and whether every id lies inside ``bounds`` (True when the read
    failed: nothing was cast)."""
    p, ahead, failed, status = _read_mds_row(b, p, ahead, pieces, requests, spans, n, row,
                                             check, column_sizes, fds, addresses, sizes,
                                             use_pread, mds)
    if failed >= 0:
        return p, ahead, failed, status, True
    return p, ahead, -1, status, stream_kernels._decode_tokens(b, row, seq_len, inputs, labels,
                                                               shift, bounds)


@njit(nogil=True, cache=True)
def mds_read_requests(
    shards: np.ndarray, requests: np.ndarray, buffer: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, itemsize: int, mds: np.ndarray,
) -> tuple[int, int]:
    """``MDSFiles.read_scattered``'s ``requests`` (``(4, P)``: handle, byte
    offset and bytes over shard ``shards[p]``'s tokens, byte destination in
    ``buffer``) read from local files in one call by ``_read_request``, the
    next request's samples prefetched first (``mds``:
    ``MDSFiles.kernel_descriptor``). Returns (the failed request or -1, its
    status)."""
    tables = _tables(mds)
    shards, requests, buffer = borrowed(shards), borrowed(requests), borrowed(buffer)
    fd_table, address_table, size_table = borrowed(fds), borrowed(addresses), borrowed(sizes)
    spans = _sample_spans(shards, requests, itemsize, tables)
    check, column_sizes = _scratch(tables)
    count = shards.shape[0]
    for p in range(count):
        if p == 0:
            _prefetch_samples(0, shards[0], requests, spans, address_table, size_table,
                              use_pread, itemsize, tables)
        if p + 1 < count:
            _prefetch_samples(p + 1, shards[p + 1], requests, spans, address_table, size_table,
                              use_pread, itemsize, tables)
        status = _read_request(p, shards[p], requests, spans, buffer.ctypes.data, 0,
                               buffer.shape[0], check, column_sizes, fd_table, address_table,
                               size_table, use_pread, itemsize, tables)
        if status < 1:
            return p, status
    return -1, 1


@njit(nogil=True, cache=True)
def mds_read_windows(
    indices: np.ndarray, stride: int, n: int, count: int, shard_starts: np.ndarray,
    handles: np.ndarray, bases: np.ndarray, row: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, mds: np.ndarray,
) -> tuple[int, int, int, int, int, int, int]:
    """``stream._kernels.read_windows`` over MDS shards (``mds``:
    ``MDSFiles.kernel_descriptor``): each window's pieces split at sample bounds,
    every sample's header checked and its values copied into ``row``
    (``_read_mds_row``), then cast. Returns what ``read_windows`` returns; a
    failed request's status may also be ``BAD_SAMPLE``."""
    pieces, requests, closed, bad = stream_kernels.plan_windows(
        indices, stride, n, count, shard_starts, handles, bases, row.itemsize)
    if bad >= 0 or closed >= 0:
        return bad, closed, -1, 1, _DOCS_OK, 0, -1
    tables = _tables(mds)
    check, column_sizes, spans = _row_scratch(pieces, requests, row, tables)
    failed, status, wrong = _mds_read_planned(
        pieces, requests, spans, check, column_sizes, indices.shape[0], n, row, fds, addresses,
        sizes, use_pread, seq_len, inputs, labels, shift, bounds, tables)
    return -1, -1, failed, status, _DOCS_OK, 0, wrong


@njit(nogil=True, cache=True)
def _mds_read_planned(
    pieces: np.ndarray, requests: np.ndarray, spans: np.ndarray, check: np.ndarray,
    column_sizes: np.ndarray, rows: int, n: int, row: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, tables: tuple,
) -> tuple[int, int, int]:
    """The reading half of :func:`mds_read_windows` (``stream._kernels._read_planned``'s
    twin): each of ``rows`` windows read by ``_read_cast_mds_row``, every
    array argument borrowed first (no reference count a row). Returns (failed
    request or -1, its status, the first row with an id outside ``bounds`` or -1)."""
    pieces, requests, spans = borrowed(pieces), borrowed(requests), borrowed(spans)
    check, column_sizes, row = borrowed(check), borrowed(column_sizes), borrowed(row)
    fds, addresses, sizes = borrowed(fds), borrowed(addresses), borrowed(sizes)
    inputs, labels, bounds = borrowed(inputs), borrowed(labels), borrowed(bounds)
    p = ahead = 0
    for b in range(rows):
        p, ahead, failed, status, inside = _read_cast_mds_row(
            b, p, ahead, pieces, requests, spans, n, row, check, column_sizes, fds,
            addresses, sizes, use_pread, seq_len, inputs, labels, shift, bounds, tables)
        if failed >= 0:
            return failed, status, -1
        if not inside:
            return -1, 1, b
    return -1, 1, -1


@njit(nogil=True, cache=True)
def mds_read_windows_segments(
    indices: np.ndarray, stride: int, n: int, count: int, shard_starts: np.ndarray,
    handles: np.ndarray, bases: np.ndarray, row: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, docs: np.ndarray,
    out: tuple, mds: np.ndarray,
) -> tuple[int, int, int, int, int, int, int]:
    """:func:`mds_read_windows` with each window's document columns, as
    ``stream._kernels.read_windows_segments`` (``docs``: every shard's
    sample token offsets)."""
    pieces, requests, closed, bad = stream_kernels.plan_windows(
        indices, stride, n, count, shard_starts, handles, bases, row.itemsize)
    if bad >= 0 or closed >= 0:
        return bad, closed, -1, 1, _DOCS_OK, 0, -1
    tables = _tables(mds)
    firsts, code, shard = stream_kernels._first_documents(pieces, n, seq_len, docs)
    if code != _DOCS_OK:
        return -1, -1, -1, 1, code, shard, -1
    check, column_sizes, spans = _row_scratch(pieces, requests, row, tables)
    failed, status, code, shard, wrong = _mds_read_planned_segments(
        pieces, requests, spans, check, column_sizes, indices.shape[0], n, row, fds, addresses,
        sizes, use_pread, seq_len, inputs, labels, shift, bounds, docs, firsts, out, tables)
    return -1, -1, failed, status, code, shard, wrong


@njit(nogil=True, cache=True)
def _mds_read_planned_segments(
    pieces: np.ndarray, requests: np.ndarray, spans: np.ndarray, check: np.ndarray,
    column_sizes: np.ndarray, rows: int, n: int, row: np.ndarray, fds: np.ndarray,
    addresses: np.ndarray, sizes: np.ndarray, use_pread: bool, seq_len: int,
    inputs: np.ndarray, labels: np.ndarray, shift: int, bounds: np.ndarray, docs: np.ndarray,
    firsts: np.ndarray, out: tuple, tables: tuple,
) -> tuple[int, int, int, int, int]:
    """:func:`_mds_read_planned` with each window's document columns
    (``stream._kernels._row_segments`` into ``out``; ``firsts``: each
    window's first document, ``_first_documents``). Returns (failed request
    or -1, its status, code, shard, the first row with an id outside
    ``bounds`` or -1)."""
    pieces, requests, spans = borrowed(pieces), borrowed(requests), borrowed(spans)
    check, column_sizes, row = borrowed(check), borrowed(column_sizes), borrowed(row)
    fds, addresses, sizes = borrowed(fds), borrowed(addresses), borrowed(sizes)
    inputs, labels, bounds = borrowed(inputs), borrowed(labels), borrowed(bounds)
    docs, firsts, out = borrowed(docs), borrowed(firsts), stream_kernels.borrowed_columns(out)
    mask_starts = shift == 0 and labels.shape[0] > 0
    p = ahead = 0
    for b in range(rows):
        first = p
        p, ahead, failed, status, inside = _read_cast_mds_row(
            b, p, ahead, pieces, requests, spans, n, row, check, column_sizes, fds,
            addresses, sizes, use_pread, seq_len, inputs, labels, shift, bounds, tables)
        if failed >= 0:
            return failed, status, _DOCS_OK, 0, -1
        if not inside:
            return -1, 1, _DOCS_OK, 0, b
        _, code, shard = stream_kernels._row_segments(b, first, pieces, n, seq_len, docs, firsts,
                                                      labels, mask_starts, out)
        if code != _DOCS_OK:
            return -1, 1, code, shard, -1
    return -1, 1, _DOCS_OK, 0, -1


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
        s = count_at_or_below(starts, i, 0, starts.shape[0]) - 1  # the last shard at or below i
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
