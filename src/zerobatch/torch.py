"""PyTorch adapter: a Loader's plan as an ``IterableDataset`` for ``DataLoader`` workers.

``LoaderDataset(loader)`` yields the same batches, in the same order, as
iterating ``loader`` itself, through
``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=k)``: worker
``w`` of ``k`` produces steps ``w, w + k, w + 2k, ...`` of the rank's
sequence, and the DataLoader's round robin puts them back in order. Batching
and shuffling stay in the plan, so ``batch_size=None`` is required.

Each worker reads in its own thread (no prefetch threads inside workers). The
position starts from the loader's state (``loader.load_state_dict`` before
building the DataLoader resumes there, with any worker count).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data

from zerobatch.loader import Loader

__all__ = ["LoaderDataset"]


class LoaderDataset(torch.utils.data.IterableDataset):
    """The steps of ``loader`` (see the module docstring), split over DataLoader workers."""

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for step, (epoch, consumed) in enumerate(self.loader.steps()):
            if step % workers == worker:
                yield self.loader.produce(epoch, consumed)
