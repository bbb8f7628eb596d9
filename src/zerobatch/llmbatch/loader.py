"""``BatchNativeLoader``: seed 000's loader of LLMBATCH files, block-shuffled
batches split across ranks, with exact resume."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from zerobatch._output_dtype import CASTS, output_dtype
from zerobatch.llmbatch.reader import BatchFileReader
from zerobatch.plan import Plan, Position

__all__ = ["BatchNativeLoader"]


class BatchNativeLoader:
    """Iterate a batch file's batches in block-shuffled order.

    The order and the rank split are :class:`zerobatch.plan.Plan`'s over the
    file's batches, one batch per step and rank: blocks of ``block_size``
    consecutive batches are visited in the order of a permutation seeded by
    ``zerobatch.plan.epoch_seed(seed, epoch)`` (``seed`` is the *shuffle* seed
    of reading, not the file's *write* seed), and batches inside a block are
    read in file order, so the kernel's readahead (and ``MADV_WILLNEED`` hints
    issued ``readahead_bytes`` ahead) stream them from disk. With
    ``world_size`` ranks, rank ``r`` takes positions ``r, r + world_size, ...``
    of that order and every rank yields the same number of batches; up to
    ``world_size - 1`` batches at the tail of an epoch are dropped. What a rank
    yields depends only on (seed, epoch, position, rank, world_size): ranks
    never talk.

    Yields int64 tensors by default; ``dtype="int32"`` (or ``torch.int32``,
    ``np.int32``) gives zero-copy tensors; ``output="numpy"`` gives read-only
    views of the stored tokens. Each batch is ``[batch_size, seq_len]`` stored
    tokens, not split into ``input_ids`` and ``labels``: seed 000's loop takes
    ``batch[:, :-1]`` and ``batch[:, 1:]``.

    ``state_dict()`` is :class:`zerobatch.plan.Position`'s, the state every
    zerobatch iterable shares: a ``Loader(BatchFileReader(path), 1,
    block_size=...)`` resumes from it and it from the Loader's, also with
    another ``world_size``. It counts what the caller received; once an epoch
    is done it names the next epoch's start, while iterating again without
    :meth:`set_epoch` replays the epoch (seed 000's loop calls ``set_epoch``).
    States of the older form (``num_batches``, no fingerprint) still load.
    Not thread-safe: iterate from one thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        block_size: int = 256,
        shuffle: bool = True,
        seed: int = 42,
        epoch: int = 0,
        *,
        rank: int = 0,
        world_size: int = 1,
        dtype: Any = None,
        output: Literal["torch", "numpy"] = "torch",
        readahead_bytes: int = 32 * 2**20,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        if output not in ("torch", "numpy"):
            raise ValueError(f"output must be 'torch' or 'numpy', got {output!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        out = output_dtype("int64" if dtype is None else dtype, allowed=CASTS)
        self.reader = BatchFileReader(path, storage_options=storage_options)
        try:
            plan = Plan(self.reader.num_batches, 1, world_size=world_size, seed=seed,
                        shuffle=shuffle, block_size=block_size if shuffle else None)
            self.rank = plan.check_rank(rank)
        except BaseException:
            self.reader.close()
            raise
        self.block_size = block_size
        self.shuffle = shuffle
        self.seed = seed
        self.world_size = world_size
        self.dtype = out
        self.output = output
        self.readahead_batches = max(1, readahead_bytes // self.reader.padded_batch_bytes)
        self._position = Position(plan, self.reader.fingerprint)
        self._position.start_epoch(epoch)
        self._epoch = epoch  # the epoch iterating yields (set_epoch); the position may be past it

    @property
    def plan(self) -> Plan:
        """The plan: one batch of the file per step and rank."""
        return self._position.plan

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order. A new epoch starts from its beginning; setting
        the current epoch again keeps a resumed position."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self._position.epoch:
            self._position.start_epoch(epoch)
        self._epoch = epoch

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch."""
        return self.plan.steps(0)

    def __iter__(self) -> Iterator[Any]:
        position = self._position
        if position.epoch != self._epoch:  # this epoch is done: iterating again replays it
            position.start_epoch(self._epoch)
        read = self._read_function()
        self.reader.discard_private_writes()  # int32 tensors of a past pass may have been edited
        window = (0, 0)  # advised batches [start, refresh): advise again outside it
        for _, after, indices, _ in position.planned(1, self.rank):
            batch_index = int(indices[0])
            if not window[0] <= batch_index < window[1]:
                window = self._advise(batch_index)
            item = read(batch_index)
            position.epoch, position.consumed = after
            yield item

    def _advise(self, batch_index: int) -> tuple[int, int]:
        """Hint the kernel to read ahead from ``batch_index`` to the end of its block
        (at most ``readahead_batches``); returns the range in which to advise no more:
        the whole window when it reaches the block end, else its first half."""
        n = self.reader.num_batches
        block_end = (batch_index // self.block_size + 1) * self.block_size if self.shuffle else n
        block_end = min(block_end, n)
        end = min(block_end, batch_index + self.readahead_batches)
        self.reader.advise(batch_index, end - batch_index)
        refresh = end if end == block_end else batch_index + max(1, (end - batch_index) // 2)
        return batch_index, refresh

    def _read_function(self) -> Any:
        if self.output == "numpy":
            return self.reader.read_batch
        import torch

        dtype, reader = self.dtype, self.reader
        if dtype == np.int64:
            return lambda i: torch.from_numpy(reader.read_batch(i).astype(np.int64))
        return lambda i: reader.read_batch_torch(i, dtype)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position of what the caller has received
        (:meth:`zerobatch.plan.Position.state_dict`). O(1)."""
        return self._position.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after what ``state`` says was received, with this
        loader's rank and world_size. ValueError names what differs when the
        state belongs to another file, seed, order or version."""
        self._position.load_state_dict(self._current_form(state))
        self._epoch = self._position.epoch

    def _current_form(self, state: Any) -> Any:
        """``state`` in Position's form: one of the older form (``num_batches``,
        no ``length`` or fingerprint) gets this file's, after its own fields are
        checked by Position."""
        if not isinstance(state, dict) or "num_batches" not in state or "length" in state:
            return state
        old = dict(state)
        old["length"] = old.pop("num_batches")
        old["fingerprint"] = self._position.fingerprint
        if not self.shuffle and old.get("shuffle") is False:
            old["block_size"] = None  # the older form stored block_size unshuffled too
        return old

    def close(self) -> None:
        """Close the underlying reader (idempotent)."""
        self.reader.close()

    def __enter__(self) -> BatchNativeLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
