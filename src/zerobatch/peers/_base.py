"""What every peer format shares: where its files are, how a format describes
them (``PeerFiles``), and the dataset that reads them in place (``PeerDataset``).

A peer format is its own way of giving two things: token files (one
headerless little-endian array per shard, at a byte ``base`` of a file) and
per-shard document offsets. ``PeerDataset`` is a ``stream.Dataset`` over
those: windows, documents, the Loader, the plan, torch, JAX and the service
work on it unchanged. Opening reads headers and sizes only (O(files) small
reads). Reads look up the document offsets they need in the format's own
boundary table (``PeerFiles.locate``, ``PeerFiles.offsets``; mapped locally,
by range over object storage: ``_lookup``), never a whole table per
process; only a format whose boundaries need a pass (OLMo's EOS scan or
csv.gz) derives them whole, once (``PeerFiles.docs``).

Document ids are the peer's own: a document of zero tokens (an empty
Megatron document, an empty Arrow row) is a document, ``documents()``
returns it as an empty row, and windows read past it as if it were not there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch._json import load_json
from zerobatch._text import format_table
from zerobatch.columnar import Batch
from zerobatch.errors import FormatError
from zerobatch.peers._index import DocumentTables, PeerIndex, by_shard
from zerobatch.peers._kernels import BAD_SAMPLE
from zerobatch.peers._lookup import Lookup
from zerobatch.source import read_indices
from zerobatch.storage import LocalStorage, Storage, is_url, join, local_path, open_storage
from zerobatch.stream._kernels import SHARD
from zerobatch.stream._tables import shard_tables
from zerobatch.stream.manifest import OFFSET_DTYPE, TOKENS, Manifest, Shard
from zerobatch.stream.reader import Dataset, Documents, TokenWindows
from zerobatch.stream.verify import Problem

__all__ = ["Location", "PeerDataset", "PeerFiles", "PeerShard", "local_reader", "locate",
           "read_at"]


@dataclass(frozen=True)
class PeerShard:
    """One token file of a peer dataset: ``records`` tokens of the dataset's
    dtype at byte ``base`` of ``tokens``, split into ``documents`` documents
    whose boundaries come from the file ``boundary``."""

    tokens: str
    base: int
    records: int
    documents: int
    boundary: str


@dataclass(frozen=True)
class Location:
    """Where a peer dataset's files are: ``root`` (a folder or prefix URL), its
    ``storage``, the names directly under it, and the ``stem`` the caller
    named inside it (a Megatron prefix, one file), or None for the whole root."""

    root: str | Path
    storage: Storage
    names: tuple[str, ...]
    stem: str | None
    # JSON files read here (read_json): name -> (bytes, parsed), once for every
    # format's detect and the one that opens
    parsed: dict[str, tuple[bytes, Any]] = dataclasses.field(default_factory=dict,
                                                             compare=False, repr=False)


MAX_JSON = 1 << 30
"""Bytes of a peer's JSON file (an MDS or LitData ``index.json``) parsed at most."""


def read_json(location: Location, name: str, format: str) -> tuple[bytes, Any]:
    """``name`` under ``location`` (a format's index): its bytes and their
    JSON, size and depth capped first (``FormatError`` naming the file, field
    ``index``); read once per ``Location``."""
    found = location.parsed.get(name)
    if found is not None:
        return found
    where = join(location.root, name)
    try:
        size = location.storage.size(name)
    except FileNotFoundError:
        raise FormatError(f"file is missing: not a {format} dataset", path=where,
                          field="index") from None
    if size > MAX_JSON:
        raise FormatError(f"larger than {MAX_JSON} bytes", path=where, field="index")
    raw = bytes(read_at(location.storage, name, 0, size, path=where, field="index"))
    found = raw, load_json(raw, path=where, field="index", max_bytes=MAX_JSON)
    location.parsed[name] = found
    return found


def _listing(storage: Storage, root: str | Path) -> tuple[str, ...]:
    if isinstance(root, Path):
        try:
            return tuple(sorted(os.listdir(root)))
        except OSError:
            return ()
    names = getattr(storage, "names", None)
    return tuple(names()) if names is not None else ()


def locate(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
           ) -> Location:
    """The folder (or prefix) ``path`` names, or, when ``path`` names a file or
    a file stem inside one, its parent and that stem. One LIST for a URL."""
    options = storage_options or {}
    if is_url(path):
        url = str(path)
        storage = open_storage(url, **options)
        names = _listing(storage, url)
        if names or url.endswith("/"):
            return Location(url, storage, names, None)
        storage.close()
        parent, _, name = url.rstrip("/").rpartition("/")
        storage = open_storage(parent, **options)
        return Location(parent, storage, _listing(storage, parent), name)
    local = local_path(path)
    stem: str | None = None if local.is_dir() else local.name
    root = local if stem is None else local.parent
    storage = LocalStorage(root)
    return Location(root, storage, _listing(storage, root), stem)


def read_at(storage: Storage, name: str, offset: int, count: int, *, path: str | Path,
            field: str) -> bytes:
    """``count`` bytes at ``offset`` of ``name``; ``FormatError`` naming ``path``
    and ``field`` when the file ends before them."""
    buffer = bytearray(count)
    got = storage.readinto(storage.open(name), offset, buffer) if count else 0
    if got != count:
        raise FormatError(f"file ends at byte {offset + got}, before byte {offset + count}; "
                          "truncated or not fully written?", path=path, field=field)
    return bytes(buffer)


@contextlib.contextmanager
def local_reader(path: str | Path) -> Iterator[Callable[[int, int], bytes]]:
    """``read(offset, count)``: up to ``count`` bytes at ``offset`` of the local
    file ``path`` (fewer only at its end), by ``pread`` on a descriptor of
    its own. For headers read at opening: read through the file's mapping,
    each would map its page cache into the process (large folios whole)."""
    descriptor = os.open(path, os.O_RDONLY)

    def read(offset: int, count: int) -> bytes:
        if offset < 0 or count <= 0:
            return b""
        data = os.pread(descriptor, count, offset)
        if len(data) == count or not data:  # (one pread returns at most ~2 GiB)
            return data
        parts, got = [data], len(data)
        while got < count and (part := os.pread(descriptor, count - got, offset + got)):
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    try:
        yield read
    finally:
        os.close(descriptor)


class PeerFiles(ABC):
    """A peer format's view of its files, built by opening them (headers and
    sizes only). Subclasses set ``format``, ``dtype`` and ``shards`` in their
    constructor and give each shard's document offsets whole (``_documents``,
    for ``docs``, ``problems`` and ``verify``) and, where the format has a
    table to search, per lookup (``locate`` and ``offsets``, which reads use;
    the defaults derive the whole table once)."""

    format: str
    dtype: np.dtype
    shards: tuple[PeerShard, ...]
    fields: dict[str, tuple[np.dtype, tuple[str, ...]]]
    """Per-token fields kept in files of their own (datatrove's ``.ds.loss``):
    name -> (dtype, one headerless file per shard, records aligned with its tokens)."""
    scattered = False
    """Whether a shard's records are pieces of its file rather than one array at
    ``base`` (MDS: one piece per sample); such a format reads them itself
    (``read_scattered``)."""

    boundary_field: str = "offsets"
    """The field of the boundary file that a bad document offset names."""
    counted: bool = True
    """Whether every shard's ``documents`` is known from opening (OLMo's are not:
    its boundaries need a pass, made once by ``docs`` on first use)."""

    def __init__(self, location: Location, options: dict[str, Any]) -> None:
        self.location = location
        self.options = options
        self.fields = {}
        self.lookup = Lookup(location.storage)
        self._whole_tables: dict[int, np.ndarray] = {}
        self._whole_lock = _forksafe.lock()

    @property
    def storage(self) -> Storage:
        """The storage the files are read through."""
        return self.location.storage

    def path(self, name: str) -> str | Path:
        """``name``'s full path or URL, for messages."""
        return join(self.location.root, name)

    @abstractmethod
    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        """Shard ``shard``'s document offsets from the format's own table, checked:
        ``(field, what is wrong or None, the offsets when sound)``."""

    def docs(self, shard: int) -> np.ndarray:
        """Shard ``shard``'s ``documents + 1`` ``<u8`` token offsets, from 0 to its
        records, derived from the format's own table and checked (``FormatError``
        naming the file and field otherwise)."""
        field, message, offsets = self._documents(shard)
        if message is not None or offsets is None:
            raise FormatError(message or "unsound",
                              path=self.path(self.shards[shard].boundary), field=field)
        return offsets

    def whole(self, shard: int) -> np.ndarray:
        """Shard ``shard``'s ``docs``, derived once and kept (for formats that
        have no table to look entries up in)."""
        with self._whole_lock:
            table = self._whole_tables.get(shard)
            if table is None:
                table = np.ascontiguousarray(self.docs(shard), OFFSET_DTYPE)
                table.setflags(write=False)
                self._whole_tables[shard] = table
            return table

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Per record of shard ``shard`` (each below its records), the document
        holding it: the last one whose offset is at or below it. This default
        searches ``whole``; a format with a boundary table searches it in place."""
        found = np.searchsorted(self.whole(shard), records.astype(np.uint64), side="right")
        return found.astype(np.int64) - 1

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """Shard ``shard``'s document offsets (tokens) at ``ids`` (each in ``[0,
        documents]``); ``FormatError`` naming the file and field when an entry
        read is unsound. This default reads ``whole``; a format with a boundary
        table reads only those entries."""
        return self.whole(shard)[ids]

    def document_tables(self) -> DocumentTables | None:
        """Every shard's offsets as runs of a few mapped files, for
        ``_kernels.plan_mapped_documents`` (see ``HFFiles``), or None: this
        default, where a batch's documents are planned from ``offsets_of``."""
        return None

    def offsets_of(self, shards: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]
                   ) -> npt.NDArray[np.uint64]:
        """``offsets`` of each ``(shards[i], ids[i])`` pair, shards in any order.
        This default asks ``offsets`` once per shard present; a format whose
        batches touch many shards answers all at once."""
        out = np.zeros(shards.shape[0], OFFSET_DTYPE)
        for s, where in by_shard(shards):
            out[where] = self.offsets(s, ids[where])
        return out

    def problems(self) -> list[Problem]:
        """Everything wrong with the files, in one pass over them (no tokens are
        checked against a vocabulary the format does not record)."""
        found = []
        for i, entry in enumerate(self.shards):
            field, message, _ = self._documents(i)
            if message is not None:
                found.append(Problem(self.path(entry.boundary), field, message))
        return found

    def prepare(self, shards: npt.NDArray[np.int64]) -> None:
        """Ready what reading ``shards`` needs beyond their open files, before
        their first read opens them (MDS: their sample tables). This default
        needs nothing."""
        return

    def read_scattered(self, shards: np.ndarray, requests: np.ndarray,
                       buffer: np.ndarray) -> None:
        """Run a dataset's read ``requests`` (``(4, P)``: handle, byte offset, bytes
        and destination, over each shard's records as if they were one array)
        into ``buffer``; only for ``scattered`` formats."""
        raise NotImplementedError(f"{self.format} records are one array per shard")

    def direct_kernels(self) -> tuple[Any, Any, tuple[Any, ...]] | None:
        """For a ``scattered`` format, the kernels that read windows straight
        from local files in one call (without and with the document columns,
        each taking ``stream._kernels.read_windows``'s arguments, then the
        third item's), or None: this default, where every read goes through
        ``read_scattered``."""
        return None

    def facts(self) -> list[tuple[str, str]]:
        """Format-specific rows for ``describe``."""
        return []

    def identity(self) -> dict[str, Any]:
        """What the fingerprint hashes: the format, dtype, options, and every
        shard's files with their sizes in bytes."""
        storage = self.storage
        files = sorted({name for s in self.shards for name in (s.tokens, s.boundary)}
                       | {name for _, names in self.fields.values() for name in names})
        return {"format": self.format, "dtype": self.dtype.str,
                "options": {k: repr(v) for k, v in sorted(self.options.items())},
                "files": [[name, storage.size(name)] for name in files],
                "shards": [[s.tokens, s.base, s.records, s.documents] for s in self.shards]}


def _manifest(files: PeerFiles) -> Manifest:
    shards = tuple(Shard(f"{i:05d}", s.records, s.documents, None, {})
                   for i, s in enumerate(files.shards))
    return Manifest(files.dtype, None, None, None, shards)


class PeerDataset(Dataset):
    """A peer format's files read in place as a token-stream ``Dataset`` (see
    the module docstring). Create with ``zerobatch.open_dataset(path,
    format=...)``. Immutable and thread-safe like ``Dataset``; pickles as its
    location and options (the copy opens the files again)."""

    _index: PeerIndex

    def __init__(self, files: PeerFiles) -> None:
        self._files = files
        # A scattered format's requests are over its token stream, with no base.
        super().__init__(files.location.root, _manifest(files), files.storage, None,
                         bases=None if files.scattered else [s.base for s in files.shards])
        self._field_sets = {name: PeerDataset(_FieldFiles(files, name)) for name in files.fields}
        self._whole_docs: np.ndarray | None = None

    def windows(
        self, seq_len: int, *, stride: int | None = None, labels: Any = "shifted",
        dtype: Any = "int64", columns: Sequence[str] | str | None = None,
        document_masking: bool = False,
    ) -> TokenWindows:
        """Windows as ``Dataset.windows``; each per-token field of the format
        (``fields``) is a ``[B, seq_len]`` column aligned with ``input_ids``
        (one of the default columns)."""
        kind = _FieldWindows if self._field_sets else _PeerWindows
        return kind(self, seq_len, stride=stride, labels=labels, dtype=dtype,
                             columns=columns, document_masking=document_masking)

    def documents(self, *, max_len: int | None = None, dtype: Any = "int64") -> Documents:
        """Documents as ``Dataset.documents``, with each per-token field jagged."""
        if not self._field_sets:
            return super().documents(max_len=max_len, dtype=dtype)
        return _FieldDocuments(self, max_len=max_len, dtype=dtype)

    @property
    def fields(self) -> tuple[str, ...]:
        """The per-token fields read from files of their own (e.g. ``loss_mask``)."""
        return tuple(self._field_sets)

    def close(self) -> None:
        for field in self._field_sets.values():
            field.close()
        super().close()

    def __enter__(self) -> PeerDataset:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reopen, (type(self._files), self._files.location, self._files.options)

    def _make_index(self) -> PeerIndex:
        return PeerIndex(self._files, self._shard_error)

    def _docs_tables(self) -> np.ndarray:
        """Every shard's document offsets whole, derived and checked once
        (``PeerFiles.whole``), empty documents dropped (a repeated offset
        changes no segment): what the direct kernels take (``_PeerWindows``)."""
        found = self._whole_docs
        if found is None:
            with self._lock:
                if self._whole_docs is None:
                    tables = []
                    for shard in range(len(self._files.shards)):
                        table = self._files.whole(shard)
                        starts = np.ones(table.shape[0], bool)
                        starts[1:] = table[1:] != table[:-1]
                        tables.append(table if starts.all() else table[starts])
                    self._whole_docs = shard_tables(tables, OFFSET_DTYPE)
                found = self._whole_docs
        return found

    def _token_file(self, shard: int) -> str:
        return self._files.shards[shard].tokens

    def _open(self, shards: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        # A shard's open file is what every read kernel checks first: whatever
        # else reading it needs is ready before (PeerFiles.prepare).
        self._files.prepare(shards)
        return super()._open(shards)

    def _read_records(self, pieces: np.ndarray, requests: np.ndarray, closed: int,
                      buffer: np.ndarray) -> np.ndarray:
        if not self._files.scattered:
            return super()._read_records(pieces, requests, closed, buffer)
        shards = pieces[:, SHARD]
        if closed >= 0:
            requests[0] = self._open(shards)[shards]
        self._files.read_scattered(shards, requests, buffer)
        return buffer.view(self._manifest.record_dtype)

    def _shard_error(self, shard: int, suffix: str, field: str, message: str) -> FormatError:
        entry = self._files.shards[shard]
        name = entry.tokens if suffix == TOKENS else entry.boundary
        if suffix != TOKENS and field == "offsets":
            field = self._files.boundary_field
        return FormatError(message, path=self._files.path(name), field=field)

    @property
    def num_documents(self) -> int:
        """Documents in all files, as the format counts them (empty ones too):
        from the headers, except OLMo's, counted on first use."""
        return int(self._index.doc_starts()[-1])

    @property
    def format(self) -> str:
        """The peer format's name (``"megatron"``, ``"datatrove"``, …)."""
        return self._files.format

    @property
    def files(self) -> PeerFiles:
        """The format's view of the files."""
        return self._files

    @property
    def fingerprint(self) -> str:
        """The XXH3-64 of the format, dtype, options and every file's name and
        size (``PeerFiles.identity``): identifies the data a loader state
        belongs to. Files rewritten in place with the same sizes keep it."""
        import xxhash

        text = json.dumps(self._files.identity(), sort_keys=True)
        return xxhash.xxh3_64_hexdigest(text.encode())

    def __repr__(self) -> str:
        return (f"PeerDataset({self.format!r}, {str(self._path)!r}, tokens={self.num_tokens}, "
                f"shards={len(self._files.shards)})")

    def verify(self) -> list[Problem]:
        """Every problem with the files (one pass over them); ``[]`` when sound.
        With a signed token dtype it also reads every token: a negative id is
        refused by every read, so verify reports it too."""
        return self._files.problems() + _negative_tokens(self._files)

    def describe(self) -> str:
        """A table describing the dataset, from its headers alone."""
        shards = self._files.shards
        rows = [("format", self.format), ("location", str(self._path)),
                ("token dtype", self._files.dtype.str), ("files", f"{len(shards):,}"),
                ("tokens", f"{self.num_tokens:,}"), ("documents", f"{self.num_documents:,}"),
                *self._files.facts()]
        return format_table(rows)


_VERIFY_CHUNK = 8 * 2**20  # tokens checked per step of the negative-id scan


def _negative_tokens(files: PeerFiles) -> list[Problem]:
    """The first negative token id of each shard, when the dtype is signed (the
    read kernels refuse negative ids: see ``stream/_kernels``)."""
    dtype = files.dtype
    if dtype.kind != "i" or files.scattered:  # a scattered format checks its own
        return []
    found = []
    for shard in files.shards:
        raw = files.storage.map(shard.tokens)
        tokens = raw[shard.base:shard.base + shard.records * dtype.itemsize].view(dtype)
        for start in range(0, tokens.size, _VERIFY_CHUNK):
            chunk = tokens[start:start + _VERIFY_CHUNK]
            if chunk.size and int(chunk.min()) < 0:
                record = start + int(np.argmax(chunk < 0))
                found.append(Problem(
                    files.path(shard.tokens), "tokens",
                    f"token id {int(tokens[record])} at record {record} is negative (stored "
                    f"as {dtype.str}); token ids must be >= 0: the file is corrupt, or was "
                    "written with a signed dtype by mistake"))
                break
    return found


class _FieldFiles(PeerFiles):
    """One per-token field of ``parent`` as a token array of its own (same
    shards, records and documents; the field's files in place of the tokens)."""

    def __init__(self, parent: PeerFiles, name: str) -> None:
        super().__init__(parent.location, {})
        dtype, names = parent.fields[name]
        self.format = f"{parent.format}:{name}"
        self.dtype = dtype
        self.shards = tuple(PeerShard(file, 0, s.records, s.documents, s.boundary)
                            for s, file in zip(parent.shards, names, strict=True))
        self._parent = parent
        self.counted = parent.counted

    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        return self._parent._documents(shard)

    def whole(self, shard: int) -> np.ndarray:
        return self._parent.whole(shard)

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return self._parent.locate(shard, records)

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        return self._parent.offsets(shard, ids)

    def problems(self) -> list[Problem]:
        return []  # the parent reports its tables


# Documents a dataset may have for its offsets to be derived whole (8 bytes
# each, per process: 128 MiB); larger ones look them up per batch.
WHOLE_DOCUMENTS_MAX = 1 << 24
# Reads of a local dataset's document columns by per-batch lookups before it
# derives its offsets whole (its first batches cost O(1), then each costs less).
LOOKUP_READS = 16


class _PeerWindows(TokenWindows):
    """``TokenWindows`` whose document columns go through the peer index: the
    first ``LOOKUP_READS`` local reads of those columns look up the offsets
    their pieces touch; after them (at once in a mixture's one-call read of
    many datasets) the direct kernel reads them with every shard's offsets
    whole, an O(documents) derivation made once. Only where the format counts
    its documents in its headers and has at most ``WHOLE_DOCUMENTS_MAX``;
    remote reads always look up. A scattered format (MDS: its tokens are not
    one array per file) reads local windows by its own direct kernels
    (``PeerFiles.direct_kernels``), never by many datasets' one call."""

    _ds: PeerDataset

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        files = self._ds._files
        self._lookups_left = 0
        if files.scattered:
            self._one_call = False  # many datasets' one call reads arrays, not pieces
            direct = files.direct_kernels() if self._ds._local is not None else None
            if direct is None:
                self._direct = False
            else:
                plain, segments, self._kernel_tail = direct
                self._kernels = (plain, segments)
        if self._want_segments:
            whole = (self._direct and files.counted and self._ds._local is not None
                     and self._ds.num_documents <= WHOLE_DOCUMENTS_MAX)
            self._direct = False  # until LOOKUP_READS reads have looked up
            self._lookups_left = LOOKUP_READS if whole else 0
            if not files.scattered:
                self._one_call = whole

    def _count_lookup(self) -> None:
        """After ``LOOKUP_READS`` reads by lookups, the whole offsets."""
        if self._lookups_left > 0:
            self._lookups_left -= 1
            if self._lookups_left == 0:
                self._ds._docs_tables()  # derived and checked once (FormatError)
                self._direct = True

    def read(self, indices: Sequence[int] | np.ndarray) -> Batch:
        # (read_collated reads through read until the direct kernel takes over)
        self._count_lookup()
        return super().read(indices)

    def _raise_failed(self, pieces: npt.NDArray[np.int64], requests: npt.NDArray[np.int64],
                      failed: int, status: int) -> NoReturn:
        """A scattered format's failed direct read, read again by the format's
        own ``read_scattered``: its ``FormatError`` names the file and sample."""
        if self._ds._files.scattered:
            end = int((requests[2] + requests[3]).max()) if requests.shape[1] else 0
            self._ds._read_records(pieces, requests, -1, np.empty(end, np.uint8))
            if status == BAD_SAMPLE:
                raise RuntimeError("a sample's header disagreed with its table, then agreed "
                                   "when read again: did a file change while it was read?")
        super()._raise_failed(pieces, requests, failed, status)


class _FieldWindows(_PeerWindows):
    """``TokenWindows`` plus the dataset's per-token field columns."""

    _ds: PeerDataset

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._field_columns = [name for name in self._ds._field_sets if name in self._columns]
        if self._field_columns:
            self._one_call = False  # its read adds the field columns

    def _window_columns(self) -> tuple[str, ...]:
        return (*super()._window_columns(), *self._ds._field_sets)

    def _default_columns(self, document_masking: bool) -> tuple[str, ...]:
        return (*super()._default_columns(document_masking), *self._ds._field_sets)

    def read_collated(self, indices: Sequence[int] | np.ndarray,
                      padding: np.ndarray | None = None, output: str = "numpy") -> dict[str, Any]:
        """``collate(read(indices))`` when field columns are asked for: they
        come from :meth:`read` (the inherited direct read would drop them)."""
        if not self._field_columns:
            return super().read_collated(indices, padding, output)
        return self.collate(read_indices(self, np.asarray(indices, np.int64), padding), output)

    def read(self, indices: Sequence[int] | np.ndarray) -> Batch:
        batch = super().read(indices)
        if not self._field_columns:
            return batch
        columns = dict(batch.to_numpy())
        for name in self._field_columns:
            field = self._ds._field_sets[name].windows(
                self._seq_len, stride=self._stride, labels=bool(self._shift), dtype="stored",
                columns=["input_ids"])
            columns[name] = field.read(indices)["input_ids"]
        return Batch.from_columns(columns, batch.meta)


class _FieldDocuments(Documents):
    """``Documents`` plus the dataset's per-token fields, jagged."""

    _ds: PeerDataset

    def read(self, indices: Sequence[int] | np.ndarray) -> Batch:
        batch = super().read(indices)
        columns = dict(batch.to_numpy())
        for name, field in self._ds._field_sets.items():
            columns[name] = field.documents(max_len=self._max_len, dtype="stored").read(
                indices)["input_ids"]
        return Batch.from_columns(columns, batch.meta)


def _reopen(kind: type[PeerFiles], location: Location, options: dict[str, Any]) -> PeerDataset:
    return PeerDataset(kind(location, options))


def checked_offsets(ends: Sequence[int] | np.ndarray, records: int, *, path: str | Path,
                    field: str) -> str | None:
    """What is wrong with token offsets ``ends`` (non-decreasing, first 0, last
    ``records``), or None."""
    table = np.asarray(ends)
    if table.shape[0] == 0 or int(table[0]) != 0 or int(table[-1]) != records:
        return f"expected offsets from 0 to {records}"
    bad = table[1:] < table[:-1]
    if bad.any():
        return f"offsets go backwards at position {int(np.argmax(bad))}"
    return None
