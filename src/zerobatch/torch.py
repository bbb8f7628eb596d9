"""PyTorch adapter: a Loader's plan read by ``DataLoader`` worker processes.

Two ways to put worker processes behind a :class:`~zerobatch.Loader`:

- :class:`DataLoader` ``(loader, num_workers=k)``: a ``torch.utils.data.DataLoader``
  whose main process moves ``loader``'s position as it yields each batch, so
  ``loader.state_dict()`` (or the DataLoader's own ``state_dict()``, the same
  thing) is exact at any time and resumes with any ``num_workers``,
  ``world_size`` and ``batch_size``. Frameworks that checkpoint any loader with
  ``state_dict``/``load_state_dict`` (Lightning, DCP) take it as it is.
- :class:`LoaderDataset` ``(loader)`` in a ``DataLoader(ds, batch_size=None,
  num_workers=k)`` of your own, or in torchdata's ``StatefulDataLoader``.

Either way worker ``w`` of ``k`` produces steps ``w, w + k, w + 2k, ...`` of
the rank's sequence and the DataLoader's round robin puts them back in order:
the batches are the Loader's own, in the same order. Batching and shuffling
stay in the plan, so ``batch_size=None``.

Each pass starts from the loader's position and runs ``loader.epochs`` epochs;
:meth:`LoaderDataset.set_epoch` (which frameworks and accelerate call) moves the
loader to an epoch's start, so every epoch is freshly shuffled.

With torchdata's ``StatefulDataLoader`` the workers' iterator states hold the
position (the Loader state of each worker's next step and the step size it
was made for), counted from what the main process yielded, never from what
workers prefetched. ``StatefulDataLoader.load_state_dict`` resumes exactly with
the same ``num_workers`` and the same step (``batch_size * world_size``, any
split of it); another step or worker count is refused with a ValueError that
names the fix: :meth:`LoaderDataset.loader_state` turns the saved state into
the one global position, which :class:`DataLoader` and the Loader load with
anything changed (``DataLoader.load_state_dict`` accepts such a state as it is).
On this route the main process's ``loader`` never moves, so its
``state_dict()`` warns.

Worker processes are forked (the default start method on Linux) from the main
process, also while a Loader there reads the *same* source object with reader
threads: a forked child finds every lock of the source unlocked, and a pass
begun before the fork goes on in the child's own thread (``zerobatch._forksafe``).
Object storage (``s3://``, ...) is the exception: obstore is not fork-safe, so a
forked worker's read raises ``StorageError``; use
``multiprocessing_context="spawn"`` there.

WARNING: keep the DataLoader's default ``in_order=True`` and
``persistent_workers=False``: the position assumes the round robin's order, and
persistent workers keep the loader they started with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from zerobatch._torch_output import TorchOutput
from zerobatch.loader import Loader
from zerobatch.plan import Plan, Position
from zerobatch.source import resume_source

__all__ = ["DataLoader", "LoaderDataset", "TorchOutput"]

_ITERATOR_VERSION = 2
_STALE = ("this Loader feeds a LoaderDataset, whose DataLoader workers read from copies of "
          "it: its own state_dict() does not move. Save the StatefulDataLoader's "
          "state_dict() instead, or use zerobatch.torch.DataLoader(loader, num_workers=...), "
          "which moves the Loader as it yields")


class LoaderDataset(torch.utils.data.IterableDataset):
    """The steps of ``loader`` (see the module docstring), split over DataLoader workers.

    ``state_dict``/``load_state_dict`` are the loader's own (where a new
    iteration starts); the iterators add their worker's next step.
    """

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        if not isinstance(loader, Loader):
            raise TypeError(f"LoaderDataset takes a zerobatch Loader, got {type(loader).__name__}")
        self.loader = loader
        loader._stale = _STALE

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> _WorkerSteps:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        self.loader._refresh_rank()
        return _WorkerSteps(self.loader, worker, workers)

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at ``epoch``'s first step (``Loader.set_epoch``);
        the current epoch keeps a resumed position. Call it in the main process
        before iterating (frameworks and accelerate do)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state (JSON-able): where a new pass starts."""
        return self.loader._position.state_dict()

    def load_state_dict(self, state: dict[str, Any], *, allow: Any = ()) -> None:
        """Move the loader to ``state`` (as ``Loader.load_state_dict``, ``allow`` included)."""
        self.loader.load_state_dict(state, allow=allow)

    def loader_state(self, dataloader_state: dict[str, Any], *,
                     allow: Any = ()) -> dict[str, Any]:
        """The Loader state inside ``StatefulDataLoader.state_dict()`` over a
        LoaderDataset, saved with any ``num_workers``, ``world_size`` and
        ``batch_size``: the step after the last batch its main process yielded
        (also with ``snapshot_every_n_steps`` above 1). ``loader.load_state_dict``
        of it resumes with any of them changed. O(workers).

        A source that resumes changed (a ``Mixture`` whose weights, sources or
        length changed since the save: see ``Loader.load_state_dict``) needs
        ``allow`` naming the changes: the state is then the saved source's (its
        description and identity, from the state's ``dataset_state``), checked
        against this loader's source, and ``loader.load_state_dict(state,
        allow=...)`` continues it (a new stage at that step).

        ValueError names the field when ``dataloader_state`` holds no
        LoaderDataset position or a malformed one, and names what changed when
        ``allow`` does not accept it.
        """
        states = _iterator_states(dataloader_state)
        if not states:
            raise ValueError("dataloader_state holds no LoaderDataset iterator state; pass "
                             "StatefulDataLoader(LoaderDataset(...)).state_dict()")
        position = self.loader.position()
        first = states[0].get("loader") if isinstance(states[0], dict) else None
        changed = (isinstance(first, dict) and first.get("fingerprint") != position.fingerprint
                   and callable(getattr(self.loader.source, "resumed", None)))
        if allow or changed:  # check the workers against the source they were saved with
            position = _saved_position(self.loader, dataloader_state, states)
        steps = [_check_iterator_state(s, position) for s in states]
        step_size = steps[0][1]
        if any(size != step_size for _, size in steps):
            raise ValueError(f"dataloader_state's workers were made for different steps "
                             f"({sorted({size for _, size in steps})}): not one DataLoader's state")
        epoch, consumed = min(step for step, _ in steps)
        since = dataloader_state.get("_steps_since_snapshot", 0)
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ValueError(f"dataloader_state has _steps_since_snapshot={since!r}; expected "
                             "an int >= 0")
        if since:
            plan = position.plan
            saved = Plan(plan.length, step_size, seed=plan.seed, shuffle=plan.shuffle,
                         drop_last=plan.drop_last, block_size=plan.block_size)
            epoch, consumed = saved.advance(epoch, consumed, since)
        position.epoch, position.consumed = epoch, consumed
        state = position.state_dict()
        if allow or changed:
            resume_source(self.loader.source, state, allow)  # raises naming what changed
        return state


def _saved_position(loader: Loader, dataloader_state: Any, states: list[Any]) -> Position:
    """A Position of the plan and source the workers' states were saved with
    (their length and fingerprint, and the saved source's description from a
    ``dataset_state``), to check them against when the source changed since."""
    loaders = [s.get("loader") for s in states if isinstance(s, dict)]
    saved = loaders[0] if loaders and isinstance(loaders[0], dict) else {}
    length = saved.get("length")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"LoaderDataset iterator state has loader.length={length!r}; "
                         "expected an int >= 0")
    description = None
    for found in _dataset_states(dataloader_state):
        if isinstance(found, dict) and found.get("fingerprint") == saved.get("fingerprint"):
            description = found.get("source")
            break
    if description is None:
        raise ValueError("dataloader_state holds no dataset_state with the saved source's "
                         "description (LoaderDataset.state_dict()): cannot resume a changed "
                         "source from it")
    plan = dataclasses.replace(loader.plan, length=length)
    return Position(plan, saved.get("fingerprint"), description)


def _dataset_states(dataloader_state: Any) -> list[Any]:
    """Every ``dataset_state`` in a StatefulDataLoader state (the main
    process's, each worker's)."""
    found = [dataloader_state.get("dataset_state")]
    snapshot = dataloader_state.get("_snapshot")
    if isinstance(snapshot, dict):
        main = snapshot.get("_main_snapshot")
        if isinstance(main, dict):
            found.append(main.get("dataset_state"))
        workers = snapshot.get("_worker_snapshots")
        if isinstance(workers, dict):
            found.extend(w.get("dataset_state") for w in workers.values() if isinstance(w, dict))
    return [f for f in found if f is not None]


def _check_iterator_state(state: Any, position: Position) -> tuple[tuple[int, int], int]:
    """A worker iterator state's next step ``(epoch, consumed)`` (checked against
    ``position``'s plan and source) and the step size it was made for;
    ValueError names the field that is missing or malformed."""
    if not isinstance(state, dict):
        raise ValueError(f"a LoaderDataset iterator state must be a dict, got "
                         f"{type(state).__name__}")
    if state.get("version") != _ITERATOR_VERSION:
        raise ValueError(f"LoaderDataset iterator state has version {state.get('version')!r}; "
                         f"this zerobatch reads version {_ITERATOR_VERSION}")
    if not isinstance(state.get("loader"), dict):
        raise ValueError("LoaderDataset iterator state has no 'loader' field (a dict, the "
                         "Loader state of the worker's next step)")
    step_size = state.get("step_size")
    if (isinstance(step_size, bool) or not isinstance(step_size, int)
            or not 1 <= step_size <= max(1, position.plan.length)):
        raise ValueError(f"LoaderDataset iterator state has step_size={step_size!r}; expected "
                         f"an int in [1, {max(1, position.plan.length)}]")
    for name in ("worker", "workers"):
        value = state.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"LoaderDataset iterator state has {name}={value!r}; expected "
                             "an int >= 0")
    end = state.get("end_epoch")
    if end is not None and (isinstance(end, bool) or not isinstance(end, int) or end < 0):
        raise ValueError(f"LoaderDataset iterator state has end_epoch={end!r}; expected an "
                         "int >= 0 or None")
    return position.check(state["loader"]), step_size


def _iterator_states(dataloader_state: Any) -> list[Any]:
    """The iterator states in a StatefulDataLoader state: one with no workers,
    one per worker with workers."""
    if not isinstance(dataloader_state, dict):
        raise ValueError(f"dataloader_state must be a dict from StatefulDataLoader.state_dict(),"
                         f" got {type(dataloader_state).__name__}")
    snapshot = dataloader_state.get("_snapshot")
    if isinstance(snapshot, dict):
        workers = snapshot.get("_worker_snapshots") or {}
        if not isinstance(workers, dict):
            raise ValueError(f"dataloader_state has _worker_snapshots of type "
                             f"{type(workers).__name__}; expected a dict")
        fetchers = [w.get("fetcher_state") for w in workers.values() if isinstance(w, dict)]
    else:
        fetchers = [dataloader_state.get("fetcher_state")]
    return [f.get("dataset_iter_state") for f in fetchers if isinstance(f, dict)]


class _WorkerSteps(Iterator[Any]):
    """Worker ``worker`` of ``workers``: steps ``worker, worker + workers, ...`` of
    ``loader``'s sequence from its current position, for ``loader.epochs`` epochs.

    ``state_dict()`` is JSON-able: the Loader state of the next step this
    worker produces, the step size (``batch_size * world_size``) it was made
    for, and the epoch where the pass ends.
    """

    def __init__(self, loader: Loader, worker: int, workers: int) -> None:
        self._loader = loader
        self._plan = loader.plan
        self._worker, self._workers = worker, workers
        self._position = loader.position()
        self._position.epoch, self._position.consumed = loader.step
        epochs = loader.epochs
        self._end = None if epochs is None else self._position.epoch + epochs
        self._skip(worker)

    def _skip(self, steps: int) -> None:
        position = self._position
        position.epoch, position.consumed = self._plan.advance(*position.step, steps)

    def __next__(self) -> Any:
        if self._end is not None and self._position.epoch >= self._end:
            raise StopIteration
        item = self._loader.produce(*self._position.step)
        self._skip(self._workers)
        return item

    def state_dict(self) -> dict[str, Any]:
        """This worker's next step (a Loader state), the step size, where the pass
        ends, and the worker's place (``worker`` of ``workers``). Without a
        stateful source's description (``"source"``): the main process's Loader
        holds it, and a large mixture's would be pickled at every step."""
        loader = self._position.state_dict()
        loader.pop("source", None)
        return {"version": _ITERATOR_VERSION, "loader": loader,
                "step_size": self._plan.step_size, "end_epoch": self._end,
                "worker": self._worker, "workers": self._workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the step ``state`` saved. ValueError names the field when it
        is malformed, and the fix when it was saved by another worker count or
        step size (``batch_size * world_size``; another split of the same step
        resumes here exactly)."""
        step, step_size = _check_iterator_state(state, self._position)
        if (state["worker"], state["workers"]) != (self._worker, self._workers):
            raise ValueError(
                f"iterator state of worker {state['worker']} of {state['workers']} loaded into "
                f"worker {self._worker} of {self._workers}; to resume with another "
                "num_workers, load the saved state into zerobatch.torch.DataLoader, or "
                "LoaderDataset.loader_state(dataloader_state) into the Loader"
            )
        if step_size != self._plan.step_size:
            raise ValueError(
                f"iterator state was made for steps of {step_size} observations (batch_size * "
                f"world_size), this loader takes {self._plan.step_size}; to resume with "
                "another step, load the saved state into zerobatch.torch.DataLoader, or "
                "LoaderDataset.loader_state(dataloader_state) into the Loader"
            )
        self._position.epoch, self._position.consumed = step
        self._end = state.get("end_epoch")  # absent: None, as checked


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader(LoaderDataset(loader), batch_size=None, ...)``
    whose main process moves ``loader`` past each batch as it yields it.

    ``state_dict()`` is the Loader's (JSON-able, O(1)): what this DataLoader
    has yielded, never what its workers prefetched. ``load_state_dict`` takes
    a Loader state, or a torchdata ``StatefulDataLoader`` state over a
    ``LoaderDataset``, saved with any ``num_workers``, ``world_size`` and
    ``batch_size``, and resumes exactly.

    Args:
        loader: the Loader (its batch_size, seed, rank and epochs apply).
        num_workers: worker processes (0: read in the main process).
        **kwargs: other ``torch.utils.data.DataLoader`` options (``pin_memory``,
            ``prefetch_factor``, ``multiprocessing_context``, ...); ``batch_size``,
            ``shuffle``, ``sampler``, ``collate_fn``, ``persistent_workers`` and
            ``in_order`` are the plan's and are refused.

    >>> # data = DataLoader(loader, num_workers=2); for batch in data: ...
    """

    _REFUSED = ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn",
                "drop_last", "persistent_workers", "in_order", "dataset")

    def __init__(self, loader: Loader, *, num_workers: int = 0, **kwargs: Any) -> None:
        refused = sorted(set(kwargs) & set(self._REFUSED))
        if refused:
            raise ValueError(f"zerobatch.torch.DataLoader takes no {', '.join(refused)}: "
                             "batching, order and epochs are the Loader's (set them there)")
        super().__init__(LoaderDataset(loader), batch_size=None, num_workers=num_workers,
                         **kwargs)
        self.loader = loader
        loader._stale = None  # this DataLoader moves it

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        loader = self.loader
        loader._refresh_rank()
        loader._stale = None
        position = loader._position
        for item in super().__iter__():
            position.received(*position.step)  # before the caller has it: a save now counts it
            yield item

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at ``epoch`` (``Loader.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The Loader's position after the last batch yielded (JSON-able)."""
        return self.loader._position.state_dict()

    def load_state_dict(self, state: dict[str, Any], *, allow: Any = ()) -> None:
        """Resume after ``state``: a Loader state, or a ``StatefulDataLoader`` state
        over a ``LoaderDataset`` (any worker count and step). ValueError names
        what does not fit; ``allow`` as ``Loader.load_state_dict``."""
        if isinstance(state, dict) and ("_snapshot" in state or "fetcher_state" in state):
            state = LoaderDataset.loader_state(self.dataset, state)  # type: ignore[arg-type]
        self.loader.load_state_dict(state, allow=allow)
