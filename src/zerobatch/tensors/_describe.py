"""Human-readable summaries of tensor files, for ``zerobatch inspect``."""

from __future__ import annotations

import os

from zerobatch._text import format_table
from zerobatch.errors import FormatError
from zerobatch.tensors._format import LENGTH_SIZE, detect
from zerobatch.tensors._open import safe_open

__all__ = ["describe", "is_tensor_file"]


def is_tensor_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file whose first bytes look like bintensors or
    safetensors (a plausible header length and first header byte). Reads 9 bytes."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as file:
        prefix = file.read(LENGTH_SIZE + 1)
        size = os.fstat(file.fileno()).st_size
    try:
        detect(prefix, size, path=path)
    except FormatError:
        return False
    return True


def describe(path: str | os.PathLike[str]) -> str:
    """A table of the file's tensors (name, dtype, shape, byte offsets relative
    to the data section, bytes), in file order, after its format, sizes and
    metadata. Raises :class:`FormatError` for a malformed file."""
    with safe_open(path, "np") as file:
        header = file.header
        size = os.path.getsize(path)
        lines = [
            f"{os.fspath(path)}: {header.format}, {size} bytes, header {header.data_start} bytes "
            f"(with the 8-byte length), {len(header.names)} tensors",
        ]
        metadata = file.metadata()
        if metadata is None:
            lines.append("metadata: none")
        else:
            lines.append(f"metadata: {len(metadata)} entries")
            lines.extend(f"  {key!r}: {value!r}" for key, value in sorted(metadata.items()))
        rows = [["name", "dtype", "shape", "begin", "end", "bytes"]]
        for name in file.offset_keys():
            info = header.info(header.index[name])
            rows.append([name, info.dtype, str(list(info.shape)), str(info.begin), str(info.end),
                         str(info.end - info.begin)])
    return "\n".join([*lines, format_table(rows)])
