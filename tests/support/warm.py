"""Warm the Numba kernels a subprocess test's ranks will call, in the test's
own process first: with a cold on-disk cache (a fresh clone) every rank of a
torchrun job would otherwise compile the same kernels at once."""

from __future__ import annotations

from pathlib import Path

from zerobatch import Loader, open_dataset


def warm_windows(corpus: Path, seq_len: int, batch_size: int) -> None:
    """One batch of the default Loader over ``corpus``'s windows (torch
    output), so the kernels it compiles are in the cache the ranks load."""
    with open_dataset(corpus) as dataset, Loader(dataset.windows(seq_len), batch_size) as loader:
        next(iter(loader))
