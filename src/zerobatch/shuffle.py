"""Shuffles that need no memory: a keyed Feistel permutation and a block shuffle.

``Feistel(n, seed)`` is a bijection on ``[0, n)`` for any ``n`` from 1 to 2**63.
It runs a balanced Feistel network over the smallest even bit width ``w`` with
``2**w >= n`` and walks the cycle (applies the network again) while the value is
``>= n``; because ``2**w < 4 * n`` a walk takes under four steps on average.
Round keys come from the seed through the SplitMix64 mixer, and the round
function is that mixer too, so the permutation is pure 64-bit integer arithmetic:
identical on every machine and every NumPy version.

``BlockShuffle(n, block_size, seed)`` keeps runs of ``block_size`` consecutive
items together and permutes the order of the runs (seed 000's block shuffle).
The last, shorter block takes part in the shuffle like the others.

Both map one int or a NumPy integer array at a time; arrays go through Numba
kernels that release the GIL. Neither allocates anything proportional to ``n``.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import numpy.typing as npt

from zerobatch._jit import njit

__all__ = ["DEFAULT_ROUNDS", "MAX_LENGTH", "BlockShuffle", "Feistel"]

MAX_LENGTH = 2**63
"""The largest ``n`` a permutation accepts (indices fit in int64)."""

DEFAULT_ROUNDS = 6
"""Feistel rounds: six give a uniform shuffle for non-cryptographic use."""

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_SEED_DOMAIN = 0x5A45524F42415443  # "ZEROBATC": separates our keys from plain SplitMix64

IntArray = npt.NDArray[np.integer]


def _splitmix64(value: int) -> int:
    """The SplitMix64 finalizer on a Python int (mod 2**64)."""
    z = value & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def round_keys(seed: int, rounds: int) -> npt.NDArray[np.uint64]:
    """The ``rounds`` 64-bit round keys derived from ``seed`` (any int, taken mod 2**64)."""
    base = _splitmix64(seed ^ _SEED_DOMAIN)
    keys = [_splitmix64(base + (i + 1) * _GOLDEN) for i in range(rounds)]
    return np.array(keys, dtype=np.uint64)


@njit(nogil=True, cache=True, inline="always")
def _mix(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(nogil=True, cache=True)
def _network(a: np.ndarray, b: np.ndarray, count: int, keys: np.ndarray,
             mask: np.uint64) -> None:
    """Every round of the network on the first ``count`` pairs of halves, in
    place: ``(a, b) <- (b, a ^ F(b ^ key))`` for each key in turn. Encrypting
    passes (left, right) and the keys in order; decrypting passes (right, left)
    and the keys reversed. The loop over values is the inner one, so it runs
    in SIMD lanes (the values are independent; walking one value at a time
    waits on each multiply)."""
    for k in range(keys.shape[0]):
        key = keys[k]
        for j in range(count):
            right = b[j]
            b[j] = a[j] ^ (_mix(right ^ key) & mask)
            a[j] = right


@njit(nogil=True, cache=True, inline="always")
def fill_round_keys(seed: np.uint64, keys: np.ndarray) -> None:
    """``keys[:DEFAULT_ROUNDS]`` = the round keys ``permute_one(..., seed)``
    derives (for :func:`permute_keyed`, which takes them given)."""
    base = _mix(seed ^ np.uint64(_SEED_DOMAIN))
    for i in range(DEFAULT_ROUNDS):
        keys[i] = _mix(base + np.uint64(i + 1) * np.uint64(_GOLDEN))


@njit(nogil=True, cache=True, inline="always")
def permute_keyed(value: int, n: int, half: int, keys: np.ndarray) -> int:
    """:func:`permute_one` with its round keys given (:func:`fill_round_keys`):
    no key derivation per value, for kernels that permute many values under
    one seed held in a table."""
    h = np.uint64(half)
    mask = (np.uint64(1) << h) - np.uint64(1)
    limit = np.uint64(n)
    y = np.uint64(value)
    while True:
        a, b = y >> h, y & mask
        for i in range(DEFAULT_ROUNDS):
            a, b = b, a ^ (_mix(b ^ keys[i]) & mask)
        y = (a << h) | b
        if y < limit:
            return np.int64(y)  # type: ignore[return-value]  # an int in the kernel


@njit(nogil=True, cache=True, inline="always")
def permute_one(value: int, n: int, half: int, seed: np.uint64) -> int:
    """``Feistel(n, seed)(value)`` inside a kernel, for one ``value`` in
    ``[0, n)``: the round keys of ``round_keys(seed, DEFAULT_ROUNDS)`` and the
    same network and cycle walk; ``half`` is ``Feistel(n, seed)``'s half width
    (``(max(2, (n - 1).bit_length()) + 1) // 2``). About 8 mixes a value
    plus 12 a step of the walk: for kernels that permute a few values under many
    seeds (a mixture's sources), where a ``Feistel`` per seed costs more."""
    base = _mix(seed ^ np.uint64(_SEED_DOMAIN))
    h = np.uint64(half)
    mask = (np.uint64(1) << h) - np.uint64(1)
    limit = np.uint64(n)
    y = np.uint64(value)
    while True:
        a, b = y >> h, y & mask
        for i in range(DEFAULT_ROUNDS):  # round key i: recomputed, nothing allocated
            key = _mix(base + np.uint64(i + 1) * np.uint64(_GOLDEN))
            a, b = b, a ^ (_mix(b ^ key) & mask)
        y = (a << h) | b
        if y < limit:
            return np.int64(y)  # type: ignore[return-value]  # an int in the kernel


_BLOCK = 1024
"""Values the kernels walk together: their halves stay in L1, and the scratch
memory is the same for any count."""


@njit(nogil=True, cache=True)
def _walk(left: np.ndarray, right: np.ndarray, out: np.ndarray, keys: np.ndarray,
          half: int, n: np.uint64, inverse: bool) -> None:
    """``out[i]`` = the permutation (or its inverse: pass ``keys`` reversed) of
    the value whose halves are ``left[i]`` and ``right[i]`` (below ``n``; as many
    as ``out`` holds): the network applied again while the result is ``>= n``,
    every value still walking in one pass. Consumes the halves."""
    h = np.uint64(half)
    mask = (np.uint64(1) << h) - np.uint64(1)
    limit = np.uint64(n)
    count = out.shape[0]
    where = np.arange(count)  # where each walking value goes in out
    while count > 0:
        if inverse:  # decrypting is encrypting the swapped halves, keys reversed
            _network(right, left, count, keys, mask)
        else:
            _network(left, right, count, keys, mask)
        walking = 0
        for j in range(count):  # keep the values still >= n at the front
            y = (left[j] << h) | right[j]
            i = where[j]
            out[i] = np.int64(y)
            where[walking] = i
            left[walking] = left[j]
            right[walking] = right[j]
            walking += 1 if y >= limit else 0
        count = walking


@njit(nogil=True, cache=True)
def _permute_array(
    indices: np.ndarray,
    out: np.ndarray,
    keys: np.ndarray,
    half: int,
    n: np.uint64,
    inverse: bool,
) -> int:
    """Permute ``indices`` into ``out``; returns the position of the first index
    outside ``[0, n)``, or -1 when all are valid (``out`` is then complete)."""
    h = np.uint64(half)
    mask = (np.uint64(1) << h) - np.uint64(1)
    limit = np.uint64(n)
    for i in range(indices.shape[0]):
        value = indices[i]
        if value < 0 or np.uint64(value) >= limit:
            return i
    order = keys[::-1].copy() if inverse else keys
    first = np.empty(_BLOCK, dtype=np.uint64)
    second = np.empty(_BLOCK, dtype=np.uint64)
    for start in range(0, indices.shape[0], _BLOCK):
        block = out[start:start + _BLOCK]
        for j in range(block.shape[0]):
            value = np.uint64(indices[start + j])
            first[j] = value >> h
            second[j] = value & mask
        _walk(first, second, block, order, half, n, inverse)
    return -1


@njit(nogil=True, cache=True)
def _permute_range(
    start: int, step: int, out: np.ndarray, keys: np.ndarray, half: int, n: np.uint64
) -> None:
    """``out[i] = permute((start + i * step) % n)``, for ``0 <= start, step < n``."""
    h = np.uint64(half)
    mask = (np.uint64(1) << h) - np.uint64(1)
    limit = np.uint64(n)
    position = np.uint64(start)
    stride = np.uint64(step)
    left = np.empty(_BLOCK, dtype=np.uint64)
    right = np.empty(_BLOCK, dtype=np.uint64)
    for first in range(0, out.shape[0], _BLOCK):
        block = out[first:first + _BLOCK]
        for j in range(block.shape[0]):
            left[j] = position >> h
            right[j] = position & mask
            position += stride  # below 2**64: both terms are below n <= 2**63
            if position >= limit:
                position -= limit
        _walk(left, right, block, keys, half, n, False)


_NOGIL_FROM = 4096
"""Ranges this long release the GIL while they are permuted; shorter ones (a
batch's indices, or the Loader's 2,048 positions, 1-15 us) keep it: handing
the GIL to another thread and back costs more than the work when threads
contend (a reader thread per step)."""


@njit(cache=True)
def _permute_range_holding(
    start: int, step: int, out: np.ndarray, keys: np.ndarray, half: int, n: np.uint64
) -> None:
    """:func:`_permute_range` keeping the GIL. A function of its own, not a second
    ``njit`` of the same Python function: Numba's cache names a kernel's file by
    its function, so the two would overwrite each other's cached code, and either
    could load the other's (with the other's GIL handling)."""
    _permute_range(start, step, out, keys, half, n)


@njit(cache=True)
def _permute_array_holding(
    indices: np.ndarray, out: np.ndarray, keys: np.ndarray, half: int, n: np.uint64,
    inverse: bool,
) -> int:
    """:func:`_permute_array` keeping the GIL, for arrays shorter than
    ``_NOGIL_FROM`` (a mixture permutes a few indices of each of many sources
    a step: releasing and taking back the GIL for each would cost more)."""
    return _permute_array(indices, out, keys, half, n, inverse)


def _check_length(n: object, name: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if not 1 <= int(n) <= MAX_LENGTH:
        raise ValueError(f"{name} must be in [1, 2**63], got {n}")
    return int(n)


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return int(seed) & _MASK64


class Feistel:
    """A keyed pseudorandom bijection on ``[0, n)``, computed on demand.

    Args:
        n: the length of the domain, 1 <= n <= 2**63.
        seed: any int; taken mod 2**64. The same (n, seed, rounds) gives the same
            permutation on every machine.
        rounds: Feistel rounds, at least 1 (default 6).

    Memory is O(rounds); time per index is O(rounds), about 4 walks at most on
    average. Thread-safe: instances are immutable.

    >>> p = Feistel(10, seed=7)
    >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
    True
    >>> p.inverse(p(3)) == 3
    True
    """

    __slots__ = ("_half", "_keys", "_limit", "_n", "_rounds", "_seed")

    def __init__(self, n: int, seed: int, *, rounds: int = DEFAULT_ROUNDS) -> None:
        self._n = _check_length(n)
        self._seed = _check_seed(seed)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
        self._rounds = rounds
        bits = max(2, (self._n - 1).bit_length())
        self._half = (bits + 1) // 2
        self._keys = round_keys(self._seed, rounds)
        self._limit = np.uint64(self._n)  # the kernels' n, built once (0.3 us a call)

    @property
    def n(self) -> int:
        """The domain length."""
        return self._n

    @property
    def seed(self) -> int:
        """The seed, reduced mod 2**64."""
        return self._seed

    @property
    def rounds(self) -> int:
        """The number of Feistel rounds."""
        return self._rounds

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"Feistel(n={self._n}, seed={self._seed}, rounds={self._rounds})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Feistel):
            return NotImplemented
        return (self._n, self._seed, self._rounds) == (other._n, other._seed, other._rounds)

    def __hash__(self) -> int:
        return hash((Feistel, self._n, self._seed, self._rounds))

    @overload
    def __call__(self, index: int) -> int: ...
    @overload
    def __call__(
        self, index: IntArray, *, out: npt.NDArray[np.int64] | None = None
    ) -> npt.NDArray[np.int64]: ...
    def __call__(
        self, index: int | IntArray, *, out: npt.NDArray[np.int64] | None = None
    ) -> int | npt.NDArray[np.int64]:
        """The permuted position of ``index`` (an int or an integer array)."""
        return self._apply(index, out, inverse=False)

    @overload
    def inverse(self, index: int) -> int: ...
    @overload
    def inverse(
        self, index: IntArray, *, out: npt.NDArray[np.int64] | None = None
    ) -> npt.NDArray[np.int64]: ...
    def inverse(
        self, index: int | IntArray, *, out: npt.NDArray[np.int64] | None = None
    ) -> int | npt.NDArray[np.int64]:
        """The index that ``self`` maps to ``index``: ``p.inverse(p(i)) == i``."""
        return self._apply(index, out, inverse=True)

    def range(self, start: int, stop: int, step: int = 1) -> npt.NDArray[np.int64]:
        """``self(np.arange(start, stop, step))`` without building the input array.

        ``start`` and ``stop`` are clipped to ``[0, n]`` like a slice; ``step > 0``.
        """
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step}")
        first, last, _ = slice(start, stop).indices(self._n)
        count = max(0, -(-(last - first) // step))
        return self.strided(first, count, step)

    def strided(self, start: int, count: int, step: int = 1) -> npt.NDArray[np.int64]:
        """``self((start + step * np.arange(count)) % n)`` in one kernel call:
        positions past the end wrap to its start. ``start >= 0``, ``step >= 1``.

        >>> p = Feistel(10, seed=7)
        >>> p.strided(8, 4).tolist() == p(np.array([8, 9, 0, 1])).tolist()
        True
        """
        out = np.empty(count, dtype=np.int64)
        permute = _permute_range if count >= _NOGIL_FROM else _permute_range_holding
        permute(start % self._n, step % self._n, out, self._keys, self._half, self._limit)
        return out

    def _apply(
        self, index: int | IntArray, out: npt.NDArray[np.int64] | None, *, inverse: bool
    ) -> int | npt.NDArray[np.int64]:
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            value = int(index)
            if not 0 <= value < self._n:
                raise IndexError(f"index {value} is out of range for a permutation of {self._n}")
            single = np.array([value], dtype=np.int64)
            _permute_array_holding(single, single, self._keys, self._half, self._limit,
                                   inverse)
            return int(single[0])
        array = np.asarray(index)
        if array.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {array.dtype}")
        if array.dtype.kind == "u" and array.size and int(array.max()) >= MAX_LENGTH:
            raise IndexError(f"index {int(array.max())} is out of range for {self._n}")
        flat = np.ascontiguousarray(array, dtype=np.int64).reshape(-1)
        if out is None:
            result = np.empty(flat.shape[0], dtype=np.int64)
        else:
            if out.dtype != np.int64 or out.size != flat.size or not out.flags.c_contiguous:
                raise ValueError("out must be a C-contiguous int64 array of the indices' size")
            result = out.reshape(-1)
        permute = _permute_array if flat.shape[0] >= _NOGIL_FROM else _permute_array_holding
        bad = permute(flat, result, self._keys, self._half, self._limit, inverse)
        if bad >= 0:
            raise IndexError(
                f"index {int(flat[bad])} (at position {bad}) is out of range "
                f"for a permutation of {self._n}"
            )
        return result.reshape(array.shape) if out is None else out


class BlockShuffle:
    """Permute the order of blocks of ``block_size`` consecutive items.

    Position ``p`` of the shuffled order holds item ``self(p)``. Items inside a
    block keep their order; blocks are ordered by ``Feistel(num_blocks, seed)``.
    When ``block_size`` does not divide ``n`` the last block is shorter and is
    shuffled like the others. O(1) memory; thread-safe (immutable).

    >>> s = BlockShuffle(10, block_size=4, seed=1)
    >>> sorted(s(np.arange(10)).tolist()) == list(range(10))
    True
    """

    __slots__ = ("_block", "_blocks", "_n", "_perm", "_span", "_tail", "_tail_slot")

    def __init__(self, n: int, block_size: int, seed: int, *, rounds: int = DEFAULT_ROUNDS) -> None:
        self._n = _check_length(n)
        self._block = _check_length(block_size, "block_size")
        # A block of n items or more is one block, the identity: the arithmetic uses
        # at most n, so positions plus a block stay inside int64 (block_size 2**63).
        self._span = min(self._block, self._n) if self._n else self._block
        self._blocks = -(-self._n // self._span)
        self._tail = self._n - (self._blocks - 1) * self._span
        self._perm = Feistel(self._blocks, seed, rounds=rounds)
        self._tail_slot = self._perm.inverse(self._blocks - 1)

    @property
    def n(self) -> int:
        """The number of items."""
        return self._n

    @property
    def block_size(self) -> int:
        """Items per block."""
        return self._block

    @property
    def num_blocks(self) -> int:
        """Blocks, the last one possibly shorter."""
        return self._blocks

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"BlockShuffle(n={self._n}, block_size={self._block}, seed={self._perm.seed})"

    @overload
    def __call__(self, position: int) -> int: ...
    @overload
    def __call__(self, position: IntArray) -> npt.NDArray[np.int64]: ...
    def __call__(self, position: int | IntArray) -> int | npt.NDArray[np.int64]:
        """The item at ``position`` of the shuffled order."""
        scalar = isinstance(position, (int, np.integer))
        pos = np.asarray(position, dtype=np.int64)
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= self._n):
            raise IndexError(f"position out of range for a block shuffle of {self._n} items")
        bs, tail = self._span, self._tail
        tail_start = self._tail_slot * bs
        in_tail = (pos >= tail_start) & (pos < tail_start + tail)
        shifted = np.where(pos >= tail_start + tail, pos - tail + bs, pos)
        slot, offset = np.divmod(shifted, bs)
        slot = np.where(in_tail, 0, slot)  # keep tail positions in range for the permutation
        items = self._perm(slot) * bs + offset
        items = np.where(in_tail, (self._blocks - 1) * bs + (pos - tail_start), items)
        return int(items) if scalar else items

    @overload
    def inverse(self, item: int) -> int: ...
    @overload
    def inverse(self, item: IntArray) -> npt.NDArray[np.int64]: ...
    def inverse(self, item: int | IntArray) -> int | npt.NDArray[np.int64]:
        """The position that holds ``item``: ``s.inverse(s(p)) == p``."""
        scalar = isinstance(item, (int, np.integer))
        items = np.asarray(item, dtype=np.int64)
        if items.size and (int(items.min()) < 0 or int(items.max()) >= self._n):
            raise IndexError(f"item out of range for a block shuffle of {self._n} items")
        bs = self._span
        block, offset = np.divmod(items, bs)
        slot = self._perm.inverse(block)
        pos = slot * bs + offset - np.where(slot > self._tail_slot, bs - self._tail, 0)
        return int(pos) if scalar else pos
