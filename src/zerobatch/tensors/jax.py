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

from zerobatch.tensors import _api
from zerobatch.tensors._checks import check_filename, check_metadata, check_tensor_dict
from zerobatch.tensors._errors import SafetensorError
from zerobatch.tensors._header import SAFETENSORS
from zerobatch.tensors._open import safe_open
from zerobatch.tensors._specs import TensorSpec, deserialize, serialize, serialize_file

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


def _check_for_save(tensors: Any, metadata: Any) -> None:
    check_tensor_dict(tensors)
    check_metadata(metadata)
    for name, array in tensors.items():
        if not hasattr(array, "dtype") or not hasattr(array, "shape"):
            raise ValueError(f"argument 'tensors': {name!r} is a {type(array).__name__}, "
                             "expected a jax.Array")


def save(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None, *,
         format: str = SAFETENSORS) -> bytes:
    """The file bytes for ``tensors`` (each copied to the host once)."""
    _check_for_save(tensors, metadata)
    return _api.save(tensors, metadata, format=format)


def save_file(tensors: Mapping[str, Any], filename: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None, *, format: str = SAFETENSORS) -> None:
    """Write ``tensors`` to ``filename`` (atomically: nothing appears on error)."""
    _check_for_save(tensors, metadata)
    check_filename(filename)
    _api.save_file(tensors, filename, metadata, format=format)


def load(data: bytes) -> dict[str, Any]:
    """All tensors in ``data`` (file bytes), as JAX arrays on the default CPU device."""
    return _api.load(data, "jax")


def load_file(filename: Any, *, backend: str = "mmap") -> dict[str, Any]:
    """All tensors in ``filename`` (a path or binary file object), as JAX arrays."""
    return _api.load_file(filename, "jax", backend=backend)
