"""datatrove / nanotron ``.ds`` token files, read in place.

A folder (or prefix) holds, per tokenized file ``<name>.ds`` (datatrove's
``TokenizedFile``; read by nanotron and datatrove's ``DatatroveFolderDataset``):

======================  ===========================================================
file                    layout
======================  ===========================================================
``<name>.ds``           headerless little-endian tokens, ``token_size`` bytes each:
                        2 (``<u2``) or 4 (``<u4``)
``<name>.ds.index``     ``<u8`` document ends, in tokens, no header: one per
                        document, non-decreasing, the last one the file's tokens
``<name>.ds.loss``      optional: one byte per token, 0 or 1 (the loss mask);
                        read as the per-token field ``loss_mask`` (``u1``)
``<name>.ds.metadata``  optional text: first line ``<tokenizer>|<token_size>``
                        (the tokenizer name may itself hold ``|``), then the tokens
======================  ===========================================================

``token_size`` comes from the ``token_size=`` option, else the metadata
file, else the ``.ds`` size over the last document end (the index's last
entry: one 8-byte read). The sources must agree.

What opening checks (O(1) per file: sizes and the index's last entry): every
``.ds`` has its ``.ds.index``; the index is a whole number of ``<u8``; the
``.ds`` is a whole number of tokens and its tokens equal the last document end;
a ``.ds.loss``, when any file has one, exists for every file with one byte
per token. Reads search the index and read the ends they need (by range over
object storage); the whole index (non-decreasing ends) is checked by
``verify``, which also checks that the loss bytes are 0 or 1. Files are one
logical token array, in name order (datatrove's listing order). Unlike
datatrove's reader, windows cross files and keep every token.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch.errors import FormatError
from zerobatch.peers._base import Location, PeerFiles, PeerShard, checked_offsets, read_at
from zerobatch.peers._lookup import Column
from zerobatch.stream.verify import Problem

__all__ = ["INDEX", "LOSS", "METADATA", "SUFFIX", "TOKEN_DTYPES", "DatatroveFiles", "detect"]

SUFFIX, INDEX, LOSS, METADATA = ".ds", ".ds.index", ".ds.loss", ".ds.metadata"
TOKEN_DTYPES: dict[int, np.dtype] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
"""Token size in bytes -> dtype, as datatrove writes them ("H" and "I")."""
_MAX_METADATA = 1 << 16  # bytes of a .ds.metadata file read


def detect(location: Location) -> bool:
    """Whether ``location`` is a folder holding ``.ds`` files, or one ``.ds`` file."""
    if location.stem is not None:
        return location.stem.endswith(SUFFIX) and location.stem in location.names
    return any(n.endswith(SUFFIX) for n in location.names)


class DatatroveFiles(PeerFiles):
    """The ``.ds`` files at a location (see the module docstring).

    Options: ``token_size`` (2 or 4; default: from the metadata or the sizes)."""

    format = "datatrove"
    boundary_field = "ends"

    def __init__(self, location: Location, options: dict[str, Any]) -> None:
        super().__init__(location, options)
        unknown = set(options) - {"token_size"}
        if unknown:
            raise TypeError(f"unknown datatrove option(s) {sorted(unknown)}; "
                            "the only one is token_size=")
        names = [location.stem] if location.stem is not None else sorted(
            n for n in location.names if n.endswith(SUFFIX))
        if not names:
            raise FormatError("no .ds file here", path=location.root, field="files")
        listed = set(location.names)
        sizes = [self._size(name) for name in names]
        ends = [self._last_end(name) for name in names]
        size = self._token_size(names, sizes, ends)
        self.dtype = TOKEN_DTYPES[size]
        shards = []
        for name, nbytes, (end, documents) in zip(names, sizes, ends, strict=True):
            if nbytes % size or nbytes // size != end:
                raise FormatError(f"{nbytes} bytes of {size}-byte tokens, but the index ends "
                                  f"its last document at token {end}; the pair does not "
                                  "match or one is truncated", path=self.path(name),
                                  field="bytes")
            shards.append(PeerShard(name, 0, end, documents, name[:-len(SUFFIX)] + INDEX))
        self.shards = tuple(shards)
        losses = [name[:-len(SUFFIX)] + LOSS for name in names]
        have = [loss in listed for loss in losses]
        if any(have):
            for loss, shard in zip(losses, self.shards, strict=True):
                got = self._size(loss)
                if got != shard.records:
                    raise FormatError(f"expected one byte per token ({shard.records}), found "
                                      f"{got}", path=self.path(loss), field="bytes")
            self.fields = {"loss_mask": (np.dtype("u1"), tuple(losses))}

    def _size(self, name: str) -> int:
        try:
            return int(self.storage.size(name))
        except FileNotFoundError:
            raise FormatError("file is missing (every .ds needs its .ds.index, and a "
                              ".ds.loss when the others have one)", path=self.path(name),
                              field="files") from None

    def _last_end(self, name: str) -> tuple[int, int]:
        """(the last document end, documents) of ``name``'s index."""
        index = name[:-len(SUFFIX)] + INDEX
        size = self._size(index)
        if size % 8:
            raise FormatError(f"{size} bytes is not a whole number of 8-byte document ends",
                              path=self.path(index), field="ends")
        if size == 0:
            return 0, 0
        end, = struct.unpack("<Q", read_at(self.storage, index, size - 8, 8,
                                           path=self.path(index), field="ends"))
        return end, size // 8

    def _token_size(self, names: list[str], sizes: list[int],
                    ends: list[tuple[int, int]]) -> int:
        """The token size from the option, the metadata files and the sizes, which
        must agree."""
        claims: dict[str, int] = {}
        asked = self.options.get("token_size")
        if asked is not None:
            if asked not in TOKEN_DTYPES:
                raise ValueError(f"token_size must be 2 or 4, got {asked!r}")
            claims["token_size="] = asked
        for name in names:
            meta = name[:-len(SUFFIX)] + METADATA
            if meta in self.location.names:
                claims[meta] = self._metadata_size(meta)
        for name, nbytes, (end, _) in zip(names, sizes, ends, strict=True):
            if end and nbytes % end == 0 and nbytes // end in TOKEN_DTYPES:
                claims[name] = nbytes // end
        if not claims:
            raise FormatError("cannot tell the token size (no .ds.metadata, and the sizes "
                              "do not give it); pass token_size=2 or 4",
                              path=self.location.root, field="token_size")
        values = set(claims.values())
        if len(values) > 1:
            raise FormatError(f"the token size is ambiguous: {claims}; pass token_size= to "
                              "say which, or fix the files", path=self.location.root,
                              field="token_size")
        return values.pop()

    def _metadata_size(self, name: str) -> int:
        size = min(self._size(name), _MAX_METADATA)
        raw = read_at(self.storage, name, 0, size, path=self.path(name), field="token_size")
        first = raw.split(b"\n", 1)[0].decode("utf-8", "replace")
        _, bar, value = first.rpartition("|")
        value = value.strip()  # the value checked is the value returned
        if not bar or value not in ("2", "4"):
            raise FormatError(f"expected a first line '<tokenizer>|<2 or 4>', found "
                              f"{first[:80]!r}", path=self.path(name), field="token_size")
        return int(value)

    def _column(self, shard: int) -> Column:
        entry = self.shards[shard]
        return Column(entry.boundary, 0, entry.documents, np.dtype("<u8"), 0, entry.records)

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        # the document holding record r: how many documents end at or before it
        return self.lookup.search(self._column(shard), records)

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        out = np.zeros(ids.shape[0], np.uint64)  # document 0 starts at 0, d at end d - 1
        later = ids > 0
        out[later] = self.lookup.take(self._column(shard), ids[later] - 1)
        return out

    def _ends(self, shard: int) -> np.ndarray:
        raw = self.storage.map(self.shards[shard].boundary)
        return raw[:raw.shape[0] // 8 * 8].view("<u8")

    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        entry = self.shards[shard]
        ends = self._ends(shard)
        if ends.shape[0] != entry.documents:
            return "ends", "the file changed size since it was opened", None
        offsets = np.empty(ends.shape[0] + 1, np.uint64)
        offsets[0] = 0
        offsets[1:] = ends
        message = checked_offsets(offsets, entry.records, path=self.path(entry.boundary),
                                  field="ends")
        return "ends", message, offsets if message is None else None

    def problems(self) -> list[Problem]:
        found = super().problems()
        for loss in self.fields.get("loss_mask", (None, ()))[1]:
            values = self.storage.map(loss)
            if values.shape[0] and int(values.max()) > 1:
                found.append(Problem(self.path(loss), "loss_mask",
                                     f"expected bytes 0 or 1, found {int(values.max())}"))
        return found

    def facts(self) -> list[tuple[str, str]]:
        return [("token size", f"{self.dtype.itemsize} bytes"),
                ("fields", ", ".join(self.fields) or "-")]
