"""A one-pass scanner for safetensors header JSON, compiled with Numba.

It accepts exactly the JSON grammar restricted to the safetensors schema
(any whitespace, any key order inside an entry) and returns byte spans and
numbers in columns; strings are unescaped and UTF-8-checked by the caller.
Arrays are sized from byte counts of the header (quotes, commas, brackets)
before scanning, never from a number read from the file.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from zerobatch._jit import njit

__all__ = ["ERRORS", "scan"]

OK = 0
_SYNTAX = 1
_CONTROL = 2
_ESCAPE = 3
_NUMBER = 4
_FIELD = 5
_MISSING = 6
_DTYPE = 7
_METADATA = 8
_OFFSETS = 9

ERRORS = {
    _SYNTAX: ("header is not valid JSON", "header"),
    _CONTROL: ("raw control character inside a JSON string", "header"),
    _ESCAPE: ("invalid escape sequence in a JSON string", "header"),
    _NUMBER: ("expected an integer in [0, 2**64)", "header"),
    _FIELD: ("unknown or repeated key in a tensor entry", "header"),
    _MISSING: ("tensor entry needs exactly the keys dtype, shape and data_offsets", "header"),
    _DTYPE: ("unknown dtype", "dtype"),
    _METADATA: ("metadata must be an object of string values, given once", "__metadata__"),
    _OFFSETS: ("data_offsets must be exactly two integers", "data_offsets"),
}
"""Error code -> (message, field)."""

_BYTES = numba.types.Array(numba.types.uint8, 1, "C", readonly=True)
_I64 = numba.types.int64

_KEY_DTYPE = np.frombuffer(b"dtype", np.uint8)
_KEY_SHAPE = np.frombuffer(b"shape", np.uint8)
_KEY_OFFSETS = np.frombuffer(b"data_offsets", np.uint8)
_KEY_METADATA = np.frombuffer(b"__metadata__", np.uint8)


@njit((_BYTES, _I64), cache=True, nogil=True)
def _skip_ws(h: Any, pos: Any) -> Any:
    n = h.size
    while pos < n and (h[pos] == 0x20 or h[pos] == 0x0A or h[pos] == 0x0D or h[pos] == 0x09):
        pos += 1
    return pos


@njit((_BYTES, _I64), cache=True, nogil=True)
def _string(h: Any, pos: Any) -> Any:
    """(end of content, position after the closing quote, escaped, error); ``pos`` at '"'."""
    n = h.size
    if pos >= n or h[pos] != 0x22:
        return 0, pos, False, _SYNTAX
    pos += 1
    escaped = False
    while pos < n:
        c = h[pos]
        if c == 0x22:
            return pos, pos + 1, escaped, OK
        if c < 0x20:
            return 0, pos, False, _CONTROL
        if c == 0x5C:
            escaped = True
            if pos + 1 >= n:
                return 0, pos, False, _ESCAPE
            e = h[pos + 1]
            if e == 0x75:
                if pos + 5 >= n:
                    return 0, pos, False, _ESCAPE
                for k in range(pos + 2, pos + 6):
                    d = h[k]
                    if not ((0x30 <= d <= 0x39) or (0x41 <= d <= 0x46) or (0x61 <= d <= 0x66)):
                        return 0, pos, False, _ESCAPE
                pos += 6
                continue
            if e not in (0x22, 0x5C, 0x2F, 0x62, 0x66, 0x6E, 0x72, 0x74):
                return 0, pos, False, _ESCAPE
            pos += 2
            continue
        pos += 1
    return 0, pos, False, _SYNTAX


@njit((_BYTES, _I64), cache=True, nogil=True)
def _uint(h: Any, pos: Any) -> Any:
    """(value, next position, error) for a JSON integer in [0, 2**64)."""
    n = h.size
    value = np.uint64(0)
    if pos >= n or not (0x30 <= h[pos] <= 0x39):
        return value, pos, _NUMBER
    start = pos
    limit = np.uint64(2**64 - 1)
    while pos < n and 0x30 <= h[pos] <= 0x39:
        digit = np.uint64(h[pos] - 0x30)
        if value > (limit - digit) // np.uint64(10):
            return value, pos, _NUMBER
        value = value * np.uint64(10) + digit
        pos += 1
    if pos - start > 1 and h[start] == 0x30:
        return value, start, _NUMBER
    if pos < n and (h[pos] == 0x2E or h[pos] == 0x65 or h[pos] == 0x45):
        return value, pos, _NUMBER
    return value, pos, OK


@njit(cache=True, nogil=True)
def _equals(h: Any, start: Any, end: Any, word: Any) -> bool:
    if end - start != word.size:
        return False
    for k in range(word.size):  # noqa: SIM110 - a plain loop compiles well in Numba
        if h[start + k] != word[k]:
            return False
    return True


@njit(cache=True, nogil=True)
def _dtype(h: Any, start: Any, end: Any, table: Any, lengths: Any) -> Any:
    """The code of the dtype string ``h[start:end]``, or -1."""
    size = end - start
    for code in range(lengths.size):
        if lengths[code] != size:
            continue
        k = 0
        while k < size and h[start + k] == table[code, k]:
            k += 1
        if k == size:
            return code
    return -1


@njit((_I64, _I64, _I64), cache=True, nogil=True)
def _fail(code: Any, pos: Any, row: Any) -> Any:
    empty = np.zeros((0, 3), np.int64)
    return (code, pos, row, False, empty, empty, np.zeros(0, np.uint8), np.zeros(0, np.uint64),
            np.zeros(1, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.uint64))


@njit(cache=True, nogil=True)
def scan(h: Any, table: Any, lengths: Any, strings: Any, numbers: Any) -> Any:
    """Scan header bytes ``h``; ``table``/``lengths`` hold the dtype strings by code.

    ``strings`` and ``numbers`` bound how many strings and integers ``h`` can
    hold (half its quote count; its commas and opening brackets); the output
    arrays are sized from them, and every write is checked against them.

    Returns ``(error, position, row, has_metadata, meta_spans, name_spans, codes,
    dims, dim_starts, begins, ends)``. Spans are ``(start, end, escaped)`` of
    string contents (between the quotes); meta_spans rows alternate key, value.
    """
    n = h.size
    rows = strings // 5 + 1
    names = np.empty((rows, 3), np.int64)
    meta = np.empty((strings + 1, 3), np.int64)
    codes = np.empty(rows, np.uint8)
    dims = np.empty(numbers + 1, np.uint64)
    starts = np.empty(rows + 1, np.int64)
    begins = np.empty(rows, np.uint64)
    ends = np.empty(rows, np.uint64)
    starts[0] = 0
    has_meta = False
    n_meta = 0
    row = 0
    used = 0
    pos = _skip_ws(h, 0)
    if pos >= n or h[pos] != 0x7B:
        return _fail(_SYNTAX, pos, -1)
    pos = _skip_ws(h, pos + 1)
    if pos < n and h[pos] == 0x7D:
        pos += 1
    else:
        while True:
            key_start = pos + 1
            key_end, pos, escaped, err = _string(h, pos)
            if err:
                return _fail(err, pos, row)
            pos = _skip_ws(h, pos)
            if pos >= n or h[pos] != 0x3A:
                return _fail(_SYNTAX, pos, row)
            pos = _skip_ws(h, pos + 1)
            if not escaped and _equals(h, key_start, key_end, _KEY_METADATA):
                if has_meta or pos >= n or h[pos] != 0x7B:
                    return _fail(_METADATA, pos, -1)
                has_meta = True
                pos = _skip_ws(h, pos + 1)
                if pos < n and h[pos] == 0x7D:
                    pos += 1
                else:
                    while True:
                        for _ in range(2):
                            if n_meta >= meta.shape[0]:
                                return _fail(_SYNTAX, pos, -1)
                            meta[n_meta, 0] = pos + 1
                            end, pos, escaped, err = _string(h, pos)
                            if err:
                                return _fail(_METADATA if err == _SYNTAX else err, pos, -1)
                            meta[n_meta, 1] = end
                            meta[n_meta, 2] = escaped
                            n_meta += 1
                            pos = _skip_ws(h, pos)
                            if n_meta % 2 == 1:
                                if pos >= n or h[pos] != 0x3A:
                                    return _fail(_SYNTAX, pos, -1)
                                pos = _skip_ws(h, pos + 1)
                        if pos < n and h[pos] == 0x2C:
                            pos = _skip_ws(h, pos + 1)
                            continue
                        if pos < n and h[pos] == 0x7D:
                            pos += 1
                            break
                        return _fail(_SYNTAX, pos, -1)
            else:
                if row >= rows:
                    return _fail(_SYNTAX, pos, row)
                names[row, 0] = key_start
                names[row, 1] = key_end
                names[row, 2] = escaped
                if pos >= n or h[pos] != 0x7B:
                    return _fail(_SYNTAX, pos, row)
                pos = _skip_ws(h, pos + 1)
                seen = 0
                while True:
                    field_start = pos + 1
                    field_end, pos, escaped, err = _string(h, pos)
                    if err:
                        return _fail(err, pos, row)
                    pos = _skip_ws(h, pos)
                    if pos >= n or h[pos] != 0x3A:
                        return _fail(_SYNTAX, pos, row)
                    pos = _skip_ws(h, pos + 1)
                    if _equals(h, field_start, field_end, _KEY_DTYPE) and not seen & 1:
                        seen |= 1
                        value_start = pos + 1
                        value_end, pos, escaped, err = _string(h, pos)
                        if err:
                            return _fail(err, pos, row)
                        code = _dtype(h, value_start, value_end, table, lengths)
                        if code < 0:
                            return _fail(_DTYPE, value_start, row)
                        codes[row] = code
                    elif _equals(h, field_start, field_end, _KEY_SHAPE) and not seen & 2:
                        seen |= 2
                        if pos >= n or h[pos] != 0x5B:
                            return _fail(_SYNTAX, pos, row)
                        pos = _skip_ws(h, pos + 1)
                        if pos < n and h[pos] == 0x5D:
                            pos += 1
                        else:
                            while True:
                                dim, pos, err = _uint(h, pos)
                                if err:
                                    return _fail(err, pos, row)
                                if used >= dims.size:
                                    return _fail(_SYNTAX, pos, row)
                                dims[used] = dim
                                used += 1
                                pos = _skip_ws(h, pos)
                                if pos < n and h[pos] == 0x2C:
                                    pos = _skip_ws(h, pos + 1)
                                    continue
                                if pos < n and h[pos] == 0x5D:
                                    pos += 1
                                    break
                                return _fail(_SYNTAX, pos, row)
                        starts[row + 1] = used
                    elif _equals(h, field_start, field_end, _KEY_OFFSETS) and not seen & 4:
                        seen |= 4
                        if pos >= n or h[pos] != 0x5B:
                            return _fail(_OFFSETS, pos, row)
                        pos = _skip_ws(h, pos + 1)
                        begin, pos, err = _uint(h, pos)
                        if err:
                            return _fail(err, pos, row)
                        pos = _skip_ws(h, pos)
                        if pos >= n or h[pos] != 0x2C:
                            return _fail(_OFFSETS, pos, row)
                        pos = _skip_ws(h, pos + 1)
                        end, pos, err = _uint(h, pos)
                        if err:
                            return _fail(err, pos, row)
                        pos = _skip_ws(h, pos)
                        if pos >= n or h[pos] != 0x5D:
                            return _fail(_OFFSETS, pos, row)
                        pos += 1
                        begins[row] = begin
                        ends[row] = end
                    else:
                        return _fail(_FIELD, field_start, row)
                    pos = _skip_ws(h, pos)
                    if pos < n and h[pos] == 0x2C:
                        pos = _skip_ws(h, pos + 1)
                        continue
                    if pos < n and h[pos] == 0x7D:
                        pos += 1
                        break
                    return _fail(_SYNTAX, pos, row)
                if seen != 7:
                    return _fail(_MISSING, pos, row)
                row += 1
            pos = _skip_ws(h, pos)
            if pos < n and h[pos] == 0x2C:
                pos = _skip_ws(h, pos + 1)
                continue
            if pos < n and h[pos] == 0x7D:
                pos += 1
                break
            return _fail(_SYNTAX, pos, row)
    pos = _skip_ws(h, pos)
    if pos != n:
        return _fail(_SYNTAX, pos, -1)
    return (OK, pos, -1, has_meta, meta[:n_meta], names[:row], codes[:row], dims[:used],
            starts[: row + 1], begins[:row], ends[:row])
