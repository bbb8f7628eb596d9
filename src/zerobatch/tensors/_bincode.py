"""The bintensors header codec: bincode 2 (standard config) by hand.

Integers are varints: ``v < 251`` is one byte; otherwise a tag byte (251, 252,
253) then ``v`` as u16, u32 or u64 little-endian. Strings are a varint byte
length then UTF-8. The header is ``(Option<BTreeMap<String, String>>,
Vec<(String, TensorInfo)>)`` with ``TensorInfo = (dtype id, Vec<usize> shape,
(begin, end))``, padded with spaces (0x20) to a multiple of 8 bytes.

The decoder is stricter than bincode: varints must use their shortest form,
metadata keys must be strictly increasing (sorted, no duplicates) and the
padding must be spaces, so every accepted header has exactly one encoding.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from zerobatch._jit import njit

__all__ = ["ERRORS", "decode", "encode"]

_TAG_U16 = 251
_TAG_U32 = 252
_TAG_U64 = 253
_MAX_DTYPE_ID = 14
_BYTES = numba.types.Array(numba.types.uint8, 1, "C", readonly=True)
_I64 = numba.types.int64

OK = 0
_TRUNCATED = 1
_BAD_TAG = 2
_NOT_SHORTEST = 3
_BAD_OPTION = 4
_TOO_MANY = 5
_META_ORDER = 6
_BAD_DTYPE = 7
_BAD_PADDING = 8

ERRORS = {
    _TRUNCATED: ("header ends in the middle of a value (file seems not fully written?)", "header"),
    _BAD_TAG: ("invalid varint tag byte (254 or 255)", "header"),
    _NOT_SHORTEST: ("varint not in its shortest form", "header"),
    _BAD_OPTION: ("metadata option tag must be 0 (none) or 1 (some)", "__metadata__"),
    _TOO_MANY: ("count larger than the bytes left in the header", "header"),
    _META_ORDER: ("metadata keys must be unique and sorted by UTF-8 bytes", "__metadata__"),
    _BAD_DTYPE: (f"unknown dtype id (expected 0..{_MAX_DTYPE_ID})", "dtype"),
    _BAD_PADDING: ("bytes after the header content must be spaces (0x20)", "header"),
}
"""Error code -> (message, field)."""


@njit((_BYTES, _I64), cache=True, nogil=True)
def _varint(h: Any, pos: Any) -> Any:
    """(value, next position, error code) for the varint at ``pos``."""
    n = h.size
    zero = np.uint64(0)
    if pos >= n:
        return zero, pos, _TRUNCATED
    tag = h[pos]
    if tag < _TAG_U16:
        return np.uint64(tag), pos + 1, OK
    if tag > _TAG_U64:
        return zero, pos, _BAD_TAG
    width = 2 if tag == _TAG_U16 else (4 if tag == _TAG_U32 else 8)
    if pos + 1 + width > n:
        return zero, pos, _TRUNCATED
    value = np.uint64(0)
    for k in range(width):
        value |= np.uint64(h[pos + 1 + k]) << np.uint64(8 * k)
    floor = np.uint64(_TAG_U16) if width == 2 else np.uint64(1) << np.uint64(4 * width)
    if value < floor:
        return zero, pos, _NOT_SHORTEST
    return value, pos + 1 + width, OK


@njit((_BYTES, _I64, _I64, _I64, _I64), cache=True, nogil=True)
def _bytes_less(h: Any, a: int, a_len: int, b: int, b_len: int) -> bool:
    for k in range(min(a_len, b_len)):
        if h[a + k] != h[b + k]:
            return h[a + k] < h[b + k]
    return a_len < b_len


@njit((_I64, _I64, _I64), cache=True, nogil=True)
def _fail(code: int, pos: int, row: int) -> Any:
    return (code, pos, row, False, np.zeros((0, 2, 2), np.int64), np.zeros((0, 2), np.int64),
            True, np.zeros(0, np.uint8), np.zeros(0, np.uint64), np.zeros(1, np.int64),
            np.zeros(0, np.uint64), np.zeros(0, np.uint64))


@njit((numba.types.uint64, _I64), cache=True, nogil=True)
def _fits(count: Any, room: int) -> bool:
    """Whether a decoded count is at most ``room`` (a non-negative int)."""
    return count <= np.uint64(max(room, 0))


@njit(cache=True, nogil=True)
def decode(h: Any) -> Any:
    """Decode header bytes ``h`` (uint8 array, padding included).

    Returns ``(error, position, row, has_metadata, meta_spans, name_spans,
    names_ascii, dtype_ids, dims, dim_starts, begins, ends)``; spans are
    ``(start, length)`` byte pairs into ``h``. ``error`` is 0 or a key of
    :data:`ERRORS`; ``row`` is the tensor being read when it happened (-1 for
    metadata). Counts are checked against the bytes left before allocating.
    """
    n = h.size
    meta = np.zeros((0, 2, 2), np.int64)
    if n < 1:
        return _fail(_TRUNCATED, 0, -1)
    if h[0] > 1:
        return _fail(_BAD_OPTION, 0, -1)
    has_meta = h[0] == 1
    pos: Any = 1
    if has_meta:
        pairs, pos, err = _varint(h, pos)
        if err:
            return _fail(err, pos, -1)
        if not _fits(pairs, (n - pos) // 2):
            return _fail(_TOO_MANY, pos, -1)
        meta = np.empty((np.int64(pairs), 2, 2), np.int64)
        for i in range(np.int64(pairs)):
            for j in range(2):
                length, pos, err = _varint(h, pos)
                if err:
                    return _fail(err, pos, -1)
                if not _fits(length, n - pos):
                    return _fail(_TRUNCATED, pos, -1)
                meta[i, j, 0] = pos
                meta[i, j, 1] = np.int64(length)
                pos += np.int64(length)
            if i > 0 and not _bytes_less(
                h, meta[i - 1, 0, 0], meta[i - 1, 0, 1], meta[i, 0, 0], meta[i, 0, 1]
            ):
                return _fail(_META_ORDER, meta[i, 0, 0], -1)
    raw_count, pos, err = _varint(h, pos)
    if err:
        return _fail(err, pos, 0)
    if not _fits(raw_count, (n - pos) // 5):
        return _fail(_TOO_MANY, pos, 0)
    count: Any = np.int64(raw_count)
    names = np.empty((count, 2), np.int64)
    ids = np.empty(count, np.uint8)
    starts = np.empty(count + 1, np.int64)
    begins = np.empty(count, np.uint64)
    ends = np.empty(count, np.uint64)
    dims = np.empty(max(0, n - pos - 5 * count), np.uint64)
    starts[0] = 0
    ascii_names = True
    used = 0
    for row in range(count):
        length, pos, err = _varint(h, pos)
        if err:
            return _fail(err, pos, row)
        if not _fits(length, n - pos):
            return _fail(_TRUNCATED, pos, row)
        size: Any = np.int64(length)
        names[row, 0] = pos
        names[row, 1] = size
        for k in range(pos, pos + size):
            if h[k] >= 128:
                ascii_names = False
                break
        pos += size
        dtype_id, pos, err = _varint(h, pos)
        if err:
            return _fail(err, pos, row)
        if not _fits(dtype_id, _MAX_DTYPE_ID):
            return _fail(_BAD_DTYPE, pos, row)
        ids[row] = dtype_id
        ndim, pos, err = _varint(h, pos)
        if err:
            return _fail(err, pos, row)
        if not _fits(ndim, dims.size - used):
            return _fail(_TOO_MANY, pos, row)
        for _ in range(np.int64(ndim)):
            dim, pos, err = _varint(h, pos)
            if err:
                return _fail(err, pos, row)
            dims[used] = dim
            used += 1
        starts[row + 1] = used
        begin, pos, err = _varint(h, pos)
        if err:
            return _fail(err, pos, row)
        end, pos, err = _varint(h, pos)
        if err:
            return _fail(err, pos, row)
        begins[row] = begin
        ends[row] = end
    for k in range(pos, n):
        if h[k] != 0x20:
            return _fail(_BAD_PADDING, k, -1)
    return (OK, pos, -1, has_meta, meta, names, ascii_names, ids, dims[:used], starts,
            begins, ends)


def _varint_bytes(value: int) -> bytes:
    if value < _TAG_U16:
        return bytes((value,))
    if value < 1 << 16:
        return bytes((_TAG_U16,)) + value.to_bytes(2, "little")
    if value < 1 << 32:
        return bytes((_TAG_U32,)) + value.to_bytes(4, "little")
    return bytes((_TAG_U64,)) + value.to_bytes(8, "little")


def _str_bytes(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _varint_bytes(len(raw)) + raw


def encode(
    metadata: dict[str, str] | None,
    entries: list[tuple[str, int, tuple[int, ...], int, int]],
) -> bytes:
    """Header bytes (unpadded) for ``entries`` of (name, dtype id, shape, begin, end)."""
    parts: list[bytes] = []
    if metadata is None:
        parts.append(b"\x00")
    else:
        parts.append(b"\x01" + _varint_bytes(len(metadata)))
        for key in sorted(metadata, key=lambda k: k.encode("utf-8")):
            parts.append(_str_bytes(key) + _str_bytes(metadata[key]))
    parts.append(_varint_bytes(len(entries)))
    for name, dtype_id, shape, begin, end in entries:
        parts.append(_str_bytes(name))
        parts.append(_varint_bytes(dtype_id) + _varint_bytes(len(shape)))
        parts.extend(_varint_bytes(d) for d in shape)
        parts.append(_varint_bytes(begin) + _varint_bytes(end))
    return b"".join(parts)
