"""``zerobatch bench``: shuffled-window read throughput of a dataset on this
machine, against the memory-copy limit measured in the same run."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.shuffle import Feistel
from zerobatch.stream.manifest import is_dataset

__all__ = ["BenchResult", "bench"]


@dataclass(frozen=True)
class BenchResult:
    """Throughput in bytes/s of token reads and of ``np.copyto`` of as many bytes."""

    what: str
    batches: int
    batch_bytes: int
    read_bytes_per_s: float
    copy_bytes_per_s: float

    def table(self) -> str:
        """The result as lines for people."""
        ratio = self.read_bytes_per_s / self.copy_bytes_per_s
        return "\n".join([
            f"source             {self.what}",
            f"batches read       {self.batches:,} ({self.batch_bytes:,} token bytes each)",
            f"shuffled reads     {self.read_bytes_per_s / 1e9:.3f} GB/s",
            f"memory-copy limit  {self.copy_bytes_per_s / 1e9:.3f} GB/s (np.copyto, same bytes)",
            f"ratio              {ratio:.3f} of the copy limit",
        ])


def _timed(step: Callable[[int], None], seconds: float, limit: int) -> tuple[int, float]:
    step(0)  # warm up: compile kernels, open files
    count, started = 0, time.perf_counter()
    while count < limit and (count == 0 or time.perf_counter() - started < seconds):
        step(count)
        count += 1
    return count, time.perf_counter() - started


def bench(
    path: str | os.PathLike[str], *, seq_len: int = 2048, batch_size: int = 16,
    seconds: float = 2.0, seed: int = 0,
) -> BenchResult:
    """Read globally shuffled batches for about ``seconds`` and time them; then
    time ``np.copyto`` of the same number of bytes per batch as often."""
    from zerobatch.stream.reader import Dataset, open_dataset

    folder = Path(path)
    if not is_dataset(folder):
        raise FormatError("bench needs a token-stream dataset folder", path=path)
    with open_dataset(folder) as dataset:
        assert isinstance(dataset, Dataset)  # is_dataset: a manifest, not a .npy folder
        windows = dataset.windows(seq_len, dtype="stored")
        if len(windows) < batch_size:
            raise ValueError(f"{folder} has {len(windows)} windows of {seq_len} tokens, fewer "
                             f"than batch_size={batch_size}; pass a smaller --seq-len")
        order = Feistel(len(windows), seed)
        steps = len(windows) // batch_size
        batch_bytes = batch_size * (seq_len + 1) * dataset.manifest.token_dtype.itemsize

        def read(i: int) -> None:
            positions = np.arange(i % steps * batch_size, (i % steps + 1) * batch_size)
            windows.read(order(positions))

        count, took = _timed(read, seconds, 1 << 30)
    source = np.random.default_rng(seed).integers(0, 255, batch_bytes * 8, dtype=np.uint8)
    target = np.empty(batch_bytes, dtype=np.uint8)

    def copy(i: int) -> None:
        start = i % 8 * batch_bytes
        np.copyto(target, source[start:start + batch_bytes])

    copies, copy_took = _timed(copy, seconds, 1 << 30)
    return BenchResult(f"{folder} windows of {seq_len} tokens x {batch_size}", count,
                       batch_bytes, count * batch_bytes / took, copies * batch_bytes / copy_took)
