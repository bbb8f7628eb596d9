"""Drop-in for ``safetensors.flax``: the functions of :mod:`zerobatch.tensors.jax`."""

from __future__ import annotations

from zerobatch.tensors.jax import (
    SafetensorError,
    TensorSpec,
    deserialize,
    load,
    load_file,
    safe_open,
    save,
    save_file,
    serialize,
    serialize_file,
)

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
