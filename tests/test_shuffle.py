from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch.plan import Plan
from zerobatch.shuffle import _NOGIL_FROM, DEFAULT_ROUNDS, MAX_LENGTH, BlockShuffle, Feistel

SEEDS = st.integers(min_value=-(2**70), max_value=2**70)


def _is_permutation(values: np.ndarray, n: int) -> bool:
    return values.shape == (n,) and bool(np.array_equal(np.sort(values), np.arange(n)))


def test_bijection_for_every_small_n() -> None:
    for n in range(1, 3001):
        p = Feistel(n, seed=n * 7919)
        out = p(np.arange(n))
        assert _is_permutation(out, n), n
        assert np.array_equal(p.inverse(out), np.arange(n)), n


@given(n=st.integers(1, 5000), seed=SEEDS, rounds=st.integers(1, 12))
@settings(max_examples=200, deadline=None)
def test_bijection_any_seed_and_rounds(n: int, seed: int, rounds: int) -> None:
    p = Feistel(n, seed, rounds=rounds)
    out = p.range(0, n)
    assert _is_permutation(out, n)
    assert np.array_equal(p.inverse(out), np.arange(n))
    assert np.array_equal(out, p(np.arange(n)))


def _powers_and_neighbours() -> list[int]:
    values = set()
    for bits in range(1, 64):
        for delta in (-2, -1, 0, 1, 2):
            value = 2**bits + delta
            if 1 <= value <= MAX_LENGTH:
                values.add(value)
    return sorted(values)


@pytest.mark.parametrize("n", [v for v in _powers_and_neighbours() if v <= 2**21 + 2])
def test_bijection_at_powers_of_two_and_four_exhaustively(n: int) -> None:
    p = Feistel(n, seed=n)
    assert _is_permutation(p.range(0, n), n)


@pytest.mark.parametrize("n", [v for v in _powers_and_neighbours() if v > 2**21 + 2])
def test_large_n_inverse_and_range(n: int) -> None:
    rng = np.random.default_rng(n % 2**32)
    x = np.unique(rng.integers(0, n, size=20_000, dtype=np.uint64).astype(np.int64))
    x = np.concatenate([x, [0, n - 1]]).astype(np.int64)
    x = np.unique(x)
    p = Feistel(n, seed=12345)
    y = p(x)
    assert int(y.min()) >= 0 and int(y.max()) < n
    assert len(np.unique(y)) == len(x), "two indices mapped to one position"
    assert np.array_equal(p.inverse(y), x)


@given(n=st.integers(1, MAX_LENGTH), seed=SEEDS, data=st.data())
@settings(max_examples=300, deadline=None)
def test_scalar_matches_vector_and_inverts(n: int, seed: int, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, n - 1))
    p = Feistel(n, seed)
    y = p(index)
    assert isinstance(y, int) and 0 <= y < n
    assert p.inverse(y) == index
    assert int(p(np.array([index]))[0]) == y


def test_deterministic_golden_values() -> None:
    # These values are part of the on-disk contract: a checkpoint made with one
    # release must resume to the same order with the next. Never change them.
    assert Feistel(10, seed=0)(np.arange(10)).tolist() == GOLDEN_10_SEED_0
    assert Feistel(2**40 + 3, seed=42)(12345) == GOLDEN_BIG
    assert Feistel(10**7, seed=7, rounds=4)(0) == GOLDEN_ROUNDS4


GOLDEN_10_SEED_0 = [4, 8, 7, 2, 1, 6, 0, 9, 5, 3]
GOLDEN_BIG = 605008531777
GOLDEN_ROUNDS4 = 5713753


def test_different_seeds_give_different_orders() -> None:
    n = 1000
    orders = {tuple(Feistel(n, seed).range(0, n).tolist()) for seed in range(50)}
    assert len(orders) == 50
    a, b = Feistel(n, 1).range(0, n), Feistel(n, 2).range(0, n)
    assert np.mean(a == b) < 0.02


def _chi_square_critical(df: int) -> float:
    """Upper 0.1% point of chi-square (Wilson-Hilferty approximation)."""
    z = 3.090  # standard normal 99.9th percentile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("n", [7, 16, 100])
def test_where_an_index_lands_is_uniform_over_seeds(n: int) -> None:
    trials = 200 * n
    landed = np.array([Feistel(n, seed)(3 % n) for seed in range(trials)])
    counts = np.bincount(landed, minlength=n)
    expected = trials / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < _chi_square_critical(n - 1), (chi2, counts)


def test_adjacent_inputs_are_not_adjacent_outputs() -> None:
    n = 1_000_000
    out = Feistel(n, seed=99).range(0, n)
    steps = np.abs(np.diff(out))
    assert np.mean(steps == 1) < 1e-3
    assert abs(np.corrcoef(np.arange(n), out)[0, 1]) < 0.01


def test_range_matches_slices() -> None:
    p = Feistel(1000, seed=5)
    full = p.range(0, 1000)
    assert np.array_equal(p.range(3, 900, 7), full[3:900:7])
    assert np.array_equal(p.range(-10, 5000), full[-10:])
    assert p.range(500, 100).size == 0


def test_out_parameter_and_shapes() -> None:
    p = Feistel(100, seed=1)
    idx = np.arange(100).reshape(10, 10)
    assert p(idx).shape == (10, 10)
    out = np.empty(100, dtype=np.int64)
    assert p(np.arange(100), out=out) is out
    assert np.array_equal(out, p.range(0, 100))
    assert p(np.arange(100, dtype=np.uint16)).dtype == np.int64


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: Feistel(0, 1), ValueError, r"n must be in \[1, 2\*\*63\]"),
        (lambda: Feistel(2**63 + 1, 1), ValueError, "n must be"),
        (lambda: Feistel(10, 1.5), TypeError, "seed must be an int"),  # type: ignore[arg-type]
        (lambda: Feistel(10, 1, rounds=0), ValueError, "rounds"),
        (lambda: Feistel(10, 1)(10), IndexError, "index 10 is out of range"),
        (lambda: Feistel(10, 1)(-1), IndexError, "out of range"),
        (lambda: Feistel(10, 1)(np.array([1, 2, 11])), IndexError, "at position 2"),
        (lambda: Feistel(10, 1)(np.array([1.0])), TypeError, "must be integers"),
        (lambda: Feistel(10, 1).inverse(np.array([-3])), IndexError, "-3"),
        (lambda: Feistel(10, 1).range(0, 10, 0), ValueError, "step"),
    ],
)
def test_bad_arguments(call: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()  # type: ignore[operator]


@given(n=st.integers(1, 3000), block=st.integers(1, 300), seed=SEEDS)
@settings(max_examples=200, deadline=None)
def test_block_shuffle_is_a_block_preserving_bijection(n: int, block: int, seed: int) -> None:
    s = BlockShuffle(n, block, seed)
    order = s(np.arange(n))
    assert _is_permutation(order, n)
    assert np.array_equal(s.inverse(order), np.arange(n))
    # Every run of items from one block is consecutive and ascending.
    blocks = order // block
    for b in np.unique(blocks):
        where = np.flatnonzero(blocks == b)
        assert np.array_equal(np.diff(where), np.ones(len(where) - 1, dtype=np.int64))
        assert np.array_equal(order[where], np.arange(b * block, min(n, (b + 1) * block)))


def test_block_shuffle_orders_blocks_differently_per_seed() -> None:
    n, block = 256 * 40, 256
    first = {
        tuple(BlockShuffle(n, block, seed)(np.arange(0, n, block)).tolist()) for seed in range(20)
    }
    assert len(first) == 20
    assert BlockShuffle(10, 4, 1)(5) == int(BlockShuffle(10, 4, 1)(np.array([5]))[0])
    with pytest.raises(IndexError):
        BlockShuffle(10, 4, 1)(10)


@given(n=st.integers(1, MAX_LENGTH), seed=SEEDS, data=st.data())
@settings(max_examples=200, deadline=None)
def test_strided_wraps_positions_past_the_end(n: int, seed: int, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, n + 64))
    count, step = data.draw(st.integers(0, 40)), data.draw(st.integers(1, 64))
    p = Feistel(n, seed)
    positions = [(start + step * i) % n for i in range(count)]
    expected = [p(value) for value in positions]
    assert p.strided(start, count, step).tolist() == expected


@pytest.mark.parametrize("n", [5_000, 2**40 + 3])
def test_strided_is_the_same_kernel_either_side_of_the_gil_threshold(n: int) -> None:
    """Short ranges keep the GIL, long ones release it: one definition."""
    p = Feistel(n, 99)
    count = _NOGIL_FROM + 7
    long = p.strided(n - 3, count, 3)  # wraps past the end
    short = np.concatenate([p.strided(n - 3 + 3 * i, 1, 3) for i in range(count)])
    assert long.tolist() == short.tolist()
    assert long.tolist() == p(np.array([(n - 3 + 3 * i) % n for i in range(count)])).tolist()


@pytest.mark.parametrize("block", [48, 49, 2**62, 2**63 - 1, MAX_LENGTH])
def test_a_block_of_all_items_or_more_is_the_identity(block: int) -> None:
    """Found by the fuzzer (a BatchServer request with block_size 2**63): a
    block far larger than the items overflowed int64 (OverflowError)."""
    s = BlockShuffle(48, block, seed=3)
    positions = np.arange(48)
    assert s(positions).tolist() == list(range(48))
    assert s.inverse(positions).tolist() == list(range(48))
    assert s.block_size == block and s.num_blocks == 1
    plan = Plan(48, 4, block_size=block)
    assert plan.indices(0, 0, 0)[0].tolist() == [0, 1, 2, 3]


def _both_kernel_permutations():
    from numba import njit

    from zerobatch.shuffle import fill_round_keys, permute_keyed, permute_one

    @njit
    def both(value: int, n: int, half: int, seed: np.uint64) -> tuple[int, int]:
        keys = np.empty(DEFAULT_ROUNDS, np.uint64)
        fill_round_keys(seed, keys)
        return permute_one(value, n, half, seed), permute_keyed(value, n, half, keys)

    return both


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 2**40), seed=st.integers(0, 2**64 - 1), at=st.integers(0, 2**40))
def test_kernel_permutations_equal_feistel(n: int, seed: int, at: int) -> None:
    """The kernels' one-value Feistel (``permute_one``: keys derived per value)
    and its keyed form (``permute_keyed`` over ``fill_round_keys``: a
    mixture's per-block keys) are ``Feistel(n, seed)`` itself."""
    value = at % n
    half = (max(2, (n - 1).bit_length()) + 1) // 2
    expected = int(Feistel(n, seed)(np.array([value], np.int64))[0])
    got = _BOTH(value, n, half, np.uint64(seed))
    assert (int(got[0]), int(got[1])) == (expected, expected)


_BOTH = _both_kernel_permutations()
