"""bintensors and safetensors: the tensor-file formats, byte for byte.

Both formats are one frame around a header; they differ only in how the
header is encoded (bincode for bintensors 0.2.0, JSON for safetensors 0.8.0)::

    offset    size  content
    0         8     N: header length in bytes, <u8, padding included
    8         N     header, then 0x20 (space) bytes until N % 8 == 0
    8+N       D     data: each tensor's elements, little-endian, C order,
                    back to back from data offset 0; D = file size - 8 - N

A header holds optional metadata (string keys to string values) and, per
tensor, its name, dtype, shape and data byte range ``[begin, end)``, counted
from the start of the data section (byte ``8 + N``). The first header byte
tells the formats apart: ``{`` is safetensors, 0x00 or 0x01 (the metadata
option tag) bintensors. Neither format stores a version or a checksum.

bintensors header (bincode 2, standard configuration)::

    header   := metadata tensors padding
    metadata := 0x00 | 0x01 varint(count) (string key, string value)*count
    tensors  := varint(count) (string name, varint(dtype id), varint(ndim),
                varint(dim)*ndim, varint(begin), varint(end))*count
    string   := varint(byte length) UTF-8 bytes
    varint   := v (v < 251) | 0xFB u16le | 0xFC u32le | 0xFD u64le

safetensors header: one JSON object, ``{"__metadata__": {str: str}, name:
{"dtype": "F32", "shape": [int, ...], "data_offsets": [begin, end]}, ...}``.

Element types (:data:`DTYPES`; a tensor's byte size is ``prod(shape) * bits /
8``; ``[]`` is a scalar, a shape with a 0 an empty tensor)::

    code  safetensors  bintensors id  bits     code  safetensors  bintensors id  bits
    0     BOOL         0              8        11    I16          5              16
    1     F4           -              4        12    U16          6              16
    2     F6_E2M3      -              6        13    F16          7              16
    3     F6_E3M2      -              6        14    BF16         8              16
    4     U8           1              8        15    I32          9              32
    5     I8           2              8        16    U32          10             32
    6     F8_E5M2      3              8        17    F32          11             32
    7     F8_E4M3      4              8        18    C64          -              64
    8     F8_E8M0      -              8        19    F64          12             64
    9     F8_E4M3FNUZ  -              8        20    I64          13             64
    10    F8_E5M2FNUZ  -              8        21    U64          14             64

Writers MUST:

- sort tensors by dtype, largest first (descending bintensors id, or
  descending code above for safetensors), then by name (UTF-8 bytes), and lay
  them out from data offset 0 without gaps, so each tensor is aligned to its
  element size;
- write bintensors metadata keys sorted by UTF-8 bytes, and the safetensors
  JSON compact (``","`` and ``":"`` separators, non-ASCII raw, ``__metadata__``
  first and only when metadata is given, entry keys ``dtype``, ``shape``,
  ``data_offsets`` in that order);
- pad the header with spaces to a multiple of :data:`ALIGNMENT` bytes.

Writers MUST NOT write more than :data:`METADATA_LIMIT` metadata entries, or a
safetensors tensor named ``__metadata__``. zerobatch writes the references'
bytes exactly (safetensors: with at most one metadata key, which it orders
randomly).

Readers MUST check, before mapping or allocating anything from the header's
numbers, and raise :class:`FormatError` naming the file, the tensor and the field:

1. the file holds at least 8 bytes; ``0 < N <= HEADER_LIMIT``; ``8 + N`` is
   within the file; the first header byte is ``{``, 0x00 or 0x01;
2. the header decodes completely: no value runs past ``N``; valid UTF-8;
   known dtype ids or strings; integers below ``2**64``; counts no larger than
   the bytes left; at most :data:`METADATA_LIMIT` metadata entries;
3. tensor names are unique (safetensors: metadata keys too, and each entry
   has exactly the keys ``dtype``, ``shape``, ``data_offsets``);
4. per tensor: at most :data:`MAX_DIMS` dimensions; ``prod(shape) * bits``,
   zero dimensions left out, below ``2**63``; ``end >= begin``; ``end - begin``
   equal to its byte size;
5. walking the tensors (bintensors: in stored order; safetensors: sorted by
   ``(begin, end)``, as each reference reader does), each ``begin`` equals the
   previous ``end``, from 0: no holes, no overlaps;
6. the last ``end`` equals ``D``: no trailing bytes, no truncated data.

Readers MUST NOT accept, beyond the references (so that a bintensors header
has one encoding): varints longer than their shortest form, unsorted or
repeated bintensors metadata keys, padding other than spaces, an escaped
spelling of ``__metadata__``, lone surrogates, fractions or exponents.
``docs/FORMAT.md`` mirrors this docstring with a worked example.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from zerobatch._jit import njit
from zerobatch.errors import FormatError
from zerobatch.tensors import _bincode, _json_scan

__all__ = [
    "ALIGNMENT",
    "BINTENSORS",
    "BINTENSORS_CODE",
    "BINTENSORS_ID",
    "DTYPES",
    "FORMATS",
    "HEADER_LIMIT",
    "LENGTH_SIZE",
    "MAX_DIMS",
    "METADATA_KEY",
    "METADATA_LIMIT",
    "SAFETENSORS",
    "SAFETENSORS_CODE",
    "DType",
    "Header",
    "SafetensorError",
    "SliceError",
    "TensorInfo",
    "TensorNotFound",
    "check_layout",
    "code_of_numpy",
    "detect",
    "encode_header",
    "numpy_dtype",
    "read_header",
    "read_header_at",
]

BINTENSORS = "bintensors"
SAFETENSORS = "safetensors"
FORMATS = (BINTENSORS, SAFETENSORS)

LENGTH_SIZE = 8
"""Bytes of the little-endian u64 header length that opens every file."""

ALIGNMENT = 8
"""The header (after the length) is padded with spaces to a multiple of this."""

HEADER_LIMIT = 100_000_000
"""Largest header (bytes after the 8-byte length) either reader accepts."""

METADATA_LIMIT = 65_536
"""Most metadata entries (key-value pairs) a header may hold. Readers refuse
more before building any string, writers before writing anything: a header
under ``HEADER_LIMIT`` could otherwise hold millions of entries, hundreds of
MB of Python strings. The reference writers store a few entries (``format``,
one per tied name dropped by ``save_model``, a training tool's settings)."""

METADATA_KEY = "__metadata__"
"""The safetensors header key that holds the metadata (never a tensor name)."""

MAX_DIMS = 64
"""Most dimensions a tensor may have: NumPy's limit."""

_BIT_LIMIT = np.uint64(2**63 - 1)
"""Largest shape x dtype size in bits (zero dimensions left out), so that every
accepted shape, empty ones included, is one NumPy and PyTorch can represent."""

_CHUNK = 1 << 16

SafetensorError = FormatError
"""Alias: ``except SafetensorError`` catches every error a safetensors call would
raise for a malformed file, a closed handle, a missing tensor or a refused slice."""


class TensorNotFound(FormatError, KeyError):
    """The file has no tensor of that name (also a ``KeyError``)."""

    __str__ = FormatError.__str__


class SliceError(FormatError, IndexError):
    """``get_slice(name)[index]`` with an index safetensors refuses (also an ``IndexError``)."""


@dataclass(frozen=True)
class DType:
    """One element type.

    Attributes:
        name: the safetensors dtype string (``"F32"``).
        bits: size of one element in bits (4 and 6 for the packed float types).
        bintensors_id: the bincode enum index in bintensors, or None where
            bintensors has no such type.
        numpy_name: the NumPy (or ``ml_dtypes``) type name, or None where NumPy
            has no packed equivalent.
        torch_name: the ``torch`` attribute name, or None.
    """

    name: str
    bits: int
    bintensors_id: int | None
    numpy_name: str | None
    torch_name: str | None


DTYPES: tuple[DType, ...] = (
    DType("BOOL", 8, 0, "bool", "bool"),
    DType("F4", 4, None, None, "float4_e2m1fn_x2"),
    DType("F6_E2M3", 6, None, None, None),
    DType("F6_E3M2", 6, None, None, None),
    DType("U8", 8, 1, "uint8", "uint8"),
    DType("I8", 8, 2, "int8", "int8"),
    DType("F8_E5M2", 8, 3, "float8_e5m2", "float8_e5m2"),
    DType("F8_E4M3", 8, 4, "float8_e4m3fn", "float8_e4m3fn"),
    DType("F8_E8M0", 8, None, "float8_e8m0fnu", "float8_e8m0fnu"),
    DType("F8_E4M3FNUZ", 8, None, "float8_e4m3fnuz", "float8_e4m3fnuz"),
    DType("F8_E5M2FNUZ", 8, None, "float8_e5m2fnuz", "float8_e5m2fnuz"),
    DType("I16", 16, 5, "int16", "int16"),
    DType("U16", 16, 6, "uint16", "uint16"),
    DType("F16", 16, 7, "float16", "float16"),
    DType("BF16", 16, 8, "bfloat16", "bfloat16"),
    DType("I32", 32, 9, "int32", "int32"),
    DType("U32", 32, 10, "uint32", "uint32"),
    DType("F32", 32, 11, "float32", "float32"),
    DType("C64", 64, None, "complex64", "complex64"),
    DType("F64", 64, 12, "float64", "float64"),
    DType("I64", 64, 13, "int64", "int64"),
    DType("U64", 64, 14, "uint64", "uint64"),
)

SAFETENSORS_CODE: dict[str, int] = {d.name: code for code, d in enumerate(DTYPES)}
"""safetensors dtype string -> code."""

BINTENSORS_CODE: dict[int, int] = {
    d.bintensors_id: code for code, d in enumerate(DTYPES) if d.bintensors_id is not None
}
"""bintensors dtype id -> code."""

BINTENSORS_ID: dict[int, int] = {code: dtype_id for dtype_id, code in BINTENSORS_CODE.items()}
"""code -> bintensors dtype id, for the dtypes bintensors has."""


@cache
def numpy_dtype(code: int) -> np.dtype[Any] | None:
    """The little-endian NumPy dtype for ``code``; None for packed sub-byte types."""
    name = DTYPES[code].numpy_name
    if name is None:
        return None
    if name.startswith(("float8", "bfloat")):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name).newbyteorder("<")


@cache
def _codes_by_numpy() -> dict[np.dtype[Any], int]:
    return {
        dtype: code
        for code in range(len(DTYPES))
        if (dtype := numpy_dtype(code)) is not None
    }


def code_of_numpy(dtype: np.dtype[Any]) -> int | None:
    """The code for a NumPy dtype (either byte order), or None if neither format has it."""
    codes = _codes_by_numpy()
    code = codes.get(dtype)
    if code is None and dtype.byteorder == ">":
        code = codes.get(dtype.newbyteorder("<"))
    return code


def _check_metadata_entries(count: int, *, path: object) -> None:
    """Raise :class:`FormatError` when a header holds more than ``METADATA_LIMIT``
    metadata entries."""
    if count > METADATA_LIMIT:
        raise FormatError(f"header holds {count} metadata entries, more than the limit of "
                          f"{METADATA_LIMIT}", path=path, field=METADATA_KEY)


def _cut_strings(source: str | bytes, starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]
                ) -> list[str]:
    """``source[start:end]`` for each pair, as str (bytes are decoded as UTF-8,
    raising UnicodeDecodeError). Offsets become Python ints a chunk at a time,
    so the temporary lists stay small next to the strings themselves."""
    result: list[str] = []
    for first in range(0, len(starts), _CHUNK):
        pairs = zip(starts[first : first + _CHUNK].tolist(),
                    ends[first : first + _CHUNK].tolist(), strict=True)
        if isinstance(source, str):
            result += [source[start:end] for start, end in pairs]
        else:
            result += [source[start:end].decode("utf-8") for start, end in pairs]
    return result


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: dtype string, shape, and byte range in the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A validated header, one column per field, rows in stored order.

    ``dims[dim_starts[i]:dim_starts[i + 1]]`` is the shape of tensor ``i``;
    ``begins``/``ends`` are byte offsets relative to ``data_start``.
    """

    format: str
    metadata: dict[str, str] | None
    names: list[str]
    codes: np.ndarray[Any, np.dtype[np.uint8]]
    dims: np.ndarray[Any, np.dtype[np.uint64]]
    dim_starts: np.ndarray[Any, np.dtype[np.int64]]
    begins: np.ndarray[Any, np.dtype[np.uint64]]
    ends: np.ndarray[Any, np.dtype[np.uint64]]
    data_start: int
    index: dict[str, int] = field(repr=False)

    def info(self, row: int) -> TensorInfo:
        """The tensor stored at ``row``."""
        shape = tuple(self.dims[self.dim_starts[row] : self.dim_starts[row + 1]].tolist())
        return TensorInfo(
            self.names[row],
            DTYPES[int(self.codes[row])].name,
            shape,
            int(self.begins[row]),
            int(self.ends[row]),
        )

    def offset_order(self) -> list[str]:
        """Tensor names sorted by where their data begins."""
        order = np.lexsort((self.ends, self.begins))
        return [self.names[row] for row in order.tolist()]


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
        _check_metadata_entries(len(meta), path=path)
        try:
            keys = _cut_strings(raw, meta[:, 0, 0], meta[:, 0, 0] + meta[:, 0, 1])
            values = _cut_strings(raw, meta[:, 1, 0], meta[:, 1, 0] + meta[:, 1, 1])
        except UnicodeDecodeError:
            raise FormatError("a metadata key or value is not valid UTF-8", path=path,
                              field=METADATA_KEY) from None
        metadata = dict(zip(keys, values, strict=True))
    firsts, lasts = spans[:, 0], spans[:, 0] + spans[:, 1]
    try:
        names = _cut_strings(raw.decode("latin-1") if ascii_names else raw, firsts, lasts)
    except UnicodeDecodeError:
        bad = next(row for row, (first, last) in enumerate(zip(firsts, lasts, strict=True))
                   if not _is_utf8(raw[first:last]))
        raise FormatError(f"tensor #{bad}: name at header byte {firsts[bad] + LENGTH_SIZE} is "
                          "not valid UTF-8", path=path, field="tensor name") from None
    return metadata, names, _ID_TO_CODE[ids], dims, starts, begins, ends


_QUOTE, _COMMA, _BRACKET = b'"'[0], b","[0], b"["[0]

_TABLE = np.zeros((len(DTYPES), 16), np.uint8)
_LENGTHS = np.array([len(d.name) for d in DTYPES], np.int64)
for _code, _dtype in enumerate(DTYPES):
    _TABLE[_code, : len(_dtype.name)] = np.frombuffer(_dtype.name.encode(), np.uint8)


def _strings(raw: bytes, text: str | None, spans: np.ndarray[Any, Any], *,
             path: object) -> list[str]:
    """The strings at ``spans`` rows (start, end, escaped); ``text`` is the
    header decoded when it is pure ASCII, so byte offsets are character offsets."""
    result = _cut_strings(raw if text is None else text, spans[:, 0], spans[:, 1])
    for row in np.flatnonzero(spans[:, 2]).tolist():
        value = json.loads(f'"{result[row]}"')
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise FormatError(f"string at header byte {spans[row, 0] + LENGTH_SIZE} escapes a "
                              "lone surrogate", path=path, field="header") from None
        result[row] = value
    return result


def _read_safetensors(raw: bytes, *, path: object) -> tuple[Any, ...]:
    """(metadata, names, codes, dims, dim_starts, begins, ends) from header
    bytes (padding included), rows in stored order."""
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FormatError(f"header is not valid UTF-8 ({error.reason} at header byte "
                          f"{error.start + LENGTH_SIZE})", path=path, field="header") from None
    h = np.frombuffer(raw, np.uint8)
    (error_code, pos, row, has_meta, meta, spans, codes, dims, starts, begins,
     ends) = _json_scan.scan(h, _TABLE, _LENGTHS, np.count_nonzero(h == _QUOTE) // 2,
                             np.count_nonzero(h == _COMMA) + np.count_nonzero(h == _BRACKET))
    if error_code:
        message, field = _json_scan.ERRORS[error_code]
        where = f"tensor #{row}: " if row >= 0 else ""
        raise FormatError(f"{where}{message} (header byte {pos + LENGTH_SIZE})", path=path,
                          field=field)
    if has_meta:
        _check_metadata_entries(len(meta) // 2, path=path)
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
    reader = _read_bintensors if fmt == BINTENSORS else _read_safetensors
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
        body = _encode_safetensors(metadata, entries)
    body += b" " * (-len(body) % ALIGNMENT)
    return len(body).to_bytes(LENGTH_SIZE, "little") + body


def _encode_safetensors(
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


_OK = 0
_OVERFLOW = 1
_PARTIAL_BYTE = 2
_REVERSED = 3
_HOLE = 4
_OVERLAP = 5
_SIZE = 6
_TOO_MANY_DIMS = 7

_BITS = np.array([d.bits for d in DTYPES], np.uint64)


@njit(cache=True, nogil=True)
def _walk(order: Any, bits: Any, codes: Any, dims: Any, starts: Any, begins: Any,
          ends: Any) -> Any:
    """(error, row, end of the last tensor) walking rows in ``order`` from offset 0."""
    expected = np.uint64(0)
    for row in order:
        if starts[row + 1] - starts[row] > MAX_DIMS:
            return _TOO_MANY_DIMS, row, np.uint64(0)
        span = bits[codes[row]]
        empty = False
        for k in range(starts[row], starts[row + 1]):
            dim = dims[k]
            if dim == 0:
                empty = True
            elif span > _BIT_LIMIT // dim:
                return _OVERFLOW, row, np.uint64(0)
            else:
                span *= dim
        total = np.uint64(0) if empty else span
        if total % np.uint64(8) != 0:
            return _PARTIAL_BYTE, row, np.uint64(0)
        begin = begins[row]
        end = ends[row]
        if end < begin:
            return _REVERSED, row, np.uint64(0)
        if begin > expected:
            return _HOLE, row, np.uint64(0)
        if begin < expected:
            return _OVERLAP, row, np.uint64(0)
        if end - begin != total // np.uint64(8):
            return _SIZE, row, np.uint64(0)
        expected = end
    return _OK, -1, expected


def _message(code: int, header: Header, row: int) -> tuple[str, str]:
    if code == _TOO_MANY_DIMS:
        ndim = int(header.dim_starts[row + 1] - header.dim_starts[row])
        return (f"tensor {header.names[row]!r}: {ndim} dimensions, more than the "
                f"{MAX_DIMS} NumPy supports", "shape")
    info = header.info(row)
    where = f"tensor {info.name!r} ({info.dtype}, shape {list(info.shape)})"
    if code == _OVERFLOW:
        return (f"{where}: shape too large (integer overflow): its elements, zero dimensions "
                "left out, would need 2**63 bits or more", "shape")
    if code == _PARTIAL_BYTE:
        return f"{where}: packed elements do not fill whole bytes", "shape"
    if code == _REVERSED:
        return f"{where}: data offsets [{info.begin}, {info.end}] end before they begin", (
            "data_offsets"
        )
    if code in (_HOLE, _OVERLAP):
        problem = "leave a hole before them" if code == _HOLE else "overlap the previous tensor"
        walk = "in stored order" if header.format == BINTENSORS else "sorted by offset"
        return (
            f"{where}: data offsets [{info.begin}, {info.end}] {problem}; "
            f"tensors must be contiguous from offset 0 ({walk})",
            "data_offsets",
        )
    count = 1
    for dim in info.shape:
        count *= dim
    return (
        f"{where}: data offsets [{info.begin}, {info.end}] hold {info.end - info.begin} bytes, "
        f"shape x dtype needs {count * DTYPES[int(header.codes[row])].bits // 8}",
        "data_offsets",
    )


def check_layout(header: Header, data_len: int, *, path: object) -> None:
    """Raise :class:`FormatError` unless the tensors tile ``data_len`` bytes exactly.

    bintensors is walked in stored order, safetensors sorted by (begin, end),
    as each reference reader does.
    """
    if header.format == BINTENSORS:
        order = np.arange(len(header.names))
    else:
        order = np.lexsort((header.ends, header.begins))
    code, row, end = _walk(
        order, _BITS, header.codes, header.dims, header.dim_starts, header.begins, header.ends
    )
    if code != _OK:
        message, field = _message(code, header, row)
        raise FormatError(message, path=path, field=field)
    if end != data_len:
        hint = "trailing bytes after the last tensor" if data_len > end else (
            "file seems not fully written?"
        )
        raise FormatError(
            f"tensors cover {end} data bytes but the file holds {data_len}: {hint}",
            path=path,
            field="data_offsets",
        )
