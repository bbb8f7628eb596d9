"""``BlockCache``: fixed-size blocks of remote objects, kept in memory (least
recently used out first, within a byte budget) and optionally on local disk
across runs (``cache_dir``).

The index files of a remote dataset (document offsets, metadata index, data
and spans) are read through it, so a batch fetches only the blocks that hold the
entries it needs and a large index file is never downloaded whole. Block
``b`` of an object is its bytes ``[b * block_size, min((b + 1) * block_size,
size))``. ``read`` takes every byte range of a batch at once and fetches all
the missing blocks with one ``ObjectStorage.read_into`` call: every request in
flight together, neighbours merged by obstore's coalescing.

With ``cache_dir``, each fetched block is also written to that folder, in a
sub-folder named after the object's URL, size and entity tag (a rewritten
object never serves old blocks), by temporary name then rename, so any number
of threads and processes may share a folder. A block file holds the block,
then the XXH3-64 of the block (8 bytes, little-endian); it is used again only
when its size and checksum match, and fetched again otherwise. When this
process has written ``cache_dir_bytes / 10`` bytes since it last looked, the
folder is scanned and its oldest block files (by modification time) are
removed until it holds at most 0.9 of ``cache_dir_bytes``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from zerobatch import _forksafe
from zerobatch.storage.protocol import Storage

__all__ = ["BLOCK_SIZE", "CACHE_BYTES", "CACHE_DIR_BYTES", "BlockCache", "BlockSource"]

BLOCK_SIZE = 16 << 10
"""Default block size in bytes: 2,048 offsets of an index file."""

CACHE_BYTES = 64 << 20
"""Default in-memory budget in bytes (4,096 blocks of the default size)."""

CACHE_DIR_BYTES = 4 << 30
"""Default budget in bytes of a ``cache_dir``."""


class BlockSource(Storage, Protocol):
    """What ``BlockCache`` reads through: a ``Storage`` whose objects have URLs
    and content versions (``ObjectStorage``)."""

    def url_of(self, name: str) -> str:
        """The URL of ``name`` (for messages)."""
        ...

    def version(self, name: str) -> str:
        """What identifies the content of ``name`` (URL, size, entity tag): the
        key of its blocks in a ``cache_dir``."""
        ...


_CHECKSUM = 8  # bytes of XXH3-64 after each block on disk
_SUFFIX = ".block"


class BlockCache:
    """Blocks of ``storage``'s objects (see the module docstring).

    ``block_size`` bytes per block, at most ``cache_bytes`` bytes of blocks in
    memory (a batch that needs more still gets all of its blocks; the oldest
    others are dropped), ``cache_dir`` (None: memory only) kept within
    ``cache_dir_bytes``. Thread-safe; two threads missing the same block may
    both fetch it.
    """

    def __init__(
        self, storage: BlockSource, *, block_size: int = BLOCK_SIZE,
        cache_bytes: int = CACHE_BYTES, cache_dir: str | os.PathLike[str] | None = None,
        cache_dir_bytes: int = CACHE_DIR_BYTES,
    ) -> None:
        for name, value, low in (("block_size", block_size, 8), ("cache_bytes", cache_bytes, 0),
                                 ("cache_dir_bytes", cache_dir_bytes, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low} bytes, got {value!r}")
        if block_size % 8:
            raise ValueError(f"block_size must be a multiple of 8 bytes (whole offsets), "
                             f"got {block_size}")
        self._storage = storage
        self._block_size = block_size
        self._budget = cache_bytes
        self._folder = None if cache_dir is None else Path(cache_dir)
        self._disk_budget = cache_dir_bytes
        self._blocks: OrderedDict[tuple[str, int], npt.NDArray[np.uint8]] = OrderedDict()
        self._held = 0  # bytes in self._blocks
        self._written = 0  # bytes this process wrote to cache_dir since its last scan
        self._lock = _forksafe.lock()

    @property
    def block_size(self) -> int:
        """Bytes per block."""
        return self._block_size

    def read(self, requests: Sequence[tuple[str, int, int]]) -> list[npt.NDArray[np.uint8]]:
        """Bytes ``[start, end)`` of object ``name`` for each ``(name, start, end)``,
        read-only (a view of a block when the range lies in one, else a copy).
        ``ValueError`` names a range outside its object."""
        size = self._block_size
        wanted: dict[tuple[str, int], None] = {}
        for name, start, end in requests:
            total = self._storage.size(name)
            if not 0 <= start <= end <= total:
                raise ValueError(f"bytes {start}-{end} are outside "
                                 f"{self._storage.url_of(name)} ({total} bytes)")
            for block in range(start // size, -(-end // size)):
                wanted[(name, block)] = None
        blocks = self._get(list(wanted))
        out = []
        for name, start, end in requests:
            first, last = start // size, (end - 1) // size
            if end <= start:
                out.append(np.zeros(0, np.uint8))
            elif first == last:
                out.append(blocks[(name, first)][start - first * size:end - first * size])
            else:  # a copy: the range spans blocks
                parts = [blocks[(name, b)] for b in range(first, last + 1)]
                joined = np.concatenate(parts)[start - first * size:end - first * size]
                joined.setflags(write=False)
                out.append(joined)
        return out

    def _get(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], npt.NDArray[np.uint8]]:
        """Every block of ``keys``: from memory, else from ``cache_dir``, else fetched."""
        found: dict[tuple[str, int], npt.NDArray[np.uint8]] = {}
        with self._lock:
            for key in keys:
                block = self._blocks.get(key)
                if block is not None:
                    self._blocks.move_to_end(key)
                    found[key] = block
        missing = [key for key in keys if key not in found]
        fresh: dict[tuple[str, int], npt.NDArray[np.uint8]] = {}
        for key in missing:
            block = self._load(key)
            if block is not None:
                fresh[key] = block
        fetch = [key for key in missing if key not in fresh]
        if fetch:
            fetched = self._fetch(fetch)
            for key, block in fetched.items():
                self._store(key, block)
            fresh.update(fetched)
        if fresh:
            with self._lock:
                for key, block in fresh.items():
                    if key not in self._blocks:
                        self._blocks[key] = block
                        self._held += block.shape[0]
                while self._held > self._budget and self._blocks:
                    _, old = self._blocks.popitem(last=False)
                    self._held -= old.shape[0]
        found.update(fresh)
        return found

    def _length(self, key: tuple[str, int]) -> int:
        name, block = key
        return min(self._block_size, self._storage.size(name) - block * self._block_size)

    def _fetch(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], npt.NDArray[np.uint8]]:
        """``keys`` fetched by one ``read_into`` call (every request in flight at once)."""
        storage = self._storage
        lengths = np.array([self._length(key) for key in keys], dtype=np.int64)
        handles = np.array([storage.open(name) for name, _ in keys], dtype=np.int64)
        offsets = np.array([block * self._block_size for _, block in keys], dtype=np.int64)
        padded = -(-lengths // 8) * 8  # every block 8-byte aligned: offsets view as uint64
        destinations = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
        buffer = np.empty(int(padded.sum()), dtype=np.uint8)
        short = storage.read_into(handles, offsets, lengths, buffer, destinations)
        if short >= 0:
            name = keys[short][0]
            raise OSError(f"{storage.url_of(name)} is shorter than its listed size "
                          f"{storage.size(name)} bytes; rewritten while open?")
        buffer.setflags(write=False)
        return {key: buffer[int(d):int(d) + int(n)]
                for key, d, n in zip(keys, destinations, lengths, strict=True)}

    # -- cache_dir --------------------------------------------------------------

    def _path(self, key: tuple[str, int]) -> Path | None:
        if self._folder is None:
            return None
        name, block = key
        version = self._storage.version(name)
        digest = hashlib.sha256(f"{version}\0{self._block_size}".encode()).hexdigest()[:32]
        return self._folder / digest / f"{block}{_SUFFIX}"

    def _load(self, key: tuple[str, int]) -> npt.NDArray[np.uint8] | None:
        """The block from ``cache_dir`` when its size and checksum hold, else None."""
        path = self._path(key)
        if path is None:
            return None
        length = self._length(key)
        data = np.empty(length + _CHECKSUM + 1, dtype=np.uint8)  # aligned, unlike bytes
        try:
            with open(path, "rb") as file:
                got = file.readinto(data.data)
        except OSError:
            return None
        if got != length + _CHECKSUM or xxhash.xxh3_64_intdigest(
                data[:length].data) != int.from_bytes(data[length:got].tobytes(), "little"):
            return None
        block = data[:length]
        block.setflags(write=False)
        return block

    def _store(self, key: tuple[str, int], block: npt.NDArray[np.uint8]) -> None:
        """Write ``block`` to ``cache_dir`` (temporary name, then rename)."""
        path = self._path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        checksum = xxhash.xxh3_64_intdigest(block.data).to_bytes(_CHECKSUM, "little")
        with open(temporary, "wb") as file:
            file.write(block.data)
            file.write(checksum)
        os.replace(temporary, path)
        with self._lock:
            self._written += block.shape[0] + _CHECKSUM
            full = self._written * 10 >= self._disk_budget
            if full:
                self._written = 0
        if full:
            self._trim()

    def _trim(self) -> None:
        """Remove the oldest block files until ``cache_dir`` holds at most 0.9 of its budget."""
        assert self._folder is not None
        files = []
        for path in self._folder.glob(f"*/*{_SUFFIX}"):
            try:
                stat = path.stat()
            except FileNotFoundError:  # another process removed it
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total * 10 <= self._disk_budget * 9:
                break
            path.unlink(missing_ok=True)
            total -= size
