"""Reading and laying out whole headers: the 8-byte length, format detection,
decoding with either codec, and the layout checks.

Both formats share the frame: ``N`` as u64 little-endian, ``N`` header bytes
(a multiple of 8, padded with spaces), then the data section, whose length the
tensors' byte ranges must cover exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.tensors import _bincode, _safetensors_header
from zerobatch.tensors._dtypes import BINTENSORS_CODE, BINTENSORS_ID
from zerobatch.tensors._header import (
    BINTENSORS,
    HEADER_LIMIT,
    METADATA_LIMIT,
    SAFETENSORS,
    Header,
    check_metadata_entries,
    cut_strings,
)
from zerobatch.tensors._validate import check_layout

__all__ = ["LENGTH_SIZE", "detect", "encode_header", "read_header", "read_header_at"]

LENGTH_SIZE = 8
"""Bytes of the little-endian u64 header length that opens every file."""

_ID_TO_CODE = np.zeros(256, np.uint8)
for _dtype_id, _code in BINTENSORS_CODE.items():
    _ID_TO_CODE[_dtype_id] = _code


def detect(prefix: bytes, size: int, *, path: object) -> tuple[str, int]:
    """(format, header length N) from the first 9 bytes of a ``size``-byte file."""
    if size < LENGTH_SIZE:
        raise FormatError(f"file is {size} bytes, too short for the 8-byte header length "
                          "(file seems not fully written?)", path=path, field="header_length")
    length = int.from_bytes(prefix[:LENGTH_SIZE], "little")
    if length > HEADER_LIMIT:
        raise FormatError(f"header length {length} exceeds the limit of {HEADER_LIMIT} bytes",
                          path=path, field="header_length")
    if length + LENGTH_SIZE > size:
        raise FormatError(f"header length {length} runs past the end of the {size}-byte file "
                          "(file seems not fully written?)", path=path, field="header_length")
    if length == 0:
        raise FormatError("header length is 0", path=path, field="header_length")
    first = prefix[LENGTH_SIZE]
    if first == ord("{"):
        return SAFETENSORS, length
    if first in (0, 1):
        return BINTENSORS, length
    raise FormatError(f"header starts with byte 0x{first:02x}: neither bintensors "
                      "(0x00 or 0x01) nor safetensors ('{')", path=path, field="header")


def _duplicate(names: list[str], *, path: object) -> FormatError:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            break
        seen.add(name)
    return FormatError(f"tensor name {name!r} appears twice", path=path, field=name)


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_bintensors(raw: bytes, *, path: object) -> tuple[Any, ...]:
    (error, pos, row, has_meta, meta, spans, ascii_names, ids, dims, starts, begins,
     ends) = _bincode.decode(np.frombuffer(raw, np.uint8))
    if error:
        message, field = _bincode.ERRORS[error]
        where = f"tensor #{row}: " if row >= 0 else ""
        raise FormatError(f"{where}{message} (header byte {pos + LENGTH_SIZE})", path=path,
                          field=field)
    metadata = None
    if has_meta:
        check_metadata_entries(len(meta), path=path)
        try:
            keys = cut_strings(raw, meta[:, 0, 0], meta[:, 0, 0] + meta[:, 0, 1])
            values = cut_strings(raw, meta[:, 1, 0], meta[:, 1, 0] + meta[:, 1, 1])
        except UnicodeDecodeError:
            raise FormatError("a metadata key or value is not valid UTF-8", path=path,
                              field="__metadata__") from None
        metadata = dict(zip(keys, values, strict=True))
    firsts, lasts = spans[:, 0], spans[:, 0] + spans[:, 1]
    try:
        names = cut_strings(raw.decode("latin-1") if ascii_names else raw, firsts, lasts)
    except UnicodeDecodeError:
        bad = next(row for row, (first, last) in enumerate(zip(firsts, lasts, strict=True))
                   if not _is_utf8(raw[first:last]))
        raise FormatError(f"tensor #{bad}: name at header byte {firsts[bad] + LENGTH_SIZE} is "
                          "not valid UTF-8", path=path, field="tensor name") from None
    return metadata, names, _ID_TO_CODE[ids], dims, starts, begins, ends


def read_header(buffer: Any, *, path: object = None) -> Header:
    """Parse and check the header of the file held in ``buffer`` (any bytes-like).

    Raises :class:`FormatError` naming ``path``, the tensor and the field for a
    header longer than 100,000,000 bytes or than the file, more than 65,536
    metadata entries, undecodable bytes,
    unknown dtypes, duplicate names, and data ranges that do not tile the data
    section exactly.
    """
    view = memoryview(buffer).cast("B")
    return read_header_at(lambda begin, end: bytes(view[begin:end]), len(view), path=path)


def read_header_at(read: Callable[[int, int], bytes], size: int, *, path: object = None
                   ) -> Header:
    """:func:`read_header` for a ``size``-byte file whose bytes ``[begin, end)``
    come from ``read(begin, end)`` (a pread, a ranged request): reads the first
    9 bytes, then the header, never the data."""
    fmt, length = detect(read(0, min(size, LENGTH_SIZE + 1)), size, path=path)
    raw = read(LENGTH_SIZE, LENGTH_SIZE + length)
    reader = _read_bintensors if fmt == BINTENSORS else _safetensors_header.decode
    metadata, names, codes, dims, starts, begins, ends = reader(raw, path=path)
    index = dict(zip(names, range(len(names)), strict=True))
    if len(index) != len(names):
        raise _duplicate(names, path=path)
    header = Header(fmt, metadata, names, codes, dims, starts, begins, ends,
                    LENGTH_SIZE + length, index)
    check_layout(header, size - header.data_start, path=path)
    return header


def encode_header(
    fmt: str,
    metadata: dict[str, str] | None,
    entries: list[tuple[str, int, tuple[int, ...], int, int]],
) -> bytes:
    """The 8-byte length and the padded header for ``entries`` of
    (name, code, shape, begin, end), already in write order. Raises ValueError
    for more than ``METADATA_LIMIT`` metadata entries (readers refuse them)."""
    if metadata is not None and len(metadata) > METADATA_LIMIT:
        raise ValueError(f"argument 'metadata': {len(metadata)} entries, more than the "
                         f"{METADATA_LIMIT} a header may hold; store large metadata as one "
                         "value (JSON text, say) or in a file beside this one")
    if fmt == BINTENSORS:
        body = _bincode.encode(metadata, [(n, BINTENSORS_ID[c], s, b, e)
                                          for n, c, s, b, e in entries])
    else:
        body = _safetensors_header.encode(metadata, entries)
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(LENGTH_SIZE, "little") + body
