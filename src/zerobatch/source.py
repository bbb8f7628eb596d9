"""Sources: the random-access protocol the plan reads from, and what every
iterable over a source shares (the step read, the identity a state stores,
the rank this process has).

A *source* is anything with ``__len__`` and ``read(indices) -> Batch``
(:class:`Source`): ``TokenWindows``, ``Documents``, ``BatchFileReader``, a
``Mixture`` or a user's own object. ``Loader``, ``zerobatch.torch`` and
``BatchServer`` all read a step through :func:`read_step`, so they read the same
rows at the same position.

**Ordered and stateful sources** (optional; a ``Mixture`` is both). A source
with ``ordered = True`` is already in training order: plans read it unshuffled
(:func:`plan_shuffle`). A source with ``state_dict()`` contributes its
JSON-able description to the one resume state: ``Position`` stores it under
``"source"`` (:func:`source_state`). If it also has ``resumed(saved, *,
epoch, consumed, allow)``, loading a state passes it the saved description
and the position, and it returns the source that continues that run (itself
when nothing changed, a new source otherwise; sources never change), or
raises ValueError naming what changed and what ``allow`` would accept
(:func:`resume_source`). Nothing else in the state is the source's.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from zerobatch.columnar import Batch
from zerobatch.plan import Plan

__all__ = ["Source", "describe", "fingerprint", "ordered_shuffle", "plan_shuffle", "read_indices",
           "read_step", "resolve_rank", "resume_source", "source_state"]

_DEFAULT_RANK = "default (single process)"  # resolve_rank's origin when nothing says more


@runtime_checkable
class Source(Protocol):
    """A random-access source: ``len(source)`` observations, ``read(indices)``
    returns them as one ``Batch`` (any order, repeats allowed), thread-safe.

    A source may also offer ``fingerprint`` (a str identifying its data, e.g. a
    manifest checksum); the loader stores it in its state and refuses to
    resume on a source with another fingerprint. A source with ``reads_wait =
    False`` says its reads never wait on I/O beyond local files (tens of
    microseconds): the Loader's automatic ``num_threads`` reads it in the
    caller's thread; without it, a source gets a reader thread.
    """

    def __len__(self) -> int: ...

    def read(self, indices: npt.NDArray[np.int64]) -> Batch: ...


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int, str]:
    """(rank, world_size, where they came from): explicit arguments win, then an
    initialized ``torch.distributed``, then ``RANK``/``WORLD_SIZE`` (torchrun),
    else 0 and 1."""
    if rank is not None or world_size is not None:
        return (0 if rank is None else rank), (1 if world_size is None else world_size), "arguments"
    dist = sys.modules.get("torch.distributed")  # never import torch just to ask
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "RANK/WORLD_SIZE"
        except ValueError:
            raise ValueError(
                f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                "must be ints; fix the environment or pass rank= and world_size="
            ) from None
    return 0, 1, _DEFAULT_RANK


def fingerprint(source: Any) -> str | None:
    """The identity a state stores for ``source``: its ``fingerprint`` attribute
    as a str, or None when it has none."""
    value = getattr(source, "fingerprint", None)
    return None if value is None else str(value)


def source_state(source: Any) -> dict[str, Any] | None:
    """The description a stateful source adds to the resume state (its
    ``state_dict()``), or None for a plain source."""
    describe = getattr(source, "state_dict", None)
    return describe() if callable(describe) else None


def describe(source: Any) -> tuple[str | None, dict[str, Any] | None]:
    """``(fingerprint(source), source_state(source))``: what a state stores
    about its source (``Position.of`` takes it when first asked)."""
    return fingerprint(source), source_state(source)


def plan_shuffle(source: Any, shuffle: bool | None) -> bool:
    """The plan's ``shuffle`` for ``source``: ``shuffle`` (None: True), except
    that an ordered source is read in order; asking to shuffle one is a
    ValueError (its order is its own: shuffling it again would break it)."""
    return ordered_shuffle(bool(getattr(source, "ordered", False)), shuffle,
                           f"a {type(source).__name__}")


def ordered_shuffle(ordered: bool, shuffle: bool | None, what: str = "the source") -> bool:
    """:func:`plan_shuffle` from the source's ``ordered`` flag (a client that
    knows the served source only by its answers); ``what`` names it in the error."""
    if ordered:
        if shuffle:
            raise ValueError(f"shuffle=True: {what} orders itself (its positions are "
                             "already shuffled); leave shuffle unset or False")
        return False
    return True if shuffle is None else bool(shuffle)


def resume_source(source: Any, state: Any, allow: Any = ()) -> Any:
    """The source that continues the run ``state`` saved (a Position state):
    ``source.resumed(state["source"], ...)`` for a source that can resume
    (see the module docstring), else ``source`` itself. ValueError when
    ``allow`` names changes but the source cannot resume changed."""
    resumed = getattr(source, "resumed", None)
    saved = state.get("source") if isinstance(state, dict) else None
    if not callable(resumed) or saved is None:
        if allow:
            raise ValueError(f"allow={allow!r}: only a source that resumes changed (a Mixture) "
                             f"accepts changes, and this state has "
                             f"{'no source description' if saved is None else 'one'} for a "
                             f"{type(source).__name__}")
        return source
    return resumed(saved, epoch=state.get("epoch"), consumed=state.get("consumed"),
                   allow=allow)


def read_step(source: Any, plan: Plan, epoch: int, consumed: int, rank: int) -> Batch:
    """Rank ``rank``'s batch of ``epoch``'s step starting at global position
    ``consumed``, read from ``source``; with ``plan.drop_last`` False it gains the
    boolean ``padding`` column (True on rows that pad the epoch's last step).
    What the Loader, ``zerobatch.torch`` and ``BatchServer`` read at a step."""
    indices, padding = plan.indices(epoch, consumed, rank)
    return read_indices(source, indices, None if plan.drop_last else padding)


def read_indices(source: Any, indices: npt.NDArray[np.int64],
          padding: npt.NDArray[np.bool_] | None) -> Batch:
    """``source.read(indices)``, with the ``padding`` column unless it is None."""
    batch = source.read(indices)
    if padding is None:
        return batch
    columns = batch.to_numpy()
    columns["padding"] = padding
    return Batch.from_columns(columns, batch.meta)
