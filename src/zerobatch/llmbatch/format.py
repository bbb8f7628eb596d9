"""LLMBATCH: pre-formed batches of tokens, one page-aligned slot per batch.

A ``.batch`` file is a 4096-byte header followed by ``num_batches`` slots. Slot
``i`` starts at byte ``HEADER_SIZE + i * padded_batch_bytes`` and holds one batch
as a row-major ``[batch_size, seq_len]`` array of little-endian tokens, then
zeros up to the next multiple of ``PAGE``::

    offset  size  type  field          meaning
    0       8     8s    magic          b"LLMBATCH"
    8       4     <u4   version        1
    12      4     <u4   batch_size     records per batch, >= 1
    16      4     <u4   seq_len        tokens per record, >= 1
    20      8     <u8   num_batches    slots in the file, >= 1
    28      4     <u4   dtype          0 = uint32 tokens, 1 = uint16 tokens
    32      4     <u4   seed           the write seed (records' write-time shuffle)
    36      4     <u4   total_records  records given to the writer
    40      4056  zeros reserved

    raw_batch_bytes    = batch_size * seq_len * itemsize(dtype)
    padded_batch_bytes = ceil(raw_batch_bytes / PAGE) * PAGE
    file size          = HEADER_SIZE + num_batches * padded_batch_bytes

Writers MUST write zeros in the reserved bytes and in slot padding; readers
MUST NOT interpret them. Readers MUST reject a file whose size is not exactly
the size the header implies, and MUST NOT map anything before checking it.
Dtype code 0 is the original format, byte for byte; code 1 (uint16) is a
zerobatch extension that halves storage when the vocabulary has < 65,536 ids.
A *sharded* batch dataset is a folder of ``NNNNN.batch`` files that share
batch_size, seq_len, dtype and seed, listed in order by ``manifest.json``.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch._json import load_json, read_capped
from zerobatch.errors import FormatError

__all__ = [
    "DTYPE_CODES",
    "HEADER_SIZE",
    "MAGIC",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "PAGE",
    "VERSION",
    "BatchHeader",
    "check_manifest",
    "dtype_code",
    "load_manifest",
    "manifest_bytes",
    "read_header",
    "read_manifest_format",
    "shard_name",
    "shard_path",
]

MAGIC = b"LLMBATCH"
VERSION = 1
HEADER_SIZE = 4096
PAGE = 4096
DTYPE_CODES: dict[int, np.dtype] = {0: np.dtype("<u4"), 1: np.dtype("<u2")}
"""Token dtype by header code: 0 is the spec's uint32, 1 is our uint16 extension."""
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "zerobatch.llmbatch-shards"
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest larger than this is refused unread

_FIELDS = struct.Struct("<8sIIIQIII")  # the 40 defined bytes; the rest of the page is zeros
_U32_MAX = 2**32 - 1


def dtype_code(dtype: npt.DTypeLike) -> int:
    """The header code of a token dtype (``"uint32"``, ``np.uint16``, ``"<u2"`` ...)."""
    try:
        wanted = np.dtype(dtype).newbyteorder("<")
    except TypeError as error:
        raise ValueError(f"dtype must be uint32 or uint16, got {dtype!r}") from error
    for code, known in DTYPE_CODES.items():
        if known == wanted:
            return code
    raise ValueError(f"dtype must be uint32 or uint16, got {dtype!r}")


@dataclass(frozen=True)
class BatchHeader:
    """The header of one ``.batch`` file; sizes in bytes."""

    batch_size: int
    seq_len: int
    num_batches: int
    dtype: int
    seed: int
    total_records: int
    version: int = VERSION

    @property
    def token_dtype(self) -> np.dtype:
        """The NumPy dtype of stored tokens (little-endian)."""
        return DTYPE_CODES[self.dtype]

    @property
    def raw_batch_bytes(self) -> int:
        """Bytes of tokens in one batch."""
        return self.batch_size * self.seq_len * self.token_dtype.itemsize

    @property
    def padded_batch_bytes(self) -> int:
        """Bytes of one slot: the batch rounded up to a whole page."""
        return -(-self.raw_batch_bytes // PAGE) * PAGE

    @property
    def file_size(self) -> int:
        """The exact size of a file with this header."""
        return HEADER_SIZE + self.num_batches * self.padded_batch_bytes

    def batch_offset(self, index: int) -> int:
        """Byte offset of batch ``index``'s slot."""
        return HEADER_SIZE + index * self.padded_batch_bytes

    def pack(self) -> bytes:
        """The 4096 header bytes."""
        for name in ("batch_size", "seq_len", "seed", "total_records"):
            value = getattr(self, name)
            if not 0 <= value <= _U32_MAX:
                raise ValueError(f"{name}={value} does not fit the header's uint32 field")
        packed = _FIELDS.pack(
            MAGIC,
            self.version,
            self.batch_size,
            self.seq_len,
            self.num_batches,
            self.dtype,
            self.seed,
            self.total_records,
        )
        return packed + bytes(HEADER_SIZE - len(packed))

    @classmethod
    def unpack(cls, data: bytes, *, path: object = None) -> BatchHeader:
        """Parse and check the fields of a header (not yet against a file size)."""
        if len(data) < HEADER_SIZE:
            raise FormatError(
                f"expected a {HEADER_SIZE}-byte header, found {len(data)} bytes; "
                "file seems not fully written?",
                path=path,
                field="header",
            )
        magic, version, batch_size, seq_len, num_batches, dtype, seed, total = _FIELDS.unpack_from(
            data
        )
        if magic != MAGIC:
            raise FormatError(
                f"expected magic {MAGIC!r}, found {magic!r}: not an LLMBATCH file",
                path=path,
                field="magic",
            )
        if version != VERSION:
            raise FormatError(
                f"expected version {VERSION}, found {version}; "
                "written by a newer zerobatch? upgrade to read it",
                path=path,
                field="version",
            )
        if dtype not in DTYPE_CODES:
            raise FormatError(
                f"unknown dtype code {dtype} (known: 0 = uint32, 1 = uint16)",
                path=path,
                field="dtype",
            )
        for name, value in (
            ("batch_size", batch_size),
            ("seq_len", seq_len),
            ("num_batches", num_batches),
        ):
            if value == 0:
                raise FormatError(
                    f"{name} is 0; a batch file needs at least 1", path=path, field=name
                )
        if num_batches * batch_size > total:
            raise FormatError(
                f"{num_batches} batches of {batch_size} records need {num_batches * batch_size} "
                f"records, but total_records is {total}",
                path=path,
                field="total_records",
            )
        return cls(batch_size, seq_len, num_batches, dtype, seed, total, version)

    def check_file_size(self, size: int, *, path: object = None) -> None:
        """Raise ``FormatError`` unless a file of ``size`` bytes matches this header."""
        expected = self.file_size
        if size < expected:
            raise FormatError(
                f"header promises {self.num_batches} batches of {self.padded_batch_bytes} "
                f"bytes ({expected} bytes in all), but the file has {size}; "
                "file seems not fully written?",
                path=path,
                field="num_batches",
            )
        if size > expected:
            raise FormatError(
                f"file has {size - expected} bytes after the last batch slot "
                f"(expected exactly {expected} bytes); not written by an LLMBATCH writer?",
                path=path,
                field="num_batches",
            )


def read_header(path: str | os.PathLike[str]) -> BatchHeader:
    """Read and check the header of ``path`` against the file's real size."""
    path = Path(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        header = BatchHeader.unpack(file.read(HEADER_SIZE), path=path)
    header.check_file_size(size, path=path)
    return header


def read_manifest_format(path: Path) -> str | None:
    """The ``format`` key of the JSON file at ``path``; None when it is missing,
    unreadable or not a JSON object."""
    try:
        with open(path, "rb") as file:
            raw = read_capped(file, MAX_MANIFEST_BYTES)
        data = load_json(raw, path=path, field="manifest", max_bytes=MAX_MANIFEST_BYTES)
    except (OSError, FormatError):
        return None
    return data.get("format") if isinstance(data, dict) else None


def shard_path(folder: Path, entry: Any, position: int, manifest: Path) -> Path:
    """The path of shard ``position`` after checking its name (:func:`shard_name`)
    names a regular file in ``folder``."""
    name = shard_name(entry, position, manifest)
    where = f"shards[{position}].name"
    path = folder / name
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise FormatError(f"shard {name!r} cannot be opened ({error.strerror})",
                          path=path, field=where) from None
    if not stat.S_ISREG(mode):
        raise FormatError(f"shard {name!r} is not a regular file", path=path, field=where)
    return path


def shard_name(entry: Any, position: int, manifest: object) -> str:
    """The name of shard ``position``: a printable ``*.batch`` file name (no
    separator, NUL or control character, at most 255 UTF-8 bytes)."""
    name = entry.get("name") if isinstance(entry, dict) else None
    where = f"shards[{position}].name"
    ok = (isinstance(name, str) and name.isprintable() and name.endswith(".batch")
          and not name.startswith(".") and not any(c in name for c in "/\\\x00"))
    try:
        ok = ok and len(name.encode("utf-8")) <= 255  # type: ignore[union-attr]
    except UnicodeEncodeError:
        ok = False
    if not ok:
        raise FormatError(f"expected a plain '*.batch' file name, found {name!r:.80}",
                          path=manifest, field=where)
    return str(name)


def load_manifest(folder: Path) -> tuple[dict[str, Any], list[Path]]:
    """Parse and check a shard manifest; returns it and the shard paths in order."""
    path = folder / MANIFEST_NAME
    try:
        with open(path, "rb") as file:
            raw = read_capped(file, MAX_MANIFEST_BYTES)
    except OSError as error:
        raise FormatError(f"cannot be read ({error.strerror}): not a batch shard folder, or "
                          "not fully written", path=path, field="manifest") from None
    manifest = check_manifest(raw, path)
    paths = [shard_path(folder, entry, position, path)
             for position, entry in enumerate(manifest["shards"])]
    return manifest, paths


def check_manifest(raw: bytes, path: object) -> dict[str, Any]:
    """Parse and check the bytes of a shard manifest (shard names unchecked)."""
    manifest = load_json(raw, path=path, field="manifest", max_bytes=MAX_MANIFEST_BYTES)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"expected format {MANIFEST_FORMAT!r}", path=path, field="format")
    if manifest.get("version") != MANIFEST_VERSION:
        raise FormatError(
            f"expected version 1, found {manifest.get('version')!r:.80}", path=path,
            field="version",
        )
    for key in ("batch_size", "seq_len", "seed", "total_records", "num_batches"):
        value = manifest.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise FormatError(f"expected a non-negative int64, found {value!r:.80}", path=path,
                              field=key)
    dtype = manifest.get("dtype")
    try:
        if not isinstance(dtype, str):
            raise ValueError(f"expected a dtype name, found {dtype!r:.80}")
        manifest["dtype_code"] = dtype_code(dtype)
    except (ValueError, TypeError) as error:
        raise FormatError(str(error), path=path, field="dtype") from None
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise FormatError("expected a non-empty list of shards", path=path, field="shards")
    return manifest


def manifest_bytes(header: BatchHeader, names: list[str], headers: list[BatchHeader]) -> bytes:
    """The shard manifest of a dataset whose shards ``names`` have ``headers``,
    ``header`` describing the whole dataset."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "batch_size": header.batch_size,
        "seq_len": header.seq_len,
        "dtype": DTYPE_CODES[header.dtype].name,
        "seed": header.seed,
        "total_records": header.total_records,
        "num_batches": header.num_batches,
        "shards": [
            {"name": name, "num_batches": h.num_batches, "bytes": h.file_size}
            for name, h in zip(names, headers, strict=True)
        ],
    }
    return (json.dumps(manifest, indent=2) + "\n").encode()
