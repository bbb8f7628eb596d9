"""JSON for manifests, parsed within a size and a nesting-depth budget.

``json.loads`` recurses once per nesting level; a crafted file nested
100,000 levels deep would raise ``RecursionError`` from deep inside it. The
depth is measured first, by vectorized passes over the bytes (1 MiB at a
time, so memory stays a small multiple of that chunk) that then follow only
the brackets and quotes (3.6 ms a MiB of an MDS index.json), and a file over either
budget is refused with ``FormatError`` before any parsing.
"""

from __future__ import annotations

import json
import os
from typing import Any, BinaryIO

import numpy as np

from zerobatch.errors import FormatError

__all__ = ["MAX_DEPTH", "json_depth", "load_json", "read_capped"]

MAX_DEPTH = 64
"""Nesting levels (objects and arrays) a manifest may use."""

_CHUNK = 1 << 20
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN_ARRAY, _OPEN_OBJECT, _CLOSE_ARRAY, _CLOSE_OBJECT = (ord(c) for c in "[{]}")


def read_capped(file: BinaryIO, max_bytes: int) -> bytes:
    """The bytes of ``file`` from its position, at most ``max_bytes + 1`` of them
    (one more than a limit, so a caller can tell a file over it). Asks for no
    more than the file holds: ``read(n)`` allocates ``n`` bytes first."""
    try:
        left = os.fstat(file.fileno()).st_size - file.tell()
    except (OSError, ValueError, AttributeError):  # not a plain file: read in steps
        left = max_bytes
    return file.read(max(0, min(left, max_bytes)) + 1)


def json_depth(data: bytes | bytearray | memoryview) -> int:
    """The deepest nesting of arrays and objects in JSON text ``data``, brackets
    inside strings not counted. O(len(data)) time, O(1 MiB) extra memory.

    Exact for valid JSON; for invalid text it is some bound the parser then
    rejects anyway.
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    depth = deepest = 0
    in_string = False
    slashes = 0  # backslashes right before the chunk
    for begin in range(0, raw.shape[0], _CHUNK):
        chunk = raw[begin : begin + _CHUNK]
        n = chunk.shape[0]
        quotes = chunk == _QUOTE
        backslashes = chunk == _BACKSLASH
        if backslashes.any():  # a quote after an odd run of backslashes is escaped
            positions = np.arange(n, dtype=np.int64)
            # length of the backslash run ending just before each byte
            last_other = np.maximum.accumulate(np.where(backslashes, -1, positions))
            run_before = np.empty(n, np.int64)
            run_before[0] = slashes
            run_before[1:] = positions[:-1] - last_other[:-1]
            if n > 1:
                carried = last_other[:-1] < 0  # the run started in an earlier chunk
                run_before[1:][carried] += slashes
            quotes &= run_before % 2 == 0
            tail = n - 1 - int(last_other[-1])
            slashes = tail + (slashes if last_other[-1] < 0 else 0)
        else:  # (most files) only a run carried from the chunk before escapes
            if slashes % 2:
                quotes[0] = False
            slashes = 0
        # Only the brackets matter (a few % of an index's bytes): each is inside
        # a string when an odd number of unescaped quotes come before it.
        quoted = np.flatnonzero(quotes)
        opens = (chunk == _OPEN_ARRAY) | (chunk == _OPEN_OBJECT)
        brackets = np.flatnonzero(opens | (chunk == _CLOSE_ARRAY) | (chunk == _CLOSE_OBJECT))
        inside = (np.searchsorted(quoted, brackets) & 1).astype(np.bool_) ^ in_string
        counted = brackets[~inside]
        levels = np.cumsum(np.where(opens[counted], 1, -1), dtype=np.int32)
        if levels.shape[0]:
            deepest = max(deepest, depth + int(levels.max()))
            depth += int(levels[-1])
        in_string ^= quoted.shape[0] % 2 == 1
    return deepest


def load_json(
    data: bytes, *, path: object, field: str, max_bytes: int, max_depth: int = MAX_DEPTH
) -> Any:
    """Decode JSON ``data`` (UTF-8) after checking its size and nesting depth.

    Raises ``FormatError(path=path, field=field)`` for text over ``max_bytes``,
    nested deeper than ``max_depth``, or not valid UTF-8 JSON.
    """
    if len(data) > max_bytes:
        raise FormatError(f"{len(data)} bytes is over the {max_bytes}-byte limit",
                          path=path, field=field)
    # the depth is at most the count of opening brackets: most files need no scan
    opening = data.count(b"[") + data.count(b"{")
    depth = json_depth(data) if opening > max_depth else opening
    if depth > max_depth:
        raise FormatError(f"JSON nested {depth} levels deep, over the limit of {max_depth}",
                          path=path, field=field)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise FormatError(f"not valid JSON ({error}); file not fully written?",
                          path=path, field=field) from None
