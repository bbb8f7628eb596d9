"""The safetensors header codec: one compact JSON object.

``{"__metadata__": {str: str}, name: {"dtype": str, "shape": [int, ...],
"data_offsets": [begin, end]}, ...}`` with no spaces (``","`` and ``":"``
separators), non-ASCII characters written raw, then spaces up to a multiple
of 8 bytes. The decoder accepts any JSON whitespace and key order but rejects
duplicate keys, unknown keys, non-string metadata values, lone surrogates and
numbers that are not integers in ``[0, 2**64)``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.tensors import _json_scan
from zerobatch.tensors._dtypes import DTYPES
from zerobatch.tensors._header import check_metadata_entries, cut_strings

__all__ = ["METADATA_KEY", "decode", "encode"]

METADATA_KEY = "__metadata__"
_LENGTH_SIZE = 8
_QUOTE, _COMMA, _BRACKET = b'"'[0], b","[0], b"["[0]

_TABLE = np.zeros((len(DTYPES), 16), np.uint8)
_LENGTHS = np.array([len(d.name) for d in DTYPES], np.int64)
for _code, _dtype in enumerate(DTYPES):
    _TABLE[_code, : len(_dtype.name)] = np.frombuffer(_dtype.name.encode(), np.uint8)


def _strings(raw: bytes, text: str | None, spans: np.ndarray[Any, Any], *,
             path: object) -> list[str]:
    """The strings at ``spans`` rows (start, end, escaped); ``text`` is the
    header decoded when it is pure ASCII, so byte offsets are character offsets."""
    result = cut_strings(raw if text is None else text, spans[:, 0], spans[:, 1])
    for row in np.flatnonzero(spans[:, 2]).tolist():
        value = json.loads(f'"{result[row]}"')
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise FormatError(f"string at header byte {spans[row, 0] + _LENGTH_SIZE} escapes a "
                              "lone surrogate", path=path, field="header") from None
        result[row] = value
    return result


def decode(raw: bytes, *, path: object) -> tuple[Any, ...]:
    """(metadata, names, codes, dims, dim_starts, begins, ends) from header
    bytes (padding included), rows in stored order."""
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FormatError(f"header is not valid UTF-8 ({error.reason} at header byte "
                          f"{error.start + _LENGTH_SIZE})", path=path, field="header") from None
    h = np.frombuffer(raw, np.uint8)
    (error_code, pos, row, has_meta, meta, spans, codes, dims, starts, begins,
     ends) = _json_scan.scan(h, _TABLE, _LENGTHS, np.count_nonzero(h == _QUOTE) // 2,
                             np.count_nonzero(h == _COMMA) + np.count_nonzero(h == _BRACKET))
    if error_code:
        message, field = _json_scan.ERRORS[error_code]
        where = f"tensor #{row}: " if row >= 0 else ""
        raise FormatError(f"{where}{message} (header byte {pos + _LENGTH_SIZE})", path=path,
                          field=field)
    if has_meta:
        check_metadata_entries(len(meta) // 2, path=path)
    if not raw.isascii():
        text = None
    names = _strings(raw, text, spans, path=path)
    if METADATA_KEY in names:
        raise FormatError(f"{METADATA_KEY!r} must not be written with escapes", path=path,
                          field=METADATA_KEY)
    metadata = None
    if has_meta:
        pairs = _strings(raw, text, meta, path=path)
        metadata = dict(zip(pairs[::2], pairs[1::2], strict=True))
        if len(metadata) != len(pairs) // 2:
            raise FormatError("duplicate metadata key", path=path, field=METADATA_KEY)
    return metadata, names, codes, dims, starts, begins, ends


def encode(
    metadata: dict[str, str] | None,
    entries: list[tuple[str, int, tuple[int, ...], int, int]],
) -> bytes:
    """Header JSON bytes (unpadded) for ``entries`` of (name, code, shape, begin, end)."""
    dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    parts = []
    if metadata is not None:
        items = ",".join(f"{dump(k)}:{dump(metadata[k])}" for k in sorted(metadata))
        parts.append(f'"{METADATA_KEY}":{{{items}}}')
    for name, code, shape, begin, end in entries:
        dims = ",".join(map(str, shape))
        parts.append(f'{dump(name)}:{{"dtype":"{DTYPES[code].name}","shape":[{dims}],'
                     f'"data_offsets":[{begin},{end}]}}')
    return ("{" + ",".join(parts) + "}").encode("utf-8")
