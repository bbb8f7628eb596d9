"""Read token-stream datasets: ``open_dataset``, ``TokenWindows``, ``Documents``.

``Dataset`` is the opened folder; ``TokenWindows`` and ``Documents`` are
random-access sources over it (``len(src)``, ``src.read(indices) -> Batch``).
A batch is planned by Numba kernels, read with one ``Storage.read_into`` call
into one recycled buffer, and decoded without a Python loop per sample: one
GIL-free pass writes every token column of a window batch. Cast token columns
of a tokens-only dataset on local files skip the buffer: one kernel call
plans, reads each window into a row that stays in the L1 cache and casts it. Span metadata comes
from the mapped index and data files in one more kernel call; its values are
Python objects, decoded in one call per batch when first used (``Spans``).

All three are immutable and thread-safe: any number of threads may call
``read`` at once. Files are opened lazily and kept open until ``close()``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from itertools import compress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
from numba import typed

from zerobatch._output_dtype import output_dtype
from zerobatch.columnar import Batch, BatchMeta, FieldSchema, Jagged
from zerobatch.columnar.schema import normalize_column
from zerobatch.errors import FormatError
from zerobatch.storage import LocalStorage, Storage, is_url, join, local_path, open_storage
from zerobatch.storage.local import check_status
from zerobatch.stream import _kernels as k
from zerobatch.stream._arena import ALIGN, Arena, carve
from zerobatch.stream.index import Index, MappedIndex
from zerobatch.stream.manifest import (
    DOCS,
    DOCUMENT_KIND,
    FORMAT,
    MANIFEST,
    META_DATA,
    META_ID,
    META_INDEX,
    META_SPANS,
    TOKENS,
    Manifest,
    check_sizes,
    read_manifest,
)
from zerobatch.stream.npy import NpyTokens, is_npy_folder, open_npy
from zerobatch.stream.ranged import IndexView, RangedIndex
from zerobatch.stream.serializers import BUILTIN, get_serializer, loads_many
from zerobatch.stream.spans import Spans, SpanTable

if TYPE_CHECKING:
    from zerobatch.packing import PackedRows

__all__ = ["Dataset", "Documents", "TokenWindows", "open_dataset"]

_HEAD = 8  # spare bytes before metadata entries (see serializers.loads_many)
_METADATA_SCHEMA = FieldSchema("objects", "Spans")  # per window, its (start, end, value) spans
_EMPTY_METADATA_SCHEMA = FieldSchema("objects", "object")  # what from_columns infers for []


def _indices(indices: Any) -> npt.NDArray[np.int64]:
    array = np.asarray(indices)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"indices must be a 1-D integer array, got {array.dtype} {array.shape}")
    return np.ascontiguousarray(array, dtype=np.int64)


class Dataset:
    """An opened token-stream dataset folder. Create with ``open_dataset``.

    Opening reads the manifest and the size of every file (O(shards)); no token,
    document or metadata byte is read until a source reads. Local index files
    are mapped; over a storage with a block cache (``ObjectStorage.blocks``)
    a batch reads only the blocks of them it needs (``ranged.RangedIndex``).
    Immutable and thread-safe; ``close()`` is idempotent and makes later reads
    fail. Pickles as its location, manifest and storage (the copy opens its
    files again): how it reaches ``spawn`` and ``forkserver`` processes.
    """

    def __init__(
        self, path: str | Path, manifest: Manifest, storage: Storage, serializer: Any, *,
        bases: Sequence[int] | None = None,
    ) -> None:
        self._path = path
        self._manifest = manifest
        self._storage = storage
        self._local = storage if isinstance(storage, LocalStorage) else None
        self._serializer = serializer
        shards = manifest.shards
        self._records = np.array([s.records for s in shards], dtype=np.int64)
        self._shard_starts = np.concatenate([[0], np.cumsum(self._records)]).astype(np.int64)
        self._doc_starts = np.concatenate(
            [[0], np.cumsum([s.documents for s in shards])]).astype(np.int64)
        # Byte where each shard's records start in its token file (None: all at 0).
        self._bases = None if bases is None or not any(bases) else np.array(bases, np.int64)
        self._token_handles = np.full(len(shards), -1, dtype=np.int64)  # -1: not open yet
        self._index = self._make_index()
        self._arena = Arena()
        self._lock = threading.Lock()
        self._closed = False

    def _make_index(self) -> Index:
        """The index of document offsets and metadata: the mapped files, or over
        a block cache (``ObjectStorage.blocks``) the entries a batch needs."""
        blocks = getattr(self._storage, "blocks", None)
        if blocks is None:
            return MappedIndex(self._manifest, self._storage, self._shard_error)
        return RangedIndex(self._manifest, blocks, self._check)

    def _token_file(self, shard: int) -> str:
        """The name of ``shard``'s token file in the storage."""
        return self._manifest.shards[shard].file(TOKENS)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Dataset, (self._path, self._manifest, self._storage, self._serializer)

    @property
    def path(self) -> str | Path:
        """The dataset folder (a ``Path``) or prefix URL (a ``str``)."""
        return self._path

    @property
    def manifest(self) -> Manifest:
        """The parsed manifest."""
        return self._manifest

    @property
    def num_tokens(self) -> int:
        """Tokens (records) in all shards."""
        return int(self._shard_starts[-1])

    @property
    def num_documents(self) -> int:
        """Documents in all shards."""
        return int(self._doc_starts[-1])

    @property
    def fingerprint(self) -> str:
        """The XXH3-64 of the manifest's content (shard table with every file's
        checksum): identifies the data a loader state belongs to."""
        import json

        import xxhash

        text = json.dumps(self._manifest.to_json(), sort_keys=True)
        return xxhash.xxh3_64_hexdigest(text.encode())

    @property
    def has_metadata(self) -> bool:
        """Whether the dataset stores span metadata."""
        return self._manifest.metadata is not None

    @property
    def has_document_metadata(self) -> bool:
        """Whether reads can tell a document's own metadata from its spans
        (version 2): sources then add a ``document_metadata`` column."""
        return self._manifest.has_spans_table

    def __repr__(self) -> str:
        return (f"Dataset({str(self._path)!r}, tokens={self.num_tokens}, "
                f"documents={self.num_documents}, shards={len(self._manifest.shards)})")

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every file; idempotent. Reads afterwards raise ``ValueError``."""
        with self._lock:
            self._closed = True
            self._token_handles[:] = -1
            self._storage.close()

    def windows(
        self, seq_len: int, *, stride: int | None = None, labels: bool = True,
        dtype: Any = "int64", columns: Sequence[str] | None = None,
    ) -> TokenWindows:
        """Fixed-length windows over all documents concatenated (see ``TokenWindows``);
        ``columns`` picks the columns computed (default all)."""
        return TokenWindows(self, seq_len, stride=stride, labels=labels, dtype=dtype,
                            columns=columns)

    def documents(self, *, max_len: int | None = None, dtype: Any = "int64") -> Documents:
        """One observation per document (see ``Documents``)."""
        return Documents(self, max_len=max_len, dtype=dtype)

    # -- shared read machinery ------------------------------------------------

    def _shard_error(self, shard: int, suffix: str, field: str, message: str) -> FormatError:
        name = self._manifest.shards[shard].file(suffix)
        return FormatError(message, path=join(self._path, name), field=field)

    def _open(self, shards: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Open the token files of ``shards`` not open yet; returns the handle table."""
        table = self._token_handles
        with self._lock:
            if self._closed:
                raise ValueError(f"{self._path} is closed")
            for s in np.unique(shards).tolist():
                if table[s] < 0:
                    table[s] = self._storage.open(self._token_file(s))
        return table

    def _docs_tables(self) -> typed.List:
        """Every shard's document offsets, whole (local files: a ``MappedIndex``)."""
        if not isinstance(self._index, MappedIndex):
            raise TypeError(f"{self._path}: whole offset tables need a MappedIndex")
        return self._index.docs_tables()

    def _read_records(
        self, pieces: npt.NDArray[np.int64], requests: npt.NDArray[np.int64], closed: int,
        buffer: npt.NDArray[np.uint8],
    ) -> np.ndarray:
        """Run ``requests`` (``read_requests`` of ``pieces``; ``closed >= 0`` when a
        shard is not open yet) into ``buffer``; returns its whole records."""
        shards = pieces[:, k.SHARD]
        if closed >= 0:
            requests[0] = self._open(shards)[shards]
        if self._bases is not None:
            requests[1] += self._bases[shards]
        short = self._storage.read_into(requests[0], requests[1], requests[2], buffer, requests[3])
        if short >= 0:
            raise self._short_read(shards, requests, short)
        return buffer.view(self._manifest.record_dtype)

    def _short_read(
        self, shards: npt.NDArray[np.int64], requests: npt.NDArray[np.int64], short: int
    ) -> FormatError:
        """The error for request ``short`` of ``requests``, which came back short."""
        return self._shard_error(
            int(shards[short]), TOKENS, "bytes",
            f"file ends before byte {int(requests[1, short] + requests[2, short])}; "
            "truncated or not fully written?",
        )

    def _check(self, code: int, shard: int) -> None:
        if code == k.OK:
            return
        if code == k.BAD_DOCS:
            raise self._shard_error(shard, DOCS, "offsets",
                                    "document offsets go backwards or past the end")
        if code == k.BAD_META_ID:
            raise self._shard_error(shard, TOKENS, META_ID,
                                    "metadata id out of range of the metadata index")
        if code == k.META_ORDER and self._manifest.has_spans_table:
            raise self._shard_error(shard, TOKENS, META_ID,
                                    "a metadata id names an entry that does not cover its token")
        if code == k.META_ORDER:
            raise self._shard_error(shard, TOKENS, META_ID,
                                    "metadata ids must rise by one from span to span")
        if code == k.BAD_SPANS:
            raise self._shard_error(shard, META_SPANS, "rows",
                                    "an entry's span is empty, past the shard's records, or "
                                    "of an unknown kind")
        raise self._shard_error(shard, META_INDEX, "offsets",
                                "metadata index goes backwards or past its data file")

    def _view(
        self, pieces: npt.NDArray[np.int64], obs_begin: npt.NDArray[np.int64],
        obs_len: npt.NDArray[np.int64], *, docs: bool, meta_ids: np.ndarray | None = None,
    ) -> IndexView:
        """The tables the kernels read for ``pieces``: the mapped files, or over a
        block cache the entries the pieces need (document offsets when ``docs``,
        metadata when ``meta_ids`` are given)."""
        return self._index.view(pieces, obs_begin, obs_len, docs=docs, meta_ids=meta_ids)

    def _plan_documents(
        self, indices: npt.NDArray[np.int64], max_len: int
    ) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """``_kernels.plan_documents`` over the mapped offsets or by range."""
        return self._index.plan_documents(indices, max_len)

    def _metadata(
        self, meta_ids: np.ndarray, pieces: npt.NDArray[np.int64],
        obs_begin: npt.NDArray[np.int64], obs_len: npt.NDArray[np.int64], *,
        documents: bool = True,
    ) -> tuple[list[Spans], list[Spans] | None]:
        """Per observation, the ``(start, end, value)`` of each entry it
        overlaps, and (version 2, when ``documents``) of the documents' own
        metadata among them (else None).

        One kernel finds the entries and copies their bytes (from the mapped
        index, data and spans files, or the blocks of them the batch needs);
        see ``_spans``.
        """
        view = self._view(pieces, obs_begin, obs_len, docs=False, meta_ids=meta_ids)
        if not self._manifest.has_spans_table:
            *spans, code, shard = k.meta_spans(
                view.meta_ids, view.pieces, obs_begin, obs_len, view.entries, view.index,
                view.data, _HEAD,
            )
            self._check(code, int(view.shards[shard]) if code else shard)
            return self._spans(*spans).observations(), None
        starts, ends, kinds, *rest, code, shard = k.annotation_spans(
            view.meta_ids, view.pieces, obs_begin, obs_len, view.entries, view.records,
            view.index, view.data, view.spans, _HEAD,
        )
        self._check(code, int(view.shards[shard]) if code else shard)
        table = self._spans(starts, ends, *rest)
        if not documents:
            return table.observations(), None
        return table.observations(), _documents_table(table, kinds).observations()

    def _spans(
        self, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
        run_offsets: npt.NDArray[np.int64], data: npt.NDArray[np.uint8],
        bounds: npt.NDArray[np.int64],
    ) -> SpanTable:
        """The batch's spans; values are decoded by one call when first asked
        for (see ``SpanTable``)."""
        serializer, path = self._serializer, self._path

        def decode() -> list[Any]:
            try:
                return loads_many(serializer, data, bounds, _HEAD)
            except Exception as error:
                raise FormatError(f"cannot decode metadata entries ({error})",
                                  path=path, field=META_DATA) from error

        return SpanTable(starts, ends, run_offsets, decode)


def _documents_table(table: SpanTable, kinds: npt.NDArray[np.int64]) -> SpanTable:
    """The entries of ``table`` whose kind is a document's own metadata, per
    observation; decoded with ``table``'s values (one decode)."""
    chosen = kinds == DOCUMENT_KIND
    counts = np.zeros(chosen.shape[0] + 1, np.int64)
    np.cumsum(chosen, out=counts[1:])
    return SpanTable(table.starts[chosen], table.ends[chosen], counts[table.offsets],
                     lambda: list(compress(table.values, chosen.tolist())))


class TokenWindows:
    """Observation ``i``: tokens ``[i * stride, i * stride + seq_len)`` of the
    concatenation of all documents, plus one more token for the labels.

    ``len(src) == (num_tokens - seq_len - labels) // stride + 1`` (0 if too
    short); the tail past the last full window is dropped. ``read(indices)``
    returns a ``Batch`` with ``input_ids`` and ``labels`` (``[B, seq_len]``;
    labels are the tokens shifted by one), ``position_ids`` (``[B, seq_len]``,
    0 at the window start and at every document start), ``cu_seqlens`` (jagged
    int32, per window the segment starts then ``seq_len``), ``doc_ids`` (jagged
    int64, the global document id of each segment), each per-token field
    (``[B, seq_len]``, aligned with ``input_ids``, views of the read buffer) and,
    with span metadata, ``metadata``: per window a ``Spans``, the sequence of
    ``(start, end, value)`` of every entry overlapping the window (spans,
    which may overlap and nest, and the documents' own metadata, each once,
    ordered by start), in window coordinates, clipped to the window (its
    ``starts``/``ends`` are arrays; values decode on first use); and, for
    datasets written since format version 2, ``document_metadata``: the
    same for the documents' own metadata alone (one entry per document of
    the window that has metadata, over its segment of the window). Global indexes
    in the batch meta are the observation indices. Immutable and thread-safe.

    ``columns`` (default: all of the above) names the columns to compute, in
    any order; the batch holds them in the order above. Only what is asked for
    costs time: without ``position_ids``, ``cu_seqlens`` and ``doc_ids`` the
    document offsets are never read, and ``("input_ids", "labels")`` is one
    read and one cast per batch (on local files, with ``input_ids``,
    ``labels`` and ``position_ids`` only and no per-token fields, one kernel
    call that casts each window as it is read). ``src.columns`` lists them.

    ``dtype`` sets the token columns: ``"int64"`` (default), ``"int32"``, or
    ``"stored"`` (``input_ids`` and ``labels`` are then overlapping views of
    the read buffer, no copy). ``position_ids`` are int64 with int64 tokens,
    else int32.
    """

    def __init__(
        self, dataset: Dataset, seq_len: int, *, stride: int | None = None,
        labels: bool = True, dtype: Any = "int64", columns: Sequence[str] | None = None,
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        stride = seq_len if stride is None else stride
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride must be a positive int, got {stride!r}")
        self._ds = dataset
        self._seq_len = seq_len
        self._stride = stride
        self._labels = bool(labels)
        self._dtype = output_dtype(dtype)
        self._span = seq_len + int(self._labels)
        self._len = max(0, (dataset.num_tokens - self._span) // stride + 1)
        manifest = dataset.manifest
        self._fields = tuple(manifest.fields)
        self._columns = _choose_columns(columns, self._window_columns())
        wanted = set(self._columns)
        self._want_inputs = "input_ids" in wanted
        self._want_labels = "labels" in wanted
        self._want_positions = "position_ids" in wanted
        self._want_jagged = not wanted.isdisjoint(("cu_seqlens", "doc_ids"))
        self._want_metadata = "metadata" in wanted
        self._want_documents = "document_metadata" in wanted
        self._token_fields = tuple(name for name in self._fields if name in wanted)
        # Cast token columns, then position_ids, share one dtype: planes of one
        # [k, B, seq_len] array.
        self._plane_dtype = np.dtype(np.int32) if self._dtype is None else self._dtype
        casts = 0 if self._dtype is None else self._want_inputs + self._want_labels
        self._planes = casts + self._want_positions
        self._no_rows = np.empty((0, seq_len), self._plane_dtype)  # "skip this column"
        self._dense = self._dense_schema()
        self._record_dtype = manifest.record_dtype
        self._token_field = manifest.token_field
        # Cast token columns with nothing else from the records: from local files,
        # one kernel reads each window and casts it (``_read_direct``).
        self._direct = (self._dtype is not None and self._token_field is None
                        and (self._want_inputs or self._want_labels)
                        and not (self._want_jagged or self._want_metadata))
        self._direct_schema = {name: self._dense[name] for name in self._columns
                               if name in self._dense}

    def _window_columns(self) -> tuple[str, ...]:
        """Every column a batch can hold, in batch order."""
        names = ["input_ids", *(["labels"] if self._labels else []),
                 "position_ids", "cu_seqlens", "doc_ids", *self._fields]
        if self._ds.has_metadata:
            names.append("metadata")
        if self._ds.has_document_metadata:
            names.append("document_metadata")
        return tuple(names)

    def _dense_schema(self) -> dict[str, FieldSchema]:
        """The schema of every column but the jagged ones, inferred as
        ``Batch.from_columns`` would (it is the same for every batch)."""
        manifest, shape = self._ds.manifest, (0, self._seq_len)
        tokens = manifest.token_dtype if self._dtype is None else self._dtype
        arrays = {"input_ids": np.empty(shape, tokens)}
        if self._labels:
            arrays["labels"] = arrays["input_ids"]
        arrays["position_ids"] = np.empty(shape, self._plane_dtype)
        fields: Mapping[str, Any] = manifest.record_dtype.fields or {}
        for name in manifest.fields:
            arrays[name] = np.empty(shape, fields[name][0])
        return {name: normalize_column(name, array)[1] for name, array in arrays.items()}

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (f"TokenWindows(seq_len={self._seq_len}, stride={self._stride}, "
                f"labels={self._labels}, len={self._len})")

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint plus this view's shape (seq_len, stride, labels)."""
        return f"{self._ds.fingerprint}:windows:{self._seq_len}:{self._stride}:{int(self._labels)}"

    @property
    def seq_len(self) -> int:
        """Tokens per window (without the extra label token)."""
        return self._seq_len

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns each batch holds, in order."""
        return self._columns

    def read(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch:
        """The windows at ``indices`` (``0 <= i < len``, any order, repeats
        allowed) as one Batch."""
        ds, n, seq_len = self._ds, self._span, self._seq_len
        idx = _indices(indices)
        if self._direct and ds._local is not None and ds._bases is None:
            return self._read_direct(ds._local, idx)
        itemsize = self._record_dtype.itemsize
        pieces, requests, closed, bad = k.plan_windows(
            idx, self._stride, n, self._len, ds._shard_starts, ds._token_handles, itemsize
        )
        if bad >= 0:
            raise IndexError(f"window {int(idx[bad])} is out of range for {self._len} windows")
        b_count = idx.shape[0]
        # One buffer per batch, recycled once the batch is gone: records, then the planes.
        record_bytes = b_count * n * itemsize
        start = -(-record_bytes // ALIGN) * ALIGN
        buffer = ds._arena.take(start + self._plane_bytes(b_count))
        records = ds._read_records(pieces, requests, closed, buffer[:record_bytes])
        records = records.reshape(b_count, n)
        field = self._token_field
        tokens = records if field is None else records[field]
        planes = self._plane_view(buffer, start, b_count)
        none = self._no_rows
        inputs = labels = positions = none
        if self._dtype is not None:
            cast = iter(planes)
            inputs = next(cast) if self._want_inputs else none
            labels = next(cast) if self._want_labels else none
        if self._want_positions:
            positions = planes[-1]
        jagged: dict[str, Any] = {}
        metadata: dict[str, list[Spans]] = {}
        schema = self._dense
        if self._want_jagged or self._want_metadata or self._want_documents:
            jagged, metadata, schema = self._segment_columns(
                records, tokens, pieces, inputs, labels, positions
            )
        elif self._want_positions:
            view = ds._view(pieces, *self._bounds(b_count), docs=True)
            code, shard = k.window_positions(
                tokens, view.pieces, n, seq_len, view.docs, inputs, labels, positions
            )
            ds._check(code, int(view.shards[shard]) if code else shard)
        elif inputs.shape[0] or labels.shape[0]:
            k.window_tokens(tokens, seq_len, inputs, labels)
        if self._dtype is None:  # views of the read buffer, labels overlapping inputs
            inputs, labels = tokens[:, :seq_len], tokens[:, 1:]
        # Built valid here: Jagged and Batch skip the checks of their public constructors.
        out = self._token_columns(inputs, labels, positions)
        out.update(jagged)
        for name in self._token_fields:
            out[name] = records[name][:, :seq_len]
        out.update(metadata)
        return Batch._trusted(out, idx, {name: schema[name] for name in out})

    def _read_direct(self, local: LocalStorage, idx: npt.NDArray[np.int64]) -> Batch:
        """``read`` of cast token columns (and ``position_ids``) from local files,
        in one kernel call that plans, reads each window into a row buffer and
        casts it at once: the batch's records are never written."""
        ds, n, seq_len, b_count = self._ds, self._span, self._seq_len, idx.shape[0]
        planes = self._plane_view(ds._arena.take(self._plane_bytes(b_count)), 0, b_count)
        inputs = planes[0] if self._want_inputs else self._no_rows
        labels = planes[int(self._want_inputs)] if self._want_labels else self._no_rows
        row = np.empty(n, self._record_dtype)
        while True:
            # Handles before the file table: a handle another thread sets is in
            # every table taken after it (tables only grow).
            plan = (idx, self._stride, n, self._len, ds._shard_starts, ds._token_handles.copy(),
                    row)
            files, use_pread = local.files()  # keeps the mappings alive until the kernel returns
            if self._want_positions:
                bad, closed, failed, status, code, shard = k.read_window_positions(
                    *plan, files.fds, files.addresses, files.sizes, use_pread, seq_len,
                    ds._docs_tables(), inputs, labels, planes[-1],
                )
            else:
                bad, closed, failed, status, code, shard = k.read_window_tokens(
                    *plan, files.fds, files.addresses, files.sizes, use_pread, seq_len,
                    inputs, labels,
                )
            if closed < 0:
                break
            pieces = k.plan_windows(*plan[:-1], row.itemsize)[0]
            ds._open(pieces[:, k.SHARD])  # the first reads of these shards: then again
        if bad >= 0:
            raise IndexError(f"window {int(idx[bad])} is out of range for {self._len} windows")
        if failed >= 0:
            pieces, requests = k.plan_windows(*plan[:-1], row.itemsize)[:2]
            if status == 0:
                raise ds._short_read(pieces[:, k.SHARD], requests, failed)
            check_status(status, failed, requests[0])
        ds._check(code, shard)
        out = self._token_columns(inputs, labels, planes[-1])
        return Batch._trusted(out, idx, dict(self._direct_schema))

    def _plane_bytes(self, count: int) -> int:
        """Bytes of the output planes of ``count`` windows."""
        return self._planes * count * self._seq_len * self._plane_dtype.itemsize

    def _plane_view(self, buffer: np.ndarray, start: int, count: int) -> np.ndarray:
        """The ``[planes, count, seq_len]`` output planes at byte ``start`` of ``buffer``."""
        return np.ndarray((self._planes, count, self._seq_len), self._plane_dtype, buffer, start)

    def _token_columns(
        self, inputs: np.ndarray, labels: np.ndarray, positions: np.ndarray
    ) -> dict[str, Any]:
        """The token columns asked for, in the Batch's column order."""
        out: dict[str, Any] = {}
        if self._want_inputs:
            out["input_ids"] = inputs
        if self._want_labels:
            out["labels"] = labels
        if self._want_positions:
            out["position_ids"] = positions
        return out

    def _bounds(self, count: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Where each of ``count`` windows starts in the batch buffer, and its
        tokens (records) the columns use."""
        return (np.arange(count, dtype=np.int64) * self._span,
                np.full(count, self._seq_len, dtype=np.int64))

    def _segment_columns(
        self, records: np.ndarray, tokens: np.ndarray, pieces: npt.NDArray[np.int64],
        inputs: np.ndarray, labels: np.ndarray, positions: np.ndarray,
    ) -> tuple[dict[str, Any], dict[str, list[Spans]], dict[str, FieldSchema]]:
        """Decode ``inputs``, ``labels`` and ``positions`` (each skipped when it
        has no rows) with the document segments and, when asked for, the span
        metadata; returns the jagged columns asked for, the metadata columns
        asked for and the batch's schema."""
        ds, n, seq_len = self._ds, self._span, self._seq_len
        metadata: dict[str, list[Spans]] = {}
        meta_ids = records.reshape(-1)[META_ID] if ds.has_metadata else records
        together = self._want_metadata and not ds.has_document_metadata
        view = ds._view(pieces, *self._bounds(tokens.shape[0]), docs=True,
                        meta_ids=meta_ids if together else None)
        if together:
            (cu_off, cu, cu_len, doc_off, doc_ids, doc_len, *spans, code, shard
             ) = k.window_columns_meta(
                tokens, view.pieces, n, seq_len, view.docs, view.doc_starts, inputs, labels,
                positions, view.meta_ids, view.entries, view.index, view.data, _HEAD,
            )
            ds._check(code, int(view.shards[shard]) if code else shard)
            metadata["metadata"] = ds._spans(*spans).observations()
        else:
            cu_off, cu, cu_len, doc_off, doc_ids, doc_len, code, shard = k.window_columns(
                tokens, view.pieces, n, seq_len, view.docs, view.doc_starts, inputs, labels,
                positions,
            )
            ds._check(code, int(view.shards[shard]) if code else shard)
            if self._want_metadata or self._want_documents:
                b_count = tokens.shape[0]
                every, documents = ds._metadata(meta_ids, pieces, *self._bounds(b_count),
                                                documents=self._want_documents)
                if self._want_metadata:
                    metadata["metadata"] = every
                if self._want_documents and documents is not None:
                    metadata["document_metadata"] = documents
        columns: dict[str, Any] = {}
        schema = dict(self._dense)
        if "cu_seqlens" in self._columns:
            columns["cu_seqlens"] = Jagged._unchecked(cu, cu_off)
            schema["cu_seqlens"] = FieldSchema("jagged", cu.dtype, (), cu_len)
        if "doc_ids" in self._columns:
            columns["doc_ids"] = Jagged._unchecked(doc_ids, doc_off)
            schema["doc_ids"] = FieldSchema("jagged", doc_ids.dtype, (), doc_len)
        for name, column in metadata.items():
            schema[name] = _METADATA_SCHEMA if len(column) else _EMPTY_METADATA_SCHEMA
        return columns, metadata, schema


def _choose_columns(columns: Sequence[str] | None, valid: tuple[str, ...]) -> tuple[str, ...]:
    """The columns asked for, in the order of ``valid``; all of them for None."""
    if columns is None:
        return valid
    if isinstance(columns, str):
        raise ValueError(f"columns must be a sequence of names, e.g. ({columns!r},), "
                         f"not the string {columns!r}")
    asked = list(columns)
    unknown = [name for name in asked if name not in valid]
    if unknown:
        raise ValueError(f"unknown column(s) {', '.join(map(repr, unknown))} in columns=; "
                         f"this source has {', '.join(valid)}")
    if not asked:
        raise ValueError(f"columns is empty; name at least one of {', '.join(valid)}")
    return tuple(name for name in valid if name in asked)


class Documents:
    """Observation ``i``: document ``i``, its first ``max_len`` tokens (all if None).

    ``read(indices)`` returns a ``Batch`` with jagged ``input_ids``, jagged
    per-token fields, ``doc_ids`` (``[B]`` int64) and, with span metadata,
    ``metadata``: per document a ``Spans`` of ``(start, end, value)`` in document
    coordinates (a document's own metadata is ``(0, len, value)``), clipped to
    ``max_len``, and (format version 2) ``document_metadata``: the document's
    own metadata alone (``[(0, len, value)]``, or empty). ``dtype`` is as for
    ``TokenWindows``. Immutable and thread-safe.
    """

    def __init__(
        self, dataset: Dataset, *, max_len: int | None = None, dtype: Any = "int64"
    ) -> None:
        if max_len is not None and (
            isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1
        ):
            raise ValueError(f"max_len must be a positive int or None, got {max_len!r}")
        self._ds = dataset
        self._max_len = max_len
        self._dtype = output_dtype(dtype)

    def __len__(self) -> int:
        return self._ds.num_documents

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint plus ``max_len``."""
        return f"{self._ds.fingerprint}:documents:{self._max_len}"

    def __repr__(self) -> str:
        return f"Documents(max_len={self._max_len}, len={len(self)})"

    def lengths(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
        """Tokens of each document of ``indices`` (at most ``max_len``), from the
        document offsets alone: no token is read. O(len(indices))."""
        idx = _indices(indices)
        _, offsets, bad, code, shard = self._ds._plan_documents(idx, self._max_len or 0)
        if bad >= 0:
            raise IndexError(f"document {int(idx[bad])} is out of range for {len(self)}")
        self._ds._check(code, shard)
        return np.diff(offsets)

    def records(self, indices: Sequence[int] | npt.NDArray[np.integer]
                ) -> tuple[np.ndarray, npt.NDArray[np.int64]]:
        """The stored records of the documents of ``indices`` back to back
        (the token, per-token fields), and their offsets ``[len + 1]``: what
        ``read`` reads, without casting or building a Batch. The records are a
        view of a recycled buffer: copy what you keep past the next reads."""
        ds = self._ds
        idx = _indices(indices)
        pieces, offsets, bad, code, shard = ds._plan_documents(idx, self._max_len or 0)
        if bad >= 0:
            raise IndexError(f"document {int(idx[bad])} is out of range for {len(self)}")
        ds._check(code, shard)
        itemsize = ds.manifest.record_dtype.itemsize
        buffer = ds._arena.take(int(offsets[-1]) * itemsize)[:int(offsets[-1]) * itemsize]
        requests, closed = k.read_requests(pieces, ds._token_handles, itemsize)
        return ds._read_records(pieces, requests, closed, buffer), offsets

    def packed(self, seq_len: int, **options: Any) -> PackedRows:
        """These documents packed into rows of at most ``seq_len`` tokens
        (``zerobatch.packing.PackedRows``: ``window``, ``policy``, ``labels``,
        ``loss_mask``, ``loss_spans``, ...)."""
        from zerobatch.packing import PackedRows

        return PackedRows(self, seq_len, **options)

    def read(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch:
        """The documents at ``indices`` (``0 <= i < len``, any order, repeats
        allowed) as one Batch."""
        ds = self._ds
        idx = _indices(indices)
        pieces, offsets, bad, code, shard = ds._plan_documents(idx, self._max_len or 0)
        if bad >= 0:
            raise IndexError(f"document {int(idx[bad])} is out of range for {len(self)}")
        ds._check(code, shard)
        total = int(offsets[-1])
        itemsize = ds.manifest.record_dtype.itemsize
        record_bytes = total * itemsize
        out_bytes = 0 if self._dtype is None else total * self._dtype.itemsize
        buffer = ds._arena.take(record_bytes + ALIGN + out_bytes)
        raw, offset = carve(buffer, 0, np.uint8, (record_bytes,))
        requests, closed = k.read_requests(pieces, ds._token_handles, itemsize)
        records = ds._read_records(pieces, requests, closed, raw)
        field = ds.manifest.token_field
        tokens = records if field is None else records[field]
        values = tokens  # "stored": a view of the read buffer
        if self._dtype is not None:
            values, _ = carve(buffer, offset, self._dtype, (total,))
            np.copyto(values, tokens, casting="unsafe")
        columns: dict[str, Any] = {"input_ids": Jagged(values, offsets), "doc_ids": idx}
        for name in ds.manifest.fields:
            columns[name] = Jagged(records[name], offsets)
        if ds.has_metadata:
            spans, documents = ds._metadata(records[META_ID], pieces, offsets[:-1],
                                            np.diff(offsets))
            columns["metadata"] = spans
            if documents is not None:
                columns["document_metadata"] = documents
        return Batch.from_columns(columns, BatchMeta(idx, production_status=np.ones(len(idx))))


def open_dataset(
    path: str | os.PathLike[str], format: str | None = None, *, metadata: Any = None,
    storage: Storage | None = None, storage_options: Mapping[str, Any] | None = None,
    **format_options: Any,
) -> Dataset | NpyTokens:
    """Open a token-stream dataset folder or prefix URL (``s3://``, ``gs://``,
    ``az://``; ``storage_options`` as for ``zerobatch.storage.open_storage``):
    read the manifest, check file sizes.

    A local folder of ``.npy`` token files and no manifest opens in place as one
    token stream (``zerobatch.stream.npy.NpyTokens``; ``windows`` only).
    Another framework's files (Megatron ``.bin``/``.idx``, datatrove, …) open in
    place as a ``zerobatch.peers.PeerDataset``: detected where there is no
    manifest, or named by ``format`` (one of ``zerobatch.peers.FORMATS``), with
    that format's ``format_options``.

    ``metadata`` is needed only when the dataset was written with ``"pickle"``
    (pass ``"pickle"`` to allow unpickling) or a custom serializer (pass the
    object). Raises ``FormatError`` naming the file and field on a bad manifest
    or a size mismatch.
    """
    if format is not None and format != FORMAT:
        return _open_peer(path, format, storage, storage_options, format_options)
    folder: str | Path = str(path) if is_url(path) else local_path(path)
    if storage is None and isinstance(folder, Path) and is_npy_folder(folder):
        return open_npy(folder)
    if storage is None and format is None and _PEERS and not _has_manifest(folder,
                                                                          storage_options):
        found = _PEERS[0].detect_path(path, storage_options)
        if found is not None:
            return _open_peer(path, found, storage, storage_options, format_options)
    if format_options:
        raise TypeError(f"unexpected option(s) {sorted(format_options)} for a zerobatch "
                        "dataset (format options are for the peer formats)")
    if storage is None:
        storage = open_storage(folder, **(storage_options or {}))
    try:
        manifest = read_manifest(folder, storage if isinstance(folder, str) else None)
        check_sizes(folder, manifest, storage.size)
    except BaseException:
        storage.close()
        raise
    return Dataset(folder, manifest, storage, _serializer_for(folder, manifest, metadata))


def _has_manifest(folder: str | Path, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether ``folder`` holds a ``manifest.json`` (one HEAD for a URL)."""
    if isinstance(folder, Path):
        return (folder / MANIFEST).exists()
    storage = open_storage(folder, **(storage_options or {}))
    try:
        storage.size(MANIFEST)
    except FileNotFoundError:
        return False
    finally:
        storage.close()
    return True


class PeerFormats(Protocol):
    """How ``open_dataset`` reaches the peer formats (``zerobatch.peers``
    registers itself with ``register_peer_formats`` when imported)."""

    def detect_path(self, path: str | os.PathLike[str],
                    storage_options: Mapping[str, Any] | None) -> str | None:
        """The peer format at ``path``, or None."""

    def open(self, path: str | os.PathLike[str], format: str,
             storage_options: Mapping[str, Any] | None, options: dict[str, Any]) -> Dataset:
        """``path`` opened as ``format`` with its ``options``."""


_PEERS: list[PeerFormats] = []


def register_peer_formats(formats: PeerFormats) -> None:
    """Let ``open_dataset`` detect and open the peer formats (``zerobatch.peers``)."""
    _PEERS[:] = [formats]


def _open_peer(path: str | os.PathLike[str], format: str, storage: Storage | None,
               storage_options: Mapping[str, Any] | None, options: dict[str, Any]) -> Any:
    if storage is not None:
        raise ValueError(f"format={format!r} opens its own storage: pass the path (or URL) "
                         "and storage_options, not storage=")
    if not _PEERS:
        raise ValueError(f"format={format!r} needs zerobatch.peers; import it first")
    return _PEERS[0].open(path, format, storage_options, options)


def _serializer_for(folder: str | Path, manifest: Manifest, metadata: Any) -> Any:
    name = manifest.metadata
    if name is None:
        return None
    if name == "pickle" and metadata != "pickle":
        raise ValueError(f"{folder} stores pickled metadata; pass metadata='pickle' to "
                         "allow unpickling (only for data you trust)")
    if name in BUILTIN:
        return get_serializer(name)
    if metadata is None or isinstance(metadata, str):
        raise ValueError(f"{folder} stores metadata with {name!r}; pass that serializer "
                         "as metadata=")
    return get_serializer(metadata)
