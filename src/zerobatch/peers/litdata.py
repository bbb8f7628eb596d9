"""LitData token chunks (``litdata.optimize`` with ``TokensLoader``), read in place.

A folder (or prefix) holds ``index.json`` and the chunk files it lists:

``index.json``
    ``{"chunks": [{"filename", "chunk_size", "dim", "chunk_bytes"}, …],
    "config": {"data_format": ["no_header_tensor:<code>"] or
    ["no_header_numpy:<code>"], "item_loader": "TokensLoader",
    "compression": null, "encryption": null, …}}``. ``chunk_size`` is the
    chunk's items (documents), ``dim`` its tokens.
chunk file
    ``<u4 n | <u4 offsets[n + 1] | items``: ``offsets`` are absolute byte
    offsets of each item, the first ``4 * (n + 2)``; items are headerless
    little-endian tokens back to back, one item per yielded document.

Token dtype codes: LitData's torch codes (11 u1, 12 i1, 13/14 i2, 15/16 i4,
17/18 i8, 20 u2) for tensors, its NumPy list (0 i1, 1 i2, 2 i4, 3 i8, 4 u1,
5 u2, 6 u4, 7 u8) for arrays.

What opening checks (``index.json`` and every chunk's size, no chunk byte):
the config names ``TokensLoader``, one integer token format, no compression
and no encryption; every chunk's name is a plain file of the folder whose
size is exactly ``4 * (n + 2) + dim * itemsize`` (under 4 GiB). Reads search
the item offsets and read the ones they need (by range over object storage),
each checked to be a whole token past the header; the whole table (first the
header size, non-decreasing, last the file size) is checked by ``verify``.
Chunks are one logical token array in ``index.json``'s order; unlike
LitData's loader, windows cross chunks and no chunk tail is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch.errors import FormatError
from zerobatch.peers._base import (
    Location,
    PeerFiles,
    PeerShard,
    checked_offsets,
    read_at,
    read_json,
)
from zerobatch.peers._lookup import Column

__all__ = ["INDEX", "NUMPY_CODES", "TORCH_CODES", "LitDataFiles", "detect"]

INDEX = "index.json"
TORCH_CODES: dict[int, np.dtype] = {
    11: np.dtype("u1"), 12: np.dtype("i1"), 13: np.dtype("<i2"), 14: np.dtype("<i2"),
    15: np.dtype("<i4"), 16: np.dtype("<i4"), 17: np.dtype("<i8"), 18: np.dtype("<i8"),
    20: np.dtype("<u2")}
NUMPY_CODES: dict[int, np.dtype] = {
    0: np.dtype("i1"), 1: np.dtype("<i2"), 2: np.dtype("<i4"), 3: np.dtype("<i8"),
    4: np.dtype("u1"), 5: np.dtype("<u2"), 6: np.dtype("<u4"), 7: np.dtype("<u8")}


def read_index(location: Location) -> Any:
    """``index.json`` at ``location``, parsed (size capped first)."""
    return read_json(location, INDEX, "LitData")[1]


def detect(location: Location) -> bool:
    """Whether ``location`` holds a LitData ``index.json`` with ``TokensLoader``."""
    if location.stem is not None or INDEX not in location.names:
        return False
    try:
        raw = read_index(location)
    except (FormatError, OSError):
        return False
    config = raw.get("config") if isinstance(raw, dict) else None
    return isinstance(config, dict) and "item_loader" in config and "chunks" in raw


def _fail(message: str, location: Location, field: str) -> FormatError:
    root = location.root
    return FormatError(message, path=f"{root}/{INDEX}" if isinstance(root, str)
                       else root / INDEX, field=field)


def _dtype(config: dict[str, Any], location: Location) -> np.dtype:
    formats = config.get("data_format")
    if not isinstance(formats, list) or len(formats) != 1 or not isinstance(formats[0], str):
        raise _fail(f"expected one token format, found {formats!r:.200}", location,
                    "config.data_format")
    kind, _, code = formats[0].partition(":")
    table = {"no_header_tensor": TORCH_CODES, "no_header_numpy": NUMPY_CODES}.get(kind)
    dtype = table.get(int(code)) if table is not None and code.isdecimal() else None
    if dtype is None:
        raise _fail(f"expected no_header_tensor or no_header_numpy of an integer type, found "
                    f"{formats[0]!r:.80}", location, "config.data_format")
    return dtype


class LitDataFiles(PeerFiles):
    """The chunks of a LitData ``TokensLoader`` dataset (see the module docstring)."""

    format = "litdata"

    def __init__(self, location: Location, options: dict[str, Any]) -> None:
        super().__init__(location, options)
        if options:
            raise TypeError(f"LitData takes no options, got {sorted(options)}")
        raw = read_index(location)
        config = raw.get("config") if isinstance(raw, dict) else None
        chunks = raw.get("chunks") if isinstance(raw, dict) else None
        if not isinstance(config, dict) or not isinstance(chunks, list):
            raise _fail("expected an object with chunks (a list) and config", location,
                        "index")
        if config.get("item_loader") != "TokensLoader":
            raise _fail(f"expected TokensLoader, found {config.get('item_loader')!r:.80}",
                        location, "config.item_loader")
        for key in ("compression", "encryption"):
            if config.get(key) is not None:
                raise _fail(f"compressed or encrypted chunks are not read in place "
                            f"({key}={config.get(key)!r:.80})", location, f"config.{key}")
        self.dtype = _dtype(config, location)
        names = set(location.names)
        shards = []
        for i, chunk in enumerate(chunks):
            where = f"chunks[{i}]"
            if not isinstance(chunk, dict):
                raise _fail("expected an object", location, where)
            name: Any = chunk.get("filename")
            items: Any = chunk.get("chunk_size")
            dim: Any = chunk.get("dim")
            if not isinstance(name, str) or "/" in name or "\\" in name or name not in names:
                raise _fail(f"expected a chunk file of the folder, found {name!r:.80}",
                            location, f"{where}.filename")
            for key, value in (("chunk_size", items), ("dim", dim)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise _fail(f"expected a non-negative integer, found {value!r:.80}",
                                location, f"{where}.{key}")
            header = 4 * (items + 2)
            size = int(self.storage.size(name))
            if size != header + dim * self.dtype.itemsize:
                raise FormatError(f"index.json gives {items} items and {dim} tokens "
                                  f"({header + dim * self.dtype.itemsize} bytes), the file "
                                  f"has {size}; truncated or not fully written?",
                                  path=self.path(name), field="bytes")
            if size >= 1 << 32:
                raise FormatError(f"{size} bytes: LitData's <u4 item offsets cannot address "
                                  "past 4 GiB", path=self.path(name), field="offsets")
            shards.append(PeerShard(name, header, dim, items, name))
        self.shards = tuple(shards)

    def _column(self, shard: int) -> Column:
        entry = self.shards[shard]
        end = entry.base + entry.records * self.dtype.itemsize
        return Column(entry.tokens, 4, entry.documents + 1, np.dtype("<u4"), entry.base, end)

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        byte = self.shards[shard].base + records * self.dtype.itemsize
        return self.lookup.search(self._column(shard), byte) - 1

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        entry, itemsize = self.shards[shard], self.dtype.itemsize
        found = self.lookup.take(self._column(shard), ids).astype(np.int64) - entry.base
        bad = np.flatnonzero((found < 0) | (found % itemsize != 0))
        if bad.size:
            raise FormatError(f"item {int(ids[bad[0]])} starts at byte "
                              f"{int(found[bad[0]]) + entry.base}, not at a whole "
                              f"{itemsize}-byte token after the header", path=self.path(
                                  entry.tokens), field="offsets")
        return (found // itemsize).astype(np.uint64)

    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        entry = self.shards[shard]
        head = read_at(self.storage, entry.tokens, 0, entry.base, path=self.path(entry.tokens),
                       field="offsets")
        table = np.frombuffer(head, "<u4")
        if int(table[0]) != entry.documents:
            return "items", f"expected {entry.documents} items, found {int(table[0])}", None
        offsets = table[1:].astype(np.int64) - entry.base
        itemsize = self.dtype.itemsize
        if (offsets % itemsize).any():
            return "offsets", f"an item is not a whole number of {itemsize}-byte tokens", None
        tokens = offsets // itemsize
        message = checked_offsets(tokens, entry.records, path=self.path(entry.tokens),
                                  field="offsets")
        return "offsets", message, tokens.astype(np.uint64) if message is None else None

    def facts(self) -> list[tuple[str, str]]:
        return [("chunks", f"{len(self.shards):,}")]
