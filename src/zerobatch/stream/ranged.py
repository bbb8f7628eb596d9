"""Index files of a remote dataset by range: the tables the read kernels need
for one batch, built from the storage's ``BlockCache``.

The kernels of ``_kernels`` take whole per-shard tables (document offsets,
metadata index, metadata data), which a local dataset maps. Over object
storage those files are never downloaded whole. Instead each piece of a batch
gets a *virtual shard* of its own: ``view`` returns the pieces with their
shard column replaced by the piece's number, and lists whose table ``p``
holds only the entries piece ``p`` touches:

- document offsets: the entries from the document holding the piece's first
  record to the first offset at or past its end, found by a search over the
  blocks of the ``.docs`` file (interpolation, then bisection, in turns: one
  round of concurrent block fetches per step, usually one round); the
  piece's ``doc_starts`` entry is moved by as many documents, so document ids
  come out the same;
- metadata, format version 1: the index entries from the piece's first to
  its last metadata id (as the kernels find them), shifted to start at 0, and
  the data bytes they span; the piece's metadata ids are shifted by its first
  id (in a copy of the ids);
- metadata, format version 2: the ``meta.spans`` rows from the piece's first
  covered token's id to the first row starting past the piece (found by a
  search over the blocks: the rows after the first id, then galloping, then
  bisection; usually the first round, which also fetches the index entries
  beside them), their index entries shifted to the first data byte the
  kernel copies, and the data bytes of the entries that overlap the piece;
  the piece's metadata ids are shifted as in version 1.

Every round of fetches puts all of the batch's missing blocks in flight at
once. A ``view`` also maps kernel shards back to the dataset's shards, so
errors name the right file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from zerobatch.storage.blocks import BlockCache
from zerobatch.stream import _kernels as k
from zerobatch.stream._tables import shard_tables
from zerobatch.stream.manifest import (
    DOCS,
    META_DATA,
    META_INDEX,
    META_SPANS,
    OFFSET_DTYPE,
    SPAN_DTYPE,
    SPAN_FIELDS,
    Manifest,
)

__all__ = ["IndexView", "RangedIndex"]

_ENTRY = OFFSET_DTYPE.itemsize
_ROW = SPAN_FIELDS * SPAN_DTYPE.itemsize  # bytes of one meta.spans row


class IndexView(NamedTuple):
    """What the kernels of one batch read: ``pieces`` as passed to them,
    ``shards`` (kernel shard -> dataset shard), records per kernel shard, and
    the tables (None where not asked for; ``spans`` in format version 2)."""

    pieces: npt.NDArray[np.int64]
    shards: npt.NDArray[np.int64]
    records: npt.NDArray[np.int64]
    docs: Any
    doc_starts: Any
    meta_ids: Any
    entries: Any
    index: Any
    data: Any
    spans: Any


def _offsets(raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    return raw.view(OFFSET_DTYPE)


class RangedIndex:
    """The index files of ``manifest``'s shards, read through ``cache``.
    ``check(code, shard)`` raises the error of a kernel code for a dataset
    shard. Thread-safe (the cache is)."""

    def __init__(
        self, manifest: Manifest, cache: BlockCache, check: Callable[[int, int], None]
    ) -> None:
        shards = manifest.shards
        self._cache = cache
        self._check = check
        self._per_block = cache.block_size // _ENTRY
        self._docs = [s.file(DOCS) for s in shards]
        self._index = [s.file(META_INDEX) for s in shards]
        self._data = [s.file(META_DATA) for s in shards]
        self._spans = [s.file(META_SPANS) for s in shards]
        self._version_2 = manifest.has_spans_table
        self._per_row_block = max(1, cache.block_size // _ROW)
        self._data_sizes = np.array([s.files[META_DATA][0] if META_DATA in s.files else 0
                                     for s in shards], dtype=np.int64)
        self._documents = np.array([s.documents for s in shards], dtype=np.int64)
        self._records = np.array([s.records for s in shards], dtype=np.int64)
        self._entries = np.array([s.metadata_entries or 0 for s in shards], dtype=np.int64)
        self._doc_starts = np.concatenate([[0], np.cumsum(self._documents)]).astype(np.int64)

    def view(
        self, pieces: npt.NDArray[np.int64], obs_begin: npt.NDArray[np.int64],
        obs_len: npt.NDArray[np.int64], *, docs: bool, meta_ids: np.ndarray | None,
    ) -> IndexView:
        """The tables for ``pieces`` (each clipped to its observation's
        ``obs_begin``/``obs_len`` in the batch buffer, as the kernels clip them):
        document offsets when ``docs``, metadata when ``meta_ids`` are given."""
        shards = np.ascontiguousarray(pieces[:, k.SHARD])
        virtual = pieces.copy()
        virtual[:, k.SHARD] = np.arange(pieces.shape[0])
        obs = pieces[:, k.OBS]
        lo = pieces[:, k.DEST]
        hi = np.minimum(lo + pieces[:, k.LENGTH], obs_begin[obs] + obs_len[obs])
        tables = starts = None
        if docs:
            tables, starts = self._doc_tables(shards, pieces[:, k.START], hi - lo)
        ids = entries = index = data = spans = None
        if meta_ids is not None and self._version_2:
            ids, entries, index, data, spans = self._annotation_tables(
                shards, pieces[:, k.START], lo, hi, meta_ids)
        elif meta_ids is not None:
            ids, entries, index, data = self._meta_tables(shards, lo, hi, meta_ids)
        return IndexView(virtual, shards, self._records[shards], tables, starts, ids, entries,
                         index, data, spans)

    def plan_documents(
        self, indices: npt.NDArray[np.int64], max_len: int
    ) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """``_kernels.plan_documents`` over two offsets per document, fetched together."""
        count = indices.shape[0]
        bad = np.flatnonzero((indices < 0) | (indices >= self._doc_starts[-1]))
        if bad.size or count == 0:
            return (np.empty((0, 5), np.int64), np.zeros(count + 1, np.int64),
                    int(bad[0]) if bad.size else -1, k.OK, 0)
        shards = np.searchsorted(self._doc_starts, indices, side="right") - 1
        first = indices - self._doc_starts[shards]
        raw = self._cache.read([(self._docs[s], d * _ENTRY, (d + 2) * _ENTRY)
                                for s, d in zip(shards.tolist(), first.tolist(), strict=True)])
        pieces, offsets, bad_at, code, shard = k.plan_documents(
            np.arange(count, dtype=np.int64), max_len, np.arange(count + 1, dtype=np.int64),
            shard_tables([_offsets(r) for r in raw], OFFSET_DTYPE), self._records[shards])
        pieces[:, k.SHARD] = shards[pieces[:, k.SHARD]]
        return pieces, offsets, bad_at, code, int(shards[shard])

    def _find(self, shards: npt.NDArray[np.int64], values: npt.NDArray[np.int64]
              ) -> npt.NDArray[np.int64]:
        """Per (shard, record): the document holding the record (the last offset
        at or below it). Invariant: offsets[lo] <= value < offsets[hi]."""
        lo = np.zeros(values.shape[0], np.int64)
        hi = self._documents[shards].copy()
        low_value = np.zeros(values.shape[0], np.int64)
        high_value = self._records[shards].copy()
        step = 0
        while True:
            open_ = np.flatnonzero(hi - lo > 1)
            if not open_.size:
                return lo
            a, b = lo[open_], hi[open_]
            if step % 2 == 0:  # interpolation (float: record * documents can pass 2**63)
                span = np.maximum(high_value[open_] - low_value[open_], 1).astype(np.float64)
                guess = a + ((values[open_] - low_value[open_]) / span * (b - a)).astype(np.int64)
            else:
                guess = (a + b) // 2
            guess = np.clip(guess, a + 1, b - 1)
            block = guess // self._per_block * self._per_block
            first, end = np.maximum(block, a + 1), np.minimum(block + self._per_block, b)
            raw = self._cache.read([(self._docs[s], x * _ENTRY, y * _ENTRY) for s, x, y in zip(
                shards[open_].tolist(), first.tolist(), end.tolist(), strict=True)])
            for q, x, got in zip(open_.tolist(), first.tolist(), raw, strict=True):
                table = _offsets(got)
                j = int(np.searchsorted(table, np.uint64(values[q]), side="right"))
                if j > 0:
                    lo[q], low_value[q] = x + j - 1, int(table[j - 1])
                if j < table.shape[0]:
                    hi[q], high_value[q] = x + j, int(table[j])
            step += 1

    def _doc_tables(
        self, shards: npt.NDArray[np.int64], starts: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
    ) -> tuple[np.ndarray, npt.NDArray[np.int64]]:
        """Per piece, the offsets of the documents its records ``[start, start +
        count)`` touch, and the global id of the first."""
        live = np.flatnonzero(counts > 0)
        s = shards[live]
        first = self._find(s, starts[live])
        last = np.minimum(self._find(s, starts[live] + counts[live] - 1) + 1, self._documents[s])
        raw = self._cache.read([(self._docs[x], a * _ENTRY, (b + 1) * _ENTRY) for x, a, b in zip(
            s.tolist(), first.tolist(), last.tolist(), strict=True)])
        empty = np.zeros(0, OFFSET_DTYPE)
        empty.setflags(write=False)
        tables = [empty] * shards.shape[0]
        doc_starts = np.zeros(shards.shape[0], np.int64)
        for p, a, got in zip(live.tolist(), first.tolist(), raw, strict=True):
            tables[p] = _offsets(got)
            doc_starts[p] = self._doc_starts[shards[p]] + a
        return shard_tables(tables, OFFSET_DTYPE), doc_starts

    def _meta_tables(
        self, shards: npt.NDArray[np.int64], lo: npt.NDArray[np.int64],
        hi: npt.NDArray[np.int64], meta_ids: np.ndarray,
    ) -> tuple[np.ndarray, npt.NDArray[np.int64], np.ndarray, np.ndarray]:
        """Per piece, its metadata ids shifted by its first one, its entry count,
        its index entries (from 0) and their data bytes."""
        ids = np.array(meta_ids)  # a copy: each piece's ids are shifted below
        entries = np.zeros(shards.shape[0], np.int64)
        first = np.zeros(shards.shape[0], np.int64)
        for p in range(shards.shape[0]):
            segment = ids[lo[p]:hi[p]]
            present = np.flatnonzero(segment != k._NO_METADATA)
            if not present.size:
                continue
            s = int(shards[p])
            a, z = int(segment[present[0]]), int(segment[present[-1]])
            if a >= self._entries[s] or z >= self._entries[s]:
                self._check(k.BAD_META_ID, s)
            if z < a:
                self._check(k.META_ORDER, s)
            segment[present] -= np.uint32(a)
            first[p], entries[p] = a, z - a + 1
        live = np.flatnonzero(entries > 0).tolist()
        raw = self._cache.read([
            (self._index[shards[p]], first[p] * _ENTRY, (first[p] + entries[p] + 1) * _ENTRY)
            for p in live])
        spans = []
        for p, got in zip(live, raw, strict=True):
            table = _offsets(got)
            start, end = int(table[0]), int(table[-1])
            if not start <= end <= self._data_sizes[shards[p]]:
                self._check(k.BAD_INDEX, int(shards[p]))
            spans.append((self._data[shards[p]], start, end))
        data = self._cache.read(spans)
        empty_index = np.zeros(1, OFFSET_DTYPE)
        empty_index.setflags(write=False)
        empty_data = np.zeros(0, np.uint8)
        empty_data.setflags(write=False)
        index, blobs = [empty_index] * shards.shape[0], [empty_data] * shards.shape[0]
        for p, got, bytes_, (_, start, _) in zip(live, raw, data, spans, strict=True):
            shifted = _offsets(got) - np.uint64(start)  # entries from 0: the data is cut there
            shifted.setflags(write=False)
            index[p], blobs[p] = shifted, bytes_
        return (ids, entries, shard_tables(index, OFFSET_DTYPE),
                shard_tables(blobs, np.uint8))

    def _annotation_tables(
        self, shards: npt.NDArray[np.int64], starts: npt.NDArray[np.int64],
        lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], meta_ids: np.ndarray,
    ) -> tuple[np.ndarray, npt.NDArray[np.int64], np.ndarray, np.ndarray, np.ndarray]:
        """Per piece (format version 2), its metadata ids shifted by its first
        covered token's id, its candidate row count, its ``meta.spans`` rows,
        its index entries and the data bytes the kernel copies. A piece whose
        first id is past its shard's entries keeps its ids and gets no rows, so
        the kernel reports it in the order of the mapped read; so does a bad
        index entry (marked past the piece's data)."""
        ids = np.array(meta_ids)  # a copy: each piece's ids are shifted below
        count = shards.shape[0]
        first = np.full(count, -1, np.int64)
        for p in range(count):
            segment = ids[lo[p]:hi[p]]
            present = np.flatnonzero(segment != k._NO_METADATA)
            if present.size and int(segment[present[0]]) < self._entries[shards[p]]:
                first[p] = int(segment[present[0]])
                segment[present] -= np.uint32(first[p])  # later ids are not read
        live = np.flatnonzero(first >= 0)
        ends = np.zeros(count, np.int64)
        a = starts.astype(np.uint64)
        b = (starts + hi - lo).astype(np.uint64)  # the piece's records [a, b) in its shard
        ends[live] = self._row_ends(shards[live], first[live], b[live])
        raw = self._cache.read([
            request for p in live.tolist() for request in (
                (self._spans[shards[p]], first[p] * _ROW, ends[p] * _ROW),
                (self._index[shards[p]], first[p] * _ENTRY, (ends[p] + 1) * _ENTRY))])
        tables, cuts, spans = [], [], []
        for j, p in enumerate(live.tolist()):
            rows = raw[2 * j].view(SPAN_DTYPE)
            offsets = _offsets(raw[2 * j + 1])
            cut, start, end = self._index_cut(rows, offsets, int(self._records[shards[p]]),
                                              int(self._data_sizes[shards[p]]), a[p], b[p])
            tables.append(rows)
            cuts.append(cut)
            spans.append((self._data[shards[p]], start, end))
        data = self._cache.read(spans)
        empty_rows = np.zeros(0, SPAN_DTYPE)
        empty_rows.setflags(write=False)
        empty_index = np.zeros(1, OFFSET_DTYPE)
        empty_index.setflags(write=False)
        empty_data = np.zeros(0, np.uint8)
        empty_data.setflags(write=False)
        rows_of, index, blobs = [empty_rows] * count, [empty_index] * count, [empty_data] * count
        for p, table, cut, bytes_ in zip(live.tolist(), tables, cuts, data, strict=True):
            rows_of[p], index[p], blobs[p] = table, cut, bytes_
        entries = np.where(first >= 0, ends - first, 0)
        return (ids, entries, shard_tables(index, OFFSET_DTYPE), shard_tables(blobs, np.uint8),
                shard_tables(rows_of, SPAN_DTYPE))

    @staticmethod
    def _index_cut(
        rows: npt.NDArray[np.uint64], offsets: npt.NDArray[np.uint64], records: int,
        data_size: int, a: np.uint64, b: np.uint64,
    ) -> tuple[npt.NDArray[np.uint64], int, int]:
        """A piece's index entries shifted to the first data byte the kernel
        copies, and that data range ``[start, end)``: the bytes of the entries
        overlapping records ``[a, b)`` that the kernel reaches (it stops at the
        first unsound row or index entry). The first overlapping entry with an
        unsound index entry gets an end past the range, so the kernel stops there."""
        table = rows.reshape(-1, SPAN_FIELDS)
        low, high, kind = table[:, 0], table[:, 1], table[:, 2]
        unsound = np.flatnonzero(~((low < high) & (high <= np.uint64(records))
                                   & (kind <= np.uint64(1))))
        reached = table.shape[0] if not unsound.size else int(unsound[0])
        overlap = np.flatnonzero((high[:reached] > a) & (low[:reached] < b))
        bad = ~((offsets[overlap] <= offsets[overlap + 1])
                & (offsets[overlap + 1] <= np.uint64(data_size)))
        broken = int(overlap[np.argmax(bad)]) if bad.any() else -1
        kept = overlap[:np.argmax(bad)] if bad.any() else overlap
        start = int(offsets[kept].min()) if kept.size else 0
        end = int(offsets[kept + 1].max()) if kept.size else 0
        cut = np.clip(offsets, np.uint64(start), np.uint64(end)) - np.uint64(start)
        if broken >= 0:
            cut[broken + 1] = end - start + 1
        cut.setflags(write=False)
        return cut, start, end

    def _row_ends(self, shards: npt.NDArray[np.int64], first: npt.NDArray[np.int64],
                  bound: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Per piece, the first ``meta.spans`` row after ``first`` (in its
        shard) that starts at or after record ``bound`` (rows are sorted by
        start), or the shard's entries. Invariant: rows up to ``low`` start
        before ``bound``, rows from ``high`` at or after it. One round of
        concurrent fetches per step: the first also fetches the index entries
        beside the rows, which the tables need next."""
        per = self._per_row_block
        low = first.copy()
        high = self._entries[shards].copy()
        step = 0
        while True:
            todo = np.arange(low.shape[0]) if step == 0 else np.flatnonzero(high - low > 1)
            if not todo.size:
                return high
            x, y = low[todo], high[todo]
            if step == 0:  # the rows right after the first id (usually all of them)
                probe = x
            else:  # galloping from low, bisection once that passes the middle
                probe = np.clip(np.minimum(x + per * (1 << min(step, 40)), (x + y) // 2),
                                x + 1, y - 1)
            end = np.minimum(probe + per, y)
            requests = [(self._spans[s], g * _ROW, e * _ROW) for s, g, e in zip(
                shards[todo].tolist(), probe.tolist(), end.tolist(), strict=True)]
            if step == 0:
                requests += [(self._index[s], g * _ENTRY, (e + 1) * _ENTRY) for s, g, e in zip(
                    shards[todo].tolist(), probe.tolist(), end.tolist(), strict=True)]
            raw = self._cache.read(requests)
            for q, g, got in zip(todo.tolist(), probe.tolist(), raw[:todo.size], strict=True):
                begin = max(g, int(low[q]) + 1)  # the rows inside (low, high)
                found = got.view(SPAN_DTYPE)[(begin - g) * SPAN_FIELDS::SPAN_FIELDS]
                if not found.size:
                    continue
                j = int(np.searchsorted(found, bound[q], side="left"))
                if j > 0:
                    low[q] = begin + j - 1
                if j < found.shape[0]:
                    high[q] = begin + j
            step += 1
