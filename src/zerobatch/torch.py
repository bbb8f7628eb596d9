"""PyTorch adapter: a Loader's plan as an ``IterableDataset`` for ``DataLoader`` workers.

``LoaderDataset(loader)`` yields the same batches, in the same order, as
iterating ``loader`` itself, through
``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=k)``: worker
``w`` of ``k`` produces steps ``w, w + k, w + 2k, ...`` of the rank's
sequence, and the DataLoader's round robin puts them back in order. Batching
and shuffling stay in the plan, so ``batch_size=None`` is required.

Each worker reads in its own thread (no prefetch threads inside workers). Each
pass starts from the loader's state (``loader.load_state_dict`` before
building the DataLoader resumes there, with any worker count) and runs
``loader.epochs`` epochs; the workers never move the loader itself, so call
``loader.set_epoch(e)`` before each pass, or build it with ``epochs=None``
(or ``epochs=N`` for the whole run and one pass). WARNING: with
``persistent_workers=True`` the workers keep the loader they started with, and
``set_epoch`` in the main process does not reach them.

Resume through ``torchdata.stateful_dataloader.StatefulDataLoader``: the
dataset and the iterators it returns implement that loader's protocol
(``state_dict`` and ``load_state_dict`` on both). Each worker's iterator state
is the Loader state of the next step it would produce, so the DataLoader's
state counts the batches its main process yielded, never the ones its workers
had prefetched, and ``StatefulDataLoader.load_state_dict`` with the same
``num_workers`` continues exactly. :meth:`LoaderDataset.loader_state` turns
such a state into the one global position of the Loader, which resumes with
any ``num_workers``::

    data = StatefulDataLoader(LoaderDataset(loader), batch_size=None, num_workers=2)
    ...
    saved = data.state_dict()
    # later, with any worker count:
    loader.load_state_dict(LoaderDataset(loader).loader_state(saved))
    data = StatefulDataLoader(LoaderDataset(loader), batch_size=None, num_workers=4)

WARNING: the StatefulDataLoader must keep its default ``in_order=True``: the
position assumes the round robin's order.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from zerobatch.loader import Loader
from zerobatch.plan import Position

__all__ = ["LoaderDataset", "TorchOutput"]

_ITERATOR_VERSION = 1


class LoaderDataset(torch.utils.data.IterableDataset):
    """The steps of ``loader`` (see the module docstring), split over DataLoader workers.

    ``state_dict``/``load_state_dict`` are the loader's own (where a new
    iteration starts); the iterators add their worker's next step.
    """

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> _WorkerSteps:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return _WorkerSteps(self.loader, worker, workers)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state (JSON-able)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Move the loader to ``state`` (as ``Loader.load_state_dict``)."""
        self.loader.load_state_dict(state)

    def loader_state(self, dataloader_state: dict[str, Any]) -> dict[str, Any]:
        """The Loader state inside ``StatefulDataLoader.state_dict()`` over this
        dataset, with any ``num_workers``: the step after the last batch its main
        process yielded (also with ``snapshot_every_n_steps`` above 1).
        ``loader.load_state_dict`` of it resumes with any worker count.

        ValueError when ``dataloader_state`` holds no LoaderDataset position.
        """
        states = _iterator_states(dataloader_state)
        if not states or any(not isinstance(s, dict) or "loader" not in s for s in states):
            raise ValueError("dataloader_state holds no LoaderDataset iterator state; pass "
                             "StatefulDataLoader(LoaderDataset(...)).state_dict()")
        position = Position(self.loader.plan, self.loader.fingerprint)
        position.epoch, position.consumed = min(position.check(s["loader"]) for s in states)
        for _ in range(int(dataloader_state.get("_steps_since_snapshot", 0))):
            position.received(*position.step)
        return position.state_dict()


def _iterator_states(dataloader_state: dict[str, Any]) -> list[Any]:
    """The iterator states in a StatefulDataLoader state: one with no workers,
    one per worker with workers."""
    if not isinstance(dataloader_state, dict):
        return []
    snapshot = dataloader_state.get("_snapshot")
    if isinstance(snapshot, dict):
        workers = snapshot.get("_worker_snapshots") or {}
        fetchers = [w.get("fetcher_state") for w in workers.values() if isinstance(w, dict)]
    else:
        fetchers = [dataloader_state.get("fetcher_state")]
    return [f.get("dataset_iter_state") for f in fetchers if isinstance(f, dict)]


class _WorkerSteps(Iterator[Any]):
    """Worker ``worker`` of ``workers``: steps ``worker, worker + workers, ...`` of
    ``loader``'s sequence from its current position, for ``loader.epochs`` epochs.

    ``state_dict()`` is JSON-able: the Loader state of the next step this
    worker produces, and the epoch where the pass ends.
    """

    def __init__(self, loader: Loader, worker: int, workers: int) -> None:
        self._loader = loader
        self._worker, self._workers = worker, workers
        self._position = Position(loader.plan, loader.fingerprint)
        self._position.load_state_dict(loader.state_dict())
        epochs = loader.epochs
        self._end = None if epochs is None else self._position.epoch + epochs
        self._skip(worker)

    def _skip(self, steps: int) -> None:
        for _ in range(steps):
            self._position.received(*self._position.step)

    def __next__(self) -> Any:
        if self._end is not None and self._position.epoch >= self._end:
            raise StopIteration
        item = self._loader.produce(*self._position.step)
        self._skip(self._workers)
        return item

    def state_dict(self) -> dict[str, Any]:
        """This worker's next step (a Loader state), where the pass ends, and the
        worker's place (``worker`` of ``workers``)."""
        return {"version": _ITERATOR_VERSION, "loader": self._position.state_dict(),
                "end_epoch": self._end, "worker": self._worker, "workers": self._workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the step ``state`` saved. ValueError when it was saved by
        another worker count (resume those through :meth:`LoaderDataset.loader_state`)."""
        if not isinstance(state, dict) or state.get("version") != _ITERATOR_VERSION:
            raise ValueError(f"not a LoaderDataset iterator state of version "
                             f"{_ITERATOR_VERSION}: {state!r:.200}")
        if (state.get("worker"), state.get("workers")) != (self._worker, self._workers):
            raise ValueError(
                f"iterator state of worker {state.get('worker')!r} of {state.get('workers')!r} "
                f"loaded into worker {self._worker} of {self._workers}; to resume with "
                "another num_workers, load LoaderDataset.loader_state(dataloader_state) "
                "into the Loader"
            )
        end = state.get("end_epoch")
        if end is not None and (isinstance(end, bool) or not isinstance(end, int)):
            raise ValueError(f"iterator state has end_epoch={end!r}; expected an int or None")
        self._position.load_state_dict(state["loader"])
        self._end = end


class TorchOutput:
    """``Loader(source, batch_size, output=TorchOutput(pin_memory=True,
    device="cuda"))``: each step as a dict of tensors sharing the batch's
    memory, pinned in the reader threads (``pin_memory``) and copied to
    ``device`` without blocking. ``output="torch"`` is ``TorchOutput()``.
    Without CUDA, ``pin_memory=True`` warns once and yields unpinned tensors.
    Immutable."""

    _warned_pin = False

    def __init__(self, *, pin_memory: bool = False, device: Any = None) -> None:
        self.pin_memory = bool(pin_memory)
        self.device = None if device is None else torch.device(device)

    def __repr__(self) -> str:
        return f"TorchOutput(pin_memory={self.pin_memory}, device={self.device})"

    def ranks(self) -> None:
        """No rank of its own: the Loader resolves it (torch.distributed, RANK)."""
        return None

    def bind(self, plan: Any, source: Any) -> Any:
        """The converter of each step's ``Batch``."""
        pin_memory, device = self.pin_memory, self.device
        if pin_memory and not torch.cuda.is_available():
            if not TorchOutput._warned_pin:
                warnings.warn("pin_memory=True but no CUDA device is available: batches are "
                              "not pinned", stacklevel=5)
                TorchOutput._warned_pin = True
            pin_memory = False
        return lambda batch: batch.to_torch(pin_memory=pin_memory, device=device)
