"""Reading a tensor file: ``safe_open`` parses and checks the header once and
hands tensors out lazily; ``describe`` and ``is_tensor_file`` serve
``zerobatch inspect``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import numpy as np

from zerobatch._text import format_table
from zerobatch.errors import FormatError
from zerobatch.tensors._frameworks import Adapter, adapter, view
from zerobatch.tensors._source import Source, open_source
from zerobatch.tensors.format import (
    LENGTH_SIZE,
    Header,
    SafetensorError,
    TensorNotFound,
    detect,
    read_header_at,
)

__all__ = ["TensorSlice", "describe", "is_tensor_file", "safe_open"]


class TensorSlice:
    """One tensor, not yet sliced: index it to get just that part in the
    file's framework. Accepts what safetensors 0.8.0 accepts: for ``"pt"``,
    torch's indexing; for NumPy and JAX, ints, slices with positive steps and
    one ``...`` (see ``_frameworks``), refusing the rest with :class:`SliceError`.
    Stays usable after the file is closed."""

    def __init__(self, array: np.ndarray[Any, Any], shape: tuple[int, ...], dtype: str,
                 framework: Adapter, device: str | int, *, path: object, name: str
                 ) -> None:
        self._array = array
        self._shape = shape
        self._dtype = dtype
        self._framework = framework
        self._device = device
        self._path = path
        self._name = name

    def get_shape(self) -> list[int]:
        """The full tensor's shape (elements, as the header stores it)."""
        return list(self._shape)

    def get_dtype(self) -> str:
        """The dtype string as the file stores it (``"F32"``)."""
        return self._dtype

    def __getitem__(self, index: Any) -> Any:
        if self._array.shape != self._shape:
            raise SafetensorError(f"tensor {self._name!r}: dtype {self._dtype} packs several "
                                  "elements per byte and cannot be sliced; read it whole with "
                                  "get_tensor", path=self._path, field=self._name)
        return self._framework.take(self._array, index, self._device, path=self._path,
                                    name=self._name)


class safe_open:
    """Open a bintensors or safetensors file (detected from its bytes).

    ``filename`` is a path, a binary file object (read from its start; the
    caller keeps it open) or an object-store URL (``s3://``, ``gs://``,
    ``az://``; ``storage_options`` as for ``zerobatch.storage.open_storage``):
    one range GET reads the header, one more each tensor asked for.
    ``framework`` is ``"np"``/``"numpy"``, ``"pt"``/``"torch"`` or
    ``"jax"``/``"flax"``. ``backend="mmap"`` maps the file once and hands out
    views (read-only for NumPy and JAX, copy-on-write for PyTorch: writes
    never reach the file); ``"pread"`` reads each tensor into its own
    writable memory. The header is parsed and checked completely here. Every
    call on a closed handle raises ``SafetensorError``; tensors and slices
    already returned stay valid. Reads may run from several threads; closing
    while another thread reads
    is not safe.
    """

    def __init__(self, filename: Any, framework: str, device: str | int = "cpu", *,
                 backend: str = "mmap", storage_options: Mapping[str, Any] | None = None
                 ) -> None:
        self._adapter = adapter(framework)
        self._device = self._adapter.check_device(device)
        self._source: Source | None = open_source(filename, backend, self._adapter.access,
                                                  storage_options)
        self._path = self._source.label
        try:
            self._header: Header = read_header_at(self._source.read, self._source.size,
                                                  path=self._path)
        except BaseException:
            self._source.close()
            raise

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the file; tensors already returned stay valid. Idempotent."""
        if self._source is not None:
            self._source.close()
            self._source = None

    def _open(self) -> Source:
        if self._source is None:
            raise SafetensorError("file is closed", path=self._path)
        return self._source

    @property
    def header(self) -> Header:
        """The parsed, validated header."""
        self._open()
        return self._header

    def keys(self) -> list[str]:
        """Tensor names, sorted."""
        self._open()
        return sorted(self._header.names)

    def offset_keys(self) -> list[str]:
        """Tensor names in the order of their data in the file."""
        self._open()
        return self._header.offset_order()

    def metadata(self) -> dict[str, str] | None:
        """The free-form string metadata, or None when the file has none."""
        self._open()
        metadata = self._header.metadata
        return None if metadata is None else dict(metadata)

    def _row(self, name: str) -> int:
        self._open()
        if not isinstance(name, str):
            raise TypeError(f"argument 'name': expected str, not {type(name).__name__}")
        row = self._header.index.get(name)
        if row is None:
            raise TensorNotFound(f"file does not contain tensor {name!r}", path=self._path,
                                 field=name)
        return row

    def _array(self, row: int) -> np.ndarray[Any, Any]:
        header = self._header
        begin = header.data_start + int(header.begins[row])
        buffer, offset = self._open().span(begin, header.data_start + int(header.ends[row]))
        return view(buffer, header, row, path=self._path, offset=offset,
                    packed=self._adapter.packed)

    def get_tensor(self, name: str) -> Any:
        """The whole tensor ``name`` (zero-copy on the CPU with ``backend="mmap"``)."""
        return self._adapter.convert(self._array(self._row(name)), self._device)

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor, by name, in the order of their data in the file."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def get_slice(self, name: str) -> TensorSlice:
        """A handle on ``name`` to read part of it by indexing."""
        row = self._row(name)
        info = self._header.info(row)
        return TensorSlice(self._array(row), info.shape, info.dtype, self._adapter,
                           self._device, path=self._path, name=name)


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
