"""bintensors and safetensors files: byte-compatible with the reference
packages of those names, read zero-copy, checked before anything is mapped.

Both formats: ``N`` (u64 little-endian), ``N`` header bytes padded with spaces
to a multiple of 8, then the tensors' bytes, little-endian, C order, packed
back to back from offset 0. bintensors encodes the header with bincode,
safetensors with JSON; readers tell them apart by the header's first byte.
:mod:`zerobatch.tensors.format` is the spec (``docs/FORMAT.md`` mirrors it).

Example (the bytes equal ``bintensors.numpy.save`` of the same input)::

    >>> import numpy as np
    >>> from zerobatch import tensors
    >>> data = tensors.save({"w": np.array([[1.0, 2.0]], np.float32)})
    >>> data[:8] == (16).to_bytes(8, "little") and len(data) == 32
    True
    >>> tensors.load(data)["w"].tolist()
    [[1.0, 2.0]]

``zerobatch.tensors.torch``, ``.numpy``, ``.jax`` and ``.flax`` are drop-ins
for the modules of the same names in safetensors 0.8.0 (``save_model``,
``load_model``, ``safe_open`` and the rest): only the import changes.

Reading never copies on the CPU: NumPy arrays are read-only views of a memory
map, PyTorch tensors writable views of a private copy-on-write map. Every
header is checked completely before any tensor is handed out; a malformed
file raises :class:`zerobatch.FormatError` naming the file, tensor and field.
"""

from __future__ import annotations

from zerobatch.tensors._api import (
    checksum,
    load,
    load_file,
    save,
    save_file,
    save_with_checksum,
)
from zerobatch.tensors._dropin import TensorSpec, deserialize, serialize, serialize_file
from zerobatch.tensors._open import TensorSlice, describe, is_tensor_file, safe_open
from zerobatch.tensors.format import (
    BINTENSORS,
    HEADER_LIMIT,
    METADATA_LIMIT,
    SAFETENSORS,
    Header,
    SafetensorError,
    SliceError,
    TensorInfo,
    TensorNotFound,
)

__all__ = [
    "BINTENSORS",
    "HEADER_LIMIT",
    "METADATA_LIMIT",
    "SAFETENSORS",
    "Header",
    "SafetensorError",
    "SliceError",
    "TensorInfo",
    "TensorNotFound",
    "TensorSlice",
    "TensorSpec",
    "checksum",
    "describe",
    "deserialize",
    "is_tensor_file",
    "load",
    "load_file",
    "safe_open",
    "save",
    "save_file",
    "save_with_checksum",
    "serialize",
    "serialize_file",
]
