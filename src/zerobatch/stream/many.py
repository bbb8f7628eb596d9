"""Windows of many local datasets read in one kernel call: ``ManyWindows``.

A mixture's step reads a few windows from each of dozens of sources. One
``TokenWindows.read`` per source costs a fixed ~6 us of calls and planning
each, which for small batches costs more than the bytes. ``ManyWindows``
lays every dataset's shards end to end in one record space, with one table
of open files indexed by global shard, so that row ``b`` of a batch,
window ``indices[b]`` of source ``sources[b]``, is planned, read, cast and
given its document columns by one call of
:func:`zerobatch.stream._kernels.read_window_rows`, straight into the batch
in row order (no per-source batches, no scatter).

It takes the sources ``TokenWindows._read_direct`` serves (local files, cast
token columns, no ``doc_ids`` or metadata) that agree on everything a batch's
layout depends on (``seq_len``, labels, dtype, columns, record dtype, the
read method). :meth:`ManyWindows.of` returns None for any other set; callers
then read each source on its own.

Files open lazily, as ``TokenWindows.read`` opens them, through each
dataset's ``_open``; a closed dataset makes the next read that touches it
fail as its own read would. Errors (a truncated file, a token the dtype
cannot hold, bad document offsets) are raised by re-reading the failing
sources with their own ``read``, so they name the same file and field.
Thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.columnar import FieldSchema
from zerobatch.storage.local import reserve_descriptors
from zerobatch.stream import _kernels as k
from zerobatch.stream._tables import join_tables
from zerobatch.stream.reader import TokenWindows

__all__ = ["ManyWindows"]

_HANDLE_BYTES = np.dtype(np.int64).itemsize


def _layout(source: TokenWindows) -> tuple[Any, ...] | None:
    """What a batch's layout depends on, or None when ``source`` is not read
    by the one-call local path. (The id bounds follow from the record and
    output dtypes.)"""
    ds = source._ds
    if not source._one_call or ds._local is None:
        return None
    return (source._seq_len, source._shift, source._dtype, source._columns,
            source._record_dtype, source._want_segments, source._mask_labels,
            ds._local.files()[1])


class ManyWindows:
    """Windows of many local token-stream datasets in one read (module
    docstring). Build with :meth:`of`."""

    def __init__(self, sources: Sequence[TokenWindows | None]) -> None:
        self._sources = list(sources)
        present = [s for s in self._sources if s is not None]
        self._first = present[0]
        datasets: dict[int, Any] = {}
        where = [datasets.setdefault(id(s._ds), len(datasets)) if s is not None else -1
                 for s in self._sources]  # each source's dataset, by first appearance
        found = {id(s._ds): s._ds for s in present}
        self._datasets: list[Any] = [found[key] for key in datasets]
        # One record space: each dataset's shards after the previous dataset's.
        counts = np.array([ds._records.shape[0] for ds in self._datasets], dtype=np.int64)
        records = np.concatenate([ds._records for ds in self._datasets])
        self._bases = np.concatenate([ds._bases for ds in self._datasets])  # by global shard
        self._shard_starts = np.zeros(records.shape[0] + 1, dtype=np.int64)
        np.cumsum(records, out=self._shard_starts[1:])
        shard_base = np.zeros(counts.shape[0], dtype=np.int64)
        np.cumsum(counts[:-1], out=shard_base[1:])
        record_base = self._shard_starts[shard_base]
        owner = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
        self._owners: list[int] = owner.tolist()  # by global shard: its dataset, its shard there
        self._local_shards: list[int] = (np.arange(records.shape[0], dtype=np.int64)
                                         - shard_base[owner]).tolist()
        shards = records.shape[0]
        # The address of each global shard's handle in its dataset's own table
        # (only ever written in place): set when the shard is opened here (the
        # kernels look at it only for shards with a size).
        self._live = np.zeros(shards, dtype=np.int64)
        # Per source (base record, stride, windows, its dataset's first global
        # shard); base -1: cannot be read.
        table = np.empty((len(self._sources), 4), dtype=np.int64)
        dataset = np.array(where, dtype=np.int64)
        readable = dataset >= 0
        table[:, 0] = np.where(readable, record_base[np.maximum(dataset, 0)], -1)
        table[:, 1] = [1 if s is None else s._stride for s in self._sources]
        table[:, 2] = [0 if s is None else s._len for s in self._sources]
        table[:, 3] = np.where(readable, shard_base[np.maximum(dataset, 0)], 0)
        self._table = table
        # The open-file table, by global shard (sizes < 0: not in it yet).
        self._fds = np.full(shards, -1, dtype=np.int64)
        self._addresses = np.zeros(shards, dtype=np.int64)
        self._sizes = np.full(shards, -1, dtype=np.int64)
        self._maps: list[Any] = [None] * shards  # keeps the mappings the table points into
        local = self._first._ds._local
        assert local is not None  # of() takes local datasets only
        self._use_pread = bool(local.files()[1])
        self._docs: Any = None
        self._lock = _forksafe.lock()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return ManyWindows, (self._sources,)  # the copy opens its files again

    @classmethod
    def of(cls, sources: Sequence[Any]) -> ManyWindows | None:
        """A ``ManyWindows`` over ``sources`` (None entries are sources that
        cannot be read), or None unless every other entry is a
        ``TokenWindows`` on local files read by the one-call path and all of
        them give the same layout."""
        layouts = set()
        for source in sources:
            if source is None:
                continue
            if not isinstance(source, TokenWindows):
                return None
            layout = _layout(source)
            if layout is None:
                return None
            layouts.add(layout)
            if len(layouts) > 1:
                return None
        return cls(sources) if layouts else None

    @property
    def schema(self) -> dict[str, FieldSchema]:
        """The schema of the columns :meth:`read` returns (``cu_seqlens``'s
        lengths vary: see :meth:`read`)."""
        return dict(self._first._direct_schema)

    def read(self, sources: npt.NDArray[np.int64], indices: npt.NDArray[np.int64], *,
             kernels: tuple[Any, Any] | None = None, prefix: tuple[Any, ...] = ()
             ) -> tuple[dict[str, Any], dict[str, FieldSchema]] | None:
        """Row ``b``: window ``indices[b]`` of source ``sources[b]`` (int64
        arrays of one length), as the columns and schema ``TokenWindows.read``
        gives, in row order.

        ``kernels``: (without, with document columns), called as
        ``kernel(*prefix, *arguments of _kernels.read_window_rows)`` (or
        ``read_window_rows_segments``) in their place, returning what they
        return; they may fill ``sources`` and ``indices`` first (a mixture
        plans its rows in the same call). None when it returns ``-2`` first:
        it read nothing."""
        first = self._first
        rows = indices.shape[0]
        inputs, labels, positions, out = first._outputs(
            first._ds._arena.take(first._output_bytes(rows)), 0, rows)
        row = np.empty(first._span, first._record_dtype)
        plain, with_segments = kernels or (k.read_window_rows, k.read_window_rows_segments)
        segments = (self._docs_tables(), out) if first._want_segments else ()
        kernel = with_segments if segments else plain
        while True:
            arguments = (sources, indices, self._table, first._span, self._shard_starts,
                         self._live, self._bases, row, self._fds, self._addresses, self._sizes,
                         self._use_pread, first._seq_len, inputs, labels, first._shift,
                         first._bounds_check, *segments)
            bad, closed, failed, _, code, _, wrong = kernel(*prefix, *arguments)
            if bad == -2:
                return None
            if closed < 0:
                break
            self._open(sources, indices)
        if bad >= 0 or failed >= 0 or code != k.OK or wrong >= 0:
            self._raise(sources, indices, bad)
        columns = first._token_columns(inputs, labels, positions, out)
        schema = first._direct_schema
        if first._want_cu:
            schema = {**schema, "cu_seqlens": first._cu_schema(out)}
            schema = {name: schema[name] for name in columns}
        return columns, schema

    def _open(self, sources: npt.NDArray[np.int64], indices: npt.NDArray[np.int64]) -> None:
        """Open the shards these rows read that are not in the table (a closed
        dataset raises its ValueError). One pass over the shards, with plain
        ints: a mixture's first batch opens ~500 files of as many datasets."""
        pieces = k.plan_window_rows(sources, indices, self._table, self._first._span,
                                    self._shard_starts, self._live, self._bases, self._sizes,
                                    1)[0]
        shards = np.sort(pieces[:, k.SHARD])  # np.unique: NumPy 2 imports np.ma for it
        wanted = shards[np.flatnonzero(np.diff(shards, prepend=-1))]
        sizes = self._sizes
        reserve_descriptors(int(np.count_nonzero(sizes[wanted] < 0)))  # one table growth
        owners, locals_ = self._owners, self._local_shards
        with self._lock:
            for g in wanted.tolist():
                ds, s = self._datasets[owners[g]], locals_[g]
                handle = int(ds._token_handles[s])
                if handle >= 0 and sizes[g] >= 0:
                    continue  # open, and in the table
                if handle < 0:  # not open yet, or its dataset closed: that raises
                    handle = ds._open_one(s)
                files = ds._local.files()[0]  # local: of() checked it; after the open
                self._fds[g] = files.fds[handle]
                self._addresses[g] = files.addresses[handle]
                self._maps[g] = files.maps[handle]
                self._live[g] = ds._token_handles.ctypes.data + _HANDLE_BYTES * s
                self._sizes[g] = files.sizes[handle]  # last: marks the entry complete

    def _docs_tables(self) -> Any:
        """Every global shard's document offsets (kernel table rows, built once)."""
        found = self._docs
        if found is None:
            with self._lock:
                if self._docs is None:
                    self._docs = join_tables([ds._docs_tables() for ds in self._datasets])
                found = self._docs
        return found

    def _raise(self, sources: npt.NDArray[np.int64], indices: npt.NDArray[np.int64],
               bad: int) -> None:
        """Raise what the sources' own reads raise for these rows."""
        if bad >= 0:
            s, i = int(sources[bad]), int(indices[bad])
            if not 0 <= s < len(self._sources) or self._sources[s] is None:
                raise IndexError(f"row {bad} reads source {s}, which cannot be read")
            raise IndexError(f"window {i} is out of range for {int(self._table[s, 2])} windows "
                             f"of source {s}")
        for s in np.unique(sources).tolist():
            source = self._sources[s]
            assert source is not None
            source.read(indices[sources == s])
        raise RuntimeError("a read of many windows failed, and reading each source again "
                           "did not (a file changed while it was read?)")
