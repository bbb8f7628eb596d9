"""``Mixture``: named sources read by weight in one exact order; itself a source.

``Mixture(sources, weights, *, seed=0, length=..., ...)`` is a random-access
source (``len``, ``read(indices)``) whose observation at position ``p`` is the
observation :class:`~zerobatch.mixture.order.MixtureOrder` places there: which
source, and which of its observations, in closed form (no index, no build
step, no replay). ``Loader(Mixture(...), batch_size)`` reads it with ranks,
elastic resume, ``zerobatch.torch``, ``BatchServer`` and ``output="jax"``; every
row carries a ``source`` column (int32, the index into :attr:`Mixture.names`).

**Epochs and passes.** A mixture is one epoch of ``length`` observations: the
Loader reads it in position order (it is its own shuffle, so the plan does not
permute it) and a Loader epoch is the whole mixture. A source's own epochs are
its *passes*: when source ``s`` has used all ``n_s`` observations it starts
pass ``1`` with a fresh permutation, and so on. ``max_passes`` bounds that: the
mixture ends where any bounded source would begin a pass past its limit. The
mixture's length is ``length``, or that stop rule, or the smaller of both;
one of them is required (a mixture never loops silently forever). A Loader
epoch past the first reads the same sequence again: to train longer, make
``length`` longer (and resume; see below).

**Weight schedules.** ``weights`` is a mapping of names to floats (> 0), or
stages ``[(start, {name: weight}), ...]`` (starts in observations, the first
0): annealing and curricula as data. A name left out of a stage gets no share
in it and continues where it stopped when it comes back.

**State.** The mixture's description (seed, sources with their lengths and
fingerprints, stages, length) is JSON-able (:meth:`Mixture.state_dict`); the
Loader stores it in its one ``Position`` state under ``"source"``, next to the
global position and the mixture's fingerprint. Resuming with
``loader.load_state_dict(state)``:

- a mixture with the same weights continues exactly;
- a mixture with other weights, other sources or another length raises
  ``ValueError`` naming what changed, unless ``allow=`` names it
  (``{"weights", "sources", "length"}``): then a new stage starts at the
  resumed position and every source continues its own order where it
  stopped, so no observation of any source is repeated or skipped within its
  pass. Removed sources keep their place (and their count) in the state;
- the seed, or a continuing source's data (its length or fingerprint), can
  never change: the state belongs to another mixture.

This is the source-state protocol of :mod:`zerobatch.source`
(``state_dict`` / ``resumed``); the mixture itself never changes
(:meth:`Mixture.resumed` returns a new one).

**Packing.** Packed rows mix as ``packed.mixable()``
(``zerobatch.packing.MixableRows``: one packing, rows ``0..len-1``; each pass
permutes the rows, so each pass takes every document exactly once); a
``PackedRows`` itself follows its own plan and is refused with that hint.
Packing over a mixture of documents packs one ``Documents`` source.

>>> from zerobatch import Batch
>>> class Numbers:
...     def __init__(self, n, base): self.n, self.base = n, base
...     def __len__(self): return self.n
...     def read(self, indices): return Batch.from_columns({"x": self.base + indices})
>>> mix = Mixture({"a": Numbers(4, 0), "b": Numbers(4, 100)}, {"a": 1.0, "b": 1.0},
...               length=8, block_size=4)
>>> sorted(mix.read(np.arange(8))["x"].tolist())
[0, 1, 2, 3, 100, 101, 102, 103]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.columnar import Batch, BatchMeta, Jagged
from zerobatch.columnar.batch import columns_to_torch
from zerobatch.columnar.schema import normalize_column
from zerobatch.mixture import _kernels as mk
from zerobatch.mixture import spec
from zerobatch.mixture.order import (
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    MixtureOrder,
    Stage,
    check_weights,
)
from zerobatch.shuffle import MAX_LENGTH
from zerobatch.source import fingerprint, read_indices
from zerobatch.storage.local import reserve_descriptors_soon
from zerobatch.stream.many import ManyWindows
from zerobatch.varlen import Columns, row_columns

__all__ = ["CHANGES", "STATE_VERSION", "Mixture"]

STATE_VERSION = 1
"""The version of :meth:`Mixture.state_dict`'s layout."""

CHANGES = ("weights", "sources", "length")
"""What ``allow=`` may name: a change of weights (or block sizes), of the set of
sources read, of the length (or ``max_passes``)."""

SOURCE_COLUMN = "source"
_SOURCE_SCHEMA = normalize_column(SOURCE_COLUMN, np.empty(0, np.int32))[1]
_NO_LIMIT = np.iinfo(np.int64).max  # the pass limit of a source without max_passes
_OBSERVE_READ = (mk.observe_read_rows, mk.observe_read_rows_segments)  # ManyWindows.read's
_GATHER_READ = (mk.gather_read_rows, mk.gather_read_rows_segments)  # (from a block's run)
_RUN_FROM = 16  # positions of a read worth observing its block's run (a step's; see _step_run)
_RUN_STEPS = 8  # steps a block's run must hold to be observed (fewer: each step observes itself)
_RUNS_KEPT = 2  # runs kept: reader threads a block ahead, and the caller's in the one before


def _int(name: str, value: object, low: int = 1, high: int = MAX_LENGTH) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if not low <= int(value) <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


def _stages(weights: Any, block_size: int) -> list[Stage]:
    """``weights`` (a mapping, or ``[(start, mapping), ...]``) as stages."""
    if isinstance(weights, Mapping):
        return [Stage(0, check_weights(weights), block_size)]
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or not weights:
        raise ValueError("weights must map source names to floats, or be a list of stages "
                         f"[(start, {{name: weight}}), ...]; got {weights!r:.200}")
    stages: list[Stage] = []
    for t, item in enumerate(weights):
        if not isinstance(item, Sequence) or isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError(f"weights[{t}] must be a (start, {{name: weight}}) pair, "
                             f"got {item!r:.200}")
        start = _int(f"weights[{t}]'s start", item[0], low=0)
        if t == 0 and start != 0:
            raise ValueError(f"weights[0] must start at 0 (the first position), got {start}")
        if t and start <= stages[-1].start:
            raise ValueError(f"weights[{t}] starts at {start}, not after weights[{t - 1}] "
                             f"({stages[-1].start}): stage starts must increase")
        stages.append(Stage(start, check_weights(item[1], f"weights[{t}]"), block_size))
    return stages


class Mixture:
    """Sources read by weight in one exact order (see the module docstring).

    Args:
        sources: name -> source (``len`` and ``read``); all must give the same
            columns (windows of one ``seq_len``, or documents, not both).
        weights: name -> weight (finite, > 0; any scale), or stages
            ``[(start, {name: weight}), ...]`` with starts in observations.
            Every named source must be in ``sources``; a source left out of
            every stage is never read.
        seed: any int; seeds the block layouts and every source's passes
            (source ``name``'s pass ``k`` is permuted by (seed, name, k)).
        length: observations in the mixture (one Loader epoch).
        max_passes: passes a source may start (an int for all, or name ->
            int); the mixture ends where a bounded source would start one more.
        block_size: positions per block (default 1,024; see
            :data:`~zerobatch.mixture.order.DEFAULT_BLOCK_SIZE`).

    Immutable and thread-safe (its sources must be). ``read`` finds every
    row's source and observation in one kernel call; windows of local
    token-stream datasets of one layout are then read in one more
    (:class:`~zerobatch.stream.many.ManyWindows`), other sources with one
    ``read`` per source present in the indices.
    """

    ordered = True
    """The plan reads a mixture in position order (it is its own shuffle)."""

    def __init__(self, sources: Mapping[str, Any], weights: Any, *, seed: int = 0,
                 length: int | None = None, max_passes: int | Mapping[str, int] | None = None,
                 block_size: int | None = None) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError(f"sources must be a non-empty mapping of names to sources, "
                             f"got {type(sources).__name__}")
        lengths: dict[str, int] = {}
        local = 0  # sources of local files (their first batch opens ~one file each)
        for name, source in sources.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"sources: names must be non-empty strs, got {name!r}")
            if not callable(getattr(source, "read", None)) or not hasattr(source, "__len__"):
                raise ValueError(f"sources[{name!r}] must have __len__ and read(indices) -> "
                                 f"Batch; got {type(source).__name__}")
            if callable(getattr(source, "bind_plan", None)):
                hint = ("pass its .mixable() (one packing, rows 0..len-1)"
                        if callable(getattr(source, "mixable", None)) else
                        "mix windows or documents")
                raise ValueError(
                    f"sources[{name!r}] is {type(source).__name__}, read through its own plan "
                    f"(row ids are not 0..len-1): {hint}")
            lengths[name] = observations = len(source)  # (not `length`: the argument)
            if observations < 1:
                raise ValueError(f"sources[{name!r}] has no observations")
            local += getattr(source, "reads_wait", True) is False
        # the descriptor table grown for their files while the mixture is built
        reserve_descriptors_soon(local)
        size = (DEFAULT_BLOCK_SIZE if block_size is None
                else _int("block_size", block_size, high=MAX_BLOCK_SIZE))
        stages = _stages(weights, size)
        missing = sorted({n for s in stages for n in s.weights} - set(sources))
        if missing:
            raise ValueError(f"weights name sources that are not in sources: {missing}; "
                             f"sources are {sorted(sources)}")
        _check_columns(sources)
        # fingerprints are taken on first use (_described): hashing each source's
        # manifest costs ~14 us a dataset, which the first batch does not need
        records = {name: {"length": n, "fingerprint": None} for name, n in lengths.items()}
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self._build(dict(sources), records, stages, int(seed), length, max_passes,
                    pending=tuple(sources))

    def _build(self, sources: dict[str, Any], records: dict[str, dict[str, Any]],
               stages: list[Stage], seed: int, length: int | None,
               max_passes: int | Mapping[str, int] | None, pending: tuple[str, ...] = ()
               ) -> None:
        """Set every attribute from the description (also for :meth:`resumed`);
        ``pending`` names the sources whose fingerprint is not in ``records``
        yet (taken by :meth:`_described`)."""
        self._sources = sources
        self._records = records
        self._pending = pending
        self._seed = seed
        names = list(records)
        self._order = MixtureOrder(names, [r["length"] for r in records.values()], stages,
                                   seed=seed)
        self._max_passes = _max_passes(max_passes, names)
        self._requested_length = None if length is None else _int("length", length)
        stop = self._stop()
        if self._requested_length is None and stop is None:
            raise ValueError("length: give length= (observations) or max_passes= (a stop "
                             "rule); a mixture never loops forever")
        self._length = min(x for x in (self._requested_length, stop) if x is not None)
        self._objects = [sources.get(name) for name in names]
        kinds = {getattr(type(s), "collate", None) for s in sources.values()}
        self._collate: Callable[..., Any] | None = (
            next(iter(sources.values())).collate if len(kinds) == 1 and None not in kinds
            else None)  # once: the Loader looks it up every step
        self._table = self._order.table([self._max_passes.get(name, _NO_LIMIT)
                                         for name in names])
        self._group: ManyWindows | None = None  # see _windows
        self._runs: tuple[tuple[Any, ...], ...] = ()  # blocks' runs, newest first (_block_run)
        self._run_lock = _forksafe.lock()
        self._group_known = False
        self._checked: set[int] = set()  # sources whose columns matched the reference's
        self._reference: tuple[str, Batch] | None = None  # the first batch read: name, batch
        seq_lens = {getattr(s, "seq_len", None) for s in sources.values()}
        self._seq_len = seq_lens.pop() if len(seq_lens) == 1 else None
        self._fingerprint: str | None = None  # on first use, from the fingerprints

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its kept runs and their lock (a child observes its own)."""
        state = dict(self.__dict__)
        del state["_run_lock"]
        state["_runs"] = ()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._run_lock = _forksafe.lock()

    def _described(self) -> dict[str, dict[str, Any]]:
        """Every source's record (name -> length and fingerprint), the pending
        fingerprints taken now. Thread-safe: a race takes one twice, the same."""
        if self._pending:
            for name in self._pending:
                self._records[name]["fingerprint"] = fingerprint(self._sources[name])
            self._pending = ()
        return self._records

    def _stop(self) -> int | None:
        """The first position where a source bounded by max_passes would start a
        pass past its limit (None: no source is bounded, or none gets there)."""
        stops = []
        for name, limit in self._max_passes.items():
            s = self._order.names.index(name)
            at = self._order.position_of(s, limit * int(self._order.lengths[s]))
            if at is not None:
                stops.append(at)
        return min(stops) if stops else None

    @classmethod
    def from_megatron(cls, data_path: str | Sequence[str], *, seq_len: int | None = None,
                      storage_options: Mapping[str, Any] | None = None,
                      **options: Any) -> Mixture:
        """A mixture from a Megatron ``--data-path`` such as ``["0.3", "/data/web",
        "0.7", "/data/code"]``: Megatron ``.bin``/``.idx`` prefixes or zerobatch
        datasets, as windows of ``seq_len`` tokens (documents when None); see
        :func:`zerobatch.mixture.spec.megatron_sources`."""
        sources, weights = spec.megatron_sources(data_path, seq_len=seq_len,
                                                 storage_options=storage_options)
        return cls(sources, weights, **options)

    @classmethod
    def from_file(cls, path: Any, *, seq_len: int | None = None,
                  storage_options: Mapping[str, Any] | None = None, **options: Any) -> Mixture:
        """A mixture from a JSON or YAML file of ``{name: {path, weight}}`` (see
        :mod:`zerobatch.mixture.spec`)."""
        sources, weights, options = spec.file_sources(path, seq_len=seq_len,
                                                      storage_options=storage_options, **options)
        return cls(sources, weights, **options)

    # -- the Source protocol -------------------------------------------------

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (f"Mixture({len(self._sources)} sources, length={self._length}, "
                f"stages={len(self._order.stages)}, seed={self._seed})")

    @property
    def reads_wait(self) -> bool:
        """False when every source says its reads never wait (local files:
        the Loader's automatic ``num_threads`` then reads in the caller's
        thread), else True."""
        return not all(getattr(s, "reads_wait", True) is False for s in self._sources.values())

    @property
    def collate(self) -> Callable[..., Any] | None:
        """The sources' own collation when they share one (windows: the varlen
        contract's flat ``cu_seqlens``; what ``Loader`` calls for its
        ``"numpy"`` and ``"torch"`` outputs), else None (the default outputs).
        The ``source`` column passes through it."""
        return self._collate

    def read_collated(self, indices: npt.ArrayLike, padding: npt.NDArray[np.bool_] | None = None,
                      output: str = "numpy") -> dict[str, Any]:
        """``collate(read(indices))`` (with the ``padding`` column when given),
        as the Loader calls it without a ``transform``: windows of local
        datasets (``ManyWindows``) go from the read kernel's columns to the
        collation without a Batch; other sources read, then collate. ValueError
        when the sources share no collation (:attr:`collate` is None)."""
        collate = self._collate
        if collate is None:
            raise ValueError("read_collated: this mixture's sources share no collation "
                             "(collate is None); read and convert the Batch instead")
        idx = self._indices(indices)
        group = self._windows()
        if group is None or output not in ("numpy", "torch") or not idx.shape[0]:
            return collate(read_indices(self, idx, padding), output=output)
        columns = self._read_group(group, idx)[0]
        if padding is not None:
            columns["padding"] = np.asarray(padding, dtype=np.bool_)
        collated = row_columns(columns)
        if output == "torch":
            return Columns(columns_to_torch(collated, jagged="offsets"))
        return collated

    @property
    def names(self) -> tuple[str, ...]:
        """Every source's name, by its index in the ``source`` column (sources
        removed at a resume keep their index)."""
        return self._order.names

    @property
    def sources(self) -> dict[str, Any]:
        """name -> source, for the sources this mixture reads."""
        return dict(self._sources)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The stages, in order (one for plain weights)."""
        return self._order.stages

    @property
    def order(self) -> MixtureOrder:
        """The pure order (positions to sources and their observations)."""
        return self._order

    @property
    def seed(self) -> int:
        """The mixture's seed."""
        return self._seed

    @property
    def seq_len(self) -> int | None:
        """The sources' common ``seq_len`` (windows), else None."""
        return self._seq_len

    @property
    def fingerprint(self) -> str:
        """A hash of the order's description: seed, sources (names, lengths,
        fingerprints) and stages; the length is not part of it."""
        found = self._fingerprint
        if found is None:
            canonical = _canonical(self.state_dict())
            text = json.dumps([canonical[k] for k in ("version", "seed", "sources", "stages")],
                              separators=(",", ":"))
            found = "mixture:" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
            self._fingerprint = found
        return found

    def locate(self, indices: npt.ArrayLike) -> tuple[npt.NDArray[np.int64],
                                                      npt.NDArray[np.int64]]:
        """``(source, index)`` of each position: the source's index in
        :attr:`names` and the observation of it read there. No I/O."""
        idx = self._check(indices)
        sources, _, index = self._order.observations(idx)
        return sources, index

    def _check(self, indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self._length):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise IndexError(f"position {bad} is out of range for a mixture of "
                             f"{self._length} observations")
        return idx

    def read(self, indices: npt.ArrayLike) -> Batch:
        """The observations at positions ``indices`` (any order, repeats allowed),
        as one Batch in that order: every source's columns plus ``source``.
        Global indexes in the meta are positions.

        Each row's source and observation come from one kernel call. Windows
        of local token-stream datasets (``ManyWindows.of`` the sources) are
        then read in one more, straight into the batch in position order; any
        other sources get one ``read`` per source present, their rows placed
        by one vectorized copy per source and column."""
        idx = self._indices(indices)
        group = self._windows()
        if group is not None and idx.shape[0]:
            columns, schema = self._read_group(group, idx)
            return Batch._trusted(columns, idx, {**schema, SOURCE_COLUMN: _SOURCE_SCHEMA})
        return self._read_each(idx, *self._observe(idx))

    def _indices(self, indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``indices`` as a C-contiguous int64 vector (checked unless it is one)."""
        idx = indices
        if not (isinstance(idx, np.ndarray) and idx.dtype == np.int64 and idx.ndim == 1
                and idx.flags.c_contiguous):
            idx = np.ascontiguousarray(self._check(indices))
        return idx

    def _observe(self, idx: npt.NDArray[np.int64], gather: bool = True
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Each position's (source, observation), from the block's run when
        ``gather`` and they are a step's (:meth:`_step_run`); IndexError past
        a pass limit."""
        run = self._step_run(idx) if gather else None
        if run is not None:
            observed = np.empty((2, idx.shape[0]), dtype=np.int64)
            if mk.gather_run(idx, run[1], run[0], run[3], run[4], observed,
                             np.empty(idx.shape[0], dtype=np.int32)):
                return observed[0], observed[1]
        sources, index, over = self._order.observe(idx, self._table, self._length)
        if over >= 0:
            self._past_limit(idx, sources, over)
        return sources, index

    def _past_limit(self, idx: npt.NDArray[np.int64], sources: npt.NDArray[np.int64],
                    over: int) -> None:
        s = int(sources[over])
        raise IndexError(f"position {int(idx[over])}: source {self.names[s]!r} would start "
                         f"a pass past max_passes={self._max_passes[self.names[s]]}")

    def _read_group(self, group: ManyWindows, idx: npt.NDArray[np.int64]
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The columns (``source`` last) and schema (without ``source``) of the
        rows at positions ``idx`` (at least one), read by ``group``: a step's
        rows gathered from its block's run (:meth:`_step_run`) and read in one
        kernel call (``_kernels.gather_read_rows``), or observed and read in
        one (``_kernels.observe_read_rows``); others observed first."""
        count = idx.shape[0]
        observed = np.empty((2, count), dtype=np.int64)
        column = np.empty(count, dtype=np.int32)
        run = self._step_run(idx)
        if run is not None:  # the step's rows gathered from its block's run, then read
            read = group.read(observed[0], observed[1], kernels=_GATHER_READ,
                              prefix=(idx, run[1], run[0], run[3], run[4], observed, column))
            if read is not None:
                read[0][SOURCE_COLUMN] = column
                return read
        blocks = self._order.step_blocks(idx, self._length)
        if blocks is not None:
            read = group.read(observed[0], observed[1], kernels=_OBSERVE_READ,
                              prefix=(*blocks, self._table, observed, column))
            if read is not None:
                read[0][SOURCE_COLUMN] = column
                return read
        sources, index = self._observe(idx, gather=False)  # also: the error past a limit
        read = group.read(sources, index)
        assert read is not None  # no kernel of ours: it reads
        read[0][SOURCE_COLUMN] = sources.astype(np.int32)
        return read

    def _step_run(self, idx: npt.NDArray[np.int64]) -> tuple[Any, ...] | None:
        """The run of the positions' block (:meth:`_block_run`) when ``idx``
        looks like a step's: at least ``_RUN_FROM`` positions, the first and
        last evenly spaced, in one block (``_kernels.gather_run`` checks every
        position). None otherwise."""
        count = idx.shape[0]
        if count < _RUN_FROM:
            return None
        first, last = int(idx[0]), int(idx[-1])
        stride = int(idx[1]) - first
        run = self._kept_run(first, last, stride)
        if run is not None:
            return run
        if stride < 1 or last != first + stride * (count - 1):
            return None
        with self._run_lock:  # reader threads meet at a block's start: one observes it
            return self._kept_run(first, last, stride) or self._block_run(first, last, stride)

    def _kept_run(self, first: int, last: int, stride: int) -> tuple[Any, ...] | None:
        for run in self._runs:  # (one tuple: another thread may replace it)
            if (run[0] == stride and run[1] <= first <= last < run[2]
                    and (first - run[1]) % stride == 0):  # (a rank's: its residue)
                return run
        return None

    def _block_run(self, first: int, last: int, stride: int) -> tuple[Any, ...] | None:
        """Every position of ``first``'s block that is ``first`` modulo
        ``stride`` (``MixtureOrder.block_run``: a rank's), observed in one call
        and kept (the last ``_RUNS_KEPT``) as ``(stride, first position, end
        of the block, sources, index)``; None when ``last`` lies past the
        block, or the block holds fewer than ``_RUN_STEPS`` such steps
        (call under ``_run_lock``). A block of 1,024 holds 16 steps
        of 64 of one rank: their observing costs one call, and the block's
        tables are read once, not between every step's reads (at batch 64: 4 %
        of a step; at 512, two steps a block, nothing). The run stops before a
        source's pass past its limit (the step's own path then raises)."""
        positions = self._order.block_run(first, stride, self._length)
        if (positions is None or positions.shape[0] < _RUN_STEPS * (last - first + stride) // stride
                or int(positions[-1]) < last):
            return None
        end = int(positions[-1]) + 1
        sources, index, over = self._order.observe(positions, self._table, self._length)
        if over >= 0:  # (index is not complete then): the positions before it
            if not over:
                return None
            sources, index, over = self._order.observe(positions[:over], self._table,
                                                       self._length)
            assert over < 0
        run = (stride, int(positions[0]), end, sources, index)
        self._runs = (run, *self._runs[:_RUNS_KEPT - 1])
        return run

    def _windows(self) -> ManyWindows | None:
        """The one-call reader of these sources, or None when they are not all
        windows of local datasets of one layout (built on first use)."""
        if not self._group_known:
            self._group = ManyWindows.of(self._objects)
            self._group_known = True
        return self._group

    def _read_each(self, idx: npt.NDArray[np.int64], sources: npt.NDArray[np.int64],
                   index: npt.NDArray[np.int64]) -> Batch:
        """:meth:`read` by one ``read`` per source present, rows placed in position order."""
        count = idx.shape[0]
        by_source = np.argsort(sources, kind="stable")
        ordered = sources[by_source]
        present, firsts = np.unique(ordered, return_index=True)
        bounds = [*firsts.tolist(), count]
        batches = []
        for i, s in enumerate(present.tolist()):
            rows = by_source[bounds[i]:bounds[i + 1]]
            source = self._objects[s]
            if source is None:
                raise ValueError(f"positions {idx[rows][:4].tolist()} read source "
                                 f"{self.names[s]!r}, which this mixture no longer has "
                                 "(removed at a resume, after those positions)")
            batches.append(source.read(index[rows]))
        names = [self.names[s] for s in present.tolist()]
        if not batches:  # no rows: the first source's columns, empty
            name, source = next(iter(self._sources.items()))
            present, names = np.array([self.names.index(name)]), [name]
            batches = [source.read(np.empty(0, dtype=np.int64))]
        for s, name, batch in zip(present.tolist(), names, batches, strict=True):
            if s not in self._checked:  # a source's layout is checked on its first read
                if self._reference is None:  # no rows: keep the schema, not the data
                    self._reference = (name, batch.select(slice(0, 0)))
                _check_layout(self._reference, name, batch)
                self._checked.add(s)
        columns = _assemble(batches, names, by_source, bounds, count)
        columns[SOURCE_COLUMN] = sources.astype(np.int32)
        return Batch.from_columns(columns, BatchMeta(idx, production_status=np.ones(count)))

    # -- description, state and resume --------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The mixture's description, JSON-able and versioned: seed, sources
        (name -> length and fingerprint, removed ones included), stages (start,
        block_size, weights), length and max_passes. O(sources * stages)."""
        return {
            "version": STATE_VERSION,
            "seed": self._seed,
            "sources": {name: dict(r) for name, r in self._described().items()},
            "stages": [{"start": s.start, "block_size": s.block_size,
                        "weights": {n: float(w) for n, w in s.weights.items()}}
                       for s in self._order.stages],
            "length": self._requested_length,
            "max_passes": dict(self._max_passes),
        }

    def resumed(self, state: Mapping[str, Any], *, epoch: int, consumed: int,
                allow: Collection[str] = ()) -> Mixture:
        """The mixture that continues a run saved as ``state`` (a
        :meth:`state_dict`) at the Loader position ``(epoch, consumed)``: the
        saved stages up to ``consumed``, then this mixture's weights, sources
        and length. Returns ``self`` when it is that mixture already.

        ValueError names what changed unless ``allow`` names it (see
        :data:`CHANGES`), and always when the seed or a continuing source's
        data changed, or the state is not a mixture's."""
        allowed = _allowed(allow)
        saved = _parse_state(state)
        if saved["seed"] != self._seed:
            raise ValueError(f"state is from a mixture with seed={saved['seed']}, this one has "
                             f"seed={self._seed}: it belongs to another mixture")
        for name, record in saved["sources"].items():
            mine = self._described().get(name)
            if mine is not None and mine != record:
                raise ValueError(
                    f"source {name!r} changed since the state was saved (length "
                    f"{record['length']} -> {mine['length']}, fingerprint "
                    f"{record['fingerprint']!r} -> {mine['fingerprint']!r}); its order would "
                    "change: the state belongs to another mixture")
        if _canonical(saved) == _canonical(self.state_dict()):
            return self
        if not isinstance(epoch, int) or not isinstance(consumed, int) or consumed < 0:
            raise ValueError(f"state has epoch={epoch!r}, consumed={consumed!r}")
        cut = consumed if epoch == 0 else None
        old_stages = [Stage(s["start"], s["weights"], s["block_size"]) for s in saved["stages"]]
        if cut is None:
            raise ValueError(f"state is at epoch {epoch}: a mixture is one epoch, and a "
                             "changed mixture resumes within it (make length longer than "
                             "the run instead of running a second epoch)")
        mine_now = _from(self._order.stages, cut)
        theirs_now = _from(old_stages, cut)
        changes: dict[str, list[str]] = {}
        if _future(mine_now) != _future(theirs_now):
            read_mine = {n for s in mine_now for n in s.weights}
            read_theirs = {n for s in theirs_now for n in s.weights}
            if read_mine != read_theirs:
                changes["sources"] = [f"added {sorted(read_mine - read_theirs)}",
                                      f"removed {sorted(read_theirs - read_mine)}"]
            changes["weights"] = [f"at position {cut}: "
                                  f"{_diff(theirs_now[0].weights, mine_now[0].weights)}"]
        if (saved["length"], saved["max_passes"]) != (self._requested_length,
                                                      dict(self._max_passes)):
            changes["length"] = [f"length {saved['length']} -> {self._requested_length}, "
                                 f"max_passes {saved['max_passes']} -> {dict(self._max_passes)}"]
        refused = sorted(set(changes) - allowed)
        if refused:
            what = "; ".join(f"{c}: {', '.join(changes[c])}" for c in refused)
            raise ValueError(
                f"the mixture changed since the state was saved ({what}); pass "
                f"allow={set(refused)!r} to load_state_dict to start a new stage at "
                f"position {cut} (each source continues its own order), or rebuild the "
                "mixture as it was")
        stages = old_stages
        if changes.keys() - {"length"}:
            stages = [s for s in old_stages if s.start < cut]
            stages.append(Stage(cut, mine_now[0].weights, mine_now[0].block_size))
            stages.extend(mine_now[1:])
        records = dict(saved["sources"])
        records.update(self._described())
        resumed = Mixture.__new__(Mixture)
        resumed._build(dict(self._sources), records, stages, self._seed,
                       self._requested_length, dict(self._max_passes))
        if consumed > len(resumed):
            raise ValueError(f"the run is at position {consumed}, past this mixture's "
                             f"length {len(resumed)}: make length longer")
        return resumed

    def describe(self, length: int | None = None) -> list[dict[str, Any]]:
        """Per source at ``length`` observations (default: the mixture's
        length): name, observations, the weight share asked in the last stage,
        the share achieved, slots read and passes started. O(sources + block)."""
        at = self._length if length is None else _int("length", length, low=0)
        slots = self._order.slots_before(at)
        last = self._order.stages[-1].weights
        total = sum(last.values())
        rows = []
        for s, name in enumerate(self.names):
            n = int(self._order.lengths[s])
            rows.append({
                "name": name,
                "observations": n,
                "weight": float(last.get(name, 0.0)) / total,
                "achieved": int(slots[s]) / at if at else 0.0,
                "slots": int(slots[s]),
                "passes": -(-int(slots[s]) // n),
                "active": name in self._sources,
            })
        return rows


def _from(stages: Sequence[Stage], cut: int) -> list[Stage]:
    """The stages in force from position ``cut`` on (the first one active at it)."""
    active = [s for s in stages if s.start <= cut][-1:]
    return active + [s for s in stages if s.start > cut]


def _future(stages: Sequence[Stage]) -> list[Any]:
    """What decides the order from a cut on: the active stage's weights and
    block size, then every later stage whole."""
    return [(i and s.start, s.block_size, sorted(s.weights.items()))
            for i, s in enumerate(stages)]


def _canonical(state: Mapping[str, Any]) -> dict[str, Any]:
    """A state with its order-carrying mappings as lists (the sources' order is
    their index) and its weights sorted (their order carries nothing)."""
    return {
        **state,
        "sources": [[n, r["length"], r["fingerprint"]] for n, r in state["sources"].items()],
        "stages": [[s["start"], s["block_size"], sorted(s["weights"].items())]
                   for s in state["stages"]],
        "max_passes": sorted(state["max_passes"].items()),
    }


def _diff(then: Mapping[str, float], now: Mapping[str, float]) -> str:
    t, n = sum(then.values()), sum(now.values())
    parts = []
    for name in sorted(set(then) | set(now)):
        a, b = then.get(name, 0.0) / t, now.get(name, 0.0) / n
        if abs(a - b) > 1e-15 or (name in then) != (name in now):
            parts.append(f"{name!r} {a:.4g} -> {b:.4g}")
    return ", ".join(parts) or "block layout"


def _allowed(allow: Collection[str]) -> set[str]:
    if isinstance(allow, str):
        allow = (allow,)
    unknown = sorted(set(allow) - set(CHANGES))
    if unknown:
        raise ValueError(f"allow may name {CHANGES}, got {unknown}")
    return set(allow)


def _max_passes(value: int | Mapping[str, int] | None, names: Sequence[str]) -> dict[str, int]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"max_passes names unknown sources {unknown}")
        return {str(n): _int(f"max_passes[{n!r}]", v) for n, v in value.items()}
    limit = _int("max_passes", value)
    return dict.fromkeys(names, limit)


def _parse_state(state: Any) -> dict[str, Any]:
    """``state`` checked as a :meth:`Mixture.state_dict`; ValueError otherwise."""
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
        raise ValueError(f"state['source'] is not a mixture state of version {STATE_VERSION}: "
                         f"{state!r:.200}; the state belongs to another source")
    try:
        sources = {str(n): {"length": int(r["length"]), "fingerprint": r["fingerprint"]}
                   for n, r in state["sources"].items()}
        stages = [{"start": int(s["start"]), "block_size": int(s["block_size"]),
                   "weights": {str(n): float(w) for n, w in s["weights"].items()}}
                  for s in state["stages"]]
        length = state["length"]
        max_passes = {str(n): int(v) for n, v in state["max_passes"].items()}
        seed = int(state["seed"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"state['source'] is a malformed mixture state ({error!r})") from None
    return {"version": STATE_VERSION, "seed": seed, "sources": sources, "stages": stages,
            "length": None if length is None else int(length), "max_passes": max_passes}


def _check_columns(sources: Mapping[str, Any]) -> None:
    """ValueError naming two sources whose columns cannot mix, as far as their
    attributes tell (``seq_len``, ``columns``); the batches are checked again
    when read."""
    first_name, first = next(iter(sources.items()))
    expected = [(attribute, getattr(first, attribute, None)) for attribute in ("seq_len",
                                                                                "columns")]
    for name, source in sources.items():
        for attribute, a in expected:
            b = getattr(source, attribute, None)
            if a != b:
                kind = {True: "windows", False: "documents"}
                if attribute == "seq_len" and (a is None) != (b is None):
                    detail = (f"{first_name!r} reads {kind[a is not None]}, {name!r} reads "
                              f"{kind[b is not None]}")
                else:
                    detail = f"{first_name!r} has {attribute}={a!r}, {name!r} has {b!r}"
                raise ValueError(f"sources: their columns cannot mix ({detail}); a mixture's "
                                 "sources must give the same columns")


def _check_layout(reference: tuple[str, Batch], name: str, batch: Batch) -> None:
    """ValueError unless ``batch`` has the fields and layouts of ``reference``'s."""
    first_name, first = reference
    if batch.fields != first.fields or any(
            not batch.meta.field_schema[f].same_layout(first.meta.field_schema[f])
            for f in first.fields):
        raise ValueError(
            f"sources: {first_name!r} and {name!r} give columns that cannot mix: "
            f"{[(f, str(first.meta.field_schema[f])) for f in first.fields]} against "
            f"{[(f, str(batch.meta.field_schema[f])) for f in batch.fields]}")
    if SOURCE_COLUMN in batch.fields:
        raise ValueError(f"sources: {name!r} has a column named {SOURCE_COLUMN!r}, which "
                         "the mixture adds; rename it")


def _assemble(batches: list[Batch], names: list[str], by_source: npt.NDArray[np.int64],
              bounds: list[int], count: int) -> dict[str, Any]:
    """The columns of ``batches`` (one per source, rows grouped by source as
    ``by_source`` orders them) in position order."""
    first = batches[0]
    if len(batches) == 1:  # one source: its rows are already in position order
        return first.to_numpy()
    inverse: npt.NDArray[np.int64] | None = None
    columns: dict[str, Any] = {}
    for field in first.fields:
        parts = [b[field] for b in batches]
        head = parts[0]
        if isinstance(head, np.ndarray):
            out = np.empty((count, *head.shape[1:]), dtype=head.dtype)
            for i, part in enumerate(parts):
                out[by_source[bounds[i]:bounds[i + 1]]] = part
            columns[field] = out
            continue
        if inverse is None:
            inverse = np.empty(count, dtype=np.int64)
            inverse[by_source] = np.arange(count, dtype=np.int64)
        if isinstance(head, Jagged):
            columns[field] = Jagged.concat(parts).take(inverse)  # type: ignore[arg-type]  # all Jagged: one schema
        else:
            flat = [x for part in parts for x in part]
            columns[field] = [flat[i] for i in inverse.tolist()]  # objects: one per row anyway
    return columns
