"""Hand-made bincode bytes for crafting bintensors headers in tests.

Written from the format description, independently of zerobatch's codec, so
tests can build headers the encoder would never produce.
"""

from __future__ import annotations

import struct


def varint(value: int) -> bytes:
    """bincode's variable-length integer; values past 64 bits get the u128 tag (251..254)."""
    if value < 251:
        return bytes([value])
    for tag, width in ((251, 2), (252, 4), (253, 8)):
        if value < 1 << (8 * width):
            return bytes([tag]) + value.to_bytes(width, "little")
    return bytes([254]) + value.to_bytes(16, "little")


def text(value: bytes) -> bytes:
    """A length-prefixed string."""
    return varint(len(value)) + value


def framed(header: bytes, data: bytes = b"", *, pad: bytes = b" ") -> bytes:
    """An 8-byte little-endian header length, the header padded with ``pad`` to a
    multiple of 8 (spaces, as writers do; none when ``pad`` is empty), then the data."""
    if pad:
        header += pad * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data
