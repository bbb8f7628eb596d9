"""``TensorSpec``, ``serialize``, ``serialize_file`` and ``deserialize``: the
low-level safetensors 0.8.0 functions that take raw memory (an address and a
length) instead of arrays, so tensors are streamed to the file one at a time
from wherever they live, never gathered first.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from typing import Any

from zerobatch.tensors._checks import check_filename, check_metadata, check_tensor_dict
from zerobatch.tensors._dtypes import DTYPES
from zerobatch.tensors._errors import SafetensorError
from zerobatch.tensors._format import encode_header, read_header
from zerobatch.tensors._header import SAFETENSORS
from zerobatch.tensors._safetensors_header import METADATA_KEY
from zerobatch.tensors._write import write_atomic

__all__ = ["TensorSpec", "deserialize", "serialize", "serialize_file"]

_F4_PAIRS = "float4_e2m1fn_x2"
_SPEC_DTYPES: dict[str, int] = {
    name: code for name in (
        "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
        "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
        "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", _F4_PAIRS, "complex64")
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
        if dtype == _F4_PAIRS and dims:
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
    check_tensor_dict(tensor_dict, "tensor_dict")
    check_metadata(metadata)
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
    check_filename(filename)
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
