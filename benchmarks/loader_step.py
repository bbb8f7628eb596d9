"""What the plan and a Loader at 0 threads cost per step alone, in CPU time.

The source's read returns one prebuilt batch, so nothing but the plan, the
Loader's iterator and its state moves. CPU seconds of this process
(``time.process_time``), best of 7 passes of 20,000 steps: other processes on a
loaded machine disturb it less than wall time. Cases: batch sizes 8, 32 and
512 on one rank, and batch 32 as rank 3 of 8. Run it on two trees to compare
two versions of the Loader, interleaved::

    PYTHONPATH=OLD/src python benchmarks/loader_step.py old
    PYTHONPATH=NEW/src python benchmarks/loader_step.py new

Each run draws ``docs/img/loader_step.png`` (the last run's figures).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import numpy.typing as npt
from _plot import bars

from zerobatch import Batch, Loader

STEPS, PASSES = 20_000, 7
CASES = (("batch 8", 8, 1), ("batch 32", 32, 1), ("batch 512", 512, 1),
         ("batch 32, rank 3 of 8", 32, 8))


class Prebuilt:
    """10^9 observations whose every read returns the same batch of 32 x 2,048."""

    def __init__(self) -> None:
        self.batch = Batch.from_columns({"input_ids": np.zeros((32, 2048), np.int64)})

    def __len__(self) -> int:
        return 10**9

    def read(self, indices: npt.NDArray[np.int64]) -> Batch:
        return self.batch


def step_cost(batch_size: int, world_size: int) -> float:
    """Best CPU seconds a step over ``PASSES`` passes of ``STEPS`` steps."""
    source, best = Prebuilt(), float("inf")
    for _ in range(PASSES):
        steps = iter(Loader(source, batch_size, seed=0, num_threads=0, prefetch=0,
                            output="batch", world_size=world_size, rank=min(3, world_size - 1)))
        start = time.process_time()
        for _ in range(STEPS):
            next(steps)
        best = min(best, time.process_time() - start)
    return best / STEPS


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this tree"
    costs = {}
    for case, batch_size, world_size in CASES:
        costs[f"zerobatch, {case}"] = step_cost(batch_size, world_size) * 1e6
        print(f"{label}: plan + Loader at 0 threads, {case}: "
              f"{costs[f'zerobatch, {case}']:.2f} us of CPU a step")
    bars("loader_step", costs, xlabel="us of CPU a step (best of 7 passes of 20,000 steps)",
         title=f"The plan and the Loader alone, 0 threads, the read prebuilt ({label})")


if __name__ == "__main__":
    main()
