"""The order of a weighted mixture: which source, and which of its observations,
sits at each position. A pure function of (seed, names, lengths, stages); no I/O,
no table, no state.

**Stages.** The positions ``0, 1, 2, ...`` are split into stages; stage ``t``
starts at position ``start_t`` (the first at 0) and has its own weights and
``block_size`` ``B``. A stage's positions are cut into blocks of ``B``
consecutive positions counted from its start, so every stage start is a
block boundary; the last block before the next stage may be cut short.

**Counts in a block.** With ``p_s = w_s / sum(w)`` source ``s``'s quota in a
block is ``B * p_s``. It gets ``floor(B * p_s)`` slots, plus one of the
``R = B - sum(floor(B * p_s))`` leftover slots in some blocks: exactly the two
counts largest remainder can give (quota rounded down or up), and every block
holds exactly ``B``. Which sources get the leftovers rotates from block to
block, so that each source's long-run share is its weight, not its rounded
quota (with 2,000 sources in blocks of 1,024 a fixed rounding would read half
of them twice as often as asked, forever). The rotation: lay the remainders
``r_s = B * p_s - floor(B * p_s)`` end to end on ``[0, R)``, scale by ``K =
2**30`` and round the boundaries up (``bounds``); block ``k`` gives a leftover
to each source whose ``[bounds[s], bounds[s + 1])`` holds an ``x`` with ``x mod
K == (k * g + h) mod K``, ``g`` odd near ``K / phi`` and ``h`` from the seed.
Each residue lies in exactly ``R`` of the ranges, a range holds each residue
at most once (``r_s < 1``), and over ``K`` blocks source ``s`` gets exactly
``bounds[s + 1] - bounds[s]`` leftovers: its share is exact to ``1 / (K * B)``,
and the slots it has after ``k`` blocks (a floor sum, O(log K)) are within a
few of ``k * B * p_s`` at every block boundary. Weights are floats, used
exactly (integer arithmetic on their binary fractions, no rounding).

**Inside a block.** A keyed, stratified permutation places the block's
slots: source ``s``'s ``k``-th slot of the block gets the key ``(k + u) /
c_s`` with ``u`` uniform in [0, 1) from (seed, stage, block, slot), and the
block's positions take the slots in key order. Every run of consecutive
positions, not only the whole block, then holds each source within a few rows
of its share: each source's keys are evenly spaced, so a run's count of them
is off by at most 2 plus that source's share of the other sources' rounding
(measured: at most 1.5 rows in batches of 512 over 100 sources; a uniform
permutation, off by about the square root of the count, gave 16 over 20), while
the layout still differs randomly from block to block and no source lines up
with a rank's stride. A position's *ordinal* counts the earlier positions of
its block that went to the same source.

**Each source's own order.** Source ``s``'s ``j``-th slot, counted over all
stages and blocks in position order, reads observation ``j`` of its own
order: pass ``j // n_s``, permuted by ``Feistel(n_s, seed(seed, name, pass))``
at ``j % n_s``. So within a pass every observation of a source comes exactly
once, in that pass's permuted order, whatever the weights do; a stage change
at any position keeps each source where it stopped.

Cost: a position's (source, slot) is O(sources) for the first position of
its block (the block's counts and the slots before it) and O(1) after
(blocks are cached); nothing is proportional to the position or the lengths.

>>> order = MixtureOrder(["a", "b"], [10, 10], [Stage(0, {"a": 1.0, "b": 3.0}, 4)])
>>> sorted(order.block_counts(0, 0).tolist())
[1, 3]
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from zerobatch.mixture import _kernels as k
from zerobatch.plan import epoch_seed
from zerobatch.shuffle import DEFAULT_ROUNDS, MAX_LENGTH, Feistel, _splitmix64

__all__ = ["DEFAULT_BLOCK_SIZE", "MAX_BLOCK_SIZE", "MixtureOrder", "Stage", "pass_order",
           "source_key", "source_keys"]

DEFAULT_BLOCK_SIZE = 1024
"""Positions per block. A block is the span over which every source's count is
exact (quota rounded down or up), so a global step of 512 to a few thousand
observations sees each source within one of its share; larger blocks cost
more per first read of a block (a Feistel walk over the block, ~10 us at 1,024)."""

MAX_BLOCK_SIZE = 1 << 24
"""The largest block (the kernels' int64 arithmetic stays below 2**63 up to it)."""

_MASK64 = (1 << 64) - 1
_SOURCE_DOMAIN = 0x4D49585352434B59  # "MIXSRCKY"
_STAGE_DOMAIN = 0x4D49585354414745  # "MIXSTAGE"


@dataclass(frozen=True)
class Stage:
    """Weights in force from global position ``start`` (observations) on, laid
    out in blocks of ``block_size`` positions counted from ``start``."""

    start: int
    weights: Mapping[str, float]
    block_size: int = DEFAULT_BLOCK_SIZE


def source_key(seed: int, name: str) -> int:
    """The 64-bit key of source ``name``'s orders: the mixture seed mixed with a
    BLAKE2b hash of the name (stable across processes and machines)."""
    return int(source_keys(seed, [name])[0])


def source_keys(seed: int, names: Sequence[str]) -> npt.NDArray[np.uint64]:
    """:func:`source_key` of each of ``names`` at once (~1 us a name: the hash;
    the mixing is vectorized)."""
    digests = np.frombuffer(b"".join(
        hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest() for name in names),
        dtype="<u8").astype(np.uint64)
    return _splitmix64_array(np.uint64(_splitmix64((seed & _MASK64) ^ _SOURCE_DOMAIN))
                             ^ digests)


def _splitmix64_array(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``shuffle._splitmix64`` of each value (uint64 arithmetic wraps mod 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_POWERS = np.int64(1) << np.arange(63, dtype=np.int64)  # 2**0 .. 2**62


def _halves(lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per source of ``lengths`` observations, the bits of half of its Feistel
    domain: ``(max(2, (n - 1).bit_length()) + 1) // 2`` (``bit_length`` exact:
    the powers of two at most ``n - 1``)."""
    bits = np.searchsorted(_POWERS, lengths - 1, side="right")
    return ((np.maximum(2, bits) + 1) // 2).astype(np.int64)


@functools.lru_cache(maxsize=4096)  # one per (source, pass) in use: a step touches each once
def pass_order(length: int, key: int, number: int) -> Feistel:
    """Pass ``number``'s permutation of a source of ``length`` observations
    whose key is ``key`` (:func:`source_key`)."""
    return Feistel(length, epoch_seed(key, number))


class Block(NamedTuple):
    """A block's layout: per position its source and ordinal (``layout[0]``
    and ``layout[1]``, one array for the kernels), per source the slots it had
    before the block (counted over the whole mixture), and for each source
    with slots in it the pass of its first one and the Feistel round keys of
    that pass and the next (``_kernels.block_keys``: a row's observation then
    costs its Feistel walk, not the derivation of its keys)."""

    layout: npt.NDArray[np.int64]
    before: npt.NDArray[np.int64]
    passes: npt.NDArray[np.int64]
    keys: npt.NDArray[np.uint64]

    @property
    def sources(self) -> npt.NDArray[np.int64]:
        """Each position's source."""
        return self.layout[0]

    @property
    def ordinals(self) -> npt.NDArray[np.int64]:
        """Each position's ordinal: the earlier positions of the block that
        went to the same source."""
        return self.layout[1]


@dataclass(frozen=True)
class _StageOrder:
    """One stage's arithmetic over the mixture's ``S`` sources."""

    start: int
    block_size: int
    floors: npt.NDArray[np.int64]  # floor(B * p_s)
    bounds: npt.NDArray[np.int64]  # S + 1 leftover boundaries on [0, K * R]
    offset: int  # h: the stage's rotation offset
    key: int  # seeds the block permutations
    base: npt.NDArray[np.int64]  # slots each source had before the stage
    sources: npt.NDArray[np.int64]  # MixtureOrder.table(): each source's length and key
    _blocks: dict[int, Block] = field(default_factory=dict, compare=False, repr=False)

    def counts(self, block: int) -> npt.NDArray[np.int64]:
        """Each source's slots in block ``block`` of the stage."""
        out = np.empty(self.floors.shape[0], dtype=np.int64)
        k.block_counts(block, self.floors, self.bounds, self.offset, out)
        return out

    def before(self, block: int) -> npt.NDArray[np.int64]:
        """Each source's slots before block ``block``, counted over the mixture."""
        out = np.empty(self.floors.shape[0], dtype=np.int64)
        k.extras_before(block, self.bounds, self.offset, out)
        out += self.base + block * self.floors
        return out

    def block(self, block: int) -> Block:
        """The layout of block ``block`` (cached: a step reads one or two)."""
        found = self._blocks.get(block)
        if found is not None:
            return found
        layout = np.empty((2, self.block_size), dtype=np.int64)
        counts = self.counts(block)
        k.block_layout(counts, np.uint64(epoch_seed(self.key, block)), layout[0], layout[1])
        previous = self._blocks.get(block - 1)  # a step's next block: add its counts
        before = (self.before(block) if previous is None
                  else previous.before + self.counts(block - 1))
        sources = counts.shape[0]
        passes = np.empty((sources, 2), dtype=np.int64)  # read only where counts > 0
        keys = np.empty((sources, k.KEYED_PASSES, DEFAULT_ROUNDS), dtype=np.uint64)
        k.block_keys(before, counts, self.sources, passes, keys)
        found = Block(layout, before, passes, keys)
        if len(self._blocks) >= 8:  # a few recent blocks; dict ops are atomic under the GIL
            for old in list(self._blocks)[:-4]:  # the oldest (dicts keep insertion order)
                self._blocks.pop(old, None)
        self._blocks[block] = found
        return found

    def slots_in(self, stop: int) -> npt.NDArray[np.int64]:
        """Each source's slots at the stage's positions ``[start, start + stop)``."""
        block, rest = divmod(stop, self.block_size)
        out = self.before(block) - self.base
        if rest:
            out += np.bincount(self.block(block).sources[:rest],
                               minlength=self.floors.shape[0])
        return out


def _quota(weights: Sequence[float], block_size: int) -> tuple[list[int], list[int]]:
    """(floors, bounds) of a stage: exact integer arithmetic on the weights'
    binary fractions (see the module docstring)."""
    ratios = [float(w).as_integer_ratio() for w in weights]
    denominator = max(d for _, d in ratios)  # powers of two: the largest is a common one
    scaled = [n * (denominator // d) for n, d in ratios]
    total = sum(scaled)
    floors, bounds, cumulative = [], [0], 0
    for w in scaled:
        whole, remainder = divmod(block_size * w, total)
        floors.append(whole)
        cumulative += remainder
        bounds.append(-((-k.PERIOD * cumulative) // total))  # ceil(K * U_s)
    return floors, bounds


def check_weights(weights: Mapping[str, float], argument: str = "weights") -> dict[str, float]:
    """``weights`` as a dict of finite floats >= 0 with at least one > 0;
    ValueError naming ``argument`` and the offending names otherwise."""
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"{argument} must be a non-empty mapping of source names to "
                         f"weights, got {weights!r:.200}")
    out: dict[str, float] = {}
    bad: list[str] = []
    for name, value in weights.items():
        if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                               np.floating))
                or not math.isfinite(float(value)) or float(value) < 0):
            bad.append(f"{name!r}: {value!r}")
        else:
            out[str(name)] = float(value)
    if bad:
        raise ValueError(f"{argument}: every weight must be a finite number > 0; got "
                         f"{', '.join(bad)}")
    zero = [repr(n) for n, v in out.items() if v == 0]
    if zero:
        raise ValueError(f"{argument}: weights must be > 0 (leave a source out to give it "
                         f"no share); got 0 for {', '.join(zero)}")
    return out


class MixtureOrder:
    """The pure order of a mixture (module docstring): immutable, thread-safe.

    Args:
        names: every source the order knows, in index order (the ``source`` ids).
        lengths: observations per source (>= 1), in the same order.
        stages: ``Stage`` objects, the first starting at 0, starts increasing;
            weights name a subset of ``names`` (a name left out gets no slot).
        seed: any int; seeds block layouts and every source's passes.
    """

    def __init__(self, names: Sequence[str], lengths: Sequence[int], stages: Sequence[Stage],
                 *, seed: int = 0) -> None:
        if len(names) != len(lengths) or len(set(names)) != len(names):
            raise ValueError("names must be distinct and as many as lengths")
        self.names = tuple(names)
        self.lengths = np.array([int(n) for n in lengths], dtype=np.int64)
        if len(self.lengths) and int(self.lengths.min()) < 1:
            raise ValueError("every source needs at least one observation")
        self.seed = int(seed)
        self.stages = tuple(stages)
        if not self.stages or self.stages[0].start != 0:
            raise ValueError("the first stage must start at position 0")
        index = {name: i for i, name in enumerate(self.names)}
        self._keys = source_keys(self.seed, self.names)
        self.keys = self._keys.tolist()
        self._halves = _halves(self.lengths)
        self._stages: list[_StageOrder] = []
        base = np.zeros(len(self.names), dtype=np.int64)
        described = self.table()
        for t, stage in enumerate(self.stages):
            if not 1 <= stage.block_size <= MAX_BLOCK_SIZE:
                raise ValueError(f"stage {t}: block_size must be in [1, {MAX_BLOCK_SIZE}], "
                                 f"got {stage.block_size}")
            if t and stage.start <= self.stages[t - 1].start:
                raise ValueError(f"stage starts must increase: stage {t} starts at "
                                 f"{stage.start}, after {self.stages[t - 1].start}")
            missing = [n for n in stage.weights if n not in index]
            if missing:
                raise ValueError(f"stage {t} weighs unknown sources {missing}; the sources "
                                 f"are {list(self.names)}")
            weights = np.zeros(len(self.names))
            for name, w in stage.weights.items():
                weights[index[name]] = w
            floors, bounds = _quota(weights.tolist(), stage.block_size)
            key = _splitmix64(_splitmix64((self.seed & _MASK64) ^ _STAGE_DOMAIN)
                              + stage.start)
            if t:
                previous = self._stages[-1]
                base = previous.base + previous.slots_in(stage.start - previous.start)
            self._stages.append(_StageOrder(
                stage.start, stage.block_size, np.array(floors, dtype=np.int64),
                np.array(bounds, dtype=np.int64), key % k.PERIOD, key, base, described))
        self._starts = np.array([s.start for s in self.stages], dtype=np.int64)
        self._step: tuple[Any, ...] | None = None  # step_blocks' last answer

    def _stage(self, position: int) -> tuple[_StageOrder, int]:
        t = int(np.searchsorted(self._starts, position, side="right")) - 1
        return self._stages[t], t

    def block_counts(self, stage: int, block: int) -> npt.NDArray[np.int64]:
        """Each source's slots in block ``block`` of stage ``stage`` (a full block)."""
        return self._stages[stage].counts(block)

    def locate(self, positions: npt.ArrayLike) -> tuple[npt.NDArray[np.int64],
                                                        npt.NDArray[np.int64]]:
        """``(source, slot)`` of each position (``0 <= position < 2**63``):
        the source's index and how many slots it had before this one."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos.size and int(pos.min()) < 0:
            raise IndexError(f"position {int(pos.min())} is negative")
        sources = np.empty(pos.shape[0], dtype=np.int64)
        slots = np.empty(pos.shape[0], dtype=np.int64)
        if pos.size == 0:
            return sources, slots
        if len(self._stages) == 1:
            self._locate(self._stages[0], pos, sources, slots, None)
        else:
            which = np.searchsorted(self._starts, pos, side="right") - 1
            for t in np.unique(which).tolist():
                self._locate(self._stages[t], pos, sources, slots, which == t)
        return sources, slots

    @staticmethod
    def _locate(stage: _StageOrder, pos: npt.NDArray[np.int64], sources: npt.NDArray[np.int64],
                slots: npt.NDArray[np.int64], mask: npt.NDArray[np.bool_] | None) -> None:
        size = stage.block_size
        mine = pos if mask is None else pos[mask]
        blocks, inside = np.divmod(mine - stage.start, size)
        first = int(blocks[0])
        if bool((blocks == first).all()):
            groups: list[tuple[int, npt.NDArray[np.bool_] | None]] = [(first, None)]
        else:
            groups = [(b, blocks == b) for b in np.unique(blocks).tolist()]
        for b, where in groups:
            layout = stage.block(b)
            at = inside if where is None else inside[where]
            src = layout.sources[at]
            slot = layout.before[src] + layout.ordinals[at]
            if mask is None and where is None:
                sources[:], slots[:] = src, slot
            elif mask is None:
                sources[where], slots[where] = src, slot
            else:
                target = np.flatnonzero(mask)
                if where is not None:
                    target = target[where]
                sources[target], slots[target] = src, slot

    def observations(self, positions: npt.ArrayLike) -> tuple[npt.NDArray[np.int64],
                                                              npt.NDArray[np.int64],
                                                              npt.NDArray[np.int64]]:
        """``(source, pass, index)`` of each position: the observation of source
        ``source`` it reads, and in which pass over that source."""
        sources, slots = self.locate(positions)
        lengths = self.lengths[sources]
        passes, local = np.divmod(slots, lengths)
        index = np.empty_like(local)
        if sources.size == 0:
            return sources, passes, index
        keyed = np.stack([sources, passes])
        unique = np.unique(keyed, axis=1)
        for s, p in unique.T.tolist():
            where = (sources == s) & (passes == p) if unique.shape[1] > 1 else slice(None)
            index[where] = pass_order(int(self.lengths[s]), self.keys[s], p)(local[where])
        return sources, passes, index

    def table(self, limits: npt.ArrayLike | None = None) -> npt.NDArray[np.int64]:
        """The per-source table :meth:`observe` takes (``[sources, 4]`` int64:
        length, Feistel half width, key bits, pass limit; ``limits``: passes
        each source may start, None for no limit)."""
        table = np.empty((len(self.names), 4), dtype=np.int64)
        table[:, k.LENGTH] = self.lengths
        table[:, k.HALF] = self._halves
        table[:, k.KEY] = self._keys.view(np.int64)
        table[:, k.LIMIT] = np.iinfo(np.int64).max if limits is None else limits
        return table

    def observe(self, positions: npt.NDArray[np.int64], table: npt.NDArray[np.int64],
                stop: int = MAX_LENGTH - 1) -> tuple[npt.NDArray[np.int64],
                                                     npt.NDArray[np.int64], int]:
        """``(source, index)`` of each position (C-contiguous int64, ``0 <=
        position < stop``: IndexError otherwise) as :meth:`observations` gives
        them, and the first row whose pass is past its limit in ``table``
        (:meth:`table`; or -1: the indices are then complete). One kernel call
        when the positions lie in two consecutive blocks of one stage (a
        step's), else :meth:`locate` and one more."""
        count = positions.shape[0]
        out = np.empty((2, count), dtype=np.int64)
        sources, index = out[0], out[1]
        if count:
            over = self._observe_blocks(positions, table, stop, out)
            if over is not None:
                return sources, index, over
        if count and (int(positions.min()) < 0 or int(positions.max()) >= stop):
            bad = int(positions.min()) if int(positions.min()) < 0 else int(positions.max())
            raise IndexError(f"position {bad} is out of range for a mixture of {stop} "
                             "observations")
        sources, slots = self.locate(positions)
        over = k.pass_indices(sources, slots, table, index)
        return sources, index, over

    def step_blocks(self, positions: npt.NDArray[np.int64], stop: int) -> tuple[Any, ...] | None:
        """The arguments ``_kernels.observe_rows`` takes before ``table`` when
        the first and last of ``positions`` (non-empty) lie in one block or two
        consecutive ones of one stage below ``stop`` (a step's), else None
        (``end`` bounds the blocks laid out, so any other position is outside):
        ``(positions, start, end, block_size, block, layout, passes, keys``
        of the block ``, layout, passes, keys`` of the next). The last answer
        is kept with the ranges of first and last positions it holds for: a
        block holds ~16 steps of 64, which then cost four compares."""
        first, last = int(positions[0]), int(positions[-1])
        kept = self._step  # (one tuple: another thread may replace it)
        if (kept is not None and kept[0] == stop and kept[1] <= first < kept[2]
                and kept[3] <= last < kept[4]):
            return (positions, *kept[5])
        if first < 0:
            return None
        if len(self._stages) == 1:
            stage, end = self._stages[0], stop
        else:
            t = int(np.searchsorted(self._starts, first, side="right")) - 1
            stage = self._stages[t]
            end = min(self._stages[t + 1].start if t + 1 < len(self._stages) else stop, stop)
        if not stage.start <= last < end:
            return None
        block = (first - stage.start) // stage.block_size
        ahead = (last - stage.start) // stage.block_size - block
        if ahead not in (0, 1):
            return None
        this = stage.block(block)
        after = stage.block(block + 1) if ahead else this
        # The kernels read only the blocks laid out here: a position past them
        # (positions need not ascend) is outside, and goes the general way.
        begin = stage.start + block * stage.block_size
        end = min(end, begin + (1 + ahead) * stage.block_size)
        tail = (stage.start, end, stage.block_size, block, this.layout, this.passes, this.keys,
                after.layout, after.passes, after.keys)
        self._step = (stop, begin, min(begin + stage.block_size, end),
                      begin + ahead * stage.block_size, end, tail)
        return (positions, *tail)

    def block_run(self, first: int, stride: int, stop: int) -> npt.NDArray[np.int64] | None:
        """The positions of ``first``'s block (of its stage, below ``stop``)
        that are ``first`` modulo ``stride``, ascending: the ones a rank's steps
        read there (``Plan``: a rank's positions are ``world_size`` apart), or
        None when ``first`` is not in ``[0, stop)``."""
        if not 0 <= first < stop or stride < 1:
            return None
        stage, t = self._stage(first)
        end = self._stages[t + 1].start if t + 1 < len(self._stages) else stop
        begin = stage.start + (first - stage.start) // stage.block_size * stage.block_size
        end = min(end, stop, begin + stage.block_size)
        return np.arange(begin + (first - begin) % stride, end, stride, dtype=np.int64)

    def _observe_blocks(self, positions: npt.NDArray[np.int64], table: npt.NDArray[np.int64],
                        stop: int, out: npt.NDArray[np.int64]) -> int | None:
        """:meth:`observe` by ``_kernels.observe_rows`` when the positions are
        a step's (:meth:`step_blocks`; None when they are not, or a position
        lies elsewhere)."""
        args = self.step_blocks(positions, stop)
        if args is None:
            return None
        outside, over = k.observe_rows(*args, table, out)
        return None if outside >= 0 else over

    def slots_before(self, position: int) -> npt.NDArray[np.int64]:
        """Each source's slots at positions ``[0, position)``. O(sources + block)."""
        if not 0 <= position <= MAX_LENGTH:
            raise ValueError(f"position must be in [0, 2**63], got {position}")
        stage, _ = self._stage(position)
        return stage.base + stage.slots_in(position - stage.start)

    def position_of(self, source: int, slot: int) -> int | None:
        """The position of source ``source``'s slot ``slot`` (0-based), or None
        when it never gets that many (its weight is 0 from some stage on)."""
        for t, stage in enumerate(self._stages):
            end = self._stages[t + 1].start if t + 1 < len(self._stages) else None
            have = int(stage.base[source])
            if end is not None:
                after = int(self._stages[t + 1].base[source])
                if slot >= after:
                    continue
            wanted = slot - have
            if wanted < 0:
                return None
            floor = int(stage.floors[source])
            extras = int(stage.bounds[source + 1] - stage.bounds[source])
            if floor == 0 and extras == 0:
                if end is None:
                    return None
                continue
            low, high = 0, (wanted // (floor * k.PERIOD + extras) + 2) * k.PERIOD
            # smallest block whose end passes slot: before(b + 1) > slot
            while low < high:
                mid = (low + high) // 2
                if int(stage.before(mid + 1)[source]) > slot:
                    high = mid
                else:
                    low = mid + 1
            layout = stage.block(low)
            ordinal = slot - int(layout.before[source])
            at = np.flatnonzero((layout.sources == source) & (layout.ordinals == ordinal))
            return stage.start + low * stage.block_size + int(at[0])
        return None
