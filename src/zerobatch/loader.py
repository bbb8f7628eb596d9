"""``Loader``: the plan, read-ahead threads, collation and exact resume over any source.

A *source* is anything with ``__len__`` and ``read(indices) -> Batch``
(:class:`zerobatch.source.Source`): ``TokenWindows``, ``Documents``, ``BatchFileReader`` or a
user's own object. The loader asks :class:`~zerobatch.plan.Plan` which
observations this rank reads at each step, runs ``source.read`` (and the
optional ``transform``, and the conversion to the output) on ``num_threads``
background threads with up to ``prefetch`` steps in flight, and yields the
steps in order. A caller that would wait for a step not yet read reads a
later one itself meanwhile.

By default (``num_threads=None``) the loader chooses: a source whose reads
never wait (``reads_wait = False``: local, memory-mapped files) read to CPU
output is read in the caller's thread, tens of microseconds a batch, and
moves to one reader thread once the caller is seen waiting between steps (a
GPU, I/O) at least as long as the reads take
(:class:`zerobatch._readers.Waits`); any other source (object storage, a
service, a user's own), a device or JAX output, or a ``transform`` gets one
reader thread from the start.

The sequence of batches depends only on (source, seed, epoch, batch_size,
rank, world_size, shuffle, drop_last, block_size): never on ``num_threads`` or
``prefetch``. ``state_dict()`` counts what the caller has received, not what
the threads fetched, so a checkpoint taken at any point resumes exactly, also
with another ``world_size``, ``batch_size``, ``prefetch`` or ``num_threads``.

>>> from zerobatch import Batch
>>> class Squares:
...     def __len__(self): return 8
...     def read(self, indices): return Batch.from_columns({"x": indices ** 2})
>>> loader = Loader(Squares(), 4, shuffle=False, output="numpy")
>>> [b["x"].tolist() for b in loader]
[[0, 1, 4, 9], [16, 25, 36, 49]]
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch._readers import Readers, Waits
from zerobatch.columnar import Batch
from zerobatch.plan import Plan, Planned, Position
from zerobatch.source import (
    _DEFAULT_RANK,
    Source,
    describe,
    fingerprint,
    plan_shuffle,
    read_indices,
    read_step,
    resolve_rank,
    resume_source,
    source_state,
)

# Source, fingerprint, read_step and resolve_rank live in zerobatch.source; they
# stay importable from here for code written before the split.
__all__ = ["Loader", "Output", "Source", "fingerprint", "read_step", "resolve_rank"]

OUTPUTS = ("torch", "numpy", "batch")
_DEPRECATED = {"pin_memory": "zerobatch.torch.TorchOutput(pin_memory=...)",
               "device": "zerobatch.torch.TorchOutput(device=...)",
               "sharding": "zerobatch.jax.JaxOutput(sharding)",
               "microbatch": "zerobatch.jax.JaxOutput(sharding, microbatch=...)"}
_log = logging.getLogger("zerobatch.loader")
_logged_rank_source = False


@runtime_checkable
class Output(Protocol):
    """What a Loader turns each step's ``Batch`` into, beyond the named kinds
    ``"torch"``, ``"numpy"`` and ``"batch"``: ``zerobatch.torch.TorchOutput``,
    ``zerobatch.jax.JaxOutput`` or a user's own. Lives with its framework."""

    def ranks(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` when the Loader is given neither, or None to
        let the Loader resolve them (:func:`zerobatch.source.resolve_rank`)."""
        ...

    def bind(self, plan: Plan, source: Any) -> Callable[[Batch], Any]:
        """The converter of ``plan``'s steps over ``source``, called on the
        reader threads (thread-safe). ValueError when the two do not fit."""
        ...


@runtime_checkable
class _Placement(Protocol):
    """A bound output that chooses which observations this process reads at a
    step (``zerobatch.jax.GlobalSteps``: the rows its devices hold)."""

    def indices(self, consumed: int, order: Any) -> npt.NDArray[np.int64]: ...


def _output_object(output: Any, deprecated: dict[str, Any]) -> Any:
    """``output`` with the per-output keywords of older releases folded into an
    output object (with a DeprecationWarning naming the object to pass)."""
    unknown = sorted(set(deprecated) - set(_DEPRECATED))
    if unknown:
        raise TypeError(f"Loader() got unexpected keyword arguments {unknown}")
    given = {key: value for key, value in deprecated.items()
             if value is not None and value is not False}
    if output == "jax" and "sharding" not in given:
        raise ValueError("output='jax' needs a sharding: pass "
                         "output=zerobatch.jax.JaxOutput(sharding, microbatch=...)")
    if not given:
        return output
    for key in given:
        warnings.warn(f"Loader({key}=...) is deprecated: pass output={_DEPRECATED[key]}",
                      DeprecationWarning, stacklevel=4)
    if output == "jax":
        from zerobatch.jax import JaxOutput

        if set(given) - {"sharding", "microbatch"}:
            raise ValueError("pin_memory and device need torch output")
        return JaxOutput(given["sharding"], microbatch=given.get("microbatch"))
    if output == "torch" and not set(given) - {"pin_memory", "device"}:
        from zerobatch._torch_output import TorchOutput

        return TorchOutput(pin_memory=bool(given.get("pin_memory")), device=given.get("device"))
    needs = "torch output" if set(given) & {"pin_memory", "device"} else "output='jax'"
    raise ValueError(f"{' and '.join(sorted(given))} need {needs}")


class Loader:
    """Iterate ``source`` in batches of ``batch_size`` for this rank, reading ahead.

    Args:
        source: a :class:`Source` (``__len__`` and ``read(indices) -> Batch``).
        batch_size: observations per batch on this rank.
        seed: the shuffle seed: with the epoch, it orders every epoch (any int).
        shuffle: a global shuffle (Feistel, or blocks with ``block_size``);
            default True, except for an ordered source (a ``Mixture``), which
            is read in its own order (shuffle=True then raises ValueError).
        rank, world_size: default from torch.distributed, then ``RANK`` and
            ``WORLD_SIZE``, else 0 and 1 (logged once). Defaults of 0 and 1
            are looked up again at each iteration, so a Loader built before
            ``init_process_group`` takes its rank when iterated.
        prefetch: steps read ahead (0: read in the caller's thread).
        num_threads: reader threads (0: read in the caller's thread). While
            the next step is not ready and at most ``prefetch`` are in flight,
            the caller's thread reads the next unclaimed step itself.
            None (default): automatic. Reads in the caller's thread when the
            source says its reads never wait (``reads_wait`` False: local
            files; tens of microseconds a batch, which a thread's hand-over
            would double) and the output stays on the CPU with no
            ``transform``; moves to one reader thread for the rest of the pass
            once the caller waits between steps (GPU, I/O) at least as long
            as its reads take. Otherwise one reader thread from the start.
        drop_last: skip the epoch's tail (True) or pad the last step and add a
            boolean ``padding`` column (False). Every rank runs the same steps.
        output: ``"torch"`` (dict of tensors sharing the batch's memory),
            ``"numpy"`` (dict of arrays), ``"batch"`` (the columnar Batch), or
            an :class:`Output` object: ``zerobatch.torch.TorchOutput(pin_memory=,
            device=)`` pins in the background and copies to a device;
            ``zerobatch.jax.JaxOutput(sharding, microbatch=)`` gives global
            ``jax.Array``s of ``batch_size * world_size`` windows per step, each
            process reading only the rows its devices hold (``rank`` and
            ``world_size`` then default to JAX's process index and count).
        epochs: epochs one ``for`` loop runs from the current position
            (None: forever, each epoch freshly shuffled).
        block_size: keep runs of this many consecutive observations together.
        transform: ``Batch -> Batch``, run on the reader threads; it must be
            thread-safe.
        pin_memory, device, sharding, microbatch: deprecated keywords of the
            output objects above (a DeprecationWarning says which to pass).

    Memory holds at most ``prefetch`` batches besides the one the caller has,
    and one more while the caller, its next batch not ready, reads ahead.
    Iterate from one thread; ``state_dict`` may be called from it at any time.
    WARNING: ``transform`` runs concurrently on ``num_threads`` threads.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int = 2,
        num_threads: int | None = None,
        drop_last: bool = True,
        output: Literal["torch", "numpy", "batch"] | Output = "torch",
        epochs: int | None = 1,
        block_size: int | None = None,
        transform: Callable[[Batch], Batch] | None = None,
        **deprecated: Any,
    ) -> None:
        global _logged_rank_source
        if not callable(getattr(source, "read", None)) or not hasattr(source, "__len__"):
            raise ValueError(f"source must have __len__ and read(indices) -> Batch; "
                             f"got {type(source).__name__}")
        output = _output_object(output, deprecated)
        if isinstance(output, str) and output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS} or an output object "
                             f"(zerobatch.torch.TorchOutput, zerobatch.jax.JaxOutput), "
                             f"got {output!r}")
        if not isinstance(output, str) and not isinstance(output, Output):
            raise ValueError(f"output must be one of {OUTPUTS} or an object with ranks() and "
                             f"bind(plan, source), got {type(output).__name__}")
        for name, value in (("prefetch", prefetch), ("num_threads", num_threads)):
            if value is None and name == "num_threads":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0"
                                 f"{' or None (automatic)' if name == 'num_threads' else ''}, "
                                 f"got {value!r}")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int)
                                   or epochs < 1):
            raise ValueError(f"epochs must be an int >= 1 or None, got {epochs!r}")
        if transform is not None and not callable(transform):
            raise ValueError(f"transform must be callable, got {type(transform).__name__}")
        implied = None if isinstance(output, str) else output.ranks()
        if implied is not None and rank is None and world_size is None:
            rank, world_size = implied
        rank, world_size, origin = resolve_rank(rank, world_size)
        if origin != "arguments" and not _logged_rank_source:
            _log.info("zerobatch Loader: rank %d of %d from %s", rank, world_size, origin)
            _logged_rank_source = True
        bind = getattr(source, "bind_plan", None)
        if callable(bind):  # a source with its own plan (packed rows), bound to our order
            self._plan, source = bind(batch_size, world_size=world_size, seed=seed,
                                      shuffle=plan_shuffle(source, shuffle), drop_last=drop_last,
                                      block_size=block_size)
        else:
            self._plan = Plan(len(source), batch_size, world_size=world_size, seed=seed,
                              shuffle=plan_shuffle(source, shuffle), drop_last=drop_last,
                              block_size=block_size)
        self._rank = self._plan.check_rank(rank)
        self._source = source
        self._prefetch = prefetch
        self._num_threads = num_threads
        self._output = output
        self._epochs = epochs
        self._transform = transform
        self._rank_origin = origin
        self._began = False  # iterated at least once
        # Why state_dict() is not the position trained on (zerobatch.torch sets it), or None.
        self._stale: str | None = None
        self._convert: Callable[[Batch], Any] | None = None
        # read + collate in one call (a source's read_collated), bound with _convert
        self._collated: Callable[[Any, Any], Any] | None = None
        self._placement: _Placement | None = None
        if not isinstance(output, str):
            self._converter()  # an output object binds now: a source it cannot take fails here
        self._position = self.position()
        self._iterator: weakref.ref[_Iterator] | None = None  # weak: no cycle, no leak
        # the current pass's threads: close() joins them even after the pass was dropped
        self._threads: Readers | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickles with its source, plan and position (for ``spawn`` workers),
        without its running iterator; a default rank is looked up first (a
        spawned worker cannot see the parent's torch.distributed)."""
        self._refresh_rank()
        state = dict(self.__dict__)
        state["_iterator"] = None
        # bound again where it is used
        state["_convert"] = state["_placement"] = state["_collated"] = None
        return state

    @property
    def plan(self) -> Plan:
        """The plan: order, steps and ranks."""
        return self._plan

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Ranks in all."""
        return self._plan.world_size

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._position.epoch

    @property
    def step(self) -> tuple[int, int]:
        """The step ``(epoch, consumed)`` the next batch comes from."""
        return self._position.step

    @property
    def epochs(self) -> int | None:
        """Epochs one ``for`` loop runs from the current position (None: forever)."""
        return self._epochs

    @property
    def fingerprint(self) -> str | None:
        """The source's identity, stored in the state (:func:`fingerprint`)."""
        return self._position.fingerprint

    def __len__(self) -> int:
        """Steps (batches for this rank) in a whole epoch."""
        return self._plan.steps(0)

    def __repr__(self) -> str:
        return (f"Loader({type(self._source).__name__}, batch_size={self._plan.batch_size}, "
                f"rank={self._rank}, world_size={self.world_size}, epoch={self.epoch}, "
                f"consumed={self._position.consumed})")

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``; the current epoch keeps a resumed position."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self._stop()
            self._position.start_epoch(epoch)

    def _refresh_rank(self) -> None:
        """Take torch.distributed's (or torchrun's) rank and world size if this
        loader's came from the single-process default and they now say more
        (a Loader built before ``init_process_group``). The position is global,
        so it stays; a pass already begun as rank 0 of 1 gets a warning."""
        if self._rank_origin != _DEFAULT_RANK:
            return
        rank, world_size, origin = resolve_rank(None, None)
        if origin == _DEFAULT_RANK:
            return
        if self._began:
            warnings.warn(f"zerobatch Loader: {origin} now reports rank {rank} of {world_size}, "
                          f"but this loader was already read as rank 0 of 1 (built before "
                          f"init_process_group?): the batches so far were the whole step; "
                          f"build the Loader after init_process_group or pass rank=, "
                          f"world_size=", stacklevel=3)
        self._stop()
        self._plan = dataclasses.replace(self._plan, world_size=world_size)
        self._rank = self._plan.check_rank(rank)
        self._position.plan = self._plan
        self._convert = self._placement = self._collated = None  # bound to the plan: bind again
        self._rank_origin = origin
        _log.info("zerobatch Loader: rank %d of %d from %s", rank, world_size, origin)

    def __iter__(self) -> Iterator[Any]:
        """Batches from the current position; a new iterator replaces the last one."""
        self._stop()
        self._refresh_rank()
        self._stale = None  # iterated itself: its position moves
        self._began = True
        if not self._plan.has_step(0, self.epoch):
            raise ValueError(
                f"the source has {self._plan.length} observations, fewer than one step of "
                f"batch_size * world_size = {self._plan.step_size}; lower batch_size or "
                "pass drop_last=False"
            )
        iterator = _Iterator(self)
        self._iterator = weakref.ref(iterator)
        return iterator

    @property
    def num_threads(self) -> int | None:
        """Reader threads asked for (None: automatic, see the class docstring)."""
        return self._num_threads

    def _reader_threads(self) -> int | None:
        """Reader threads a new pass starts with; None: the caller's thread,
        watching for waits that a thread would hide (``Waits``)."""
        if self._prefetch == 0:
            return 0
        if self._num_threads is not None:
            return self._num_threads
        output = self._output
        on_cpu = isinstance(output, str) or (
            getattr(output, "device", 0) is None and getattr(output, "pin_memory", True) is False)
        if (getattr(self._source, "reads_wait", True) is not False or not on_cpu
                or self._transform is not None):
            return 1
        return None

    def produce(self, epoch: int, consumed: int) -> Any:
        """This rank's output for the step ``(epoch, consumed)``: read (with the
        ``padding`` column when drop_last is False), transform, convert, in the
        calling thread. The state does not move; the reader threads call this.

        With a ``JaxOutput``, its bound ``GlobalSteps`` says which observations
        this process reads: the rows its devices hold."""
        self._converter()
        if self._placement is not None:  # the rows of this process's devices, not a rank's
            return self._produce(epoch, consumed, None, None)
        return self._produce(epoch, consumed, *self._plan.indices(epoch, consumed, self._rank))

    def _produce(self, epoch: int, consumed: int, indices: npt.NDArray[np.int64] | None,
                 padding: npt.NDArray[np.bool_] | None) -> Any:
        """:meth:`produce` with the rank's ``indices`` and ``padding`` at the step
        already computed (:func:`zerobatch.plan.rank_steps`; unused with a JaxOutput)."""
        convert = self._converter()
        if self._collated is not None and indices is not None:  # read and collate in one pass
            return self._collated(indices, None if self._plan.drop_last else padding)
        if self._placement is not None:
            batch = self._source.read(self._placement.indices(consumed,
                                                              self._plan.order(epoch)))
        else:
            assert indices is not None
            batch = read_indices(self._source, indices, None if self._plan.drop_last else padding)
        if self._transform is not None:
            batch = self._transform(batch)
        return convert(batch)

    def _converter(self) -> Callable[[Batch], Any]:
        """The bound output (and :attr:`_placement`), made on first use."""
        if self._convert is not None:  # every step asks: no lookup on the source
            return self._convert
        collate = getattr(self._source, "collate", None)
        if callable(collate):
            # a source with a collation of its own (packed rows: the varlen contract),
            # and, without a transform to run in between, a read that collates at once
            collated = getattr(self._source, "read_collated", None)
            if not callable(collated) or self._transform is not None:
                collated = None
            if self._output in ("torch", "numpy"):
                self._convert = functools.partial(collate, output=self._output)
                if collated is not None:
                    self._collated = functools.partial(collated, output=self._output)
            elif hasattr(self._output, "pin_memory") and hasattr(self._output, "device"):
                torch_output: Any = self._output  # zerobatch.torch.TorchOutput
                self._convert = torch_output.after(functools.partial(collate, output="torch"),
                                                   self._source)
                if collated is not None:
                    self._collated = torch_output.after(
                        functools.partial(collated, output="torch"), self._source)
        if self._convert is None:
            if not isinstance(self._output, str):
                convert = self._output.bind(self._plan, self._source)
                self._placement = convert if isinstance(convert, _Placement) else None
                self._convert = convert
            elif self._output == "torch":
                self._convert = Batch.to_torch
            elif self._output == "numpy":
                self._convert = Batch.to_numpy
            else:
                self._convert = _same
        return self._convert

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position of what the caller has received
        (:meth:`zerobatch.plan.Position.state_dict`). O(1). Warns when the
        batches come from DataLoader workers that this loader does not see
        (``zerobatch.torch.LoaderDataset``): save the DataLoader's state then."""
        if self._stale is not None:
            warnings.warn(self._stale, stacklevel=2)
        return self._position.state_dict()

    def position(self) -> Position:
        """A new Position at the start of this loader's plan, with its source's
        identity and description (what ``zerobatch.torch`` workers move)."""
        return Position.of(self._plan, functools.partial(describe, self._source))

    @property
    def source(self) -> Any:
        """The source read (after a resume, the one that continues the run)."""
        return self._source

    def load_state_dict(self, state: dict[str, Any], *, allow: Any = ()) -> None:
        """Continue exactly after what ``state`` says was received, with this
        loader's world_size, batch_size, prefetch and threads. ValueError names
        what differs when the state belongs to another source, seed or version.

        A source that resumes changed (a ``Mixture``: see
        :func:`zerobatch.source.resume_source`) may continue the run with
        changes that ``allow`` names (e.g. ``{"weights"}``); the loader then
        reads the source it returns."""
        source = resume_source(self._source, state, allow)
        if source is not self._source:
            if getattr(source, "seq_len", None) != getattr(self._source, "seq_len", None):
                raise ValueError("the resumed source has another seq_len than this loader's")
            plan = dataclasses.replace(self._plan, length=len(source))
            position = Position(plan, fingerprint(source), source_state(source))
            state = {**state, "length": plan.length, "fingerprint": position.fingerprint,
                     "source": position.source}
            step = position.check(state)
            self._stop()
            self._source, self._plan, self._position = source, plan, position
            self._convert = self._placement = self._collated = None  # bound to them: bind again
        else:
            step = self._position.check(state)
            self._stop()
        self._position.epoch, self._position.consumed = step

    def _stop(self) -> None:
        iterator = None if self._iterator is None else self._iterator()
        if iterator is not None:
            iterator.close()
        self._iterator = None
        if self._threads is not None:
            self._threads.stop(wait=True)
            self._threads = None

    def close(self) -> None:
        """Stop and join the reader threads, also those of a pass already dropped
        (a ``for`` loop left by an exception); idempotent. The loader can be
        iterated again afterwards (new threads start)."""
        self._stop()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _same(batch: Batch) -> Batch:
    return batch




def _produce(loader: Loader, planned: Planned) -> Any:
    """``loader``'s output for a planned step."""
    (epoch, consumed), _, indices, padding = planned
    return loader._produce(epoch, consumed, indices, padding)


class _Iterator:
    """One pass of a Loader: its steps, read by the caller or by :class:`Readers`."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._position = loader._position
        # The steps left to produce, each with the position after it: next()
        # only stores that, the plan's arithmetic ran where the step was produced.
        self._steps = loader._position.planned(loader._epochs, loader._rank)
        self._readers: Readers | None = None
        self._finalizer: Any = None
        threads = loader._reader_threads()
        self._waits = Waits() if threads is None else None  # automatic: caller first
        self._end = None if loader._epochs is None else self._position.epoch + loader._epochs
        # An output that must see each step where the consumer receives it (a
        # CUDA TorchOutput marks the tensors as used by the consumer's stream).
        self._received = getattr(loader._converter(), "received", None)
        if threads:
            self._start(threads)
        self._done = False

    def _start(self, threads: int) -> None:
        """Hand the steps not yet produced to ``threads`` reader threads."""
        loader = self._loader
        # The threads must not hold the iterator (see Readers): produce through the loader.
        self._readers = Readers(functools.partial(_produce, loader), self._steps,
                                 loader._prefetch, threads)
        self._finalizer = weakref.finalize(self, self._readers.stop, wait=False)
        loader._threads = self._readers
        _forksafe.register(self)

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            if self._readers is None:
                waits = self._waits
                began = 0.0 if waits is None else waits.begin()
                planned = next(self._steps, None)
                if planned is None:
                    raise StopIteration
                item = _produce(self._loader, planned)
                if waits is not None and waits.end(began):  # the caller waits: a thread reads
                    self._waits = None
                    self._start(1)
            else:
                outcome = self._readers.take()
                if outcome is None:
                    raise StopIteration
                planned, item, error = outcome
                if error is not None:
                    raise error
        except BaseException:
            self.close()
            raise
        position = self._position  # received: at the step after this one
        position.epoch, position.consumed = planned[1]
        return item if self._received is None else self._received(item)

    def _after_fork(self) -> None:
        """In a forked child: the reader threads stayed in the parent (the steps
        they claimed with them), so the rest of the pass is read in the caller's
        thread, from the step after the last one received."""
        if self._readers is None:
            return
        self._finalizer.detach()
        if self._loader._threads is self._readers:
            self._loader._threads = None
        self._readers = None
        position = self._position
        epochs = None if self._end is None else max(0, self._end - position.epoch)
        self._steps = position.planned(epochs, self._loader._rank)

    def close(self) -> None:
        """Stop the reader threads and join them (each finishes its read)."""
        self._done = True
        if self._readers is not None:
            self._finalizer.detach()
            self._readers.stop(wait=True)
            if self._loader._threads is self._readers:
                self._loader._threads = None
            self._readers = None
