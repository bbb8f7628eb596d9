"""LLMBATCH: pre-formed, page-aligned batches of tokens (seed 000).

- :mod:`zerobatch.llmbatch.format`: the spec (file header, slots, shard manifest).
- :mod:`zerobatch.llmbatch.writer`: ``write_batch_file``, ``write_batch_dataset``.
- :mod:`zerobatch.llmbatch.reader`: ``BatchFileReader``, a source of whole batches.
- :mod:`zerobatch.llmbatch.loader`: ``BatchNativeLoader``, seed 000's loader.
- :mod:`zerobatch.llmbatch.validate`: the checks, shared by the reader and ``verify``.

``zerobatch.batch_writer``, ``zerobatch.batch_loader`` and
``zerobatch.batch_format`` re-export these under seed 000's module names.
"""

from __future__ import annotations

from zerobatch.llmbatch.format import BatchHeader, read_header
from zerobatch.llmbatch.loader import BatchNativeLoader
from zerobatch.llmbatch.reader import BatchFileReader, describe, is_batch_file
from zerobatch.llmbatch.verify import verify
from zerobatch.llmbatch.writer import write_batch_dataset, write_batch_file

__all__ = [
    "BatchFileReader",
    "BatchHeader",
    "BatchNativeLoader",
    "describe",
    "is_batch_file",
    "read_header",
    "verify",
    "write_batch_dataset",
    "write_batch_file",
]
