"""Numba kernels of the mixture order: per-block counts, cumulative slots, block layout.

The math is in :mod:`zerobatch.mixture.order`'s docstring. Kernels never raise;
their callers check inputs. All arithmetic is int64 and fits: a stage's
cumulative counts are below 2**63 because positions are.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from zerobatch.shuffle import _mix

__all__ = ["PERIOD", "ROTATION", "block_counts", "block_layout", "extras_before"]

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
    order = np.argsort(keys, kind="mergesort")
    for i in range(total):
        sources[i] = owner[order[i]]
        ordinals[i] = rank[order[i]]
