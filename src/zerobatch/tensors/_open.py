"""``safe_open``: a tensor file mapped once, tensors handed out lazily."""

from __future__ import annotations

import mmap
import os
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from zerobatch.tensors import jax as _jax
from zerobatch.tensors import numpy as _numpy
from zerobatch.tensors import torch as _torch
from zerobatch.tensors._format import read_header
from zerobatch.tensors._header import Header

__all__ = ["TensorSlice", "adapter", "safe_open"]

_ADAPTERS: dict[str, ModuleType] = {
    "np": _numpy,
    "numpy": _numpy,
    "pt": _torch,
    "torch": _torch,
    "jax": _jax,
    "flax": _jax,
}


def adapter(framework: str) -> ModuleType:
    """The module that converts NumPy views for ``framework``."""
    try:
        return _ADAPTERS[framework]
    except KeyError:
        known = sorted(_ADAPTERS)
        raise ValueError(f"framework must be one of {known}, got {framework!r}") from None


class TensorSlice:
    """One tensor, not yet read: index it (NumPy basic indexing, steps
    included) to get just that part in the file's framework."""

    def __init__(self, array: np.ndarray[Any, Any], dtype: str, convert: Any,
                 device: str | int) -> None:
        self._array = array
        self._dtype = dtype
        self._convert = convert
        self._device = device

    def get_shape(self) -> list[int]:
        """The full tensor's shape."""
        return list(self._array.shape)

    def get_dtype(self) -> str:
        """The dtype string as the file stores it (``"F32"``)."""
        return self._dtype

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, tuple):
            index = (index,)
        if not any(item is Ellipsis for item in index):
            index = (*index, Ellipsis)  # keeps integer indexing a 0-d view, not a scalar
        return self._convert(self._array[index], self._device)


class safe_open:
    """Open a bintensors or safetensors file (detected from its bytes).

    ``framework`` is ``"np"``/``"numpy"``, ``"pt"``/``"torch"`` or
    ``"jax"``/``"flax"``. The header is parsed and checked completely here;
    tensors are views over one memory map (read-only for NumPy and JAX,
    copy-on-write for PyTorch: writes to a tensor never reach the file, but
    later reads through the same handle see them). Tensors stay valid after
    the file is closed. Reads may run from several threads; closing while
    another thread reads is not safe.
    """

    def __init__(self, path: str | os.PathLike[str], framework: str, device: str | int = "cpu"
                 ) -> None:
        self._path = os.fspath(path)
        self._adapter = adapter(framework)
        self._device = device
        with open(self._path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            buffer: Any = mmap.mmap(file.fileno(), 0, access=self._adapter.ACCESS) if size else b""
        self._buffer: Any = buffer
        self._header: Header = read_header(buffer, path=self._path)

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Drop this handle's mapping; tensors already returned keep it alive. Idempotent."""
        self._buffer = None

    @property
    def header(self) -> Header:
        """The parsed, validated header."""
        return self._header

    def keys(self) -> list[str]:
        """Tensor names, sorted."""
        return sorted(self._header.names)

    def offset_keys(self) -> list[str]:
        """Tensor names in the order of their data in the file."""
        return self._header.offset_order()

    def metadata(self) -> dict[str, str] | None:
        """The free-form string metadata, or None when the file has none."""
        metadata = self._header.metadata
        return None if metadata is None else dict(metadata)

    def _array(self, name: str) -> np.ndarray[Any, Any]:
        if self._buffer is None:
            raise ValueError(f"{self._path}: file is closed")
        row = self._header.index.get(name)
        if row is None:
            raise KeyError(f"{self._path}: no tensor named {name!r}")
        return _numpy.view(self._buffer, self._header, row, path=self._path)

    def get_tensor(self, name: str) -> Any:
        """The whole tensor ``name`` (zero-copy on the CPU)."""
        return self._adapter.convert(self._array(name), self._device)

    def get_slice(self, name: str) -> TensorSlice:
        """A lazy handle on ``name`` to read part of it."""
        array = self._array(name)
        dtype = self._header.info(self._header.index[name]).dtype
        return TensorSlice(array, dtype, self._adapter.convert, self._device)
