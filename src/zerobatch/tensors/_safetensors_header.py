"""The safetensors header codec: one compact JSON object.

``{"__metadata__": {str: str}, name: {"dtype": str, "shape": [int, ...],
"data_offsets": [begin, end]}, ...}`` with no spaces (``","`` and ``":"``
separators), non-ASCII characters written raw, then spaces up to a multiple
of 8 bytes. The decoder accepts any JSON whitespace but rejects duplicate keys,
unknown keys, non-string metadata values and numbers that are not integers in
``[0, 2**64)``.
"""

from __future__ import annotations

import json
from typing import Any

from zerobatch.errors import FormatError
from zerobatch.tensors._dtypes import DTYPES, SAFETENSORS_CODE

__all__ = ["METADATA_KEY", "decode", "encode"]

METADATA_KEY = "__metadata__"
_FIELDS = ("dtype", "shape", "data_offsets")
_U64_LIMIT = 2**64


class _DuplicateKeyError(Exception):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return result


def _reject_number(text: str) -> Any:
    raise ValueError(f"number {text} is not an integer")


def _parse(raw: bytes, *, path: object) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FormatError(f"header is not valid UTF-8 ({error.reason} at byte {error.start + 8})",
                          path=path, field="header") from None
    if not text.startswith("{"):
        raise FormatError("header must start with '{'", path=path, field="header")
    try:
        return json.loads(text, object_pairs_hook=_unique, parse_float=_reject_number,
                          parse_constant=_reject_number)
    except _DuplicateKeyError as error:
        raise FormatError(f"duplicate key {error.args[0]!r} in the header JSON", path=path,
                          field=str(error.args[0])) from None
    except (ValueError, RecursionError) as error:
        raise FormatError(f"header is not valid JSON: {error}", path=path,
                          field="header") from None


def _uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < _U64_LIMIT


def _metadata(value: Any, *, path: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(type(v) is str for v in value.values()):
        raise FormatError("metadata must be an object of string values", path=path,
                          field=METADATA_KEY)
    return value


def decode(raw: bytes, *, path: object) -> tuple[dict[str, str] | None, list[str], list[int],
                                                   list[list[int]], list[int], list[int]]:
    """(metadata, names, codes, shapes, begins, ends) from header bytes, stored order."""
    tree = _parse(raw, path=path)
    if not isinstance(tree, dict):
        raise FormatError("header must be a JSON object", path=path, field="header")
    metadata = None
    names: list[str] = []
    codes: list[int] = []
    shapes: list[list[int]] = []
    begins: list[int] = []
    ends: list[int] = []
    for name, entry in tree.items():
        if name == METADATA_KEY:
            metadata = _metadata(entry, path=path)
            continue
        if not isinstance(entry, dict) or entry.keys() != set(_FIELDS):
            raise FormatError(f"tensor {name!r}: expected exactly the keys {list(_FIELDS)}",
                              path=path, field=name)
        code = SAFETENSORS_CODE.get(entry["dtype"]) if type(entry["dtype"]) is str else None
        if code is None:
            raise FormatError(f"tensor {name!r}: unknown dtype {entry['dtype']!r}", path=path,
                              field="dtype")
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(_uint(d) for d in shape):
            raise FormatError(f"tensor {name!r}: shape must be a list of integers in [0, 2**64)",
                              path=path, field="shape")
        offsets = entry["data_offsets"]
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_uint, offsets)):
            raise FormatError(f"tensor {name!r}: data_offsets must be two integers in [0, 2**64)",
                              path=path, field="data_offsets")
        names.append(name)
        codes.append(code)
        shapes.append(shape)
        begins.append(offsets[0])
        ends.append(offsets[1])
    return metadata, names, codes, shapes, begins, ends


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
