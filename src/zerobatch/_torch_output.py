"""``TorchOutput``: a Loader's steps as torch tensors, pinned and moved to a
device. Exported as ``zerobatch.torch.TorchOutput``; a module of its own so the
Loader can build it for the deprecated ``pin_memory=``/``device=`` keywords
without importing the ``DataLoader`` adapter (which imports the Loader)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["TorchOutput"]


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
