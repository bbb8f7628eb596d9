"""What the safetensors drop-in modules (``torch``, ``numpy``, ``jax``) share,
and safetensors' own top-level API.

Each drop-in declares its functions with safetensors' signatures and calls
one :class:`DropIn`, which checks the arguments as safetensors does (each
error names the argument, with the exception class safetensors raises for
it) and runs ``zerobatch.tensors``' own save and load. ``TensorSpec``,
``serialize``, ``serialize_file`` and ``deserialize`` are safetensors 0.8.0's
low-level functions that take raw memory (an address and a length) instead of
arrays, so tensors are streamed to the file one at a time from wherever they
live, never gathered first.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zerobatch.tensors import _api
from zerobatch.tensors._write import F4_TORCH, write_atomic
from zerobatch.tensors.format import (
    DTYPES,
    METADATA_KEY,
    SAFETENSORS,
    SafetensorError,
    encode_header,
    read_header,
)

__all__ = ["DropIn", "TensorSpec", "deserialize", "serialize", "serialize_file"]


def _check_tensor_dict(tensors: Any, argument: str = "tensors") -> None:
    """``tensors`` (the argument named ``argument``) must be a dict with str keys."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"argument {argument!r}: expected a dict of names to tensors, got "
                         f"{type(tensors).__name__}")
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"argument {argument!r}: tensor names must be str, got {name!r} "
                            f"({type(name).__name__})")


def _check_metadata(metadata: Any) -> None:
    """``metadata`` must be None or a dict of str to str."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise TypeError("argument 'metadata': expected a dict of str to str or None, got "
                        f"{type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"argument 'metadata': entry {key!r}: {value!r} is not str to str")


def _check_filename(filename: Any) -> None:
    """``filename`` must be a str, bytes or ``os.PathLike`` path."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        raise TypeError("argument 'filename': expected str, bytes or os.PathLike, not "
                        f"{type(filename).__name__}")


def _no_more_checks(tensors: Mapping[str, Any]) -> None:
    """Frameworks without refusals of their own."""


@dataclass(frozen=True)
class DropIn:
    """One framework's drop-in module.

    ``name`` is its ``safe_open`` framework (``"np"``, ``"pt"``, ``"jax"``),
    ``argument`` the name of its save functions' dict argument, ``is_tensor``
    what that dict's values must pass (``expected`` says what they should
    be, in errors), and ``check_more`` the framework's own refusals, run
    after the common ones and before anything is written.
    """

    name: str
    argument: str
    expected: str
    is_tensor: Callable[[Any], bool]
    check_more: Callable[[Mapping[str, Any]], None] = _no_more_checks

    def check_for_save(self, tensors: Any, metadata: Any) -> None:
        """safetensors' refusals, in its order: not a dict of str, bad
        metadata, a value that is not a tensor, then the framework's own."""
        _check_tensor_dict(tensors, self.argument)
        _check_metadata(metadata)
        for name, tensor in tensors.items():
            if not self.is_tensor(tensor):
                raise ValueError(f"argument {self.argument!r}: {name!r} is a "
                                 f"{type(tensor).__name__}, expected {self.expected}")
        self.check_more(tensors)

    def save(self, tensors: Any, metadata: Any, format: str) -> bytes:
        """The file bytes, after :meth:`check_for_save`."""
        self.check_for_save(tensors, metadata)
        return _api.save(tensors, metadata, format=format)

    def save_file(self, tensors: Any, filename: str | os.PathLike[str], metadata: Any,
                  format: str) -> None:
        """Write the file atomically, after :meth:`check_for_save` and a
        check of ``filename``."""
        self.check_for_save(tensors, metadata)
        _check_filename(filename)
        _api.save_file(tensors, filename, metadata, format=format)

    def load(self, data: bytes) -> dict[str, Any]:
        """All tensors in ``data`` (file bytes), in file order."""
        return _api.load(data, self.name)

    def load_file(self, filename: Any, device: str | int, backend: str) -> dict[str, Any]:
        """All tensors in ``filename`` (a path or binary file object), in file order."""
        return _api.load_file(filename, self.name, device, backend=backend)


_SPEC_DTYPES: dict[str, int] = {
    name: code for name in (
        "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
        "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
        "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", F4_TORCH, "complex64")
    for code, dtype in enumerate(DTYPES) if dtype.torch_name == name
}
"""The dtype names ``TensorSpec`` takes (torch / NumPy spelling) -> code."""


class TensorSpec:
    """One tensor as raw memory: ``dtype`` (``"float32"``-style name),
    ``shape``, and ``data_len`` bytes at address ``data_ptr``.

    For ``float4_e2m1fn_x2`` (two elements per byte) the shape may be the
    torch storage shape: the last dimension is doubled, so :attr:`shape`
    always counts elements. The memory must stay alive and unchanged until
    :func:`serialize` or :func:`serialize_file` returns.
    """

    __slots__ = ("_code", "_data_len", "_data_ptr", "_shape")

    def __init__(self, *, dtype: str, shape: Sequence[int], data_ptr: int, data_len: int
                 ) -> None:
        if not isinstance(dtype, str) or dtype not in _SPEC_DTYPES:
            raise SafetensorError(f"unknown dtype {dtype!r}; supported: "
                                  f"{', '.join(_SPEC_DTYPES)}", field="dtype")
        dims = [int(dim) for dim in shape]
        if any(dim < 0 for dim in dims):
            raise ValueError(f"argument 'shape': dimensions must not be negative, got {dims}")
        if int(data_ptr) < 0 or int(data_len) < 0:
            raise ValueError("arguments 'data_ptr' and 'data_len' must not be negative")
        if dtype == F4_TORCH and dims:
            dims[-1] *= 2
        self._code = _SPEC_DTYPES[dtype]
        self._shape = dims
        self._data_ptr = int(data_ptr)
        self._data_len = int(data_len)

    @property
    def dtype(self) -> str:
        """The dtype as the file writes it (``"F32"``)."""
        return DTYPES[self._code].name

    @property
    def shape(self) -> list[int]:
        """Elements per dimension, as the header records them."""
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        """Address of the tensor's first byte."""
        return self._data_ptr

    @property
    def data_len(self) -> int:
        """Bytes at :attr:`data_ptr`."""
        return self._data_len

    def __repr__(self) -> str:
        return (f"TensorSpec(dtype={self.dtype!r}, shape={self._shape}, "
                f"data_ptr={self._data_ptr}, data_len={self._data_len})")


def _layout(tensor_dict: Mapping[str, TensorSpec], metadata: Mapping[str, str] | None
            ) -> tuple[bytes, list[Any]]:
    """The header and, in write order, one memoryview per tensor over its memory."""
    _check_tensor_dict(tensor_dict, "tensor_dict")
    _check_metadata(metadata)
    specs = []
    for name, spec in tensor_dict.items():
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"argument 'tensor_dict': {name!r} is a {type(spec).__name__}, "
                            "expected a TensorSpec")
        if name == METADATA_KEY:
            raise ValueError(f"argument 'tensor_dict': {METADATA_KEY!r} is reserved for "
                             "metadata in safetensors")
        count = 1
        for dim in spec.shape:
            count *= dim
        if count * DTYPES[spec._code].bits != spec.data_len * 8:
            raise SafetensorError(f"tensor {name!r}: shape {spec.shape} of {spec.dtype} needs "
                                  f"{count * DTYPES[spec._code].bits / 8:g} bytes, data_len is "
                                  f"{spec.data_len}", field=name)
        if spec.data_len and not spec.data_ptr:
            raise SafetensorError(f"tensor {name!r}: data_ptr is 0 for {spec.data_len} bytes",
                                  field=name)
        specs.append((name, spec))
    specs.sort(key=lambda item: (-item[1]._code, item[0]))
    entries, views, offset = [], [], 0
    for name, spec in specs:
        entries.append((name, spec._code, tuple(spec.shape), offset, offset + spec.data_len))
        offset += spec.data_len
        if spec.data_len:
            views.append(memoryview((ctypes.c_ubyte * spec.data_len).from_address(
                spec.data_ptr)).cast("B"))
    head = encode_header(SAFETENSORS, None if metadata is None else dict(metadata), entries)
    return head, views


def serialize(tensor_dict: Mapping[str, TensorSpec], metadata: Mapping[str, str] | None = None
              ) -> bytes:
    """The safetensors file bytes for ``tensor_dict`` (name -> :class:`TensorSpec`)."""
    head, views = _layout(tensor_dict, metadata)
    return b"".join([head, *views])


def serialize_file(tensor_dict: Mapping[str, TensorSpec], filename: str | os.PathLike[str],
                   metadata: Mapping[str, str] | None = None) -> None:
    """Write the safetensors file for ``tensor_dict`` to ``filename``, each
    tensor straight from its memory (nothing gathered), atomically."""
    _check_filename(filename)
    head, views = _layout(tensor_dict, metadata)
    write_atomic(filename, [head, *views])


def deserialize(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``[(name, {"dtype": "F32", "shape": [...], "data": bytearray}), ...]``
    sorted by name (safetensors returns the same pairs in hash order)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"argument 'data': expected bytes, not {type(data).__name__}")
    header = read_header(data)
    result = []
    for name in sorted(header.names):
        info = header.info(header.index[name])
        begin = header.data_start + info.begin
        result.append((name, {"dtype": info.dtype, "shape": list(info.shape),
                              "data": bytearray(data[begin : header.data_start + info.end])}))
    return result
