"""Where the read kernels find document offsets and span metadata: one index
interface, two implementations.

An index gives a ``Dataset``'s kernels, per batch, the tables they read
(``view``) and plans document reads (``plan_documents``):

- ``MappedIndex``: every shard's tables whole, built once on first use and
  kept (local files are mapped: 8 bytes per document, nothing read until a
  source needs it). Subclasses change only where the offsets come from
  (``load_docs``): a peer format derives them from its own boundary table;
- ``ranged.RangedIndex``: over a block cache, the entries one batch touches.

Document offsets are, per shard, ``documents + 1`` ``<u8`` record offsets from
0 to the shard's records (``manifest.DOCS``'s layout); the kernels check them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.errors import FormatError
from zerobatch.storage import Storage
from zerobatch.stream import _kernels as k
from zerobatch.stream import validate
from zerobatch.stream._tables import shard_tables
from zerobatch.stream.manifest import (
    DOCS,
    META_DATA,
    META_INDEX,
    META_SPANS,
    OFFSET_DTYPE,
    SPAN_DTYPE,
    Manifest,
)
from zerobatch.stream.ranged import IndexView

__all__ = ["Index", "MappedIndex", "ShardError"]

ShardError = Callable[[int, str, str, str], FormatError]
"""``error(shard, suffix, field, message)``: the error naming a shard's file."""


class Index(Protocol):
    """What a ``Dataset`` asks of its index (``MappedIndex``, ``RangedIndex``)."""

    def view(
        self, pieces: npt.NDArray[np.int64], obs_begin: npt.NDArray[np.int64],
        obs_len: npt.NDArray[np.int64], *, docs: bool, meta_ids: np.ndarray | None,
    ) -> IndexView:
        """The tables for ``pieces`` (see ``ranged.RangedIndex.view``)."""

    def plan_documents(
        self, indices: npt.NDArray[np.int64], max_len: int
    ) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """``_kernels.plan_documents`` for document ``indices``."""


class MappedIndex:
    """Every shard's index tables, whole: built on first use, then kept.

    The native layout maps the ``docs``, ``meta.index``, ``meta.data`` and
    ``meta.spans`` files of ``manifest``'s shards through ``storage``, each
    checked against the shard table; ``error`` builds the ``FormatError`` of a
    shard's file. Thread-safe: tables are built under ``lock`` (the owning
    dataset's, which is never held while a table is asked for; a fresh one
    by default), then read-only.
    """

    def __init__(self, manifest: Manifest, storage: Storage, error: ShardError, *,
                 lock: threading.Lock | None = None) -> None:
        shards = manifest.shards
        self._manifest = manifest
        self._storage = storage
        self._error = error
        self._records = np.array([s.records for s in shards], dtype=np.int64)
        self._doc_starts = np.concatenate(
            [[0], np.cumsum([s.documents for s in shards])]).astype(np.int64)
        self._entries = np.array([s.metadata_entries or 0 for s in shards], dtype=np.int64)
        self._shard_ids = np.arange(len(shards), dtype=np.int64)
        self._tables: dict[str, np.ndarray] = {}
        self._lock = _forksafe.lock() if lock is None else lock

    def view(
        self, pieces: npt.NDArray[np.int64], obs_begin: npt.NDArray[np.int64],
        obs_len: npt.NDArray[np.int64], *, docs: bool, meta_ids: np.ndarray | None,
    ) -> IndexView:
        """Every shard's tables (document offsets when ``docs``, metadata when
        ``meta_ids`` are given); the pieces are passed on as they are."""
        meta = meta_ids is not None
        spans = meta and self._manifest.has_spans_table
        return IndexView(pieces, self._shard_ids, self._records,
                         self.docs_tables() if docs else None, self.doc_starts(), meta_ids,
                         self._entries, self._table(META_INDEX) if meta else None,
                         self._table(META_DATA) if meta else None,
                         self._table(META_SPANS) if spans else None)

    def plan_documents(
        self, indices: npt.NDArray[np.int64], max_len: int
    ) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """``_kernels.plan_documents`` over every shard's offsets."""
        tables = self.docs_tables()
        return k.plan_documents(indices, max_len, self.doc_starts(), tables, self._records)

    def doc_starts(self) -> np.ndarray:
        """The global id of each shard's first document, then the documents (``<i8``)."""
        return self._doc_starts

    def docs_tables(self) -> np.ndarray:
        """Every shard's document offsets (``documents + 1`` ``<u8`` from 0 to
        its records) as kernel table rows (``stream._tables``), built once."""
        return self._table(DOCS)

    def load_docs(self) -> list[np.ndarray]:
        """Every shard's ``docs`` file, mapped and checked against the shard table."""
        return self._map(DOCS, validate.docs_table)

    def _table(self, kind: str) -> np.ndarray:
        """The table rows of ``kind``'s tables (``stream._tables``), built on first use."""
        with self._lock:
            found = self._tables.get(kind)
            if found is None:
                found = self._build(kind)
                self._tables[kind] = found
            return found

    def _build(self, kind: str) -> np.ndarray:
        if kind == DOCS:
            return shard_tables(self.load_docs(), OFFSET_DTYPE)
        if kind == META_INDEX:
            tables = self._map(META_INDEX, validate.index_table)
            return shard_tables(tables, OFFSET_DTYPE)
        if kind == META_DATA:
            tables = self._map(META_DATA, validate.data_bytes, np.dtype(np.uint8), "bytes")
            return shard_tables(tables, np.uint8)
        tables = self._map(META_SPANS, validate.spans_table, SPAN_DTYPE, "rows")
        return shard_tables(tables, SPAN_DTYPE)

    def _map(
        self, kind: str, problem: Callable[[Any, np.ndarray], str | None],
        dtype: np.dtype = OFFSET_DTYPE, field: str = "offsets",
    ) -> list[np.ndarray]:
        """Every shard's ``kind`` file mapped as ``dtype``, each checked by
        ``problem`` (a message, or None when the table is sound; errors name
        ``field``)."""
        tables = []
        for i, shard in enumerate(self._manifest.shards):
            raw = self._storage.map(shard.file(kind))
            if raw.shape[0] % dtype.itemsize:
                raise self._error(i, kind, field, f"{raw.shape[0]} bytes is not a "
                                  f"whole number of {dtype.itemsize}-byte entries")
            table = raw.view(dtype)
            message = problem(shard, table)
            if message is not None:
                raise self._error(i, kind, field, message)
            tables.append(table)
        return tables
