"""The pure plan: exact epochs across ranks, resumes with other world sizes, padding."""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch.plan import Plan, Position, epoch_seed


def _epoch(length: int, resumes: list[tuple[int, int, int]], *, seed: int, drop_last: bool,
           block_size: int | None) -> tuple[list[int], list[int], int]:
    """Run one epoch through a sequence of (world_size, batch_size, steps) segments, the
    last one to the end; returns (real indices, padding indices, dropped)."""
    consumed, seen, padded, plan = 0, [], [], None
    for number, (world, batch, steps) in enumerate(resumes):
        plan = Plan(length, batch, world_size=world, seed=seed, drop_last=drop_last,
                    block_size=block_size)
        last = number == len(resumes) - 1
        todo = plan.steps(consumed) if last else min(steps, plan.steps(consumed))
        for _ in range(todo):
            for rank in range(world):
                indices, padding = plan.indices(3, consumed, rank)
                seen += indices[~padding].tolist()
                padded += indices[padding].tolist()
            consumed += plan.step_size
        consumed = min(consumed, length)
    assert plan is not None
    return seen, padded, plan.dropped(consumed) if drop_last else 0


@settings(max_examples=150, deadline=None)
@given(
    length=st.integers(1, 10_000),
    resumes=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 40), st.integers(0, 30)),
                     min_size=1, max_size=5),
    seed=st.integers(0, 2**64 - 1),
    drop_last=st.booleans(),
    block_size=st.one_of(st.none(), st.integers(1, 50)),
)
def test_every_observation_once_across_ranks_and_resumes(length, resumes, seed, drop_last,
                                                         block_size):
    seen, padded, dropped = _epoch(length, resumes, seed=seed, drop_last=drop_last,
                                   block_size=block_size)
    assert len(seen) == len(set(seen))
    assert len(seen) + dropped == length
    assert set(seen) <= set(range(length))
    if drop_last:
        assert not padded
    else:
        assert set(padded) <= set(seen)  # padding repeats, never a new observation


def test_every_rank_runs_the_same_steps():
    plan = Plan(103, 4, world_size=5, drop_last=False)
    assert plan.steps() == 6
    _, padding = plan.indices(0, 100, rank=4)
    assert padding.all()
    assert Plan(103, 4, world_size=5).steps() == 5
    assert Plan(103, 4, world_size=5).dropped() == 3


def test_epoch_seed_mixes_seed_and_epoch():
    assert epoch_seed(1, 0) != epoch_seed(0, 1)
    a = Plan(1000, 10, seed=1).indices(0, 0, 0)[0]
    b = Plan(1000, 10, seed=0).indices(1, 0, 0)[0]
    assert not np.array_equal(a, b)
    assert epoch_seed(5, 7) == epoch_seed(5, 7)


def test_epochs_differ_and_are_permutations():
    plan = Plan(500, 500)
    first, second = plan.indices(0, 0, 0)[0], plan.indices(1, 0, 0)[0]
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(500))
    assert not np.array_equal(first, second)


def test_no_shuffle_is_seed_001_split():
    plan = Plan(16, 2, world_size=4, shuffle=False)
    assert plan.indices(0, 8, rank=1)[0].tolist() == [9, 13]


@pytest.mark.parametrize("length", [2**40, 10**12, 2**63])
def test_large_lengths_cost_the_same_at_any_step(length):
    plan = Plan(length, 32, world_size=1000, seed=9)
    far = min(10**9, plan.steps() // 2) * plan.step_size
    samples = []
    for consumed in (0, far, length - plan.dropped() - plan.step_size):
        for rank in (0, 999):
            indices, padding = plan.indices(0, consumed, rank)
            assert not padding.any()
            assert ((indices >= 0) & (indices < length)).all()
            samples += indices.tolist()
    assert len(samples) == len(set(samples))


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        Plan(10, 0)
    with pytest.raises(ValueError, match="world_size"):
        Plan(10, 1, world_size=0)
    with pytest.raises(ValueError, match="rank"):
        Plan(10, 1, world_size=2).indices(0, 0, 2)
    with pytest.raises(ValueError, match="consumed"):
        Plan(10, 1).indices(0, 11, 0)
    with pytest.raises(ValueError, match="no step"):
        Plan(10, 4).indices(0, 8, 0)
    with pytest.raises(TypeError, match="length"):
        Plan(1.5, 1)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(length=st.integers(1, 2**63), world=st.integers(1, 64), batch=st.integers(1, 40),
       seed=st.integers(0, 2**64 - 1), block_size=st.one_of(st.none(), st.integers(1, 50)),
       shuffle=st.booleans(), data=st.data())
def test_indices_are_the_order_at_the_rank_positions(length, world, batch, seed, block_size,
                                                     shuffle, data):
    plan = Plan(length, batch, world_size=world, seed=seed, drop_last=False,
                block_size=block_size, shuffle=shuffle)
    consumed = data.draw(st.integers(0, length - 1))
    rank = data.draw(st.integers(0, world - 1))
    indices, padding = plan.indices(2, consumed, rank)
    positions = [consumed + rank + world * k for k in range(batch)]
    order = plan.order(2)
    wrapped = [p % length for p in positions]
    assert indices.dtype == np.int64
    assert indices.tolist() == (wrapped if order is None else [order(p) for p in wrapped])
    assert padding.tolist() == [p >= length for p in positions]


@given(length=st.integers(0, 200), batch=st.integers(1, 9), world=st.integers(1, 4),
       drop_last=st.booleans(), epochs=st.integers(1, 3), start=st.integers(0, 200),
       chunk=st.integers(1, 40), data=st.data())
@settings(max_examples=80, deadline=None)
def test_planned_steps_carry_the_step_after_each_and_its_indices(
        length, batch, world, drop_last, epochs, start, chunk, data):
    plan = Plan(length, batch, world_size=world, drop_last=drop_last, seed=3)
    rank = data.draw(st.integers(0, world - 1))
    position = Position(plan)
    if plan.steps(min(start, length)):
        position.consumed = min(start, length)
    with mock.patch("zerobatch.plan._CHUNK", chunk):  # chunks end anywhere in an epoch
        planned = list(position.planned(epochs, rank))
    if plan.steps(0) == 0:
        assert planned == []
        return
    assert [step for step, *_ in planned] == list(position.steps(epochs))
    for (step, after, *_), following in itertools.pairwise(planned):
        assert after == plan.after(*step) == following[0]
    for step, _, indices, padding in planned:
        expected, expected_padding = plan.indices(*step, rank)
        assert indices.tolist() == expected.tolist()
        assert padding.tolist() == expected_padding.tolist()
    assert planned[-1][1] == plan.after(*planned[-1][0])


def test_rank_indices_rows_are_the_steps_and_refuse_past_the_epoch():
    plan = Plan(1000, 8, world_size=3, seed=5)
    rows = plan.rank_indices(0, 24, 2, steps=5)
    assert rows.shape == (5, 8)
    for j in range(5):
        assert rows[j].tolist() == plan.indices(0, 24 + 24 * j, 2)[0].tolist()
    with pytest.raises(ValueError, match="41 step"):
        plan.rank_indices(0, 0, 0, steps=42)
    with pytest.raises(ValueError, match="asked for 0"):
        plan.rank_indices(0, 0, 0, steps=0)


def test_padding_of_a_dropped_tail_plan_is_all_false_and_read_only():
    plan = Plan(100, 8, world_size=3, seed=5)
    _, padding = plan.indices(0, 24, 2)
    assert padding.tolist() == [False] * 8
    with pytest.raises(ValueError):
        padding[0] = True  # shared by every step: never writable


@settings(max_examples=200, deadline=None)
@given(length=st.integers(0, 40), batch_size=st.integers(1, 5), world_size=st.integers(1, 3),
       drop_last=st.booleans(), consumed=st.integers(0, 40), steps=st.integers(0, 60))
def test_advance_is_after_repeated(length, batch_size, world_size, drop_last, consumed, steps):
    """Plan.advance (O(1)) lands where ``steps`` calls of ``after`` land."""
    plan = Plan(length, batch_size, world_size=world_size, drop_last=drop_last)
    if plan.steps(0) == 0 or consumed > length:
        return
    epoch, at = (0, consumed) if plan.steps(consumed) else (1, 0)
    for _ in range(steps):
        epoch, at = plan.after(epoch, at)
    assert plan.advance(0, consumed, steps) == (epoch, at)


@pytest.mark.parametrize("epoch", [-1, 2**63, 2**64 + 5, 1.0, True, None])
def test_position_refuses_an_epoch_no_request_can_carry(epoch: object) -> None:
    """Found by the fuzzer (state-batch-client): a state with epoch 2**64 loaded,
    then BatchClient could not pack its request (msgpack: 64-bit integers)."""
    position = Position(Plan(10, 2, seed=1), "f")
    good = position.state_dict()
    assert position.check({**good, "epoch": 2**63 - 1}) == (2**63 - 1, 0)
    with pytest.raises(ValueError, match=r"epoch=.*expected an int in \[0, 2\*\*63\)"):
        position.check({**good, "epoch": epoch})
