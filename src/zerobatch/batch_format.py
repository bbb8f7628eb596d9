"""Seed 000's name for :mod:`zerobatch.llmbatch.format`, the LLMBATCH spec."""

from zerobatch.llmbatch.format import (
    DTYPE_CODES,
    HEADER_SIZE,
    MAGIC,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    PAGE,
    VERSION,
    BatchHeader,
    dtype_code,
    read_header,
)

__all__ = [
    "DTYPE_CODES",
    "HEADER_SIZE",
    "MAGIC",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "PAGE",
    "VERSION",
    "BatchHeader",
    "dtype_code",
    "read_header",
]
