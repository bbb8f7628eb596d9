"""The index of a peer dataset: per batch, the document offsets its pieces
touch, looked up in the format's own boundary table (``PeerFiles.locate``
and ``PeerFiles.offsets``), never a whole table.

Like ``stream.ranged.RangedIndex``, each piece of a batch becomes a kernel
shard of its own whose table holds only the offsets from the document
holding its first record to the first offset past its last, and whose
``doc_starts`` entry is that document's global id, so the read kernels run
unchanged and document ids come out as the peer's.

Documents of zero tokens keep their ids. The read kernels walk offsets that
rise, so a piece whose documents include empty ones is split at the start of
each non-empty document it touches (a piece starts a segment, as a document
does: positions, ``cu_seqlens``, ``seq_idx`` and ``doc_ids`` come out as if
the empty documents were not there), each part with the one document's two
offsets and id. ``plan_documents`` reads an empty document as an empty row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.peers._kernels import plan_mapped_documents
from zerobatch.stream import _kernels as k
from zerobatch.stream._tables import table_slices
from zerobatch.stream.index import ShardError
from zerobatch.stream.manifest import DOCS, OFFSET_DTYPE
from zerobatch.stream.ranged import IndexView

__all__ = ["Boundaries", "DocumentTables", "PeerIndex", "by_shard"]


def by_shard(shards: npt.NDArray[np.int64]) -> list[tuple[int, np.ndarray]]:
    """``(shard, positions)`` of each shard in ``shards``."""
    if not shards.size:
        return []
    if (shards == shards[0]).all():
        return [(int(shards[0]), np.arange(shards.shape[0]))]
    order = np.argsort(shards, kind="stable")
    cuts = np.flatnonzero(np.diff(shards[order])) + 1
    return [(int(shards[group[0]]), group) for group in np.split(order, cuts)]


class DocumentTables(NamedTuple):
    """Where ``_kernels.plan_mapped_documents`` reads a format's document
    offsets: runs of entries of a few mapped files."""

    files: npt.NDArray[np.int64]  # per shard: its file
    entries: npt.NDArray[np.int64]  # per shard: its first entry in that file
    firsts: npt.NDArray[np.int64]  # per shard: its first offset (subtracted)
    addresses: npt.NDArray[np.int64]  # per file: its mapping's address (held by the owner)
    counts: npt.NDArray[np.int64]  # per file: its entries
    like: np.ndarray  # an empty array of the entries' dtype


class _Shard(Protocol):
    @property
    def records(self) -> int: ...

    @property
    def documents(self) -> int: ...


class Boundaries(Protocol):
    """What the index asks of a format (``peers._base.PeerFiles``)."""

    @property
    def shards(self) -> Sequence[_Shard]: ...

    @property
    def counted(self) -> bool: ...

    def whole(self, shard: int) -> np.ndarray: ...

    def locate(self, shard: int, records: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...

    def offsets(self, shard: int, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]: ...

    def offsets_of(self, shards: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]
                   ) -> npt.NDArray[np.uint64]: ...

    def document_tables(self) -> DocumentTables | None: ...


class PeerIndex:
    """The ``stream.index.Index`` of a ``PeerDataset`` over ``files`` (see the
    module docstring); ``error`` builds the ``FormatError`` of a shard's
    file. Thread-safe."""

    def __init__(self, files: Boundaries, error: ShardError) -> None:
        shards = files.shards
        self._files = files
        self._error = error
        self._records = np.array([s.records for s in shards], dtype=np.int64)
        self._shard_ids = np.arange(len(shards), dtype=np.int64)
        self._doc_starts: np.ndarray | None = None
        if files.counted:
            self._doc_starts = np.concatenate(
                [[0], np.cumsum([s.documents for s in shards])]).astype(np.int64)
        self._lock = _forksafe.lock()

    def doc_starts(self) -> np.ndarray:
        """The global id of each shard's first document, then the documents
        (``<i8``; a format that counts them on first use does so here)."""
        starts = self._doc_starts
        if starts is None:
            with self._lock:
                if self._doc_starts is None:
                    counts = [self._files.whole(i).shape[0] - 1
                              for i in range(len(self._files.shards))]
                    self._doc_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
                starts = self._doc_starts
        return starts

    def _locate(self, shards: npt.NDArray[np.int64], records: npt.NDArray[np.int64]
                ) -> npt.NDArray[np.int64]:
        """Per (shard, record), the document holding it, clipped into the shard's
        documents (an unsound table then fails the kernels' checks)."""
        out = np.zeros(shards.shape[0], np.int64)
        counts = np.diff(self.doc_starts())
        for s, where in by_shard(shards):
            found = self._files.locate(s, records[where])
            out[where] = np.clip(found, 0, max(int(counts[s]) - 1, 0))
        return out

    def _gather(self, shards: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]
                ) -> npt.NDArray[np.uint64]:
        """Per (shard, document id), its offset."""
        return self._files.offsets_of(shards, ids)

    def view(
        self, pieces: npt.NDArray[np.int64], obs_begin: npt.NDArray[np.int64],
        obs_len: npt.NDArray[np.int64], *, docs: bool, meta_ids: np.ndarray | None,
    ) -> IndexView:
        """The offsets ``pieces`` touch (each clipped to its observation's
        ``obs_begin``/``obs_len`` in the batch buffer, as the kernels clip them),
        one kernel shard per piece, or per part of a piece split at empty
        documents; peer formats have no metadata (``meta_ids`` is ignored)."""
        starts = self.doc_starts()
        if not docs:
            return IndexView(pieces, self._shard_ids, self._records, None, starts, None,
                             np.zeros(len(self._records), np.int64), None, None, None)
        shards = np.ascontiguousarray(pieces[:, k.SHARD])
        obs = pieces[:, k.OBS]
        lo = pieces[:, k.DEST]
        hi = np.minimum(lo + pieces[:, k.LENGTH], obs_begin[obs] + obs_len[obs])
        live = np.flatnonzero(hi > lo)
        s = shards[live]
        a = pieces[live, k.START]
        both = self._locate(np.concatenate([s, s]), np.concatenate([a, a + (hi - lo)[live] - 1]))
        first, last = both[:s.shape[0]], np.maximum(both[s.shape[0]:], both[:s.shape[0]])
        counts = last - first + 2  # offsets of documents first..last, then the end of last
        ends = np.cumsum(counts)
        owner = np.repeat(np.arange(live.shape[0]), counts)
        ids = first[owner] + np.arange(int(ends[-1]) if ends.size else 0) - (ends - counts)[owner]
        values = self._gather(s[owner], ids)
        past = np.flatnonzero(values > self._records[s[owner]].astype(np.uint64))
        if past.size:
            shard = int(s[owner[past[0]]])
            raise self._error(shard, DOCS, "offsets", f"document {int(ids[past[0]])} starts "
                              f"at token {int(values[past[0]])}, past the "
                              f"{int(self._records[shard])} tokens of the file")
        values.setflags(write=False)
        same = np.zeros(values.shape[0], bool)  # an empty document starts here
        same[:-1] = values[1:] == values[:-1]
        same[ends - 1] = False  # the next table's first offset is not this table's
        virtual = pieces.copy()
        virtual[:, k.SHARD] = np.arange(pieces.shape[0])
        bounds = np.zeros((2, pieces.shape[0]), np.int64)  # each piece's table in values
        bounds[0, live], bounds[1, live] = ends - counts, ends
        out_starts = np.zeros(pieces.shape[0], np.int64)
        out_starts[live] = starts[s] + first
        if same.any():
            split = np.unique(owner[same])
            virtual, shards, bounds, out_starts = self._split(
                pieces, shards, virtual, bounds, out_starts, values,
                dict(zip(live[split].tolist(), (starts[s] + first)[split].tolist(), strict=True)))
        return IndexView(virtual, shards, self._records[shards],
                         table_slices(values, bounds[0], bounds[1], OFFSET_DTYPE), out_starts, None,
                         np.zeros(shards.shape[0], np.int64), None, None, None)

    @staticmethod
    def _split(
        pieces: npt.NDArray[np.int64], shards: npt.NDArray[np.int64],
        virtual: npt.NDArray[np.int64], bounds: npt.NDArray[np.int64],
        out_starts: npt.NDArray[np.int64], values: npt.NDArray[np.uint64],
        split: dict[int, int],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
               npt.NDArray[np.int64]]:
        """The pieces with each one of ``split`` (piece -> the global id of its
        table's first document) cut at the start of every non-empty document
        of its table, each part with that document's two offsets (``bounds``:
        where each piece's table lies in ``values``). A table that goes
        backwards is left whole, for the kernels to report."""
        rows, row_shards, row_bounds, row_starts = [], [], [], []
        for p in range(pieces.shape[0]):
            lo, hi = int(bounds[0, p]), int(bounds[1, p])
            table = values[lo:hi]
            if p not in split or (np.diff(table.astype(np.int64)) < 0).any():
                rows.append(virtual[p])
                row_shards.append(shards[p])
                row_bounds.append((lo, hi))
                row_starts.append(out_starts[p])
                continue
            obs, start, length, dest = (int(pieces[p, c]) for c in (k.OBS, k.START, k.LENGTH,
                                                                     k.DEST))
            kept = np.flatnonzero(table[1:] > table[:-1])
            for n, d in enumerate(kept.tolist()):
                begin = max(start, int(table[d]))
                end = start + length if n == kept.shape[0] - 1 else int(table[d + 1])
                row = np.zeros(pieces.shape[1], np.int64)
                row[k.OBS], row[k.START], row[k.LENGTH] = obs, begin, end - begin
                row[k.DEST] = dest + begin - start
                rows.append(row)
                row_shards.append(shards[p])
                row_bounds.append((lo + d, lo + d + 2))
                row_starts.append(split[p] + d)
        out = np.array(rows, np.int64).reshape(-1, pieces.shape[1])
        out[:, k.SHARD] = np.arange(out.shape[0])
        return (out, np.array(row_shards, np.int64),
                np.array(row_bounds, np.int64).reshape(-1, 2).T.copy(),
                np.array(row_starts, np.int64))

    def plan_documents(
        self, indices: npt.NDArray[np.int64], max_len: int
    ) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """``_kernels.plan_documents``'s result for document ``indices``, from two
        offsets per document; an empty document gets no piece and an empty row."""
        starts = self.doc_starts()
        mapped = self._files.document_tables()
        if mapped is not None:  # one kernel call (Hugging Face's record batches)
            return plan_mapped_documents(indices, starts, mapped.files, mapped.entries,
                                         mapped.firsts, self._records, mapped.addresses,
                                         mapped.counts, mapped.like, max_len)
        count = indices.shape[0]
        offsets = np.zeros(count + 1, np.int64)
        bad = np.flatnonzero((indices < 0) | (indices >= starts[-1]))
        if bad.size or count == 0:
            return (np.empty((0, 5), np.int64), offsets, int(bad[0]) if bad.size else -1,
                    k.OK, 0)
        shards = np.searchsorted(starts, indices, side="right") - 1
        local = indices - starts[shards]
        both = self._gather(np.concatenate([shards, shards]),
                            np.concatenate([local, local + 1])).astype(np.int64)
        begin, end = both[:count], both[count:]
        wrong = np.flatnonzero((begin < 0) | (end < begin) | (end > self._records[shards]))
        if wrong.size:
            return np.empty((0, 5), np.int64), offsets, -1, k.BAD_DOCS, int(shards[wrong[0]])
        lengths = end - begin
        if max_len > 0:
            lengths = np.minimum(lengths, max_len)
        np.cumsum(lengths, out=offsets[1:])
        kept = np.flatnonzero(lengths > 0)
        pieces = np.empty((kept.shape[0], 5), np.int64)
        pieces[:, k.OBS] = kept
        pieces[:, k.SHARD] = shards[kept]
        pieces[:, k.START] = begin[kept]
        pieces[:, k.LENGTH] = lengths[kept]
        pieces[:, k.DEST] = offsets[kept]
        return pieces, offsets, -1, k.OK, 0
