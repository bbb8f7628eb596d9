"""Drop-in for ``safetensors.flax``: the functions of :mod:`zerobatch.tensors.jax`."""

from __future__ import annotations

from zerobatch.tensors.jax import SafetensorError, load, load_file, safe_open, save, save_file

__all__ = ["SafetensorError", "load", "load_file", "safe_open", "save", "save_file"]
