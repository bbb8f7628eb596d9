"""Folders of ``.npy`` token files, read in place as one token stream.

A common way to ship a tokenized corpus is a folder of 1-D NumPy files
(``00000.npy``, ``00001.npy`` …), each a slice of one long token stream. This
module opens such a folder without re-encoding it: each file's header is
parsed and checked against the file size, the token bytes are never copied
anywhere but into the batch buffer, and the files in name order are one
logical array (a prefix sum of file lengths finds the file of any token).

What a file MUST be: NumPy format version 1, 2 or 3; ``shape`` of rank 1;
``descr`` a little-endian (or byte-order-free) integer type of 1, 2, 4 or 8
bytes, the same in every file; exactly ``header + tokens * itemsize`` bytes
long. Anything else is a ``FormatError`` naming the file and the field.
Headers are parsed with NumPy's safe header reader (no pickle), capped at
``MAX_HEADER`` bytes.

``NpyTokens.windows(seq_len)`` is a random-access source (``len``,
``read(indices) -> Batch``) with ``input_ids`` and ``labels`` (shifted by one,
continuing across file boundaries: no token pair is lost).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import xxhash

from zerobatch._output_dtype import CASTS, id_bounds, output_dtype, token_error
from zerobatch.columnar import Batch, BatchMeta
from zerobatch.errors import FormatError
from zerobatch.storage import LocalStorage, Storage
from zerobatch.stream import _kernels as k
from zerobatch.stream._arena import Arena

if TYPE_CHECKING:
    from zerobatch.stream.verify import Problem

__all__ = ["MAX_HEADER", "NpyTokens", "NpyWindows", "is_npy_folder", "open_npy", "verify_npy"]

MAX_HEADER = 1 << 16  # bytes of a .npy preamble + header dict that we agree to parse
_SUFFIX = ".npy"


def is_npy_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder holding ``.npy`` files and no ``manifest.json``."""
    folder = Path(path)
    return (folder.is_dir() and not (folder / "manifest.json").exists()
            and any(folder.glob(f"*{_SUFFIX}")))


def _parse_header(prefix: bytes, size: int, name: str) -> tuple[np.dtype, int, int]:
    """(dtype, tokens, data offset) of one ``.npy`` file from its first bytes."""
    fmt = np.lib.format
    stream = io.BytesIO(prefix)
    try:
        version = fmt.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(stream, max_header_size=MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, _, dtype = fmt.read_array_header_2_0(stream, max_header_size=MAX_HEADER)
        else:
            raise ValueError(f"unsupported format version {version}")
    except Exception as error:  # NumPy's header parser raises several types
        raise FormatError(f"not a readable .npy header ({error}); truncated or not a "
                          ".npy file?", path=name, field="header") from error
    offset = stream.tell()
    if len(shape) != 1:
        raise FormatError(f"expected a 1-D token array, found shape {shape}; save one "
                          "token stream per file (np.save(path, tokens.ravel()))",
                          path=name, field="shape")
    if dtype.kind not in "iu" or dtype.itemsize not in (1, 2, 4, 8) or dtype.byteorder == ">":
        raise FormatError(f"expected little-endian integer tokens, found {dtype.str!r}; "
                          "convert with tokens.astype('<u4')", path=name, field="descr")
    tokens = int(shape[0])
    expected = offset + tokens * dtype.itemsize
    if size != expected:
        what = "truncated or not fully written?" if size < expected else "trailing bytes"
        raise FormatError(f"expected {expected} bytes for {tokens} tokens of {dtype.str}, "
                          f"found {size}; {what}", path=name, field="shape")
    return dtype.newbyteorder("<"), tokens, offset


def _one_dtype(first: np.dtype | None, dtype: np.dtype, path: str, first_path: str) -> np.dtype:
    """The stream's dtype once file ``path`` (of ``dtype``) joins it: every
    file shares the first file's (``first``; None for the first file)."""
    if first is not None and dtype != first:
        raise FormatError(f"token dtype {dtype.str!r} differs from {first.str!r} in "
                          f"{first_path}; all files must share one dtype", path=path,
                          field="descr")
    return dtype


def verify_npy(path: str | os.PathLike[str], *, dtype: Any = "int64") -> list[Problem]:
    """Every problem of the ``.npy`` folder at ``path``, each naming the file
    and field: the checks ``open_npy`` runs (each file's header and size, one
    dtype), for every file, then every token id against the bounds a read
    into ``dtype`` (``"int64"`` or ``"int32"``) checks, with the read's own
    ``id_bounds``. Empty when every read into ``dtype`` succeeds. Reads every
    byte once, ``CHUNK`` bytes at a time."""
    from zerobatch.stream.validate import CHUNK
    from zerobatch.stream.verify import Problem

    out = output_dtype(dtype, allowed=CASTS)
    assert out is not None  # CASTS holds no "stored"
    folder = Path(path)
    if not folder.is_dir():
        return [Problem(folder, "folder", "not a folder of .npy files")]
    names = sorted(p.name for p in folder.glob(f"*{_SUFFIX}") if p.is_file())
    if not names:
        return [Problem(folder, "files", f"no {_SUFFIX} files")]
    problems: list[Problem] = []
    first: np.dtype | None = None
    for name in names:
        file = folder / name
        try:
            with open(file, "rb", buffering=0) as handle:
                size = os.fstat(handle.fileno()).st_size
                file_dtype, count, offset = _parse_header(handle.read(min(size, MAX_HEADER)),
                                                          size, str(file))
            first = _one_dtype(first, file_dtype, str(file), str(folder / names[0]))
        except FormatError as error:
            prefix = f"{error.path}: field {error.field!r}: "
            problems.append(Problem(file, error.field or "header",
                                    str(error).removeprefix(prefix)))
            continue
        except OSError as error:
            problems.append(Problem(file, "file", f"cannot be read ({error.strerror})"))
            continue
        low_high = id_bounds(file_dtype, out)
        if low_high.shape[0] == 0 or count == 0:
            continue
        tokens = np.memmap(file, file_dtype, "r", offset, (count,))
        step = max(1, CHUNK // file_dtype.itemsize)
        for start in range(0, count, step):
            part = tokens[start:start + step]
            bad = np.flatnonzero((part < low_high[0]) | (part > low_high[1]))
            if bad.size:
                refused = token_error(file, "data", int(part[bad[0]]), start + int(bad[0]),
                                      file_dtype, out)
                problems.append(Problem(file, "data", str(refused).removeprefix(
                    f"{file}: field 'data': ")))
                break
        del tokens
    if not problems:  # the reader's own open: whatever it refuses is reported
        try:
            open_npy(folder).close()
        except FormatError as error:
            problems.append(Problem(error.path or folder, error.field or "file", str(error)))
    return problems


class NpyTokens:
    """The ``.npy`` files of one folder or prefix: one token stream. Create with
    ``open_npy``.

    Opening reads each file's header (O(files)); no token is read until a
    source reads. Immutable and thread-safe; ``close()`` is idempotent.
    """

    def __init__(self, storage: Storage, names: Sequence[str], *, where: str) -> None:
        if not names:
            raise FileNotFoundError(f"no {_SUFFIX} files in {where}; check the folder, "
                                    "bucket and prefix")
        self._storage = storage
        self._where = where
        self._names = tuple(names)
        self._paths = tuple(f"{where.rstrip('/')}/{name}" for name in names)
        handles, counts, offsets, sizes = [], [], [], []
        dtype: np.dtype | None = None
        for name, path in zip(self._names, self._paths, strict=True):
            size = storage.size(name)
            handle = storage.open(name)
            prefix = bytearray(min(size, MAX_HEADER))
            got = storage.readinto(handle, 0, prefix)
            file_dtype, count, offset = _parse_header(bytes(prefix[:got]), size, path)
            dtype = _one_dtype(dtype, file_dtype, path, self._paths[0])
            handles.append(handle)
            counts.append(count)
            offsets.append(offset)
            sizes.append(size)
        assert dtype is not None
        self._dtype = dtype
        self._handles = np.array(handles, dtype=np.int64)
        self._offsets = np.array(offsets, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        digest = xxhash.xxh64()
        for name, size in zip(self._names, sizes, strict=True):
            digest.update(f"{name}:{size};".encode())
        self._fingerprint = f"npy:{dtype.str}:{digest.hexdigest()}"
        self._arena = Arena()

    @property
    def num_tokens(self) -> int:
        """Tokens in all files."""
        return int(self._starts[-1])

    @property
    def dtype(self) -> np.dtype:
        """The stored token dtype (little-endian)."""
        return self._dtype

    @property
    def names(self) -> tuple[str, ...]:
        """The files, in stream order."""
        return self._names

    @property
    def paths(self) -> tuple[str, ...]:
        """Each file's path (or URL), in stream order."""
        return self._paths

    @property
    def starts(self) -> tuple[int, ...]:
        """The stream token each file starts at, in stream order."""
        return tuple(self._starts[:-1].tolist())

    @property
    def fingerprint(self) -> str:
        """Identifies the stream: file names, sizes and dtype."""
        return self._fingerprint

    def __repr__(self) -> str:
        return (f"NpyTokens({self._where!r}, files={len(self._names)}, "
                f"tokens={self.num_tokens}, dtype={self._dtype.str!r})")

    def __enter__(self) -> NpyTokens:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every file; idempotent. Reads afterwards fail."""
        self._storage.close()

    def windows(self, seq_len: int, *, dtype: Any = "int64") -> NpyWindows:
        """Windows of ``seq_len`` tokens plus one label token (see ``NpyWindows``)."""
        return NpyWindows(self, seq_len, dtype=dtype)

    def file_at(self, token: int) -> int:
        """The index (in ``names``) of the file holding stream token ``token``."""
        return int(np.searchsorted(self._starts, token, side="right")) - 1

    def read_tokens(self, windows: npt.NDArray[np.int64], stride: int, span: int) -> np.ndarray:
        """Tokens ``[w * stride, w * stride + span)`` for each ``w`` in ``windows``
        (valid indices), as a ``[len(windows), span]`` array of the stored dtype,
        in one ``read_into`` call. The array is a view of a recycled buffer."""
        count = (self.num_tokens - span) // stride + 1
        itemsize = self._dtype.itemsize
        pieces, requests, _, bad = k.plan_windows(
            windows, stride, span, count, self._starts, self._handles, self._offsets, itemsize
        )
        if bad >= 0:
            raise IndexError(f"window {int(windows[bad])} is out of range for {max(count, 0)}")
        shards = pieces[:, k.SHARD]
        nbytes = windows.shape[0] * span * itemsize
        buffer = self._arena.take(nbytes)[:nbytes]
        short = self._storage.read_into(requests[0], requests[1], requests[2], buffer, requests[3])
        if short >= 0:
            raise FormatError(
                f"file ends before byte {int(requests[1, short] + requests[2, short])}; "
                "truncated after opening?", path=self._paths[int(shards[short])], field="data",
            )
        return buffer.view(self._dtype).reshape(windows.shape[0], span)


class NpyWindows:
    """Observation ``i``: tokens ``[i * seq_len, (i + 1) * seq_len)`` of the
    stream as ``input_ids`` and the same window shifted by one token as
    ``labels``, both ``[B, seq_len]`` of ``dtype`` (``"int64"`` or ``"int32"``).

    ``len(src) == (num_tokens - 1) // seq_len`` windows; the tail is dropped.
    Windows cross file boundaries freely. Global indexes in the batch meta are
    the observation indices. Immutable and thread-safe.

    >>> import tempfile; folder = tempfile.mkdtemp()
    >>> np.save(f"{folder}/0.npy", np.arange(5, dtype=np.uint16))
    >>> np.save(f"{folder}/1.npy", np.arange(5, 9, dtype=np.uint16))
    >>> open_npy(folder).windows(4).read([1])["labels"].tolist()
    [[5, 6, 7, 8]]
    """

    def __init__(self, tokens: NpyTokens, seq_len: int, *, dtype: Any = "int64") -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        out = output_dtype(dtype, allowed=CASTS)
        assert out is not None
        self._tokens = tokens
        self._seq_len = seq_len
        self._dtype = out
        self._bounds = id_bounds(tokens.dtype, out)
        self._len = max(0, (tokens.num_tokens - 1) // seq_len)

    def __len__(self) -> int:
        return self._len

    def arenas(self) -> list[Arena]:
        """The arenas this source's reads take their buffers from (a device
        output makes them pinned: ``zerobatch.torch.TorchOutput``)."""
        return [self._tokens._arena]

    def __repr__(self) -> str:
        return f"NpyWindows(seq_len={self._seq_len}, len={self._len})"

    @property
    def seq_len(self) -> int:
        """Tokens per window (without the extra label token)."""
        return self._seq_len

    @property
    def fingerprint(self) -> str:
        """Identifies the data: the stream and the window length."""
        return f"{self._tokens.fingerprint}:windows:{self._seq_len}"

    @property
    def reads_wait(self) -> bool:
        """True when a read waits on the network (object storage); False for
        local files (see ``zerobatch.Loader``'s ``num_threads``)."""
        return not isinstance(self._tokens._storage, LocalStorage)

    def read(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch:
        """The windows at ``indices`` (``0 <= i < len``, any order) as one Batch."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"indices must be a 1-D integer array, got {idx.dtype} {idx.shape}")
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._len):
            raise IndexError(f"window indices must be in [0, {self._len})")
        seq_len = self._seq_len
        raw = self._tokens.read_tokens(idx, seq_len, seq_len + 1)
        # One cast-copy into the output dtype, ids checked in the same pass.
        out = np.empty((2, idx.shape[0], seq_len), self._dtype)
        wrong = k.window_tokens(raw, seq_len, out[0], out[1], 1, self._bounds)
        if wrong >= 0:
            raise self._token_error(int(idx[wrong]), raw[wrong])
        columns = {"input_ids": out[0], "labels": out[1]}
        return Batch.from_columns(columns, BatchMeta(idx, production_status=np.ones(len(idx))))


    def _token_error(self, window: int, tokens: np.ndarray) -> FormatError:
        """The error for the first id of ``window`` (its ``tokens``) that the
        output dtype cannot hold, naming its file."""
        low, high = self._bounds
        column = int(np.flatnonzero((tokens < low) | (tokens > high))[0])
        stream = self._tokens
        at = window * self._seq_len + column
        file = stream.file_at(at)
        return token_error(stream.paths[file], "data", int(tokens[column]),
                           at - stream.starts[file], stream.dtype, self._dtype)


def open_npy(
    path: str | os.PathLike[str] | None = None, *, storage: Storage | None = None,
    names: Sequence[str] | None = None,
) -> NpyTokens:
    """Open the ``.npy`` token files of a folder (name order) as one stream.

    ``storage`` (e.g. an object-store prefix; ``path`` then only names it in
    messages) replaces ``LocalStorage(path)``; ``names`` (default: the local
    folder's ``*.npy``, sorted) lists the files in stream order. Raises
    ``FormatError`` naming the file and field for a bad header, dtype, rank or
    size, and ``FileNotFoundError`` when there is no ``.npy`` file.
    """
    folder = None if path is None else Path(path)
    if names is None:
        if folder is None or not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder (or pass storage= and names=)")
        names = sorted(p.name for p in folder.glob(f"*{_SUFFIX}") if p.is_file())
    if storage is None:
        if folder is None:
            raise ValueError("pass a folder or storage=")
        storage = LocalStorage(folder)
    where = str(path) if path is not None else repr(storage)
    return NpyTokens(storage, list(names), where=where)
