"""Which observations a rank reads at each step: a pure function, no I/O.

An epoch's order is a permutation of ``[0, length)``: ``Feistel`` over the
observations, or ``BlockShuffle`` (runs of ``block_size`` consecutive
observations kept together), seeded by :func:`epoch_seed` ``(seed, epoch)``;
with ``shuffle=False`` the identity. A step consumes ``batch_size *
world_size`` consecutive *positions* of that order; rank ``r``'s batch at the
step that starts at global position ``consumed`` holds positions ``consumed +
r + world_size * k`` for ``k < batch_size`` (seed 001's ``range(start + rank,
len, ranks)``, batched).

The only state is ``consumed``, the global count of positions taken, the same
on every rank. Resuming at that count with another ``world_size`` or
``batch_size`` continues the same order, so across all ranks and resumes each
observation of an epoch comes exactly once, minus the tail:

- ``drop_last=True``: positions past the last full step are skipped
  (:meth:`Plan.dropped` says how many);
- ``drop_last=False``: the last step is filled from the start of the epoch's
  order (as torch's ``DistributedSampler`` pads); those rows are marked in the
  ``padding`` mask and are the only repeats.

Every rank runs the same number of steps. Computing any step costs
O(batch_size), whatever the step or the length (up to 2**63).

>>> plan = Plan(10, 2, world_size=2, seed=0)
>>> plan.steps(), plan.dropped()
(2, 2)
>>> a, _ = plan.indices(0, 0, rank=0); b, _ = plan.indices(0, 0, rank=1)
>>> len(set(a.tolist()) | set(b.tolist()))
4
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch.shuffle import MAX_LENGTH, BlockShuffle, Feistel, _splitmix64

__all__ = ["STATE_VERSION", "Plan", "Planned", "Position", "epoch_seed", "rank_steps"]

STATE_VERSION = 1
"""The version of :meth:`Position.state_dict`'s layout."""

_MASK64 = (1 << 64) - 1
_WALK_LIMIT = 1 << 20  # Plan.advance: steps a subclass with its own step rule walks at most
_EPOCH_DOMAIN = 0x45504F4348534544  # "EPOCHSED": keeps epoch seeds apart from plain seeds


def epoch_seed(seed: int, epoch: int) -> int:
    """The 64-bit seed of ``epoch``'s order: a SplitMix64 mix of both, so
    (seed=1, epoch=0) and (seed=0, epoch=1) differ (``seed ^ epoch`` would not)."""
    return _splitmix64(_splitmix64((seed & _MASK64) ^ _EPOCH_DOMAIN) + (epoch & _MASK64))


@functools.lru_cache(maxsize=16)  # one per epoch in use: building one costs more than a step
def _order(length: int, seed: int, epoch: int, block_size: int | None) -> Feistel | BlockShuffle:
    if block_size is None:
        return Feistel(length, epoch_seed(seed, epoch))
    return BlockShuffle(length, block_size, epoch_seed(seed, epoch))


@functools.lru_cache(maxsize=16)
def _no_padding(count: int) -> npt.NDArray[np.bool_]:
    """``count`` False values, read-only (shared by every step of that size)."""
    padding = np.zeros(count, dtype=np.bool_)
    padding.setflags(write=False)
    return padding


def _positive(name: str, value: object, *, maximum: int = MAX_LENGTH) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= int(value) <= maximum:
        raise ValueError(f"{name} must be in [1, {maximum}], got {value}")
    return int(value)


@dataclass(frozen=True)
class Plan:
    """The order of an epoch split into steps and ranks (see the module docstring).

    Args:
        length: observations in the source (0 allowed: no steps).
        batch_size: observations per rank per step.
        world_size: ranks.
        seed: any int (mod 2**64); with the epoch it seeds the order.
        shuffle: permute the order; False reads observations in order.
        drop_last: skip the tail (True) or pad the last step (False).
        block_size: ``None`` for a full Feistel shuffle, or keep runs of
            ``block_size`` consecutive observations together (fewer, larger reads).

    Immutable and thread-safe.
    """

    length: int
    batch_size: int
    world_size: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    block_size: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, (int, np.integer)):
            raise TypeError(f"length must be an int, got {type(self.length).__name__}")
        if not 0 <= int(self.length) <= MAX_LENGTH:
            raise ValueError(f"length must be in [0, 2**63], got {self.length}")
        _positive("batch_size", self.batch_size)
        _positive("world_size", self.world_size)
        if self.block_size is not None:
            _positive("block_size", self.block_size)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")

    @property
    def step_size(self) -> int:
        """Positions one step consumes across all ranks: ``batch_size * world_size``."""
        return self.batch_size * self.world_size

    def check_rank(self, rank: int) -> int:
        """``rank`` as an int, or ValueError unless ``0 <= rank < world_size``."""
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise TypeError(f"rank must be an int, got {type(rank).__name__}")
        if not 0 <= int(rank) < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {rank}")
        return int(rank)

    def check_consumed(self, consumed: int) -> int:
        """``consumed`` as an int, or ValueError unless ``0 <= consumed <= length``."""
        if isinstance(consumed, bool) or not isinstance(consumed, (int, np.integer)):
            raise TypeError(f"consumed must be an int, got {type(consumed).__name__}")
        if not 0 <= int(consumed) <= self.length:
            raise ValueError(f"consumed must be in [0, length={self.length}], got {consumed}")
        return int(consumed)

    def steps(self, consumed: int = 0) -> int:
        """Steps left in the epoch from global position ``consumed``."""
        left = self.length - self.check_consumed(consumed)
        if self.drop_last:
            return left // self.step_size
        return -(-left // self.step_size)

    def has_step(self, consumed: int, epoch: int = 0) -> bool:
        """Whether ``epoch`` has a step starting at ``consumed`` (the same for
        every epoch here; a :class:`zerobatch.packing.PackedPlan`'s epochs differ)."""
        return self.steps(consumed) > 0

    def end(self, consumed: int = 0) -> int:
        """The position after the epoch's last step from ``consumed`` (positions
        from there to ``length`` are the dropped tail)."""
        if self.drop_last:
            return consumed + self.steps(consumed) * self.step_size
        return self.length

    def dropped(self, consumed: int = 0) -> int:
        """Observations the epoch skips at its tail when resumed at ``consumed``."""
        return self.length - self.end(consumed)

    def after(self, epoch: int, consumed: int) -> tuple[int, int]:
        """The (epoch, consumed) after the step starting at ``consumed``: the next
        epoch's start once this epoch has no step left."""
        consumed = min(consumed + self.step_size, self.length)
        return (epoch, consumed) if self.has_step(consumed, epoch) else (epoch + 1, 0)

    def advance(self, epoch: int, consumed: int, steps: int) -> tuple[int, int]:
        """The (epoch, consumed) ``steps`` steps after the step ``(epoch, consumed)``
        starts, across epoch ends (``steps=1`` is :meth:`after`). O(1).

        >>> Plan(10, 2, world_size=2, drop_last=False).advance(0, 0, 7)
        (2, 4)
        """
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        if type(self).after is not Plan.after:  # a subclass whose epochs differ: walk them
            if steps > _WALK_LIMIT:
                raise ValueError(f"cannot advance {type(self).__name__} by {steps} steps "
                                 f"(at most {_WALK_LIMIT}, one at a time)")
            for _ in range(int(steps)):
                epoch, consumed = self.after(epoch, consumed)
            return epoch, consumed
        left = self.steps(consumed)
        if left == 0:  # a position past the epoch's last step: the next epoch's start
            epoch, consumed, left = epoch + 1, 0, self.steps(0)
        if steps < left:
            return epoch, int(consumed) + int(steps) * self.step_size
        whole = self.steps(0)
        if whole == 0:
            raise ValueError(f"an epoch of {self.length} observations has no step of "
                             f"{self.step_size}: cannot advance")
        beyond = int(steps) - left  # steps into the epochs after this one
        return epoch + 1 + beyond // whole, (beyond % whole) * self.step_size

    def order(self, epoch: int) -> Feistel | BlockShuffle | None:
        """The permutation from positions to observations (None: the identity)."""
        if not self.shuffle or self.length == 0:
            return None
        return _order(int(self.length), int(self.seed), epoch, self.block_size)

    def positions(self, consumed: int, rank: int) -> npt.NDArray[np.int64]:
        """Rank ``rank``'s positions in the step starting at ``consumed``
        (may reach past ``length`` on a padded last step)."""
        rank = self.check_rank(rank)
        first = self.check_consumed(consumed) + rank
        return first + self.world_size * np.arange(self.batch_size, dtype=np.int64)

    def indices(
        self, epoch: int, consumed: int, rank: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Rank ``rank``'s observations in ``epoch``'s step starting at ``consumed``,
        and which of them pad the epoch's last step. O(batch_size)."""
        return self.rank_indices(epoch, consumed, rank)[0], self.padding(consumed, rank)

    def rank_indices(self, epoch: int, consumed: int, rank: int,
                     steps: int = 1) -> npt.NDArray[np.int64]:
        """Rank ``rank``'s observations in ``steps`` consecutive steps of ``epoch``
        from ``consumed``, one row a step (``steps x batch_size``), computed in
        one kernel call: a rank's positions in consecutive steps are one stride.
        O(steps * batch_size)."""
        left = self.steps(consumed)
        if not 1 <= steps <= left:
            raise ValueError(f"epoch has {left or 'no'} step(s) left at position {consumed}, "
                             f"asked for {steps} (length={self.length}, "
                             f"step_size={self.step_size})")
        first = int(consumed) + self.check_rank(rank)
        count, stride, length = steps * self.batch_size, self.world_size, int(self.length)
        order = self.order(epoch)
        if isinstance(order, Feistel):
            flat = order.strided(first, count, stride)
        else:
            offsets = np.arange(count, dtype=np.uint64)  # unsigned: first may pass 2**63 - 1
            flat = ((np.uint64(first) + np.uint64(stride) * offsets)
                    % np.uint64(length)).astype(np.int64)
            if order is not None:
                flat = order(flat)
        return flat.reshape(steps, self.batch_size)

    def padding(self, consumed: int, rank: int) -> npt.NDArray[np.bool_]:
        """Which of rank ``rank``'s rows in the step starting at ``consumed`` pad
        the epoch's last step (positions past ``length``); read-only when none can."""
        if self.drop_last:  # a step left is a whole step: nothing pads it
            return _no_padding(self.batch_size)
        first = int(consumed) + self.check_rank(rank)
        padding = np.zeros(self.batch_size, dtype=np.bool_)
        padding[max(0, -(-(int(self.length) - first) // self.world_size)):] = True
        return padding


    def iter_rank_steps(self, rank: int, epoch: int, consumed: int,
                        epochs: int | None) -> Iterator[Planned]:
        """:func:`rank_steps` of this plan (a subclass may walk its own way)."""
        return rank_steps(self, rank, epoch, consumed, epochs)

    def cursor_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        """Keys a state needs besides ``(epoch, consumed)`` to resume in O(1)
        (none here; packed rows add their window)."""
        return {}

    def restore_cursor(self, epoch: int, consumed: int, state: dict[str, Any]) -> None:
        """Take :meth:`cursor_state`'s keys back from a state (nothing here)."""


Planned = tuple[tuple[int, int], tuple[int, int], npt.NDArray[np.int64], npt.NDArray[np.bool_]]
"""A step as :func:`rank_steps` yields it: ``((epoch, consumed), (epoch, consumed)
after it, the rank's indices, its padding mask)``."""

_CHUNK = 2048
"""Positions :func:`rank_steps` computes in one call (at least one step):
Feistel's ~1 us of call overhead is then a few nanoseconds a step."""


def rank_steps(plan: Plan, rank: int, epoch: int, consumed: int,
               epochs: int | None) -> Iterator[Planned]:
    """The steps of rank ``rank`` from ``(epoch, consumed)`` to the end of
    ``epochs`` epochs (None: forever), each with the step after it and its
    indices (:meth:`Plan.indices`), computed a chunk of steps at a time."""
    rank = plan.check_rank(rank)
    if plan.steps(0) == 0:
        return
    last = None if epochs is None else epoch + epochs
    chunk, step_size = max(1, _CHUNK // plan.batch_size), plan.step_size
    whole = _no_padding(plan.batch_size)  # only an epoch's last step can pad
    while last is None or epoch < last:
        left = plan.steps(consumed)
        while left:
            rows = plan.rank_indices(epoch, consumed, rank, min(chunk, left))
            for row in rows:
                left -= 1
                if left:
                    yield (epoch, consumed), (epoch, consumed + step_size), row, whole
                else:
                    yield (epoch, consumed), (epoch + 1, 0), row, plan.padding(consumed, rank)
                consumed += step_size
        epoch, consumed = epoch + 1, 0


class Position:
    """Where a consumer stands in a plan: the step ``(epoch, consumed)`` it
    receives next. The Loader, ``zerobatch.torch`` and ``BatchClient`` share it,
    so their states resume one another.

    Args:
        plan: the plan being consumed.
        fingerprint: the source's identity (:func:`zerobatch.source.fingerprint`),
            stored in the state and checked on load.

    >>> position = Position(Plan(10, 2, world_size=2, shuffle=False))
    >>> position.received(*position.step)
    >>> position.step, position.state_dict()["consumed"]
    ((0, 4), 4)
    >>> [step for step in position.steps(epochs=1)]
    [(0, 4)]

    Not thread-safe: one consumer moves it.
    """

    def __init__(self, plan: Plan, fingerprint: str | None = None,
                 source: dict[str, Any] | None = None) -> None:
        self.plan = plan
        self._fingerprint = fingerprint
        self._source = source
        self._of: Any = None  # describes the source on first use (Position.of)
        self.epoch = 0
        self.consumed = 0

    @classmethod
    def of(cls, plan: Plan, describe: Callable[[], tuple[str | None, dict[str, Any] | None]]
           ) -> Position:
        """A Position at the start of ``plan`` whose source identity and
        description come from ``describe()`` (:func:`zerobatch.source.describe`)
        when first asked for (a state, a check, a pickle), not before the first
        batch: a mixture of 2,000 datasets hashes 2,000 manifests for them (~30 ms)."""
        position = cls(plan)
        position._of = describe
        return position

    def _describe(self) -> None:
        describe = self._of
        if describe is not None:
            self._fingerprint, self._source = describe()
            self._of = None

    @property
    def fingerprint(self) -> str | None:
        """The source's identity, stored in the state and checked on load."""
        self._describe()
        return self._fingerprint

    @fingerprint.setter
    def fingerprint(self, value: str | None) -> None:
        self._describe()
        self._fingerprint = value

    @property
    def source(self) -> dict[str, Any] | None:
        """A stateful source's description (``state_dict()``), or None."""
        self._describe()
        return self._source

    @source.setter
    def source(self, value: dict[str, Any] | None) -> None:
        self._describe()
        self._source = value

    def __getstate__(self) -> dict[str, Any]:
        """Pickles described (without ``describe`` and its source)."""
        self._describe()
        return dict(self.__dict__)

    @property
    def step(self) -> tuple[int, int]:
        """The next step, ``(epoch, consumed)``."""
        return self.epoch, self.consumed

    def received(self, epoch: int, consumed: int) -> None:
        """The consumer has the step starting at ``consumed`` of ``epoch``: move past it."""
        self.epoch, self.consumed = self.plan.after(epoch, consumed)

    def start_epoch(self, epoch: int) -> None:
        """Move to the first step of ``epoch``."""
        self.epoch, self.consumed = epoch, 0

    def steps(self, epochs: int | None) -> Iterator[tuple[int, int]]:
        """The steps ``(epoch, consumed)`` from here to the end of ``epochs``
        epochs (None: forever), fixed when called; the position itself does not move."""
        epoch, consumed = self.step
        return _steps(self.plan, epoch, consumed, None if epochs is None else epoch + epochs)

    def planned(self, epochs: int | None, rank: int) -> Iterator[Planned]:
        """:meth:`steps` with rank ``rank``'s indices (:func:`rank_steps`), each
        with the step after it, where the position moves once it is received."""
        return self.plan.iter_rank_steps(rank, self.epoch, self.consumed, epochs)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: version, seed, epoch, consumed (global positions, the same
        on every rank), length, shuffle, block_size and fingerprint, and a
        stateful source's description under ``"source"``. O(1) in the data."""
        plan = self.plan
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "seed": int(plan.seed),
            "epoch": self.epoch,
            "consumed": self.consumed,
            "length": plan.length,
            "shuffle": plan.shuffle,
            "block_size": plan.block_size,
            "fingerprint": self.fingerprint,
            **plan.cursor_state(self.epoch, self.consumed),
        }
        if self.source is not None:
            state["source"] = self.source
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after what ``state`` says was received, with this plan's
        world_size and batch_size (checked as :meth:`check`)."""
        self.epoch, self.consumed = self.check(state)

    def check(self, state: dict[str, Any]) -> tuple[int, int]:
        """The step ``(epoch, consumed)`` that follows ``state``; ValueError names
        what differs when it belongs to another source, seed, order or version."""
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state has version {state.get('version')!r}; this zerobatch "
                             f"reads version {STATE_VERSION}")
        mine = self.state_dict()
        for key in ("fingerprint", "length", "seed", "shuffle", "block_size"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"state was saved with {key}={state.get(key)!r}, this loader has "
                    f"{mine[key]!r}: it belongs to another source or order"
                )
        epoch, consumed = state.get("epoch"), state.get("consumed")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 1 << 63:
            raise ValueError(f"state has epoch={epoch!r}; expected an int in [0, 2**63)")
        if isinstance(consumed, bool) or not isinstance(consumed, int):
            raise ValueError(f"state has consumed={consumed!r}; expected an int in "
                             f"[0, {self.plan.length}]")
        try:
            self.plan.check_consumed(consumed)
        except ValueError:
            raise ValueError(f"state has consumed={consumed!r}; expected an int in "
                             f"[0, {self.plan.length}]") from None
        self.plan.restore_cursor(epoch, consumed, state)
        return (epoch, consumed) if self.plan.has_step(consumed, epoch) else (epoch + 1, 0)


def _steps(plan: Plan, epoch: int, consumed: int, last: int | None) -> Iterator[tuple[int, int]]:
    while last is None or epoch < last:
        yield epoch, consumed
        epoch, consumed = plan.after(epoch, consumed)
