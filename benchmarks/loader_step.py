"""What the plan and a Loader at 0 threads cost per step alone, in CPU time.

The source's read returns one prebuilt batch, so nothing but the plan, the
Loader's iterator and its state moves. CPU seconds of this process
(``time.process_time``), best of 7 passes of 20,000 steps: other processes on a
loaded machine disturb it less than wall time. Run it on two trees to compare
two versions of the Loader, interleaved::

    PYTHONPATH=OLD/src python benchmarks/loader_step.py old
    PYTHONPATH=NEW/src python benchmarks/loader_step.py new
"""

from __future__ import annotations

import sys
import time

import numpy as np
import numpy.typing as npt

from zerobatch import Batch, Loader

STEPS, PASSES = 20_000, 7


class Prebuilt:
    """10^9 observations whose every read returns the same batch of 32 x 2,048."""

    def __init__(self) -> None:
        self.batch = Batch.from_columns({"input_ids": np.zeros((32, 2048), np.int64)})

    def __len__(self) -> int:
        return 10**9

    def read(self, indices: npt.NDArray[np.int64]) -> Batch:
        return self.batch


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this tree"
    source, best = Prebuilt(), float("inf")
    for _ in range(PASSES):
        steps = iter(Loader(source, 32, seed=0, num_threads=0, prefetch=0, output="batch"))
        start = time.process_time()
        for _ in range(STEPS):
            next(steps)
        best = min(best, time.process_time() - start)
    print(f"{label}: plan + Loader at 0 threads, {best / STEPS * 1e6:.2f} us of CPU a step")


if __name__ == "__main__":
    main()
