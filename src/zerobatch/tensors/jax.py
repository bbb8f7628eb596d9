"""Drop-in for ``safetensors.flax`` (JAX arrays): change only the import.

Same functions, arguments, defaults and return values as safetensors 0.8.0
(``save``, ``save_file``, ``load``, ``load_file``), the same bytes written;
``zerobatch.tensors.flax`` is this module under the name safetensors uses.
``format="bintensors"`` writes bintensors files instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

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

_JAX = DropIn("jax", "tensors", "a jax.Array",
                 lambda a: hasattr(a, "dtype") and hasattr(a, "shape"))


def save(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None, *,
         format: str = SAFETENSORS) -> bytes:
    """The file bytes for ``tensors`` (each copied to the host once)."""
    return _JAX.save(tensors, metadata, format)


def save_file(tensors: Mapping[str, Any], filename: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None, *, format: str = SAFETENSORS) -> None:
    """Write ``tensors`` to ``filename`` (atomically: nothing appears on error)."""
    _JAX.save_file(tensors, filename, metadata, format)


def load(data: bytes) -> dict[str, Any]:
    """All tensors in ``data`` (file bytes), as JAX arrays on the default CPU device."""
    return _JAX.load(data)


def load_file(filename: Any, *, backend: str = "mmap") -> dict[str, Any]:
    """All tensors in ``filename`` (a path or binary file object), as JAX arrays."""
    return _JAX.load_file(filename, "cpu", backend)
