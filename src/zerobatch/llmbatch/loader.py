"""``BatchNativeLoader``: seed 000's loader of LLMBATCH files, block-shuffled
batches split across ranks, with exact resume."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from zerobatch._output_dtype import CASTS, output_dtype
from zerobatch.llmbatch.reader import BatchFileReader
from zerobatch.plan import Plan
from zerobatch.shuffle import BlockShuffle, Feistel

__all__ = ["BatchNativeLoader"]

_STATE_VERSION = 1


class BatchNativeLoader:
    """Iterate a batch file's batches in block-shuffled order.

    Blocks of ``block_size`` consecutive batches are visited in the order of a
    permutation seeded by ``zerobatch.plan.epoch_seed(seed, epoch)``; batches
    inside a block are read in file order, so the kernel's readahead (and
    ``MADV_WILLNEED`` hints issued ``readahead_bytes`` ahead) stream them from
    disk. With ``world_size`` ranks,
    rank ``r`` takes positions ``r, r + world_size, ...`` of that order and every
    rank yields the same number of batches; up to ``world_size - 1`` batches at
    the tail of an epoch are dropped. What a rank yields depends only on
    (seed, epoch, position, rank, world_size): ranks never talk.

    Yields int64 tensors by default; ``dtype="int32"`` (or ``torch.int32``,
    ``np.int32``) gives zero-copy tensors; ``output="numpy"`` gives read-only
    views of the stored tokens. ``state_dict()`` counts what the caller received; after
    ``load_state_dict`` iteration continues exactly there, also with another
    ``world_size``. Not thread-safe: iterate from one thread.
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
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        if output not in ("torch", "numpy"):
            raise ValueError(f"output must be 'torch' or 'numpy', got {output!r}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        out = output_dtype("int64" if dtype is None else dtype, allowed=CASTS)
        self.reader = BatchFileReader(path, storage_options=storage_options)
        self.block_size = block_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.dtype = out
        self.output = output
        self.readahead_batches = max(1, readahead_bytes // self.reader.padded_batch_bytes)
        self._epoch = epoch
        self._consumed = 0  # positions of the epoch's order that all ranks together have received
        self._exhausted = False

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order. A new epoch starts from its beginning; setting
        the current epoch again keeps a resumed position."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self._epoch:
            self._epoch = epoch
            self._consumed, self._exhausted = 0, False

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch."""
        return self.reader.num_batches // self.world_size

    def _order(self) -> BlockShuffle | Feistel | None:
        """The epoch's block-shuffled order, from the plan (seeded by (seed, epoch) mixed)."""
        plan = Plan(self.reader.num_batches, 1, world_size=self.world_size, seed=self.seed,
                    shuffle=self.shuffle, block_size=self.block_size)
        return plan.order(self._epoch)

    def __iter__(self) -> Iterator[Any]:
        n, world = self.reader.num_batches, self.world_size
        if self._exhausted:  # this loader finished the epoch: iterating again replays it
            self._consumed, self._exhausted = 0, False
        start = self._consumed
        stop = start + (n - start) // world * world
        order = self._order()
        read = self._read_function()
        self.reader.discard_private_writes()  # int32 tensors of a past pass may have been edited
        window = (0, 0)  # advised batches [start, refresh): advise again outside it
        chunk = 256 * world
        for chunk_start in range(start, stop, chunk):
            positions = np.arange(chunk_start + self.rank, min(stop, chunk_start + chunk), world)
            batches = order(positions) if order is not None else positions
            for batch_index in batches.tolist():
                if not window[0] <= batch_index < window[1]:
                    window = self._advise(batch_index)
                item = read(batch_index)
                self._consumed += world
                yield item
        self._exhausted = True

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

    def state_dict(self) -> dict[str, int | bool]:
        """JSON-able position: what the caller has received so far this epoch."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "consumed": self._consumed,
            "seed": self.seed,
            "block_size": self.block_size,
            "shuffle": self.shuffle,
            "num_batches": self.reader.num_batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()`` output, with this loader's rank and world_size."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unknown loader state version {state.get('version')!r}")
        for key in ("seed", "block_size", "shuffle", "num_batches"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise ValueError(
                    f"state was saved with {key}={state.get(key)!r}, this loader has {mine!r}; "
                    "resuming would not continue the same order"
                )
        consumed = state.get("consumed")
        if not isinstance(consumed, int) or not 0 <= consumed <= self.reader.num_batches:
            raise ValueError(f"state has consumed={consumed!r}, outside [0, num_batches]")
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"state has epoch={epoch!r}; expected an int >= 0")
        self._epoch = epoch
        self._consumed, self._exhausted = consumed, False

    def close(self) -> None:
        """Close the underlying reader (idempotent)."""
        self.reader.close()

    def __enter__(self) -> BatchNativeLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
