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

import functools
import os
from collections.abc import Mapping, Sequence
from itertools import compress
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch._output_dtype import id_bounds, output_dtype, token_error
from zerobatch.columnar import Batch, BatchMeta, FieldSchema, Jagged
from zerobatch.columnar.batch import columns_to_torch
from zerobatch.columnar.schema import normalize_column
from zerobatch.errors import FormatError
from zerobatch.source import read_indices
from zerobatch.storage import LocalStorage, Storage, is_url, join, local_path, open_storage
from zerobatch.storage.local import check_status, reserve_descriptors
from zerobatch.stream import _kernels as k
from zerobatch.stream._arena import ALIGN, Arena, carve
from zerobatch.stream.index import Index, MappedIndex
from zerobatch.stream.manifest import (
    DOCUMENT_KIND,
    FORMAT,
    MANIFEST,
    META_DATA,
    META_ID,
    TOKENS,
    Manifest,
    check_sizes,
    read_manifest,
)
from zerobatch.stream.npy import NpyTokens, is_npy_folder, open_npy
from zerobatch.stream.ranged import IndexView, RangedIndex
from zerobatch.stream.serializers import BUILTIN, get_serializer, loads_many
from zerobatch.stream.spans import Spans, SpanTable
from zerobatch.varlen import IGNORE_INDEX, Columns, flat_cu_seqlens, row_columns

if TYPE_CHECKING:
    from zerobatch.packing import PackedRows

__all__ = ["Dataset", "Documents", "TokenWindows", "open_dataset"]

_HEAD = 8  # spare bytes before metadata entries (see serializers.loads_many)
_METADATA_SCHEMA = FieldSchema("objects", "Spans")  # per window, its (start, end, value) spans
_EMPTY_METADATA_SCHEMA = FieldSchema("objects", "object")  # what from_columns infers for []
_DIRECT_KERNELS = (k.read_windows, k.read_windows_segments)  # TokenWindows._kernels' default


_DOC_IDS_SCHEMA = normalize_column("doc_ids", np.zeros(0, np.int64))[1]
"""The schema ``Batch.from_columns`` infers for a batch's ``doc_ids``."""


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
        # Byte where each shard's records start in its token file.
        self._bases = np.zeros(len(shards), np.int64) if bases is None else np.array(
            bases, np.int64)
        self._token_handles = np.full(len(shards), -1, dtype=np.int64)  # -1: not open yet
        # One lock for the dataset, its index tables and its buffers (their
        # critical sections never nest): fewer objects for the collector to
        # track when a mixture opens thousands of datasets.
        self._lock = _forksafe.lock()
        self._index = self._make_index()
        self._arena = Arena(lock=self._lock)
        self._closed = False

    def _make_index(self) -> Index:
        """The index of document offsets and metadata: the mapped files, or over
        a block cache (``ObjectStorage.blocks``) the entries a batch needs."""
        blocks = getattr(self._storage, "blocks", None)
        if blocks is None:
            return MappedIndex(self._manifest, self._storage, self._shard_error, lock=self._lock)
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
        self, seq_len: int, *, stride: int | None = None, labels: Any = "shifted",
        dtype: Any = "int64", columns: Sequence[str] | str | None = None,
        document_masking: bool = False,
    ) -> TokenWindows:
        """Fixed-length windows over all documents concatenated (see ``TokenWindows``):
        ``input_ids`` and ``labels`` (``"shifted"`` by one, or HF's ``"aligned"``);
        ``document_masking=True`` adds ``position_ids``, ``cu_seqlens`` and
        ``max_seqlen``; ``columns`` names any set."""
        return TokenWindows(self, seq_len, stride=stride, labels=labels, dtype=dtype,
                            columns=columns, document_masking=document_masking)

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
            closed = [s for s in dict.fromkeys(shards.tolist()) if table[s] < 0]  # distinct
            if self._local is not None:
                reserve_descriptors(len(closed))
            for s in closed:
                table[s] = self._storage.open(self._token_file(s))
        return table

    def _open_one(self, shard: int) -> int:
        """The handle of ``shard``'s token file, opened if it is not open yet."""
        with self._lock:
            if self._closed:
                raise ValueError(f"{self._path} is closed")
            handle = int(self._token_handles[shard])
            if handle < 0:
                handle = self._token_handles[shard] = self._storage.open(self._token_file(shard))
        return handle

    def _docs_tables(self) -> np.ndarray:
        """Every shard's document offsets, whole, as kernel table rows (local
        files: a ``MappedIndex``)."""
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
        """Raise the ``FormatError`` of kernel status ``code`` (``_kernels.STATUS``)
        for ``shard``; nothing for ``OK``."""
        if code == k.OK:
            return
        suffix, field, message = k.STATUS[code]
        if code == k.META_ORDER and self._manifest.has_spans_table:
            message = k.SPANS_META_ORDER
        raise self._shard_error(shard, suffix, field, message)

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


DOCUMENT_MASKING = ("position_ids", "cu_seqlens", "max_seqlen")
"""The columns ``document_masking=True`` adds: what Llama-3-style document
masking (FlashAttention varlen, the transformers padding-free path) takes."""
LOSS_MASK = "loss_mask"
"""The per-token field that ``labels="aligned"`` masks with (-100 where it is 0)."""


def _label_mode(labels: Any) -> str | None:
    """``"shifted"``, ``"aligned"`` or None (no labels) for a ``labels=`` value."""
    if labels is True or labels == "shifted":
        return "shifted"
    if labels is False or labels is None:
        return None
    if labels == "aligned":
        return "aligned"
    raise ValueError(f"labels must be 'shifted' (labels[t] = token[t + 1]), 'aligned' "
                     f"(Hugging Face: labels = input_ids, -100 at document starts) or False, "
                     f"got {labels!r}")


class TokenWindows:
    """Observation ``i``: tokens ``[i * stride, i * stride + seq_len)`` of the
    concatenation of all documents (with ``labels="shifted"``, plus one more
    token for the labels).

    ``len(src) == (num_tokens - seq_len - shifted) // stride + 1`` (0 if too
    short); the tail past the last full window is dropped. ``read(indices)``
    returns a ``Batch`` of the columns asked for, each ``[B, seq_len]`` unless
    said otherwise:

    - ``input_ids``; ``labels``: with ``labels="shifted"`` (default) the tokens
      shifted by one (``labels[:, t] == tokens[:, t + 1]``); with ``"aligned"``
      (Hugging Face's convention: the model shifts) ``input_ids`` again with
      -100 at each segment's first token (each document's, and the window's
      own first token, which no token of the row predicts: as
      ``DataCollatorWithFlattening`` does, so ``num_items_in_batch`` counts
      the tokens that take a loss) and, when the dataset has a ``loss_mask``
      field, wherever it is 0; with ``labels=False`` none.
    - ``position_ids``: 0 at the window start and at every document start,
      counting up inside each segment.
    - ``cu_seqlens``: jagged int32, per window its segment starts then
      ``seq_len``; the torch and numpy outputs of ``Loader`` flatten it into
      one int32 ``[segments + 1]`` over the flattened batch (see
      ``zerobatch.varlen``).
    - ``max_seqlen``: ``[B]`` int32, each window's longest segment (the
      Loader's outputs reduce it to one host int).
    - ``seq_idx``: int32, the segment of each token, numbered over the batch
      from 0 (row after row).
    - ``doc_ids``: jagged int64, the global document id of each segment.
    - each per-token field of the dataset (aligned with ``input_ids``, views of
      the read buffer).
    - with span metadata, ``metadata``: per window a ``Spans``, the ``(start,
      end, value)`` of every entry overlapping the window (spans, which may
      overlap and nest, and the documents' own metadata, each once, ordered by
      start), in window coordinates, clipped to the window (values decode on
      first use); and, since format version 2, ``document_metadata``: the
      documents' own metadata alone.

    Default columns: ``input_ids``, ``labels`` and the per-token fields: what a
    pre-training step uses. ``document_masking=True`` adds ``position_ids``,
    ``cu_seqlens`` and ``max_seqlen`` (``DOCUMENT_MASKING``); ``columns``
    names any set, in any order (the batch holds them in the order above), or
    ``"all"`` of them.
    Only what is asked for costs time: without the document columns the
    document offsets are never read, and on local files a tokens-only
    dataset's token and document columns come from one kernel call that reads
    each window into a row buffer and casts it at once. ``src.columns`` lists
    them. Global indexes in the batch meta are the observation indices.
    Immutable and thread-safe.

    ``dtype`` sets the token columns: ``"int64"`` (default), ``"int32"``, or
    ``"stored"`` (``input_ids`` and ``labels`` are then overlapping views of
    the read buffer, no copy; not with ``labels="aligned"``). A token id the
    output dtype cannot hold raises ``FormatError`` naming the file (checked
    in the same pass as the cast). ``position_ids`` are int32 whatever
    ``dtype`` (half the bytes of int64; transformers and RoPE take them as they
    take int64, with the same loss).
    """

    def __init__(
        self, dataset: Dataset, seq_len: int, *, stride: int | None = None,
        labels: Any = "shifted", dtype: Any = "int64", columns: Sequence[str] | str | None = None,
        document_masking: bool = False,
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        stride = seq_len if stride is None else stride
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride must be a positive int, got {stride!r}")
        self._ds = dataset
        self._seq_len = seq_len
        self._stride = stride
        self._label_mode = _label_mode(labels)
        self._labels = self._label_mode is not None
        self._shift = int(self._label_mode == "shifted")
        self._dtype = output_dtype(dtype)
        if self._label_mode == "aligned" and self._dtype is None:
            raise ValueError("labels='aligned' writes -100 into the labels: pass dtype='int64' "
                             "or 'int32', not 'stored'")
        self._span = seq_len + self._shift
        self._len = max(0, (dataset.num_tokens - self._span) // stride + 1)
        manifest = dataset.manifest
        self._fields = tuple(manifest.fields)
        if columns not in (None, "all") and document_masking is True:
            columns = (*columns, *DOCUMENT_MASKING)
        self._columns = _choose_columns(columns, self._window_columns(),
                                        self._default_columns(document_masking))
        wanted = set(self._columns)
        self._want_inputs = "input_ids" in wanted
        self._want_labels = "labels" in wanted
        self._want_positions = "position_ids" in wanted
        self._want_cu = "cu_seqlens" in wanted
        self._want_longest = "max_seqlen" in wanted
        self._want_seq_idx = "seq_idx" in wanted
        self._want_doc_ids = "doc_ids" in wanted
        self._want_metadata = "metadata" in wanted
        self._want_documents = "document_metadata" in wanted
        self._mask_labels = self._want_labels and self._label_mode == "aligned"
        # The per-row document walk: the document columns, and aligned labels' -100s.
        self._want_segments = (self._want_positions or self._want_cu or self._want_longest
                               or self._want_seq_idx or self._mask_labels)
        self._token_fields = tuple(name for name in self._fields if name in wanted)
        # Cast token columns share one dtype: planes of one [k, B, seq_len] array;
        # position_ids are int32 (half the bytes of int64: the document columns'
        # main cost), carved after them.
        self._plane_dtype = np.dtype(np.int32) if self._dtype is None else self._dtype
        self._planes = 0 if self._dtype is None else self._want_inputs + self._want_labels
        self._no_rows = np.empty((0, seq_len), self._plane_dtype)  # "skip this column"
        self._no_segments = k.no_segments(_INT32)
        self._dense = self._dense_schema()
        self._record_dtype = manifest.record_dtype
        self._token_field = manifest.token_field
        self._bounds_check = id_bounds(manifest.token_dtype, self._dtype)
        # Cast token columns (and the document columns) with nothing else from the
        # records: from local files, one kernel reads each window and casts it
        # (``_read_direct``).
        self._direct = (self._dtype is not None and self._token_field is None
                        and (self._want_inputs or self._want_labels)
                        and not (self._want_doc_ids or self._want_metadata
                                 or self._want_documents))
        # Read by many datasets' one call (``ManyWindows``); a subclass whose
        # ``read`` adds columns of its own sets ``_one_call`` False.
        self._one_call = self._direct
        # The direct kernels (without, with the document columns) and what they
        # take after ``read_windows``'s arguments (a scattered peer format's tables).
        self._kernels: tuple[Any, Any] = _DIRECT_KERNELS
        self._kernel_tail: tuple[Any, ...] = ()
        self._direct_schema = {name: self._dense[name] for name in self._columns
                               if name in self._dense}

    def _window_columns(self) -> tuple[str, ...]:
        """Every column a batch can hold, in batch order."""
        names = ["input_ids", *(["labels"] if self._labels else []), "position_ids",
                 "cu_seqlens", "max_seqlen", "seq_idx", "doc_ids", *self._fields]
        if self._ds.has_metadata:
            names.append("metadata")
        if self._ds.has_document_metadata:
            names.append("document_metadata")
        return tuple(names)

    def _default_columns(self, document_masking: bool) -> tuple[str, ...]:
        """The columns of ``columns=None``: the tokens, the labels, the per-token
        fields, and with ``document_masking`` its columns."""
        if not isinstance(document_masking, bool):
            raise ValueError(f"document_masking must be True or False, got {document_masking!r}")
        names = ("input_ids", *(["labels"] if self._labels else []), *self._fields)
        return names + DOCUMENT_MASKING if document_masking else names

    def _dense_schema(self) -> dict[str, FieldSchema]:
        """The schema of every column but the jagged ones, inferred as
        ``Batch.from_columns`` would (it is the same for every batch)."""
        manifest = self._ds.manifest
        tokens = manifest.token_dtype if self._dtype is None else self._dtype
        return _dense_schema(tokens, self._labels, self._seq_len, manifest.record_dtype,
                             tuple(manifest.fields))

    def __len__(self) -> int:
        return self._len

    def arenas(self) -> list[Arena]:
        """The arenas this source's reads take their buffers from (a device
        output makes them pinned: ``zerobatch.torch.TorchOutput``)."""
        return [self._ds._arena]

    def __repr__(self) -> str:
        labels = self._label_mode or False
        return (f"TokenWindows(seq_len={self._seq_len}, stride={self._stride}, "
                f"labels={labels!r}, len={self._len})")

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint plus this view's shape (seq_len, stride, labels)."""
        shape = {None: "0", "shifted": "1", "aligned": "aligned"}[self._label_mode]
        return f"{self._ds.fingerprint}:windows:{self._seq_len}:{self._stride}:{shape}"

    @property
    def seq_len(self) -> int:
        """Tokens per window (without the extra label token)."""
        return self._seq_len

    @property
    def reads_wait(self) -> bool:
        """True when a read waits on the network (object storage); False for
        local files, which the Loader's automatic mode reads in the caller's
        thread."""
        return self._ds._local is None

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns each batch holds, in order."""
        return self._columns

    @property
    def labels(self) -> str | None:
        """The label convention: ``"shifted"``, ``"aligned"``, or None (no labels)."""
        return self._label_mode

    def collate(self, batch: Batch, output: str = "numpy") -> dict[str, Any]:
        """A batch as the Loader's ``"numpy"`` or ``"torch"`` output: the varlen
        contract's shapes (one flat int32 ``cu_seqlens``, a host-int
        ``max_seqlen``: ``zerobatch.varlen.row_columns``), for torch tensors
        sharing the batch's memory, ``doc_ids`` a ``(values, offsets)`` pair (no
        nested tensors). A missing column's ``KeyError`` names the argument that
        adds it. Cost: O(columns + segments)."""
        columns = row_columns(batch.to_numpy())
        if output != "torch":
            return columns
        return Columns(columns_to_torch(columns, jagged="offsets"))

    def read(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch:
        """The windows at ``indices`` (``0 <= i < len``, any order, repeats
        allowed) as one Batch."""
        ds, n, seq_len = self._ds, self._span, self._seq_len
        idx = _indices(indices)
        if self._direct and ds._local is not None:
            return self._read_direct(ds._local, idx)
        b_count = idx.shape[0]
        # One buffer per batch, recycled once the batch is gone: records, then the planes.
        record_bytes = b_count * n * self._record_dtype.itemsize
        start = -(-record_bytes // ALIGN) * ALIGN
        buffer = ds._arena.take(start + self._output_bytes(b_count))
        pieces, records = self._read_records(idx, buffer[:record_bytes])
        field = self._token_field
        tokens = records if field is None else records[field]
        inputs, labels, positions, out = self._outputs(buffer, start, b_count)
        wrong = -1
        if self._want_segments:
            view = ds._view(pieces, *self._bounds(b_count), docs=True)
            code, shard, wrong = k.window_segments(
                tokens, view.pieces, n, seq_len, view.docs, inputs, labels, self._shift,
                self._bounds_check, out,
            )
            ds._check(code, int(view.shards[shard]) if code else shard)
        elif inputs.shape[0] or labels.shape[0]:
            wrong = k.window_tokens(tokens, seq_len, inputs, labels, self._shift,
                                    self._bounds_check)
        if wrong >= 0:
            raise self._token_error(int(idx[wrong]))
        if self._dtype is None:  # views of the read buffer, labels overlapping inputs
            inputs, labels = tokens[:, :seq_len], tokens[:, self._shift:self._shift + seq_len]
        elif self._mask_labels and LOSS_MASK in self._fields:
            np.putmask(labels, records[LOSS_MASK][:, :seq_len] == 0, IGNORE_INDEX)
        # Built valid here: Jagged and Batch skip the checks of their public constructors.
        columns = self._token_columns(inputs, labels, positions, out)
        schema = self._dense
        if self._want_doc_ids or self._want_metadata or self._want_documents:
            extra, schema = self._segment_columns(records, tokens.shape[0], pieces)
            columns.update(extra)
        for name in self._token_fields:
            columns[name] = records[name][:, :seq_len]
        if self._want_cu:
            schema = {**schema, "cu_seqlens": self._cu_schema(out)}
        order = {name: columns[name] for name in self._columns if name in columns}
        return Batch._trusted(order, idx, {name: schema[name] for name in order})

    def _read_records(
        self, idx: npt.NDArray[np.int64], raw: npt.NDArray[np.uint8]
    ) -> tuple[npt.NDArray[np.int64], np.ndarray]:
        """Plan the windows ``idx`` and read their records into ``raw``:
        (pieces, records ``[B, span]``)."""
        ds = self._ds
        pieces, requests, closed, bad = k.plan_windows(
            idx, self._stride, self._span, self._len, ds._shard_starts, ds._token_handles,
            ds._bases, self._record_dtype.itemsize,
        )
        if bad >= 0:
            raise IndexError(f"window {int(idx[bad])} is out of range for {self._len} windows")
        records = ds._read_records(pieces, requests, closed, raw)
        return pieces, records.reshape(idx.shape[0], self._span)

    def _token_error(self, window: int) -> FormatError:
        """The error for the first token of ``window`` the output dtype cannot
        hold, naming its shard file and record (the window is read again)."""
        assert self._dtype is not None
        raw = np.empty(self._span * self._record_dtype.itemsize, np.uint8)
        pieces, records = self._read_records(np.array([window], np.int64), raw)
        field = self._token_field
        tokens = (records if field is None else records[field])[0, :self._seq_len + self._shift]
        low, high = self._bounds_check
        column = int(np.flatnonzero((tokens < low) | (tokens > high))[0])
        for p in range(pieces.shape[0]):  # the piece holding that column
            begin = int(pieces[p, k.DEST])
            if begin <= column < begin + int(pieces[p, k.LENGTH]):
                shard = int(pieces[p, k.SHARD])
                record = int(pieces[p, k.START]) + column - begin
                name = self._ds._token_file(shard)  # a peer's own file name
                return token_error(join(self._ds.path, name), field or "tokens",
                                   int(tokens[column]), record, self._ds.manifest.token_dtype,
                                   self._dtype)
        raise AssertionError("the bad token lies in no piece")  # pieces cover the window

    def read_collated(self, indices: Sequence[int] | npt.NDArray[np.integer],
                      padding: npt.NDArray[np.bool_] | None = None,
                      output: str = "numpy") -> dict[str, Any]:
        """``collate(read(indices), output)`` (with a ``padding`` column when
        given), read straight into the contract's columns where the reads are
        local (no Batch in between: what the Loader calls each step). Cost: the
        read's."""
        idx = _indices(indices)
        ds = self._ds
        if not (self._direct and ds._local is not None):
            return self.collate(read_indices(self, idx, padding), output)
        columns, out = self._direct_columns(ds._local, idx)
        if self._want_cu:
            columns["cu_seqlens"] = flat_cu_seqlens(
                Jagged._unchecked(columns["cu_seqlens"], out[3]), self._seq_len)
        if self._want_longest:
            longest = columns["max_seqlen"]
            columns["max_seqlen"] = int(longest.max()) if longest.shape[0] else 0
        if padding is not None:
            columns["padding"] = padding
        if output != "torch":
            return Columns(columns)
        return Columns(columns_to_torch(columns, jagged="offsets"))

    def _read_direct(self, local: LocalStorage, idx: npt.NDArray[np.int64]) -> Batch:
        """``read`` of cast token columns and the document columns from local
        files, in one kernel call that plans, reads each window into a row
        buffer and casts it at once: the batch's records are never written."""
        columns, out = self._direct_columns(local, idx)
        if not self._want_cu:
            return Batch._trusted(columns, idx, dict(self._direct_schema))
        columns["cu_seqlens"] = Jagged._unchecked(columns["cu_seqlens"], out[3])
        schema = {**self._direct_schema, "cu_seqlens": self._cu_schema(out)}
        return Batch._trusted(columns, idx, {name: schema[name] for name in columns})

    def _direct_columns(self, local: LocalStorage, idx: npt.NDArray[np.int64]
                        ) -> tuple[dict[str, Any], tuple[np.ndarray, ...]]:
        """The columns of ``_read_direct`` (``cu_seqlens`` as its values alone:
        the offsets are ``out[3]``) and the kernel's ``out``."""
        ds, n, seq_len, b_count = self._ds, self._span, self._seq_len, idx.shape[0]
        inputs, labels, positions, out = self._outputs(
            ds._arena.take(self._output_bytes(b_count)), 0, b_count)
        row = np.empty(n, self._record_dtype)
        # Document columns: the kernel that computes them (read_windows alone
        # compiles in a third of the time: a first run's wait, a test run's).
        segments = (ds._docs_tables(), out) if self._want_segments else ()
        kernel = self._kernels[1] if segments else self._kernels[0]
        while True:
            # Handles before the file table: a handle another thread sets is in
            # every table taken after it (tables only grow).
            plan = (idx, self._stride, n, self._len, ds._shard_starts, ds._token_handles.copy(),
                    ds._bases, row)
            files, use_pread = local.files()  # keeps the mappings alive until the kernel returns
            arguments = (*plan, files.fds, files.addresses, files.sizes, use_pread, seq_len,
                         inputs, labels, self._shift, self._bounds_check)
            bad, closed, failed, status, code, shard, wrong = kernel(*arguments, *segments,
                                                                     *self._kernel_tail)
            if closed < 0:
                break
            pieces = k.plan_windows(*plan[:-1], row.itemsize)[0]
            ds._open(pieces[:, k.SHARD])  # the first reads of these shards: then again
        if bad >= 0:
            raise IndexError(f"window {int(idx[bad])} is out of range for {self._len} windows")
        if failed >= 0:
            pieces, requests = k.plan_windows(*plan[:-1], row.itemsize)[:2]
            self._raise_failed(pieces, requests, failed, status)
        ds._check(code, shard)
        if wrong >= 0:
            raise self._token_error(int(idx[wrong]))
        return self._token_columns(inputs, labels, positions, out, jagged=False), out

    def _raise_failed(self, pieces: npt.NDArray[np.int64], requests: npt.NDArray[np.int64],
                      failed: int, status: int) -> NoReturn:
        """Raise the error of request ``failed`` of ``plan_windows``'s ``pieces``
        and ``requests``, which a direct kernel read with ``read_request``
        status ``status``."""
        if status == 0:
            raise self._ds._short_read(pieces[:, k.SHARD], requests, failed)
        check_status(status, failed, requests[0])
        raise AssertionError(f"read_request status {status} is not an error")

    def _output_bytes(self, count: int) -> int:
        """Bytes of the outputs of ``count`` windows (``_outputs``)."""
        planes = self._planes * count * self._seq_len * self._plane_dtype.itemsize
        if not self._want_segments:
            return planes
        positions = (count * self._seq_len * _INT32.itemsize + ALIGN) * self._want_positions
        return planes + ALIGN + positions + _segment_bytes(count, self._seq_len)

    def _outputs(
        self, buffer: np.ndarray, start: int, count: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
        """(inputs, labels, positions, the ``out`` of ``_kernels._row_segments``)
        of ``count`` windows carved from ``buffer`` at byte ``start``; a column
        not asked for has no rows (a cast column none with ``dtype="stored"``)."""
        shape = (self._planes, count, self._seq_len)
        planes = np.ndarray(shape, self._plane_dtype, buffer, start)
        none = self._no_rows
        inputs = labels = none
        if self._dtype is not None:
            inputs = planes[0] if self._want_inputs else none
            labels = planes[int(self._want_inputs)] if self._want_labels else none
        positions = self._no_segments[0]
        if not self._want_segments:
            return inputs, labels, positions, self._no_segments
        at = -(-(start + planes.nbytes) // ALIGN) * ALIGN
        if self._want_positions:
            positions, at = carve(buffer, at, _INT32, (count, self._seq_len))
        return inputs, labels, positions, _carve_segments(
            buffer, at, count, self._seq_len, self._no_segments, positions=positions,
            seq_idx=self._want_seq_idx, longest=self._want_longest)

    def _token_columns(
        self, inputs: np.ndarray, labels: np.ndarray, positions: np.ndarray,
        out: tuple[np.ndarray, ...], *, jagged: bool = True,
    ) -> dict[str, Any]:
        """The token and document columns asked for, in the Batch's column order
        (``cu_seqlens`` a per-row Jagged, or with ``jagged`` False its values)."""
        columns: dict[str, Any] = {}
        if self._want_inputs:
            columns["input_ids"] = inputs
        if self._want_labels:
            columns["labels"] = labels
        if self._want_positions:
            columns["position_ids"] = positions
        _, seq_idx, cu, cu_offsets, _, longest, cursor = out
        if self._want_cu:
            values = cu[:int(cursor[0])]
            columns["cu_seqlens"] = Jagged._unchecked(values, cu_offsets) if jagged else values
        if self._want_longest:
            columns["max_seqlen"] = longest
        if self._want_seq_idx:
            columns["seq_idx"] = seq_idx
        return columns

    @staticmethod
    def _cu_schema(out: tuple[np.ndarray, ...]) -> FieldSchema:
        """The schema of the batch's ``cu_seqlens`` (its lengths vary per batch)."""
        return FieldSchema("jagged", _INT32, (), out[4])

    def _bounds(self, count: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Where each of ``count`` windows starts in the batch buffer, and its
        tokens (records) the columns use."""
        return (np.arange(count, dtype=np.int64) * self._span,
                np.full(count, self._seq_len, dtype=np.int64))

    def _segment_columns(
        self, records: np.ndarray, b_count: int, pieces: npt.NDArray[np.int64],
    ) -> tuple[dict[str, Any], dict[str, FieldSchema]]:
        """The ``doc_ids`` and metadata columns asked for, and the batch's schema."""
        ds, n, seq_len = self._ds, self._span, self._seq_len
        metadata: dict[str, list[Spans]] = {}
        meta_ids = records.reshape(-1)[META_ID] if ds.has_metadata else records
        together = self._want_metadata and not ds.has_document_metadata
        view = ds._view(pieces, *self._bounds(b_count), docs=self._want_doc_ids or together,
                        meta_ids=meta_ids if together else None)
        doc_ids = doc_off = doc_len = None
        if together:
            (_, _, _, doc_off, doc_ids, doc_len, *spans, code, shard) = k.window_columns_meta(
                view.pieces, b_count, n, seq_len, view.docs, view.doc_starts, view.meta_ids,
                view.entries, view.index, view.data, _HEAD,
            )
            ds._check(code, int(view.shards[shard]) if code else shard)
            metadata["metadata"] = ds._spans(*spans).observations()
        else:
            if self._want_doc_ids:
                _, _, _, doc_off, doc_ids, doc_len, code, shard = k.window_columns(
                    view.pieces, b_count, n, seq_len, view.docs, view.doc_starts,
                )
                ds._check(code, int(view.shards[shard]) if code else shard)
            if self._want_metadata or self._want_documents:
                every, documents = ds._metadata(meta_ids, pieces, *self._bounds(b_count),
                                                documents=self._want_documents)
                if self._want_metadata:
                    metadata["metadata"] = every
                if self._want_documents and documents is not None:
                    metadata["document_metadata"] = documents
        columns: dict[str, Any] = {}
        schema = dict(self._dense)
        if self._want_doc_ids:
            assert doc_ids is not None and doc_off is not None
            columns["doc_ids"] = Jagged._unchecked(doc_ids, doc_off)
            schema["doc_ids"] = FieldSchema("jagged", doc_ids.dtype, (), doc_len)
        for name, column in metadata.items():
            schema[name] = _METADATA_SCHEMA if len(column) else _EMPTY_METADATA_SCHEMA
        columns.update(metadata)
        return columns, schema


_INT32 = np.dtype(np.int32)


def _segment_bytes(count: int, seq_len: int) -> int:
    """Bytes ``_carve_segments`` may use for ``count`` windows, alignment included."""
    return (count * seq_len * 4 + (count * (seq_len + 1) + 1) * 4 + (2 * count + 1) * 8
            + count * 4 + 16 + 6 * ALIGN)


def _carve_segments(
    buffer: np.ndarray, at: int, count: int, seq_len: int, none: tuple[np.ndarray, ...], *,
    positions: np.ndarray, seq_idx: bool, longest: bool,
) -> tuple[np.ndarray, ...]:
    """The ``out`` of ``_kernels._row_segments`` for ``count`` windows: the
    arrays asked for carved from ``buffer`` from byte ``at``, the others from
    ``none`` (``_kernels.no_segments``), and a fresh cursor."""
    ids = none[1]
    if seq_idx:
        ids, at = carve(buffer, at, np.int32, (count, seq_len))
    # cu_seqlens, always (the walk writes it): at most seq_len segments and the end a window
    values, at = carve(buffer, at, np.int32, (count * (seq_len + 1),))
    offsets, at = carve(buffer, at, np.int64, (count + 1,))
    lengths, at = carve(buffer, at, np.int64, (count,))
    offsets[0] = 0
    most = none[5]
    if longest:
        most, at = carve(buffer, at, np.int32, (count,))
    cursor, at = carve(buffer, at, np.int64, (2,))
    cursor[:] = 0
    return positions, ids, values, offsets, lengths, most, cursor


def _choose_columns(
    columns: Sequence[str] | str | None, valid: tuple[str, ...],
    default: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """The columns asked for, in the order of ``valid``; ``default`` (all of
    ``valid`` when None) for None; all of ``valid`` for ``"all"``."""
    if columns is None or columns == "all":
        chosen = valid if default is None or columns == "all" else default
        return tuple(name for name in valid if name in chosen)
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
        # Batches of cast tokens and ids alone (no fields, no metadata) are built
        # valid: this is the dtype Batch.from_columns would store their values as.
        self._trusted_dtype = (
            None if self._dtype is None or dataset.manifest.fields or dataset.has_metadata
            else normalize_column("input_ids", Jagged._unchecked(
                np.zeros(0, self._dtype), np.zeros(1, np.int64)))[1].dtype)

    def __len__(self) -> int:
        return self._ds.num_documents

    def arenas(self) -> list[Arena]:
        """The arenas this source's reads take their buffers from (a device
        output makes them pinned: ``zerobatch.torch.TorchOutput``)."""
        return [self._ds._arena]

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint plus ``max_len``."""
        return f"{self._ds.fingerprint}:documents:{self._max_len}"

    @property
    def reads_wait(self) -> bool:
        """True when a read waits on the network (object storage); False for
        local files, which the Loader's automatic mode reads in the caller's
        thread."""
        return self._ds._local is None

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
        requests, closed = k.read_requests(pieces, ds._token_handles, ds._bases, itemsize)
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
        requests, closed = k.read_requests(pieces, ds._token_handles, ds._bases, itemsize)
        records = ds._read_records(pieces, requests, closed, raw)
        field = ds.manifest.token_field
        tokens = records if field is None else records[field]
        values = tokens  # "stored": a view of the read buffer
        if self._dtype is not None:
            values, _ = carve(buffer, offset, self._dtype, (total,))
            np.copyto(values, tokens, casting="unsafe")
        if self._trusted_dtype is not None:  # Batch.from_columns's result, unchecked
            tokens_column = Jagged._unchecked(values, offsets)
            return Batch._trusted({"input_ids": tokens_column, "doc_ids": idx}, idx, {
                "input_ids": FieldSchema("jagged", self._trusted_dtype, (),
                                         tokens_column.lengths),
                "doc_ids": _DOC_IDS_SCHEMA})
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


@functools.lru_cache(maxsize=256)  # many sources of one kind (a mixture) infer it once
def _dense_schema(tokens: np.dtype, labels: bool, seq_len: int, record_dtype: np.dtype,
                  fields: tuple[str, ...]) -> dict[str, FieldSchema]:
    """``TokenWindows._dense_schema`` for these token and record dtypes (the
    result is shared: never mutate it)."""
    shape = (0, seq_len)
    arrays = {"input_ids": np.empty(shape, tokens)}
    if labels:
        arrays["labels"] = arrays["input_ids"]
    arrays["position_ids"] = np.empty(shape, _INT32)
    arrays["max_seqlen"] = np.empty(0, np.int32)
    arrays["seq_idx"] = np.empty(shape, np.int32)
    named: Mapping[str, Any] = record_dtype.fields or {}
    for name in fields:
        arrays[name] = np.empty(shape, named[name][0])
    return {name: normalize_column(name, array)[1] for name, array in arrays.items()}


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
    # A local folder with a manifest is ours (one stat); without one it may be
    # an .npy folder or a peer's files.
    native = (storage is None and isinstance(folder, Path)
              and os.path.isfile(os.path.join(folder, MANIFEST)))
    if storage is None and not native and isinstance(folder, Path) and is_npy_folder(folder):
        return open_npy(folder)
    if (storage is None and not native and format is None and _PEERS
            and not _has_manifest(folder, storage_options)):
        found = _PEERS[0].open(path, None, storage_options, format_options)  # detected
        if found is not None:
            return found
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

    def open(self, path: str | os.PathLike[str], format: str | None,
             storage_options: Mapping[str, Any] | None, options: dict[str, Any]
             ) -> Dataset | None:
        """``path`` opened as ``format`` with its ``options`` (None: the format
        detected, and None when there is none)."""


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
    found = _PEERS[0].open(path, format, storage_options, options)
    assert found is not None  # a format named: opened, or raised
    return found


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
