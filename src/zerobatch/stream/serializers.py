"""Span-metadata serializers: how one metadata value becomes bytes and back.

Built in, by name: ``"msgpack"`` (the default choice: compact, safe),
``"json"``, ``"bytes"`` (values are bytes, stored as is) and ``"numpy"``
(one array per value, ``.npy`` bytes, never pickled). ``"pickle"`` exists only
when asked for by name, when writing and again when reading. Any object with
``dumps(value) -> bytes`` and ``loads(bytes) -> value`` works too; the manifest
then records ``custom:<class name>`` and the reader needs the object again.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import pickle
from typing import Any, Protocol

import msgpack
import numpy as np

__all__ = [
    "BUILTIN", "Serializer", "get_serializer", "loads_many", "npy_loads", "serializer_name",
]


class Serializer(Protocol):
    """Anything with ``dumps`` and ``loads``."""

    def dumps(self, value: Any) -> bytes: ...
    def loads(self, data: bytes | memoryview) -> Any: ...


class _Msgpack:
    name = "msgpack"

    def dumps(self, value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)

    def loads(self, data: bytes | memoryview) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)


class _Json:
    name = "json"

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    def loads(self, data: bytes | memoryview) -> Any:
        return json.loads(bytes(data))


class _Bytes:
    name = "bytes"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"the 'bytes' serializer takes bytes, got {type(value).__name__}")
        return bytes(value)

    def loads(self, data: bytes | memoryview) -> Any:
        return bytes(data)


class _Numpy:
    name = "numpy"

    def dumps(self, value: Any) -> bytes:
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise TypeError("the 'numpy' serializer does not store object arrays")
        out = io.BytesIO()
        np.save(out, array, allow_pickle=False)
        return out.getvalue()

    def loads(self, data: bytes | memoryview) -> Any:
        return npy_loads(data)


def npy_loads(data: bytes | memoryview) -> np.ndarray:
    """The array in ``.npy`` bytes ``data``, never allocating more than ``data``
    holds: the header is parsed first (NumPy's own parser, header size capped)
    and ``shape * itemsize`` must equal the bytes after it. No pickles, no
    structured or object dtypes. ValueError for anything else."""
    view = memoryview(data).cast("B")
    stream = io.BytesIO(view)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except Exception as error:  # NumPy's header parser raises several types
        raise ValueError(f"not a readable .npy header ({type(error).__name__}: {error})") \
            from None
    if dtype.hasobject or dtype.names is not None or dtype.shape != ():
        raise ValueError(f"unsupported .npy dtype {dtype}")
    start = stream.tell()
    count = math.prod(shape)
    if count * dtype.itemsize != view.nbytes - start:
        raise ValueError(f"header declares shape {shape} of {dtype} ({count * dtype.itemsize} "
                         f"bytes), the entry holds {view.nbytes - start}")
    flat = np.frombuffer(view, dtype=dtype, count=count, offset=start)
    return flat.reshape(shape, order="F" if fortran else "C").copy(order="K")


class _Pickle:
    name = "pickle"

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=5)

    def loads(self, data: bytes | memoryview) -> Any:
        return pickle.loads(data)


BUILTIN: dict[str, type] = {
    cls.name: cls for cls in (_Msgpack, _Json, _Bytes, _Numpy, _Pickle)
}


def serializer_name(serializer: Any) -> str:
    """The name the manifest records for ``serializer``."""
    name = getattr(serializer, "name", None)
    if isinstance(name, str) and type(serializer) is BUILTIN.get(name):
        return name
    return f"custom:{type(serializer).__qualname__}"


def get_serializer(spec: Any) -> Any:
    """The serializer for a built-in name or a ``dumps``/``loads`` object."""
    if isinstance(spec, str):
        if spec not in BUILTIN:
            raise ValueError(f"unknown metadata serializer {spec!r}; expected one of "
                             f"{sorted(BUILTIN)} or an object with dumps and loads")
        return BUILTIN[spec]()
    if not (callable(getattr(spec, "dumps", None)) and callable(getattr(spec, "loads", None))):
        raise TypeError("metadata must be a serializer name or an object with dumps and loads")
    return spec


_ARRAY32 = 0xDD


def loads_many(serializer: Any, data: np.ndarray, offsets: np.ndarray, head: int) -> list[Any]:
    """Decode entries ``data[head + offsets[k] : head + offsets[k+1]]``, all at once.

    ``data`` is a uint8 buffer with ``head`` (>= 5) spare bytes before the
    entries. For msgpack those bytes become an array header, so one C call
    decodes every entry; other serializers decode entry by entry.
    """
    count = offsets.shape[0] - 1
    if count <= 0:
        return []
    if isinstance(serializer, _Msgpack):
        start = head - 5
        data[start] = _ARRAY32
        data[start + 1 : head] = np.frombuffer(count.to_bytes(4, "big"), dtype=np.uint8)
        values = msgpack.unpackb(
            data.data[start : head + int(offsets[-1])], raw=False, strict_map_key=False
        )
        if not isinstance(values, list) or len(values) != count:
            raise ValueError("entries do not line up with the metadata index")
        return values
    view = data.data
    bounds = (offsets + head).tolist()
    return [serializer.loads(view[a:b]) for a, b in itertools.pairwise(bounds)]
