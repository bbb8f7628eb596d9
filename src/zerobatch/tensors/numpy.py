"""Drop-in for ``safetensors.numpy``: change only the import.

Same functions, arguments, defaults and return values as safetensors 0.8.0
(``save``, ``save_file``, ``load``, ``load_file``), the same bytes written.
Differences: ``load_file`` with the default ``backend="mmap"`` returns
read-only views of the file instead of copies (``backend="pread"`` gives
writable copies); arrays that are not C-contiguous are written in C order
(safetensors writes their memory as it lies). ``format="bintensors"`` writes
bintensors files instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from zerobatch.tensors._dropin import DropIn, TensorSpec, deserialize, serialize, serialize_file
from zerobatch.tensors._open import safe_open
from zerobatch.tensors.format import SAFETENSORS, SafetensorError

__all__ = [
    "SafetensorError",
    "TensorSpec",
    "deserialize",
    "load",
    "load_file",
    "safe_open",
    "save",
    "save_file",
    "serialize",
    "serialize_file",
]

_NUMPY = DropIn("np", "tensor_dict", "a numpy.ndarray", lambda a: isinstance(a, np.ndarray))


def save(tensor_dict: Mapping[str, np.ndarray[Any, Any]],
         metadata: Mapping[str, str] | None = None, *, format: str = SAFETENSORS) -> bytes:
    """The file bytes for ``tensor_dict``."""
    return _NUMPY.save(tensor_dict, metadata, format)


def save_file(tensor_dict: Mapping[str, np.ndarray[Any, Any]],
              filename: str | os.PathLike[str], metadata: Mapping[str, str] | None = None, *,
              format: str = SAFETENSORS) -> None:
    """Write ``tensor_dict`` to ``filename`` (atomically: nothing appears on error)."""
    _NUMPY.save_file(tensor_dict, filename, metadata, format)


def load(data: bytes) -> dict[str, np.ndarray[Any, Any]]:
    """All arrays in ``data`` (file bytes): read-only views of it."""
    return _NUMPY.load(data)


def load_file(filename: Any, *, backend: str = "mmap") -> dict[str, np.ndarray[Any, Any]]:
    """All arrays in ``filename`` (a path or binary file object)."""
    return _NUMPY.load_file(filename, "cpu", backend)
