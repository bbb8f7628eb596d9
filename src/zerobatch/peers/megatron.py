"""Megatron ``.bin``/``.idx`` pairs (Megatron-LM, megatron-core, NeMo,
datatrove's Megatron writer), read in place.

``<prefix>.idx``, little-endian, as megatron-core's ``_IndexWriter`` writes it:

=========  ==========================  =============================================
offset     field                       value
=========  ==========================  =============================================
0          magic (9 bytes)             ``MMIDIDX\\x00\\x00`` (``MAGIC``)
9          version (``<Q``)            1 (``VERSION``)
17         dtype code (``<B``)         1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 8 u16
                                       (6 f64 and 7 f32 are not token ids: refused)
18         sequences S (``<Q``)
26         document count D (``<Q``)   entries of ``document_indices`` (documents + 1)
34         lengths                     S ``<i4``: tokens per sequence
34 + 4S    pointers                    S ``<i8``: byte offset of each sequence in .bin
34 + 12S   document_indices            D ``<i8``: sequence index where each document
                                       starts, then S
34+12S+8D  modes (multimodal only)     S ``<i1``; nothing flags them but the size
=========  ==========================  =============================================

``<prefix>.bin`` is the tokens of every sequence back to back, headerless.
Document ``d`` is sequences ``[document_indices[d], document_indices[d+1])``.

What opening checks (O(1): the header and five small reads): the magic,
version and dtype code; the ``.idx`` size is exactly the header plus the
tables (``multimodal`` is inferred from it: there is no flag; pass
``multimodal=`` to insist); ``D >= 1``; ``.bin`` is a whole number of tokens;
the first pointer is 0, the last pointer plus the last length is the
``.bin`` size, and ``document_indices`` runs from 0 to S. A read that needs
document offsets (positions, ``cu_seqlens``, documents) searches
``pointers`` for the sequence holding a token and ``document_indices`` for
its document, and reads the entries of the documents it touches (mapped, or
by range over object storage): O(log S) per lookup, never the whole tables.
Each entry read is checked (a document index inside 0 to S, a pointer a
whole token inside the ``.bin``); ``verify`` checks the whole tables:
lengths non-negative, each pointer the previous one plus its length,
document indices non-decreasing. Document ``d`` is the peer's document
``d``, empty or not. A folder of several pairs is one logical token array,
in name order.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch.errors import FormatError
from zerobatch.peers._base import Location, PeerFiles, PeerShard, read_at
from zerobatch.peers._kernels import BAD_INDICES, BAD_LENGTH, BAD_POINTER, megatron_offsets
from zerobatch.peers._lookup import Column

__all__ = ["DTYPE_CODES", "HEADER_SIZE", "MAGIC", "VERSION", "MegatronFiles", "detect"]

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = 34
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"),
    5: np.dtype("<i8"), 8: np.dtype("<u2")}
"""Megatron's dtype codes for token ids (6 float64 and 7 float32 hold no tokens)."""
_HEADER = struct.Struct("<9sQBQQ")
IDX, BIN = ".idx", ".bin"


def detect(location: Location) -> bool:
    """Whether ``location`` names a Megatron prefix, ``.idx`` or ``.bin`` file,
    or a folder holding ``.idx`` files."""
    return bool(_prefixes(location, strict=False))


def _prefixes(location: Location, *, strict: bool) -> list[str]:
    names = set(location.names)
    stem = location.stem
    if stem is None:
        found = sorted(n[:-len(IDX)] for n in names if n.endswith(IDX))
        if not found and strict:
            raise FormatError("no .idx file in the folder", path=location.root, field="files")
        return found
    for suffix in (IDX, BIN):
        if stem.endswith(suffix):
            stem = stem[:-len(suffix)]
    if stem + IDX in names:
        return [stem]
    if strict:
        raise FormatError(f"{stem}{IDX} does not exist", path=location.root, field="files")
    return []


class MegatronFiles(PeerFiles):
    """The ``.bin``/``.idx`` pairs at a location (see the module docstring).

    Options: ``multimodal`` (None: inferred from the ``.idx`` size; a bool
    insists on it)."""

    format = "megatron"
    boundary_field = "document_indices"

    def __init__(self, location: Location, options: dict[str, Any]) -> None:
        super().__init__(location, options)
        unknown = set(options) - {"multimodal"}
        if unknown:
            raise TypeError(f"unknown Megatron option(s) {sorted(unknown)}; "
                            "the only one is multimodal=")
        self._heads: list[tuple[int, int, bool]] = []  # (S, D, multimodal) per pair
        shards, dtypes = [], set()
        for prefix in _prefixes(location, strict=True):
            dtype, shard, head = self._open_pair(prefix)
            dtypes.add(dtype)
            shards.append(shard)
            self._heads.append(head)
        if len(dtypes) > 1:
            raise FormatError(f"the pairs hold different token dtypes ({sorted(map(str, dtypes))})"
                              "; open them separately", path=location.root, field="dtype")
        self.dtype = dtypes.pop()
        self.shards = tuple(shards)

    def _open_pair(self, prefix: str) -> tuple[np.dtype, PeerShard, tuple[int, int, bool]]:
        storage, idx, bin_ = self.storage, prefix + IDX, prefix + BIN
        path = self.path(idx)
        magic, version, code, sequences, count = _HEADER.unpack(
            read_at(storage, idx, 0, HEADER_SIZE, path=path, field="header"))
        if magic != MAGIC:
            raise FormatError(f"expected the magic {MAGIC!r}, found {magic!r}; not a Megatron "
                              "index", path=path, field="magic")
        if version != VERSION:
            raise FormatError(f"expected {VERSION}, found {version}", path=path, field="version")
        dtype = DTYPE_CODES.get(code)
        if dtype is None:
            raise FormatError(f"expected a token dtype code {sorted(DTYPE_CODES)}, found {code}",
                              path=path, field="dtype")
        if count < 1:
            raise FormatError("expected at least 1 (document_indices starts with 0), found 0",
                              path=path, field="documents")
        size = storage.size(idx)
        tables = HEADER_SIZE + 12 * sequences + 8 * count
        asked = self.options.get("multimodal")
        if size == tables and asked is not True:
            multimodal = False
        elif size == tables + sequences and asked is not False:
            multimodal = True
        else:
            want = {None: f"{tables} or {tables + sequences} (multimodal)",
                    False: f"{tables}", True: f"{tables + sequences} (multimodal)"}[asked]
            raise FormatError(f"{sequences} sequences and {count} document indices need "
                              f"{want} bytes, the file has {size}; truncated or not "
                              "fully written?", path=path, field="sequences")
        bin_size = _size(storage, bin_, self.path(bin_))
        if bin_size % dtype.itemsize:
            raise FormatError(f"{bin_size} bytes is not a whole number of {dtype} tokens",
                              path=self.path(bin_), field="bytes")
        pointers_at = HEADER_SIZE + 4 * sequences
        indices_at = pointers_at + 8 * sequences
        first_doc, = struct.unpack("<q", read_at(storage, idx, indices_at, 8, path=path,
                                                 field="document_indices"))
        last_doc, = struct.unpack("<q", read_at(storage, idx, indices_at + 8 * (count - 1), 8,
                                                path=path, field="document_indices"))
        if first_doc != 0 or last_doc != sequences:
            raise FormatError(f"expected document indices from 0 to {sequences}, found "
                              f"{first_doc} to {last_doc}", path=path, field="document_indices")
        end = 0
        if sequences:
            first, = struct.unpack("<q", read_at(storage, idx, pointers_at, 8, path=path,
                                                 field="pointers"))
            last, = struct.unpack("<q", read_at(storage, idx, indices_at - 8, 8, path=path,
                                                field="pointers"))
            length, = struct.unpack("<i", read_at(storage, idx, pointers_at - 4, 4, path=path,
                                                  field="lengths"))
            if first != 0:
                raise FormatError(f"expected the first pointer at byte 0, found {first}",
                                  path=path, field="pointers")
            end = last + length * dtype.itemsize
        if end != bin_size:
            raise FormatError(f"the index ends its last sequence at byte {end}, the .bin file "
                              f"has {bin_size} bytes; the pair does not match or one is "
                              "truncated", path=self.path(bin_), field="bytes")
        shard = PeerShard(bin_, 0, bin_size // dtype.itemsize, count - 1, idx)
        return dtype, shard, (sequences, count, multimodal)

    def _columns(self, shard: int) -> tuple[Column, Column]:
        """Shard ``shard``'s ``pointers`` and ``document_indices`` columns."""
        sequences, count, _ = self._heads[shard]
        entry = self.shards[shard]
        at = HEADER_SIZE + 4 * sequences
        pointers = Column(entry.boundary, at, sequences, np.dtype("<i8"), 0,
                          entry.records * self.dtype.itemsize)
        indices = Column(entry.boundary, at + 8 * sequences, count, np.dtype("<i8"), 0,
                         sequences)
        return pointers, indices

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        # the last sequence starting at or before the record, then the last
        # document starting at or before that sequence
        pointers, indices = self._columns(shard)
        sequence = self.lookup.search(pointers, records * self.dtype.itemsize) - 1
        return self.lookup.search(indices, sequence) - 1

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        pointers, indices = self._columns(shard)
        entry, itemsize, sequences = self.shards[shard], self.dtype.itemsize, pointers.count
        path = self.path(entry.boundary)
        first = self.lookup.take(indices, ids)
        bad = np.flatnonzero((first < 0) | (first > sequences))
        if bad.size:
            raise FormatError(f"document {int(ids[bad[0]])} starts at sequence "
                              f"{int(first[bad[0]])}, outside 0 to {sequences}", path=path,
                              field="document_indices")
        inside = first < sequences
        byte = np.full(ids.shape[0], entry.records * itemsize, np.int64)
        byte[inside] = self.lookup.take(pointers, first[inside])
        bad = np.flatnonzero((byte < 0) | (byte % itemsize != 0)
                             | (byte > entry.records * itemsize))
        if bad.size:
            raise FormatError(f"sequence {int(first[bad[0]])} starts at byte "
                              f"{int(byte[bad[0]])}, not a whole {itemsize}-byte token "
                              f"inside the .bin", path=path, field="pointers")
        return (byte // itemsize).astype(np.uint64)

    def _tables(self, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard ``shard``'s lengths, pointers and document indices (mapped)."""
        sequences, count, _ = self._heads[shard]
        raw = self.storage.map(self.shards[shard].boundary)
        lengths = raw[HEADER_SIZE:HEADER_SIZE + 4 * sequences].view("<i4")
        at = HEADER_SIZE + 4 * sequences
        pointers = raw[at:at + 8 * sequences].view("<i8")
        at += 8 * sequences
        return lengths, pointers, raw[at:at + 8 * count].view("<i8")

    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        """(field, what is wrong or None, the document offsets when sound)."""
        entry, itemsize = self.shards[shard], self.dtype.itemsize
        if self.storage.size(entry.boundary) != _expected_size(self._heads[shard]):
            return "sequences", "the file changed size since it was opened", None
        lengths, pointers, indices = self._tables(shard)
        offsets, code, at = megatron_offsets(lengths, pointers, indices, itemsize,
                                             entry.records)
        if code == BAD_LENGTH:
            return "lengths", f"negative length at sequence {at}", None
        if code == BAD_POINTER:
            return "pointers", (f"sequence {at} does not start where the one before it ends"
                                if at < lengths.shape[0] else "the last sequence does not end "
                                "the .bin file"), None
        if code == BAD_INDICES:
            return "document_indices", (f"document index {at} goes backwards or past the "
                                        "sequences"), None
        return "document_indices", None, offsets

    def facts(self) -> list[tuple[str, str]]:
        return [("sequences", f"{sum(h[0] for h in self._heads):,}"),
                ("multimodal", ", ".join(sorted({str(h[2]) for h in self._heads})))]


def _expected_size(head: tuple[int, int, bool]) -> int:
    sequences, count, multimodal = head
    return HEADER_SIZE + 12 * sequences + 8 * count + (sequences if multimodal else 0)


def _size(storage: Any, name: str, path: str | Path) -> int:
    try:
        return int(storage.size(name))
    except FileNotFoundError:
        raise FormatError("file is missing (every .idx needs its .bin)", path=path,
                          field="files") from None
