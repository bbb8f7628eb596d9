"""JAX arrays from tensor-file bytes: one copy onto the device (which on the
CPU backend may alias the read-only mapping instead). JAX is imported lazily."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from zerobatch.tensors._slicing import basic_index

__all__ = ["ACCESS", "PACKED", "check_device", "convert", "take"]

ACCESS = mmap.ACCESS_READ
"""How a file is mapped for this framework: shared and read-only."""


PACKED = False
"""JAX has no packed 4-bit type here: F4 tensors are refused."""


def check_device(device: str | int) -> str | int:
    """``device`` as given; JAX resolves it when a tensor is placed."""
    if not isinstance(device, (str, int)):
        raise TypeError(f"argument 'device': expected str or int, not {type(device).__name__}")
    return device


def convert(array: np.ndarray[Any, Any], device: str | int) -> Any:
    """``array`` placed on ``device``: ``"cpu"``, ``"gpu"``, or ``"gpu:1"``-style."""
    import jax

    platform, _, number = str(device).partition(":")
    target = jax.devices(platform)[int(number or 0)]
    return jax.device_put(array, target)


def take(array: np.ndarray[Any, Any], index: Any, device: str | int, *, path: object,
         name: str) -> Any:
    """``array[index]`` for the indexes safetensors 0.8.0 accepts for this
    framework (``_slicing``), placed as :func:`convert` places it."""
    spelled = basic_index(index, array.shape, path=path, name=name)
    # the trailing ... keeps all-int indexes a 0-d view, not a NumPy scalar
    return convert(array[(*spelled, Ellipsis)], device)
