"""The parsed header of a tensor file, in columns, shared by both formats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.tensors._dtypes import DTYPES

__all__ = [
    "BINTENSORS",
    "FORMATS",
    "HEADER_LIMIT",
    "METADATA_LIMIT",
    "SAFETENSORS",
    "Header",
    "TensorInfo",
    "check_metadata_entries",
    "cut_strings",
]

BINTENSORS = "bintensors"
SAFETENSORS = "safetensors"
FORMATS = (BINTENSORS, SAFETENSORS)
HEADER_LIMIT = 100_000_000
"""Largest header (bytes after the 8-byte length) either reader accepts."""

METADATA_LIMIT = 65_536
"""Most metadata entries (key-value pairs) a header may hold. Readers refuse
more before building any string, writers before writing anything: a header
under ``HEADER_LIMIT`` could otherwise hold millions of entries, hundreds of
MB of Python strings. The reference writers store a few entries (``format``,
one per tied name dropped by ``save_model``, a training tool's settings)."""

_CHUNK = 1 << 16


def check_metadata_entries(count: int, *, path: object) -> None:
    """Raise :class:`FormatError` when a header holds more than ``METADATA_LIMIT``
    metadata entries."""
    if count > METADATA_LIMIT:
        raise FormatError(f"header holds {count} metadata entries, more than the limit of "
                          f"{METADATA_LIMIT}", path=path, field="__metadata__")


def cut_strings(source: str | bytes, starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]
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
