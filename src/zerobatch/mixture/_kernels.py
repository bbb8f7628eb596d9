"""Numba kernels of the mixture order: per-block counts, cumulative slots, block layout.

The math is in :mod:`zerobatch.mixture.order`'s docstring. Kernels never raise;
their callers check inputs. All arithmetic is int64 and fits: a stage's
cumulative counts are below 2**63 because positions are.
"""

from __future__ import annotations

import numpy as np

from zerobatch._jit import njit
from zerobatch.plan import _EPOCH_DOMAIN
from zerobatch.shuffle import DEFAULT_ROUNDS, _mix, fill_round_keys, permute_one
from zerobatch.stream._kernels import read_window_rows, read_window_rows_segments

__all__ = [
    "HALF",
    "KEY",
    "LENGTH",
    "LIMIT",
    "PERIOD",
    "ROTATION",
    "block_counts",
    "block_keys",
    "block_layout",
    "extras_before",
    "gather_read_rows",
    "gather_read_rows_segments",
    "gather_run",
    "observe_read_rows",
    "observe_read_rows_segments",
    "observe_rows",
    "pass_indices",
]

PERIOD = 1 << 30
"""K: the blocks after which a stage's rotation of leftover slots repeats. A
source's long-run share is exact to 1 / (K * block_size) of the stream."""

ROTATION = 663608941
"""g: block ``k`` of a stage starts its leftover slots at residue ``k * g mod K``.
Odd (so ``k -> k * g mod K`` is a bijection on a period) and close to K / phi,
the golden section, so consecutive blocks' residues spread evenly."""


@njit(nogil=True, cache=True)
def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a * j + b) / m) for j in range(n))`` for ``n, m, a, b >= 0``
    with ``a * n + b < 2**62`` (the Euclid-like reduction, O(log m))."""
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            return total
        n, b = top // m, top % m
        m, a = a, m


@njit(nogil=True, cache=True)
def _down_sum(c: int, n: int) -> int:
    """``sum(floor((c - j * ROTATION) / PERIOD) for j in range(n))``, ``n <= PERIOD``."""
    b = PERIOD - 1 - c  # floor((c - jg)/K) = -floor((jg + K - 1 - c)/K)
    q = b // PERIOD  # floor division: b may be negative
    return -(_floor_sum(n, PERIOD, ROTATION, b - q * PERIOD) + n * q)


@njit(nogil=True, cache=True, inline="always")
def _extra(lo: int, hi: int, m: int) -> int:
    """1 when some ``x`` in ``[lo, hi)`` has ``x % PERIOD == m`` (the interval is
    at most PERIOD long, so at most one does), else 0."""
    return (hi - 1 - m) // PERIOD - (lo - 1 - m) // PERIOD


@njit(nogil=True, cache=True)
def block_counts(block: int, base: np.ndarray, bounds: np.ndarray, offset: int,
                 out: np.ndarray) -> None:
    """Each source's slots in a stage's block ``block``: ``base[s]`` plus one when
    the block's residue falls in ``[bounds[s], bounds[s + 1])`` (mod PERIOD)."""
    m = (block % PERIOD * ROTATION + offset) % PERIOD
    for s in range(base.shape[0]):
        out[s] = base[s] + _extra(bounds[s], bounds[s + 1], m)


@njit(nogil=True, cache=True)
def extras_before(block: int, bounds: np.ndarray, offset: int, out: np.ndarray) -> None:
    """Each source's leftover slots in a stage's blocks ``[0, block)``: whole
    periods give ``bounds[s + 1] - bounds[s]`` each, the rest a floor sum."""
    periods, rest = block // PERIOD, block % PERIOD
    for s in range(out.shape[0]):
        lo, hi = bounds[s], bounds[s + 1]
        out[s] = periods * (hi - lo)
        if rest and hi > lo:
            out[s] += _down_sum(hi - 1 - offset, rest) - _down_sum(lo - 1 - offset, rest)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True)
def block_layout(counts: np.ndarray, seed: np.uint64, sources: np.ndarray,
                 ordinals: np.ndarray) -> None:
    """A block's source and ordinal per position. Source ``s``'s ``k``-th slot
    gets the key ``(k + u) / counts[s]``, ``u`` uniform in [0, 1) from ``seed``
    and the slot's number (SplitMix64); the positions take the slots in key
    order (ties: slot number). A slot's ordinal is ``k``: keys rise with ``k``."""
    total = sources.shape[0]
    keys = np.empty(total, dtype=np.float64)
    owner = np.empty(total, dtype=np.int64)
    rank = np.empty(total, dtype=np.int64)
    at = 0
    for s in range(counts.shape[0]):
        c = counts[s]
        for j in range(c):
            u = np.float64(_mix(seed + np.uint64(at + 1) * _GOLDEN) >> np.uint64(11)) \
                * 1.1102230246251565e-16  # 2**-53
            keys[at] = (j + u) / c
            owner[at] = s
            rank[at] = j
            at += 1
    # A stable sort of the keys (in [0, 1)): a counting sort by ``floor(key *
    # total)``, then insertion inside each bucket (about one key a bucket), ~5x
    # faster than a merge sort; ties keep the slot order, as a stable sort does.
    starts = np.zeros(total + 1, dtype=np.int64)
    for i in range(total):
        starts[min(np.int64(keys[i] * total), total - 1) + 1] += 1
    for i in range(total):
        starts[i + 1] += starts[i]
    order = np.empty(total, dtype=np.int64)
    for i in range(total):
        bucket = min(np.int64(keys[i] * total), total - 1)
        order[starts[bucket]] = i
        starts[bucket] += 1
    begin = 0
    for bucket in range(total):  # starts[bucket] is now the bucket's end
        end = starts[bucket]
        for i in range(begin + 1, end):
            item = order[i]
            j = i - 1
            while j >= begin and keys[order[j]] > keys[item]:
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = item
        begin = end
    for i in range(total):
        sources[i] = owner[order[i]]
        ordinals[i] = rank[order[i]]


@njit(nogil=True, cache=True, inline="always")
def _epoch_seed(seed: np.uint64, epoch: int) -> np.uint64:
    """:func:`zerobatch.plan.epoch_seed` inside a kernel."""
    return _mix(_mix(seed ^ np.uint64(_EPOCH_DOMAIN)) + np.uint64(epoch))


LENGTH, HALF, KEY, LIMIT = 0, 1, 2, 3
"""The columns of the per-source table the row kernels take (``MixtureOrder.
table``): observations, Feistel half width, key (uint64 bits as int64), pass
limit. One row a source: a row's lookups touch one cache line."""


@njit(nogil=True, cache=True, inline="always")
def _observation(table: np.ndarray, s: int, slot: int) -> int:
    """Source ``s``'s observation at ``slot`` (pass ``slot // n`` permuted by
    ``Feistel(n, epoch_seed(key, pass))``), or -1 past its pass limit."""
    n = table[s, LENGTH]
    p, local = slot // n, slot % n
    if p >= table[s, LIMIT]:
        return -1
    return permute_one(local, n, table[s, HALF], _epoch_seed(np.uint64(table[s, KEY]), p))


KEYED_PASSES = 2
"""Passes of a source whose round keys a block holds: the pass its first slot
in the block reads and the next (a source shorter than its count in a block
spans more; its further passes compute their keys per row)."""


@njit(nogil=True, cache=True)
def block_keys(before: np.ndarray, counts: np.ndarray, table: np.ndarray,
               passes: np.ndarray, keys: np.ndarray) -> None:
    """For each source with slots in a block (``counts[s] > 0``; ``before[s]``
    slots before it): ``passes[s]``, the pass of its first slot and that
    slot's place in the pass (``before[s] = pass * length + place``), and
    ``keys[s, d]``, the Feistel round keys of pass ``passes[s, 0] + d`` for
    ``d < KEYED_PASSES`` (what :func:`zerobatch.shuffle.permute_one` derives
    from ``_epoch_seed(key, pass)`` for every value). A row's observation
    then needs no division and no key derivation. Sources without slots are
    left as they are."""
    for s in range(counts.shape[0]):
        if counts[s] <= 0:
            continue
        first, place = divmod(before[s], table[s, LENGTH])
        passes[s, 0] = first
        passes[s, 1] = place
        key = np.uint64(table[s, KEY])
        for d in range(KEYED_PASSES):
            fill_round_keys(_epoch_seed(key, first + d), keys[s, d])


@njit(nogil=True, cache=True, inline="always")
def _keyed_place(table: np.ndarray, s: int, ordinal: int, passes: np.ndarray) -> tuple[int, int]:
    """``(d, local)``: source ``s``'s slot ``ordinal`` of a block is place
    ``local`` of its pass ``passes[s, 0] + d`` (the block's passes of
    :func:`block_keys`): no division unless the source is shorter than its
    slots in the block."""
    n = table[s, LENGTH]
    d, local = 0, passes[s, 1] + ordinal
    if local >= n:
        if local - n < n:  # (not local < 2 * n: n may be above 2**62)
            d, local = 1, local - n
        else:
            d, local = divmod(local, n)
    return d, local


_LEFT, _RIGHT, _SHIFT, _MASK, _BOUND, _ROUND_KEYS = 0, 1, 2, 3, 4, 5
"""The rows of :func:`_walk`'s scratch, one column a value: the Feistel
halves, the half width, its mask, the domain size ``n``, then the round keys."""


@njit(nogil=True, cache=True)
def _walk(net: np.ndarray, rows: np.ndarray, count: int, out: np.ndarray) -> None:
    """``out[rows[j]]``: :func:`zerobatch.shuffle.permute_keyed` of the first
    ``count`` values of ``net`` (columns: ``_ROUND_KEYS``), all walked at once.
    Each round runs over every value (independent: the multiplies of one
    overlap another's, where one value at a time waits on each, and no
    branch), then the values still outside ``[0, n)`` take another turn of
    the cycle walk, packed to the front."""
    while count > 0:
        for i in range(DEFAULT_ROUNDS):
            for j in range(count):
                right = net[_RIGHT, j]
                mixed = _mix(right ^ net[_ROUND_KEYS + i, j]) & net[_MASK, j]
                net[_RIGHT, j] = net[_LEFT, j] ^ mixed
                net[_LEFT, j] = right
        kept = 0
        for j in range(count):
            y = (net[_LEFT, j] << net[_SHIFT, j]) | net[_RIGHT, j]
            if y < net[_BOUND, j]:
                out[rows[j]] = np.int64(y)
                continue
            for r in range(_SHIFT, net.shape[0]):
                net[r, kept] = net[r, j]
            net[_LEFT, kept], net[_RIGHT, kept] = y >> net[_SHIFT, j], y & net[_MASK, j]
            rows[kept] = rows[j]
            kept += 1
        count = kept


@njit(nogil=True, cache=True)
def pass_indices(sources: np.ndarray, slots: np.ndarray, table: np.ndarray,
                 out: np.ndarray) -> int:
    """``out[b]``: the observation source ``sources[b]``'s slot ``slots[b]``
    reads, as :func:`zerobatch.mixture.order.pass_order` computes it, for
    every source in one call (``table``: ``MixtureOrder.table``). Returns the
    first row whose pass is past its source's limit, or -1."""
    for b in range(sources.shape[0]):
        index = _observation(table, sources[b], slots[b])
        if index < 0:
            return b
        out[b] = index
    return -1


@njit(nogil=True, cache=True)
def observe_rows(positions: np.ndarray, start: int, end: int, size: int, block: int,
                 layout0: np.ndarray, passes0: np.ndarray, keys0: np.ndarray,
                 layout1: np.ndarray, passes1: np.ndarray, keys1: np.ndarray, table: np.ndarray,
                 out: np.ndarray) -> tuple[int, int]:
    """Each position's source (``out[0]``) and observation (``out[1]``) when
    all positions lie in blocks ``block`` and ``block + 1`` of one stage
    (positions ``[start, end)``, blocks of ``size`` counted from ``start``),
    whose layouts are given (``order.Block``: sources and ordinals ``[2,
    size]``, the passes and round keys of :func:`block_keys`):
    the block lookup of ``MixtureOrder.locate`` and :func:`pass_indices`:
    one pass over the rows for their sources and places, then every row's
    Feistel walk at once (:func:`_walk`). Returns (the first row outside
    those blocks or -1, the first row past its source's pass limit or -1);
    ``out`` is complete when both are -1, and ``out[0]`` holds the sources up
    to the row past its limit."""
    first = start + block * size  # the first position of block ``block``
    count = positions.shape[0]
    net = np.empty((_ROUND_KEYS + DEFAULT_ROUNDS, count), np.uint64)  # the values of _walk
    rows = np.empty(count, np.int64)
    walking = 0
    for b in range(count):
        position = positions[b]
        if position < start or position >= end:
            return b, -1
        at = position - first
        if 0 <= at < size:
            s, ordinal, passes, keys = layout0[0, at], layout0[1, at], passes0, keys0
        elif size <= at < 2 * size:
            s, ordinal = layout1[0, at - size], layout1[1, at - size]
            passes, keys = passes1, keys1
        else:
            return b, -1
        out[0, b] = s
        d, local = _keyed_place(table, s, ordinal, passes)
        p = passes[s, 0] + d
        if p >= table[s, LIMIT]:
            return -1, b
        if d >= KEYED_PASSES:  # no round keys in the block: this row alone
            out[1, b] = permute_one(local, table[s, LENGTH], table[s, HALF],
                                    _epoch_seed(np.uint64(table[s, KEY]), p))
            continue
        shift = np.uint64(table[s, HALF])
        mask = (np.uint64(1) << shift) - np.uint64(1)
        value = np.uint64(local)
        net[_LEFT, walking], net[_RIGHT, walking] = value >> shift, value & mask
        net[_SHIFT, walking], net[_MASK, walking] = shift, mask
        net[_BOUND, walking] = np.uint64(table[s, LENGTH])
        for i in range(DEFAULT_ROUNDS):
            net[_ROUND_KEYS + i, walking] = keys[s, d, i]
        rows[walking] = b
        walking += 1
    _walk(net, rows, walking, out[1])
    return -1, -1


@njit(nogil=True, cache=True)
def gather_run(positions: np.ndarray, first: int, stride: int, sources: np.ndarray,
               index: np.ndarray, observed: np.ndarray, column: np.ndarray) -> bool:
    """Each position's source and observation (``observed[0]``, ``observed[1]``,
    and the source again as the int32 ``column``) from a run observed at once:
    ``sources[j]`` and ``index[j]`` of position ``first + stride * j``. False,
    with ``observed`` incomplete, when a position is not in the run."""
    count = sources.shape[0]
    for b in range(positions.shape[0]):
        offset = positions[b] - first
        if offset < 0 or offset % stride:
            return False
        j = offset // stride
        if j >= count:
            return False
        observed[0, b] = sources[j]
        observed[1, b] = index[j]
        column[b] = sources[j]
    return True


NOT_PLANNED = -2
"""What :func:`observe_read_rows` returns first when it did not read: a
position lies outside the step's blocks, or past its source's pass limit."""


@njit(nogil=True, cache=True, inline="always")
def _observe_step(positions: np.ndarray, start: int, end: int, size: int, block: int,
                  layout0: np.ndarray, passes0: np.ndarray, keys0: np.ndarray,
                  layout1: np.ndarray, passes1: np.ndarray, keys1: np.ndarray,
                  order: np.ndarray, observed: np.ndarray, column: np.ndarray
                  ) -> tuple[int, int]:
    """:func:`observe_rows` into ``observed``, then the sources again as the
    int32 ``column`` when every position was observed. Returns what
    ``observe_rows`` returns."""
    outside, over = observe_rows(positions, start, end, size, block, layout0, passes0, keys0,
                                 layout1, passes1, keys1, order, observed)
    if outside < 0 and over < 0:
        for b in range(column.shape[0]):
            column[b] = observed[0, b]
    return outside, over


@njit(nogil=True, cache=True)
def observe_read_rows(positions: np.ndarray, start: int, end: int, size: int, block: int,
                      layout0: np.ndarray, passes0: np.ndarray, keys0: np.ndarray,
                      layout1: np.ndarray, passes1: np.ndarray, keys1: np.ndarray,
                      order: np.ndarray, observed: np.ndarray, column: np.ndarray,
                      sources: np.ndarray, indices: np.ndarray, table: np.ndarray, n: int,
                      shard_starts: np.ndarray, live: np.ndarray, bases: np.ndarray,
                      row: np.ndarray, fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray,
                      use_pread: bool, seq_len: int, inputs: np.ndarray, labels: np.ndarray,
                      shift: int, bounds: np.ndarray) -> tuple[int, int, int, int, int, int, int]:
    """:func:`observe_rows` into ``observed`` (``order``: its ``table``), the
    sources again as the int32 ``column``, then
    :func:`zerobatch.stream._kernels.read_window_rows` of those rows
    (``sources`` and ``indices`` are ``observed``'s two rows): a mixture's
    step in one call. Returns what ``read_window_rows`` returns, or
    ``(NOT_PLANNED, outside, over, ...)`` with ``observe_rows``'s answer when
    the positions are not all in the step's blocks and under their limits
    (nothing read)."""
    outside, over = _observe_step(positions, start, end, size, block, layout0, passes0, keys0,
                                  layout1, passes1, keys1, order, observed, column)
    if outside >= 0 or over >= 0:
        return NOT_PLANNED, outside, over, 1, 0, 0, -1
    return read_window_rows(sources, indices, table, n, shard_starts, live, bases, row, fds,
                            addresses, sizes, use_pread, seq_len, inputs, labels, shift, bounds)


@njit(nogil=True, cache=True)
def observe_read_rows_segments(
    positions: np.ndarray, start: int, end: int, size: int, block: int,
    layout0: np.ndarray, passes0: np.ndarray, keys0: np.ndarray,
    layout1: np.ndarray, passes1: np.ndarray, keys1: np.ndarray,
    order: np.ndarray, observed: np.ndarray, column: np.ndarray,
    sources: np.ndarray, indices: np.ndarray, table: np.ndarray, n: int,
    shard_starts: np.ndarray, live: np.ndarray, bases: np.ndarray, row: np.ndarray,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray,
    use_pread: bool, seq_len: int, inputs: np.ndarray, labels: np.ndarray,
    shift: int, bounds: np.ndarray, docs: np.ndarray, out: tuple,
) -> tuple[int, int, int, int, int, int, int]:
    """:func:`observe_read_rows` with the document columns
    (:func:`zerobatch.stream._kernels.read_window_rows_segments`)."""
    outside, over = _observe_step(positions, start, end, size, block, layout0, passes0, keys0,
                                  layout1, passes1, keys1, order, observed, column)
    if outside >= 0 or over >= 0:
        return NOT_PLANNED, outside, over, 1, 0, 0, -1
    return read_window_rows_segments(sources, indices, table, n, shard_starts, live, bases,
                                     row, fds, addresses, sizes, use_pread, seq_len, inputs, labels,
                                     shift, bounds, docs, out)


@njit(nogil=True, cache=True)
def gather_read_rows(positions: np.ndarray, first: int, stride: int, run_sources: np.ndarray,
                     run_index: np.ndarray, observed: np.ndarray, column: np.ndarray,
                     sources: np.ndarray, indices: np.ndarray, table: np.ndarray, n: int,
                     shard_starts: np.ndarray, live: np.ndarray, bases: np.ndarray,
                     row: np.ndarray, fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray,
                     use_pread: bool, seq_len: int, inputs: np.ndarray, labels: np.ndarray,
                     shift: int, bounds: np.ndarray) -> tuple[int, int, int, int, int, int, int]:
    """:func:`gather_run` into ``observed`` and ``column``, then
    :func:`zerobatch.stream._kernels.read_window_rows` of those rows
    (``sources`` and ``indices`` are ``observed``'s two rows): a step read
    from its block's run in one call. Returns what ``read_window_rows``
    returns, or ``(NOT_PLANNED, ...)`` when a position is not in the run
    (nothing read)."""
    if not gather_run(positions, first, stride, run_sources, run_index, observed, column):
        return NOT_PLANNED, -1, -1, 1, 0, 0, -1
    return read_window_rows(sources, indices, table, n, shard_starts, live, bases, row, fds,
                            addresses, sizes, use_pread, seq_len, inputs, labels, shift, bounds)


@njit(nogil=True, cache=True)
def gather_read_rows_segments(
    positions: np.ndarray, first: int, stride: int, run_sources: np.ndarray,
    run_index: np.ndarray, observed: np.ndarray, column: np.ndarray,
    sources: np.ndarray, indices: np.ndarray, table: np.ndarray, n: int,
    shard_starts: np.ndarray, live: np.ndarray, bases: np.ndarray, row: np.ndarray,
    fds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray,
    use_pread: bool, seq_len: int, inputs: np.ndarray, labels: np.ndarray,
    shift: int, bounds: np.ndarray, docs: np.ndarray, out: tuple,
) -> tuple[int, int, int, int, int, int, int]:
    """:func:`gather_read_rows` with the document columns
    (:func:`zerobatch.stream._kernels.read_window_rows_segments`)."""
    if not gather_run(positions, first, stride, run_sources, run_index, observed, column):
        return NOT_PLANNED, -1, -1, 1, 0, 0, -1
    return read_window_rows_segments(sources, indices, table, n, shard_starts, live, bases,
                                     row, fds, addresses, sizes, use_pread, seq_len, inputs, labels,
                                     shift, bounds, docs, out)
