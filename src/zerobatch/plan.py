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

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from zerobatch.shuffle import MAX_LENGTH, BlockShuffle, Feistel, _splitmix64

__all__ = ["Plan", "epoch_seed"]

_MASK64 = (1 << 64) - 1
_EPOCH_DOMAIN = 0x45504F4348534544  # "EPOCHSED": keeps epoch seeds apart from plain seeds


def epoch_seed(seed: int, epoch: int) -> int:
    """The 64-bit seed of ``epoch``'s order: a SplitMix64 mix of both, so
    (seed=1, epoch=0) and (seed=0, epoch=1) differ (``seed ^ epoch`` would not)."""
    return _splitmix64(_splitmix64((seed & _MASK64) ^ _EPOCH_DOMAIN) + (epoch & _MASK64))


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
        return (epoch + 1, 0) if self.steps(consumed) == 0 else (epoch, consumed)

    def order(self, epoch: int) -> Feistel | BlockShuffle | None:
        """The permutation from positions to observations (None: the identity)."""
        if not self.shuffle or self.length == 0:
            return None
        seed = epoch_seed(int(self.seed), epoch)
        if self.block_size is None:
            return Feistel(self.length, seed)
        return BlockShuffle(self.length, self.block_size, seed)

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
        if self.steps(consumed) == 0:
            raise ValueError(f"epoch has no step left at position {consumed} "
                             f"(length={self.length}, step_size={self.step_size})")
        positions = self.positions(consumed, rank)
        padding = positions >= self.length
        if padding.any():
            positions = positions % self.length
        order = self.order(epoch)
        indices = positions if order is None else order(positions)
        return np.asarray(indices, dtype=np.int64), padding
