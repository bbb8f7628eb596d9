"""Drop-in for ``safetensors.flax``: the functions of :mod:`zerobatch.tensors.jax`
under the name safetensors uses (``zerobatch.tensors.flax.save_file is
zerobatch.tensors.jax.save_file``)."""

from __future__ import annotations

from zerobatch.tensors.jax import *  # noqa: F403 - this module is jax's surface, renamed
from zerobatch.tensors.jax import __all__ as __all__
