"""Hugging Face ``datasets`` folders (``save_to_disk``) and Arrow files, read in place.

A ``save_to_disk`` folder holds ``state.json`` (``_data_files``: the Arrow
files in order), ``dataset_info.json`` and the Arrow files
(``data-NNNNN-of-NNNNN.arrow``). Each Arrow file is an Arrow IPC stream (or
an IPC file, magic ``ARROW1``): a schema message, then record batches. The
token column (``column=``, default ``input_ids``) is ``list<int>`` or
``large_list<int>`` of an integer type, one row per document. In a record
batch, its list offsets (``<i4``, or ``<i8`` for large lists; ``rows + 1``
entries) and its values (the tokens, back to back) are each one contiguous
buffer of the file, uncompressed: every record batch is one token array at a
byte base of the file, and its offsets minus the first are its document
offsets.

What opening checks: the file is a readable Arrow IPC stream or file whose
schema has the column with an integer list type; no buffer is compressed;
each batch's offsets and values buffers lie inside the file; the list holds
no null values. Opening walks the stream's message headers (``arrow_ipc``:
no pyarrow; O(record batches), about one per 1,000 rows as ``datasets``
writes them; no token is read), one small read per message with its two end
offsets where they lie close, in turn (each message's place comes from the
one before it; a batch whose header bytes equal the first's but for its
numbers is read by one ``struct``, without a flatbuffer parse), the same on
local files and on object storage (``s3://``, ``gs://``, ``az://``); the
whole offsets are checked (non-decreasing) once, on the first read that
needs them, and by ``verify``. A null row reads as an empty
document (a document of the peer's: ids are row numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch._json import load_json
from zerobatch.errors import FormatError
from zerobatch.peers._base import (
    Location,
    PeerFiles,
    PeerShard,
    checked_offsets,
    local_reader,
    read_at,
)
from zerobatch.peers._index import DocumentTables, by_shard
from zerobatch.peers._lookup import Column
from zerobatch.peers.arrow_ipc import read_batches
from zerobatch.storage import LocalStorage, join

__all__ = ["ARROW", "STATE", "HFFiles", "detect"]

ARROW, STATE, DICT = ".arrow", "state.json", "dataset_dict.json"
_MAX_STATE = 64 << 20  # bytes of a state.json parsed


def detect(location: Location) -> bool:
    """Whether ``location`` is a ``save_to_disk`` folder (``state.json`` and
    Arrow files), a ``DatasetDict`` folder, or an ``.arrow`` file."""
    if location.stem is not None:
        return location.stem.endswith(ARROW) and location.stem in location.names
    names = set(location.names)
    return DICT in names or (STATE in names and any(n.endswith(ARROW) for n in names))


def _arrow_files(location: Location) -> list[str]:
    """The Arrow files at ``location``, in the order ``state.json`` gives."""
    if location.stem is not None:
        return [location.stem]
    names = set(location.names)
    if DICT in names:
        splits = sorted(n for n in names if isinstance(location.root, str)
                        or (location.root / n).is_dir())
        raise FormatError(f"a DatasetDict: open one split's folder (one of {splits})",
                          path=location.root, field="splits")
    if STATE not in names:
        found = sorted(n for n in names if n.endswith(ARROW))
        if not found:
            raise FormatError("no state.json and no .arrow file here", path=location.root,
                              field="files")
        return found
    path = join(location.root, STATE)
    size = int(location.storage.size(STATE))
    if size > _MAX_STATE:
        raise FormatError(f"larger than {_MAX_STATE} bytes", path=path, field="state")
    state = load_json(read_at(location.storage, STATE, 0, size, path=path, field="state"),
                      path=path, field="state", max_bytes=_MAX_STATE)
    try:
        entries = state["_data_files"]
        if not isinstance(entries, list):
            raise TypeError(f"_data_files is {type(entries).__name__}, not a list")
        files = [entry["filename"] for entry in entries]
    except (KeyError, TypeError) as error:
        raise FormatError(f"expected JSON with _data_files: [{{filename}}] ({error})",
                          path=path, field="_data_files") from None
    for name in files:
        if not isinstance(name, str) or "/" in name or name not in names:
            raise FormatError(f"lists {name!r:.80}, which is not a file of the folder",
                              path=path, field="_data_files")
    return files


class HFFiles(PeerFiles):
    """The Arrow files of a ``save_to_disk`` folder (see the module docstring).

    Options: ``column`` (the token column; default ``"input_ids"``)."""

    format = "hf"

    def __init__(self, location: Location, options: dict[str, Any]) -> None:
        super().__init__(location, options)
        unknown = set(options) - {"column"}
        if unknown:
            raise TypeError(f"unknown Hugging Face option(s) {sorted(unknown)}; "
                            "the only one is column=")
        self._column = options.get("column", "input_ids")
        self.boundary_field = self._column
        shards: list[PeerShard] = []
        self._offsets: list[tuple[int, int, np.dtype]] = []  # (byte, rows, dtype) per batch
        self._firsts: list[int] = []  # each batch's first list offset
        dtypes = set()
        for name in _arrow_files(location):
            dtype = self._walk(name, shards)
            if dtype is not None:
                dtypes.add(dtype)
        if len(dtypes) > 1:
            raise FormatError(f"the files hold different token types {sorted(map(str, dtypes))}",
                              path=location.root, field=self._column)
        self.dtype = dtypes.pop() if dtypes else np.dtype("<i8")
        self.shards = tuple(shards)
        self._flat = self._flat_offsets()
        self._tables: DocumentTables | None = None

    def _walk(self, name: str, shards: list[PeerShard]) -> np.dtype:
        """Append ``name``'s record batches to ``shards``; its token dtype. By
        reads of the message headers (``arrow_ipc``; local files by ``pread``,
        others through the storage): no pyarrow (its import alone cost a
        fresh process 40-60 ms and ~25 MiB); one small read per record batch
        where its list offsets lie within 64 KiB of its header (its message
        prefix, header and first and last list offset), else two or three."""
        path, storage = self.path(name), self.storage
        size = int(storage.size(name))
        if isinstance(storage, LocalStorage):  # pread, not the mapping: see local_reader
            with local_reader(path) as read:
                return self._add_batches(name, size, read, shards)
        handle = storage.open(name)

        def read_storage(offset: int, count: int) -> bytes:
            buffer = bytearray(max(0, min(count, size - offset)))
            got = storage.readinto(handle, offset, buffer) if buffer else 0
            return bytes(buffer[:got])

        return self._add_batches(name, size, read_storage, shards)

    def _add_batches(self, name: str, size: int, read: Callable[[int, int], bytes],
                     shards: list[PeerShard]) -> np.dtype:
        """``_walk``'s record batches of ``name`` (``size`` bytes), read by ``read``."""
        path = self.path(name)
        layout, batches = read_batches(read, size, self._column, path)
        dtype, kind = layout.dtype, np.dtype(f"<i{layout.width}")
        kept = np.flatnonzero(batches.rows)
        first, last = batches.first[kept], batches.last[kept]
        bad = np.flatnonzero(batches.null_values[kept] != 0)
        if bad.size:
            raise FormatError("expected no null tokens", path=path,
                              field=f"{self._column}[batch {int(kept[bad[0]])}]")
        tokens = last - first
        bad = np.flatnonzero((first < 0) | (tokens < 0) |
                             (last > batches.values_bytes[kept] // dtype.itemsize))
        if bad.size:
            i = int(bad[0])
            raise FormatError(f"offsets {int(first[i])} to {int(last[i])} do not lie in the "
                              "values buffer", path=path,
                              field=f"{self._column}[batch {int(kept[i])}]")
        starts = batches.values_at[kept] + first * dtype.itemsize
        rows = batches.rows[kept].tolist()
        shards.extend(PeerShard(name, start, count, records, name) for start, count, records
                      in zip(starts.tolist(), tokens.tolist(), rows, strict=True))
        self._offsets.extend((at, records, kind) for at, records
                             in zip(batches.offsets_at[kept].tolist(), rows, strict=True))
        self._firsts.extend(first.tolist())
        return dtype

    def _list_offsets(self, shard: int) -> Column:
        at, rows, dtype = self._offsets[shard]
        first = self._firsts[shard]
        return Column(self.shards[shard].tokens, at, rows + 1, dtype, first,
                      first + self.shards[shard].records)

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return self.lookup.search(self._list_offsets(shard), records + self._firsts[shard]) - 1

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        found = self.lookup.take(self._list_offsets(shard), ids).astype(np.int64)
        found -= self._firsts[shard]
        bad = np.flatnonzero(found < 0)
        if bad.size:
            raise FormatError(f"row {int(ids[bad[0]])} starts before the batch's first row",
                              path=self.path(self.shards[shard].tokens), field=self._column)
        return found.astype(np.uint64)

    def offsets_of(self, shards: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]
                   ) -> npt.NDArray[np.uint64]:
        """Every pair at once from the mapped files. ``save_to_disk`` writes a
        record batch (a shard here) per 1,000 rows, so a batch of documents
        touches about one shard per document: one lookup per shard cost ~40 us
        each, more than ``ds[indices]`` takes for the whole batch."""
        flat = self._flat
        if flat is None or not shards.size:
            return super().offsets_of(shards, ids)
        files, names, starts, rows, firsts, dtype = flat
        if ((ids < 0) | (ids > rows[shards])).any():
            return super().offsets_of(shards, ids)  # its errors name the shard
        which = files[shards]
        positions = starts[shards] + ids
        found = np.empty(shards.shape[0], np.int64)
        for f, where in by_shard(which):
            found[where] = self.lookup.whole(names[f], dtype)[positions[where]]
        found -= firsts[shards]
        bad = np.flatnonzero(found < 0)
        if bad.size:
            raise FormatError(f"row {int(ids[bad[0]])} starts before the batch's first row",
                              path=self.path(self.shards[int(shards[bad[0]])].tokens),
                              field=self._column)
        return found.astype(np.uint64)

    def document_tables(self) -> DocumentTables | None:
        """Every record batch's list offsets in the mapped files, for
        ``_kernels.plan_mapped_documents``: per shard its file, its first
        entry there and its first offset; per file its mapping's address and
        entries; an empty array of the offsets' dtype. None where
        ``offsets_of`` goes shard by shard."""
        flat = self._flat
        if flat is None:
            return None
        tables = self._tables
        if tables is None:
            files, names, starts, _, firsts, dtype = flat
            arrays = [self.lookup.whole(name, dtype) for name in names]  # held by the lookup
            tables = self._tables = DocumentTables(
                files, starts, firsts, np.array([a.ctypes.data for a in arrays], np.int64),
                np.array([a.shape[0] for a in arrays], np.int64), np.zeros(0, dtype))
        return tables

    def _flat_offsets(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray,
                                     np.dtype] | None:
        """For ``offsets_of``, per shard: its file (an index into the names),
        the entry of that file where its offsets start, its rows and its first
        offset; and the offsets' one dtype. None over object storage, or when
        the tables are not whole entries of one dtype (then shard by shard)."""
        if self.lookup.ranged or not self._offsets:
            return None
        dtypes = {dtype for _, _, dtype in self._offsets}
        dtype = dtypes.pop()
        if dtypes or any(at % dtype.itemsize for at, _, _ in self._offsets):
            return None
        names = list(dict.fromkeys(shard.tokens for shard in self.shards))
        number = {name: i for i, name in enumerate(names)}
        files = np.array([number[shard.tokens] for shard in self.shards], np.int64)
        starts = np.array([at // dtype.itemsize for at, _, _ in self._offsets], np.int64)
        rows = np.array([count for _, count, _ in self._offsets], np.int64)
        return files, names, starts, rows, np.array(self._firsts, np.int64), dtype

    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        at, rows, dtype = self._offsets[shard]
        name = self.shards[shard].tokens
        try:
            raw = read_at(self.storage, name, at, (rows + 1) * dtype.itemsize,
                          path=self.path(name), field=self._column)
        except FormatError:
            return self._column, "the file changed size since it was opened", None
        table = np.frombuffer(raw, dtype)
        offsets = table - table[0]
        message = checked_offsets(offsets, self.shards[shard].records,
                                  path=self.path(self.shards[shard].tokens), field=self._column)
        return self._column, message, offsets.astype(np.uint64) if message is None else None

    def facts(self) -> list[tuple[str, str]]:
        return [("column", self._column), ("record batches", f"{len(self.shards):,}")]
