"""Safe msgpack decoding and checked field access for received headers.

Everything here raises :class:`~zerobatch.errors.FormatError` naming the frame
(``path``) and the field; nothing unpickles, nothing allocates more than the
bytes received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from zerobatch.errors import FormatError

__all__ = ["MAX_HEADER_BYTES", "expect", "pack", "read_array", "register_encoder", "unpack"]

MAX_HEADER_BYTES = 64 << 20
"""Largest header (or objects frame) accepted, in bytes: 64 MiB."""


_ENCODERS: dict[type, Callable[[Any], Any]] = {}


def register_encoder(cls: type, encode: Callable[[Any], Any]) -> None:
    """Let :func:`pack` send instances of ``cls`` (and subclasses) as ``encode(value)``.

    ``encode`` must return msgpack-able plain data; receivers get that data
    back, not ``cls``. Meant to be called once, when the module defining
    ``cls`` is imported, so that ``zerobatch.columnar`` needs no import of it.
    """
    _ENCODERS[cls] = encode


def _encode(value: Any) -> Any:
    for cls in type(value).__mro__:
        encode = _ENCODERS.get(cls)
        if encode is not None:
            return encode(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def pack(value: Any) -> bytes:
    """msgpack bytes of ``value`` (bin for bytes, str for str, no extension types).

    Types given to :func:`register_encoder` are packed as their plain data.
    """
    return msgpack.packb(value, use_bin_type=True, default=_encode)


def unpack(buffer: Any, *, where: str, field: str | None = None) -> Any:
    """Decode one msgpack object that fills ``buffer`` exactly.

    Checks the size against :data:`MAX_HEADER_BYTES` before parsing; strings,
    binaries, arrays and maps are capped by the buffer size, extension types
    are refused. Map keys may be any hashable msgpack value (str, int, ...).
    """
    view = memoryview(buffer)
    if view.nbytes > MAX_HEADER_BYTES:
        raise FormatError(
            f"msgpack payload of {view.nbytes} bytes exceeds the {MAX_HEADER_BYTES}-byte cap",
            path=where,
            field=field,
        )
    limit = max(view.nbytes, 1)
    try:
        return msgpack.unpackb(
            view,
            raw=False,
            use_list=True,
            strict_map_key=False,
            max_str_len=limit,
            max_bin_len=limit,
            max_array_len=limit,
            max_map_len=limit,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types for malformed input
        raise FormatError(
            f"not a valid msgpack payload ({type(exc).__name__}: {exc}); truncated frame?",
            path=where,
            field=field,
        ) from exc


def expect(
    mapping: Any, key: str, kind: type | tuple[type, ...], *, where: str, field: str | None = None
) -> Any:
    """``mapping[key]`` if ``mapping`` is a dict holding a value of type ``kind``."""
    if not isinstance(mapping, dict):
        raise FormatError(
            f"expected a map, found {type(mapping).__name__}", path=where, field=field
        )
    if key not in mapping:
        raise FormatError(f"missing key {key!r}", path=where, field=field)
    value = mapping[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise FormatError(
            f"key {key!r}: expected {getattr(kind, '__name__', kind)}, "
            f"found {type(value).__name__}",
            path=where,
            field=field,
        )
    return value


def read_array(
    buffer: Any, dtype: np.dtype, count: int, *, where: str, field: str | None = None
) -> np.ndarray:
    """``count`` items of ``dtype`` viewing ``buffer`` (no copy) if its size is exact."""
    view = memoryview(buffer)
    expected = count * dtype.itemsize
    if view.nbytes != expected:
        raise FormatError(
            f"{view.nbytes} bytes, expected {expected} ({count} x {dtype.str})",
            path=where,
            field=field,
        )
    return np.frombuffer(view, dtype=dtype, count=count)
