"""Read LLMBATCH files: O(1) zero-copy batches.

:class:`BatchFileReader` maps a ``.batch`` file (or a folder of shards with a
``manifest.json``, local or on object storage) and hands out batch ``i`` as a
view of the mapping; it is also a :class:`zerobatch.source.Source` of batches
for the ``Loader``.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from zerobatch._output_dtype import CASTS, output_dtype
from zerobatch._text import format_table
from zerobatch.columnar import Batch, BatchMeta
from zerobatch.errors import FormatError
from zerobatch.llmbatch import validate
from zerobatch.llmbatch.format import (
    HEADER_SIZE,
    MAGIC,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    BatchHeader,
    check_manifest,
    load_manifest,
    read_manifest_format,
    shard_name,
)
from zerobatch.storage import is_url, open_storage

if TYPE_CHECKING:
    import torch

__all__ = ["BatchFileReader", "describe", "is_batch_file"]



def _exported(mapping: mmap.mmap) -> np.ndarray:
    """The mapping's bytes through a buffer export, so ``mapping.close()`` refuses
    (BufferError) while any view derived from it is alive, instead of unmapping
    memory under it."""
    return np.frombuffer(mapping, dtype=np.uint8)


class _Shard:
    """One mapped ``.batch`` file: its header, descriptor and a view of all batches."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # O_NONBLOCK: a FIFO named as a shard must not block the open
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(self.fd)
            if not stat.S_ISREG(info.st_mode):
                raise FormatError("not a regular file", path=path, field="name")
            size = info.st_size
            self.header = BatchHeader.unpack(os.pread(self.fd, HEADER_SIZE, 0), path=path)
            self.header.check_file_size(size, path=path)
            self.map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(self.fd)
            raise
        h = self.header
        itemsize = h.token_dtype.itemsize
        self.batches: np.ndarray = np.ndarray(
            (h.num_batches, h.batch_size, h.seq_len),
            dtype=h.token_dtype,
            buffer=_exported(self.map),
            offset=HEADER_SIZE,
            strides=(h.padded_batch_bytes, h.seq_len * itemsize, itemsize),
        )
        self.private: mmap.mmap | None = None
        self.private_batches = self.batches

    def private_batch(self, index: int) -> np.ndarray:
        """Batch ``index`` as a writable int32 view of a private copy-on-write mapping.

        Reading copies nothing; a write copies the page it touches into this
        process only, never into the file. Writes stay visible to later reads of
        the same batch until :meth:`discard_private_writes`.
        """
        if self.private is None:
            h = self.header
            self.private = mmap.mmap(self.fd, h.file_size, access=mmap.ACCESS_COPY)
            self.private_batches = np.ndarray(
                (h.num_batches, h.batch_size, h.seq_len),
                dtype=np.dtype("<i4"),
                buffer=_exported(self.private),
                offset=HEADER_SIZE,
                strides=self.batches.strides,
            )
        return self.private_batches[index]

    def discard_private_writes(self) -> None:
        """Drop pages written through :meth:`private_batch`; they read as the file again."""
        if self.private is not None:
            self.private.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.batches = self.private_batches = np.empty((0, 0, 0), dtype=self.header.token_dtype)
        for mapping in (self.map, self.private):
            try:
                if mapping is not None:
                    mapping.close()
            except BufferError:
                pass  # views handed to the caller keep the mapping alive until they are freed
        os.close(self.fd)


class _RemoteBatches:
    """The batches of a shard in an object store: one range GET per batch."""

    def __init__(self, storage: Any, handle: int, header: BatchHeader, url: str) -> None:
        self._storage, self._handle, self._header, self._url = storage, handle, header, url

    def __getitem__(self, index: int) -> np.ndarray:
        h = self._header
        raw = np.empty(h.batch_size * h.seq_len * h.token_dtype.itemsize, dtype=np.uint8)
        if self._storage.readinto(self._handle, h.batch_offset(index), raw) != raw.size:
            raise FormatError(f"batch {index} is cut short; truncated or replaced while "
                              "open?", path=self._url, field="bytes")
        batch = raw.view(h.token_dtype).reshape(h.batch_size, h.seq_len)
        batch.setflags(write=False)
        return batch


class _RemoteShard:
    """One ``.batch`` object: its header (one range GET) and its batches."""

    def __init__(self, storage: Any, name: str, url: str) -> None:
        self.path = url
        handle = storage.open(name)
        head = bytearray(HEADER_SIZE)
        got = storage.readinto(handle, 0, head)
        self.header = BatchHeader.unpack(bytes(head[:got]), path=url)
        self.header.check_file_size(storage.size(name), path=url)
        self.batches: Any = _RemoteBatches(storage, handle, self.header, url)
        self.map = None

    def private_batch(self, index: int) -> np.ndarray:
        """Batch ``index`` as a writable int32 copy."""
        return self.batches[index].astype(np.dtype("<i4"))

    def discard_private_writes(self) -> None:
        """Nothing to discard: private batches are copies."""

    def close(self) -> None:
        """Nothing to release (the storage is closed by the reader)."""


def is_batch_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file starting with the LLMBATCH magic (or a batch shard folder)."""
    path = Path(path)
    if path.is_dir():
        return read_manifest_format(path / MANIFEST_NAME) == MANIFEST_FORMAT
    if not path.is_file():  # a FIFO or device would block or never end
        return False
    try:
        with open(path, "rb") as file:
            return file.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


class BatchFileReader:
    """Random access to the batches of a ``.batch`` file or a folder of shards.

    Opening reads the header (or manifest and every shard header) and checks it
    against the real file sizes before mapping anything. Batches are views into
    the mapping: no copy, no allocation. Thread-safe for concurrent reads;
    ``close()`` is idempotent, and reads after it raise ``ValueError``.

    Attributes (from the header): ``num_batches``, ``batch_size``, ``seq_len``
    (tokens), ``dtype`` (stored token dtype), ``seed`` (the write seed),
    ``total_records``.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.path: Any = str(path) if is_url(path) else Path(path)
        self._storage: Any = None
        if isinstance(self.path, str):
            folder, _, name = self.path.rstrip("/").rpartition("/")
            self._storage = open_storage(folder if name.endswith(".batch") else self.path,
                                         **(storage_options or {}))
        elif storage_options:
            raise ValueError(f"{path!r} is a local path; storage_options apply only to "
                             "object-store URLs")
        self._shards: list[Any] = []
        self._fingerprint: str | None = None  # computed on first use: two reads
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        first = self._shards[0].header
        self.batch_size = first.batch_size
        self.seq_len = first.seq_len
        self.dtype: np.dtype = first.token_dtype
        self.padded_batch_bytes = first.padded_batch_bytes
        self._per_shard = first.num_batches
        self._single = self._shards[0].batches if len(self._shards) == 1 else None
        self._closed = False

    def _open(self) -> None:
        if isinstance(self.path, str):
            self._open_remote()
            return
        if not self.path.is_dir():
            shard = _Shard(self.path)
            self._shards.append(shard)
            self.num_batches = shard.header.num_batches
            self.seed = shard.header.seed
            self.total_records = shard.header.total_records
            return
        manifest, paths = load_manifest(self.path)
        self._check_shards(manifest, self.path / MANIFEST_NAME, [
            lambda p=p: _Shard(p) for p in paths])

    def _open_remote(self) -> None:
        """A ``.batch`` object or a shard-folder prefix, through ``self._storage``."""
        url, storage = self.path, self._storage
        if url.endswith(".batch"):
            shard = _RemoteShard(storage, url.rpartition("/")[2], url)
            self._shards.append(shard)
            self.num_batches = shard.header.num_batches
            self.seed = shard.header.seed
            self.total_records = shard.header.total_records
            return
        manifest_path = f"{url.rstrip('/')}/{MANIFEST_NAME}"
        if storage.size(MANIFEST_NAME) > MAX_MANIFEST_BYTES:
            raise FormatError(f"larger than {MAX_MANIFEST_BYTES} bytes", path=manifest_path,
                              field="manifest")
        manifest = check_manifest(storage.map(MANIFEST_NAME).tobytes(), manifest_path)
        names = [shard_name(entry, i, manifest_path)
                 for i, entry in enumerate(manifest["shards"])]
        self._check_shards(manifest, manifest_path, [
            lambda n=n: _RemoteShard(storage, n, f"{url.rstrip('/')}/{n}") for n in names])

    def _check_shards(self, manifest: dict[str, Any], manifest_path: object,
                      openers: list[Any]) -> None:
        """Open every shard (``openers``) and check it against the manifest."""
        for position, opener in enumerate(openers):
            shard = opener()
            self._shards.append(shard)
            for field, message in validate.against_manifest(shard.header, manifest, position):
                raise FormatError(message, path=shard.path, field=field)
        counts = [shard.header.num_batches for shard in self._shards]
        for at, field, message in validate.shard_counts(counts, manifest["num_batches"]):
            where = manifest_path if at is None else self._shards[at].path
            raise FormatError(message, path=where, field=field)
        total = sum(counts)
        self.num_batches = total
        self.seed = manifest["seed"]
        self.total_records = manifest["total_records"]

    def __len__(self) -> int:
        return self.num_batches

    def __repr__(self) -> str:
        return (
            f"BatchFileReader({str(self.path)!r}, num_batches={self.num_batches}, "
            f"batch_size={self.batch_size}, seq_len={self.seq_len}, dtype={self.dtype.name})"
        )

    def _locate(self, index: int) -> tuple[_Shard, int]:
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        n = self.num_batches
        if not -n <= index < n:
            raise IndexError(f"batch index {index} is out of range for {n} batches in {self.path}")
        index %= n
        shard, local = divmod(index, self._per_shard)
        return self._shards[shard], local

    def read_batch(self, batch_index: int) -> np.ndarray:
        """Batch ``batch_index`` as a read-only ``[batch_size, seq_len]`` view (no copy)."""
        if self._single is not None and 0 <= batch_index < self.num_batches:
            return self._single[batch_index]
        shard, local = self._locate(batch_index)
        return shard.batches[local]

    @property
    def reads_wait(self) -> bool:
        """True when a read waits on the network (an object-store URL); False
        for local files (see ``zerobatch.Loader``'s ``num_threads``)."""
        return self._storage is not None

    @property
    def fingerprint(self) -> str:
        """Identifies the file(s) a loader state belongs to: header fields, shard
        sizes and a hash of the first and last batches' tokens (two reads, so a
        file of the same shape and write seed but other tokens differs)."""
        if self._fingerprint is None:
            sizes = ",".join(str(shard.header.file_size) for shard in self._shards)
            ends = xxhash.xxh3_64()
            ends.update(np.ascontiguousarray(self.read_batch(0)).data)
            ends.update(np.ascontiguousarray(self.read_batch(self.num_batches - 1)).data)
            self._fingerprint = (
                f"llmbatch:{self.num_batches}:{self.batch_size}:{self.seq_len}:"
                f"{self.dtype.str}:{self.seed}:{self.total_records}:{sizes}:{ends.hexdigest()}")
        return self._fingerprint

    def read(self, indices: Any) -> Batch:
        """The batches at ``indices`` as a ``Batch`` whose observations are whole
        batches: one dense ``tokens`` column ``[len(indices), batch_size, seq_len]``
        in the stored dtype (one gather copy); global indexes are the batch indices.
        This makes a batch file a ``Loader`` source."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"indices must be a 1-D integer array, got {idx.dtype} {idx.shape}")
        idx = idx.astype(np.int64, copy=False)
        n = self.num_batches
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise IndexError(f"batch indices must be in [0, {n}) for {self.path}")
        tokens = np.empty((idx.shape[0], self.batch_size, self.seq_len), dtype=self.dtype)
        for row, index in enumerate(idx.tolist()):
            tokens[row] = self.read_batch(index)  # pre-formed batches: one copy per batch
        return Batch.from_columns({"tokens": tokens},
                                  BatchMeta(idx, production_status=np.ones(idx.shape[0])))

    def read_batch_torch(self, batch_index: int, dtype: Any = None) -> torch.Tensor:
        """Batch ``batch_index`` as a ``[batch_size, seq_len]`` torch tensor.

        ``dtype`` is int64 (default: one copy, the widening) or int32, spelled
        ``"int64"``, ``np.int64`` or ``torch.int64`` alike: int32 gives for
        uint32 files a zero-copy tensor over a private
        copy-on-write mapping (writable, no warning). In-place writes to it never
        reach the file, but later reads of the same batch from this reader see
        them until :meth:`discard_private_writes` (the loader calls it at every
        epoch start). Token ids must be < 2**31, as in every real vocabulary.
        """
        import torch

        if output_dtype("int64" if dtype is None else dtype, allowed=CASTS) == np.int64:
            return torch.from_numpy(self.read_batch(batch_index).astype(np.int64))
        shard, local = self._locate(batch_index)
        if shard.header.dtype == 0:
            return torch.from_numpy(shard.private_batch(local))
        return torch.from_numpy(shard.batches[local].astype(np.int32))  # uint16 must widen: a copy

    def discard_private_writes(self) -> None:
        """Forget in-place writes made to int32 tensors from :meth:`read_batch_torch`.

        Tensors still alive then read the file's tokens again.
        """
        for shard in self._shards:
            shard.discard_private_writes()

    def advise(self, start: int, count: int) -> None:
        """Ask the kernel to read batches ``[start, start + count)`` ahead (MADV_WILLNEED)."""
        if self._closed or count <= 0:
            return
        end = min(start + count, self.num_batches)
        while start < end:
            shard, local = self._locate(start)
            if shard.map is None:  # an object-store shard: reads are range GETs
                return
            run = min(end - start, shard.header.num_batches - local)
            shard.map.madvise(
                mmap.MADV_WILLNEED, shard.header.batch_offset(local), run * self.padded_batch_bytes
            )
            start += run

    def close(self) -> None:
        """Unmap and close every shard. Views already handed out stay valid."""
        for shard in self._shards:
            shard.close()
        if self._storage is not None:
            self._storage.close()
        self._shards = []
        self._single = None
        self._closed = True

    def __enter__(self) -> BatchFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe(path: str | os.PathLike[str]) -> str:
    """A table of a ``.batch`` file's (or shard folder's) header and derived sizes."""
    with BatchFileReader(path) as reader:
        first = reader._shards[0].header
        tokens = reader.num_batches * reader.batch_size * reader.seq_len
        size = sum(shard.header.file_size for shard in reader._shards)
        rows = [
            ("path", str(reader.path)),
            ("format", f"LLMBATCH version {first.version}"),
            ("shards", str(len(reader._shards))),
            ("batch_size", f"{reader.batch_size} records"),
            ("seq_len", f"{reader.seq_len} tokens"),
            ("num_batches", f"{reader.num_batches:,}"),
            ("dtype", f"{first.dtype} ({reader.dtype.name})"),
            ("seed", str(reader.seed)),
            ("total_records", f"{reader.total_records:,}"),
            (
                "dropped_records",
                f"{reader.total_records - reader.num_batches * reader.batch_size:,}",
            ),
            ("raw_batch_bytes", f"{first.raw_batch_bytes:,}"),
            ("padded_batch_bytes", f"{first.padded_batch_bytes:,}"),
            ("tokens", f"{tokens:,}"),
            ("file_bytes", f"{size:,}"),
            ("bytes_per_token", f"{size / tokens:.3f}"),
        ]
    return format_table(rows)
