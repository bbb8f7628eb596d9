"""MosaicML Streaming (MDS) shards with a token column, read in place.

A folder (or prefix) holds ``index.json`` and the shard files it lists, as
``streaming.MDSWriter`` writes them:

``index.json``
    ``{"version": 2, "shards": [{"format": "mds", "version": 2, "samples": n,
    "column_names": [...], "column_encodings": [...], "column_sizes": [...],
    "compression": null, "hashes": [...], "raw_data": {"basename", "bytes",
    "hashes"}, "zip_data": null, "size_limit": ...}, …]}``. Columns are in
    name order; ``column_sizes`` is a column's fixed size in bytes, or null.
shard file
    ``<u4 n | <u4 offsets[n + 1] | config JSON | samples``: ``offsets`` are
    absolute byte offsets of each sample, the last the file size.
sample
    ``<u4 size`` of each column whose size is null, in column order, then each
    column's bytes in column order.
token column ``ndarray:<dtype>``
    ``<u1 ndim << 2 | c`` (``c``: 0 u1, 1 u2, 2 u4, 3 u8 for the shape), the
    shape (``ndim`` of those), then the values, little-endian. With a fixed
    shape (``ndarray:<dtype>:<d0,d1,…>``) only the values.
token column ``bytes`` with ``dtype=``
    The values alone (llm-foundry's older ``{"tokens": "bytes"}`` of
    ``ndarray.tobytes()``); the dtype is not recorded, so the caller gives it.

Each sample is one document; its tokens are its token column's values
(flattened in C order), so a shard's tokens are pieces of the file, one per
sample, not one array. ``MDSFiles`` keeps, per shard, where each sample's
values start and how many tokens it has, and reads a batch's records as one
request per (window, sample) piece, with each piece's sample header read and
checked in the same call (``read_scattered``).

What opening costs: MDS records no token counts, so with a dynamic shape
the tokens per shard come from its offsets table (``4 * (n + 2)`` bytes;
with other variable-size columns also the ``4 * columns`` size prefix of
every sample). Opening reads each table (a ``pread`` a shard from local
files, a few MiB a call from object storage), checks every sample in one
branch-free pass (``_kernels.mds_sample_table``: ~2 ns a sample) and keeps
only the shard's token count: 4 bytes a sample read, nothing kept. A
shard's sample table (24 bytes a sample, in pages of its own) is built on
its first read (``prepare``, before its file is opened), so the first
batch of a corpus of any size costs a few shards' tables. With a fixed
shape and only fixed-size columns, opening reads ``index.json`` alone, and
a shard's table is arithmetic. The counts of a corpus of 65,536 samples or
more are kept in the token-count cache (:mod:`zerobatch.peers._counts`,
``cache_dir=``): every open after the first reads ``index.json`` alone,
O(shards), and each shard's first read still checks its count against its
own table. Compression refuses (decompress, or write
with ``compression=None``); ``hashes`` are not checked. Samples of a
dynamic shape are taken as 1-D: each piece read checks its sample header
(size prefix, ``ndim == 1``, shape), and ``verify`` checks every sample.
"""

from __future__ import annotations

import mmap
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.errors import FormatError
from zerobatch.peers._base import (
    Location,
    PeerFiles,
    PeerShard,
    local_reader,
    read_at,
    read_json,
)
from zerobatch.peers._counts import CACHE_FROM_SAMPLES, CountCache
from zerobatch.peers._index import DocumentTables
from zerobatch.peers._kernels import (
    COARSE,
    MDS_ARRAYS,
    MDS_BACKWARDS,
    MDS_NOT_WHOLE,
    MDS_OK,
    MDS_SCALARS,
    MDS_SHORT,
    MDS_SIZES,
    mds_check,
    mds_header,
    mds_pieces,
    mds_read_requests,
    mds_read_windows,
    mds_read_windows_segments,
    mds_sample_table,
)
from zerobatch.storage import LocalStorage
from zerobatch.stream.verify import Problem

__all__ = ["INDEX", "VALUE_DTYPES", "MDSFiles", "detect"]

INDEX = "index.json"
VALUE_DTYPES: dict[str, np.dtype] = {
    "uint8": np.dtype("u1"), "int8": np.dtype("i1"), "uint16": np.dtype("<u2"),
    "int16": np.dtype("<i2"), "uint32": np.dtype("<u4"), "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"), "uint64": np.dtype("<u8")}
"""The integer dtypes of MDS's ``ndarray`` encoding (token ids)."""
_SHAPE_BYTES = (1, 2, 4, 8)  # shape dtype code -> bytes of each dimension
_TABLE_BYTES = 4 << 20  # offsets tables read at once when opening from object storage
_FIXED = {"uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "int8": 1, "int16": 2,
          "int32": 4, "int64": 8, "float16": 2, "float32": 4, "float64": 8}


def _index_path(location: Location) -> str | Path:
    root = location.root
    return f"{root}/{INDEX}" if isinstance(root, str) else root / INDEX


def read_index(location: Location) -> Any:
    """``index.json`` at ``location``, parsed (size capped first)."""
    return read_json(location, INDEX, "MDS")[1]


def detect(location: Location) -> bool:
    """Whether ``location`` holds an MDS ``index.json`` (shards of format ``mds``)."""
    if location.stem is not None or INDEX not in location.names:
        return False
    try:
        raw = read_index(location)
    except (FormatError, OSError):
        return False
    shards = raw.get("shards") if isinstance(raw, dict) else None
    return (isinstance(shards, list) and bool(shards) and isinstance(shards[0], dict)
            and shards[0].get("format") == "mds")


@dataclass(frozen=True)
class _Layout:
    """Where the token column sits in every sample (the same in all shards)."""

    column: str
    position: int  # index among the columns
    dtype: np.dtype
    shape: tuple[int, ...] | None  # fixed shape, or None (a header per sample)
    sizes: tuple[int | None, ...]  # each column's fixed size, or None
    variable: tuple[int, ...]  # the columns with a size prefix, in order
    raw: bool = False  # a bytes column (dtype= given): no shape header

    @property
    def before(self) -> int:
        """Bytes of the fixed-size columns before the token column (all columns
        fixed)."""
        return sum(s or 0 for s in self.sizes[:self.position])

    @property
    def fixed_sample(self) -> int | None:
        """Bytes of every sample when all columns are fixed, else None."""
        return None if self.variable else sum(s or 0 for s in self.sizes)


@dataclass(frozen=True)
class _Table:
    """One shard's samples: their token offsets (``[n + 1]``, from
    ``start``), where each sample starts and where its values start in the
    file (``[n]`` each), the file's bytes, and whether each sample's values
    follow a 1-D shape header (its bytes: ``_kernels.mds_header``)."""

    tokens: npt.NDArray[np.int64]
    start: int
    begins: npt.NDArray[np.int64]
    values: npt.NDArray[np.int64]
    size: int
    header: bool

    def local(self) -> npt.NDArray[np.int64]:
        """The token offsets from 0."""
        return self.tokens - self.start

    def sample(self, j: int) -> tuple[int, int, int, int, int]:
        """Sample ``j``'s start and end bytes, first value byte, header bytes
        and tokens."""
        count = int(self.tokens[j + 1] - self.tokens[j])
        end = int(self.begins[j + 1]) if j + 1 < self.begins.shape[0] else self.size
        return (int(self.begins[j]), end, int(self.values[j]),
                mds_header(count) if self.header else 0, count)


@dataclass(frozen=True)
class _Global:
    """Every shard's samples end to end (dynamic shapes), filled a shard at a
    time on its first read (``MDSFiles.prepare``): the global token offsets
    (``[samples + 1]``), per sample its start and first value bytes
    (``[samples, 2]``: a sample's two on one cache line for the read
    kernels), and per shard its first sample and first token; ``coarse``:
    every ``COARSE``-th entry of ``tokens`` (``coarse[c] = tokens[c *
    COARSE]``), the first level of the read kernels' search, small enough to
    stay in the CPU's caches where ``tokens`` does not. Anonymous pages of
    their own (not NumPy's, which asks for huge pages): a shard not read yet
    costs no memory."""

    tokens: npt.NDArray[np.int64]
    samples: npt.NDArray[np.int64]
    shard_samples: npt.NDArray[np.int64]
    shard_tokens: npt.NDArray[np.int64]
    coarse: npt.NDArray[np.int64]


_NORESERVE: int = getattr(mmap, "MAP_NORESERVE", (  # Python 3.13+; Linux's value before
    0x4000 if sys.platform == "linux" and platform.machine() in
    ("x86_64", "i686", "aarch64", "arm64", "armv7l", "riscv64", "s390x") else 0))


def _pages(samples: int, path: str | Path) -> tuple[npt.NDArray[np.int64], ...]:
    """The global sample tables of ``samples`` samples (``int64``): ``tokens``
    ``[samples + 1]``, ``samples`` ``[samples, 2]`` and ``coarse``
    ``[samples // COARSE + 1]``, in one mapping of private anonymous pages
    (a forked child's writes stay its own), untouched, reserving no swap
    (``MAP_NORESERVE``): only the shards read are ever written, and a corpus
    of 1.2 billion samples asks 29 GB of address space, which Linux's
    default overcommit refuses whole beyond memory and swap. MemoryError
    naming ``path`` when the system refuses anyway (strict overcommit,
    ``vm.overcommit_memory=2``)."""
    sizes = (samples + 1, 2 * samples, samples // COARSE + 1)
    size = 8 * sum(sizes)
    try:
        pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | _NORESERVE)
    except OSError as error:
        raise MemoryError(
            f"{path}: the sample tables of {samples:,} MDS samples need {size / 2**30:.1f} GiB "
            f"of address space (24 bytes a sample, written only for the shards read), and "
            f"the system refused it ({error.strerror}); with strict overcommit "
            f"(vm.overcommit_memory=2) raise vm.overcommit_ratio or open fewer shards") from None
    whole = np.frombuffer(pages, np.int64, sum(sizes))
    tokens, rest = whole[:sizes[0]], whole[sizes[0]:]
    return tokens, rest[:sizes[1]].reshape(samples, 2), rest[sizes[1]:]


_COLUMN_FIELDS = ("format", "version", "compression", "zip_data", "column_names",
                  "column_encodings", "column_sizes")  # what _layout_of reads of an entry


class MDSFiles(PeerFiles):
    """The shards of an MDS dataset with an integer ``ndarray`` token column
    (see the module docstring). Options: ``column=``, the token column when
    there is more than one integer ``ndarray`` column; ``dtype=``, to read a
    ``bytes`` column as tokens of that dtype; ``cache_dir=``, the token-count
    cache's folder (``False``: none; default ``$ZEROBATCH_CACHE_DIR``, else
    ``~/.cache/zerobatch``; see :mod:`zerobatch.peers._counts`)."""

    format = "mds"
    scattered = True

    def __init__(self, location: Location, options: dict[str, Any]) -> None:
        super().__init__(location, options)
        unknown = set(options) - {"column", "dtype", "cache_dir"}
        if unknown:
            raise TypeError(f"MDS takes only column=, dtype= and cache_dir=, got "
                            f"{sorted(unknown)}")
        self._where = _index_path(location)
        index_bytes, raw = read_json(location, INDEX, "MDS")
        if not isinstance(raw, dict) or not isinstance(raw.get("shards"), list):
            raise self._fail("expected an object with shards (a list)", "index")
        if raw.get("version") != 2:
            raise self._fail(f"expected version 2, found {raw.get('version')!r:.80}", "version")
        entries: list[Any] = raw["shards"]
        self._layout = self._choose(entries, options.get("column"), options.get("dtype"))
        self.dtype = self._layout.dtype
        self._count_cache = CountCache(options.get("cache_dir"), "mds")  # (keyed by _records)
        self._counts_cached = False  # whether the shards' token counts came from the cache
        names = set(location.names)
        self._lock = _forksafe.lock()
        self._tables: dict[int, _Table] = {}
        self._global: _Global | None = None
        self._ready: npt.NDArray[np.bool_] | None = None  # per shard: its samples in _global
        self._values: list[int] = []  # per shard: its first value byte (dynamic shapes)
        self._unready = 0
        self._kernel_tables: tuple[Any, ...] | None = None
        self._kernel_descriptor: npt.NDArray[np.int64] | None = None
        self._documents_table: DocumentTables | None = None
        self._samples: list[int] = []
        self._bytes: list[int] = []
        self._mtimes: list[int] = []  # local shards' (ns): the token-count cache's key
        files = []
        for i, entry in enumerate(entries):
            files.append(self._shard_file(i, entry, names))
        self._files = tuple(files)
        self._header_bytes = [4 * (n + 2) for n in self._samples]
        sample = self._layout.fixed_sample or 0
        self._sizes = np.array([size or 0 for size in self._layout.sizes], np.int64)
        self._variable = np.array(self._layout.variable, np.int64)
        self._fixed_first = np.array([size - n * sample for size, n in
                                      zip(self._bytes, self._samples, strict=True)], np.int64)
        records = self._records(index_bytes)
        self.shards = tuple(
            PeerShard(name, self._first_value(i), records[i], self._samples[i], name)
            for i, name in enumerate(files))

    def _modified(self) -> bytes:
        """Each local shard file's modification time (ns, from the stat that
        checked its size), part of the count cache's key: a shard rewritten
        in place is counted again. Object stores' shards are immutable
        objects: their key is index.json's."""
        if not isinstance(self.storage, LocalStorage):
            return b""
        return np.array(self._mtimes, np.int64).tobytes()

    # -- index.json ---------------------------------------------------------

    def _fail(self, message: str, field: str) -> FormatError:
        return FormatError(message, path=self._where, field=field)

    def _choose(self, entries: list[Any], column: Any, dtype: Any) -> _Layout:
        """The token column's layout, the same in every shard."""
        layout: _Layout | None = None
        checked: list[Any] | None = None  # the column fields of the last entry checked
        for i, entry in enumerate(entries):
            fields: list[Any] | None = None
            if isinstance(entry, dict):
                fields = [entry.get(name) for name in _COLUMN_FIELDS]
                if (fields == checked  # (most corpora: every entry): already checked
                        and type(fields[1]) is int  # (== takes True for 1 and 2.0 for 2)
                        and all(size is None or type(size) is int for size in fields[-1])):
                    continue
            found = self._layout_of(i, entry, column, dtype)
            checked = fields
            if layout is not None and found != layout:
                raise self._fail("columns differ from shards[0]'s; MDS writes one set of "
                                 "columns per dataset", f"shards[{i}].column_encodings")
            layout = found
        if layout is None:
            raise self._fail("no shards", "shards")
        return layout

    def _layout_of(self, i: int, entry: Any, column: Any, raw: Any) -> _Layout:
        where = f"shards[{i}]"
        if not isinstance(entry, dict):
            raise self._fail("expected an object", where)
        if entry.get("format") != "mds" or entry.get("version") != 2:
            raise self._fail(f"expected format 'mds' version 2, found "
                             f"{entry.get('format')!r:.40} {entry.get('version')!r:.40}",
                             f"{where}.format")
        if entry.get("compression") is not None or entry.get("zip_data") is not None:
            raise self._fail(f"compressed shards ({entry.get('compression')!r:.40}) are not "
                             "read in place: write them with compression=None, or "
                             "decompress them", f"{where}.compression")
        names, encodings, sizes = (entry.get(k) for k in
                                   ("column_names", "column_encodings", "column_sizes"))
        if not (isinstance(names, list) and isinstance(encodings, list)
                and isinstance(sizes, list) and len(names) == len(encodings) == len(sizes)
                and names and all(isinstance(n, str) for n in names)
                and all(isinstance(e, str) for e in encodings)):
            raise self._fail("expected column_names, column_encodings and column_sizes: "
                             "lists of one length, names and encodings strings",
                             f"{where}.column_names")
        for c, size in enumerate(sizes):
            if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                     or size < 0 or size >= 1 << 32):
                raise self._fail(f"expected null or a size in bytes, found {size!r:.40}",
                                 f"{where}.column_sizes[{c}]")
        if raw is not None:  # tokens as the bytes of an array (llm-foundry's older writer)
            return self._bytes_layout(where, names, encodings, sizes, column, raw)
        tokens = [c for c, e in enumerate(encodings)
                  if e.split(":")[0] == "ndarray" and e.split(":")[1:2] != []
                  and e.split(":")[1] in VALUE_DTYPES]
        if column is not None:
            if column not in names:
                raise ValueError(f"column={column!r} is not a column of {self._where} "
                                 f"(columns: {', '.join(names)})")
            position = names.index(column)
            if position not in tokens:
                raise self._fail(f"column {column!r} is {encodings[position]!r:.60}; tokens are "
                                 "read from an ndarray of an integer dtype (ndarray:uint16, "
                                 "ndarray:int32, ...), or from a bytes column with dtype=",
                                 f"{where}.column_encodings")
        elif len(tokens) != 1:
            what = ", ".join(f"{names[c]} ({encodings[c]})" for c in tokens) or "none"
            raise self._fail(f"expected one ndarray column of an integer dtype, found {what}: "
                             "pass column= to name the token column (with dtype= for tokens "
                             "stored as bytes)",
                             f"{where}.column_encodings")
        else:
            position = tokens[0]
        parts = encodings[position].split(":")
        dtype = VALUE_DTYPES[parts[1]]
        shape: tuple[int, ...] | None = None
        if len(parts) == 3:
            try:
                shape = tuple(int(d) for d in parts[2].split(","))
            except ValueError:
                shape = ()
            if not shape or min(shape) < 1:
                raise self._fail(f"expected a shape of positive sizes, found {parts[2]!r:.60}",
                                 f"{where}.column_encodings")
            want = int(np.prod(shape)) * dtype.itemsize
            if sizes[position] != want:
                raise self._fail(f"column {names[position]!r} of shape {shape} has "
                                 f"{want} bytes, column_sizes gives {sizes[position]!r:.40}",
                                 f"{where}.column_sizes")
        elif len(parts) != 2 or sizes[position] is not None:
            raise self._fail(f"expected ndarray:<dtype> with a null size or "
                             f"ndarray:<dtype>:<shape>, found {encodings[position]!r:.60} of "
                             f"size {sizes[position]!r:.40}", f"{where}.column_encodings")
        self._check_fixed(where, names, encodings, sizes)
        return _Layout(names[position], position, dtype, shape, tuple(sizes),
                       tuple(c for c, s in enumerate(sizes) if s is None))

    def _check_fixed(self, where: str, names: list[str], encodings: list[str],
                     sizes: list[Any]) -> None:
        for c, encoding in enumerate(encodings):
            known = _FIXED.get(encoding)
            if known is not None and sizes[c] != known:
                raise self._fail(f"column {names[c]!r} ({encoding}) has {known} bytes, "
                                 f"column_sizes gives {sizes[c]!r:.40}",
                                 f"{where}.column_sizes[{c}]")

    def _bytes_layout(self, where: str, names: list[str], encodings: list[str],
                      sizes: list[Any], column: Any, raw: Any) -> _Layout:
        """A ``bytes`` token column read as an array of ``dtype=`` (no header:
        a sample's tokens are its bytes)."""
        dtype = VALUE_DTYPES.get(np.dtype(raw).name) if isinstance(raw, str | type | np.dtype) \
            else None
        if dtype is None:
            raise ValueError(f"dtype= must be an integer dtype ({', '.join(VALUE_DTYPES)}), "
                             f"got {raw!r}")
        found = [c for c, e in enumerate(encodings) if e == "bytes"]
        if column is not None:
            if column not in names:
                raise ValueError(f"column={column!r} is not a column of {self._where} "
                                 f"(columns: {', '.join(names)})")
            position = names.index(column)
            if position not in found:
                raise self._fail(f"dtype= reads a bytes column; {column!r} is "
                                 f"{encodings[position]!r:.60}", f"{where}.column_encodings")
        elif len(found) != 1:
            raise self._fail(f"dtype= reads a bytes column; found {len(found)}: pass column= "
                             "to name it", f"{where}.column_encodings")
        else:
            position = found[0]
        if sizes[position] is not None:
            raise self._fail(f"expected a null size for a bytes column, found "
                             f"{sizes[position]!r:.40}", f"{where}.column_sizes")
        self._check_fixed(where, names, encodings, sizes)
        return _Layout(names[position], position, dtype, None, tuple(sizes),
                       tuple(c for c, s in enumerate(sizes) if s is None), raw=True)

    def _shard_file(self, i: int, entry: dict[str, Any], names: set[str]) -> str:
        where = f"shards[{i}]"
        samples = entry.get("samples")
        if isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples < 1 << 30:
            raise self._fail(f"expected a count of samples, found {samples!r:.40}",
                             f"{where}.samples")
        data = entry.get("raw_data")
        name = data.get("basename") if isinstance(data, dict) else None
        size = data.get("bytes") if isinstance(data, dict) else None
        if not isinstance(name, str) or "/" in name or "\\" in name or name not in names:
            raise self._fail(f"expected a shard file of the folder, found {name!r:.80}",
                             f"{where}.raw_data.basename")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise self._fail(f"expected a size in bytes, found {size!r:.40}",
                             f"{where}.raw_data.bytes")
        if isinstance(self.storage, LocalStorage):  # the size and the mtime in one stat
            status = self.storage.stat(name)
            actual = status.st_size
            self._mtimes.append(status.st_mtime_ns)
        else:
            actual = int(self.storage.size(name))
        if actual != size:
            raise FormatError(f"index.json gives {size} bytes, the file has {actual}; "
                              "truncated or not fully written?", path=self.path(name),
                              field="bytes")
        if size >= 1 << 32 or size < 4 * (samples + 2):
            raise FormatError(f"{size} bytes cannot hold {samples} samples (MDS shards are "
                              "under 4 GiB and open with a table of 4 * (samples + 2) bytes)",
                              path=self.path(name), field="bytes")
        self._samples.append(samples)
        self._bytes.append(size)
        return name

    # -- per-shard tables ------------------------------------------------------

    def _records(self, index_bytes: bytes) -> list[int]:
        """Tokens of every shard: from the layout alone with a fixed sample size,
        else from every shard's offsets table (and with several variable-size
        columns every sample's size prefix), each checked whole by
        ``mds_sample_table``: O(samples) small reads, a few MiB at a time, and
        no table kept (``prepare`` builds a shard's on its first read). With
        ``CACHE_FROM_SAMPLES`` samples or more, the counts come from the
        token-count cache when it has them (keyed by ``index_bytes``, the
        layout and the shards' mtimes), and go to it when counted."""
        layout = self._layout
        if layout.fixed_sample is not None:
            assert layout.shape is not None  # a fixed sample has a fixed token shape
            per = int(np.prod(layout.shape))
            for i, n in enumerate(self._samples):
                if self._bytes[i] < self._header_bytes[i] + n * layout.fixed_sample:
                    raise FormatError(
                        f"{self._bytes[i]} bytes cannot hold {n} samples of "
                        f"{layout.fixed_sample} bytes", path=self.path(self._files[i]),
                        field="bytes")
            return [n * per for n in self._samples]
        cache = None
        if sum(self._samples) >= CACHE_FROM_SAMPLES:
            self._count_cache.key(index_bytes, repr(self._layout).encode(), self._modified())
            cache = self._count_cache if self._count_cache.path is not None else None
        found = None if cache is None else cache.load(len(self._samples))
        if found is not None:
            records, self._values = found
            self._counts_cached = True
        else:
            records, self._values = [], []
            local = isinstance(self.storage, LocalStorage)  # a read each: one table at a time
            for group in _groups(self._header_bytes, 0 if local else _TABLE_BYTES):
                for s, offsets in zip(group, self._offsets_tables(group), strict=True):
                    total, first = self._sample_table(s, offsets)
                    records.append(total)
                    self._values.append(first)
            if cache is not None:
                cache.store(records, self._values)
        counts = np.array(self._samples, np.int64)
        starts = np.zeros(counts.shape[0] + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        firsts = np.zeros(counts.shape[0] + 1, np.int64)
        np.cumsum(records, out=firsts[1:])
        tokens, samples, coarse = _pages(int(starts[-1]), self._where)
        tokens[-1] = firsts[-1]
        self._global = _Global(tokens, samples, starts, firsts, coarse)
        self._ready = counts == 0
        self._unready = int(np.count_nonzero(counts))
        return records

    def _sample_table(self, shard: int, offsets: npt.NDArray[np.uint32],
                      tokens: npt.NDArray[np.int64] | None = None,
                      samples: npt.NDArray[np.int64] | None = None) -> tuple[int, int]:
        """Shard ``shard``'s tokens and first value byte from its checked
        ``offsets`` (``mds_sample_table``, writing into ``tokens`` and
        ``samples`` when given); ``FormatError`` naming the sample otherwise."""
        layout = self._layout
        mode = 1 if layout.raw else 0 if layout.shape is None else 2
        per = int(np.prod(layout.shape)) if layout.shape is not None else 0
        base = 0 if self._global is None else int(self._global.shard_tokens[shard])
        if tokens is None or samples is None:  # count alone
            tokens, samples = np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
        prefixes = np.zeros((0, max(len(layout.variable), 1)), np.int64)
        for step in range(2 if len(layout.variable) > 1 else 1):
            if step:  # the offsets are sound: each sample's size prefix is where they say
                prefixes = self._prefix_table(shard, offsets)
            total, first, code, j = mds_sample_table(
                offsets, prefixes, self._sizes, self._variable, layout.position,
                layout.dtype.itemsize, mode, per, base, tokens, samples)
            if code != MDS_OK:
                raise self._sample_error(shard, offsets, prefixes, code, j)
        return total, first

    def _sample_error(self, shard: int, offsets: npt.NDArray[np.uint32],
                      prefixes: npt.NDArray[np.int64], code: int, j: int) -> FormatError:
        """The error of ``mds_sample_table``'s ``code`` for sample ``j``."""
        layout, path = self._layout, self.path(self._files[shard])
        width = 4 * len(layout.variable)
        length = int(offsets[j + 1]) - int(offsets[j])
        if code == MDS_BACKWARDS:
            return FormatError(f"sample offsets go backwards at sample {j}", path=path,
                               field="offsets")
        if code == MDS_SHORT:
            return FormatError(f"sample {j} is shorter than its {width}-byte size prefix",
                               path=path, field=f"samples[{j}]")
        sizes = [int(size) for size in self._sizes]
        if len(layout.variable) == 1:
            sizes[layout.variable[0]] = length - width - sum(sizes)
        else:
            for v, c in enumerate(layout.variable):
                sizes[c] = int(prefixes[j, v])
        if code == MDS_SIZES:
            return FormatError(f"sample {j} has {length} bytes, its size prefix and fixed "
                               f"columns {width + sum(max(size, 0) for size in sizes)}",
                               path=path, field=f"samples[{j}]")
        what = ("not a whole number of {} tokens" if code == MDS_NOT_WHOLE
                else "not a 1-D {} ndarray of at least one value").format(layout.dtype.name)
        return FormatError(f"sample {j}'s {layout.column!r} has {sizes[layout.position]} "
                           f"bytes: {what}", path=path,
                           field=f"samples[{j}].{layout.column}")

    def _read(self, names: list[int], starts: list[int], counts: list[int],
              field: str) -> list[npt.NDArray[np.uint8]]:
        """``counts[j]`` bytes at ``starts[j]`` of shard ``names[j]``'s file, in one
        storage call; ``FormatError`` naming the shard and ``field`` when short."""
        storage = self.storage
        handles = np.array([storage.open(self._files[s]) for s in names], np.int64)
        lengths = np.array(counts, np.int64)
        dest = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(lengths, out=dest[1:])
        buffer = np.empty(int(dest[-1]), np.uint8)
        short = storage.read_into(handles, np.array(starts, np.int64), lengths, buffer, dest[:-1])
        if short >= 0:
            raise FormatError(f"file ends before byte {starts[short] + counts[short]}; "
                              "truncated or not fully written?",
                              path=self.path(self._files[names[short]]), field=field)
        return [buffer[dest[j]:dest[j + 1]] for j in range(len(counts))]

    def _offsets_tables(self, shards: list[int]) -> list[npt.NDArray[np.uint32]]:
        """The sample offsets (``<u4 [n + 1]``) of ``shards``, their count and ends
        checked (the rest: ``mds_sample_table``): a ``pread`` each from local
        files (not through their mappings: no page of a shard not read yet
        joins the process), else one storage call."""
        if isinstance(self.storage, LocalStorage):
            raw = []
            for s in shards:
                with local_reader(self.path(self._files[s])) as read:
                    data = np.frombuffer(read(0, self._header_bytes[s]), np.uint8)
                if data.size != self._header_bytes[s]:
                    raise FormatError(f"file ends before byte {self._header_bytes[s]}; "
                                      "truncated or not fully written?",
                                      path=self.path(self._files[s]), field="offsets")
                raw.append(data)
        else:  # (read-only, as the local tables: one specialization of the kernel)
            raw = self._read(shards, [0] * len(shards), [self._header_bytes[s] for s in shards],
                             "offsets")
            for data in raw:
                data.setflags(write=False)
        tables = []
        for s, data in zip(shards, raw, strict=True):
            table = data.view("<u4")
            n, path = self._samples[s], self.path(self._files[s])
            if int(table[0]) != n:
                raise FormatError(f"index.json gives {n} samples, the shard {int(table[0])}",
                                  path=path, field="samples")
            offsets = table[1:]
            if int(offsets[0]) < self._header_bytes[s] or int(offsets[-1]) != self._bytes[s]:
                raise FormatError(f"expected sample offsets from at least "
                                  f"{self._header_bytes[s]} to the file size {self._bytes[s]}, "
                                  f"found {int(offsets[0])} to {int(offsets[-1])}",
                                  path=path, field="offsets")
            tables.append(offsets)
        return tables

    def _prefix_table(self, shard: int, offsets: npt.NDArray[np.uint32]
                      ) -> npt.NDArray[np.int64]:
        """Every sample's column size prefix (``[n, variable columns]``) of
        ``shard``, whose checked offsets table is ``offsets``: one read of
        ``4 * variable`` bytes per sample."""
        width = 4 * len(self._layout.variable)
        n = offsets.shape[0] - 1
        raw = self._read([shard] * n, offsets[:-1].tolist(), [width] * n, "samples")
        joined = np.concatenate(raw) if raw else np.empty(0, np.uint8)
        return joined.view("<u4").astype(np.int64).reshape(n, width // 4)

    def prepare(self, shards: npt.NDArray[np.int64]) -> None:
        """Build the sample tables of ``shards`` not built yet (their first
        read), from their offsets tables read again: what the read kernels
        then look up. A shard whose tokens changed since opening is a
        ``FormatError``."""
        ready, table = self._ready, self._global
        if not self._unready or ready is None or table is None:
            return
        with self._lock:
            wanted = [int(s) for s in dict.fromkeys(shards.tolist()) if not ready[s]]
            for s, offsets in zip(wanted, self._offsets_tables(wanted) if wanted else [],
                                  strict=True):
                a, b = int(table.shard_samples[s]), int(table.shard_samples[s + 1])
                total, first = self._sample_table(s, offsets, table.tokens[a:b + 1],
                                                  table.samples[a:b])
                if total != self.shards[s].records or (b > a and first != self._values[s]):
                    raise self._changed(s, total)
                first, last = -(-a // COARSE), b // COARSE + 1  # its entries' coarse ones
                table.coarse[first:last] = table.tokens[first * COARSE:b + 1:COARSE]
                ready[s] = True
                self._unready -= 1

    def _changed(self, shard: int, total: int) -> FormatError:
        """The error of a shard whose tokens are not the count it opened with
        (the cache file, when the count came from it, removed)."""
        path = self.path(self._files[shard])
        if not self._counts_cached:
            return FormatError("the shard changed since it was opened", path=path,
                               field="samples")
        self._count_cache.forget()
        return FormatError(
            f"the shard has {total} tokens, the token-count cache "
            f"{self._count_cache.path} gave {self.shards[shard].records}: it was "
            "rewritten under an unchanged index.json; the cache file is removed, open the "
            "dataset again", path=path, field="samples")

    def _fixed_table(self, shard: int) -> _Table:
        """A shard's table when every sample has the same size (no read)."""
        layout = self._layout
        assert layout.shape is not None and layout.fixed_sample is not None
        n, sample = self._samples[shard], layout.fixed_sample
        first = self._bytes[shard] - n * sample
        begins = first + sample * np.arange(n, dtype=np.int64)
        per = int(np.prod(layout.shape))
        return _Table(per * np.arange(n + 1, dtype=np.int64), 0, begins, begins + layout.before,
                      self._bytes[shard], False)

    def table(self, shard: int) -> _Table:
        """Shard ``shard``'s sample table (built on first use)."""
        found = self._tables.get(shard)
        if found is not None:
            return found
        table = self._global
        if table is None:
            found = self._fixed_table(shard)
        else:
            self.prepare(np.array([shard], np.int64))
            a, b = int(table.shard_samples[shard]), int(table.shard_samples[shard + 1])
            found = _Table(table.tokens[a:b + 1], int(table.shard_tokens[shard]),
                           table.samples[a:b, 0], table.samples[a:b, 1], self._bytes[shard],
                           not self._layout.raw and self._layout.shape is None)
        with self._lock:
            return self._tables.setdefault(shard, found)

    def _first_value(self, shard: int) -> int:
        """Byte where the shard's first token is (its base), or its header size
        when it has no samples."""
        if not self._samples[shard]:
            return self._header_bytes[shard]
        if self._layout.fixed_sample is not None:
            return (self._bytes[shard] - self._samples[shard] * self._layout.fixed_sample
                    + self._layout.before)
        return self._values[shard]

    # -- reads ----------------------------------------------------------------

    def kernel_tables(self) -> tuple[Any, ...]:
        """What the MDS kernels take of the tables, as one tuple (built once):
        ``(first_len, entries, per, size, before, fixed_first, tokens, samples,
        column_sizes, shard_samples, shard_tokens, variable, position, header,
        shard_bytes, coarse)``.
        ``first_len`` bytes are checked at each sample's start (its size
        prefix) or, with ``entries`` (no variable-size column), its two
        offsets-table entries. With ``per > 0`` every sample holds ``per``
        tokens in ``size`` bytes (``fixed_first``: each shard's first sample
        byte; ``before``: bytes before the values); else the global tables of
        ``_Global`` (``tokens`` ``[samples + 1]`` over all shards; ``samples``:
        each sample's start and first value bytes; a shard's entries are
        read only once ``prepare`` built them, which opening its file
        follows). ``column_sizes``: each column's fixed size (0: variable);
        ``variable``: the columns with a size prefix; ``position``: the token
        column's; ``header``: whether values follow a 1-D shape header;
        ``shard_bytes``: each shard file's size; ``coarse``: ``_Global``'s."""
        found = self._kernel_tables
        if found is None:
            layout, table = self._layout, self._global
            width = 4 * len(layout.variable)
            none = np.zeros(1, np.int64)
            if layout.fixed_sample is not None:
                per, size, fixed_first = (int(np.prod(layout.shape or ())), layout.fixed_sample,
                                          self._fixed_first)
                before, shards = layout.before, (none, none)
                samples = (none, np.zeros((1, 2), np.int64))
                coarse = none
            else:
                assert table is not None
                per, size, fixed_first, before = 0, 0, none, 0
                samples = (table.tokens, table.samples)
                shards = (table.shard_samples, table.shard_tokens)
                coarse = table.coarse
            found = (width if width else 8, not width, per, size, before, fixed_first, *samples,
                     self._sizes, *shards, self._variable, layout.position,
                     not layout.raw and layout.shape is None, np.array(self._bytes, np.int64),
                     coarse)
            self._kernel_tables = found
        return found

    def kernel_descriptor(self) -> npt.NDArray[np.int64]:
        """:meth:`kernel_tables` as what the MDS kernels take: one int64 array
        of its scalars, then each array's address and length
        (``_kernels.MDS_ARRAYS``). Built once, for this process (pickling
        reopens); the arrays it points into live as long as these files."""
        found = self._kernel_descriptor
        if found is None:
            tables = self.kernel_tables()
            arrays = [tables[i] for i in MDS_ARRAYS]
            assert all(a.dtype == np.int64 and a.flags.c_contiguous for a in arrays)
            found = np.array([*(tables[i] for i in MDS_SCALARS),
                              *(v for a in arrays for v in (a.ctypes.data, a.shape[0]))],
                             np.int64)
            self._kernel_descriptor = found
        return found

    def document_tables(self) -> DocumentTables | None:
        """With a dynamic shape, once every shard's samples are built, their
        global token offsets (held by these files) as one table for
        ``_kernels.plan_mapped_documents``: a batch of documents planned in one
        call. None before (``offsets_of`` builds the shards a batch touches)
        and with a fixed shape (offsets are arithmetic there)."""
        table = self._global
        if table is None or self._unready or self._documents_table is not None:
            return self._documents_table
        tokens = table.tokens
        self._documents_table = DocumentTables(
            np.zeros(len(self._files), np.int64), table.shard_samples[:-1],
            table.shard_tokens[:-1], np.array([tokens.ctypes.data], np.int64),
            np.array([tokens.shape[0]], np.int64), np.zeros(0, np.int64))
        return self._documents_table

    def offsets_of(self, shards: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]
                   ) -> npt.NDArray[np.uint64]:
        """``offsets`` of each ``(shards[i], ids[i])`` pair, in one gather from
        the global table with a dynamic shape (the shards built first)."""
        table = self._global
        if table is None:
            return super().offsets_of(shards, ids)
        self.prepare(shards)
        at = table.shard_samples[shards] + ids
        return (table.tokens[at] - table.shard_tokens[shards]).astype(np.uint64)

    def direct_kernels(self) -> tuple[Any, Any, tuple[Any, ...]]:
        """``mds_read_windows`` and its document-column twin, which take
        :meth:`kernel_descriptor` after ``read_windows``'s arguments."""
        return mds_read_windows, mds_read_windows_segments, (self.kernel_descriptor(),)

    def read_scattered(self, shards: npt.NDArray[np.int64], requests: npt.NDArray[np.int64],
                       buffer: npt.NDArray[np.uint8]) -> None:
        """Run the dataset's ``requests`` (``(4, P)``: handle, byte offset, bytes
        and destination over each shard's token stream, as if it were one
        array) into ``buffer``: one storage call reads every (request, sample)
        piece with its sample's size prefix (or offsets-table entries) and
        shape header, which are checked (``FormatError`` naming the shard file
        and sample otherwise). From local files one Numba call reads and
        checks them (``peers._kernels.mds_read_requests``); else, and to name
        what failed there, the split and the checks are two Numba passes
        (``mds_pieces``, ``mds_check``) around one storage call."""
        tables, descriptor = self.kernel_tables(), self.kernel_descriptor()
        itemsize = self.dtype.itemsize
        shards = np.ascontiguousarray(shards)
        if isinstance(self.storage, LocalStorage):  # one call; a failure is read again below
            files, use_pread = self.storage.files()
            if mds_read_requests(shards, requests, buffer, files.fds, files.addresses,
                                 files.sizes, use_pread, itemsize, descriptor)[0] < 0:
                return
        first_len, column_sizes, variable, position = tables[0], tables[8], tables[11], tables[12]
        total = int(buffer.size)
        # (shards contiguous: a batch of one piece must not compile another mds_pieces)
        reads, pieces, scratch_bytes = mds_pieces(shards, requests, itemsize, total,
                                                  descriptor)
        scratch = np.empty(scratch_bytes, np.uint8)
        short = self.storage.read_into(reads[0], reads[1], reads[2], scratch, reads[3])
        if short >= 0:
            piece = short % max(pieces.shape[1], 1)
            raise FormatError("file ends inside a sample; truncated or not fully written?",
                              path=self.path(self._files[int(pieces[0, piece])]),
                              field=f"samples[{int(pieces[1, piece])}]")
        buffer[:] = scratch[:total]
        bad = mds_check(scratch, reads, pieces, first_len, column_sizes, variable, position,
                        itemsize)
        if bad >= 0:
            n = pieces.shape[1]
            s, j = int(pieces[0, bad]), int(pieces[1, bad])
            at, head = int(reads[3, n + bad]), int(pieces[6, bad])
            where = int(reads[3, 2 * n + bad])
            message = self.sample_problem(s, j, scratch[at:at + first_len],
                                          scratch[where:where + head])
            raise FormatError(message or "the sample's header disagrees with its table",
                              path=self.path(self._files[s]),
                              field=f"samples[{j}].{self._layout.column}")

    def sample_problem(self, shard: int, j: int, first: npt.NDArray[np.uint8],
                       header: npt.NDArray[np.uint8]) -> str | None:
        """What is wrong with sample ``j`` of ``shard``, given its size prefix
        (or, with no variable-size column, its two offsets-table entries) and
        its shape header bytes; None when it is what the table says."""
        layout = self._layout
        begin, end, value, head, count = self.table(shard).sample(j)
        width = 4 * len(layout.variable)
        if not width:
            got = first.view("<u4")
            if (int(got[0]), int(got[1])) != (begin, end):
                return (f"the offsets table gives bytes {int(got[0])}..{int(got[1])}, samples "
                        f"of a fixed size are at {begin}..{end}")
        else:
            sizes = [0 if s is None else s for s in layout.sizes]
            for k, c in enumerate(layout.variable):
                sizes[c] = int(first.view("<u4")[k])
            if width + sum(sizes) != end - begin:
                return (f"the size prefix gives {width + sum(sizes)} bytes, the offsets "
                        f"table {end - begin}")
            start = begin + width + sum(sizes[:layout.position])
            column = sizes[layout.position]
            if start + head != value or column != head + count * layout.dtype.itemsize:
                return (f"the size prefix puts the column at bytes {start}.."
                        f"{start + column}, the table at {value - head}.."
                        f"{value + count * layout.dtype.itemsize}")
        if head:
            code = _SHAPE_BYTES.index(head - 1)
            if int(header[0]) != (1 << 2 | code):
                return (f"expected a 1-D shape with {head - 1}-byte sizes (header byte "
                        f"{1 << 2 | code}), found header byte {int(header[0])}: only 1-D "
                        "token arrays are read in place")
            shape = int.from_bytes(header[1:].tobytes(), "little")
            if shape != count:
                return f"the shape gives {shape} values, the sample holds {count}"
        return None

    # -- documents, verify, describe -------------------------------------------

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Per record of ``shard``, its sample: arithmetic with a fixed layout,
        else a search of the shard's sample table."""
        per = self._per_sample()
        if per:
            return records // per
        table = self.table(shard)
        found = np.searchsorted(table.tokens, records + table.start, side="right")
        return found.astype(np.int64) - 1

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """``shard``'s sample token offsets at ``ids`` (each in ``[0, samples]``)."""
        per = self._per_sample()
        if per:
            return (ids * per).astype(np.uint64)
        table = self.table(shard)
        return (table.tokens[ids] - table.start).astype(np.uint64)

    def _per_sample(self) -> int:
        """Tokens of every sample with a fixed layout, else 0."""
        layout = self._layout
        return int(np.prod(layout.shape or ())) if layout.fixed_sample is not None else 0

    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        try:
            return "samples", None, self.table(shard).local().astype(np.uint64)
        except FormatError as error:
            return error.field or "samples", str(error), None

    def problems(self) -> list[Problem]:
        """Every shard's tables, and every sample's size prefix and shape header
        (the whole shard is read), and with a signed dtype negative token ids."""
        found = []
        for s, name in enumerate(self._files):
            try:
                self._check_shard(s)
            except FormatError as error:
                found.append(Problem(self.path(name), error.field or "samples",
                                     str(error).split(": ")[-1]))
        return found

    def _check_shard(self, s: int) -> None:
        """Read shard ``s`` whole and check every sample (``FormatError`` otherwise)."""
        name, layout = self._files[s], self._layout
        path = self.path(name)
        offsets = self._offsets_tables([s])[0]
        table = self.table(s)
        if layout.fixed_sample is None:
            n = self._samples[s]
            tokens, samples = np.empty(n + 1, np.int64), np.empty((n, 2), np.int64)
            self._sample_table(s, offsets, tokens, samples)
            if not (np.array_equal(tokens, table.tokens)
                    and np.array_equal(samples[:, 0], table.begins)
                    and np.array_equal(samples[:, 1], table.values)):
                raise FormatError("the shard changed since it was opened", path=path,
                                  field="samples")
        raw = np.frombuffer(read_at(self.storage, name, 0, self._bytes[s], path=path,
                                    field="bytes"), np.uint8)
        width = 4 * len(layout.variable)
        itemsize = layout.dtype.itemsize
        for j in range(self._samples[s]):
            begin, _, value, head, count = table.sample(j)
            first = raw[begin:begin + width] if width else raw[4 * (1 + j):4 * (3 + j)]
            message = self.sample_problem(s, j, first, raw[value - head:value])
            if message is not None:
                raise FormatError(message, path=path, field=f"samples[{j}].{layout.column}")
            if layout.dtype.kind == "i":
                values = raw[value:value + count * itemsize].view(layout.dtype)
                if values.size and int(values.min()) < 0:
                    raise FormatError(f"token id {int(values.min())} is negative; token ids "
                                      "must be >= 0", path=path,
                                      field=f"samples[{j}].{layout.column}")

    def facts(self) -> list[tuple[str, str]]:
        layout = self._layout
        shape = ("bytes, dtype= given" if layout.raw else "dynamic (1-D)"
                 if layout.shape is None else str(layout.shape))
        return [("shards", f"{len(self._files):,}"),
                ("samples", f"{sum(self._samples):,}"),
                ("token column", f"{layout.column} ({layout.dtype.name}, shape {shape})")]



def _groups(sizes: list[int], limit: int) -> list[list[int]]:
    """The indices of ``sizes`` in runs of at most ``limit`` in all (at least
    one each)."""
    runs: list[list[int]] = []
    total = limit
    for i, size in enumerate(sizes):
        if total + size > limit:
            runs.append([])
            total = 0
        runs[-1].append(i)
        total += size
    return runs
