"""PyTorch tensors over tensor-file bytes.

Files are mapped copy-on-write (``mmap.ACCESS_COPY``): tensors share the
mapping's pages, are writable without a warning, and writes stay private to
the process. A device other than the CPU costs exactly one copy.
"""

from __future__ import annotations

import mmap
from functools import cache
from typing import Any

import numpy as np

from zerobatch.tensors._dtypes import DTYPES, code_of_numpy
from zerobatch.tensors._errors import SafetensorError
from zerobatch.tensors._to_numpy import F4_PAIRS

__all__ = ["ACCESS", "PACKED", "check_device", "convert", "take"]

ACCESS = mmap.ACCESS_COPY
"""How a file is mapped for this framework: private, copy-on-write."""

PACKED = True
"""torch has ``float4_e2m1fn_x2``: F4 tensors come as pairs per byte, last dimension halved."""

_SAME_SIZE_INT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


@cache
def _torch_dtype(dtype: np.dtype[Any]) -> Any:
    import torch

    if dtype == F4_PAIRS:
        return torch.float4_e2m1fn_x2
    code = code_of_numpy(dtype)
    if code is None:
        raise TypeError(f"no torch dtype for {dtype}")
    return getattr(torch, str(DTYPES[code].torch_name))


def check_device(device: str | int) -> str | int:
    """``device`` if torch knows it (``"cpu"``, ``"cuda:1"``, ``0``)."""
    import torch

    if not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"argument 'device': expected str or int, not {type(device).__name__}")
    try:
        torch.device(device)
    except RuntimeError:
        raise SafetensorError(f"device {device!r} is invalid", field="device") from None
    return device


def convert(array: np.ndarray[Any, Any], device: str | int) -> Any:
    """A ``torch.Tensor`` sharing ``array``'s memory (then moved to ``device``)."""
    import torch

    raw = array.view(_SAME_SIZE_INT[array.dtype.itemsize])
    if raw.size == 0:
        # NumPy gives empty arrays all-zero strides, and torch's .view(dtype) refuses
        # those: an empty tensor has no bytes to share, so it gets torch's own strides
        tensor = torch.empty(raw.shape, dtype=_torch_dtype(raw.dtype))
    else:
        if not raw.flags.aligned or any(stride < 0 for stride in raw.strides):
            raw = raw.copy()  # copy: torch needs aligned data and non-negative strides
        tensor = torch.from_numpy(raw)
    tensor = tensor.view(_torch_dtype(array.dtype))
    if device != "cpu" and torch.device(device).type != "cpu":
        tensor = tensor.to(device)
    return tensor


def take(array: np.ndarray[Any, Any], index: Any, device: str | int, *, path: object,
         name: str) -> Any:
    """``tensor[index]`` with torch's indexing rules, as safetensors 0.8.0 slices
    for ``"pt"`` (negative and clipped bounds, ``None``, lists and index tensors
    included; torch's own IndexError or ValueError otherwise), then moved to
    ``device``: only the part taken leaves the CPU."""
    part = convert(array, "cpu")[index]
    return part.to(device) if device != "cpu" else part
