"""Documents packed into rows of ``seq_len`` tokens, online, exactly and resumably.

``open_dataset(path).documents().packed(seq_len)`` is a :class:`PackedRows`
source: rows of at most ``seq_len`` tokens, each holding several documents
back to back (then padding), read by the :class:`~zerobatch.Loader` with the
varlen contract (:mod:`zerobatch.varlen`).

How rows come about (a pure function of the data, ``seed``, ``epoch`` and the
packing options; identical on every rank, run and thread count):

1. The epoch's *document order* is ``Feistel(documents, epoch_seed(seed,
   epoch))`` (the identity with ``shuffle=False``): the same order the plan
   gives a ``Documents`` source.
2. The order is cut into *windows* of ``window`` consecutive documents (the
   last one shorter). Window ``w`` holds order positions ``[w * window,
   (w + 1) * window)``.
3. A window's documents become *pieces* by the long-document ``policy``: a
   document of ``n <= seq_len`` tokens is one piece; a longer one is cut to
   its first ``seq_len`` tokens (``"truncate"``: the rest is counted as
   dropped), cut into ``ceil(n / seq_len)`` pieces of ``seq_len`` tokens and
   a remainder (``"split"``), or skipped and counted (``"drop"``).
4. Best-fit decreasing packs the window's pieces into rows (longest first,
   each into the fullest row it fits, O(n log seq_len)). A piece is a
   segment of its row: ``position_ids`` restart at each piece.
5. With ``shuffle`` the window's rows are read in the order of a Feistel
   permutation seeded by the epoch's seed and ``w`` (best-fit decreasing
   leaves long pieces in the first rows, short ones at the end), else in
   packing order.

The epoch's *rows* are window 0's rows, then window 1's, and so on. They are
the observations the plan counts: a step takes ``batch_size * world_size``
consecutive rows and rank ``r`` reads rows ``consumed + r + world_size * k``,
exactly as :class:`zerobatch.plan.Plan` splits positions. Packing happens on
the global order before that split, so every rank sees the same rows and runs
the same number of steps; each rank reads only its own rows' documents.

State (:class:`PackedPlan`): the Loader's one ``Position``, whose ``consumed``
counts rows received this epoch, plus ``window_documents`` (documents of the
order before the current window, a multiple of ``window``) and
``window_rows`` (rows of that window received). Resuming re-packs that one
window and goes on; nothing lives only in memory, the state is O(1), and
another ``world_size`` or ``batch_size`` continues the same rows. The
epoch's row count is learned as the windows are packed: the last step is
found when the last window is, so no length is estimated and no rank waits.
``len()`` of the source and of a Loader over it packs every window of the
epoch (O(documents), tens of milliseconds per million documents).

Row ids (``Batch.meta`` indices, what ``read`` takes): ``epoch << 46 | window
<< 23 | row``; at most 2**17 epochs, 2**23 windows and 2**23 rows a window.
With ``drop_last=False`` the last step is filled with the first rows of the
epoch's first window (marked in the ``padding`` column; their labels are all
-100), so an evaluation pass takes every document exactly once.

Losses: a per-token field (``loss_mask="field"``, nonzero = take the loss)
or spans of a kind (``loss_spans="assistant"``: spans whose value is that
string, or a dict with that ``"kind"``) mask the labels (see
:mod:`zerobatch.varlen` for both label conventions).

Mixtures, both ways:

- *Packing over a mixture of documents*: a packed source packs one
  ``Documents`` source (one dataset, or datasets joined with
  ``zerobatch.combine``); every epoch gets its own packing.
- *A mixture of packed sources*: ``Mixture({"a": pa.mixable(), "b":
  pb.mixable()}, weights, ...)`` (:class:`MixableRows`): each source is one
  packing (epoch 0 of its document order) read as positions ``0..rows-1``;
  the mixture's passes permute those rows afresh, so each pass of each source
  takes every document exactly once and resumes exactly (the Mixture's state).
  A ``PackedRows`` itself is refused by ``Mixture`` (its row ids carry epoch
  and window, and its epochs differ in length).

Each epoch's padding and dropped tokens are logged (logger
``zerobatch.packing``, INFO) when its last window is packed, and returned by
:meth:`PackedRows.describe`. Immutable apart from caches guarded by a lock:
thread-safe.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch import _packing_kernels as pk
from zerobatch.columnar import Batch, FieldSchema, Jagged
from zerobatch.plan import Plan, Planned, epoch_seed
from zerobatch.shuffle import Feistel
from zerobatch.stream._arena import ALIGN as _ALIGN
from zerobatch.stream.index import MappedIndex
from zerobatch.stream.manifest import TOKENS
from zerobatch.varlen import (
    IGNORE_INDEX,
    LABEL_MODES,
    Columns,
    static_cu_seqlens,
    to_output,
    varlen_columns,
)

__all__ = ["DEFAULT_WINDOW", "MIN_WINDOW", "POLICIES", "MixableRows", "PackedPlan",
           "PackedRows", "collate_rows"]


class _Documents(Protocol):
    """What packing reads of ``zerobatch.stream.Documents``, typed here: the
    reader imports this module (``Documents.packed``), so this one never
    imports the reader."""

    _ds: Any  # the stream Dataset: manifest, path, has_metadata
    _dtype: np.dtype | None
    _max_len: int | None

    def __len__(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    def read(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch: ...
    def records(self, indices: Sequence[int] | npt.NDArray[np.integer]
                ) -> tuple[np.ndarray, npt.NDArray[np.int64]]: ...
    def lengths(self, indices: Sequence[int] | npt.NDArray[np.integer]
                ) -> npt.NDArray[np.int64]: ...

DEFAULT_WINDOW = 8192
"""Documents packed together by default: padding under 1% on lognormal
conversations and code-like lengths (BENCHMARKS.md, packing)."""

MIN_WINDOW = 8
"""The smallest ``window``: fewer documents leave most rows half empty."""

POLICIES = tuple(pk.POLICIES)

_ROW_BITS = 23
_WINDOW_BITS = 23
_EPOCH_BITS = 64 - 1 - _ROW_BITS - _WINDOW_BITS
_ROW_MASK = (1 << _ROW_BITS) - 1
_WINDOW_MASK = (1 << _WINDOW_BITS) - 1
_ROW_DOMAIN = 0x524F574F52444552  # "ROWORDER": the rows' order apart from the documents'
_CACHED_WINDOWS = 16
_CACHED_EPOCHS = 4
_log = logging.getLogger("zerobatch.packing")
_NO_PADDING = np.zeros(0, np.bool_)
_NO_SEGMENTS = np.zeros((0, 0), np.int32)
_NO_STATS = np.zeros(0, np.int64)  # read_contract's segment_ids: not asked for
_SHARD, _START = 1, 2  # columns of the stream reader's pieces (stream._kernels)


@dataclass(frozen=True)
class _Window:
    """One packed window: pieces grouped by row (global document ids)."""

    doc: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    row_offsets: npt.NDArray[np.int64]
    stats: npt.NDArray[np.int64]  # see _STAT_NAMES
    # each piece's shard and first record there, where read_collated reads
    # local files itself (else None)
    shard: npt.NDArray[np.int64] | None = None
    record: npt.NDArray[np.int64] | None = None

    @property
    def rows(self) -> int:
        return int(self.row_offsets.shape[0] - 1)


_STAT_NAMES = ("documents", "rows", "tokens", "dropped_documents", "dropped_tokens",
               "cut_documents", "pieces")


class _Direct:
    """What a packed source needs to read and collate in one pass
    (:meth:`PackedRows.read_collated`): the input_ids dtype, the kernel's
    options (label mode, pad id), whether a loss-mask field is read, every
    shard's byte base in its token file; and the byte layout of the
    outputs per batch shape (cached)."""

    def __init__(self, dtype: np.dtype, options: npt.NDArray[np.int64], has_mask: bool,
                 bases: npt.NDArray[np.int64]) -> None:
        self.dtype, self.options, self.has_mask, self.bases = dtype, options, has_mask, bases
        self._layouts: dict[tuple[int, int, bool], tuple[int, list[Any]]] = {}

    def layout(self, rows: int, seq_len: int, attention: bool
               ) -> tuple[int, list[tuple[tuple[int, ...], np.dtype, int]]]:
        """(bytes, [(shape, dtype, byte offset)] of input_ids, labels,
        position_ids, seq_idx, attention_mask and cu_seqlens) for a batch of
        ``rows`` rows; attention_mask has no rows unless asked for."""
        key = (rows, seq_len, attention)
        known = self._layouts.get(key)
        if known is None:
            plane = (rows, seq_len)
            shapes = [(plane, self.dtype), (plane, np.dtype(np.int64)),
                      (plane, np.dtype(np.int32)), (plane, np.dtype(np.int32)),  # varlen's
                      (plane if attention else (0, 0), np.dtype(np.int64)),
                      ((rows * (seq_len + 1) + 1,), np.dtype(np.int32))]
            layout, at = [], 0
            for shape, dtype in shapes:
                layout.append((shape, dtype, at))
                at += -(-int(np.prod(shape)) * dtype.itemsize // _ALIGN) * _ALIGN
            known = self._layouts[key] = (at, layout)
        return known


class _Walk:
    """Where one epoch's windows start in its row order, learned forward from an
    anchor (window ``first`` starts at row ``starts[0]``)."""

    def __init__(self, first: int, start: int, windows: int) -> None:
        self.first = first
        self.starts = [start]
        self.windows = windows
        self.total: int | None = start if first >= windows else None


class PackedRows:
    """Rows of at most ``seq_len`` tokens packed from ``documents`` (module docstring).

    Args:
        documents: the source of documents (``open_dataset(p).documents()``).
        seq_len: tokens per row (>= 1).
        window: documents packed together (>= ``MIN_WINDOW``).
        policy: documents longer than ``seq_len``: ``"split"`` into pieces,
            ``"truncate"`` to their first ``seq_len`` tokens, or ``"drop"``.
        labels: ``"shifted"`` (labels[i] = input_ids[i + 1]) or ``"aligned"``
            (Hugging Face's: labels[i] = input_ids[i], the model shifts).
        loss_mask: a per-token field of the dataset; tokens where it is 0 take no loss.
        loss_spans: a span kind: only tokens inside such spans take the loss.
        attention_mask: add ``attention_mask`` (1 on tokens, 0 on padding).
        cu_seqlens_size: pad ``cu_seqlens`` to this static length.
        pad_id: the token id of padding.
        seed, shuffle: the document order of a ``read`` outside a Loader; a
            Loader binds its own (:meth:`bind_plan`).

    ``read(row_ids)`` returns a Batch of ``input_ids`` ``[B, seq_len]``,
    ``seqlens`` (jagged: each row's segment lengths), ``doc_ids`` and
    ``doc_starts`` (jagged: each segment's document and its first token in
    that document) and, with a loss mask, ``loss_mask`` ``[B, seq_len]``
    uint8; :meth:`collate` turns it into the varlen contract.
    """

    collate_outputs = ("numpy", "torch", "jax")
    """The outputs :meth:`collate` gives (a ``JaxOutput`` places the JAX one)."""

    def __init__(
        self, documents: _Documents, seq_len: int, *, window: int = DEFAULT_WINDOW,
        policy: Literal["split", "truncate", "drop"] = "split",
        labels: Literal["shifted", "aligned"] = "shifted", loss_mask: str | None = None,
        loss_spans: str | None = None, attention_mask: bool = False,
        cu_seqlens_size: int | None = None, pad_id: int = 0, seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        for name, value, low in (("seq_len", seq_len, 1), ("window", window, MIN_WINDOW)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < low:
                hint = (f"; windows of fewer than {MIN_WINDOW} documents leave rows mostly "
                        f"empty (default {DEFAULT_WINDOW})" if name == "window" else "")
                raise ValueError(f"{name} must be >= {low}, got {value}{hint}")
        if int(window) > _WINDOW_MASK:
            raise ValueError(f"window must be at most {_WINDOW_MASK}, got {window}")
        if policy not in pk.POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if labels not in LABEL_MODES:
            raise ValueError(f"labels must be one of {LABEL_MODES}, got {labels!r}")
        if loss_mask is not None and loss_spans is not None:
            raise ValueError("pass loss_mask= (a per-token field) or loss_spans= (a span "
                             "kind), not both")
        ds = documents._ds
        if loss_mask is not None and loss_mask not in ds.manifest.fields:
            raise ValueError(f"loss_mask={loss_mask!r} is not a per-token field of "
                             f"{ds.path}; it has {sorted(ds.manifest.fields) or 'none'}")
        if loss_spans is not None:
            _check_span_kind(documents, loss_spans)
        if cu_seqlens_size is not None and (
                isinstance(cu_seqlens_size, bool) or not isinstance(cu_seqlens_size, int)
                or cu_seqlens_size < 2):
            raise ValueError(f"cu_seqlens_size must be an int >= 2 or None, got "
                             f"{cu_seqlens_size!r}")
        self._docs = documents
        self.seq_len = int(seq_len)
        self.window = int(window)
        self.policy = policy
        self.labels = labels
        self.loss_mask = loss_mask
        self.loss_spans = loss_spans
        self.attention_mask = attention_mask
        self.cu_seqlens_size = cu_seqlens_size
        self.pad_id = pad_id
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._documents = len(documents)
        self._windows_per_epoch = -(-self._documents // self.window)
        if self._windows_per_epoch > _WINDOW_MASK + 1:
            raise ValueError(f"{self._documents} documents make more than 2**{_WINDOW_BITS} "
                             f"windows of {self.window}; raise window")
        self._lock = _forksafe.rlock()
        self._cache: OrderedDict[tuple[int, int], _Window] = OrderedDict()
        self._walks: OrderedDict[int, _Walk] = OrderedDict()
        self._stats: OrderedDict[int, np.ndarray] = OrderedDict()
        self._logged: set[int] = set()
        self._threads = threading.local()  # each reader thread's record buffer
        self._direct_cache: _Direct | Literal[False] | None = False  # False: not known yet
        self._last: tuple[tuple[int, int], _Window | None] = ((-1, -1), None)  # last window

    def _options(self) -> dict[str, Any]:
        return {"window": self.window, "policy": self.policy, "labels": self.labels,
                "loss_mask": self.loss_mask, "loss_spans": self.loss_spans,
                "attention_mask": self.attention_mask, "cu_seqlens_size": self.cu_seqlens_size,
                "pad_id": self.pad_id}

    def with_order(self, seed: int, shuffle: bool) -> PackedRows:
        """The same rows for another document order (a fresh cache)."""
        return PackedRows(self._docs, self.seq_len, seed=seed, shuffle=shuffle,
                          **self._options())

    # -- the source protocol ----------------------------------------------------

    def __len__(self) -> int:
        """Rows of epoch 0 (packs every window: O(documents))."""
        return self.rows(0)

    def arenas(self) -> list[Any]:
        """The arenas this source's reads take their buffers from (a device
        output makes them pinned: ``zerobatch.torch.TorchOutput``)."""
        arenas = getattr(self._docs, "arenas", None)
        return arenas() if callable(arenas) else []

    @property
    def documents(self) -> int:
        """Documents in an epoch."""
        return self._documents

    @property
    def fingerprint(self) -> str:
        """The documents' fingerprint plus what decides the rows."""
        return (f"{self._docs.fingerprint}:packed:{self.seq_len}:{self.window}:{self.policy}:"
                f"{self.loss_mask}:{self.loss_spans}")

    def __repr__(self) -> str:
        return (f"PackedRows(seq_len={self.seq_len}, window={self.window}, "
                f"policy={self.policy!r}, documents={self._documents})")

    def rows(self, epoch: int) -> int:
        """Rows in ``epoch`` (packs every window not yet packed: O(documents))."""
        self._locate(epoch, None)
        total = self._walk(epoch).total
        assert total is not None
        return total

    def read(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch:
        """The rows of ``indices`` (row ids, see the module docstring) as one Batch."""
        ids = np.ascontiguousarray(np.asarray(indices), dtype=np.int64).reshape(-1)
        rows, offsets, doc, start, size = self._rows_of(ids)
        row_offsets, doc, start, size, bad_row = pk.window_rows(rows, offsets, doc, start, size)
        if bad_row >= 0:
            raise IndexError(f"row id {int(ids[bad_row])}: its window has "
                             f"{offsets.shape[0] - 1} rows, not {int(rows[bad_row]) + 1}")
        counts = np.diff(row_offsets)
        if self.loss_spans is None:  # the stored records: no cast, no Batch, no metadata
            records, offsets = self._docs.records(doc)
            field = self._docs._ds.manifest.token_field
            values = records if field is None else records[field]
            mask = None if self.loss_mask is None else records[self.loss_mask]
        else:
            read = self._docs.read(doc)
            tokens = read["input_ids"]
            assert isinstance(tokens, Jagged)
            values, offsets = tokens.values, tokens.offsets
            mask = self._span_mask(read, tokens)
        dtype = self._docs._dtype or values.dtype
        input_ids = np.empty((ids.shape[0], self.seq_len), dtype)
        columns: dict[str, Any] = {"input_ids": input_ids}
        if mask is None:
            pk.fill_batch(values, values[:0], False, offsets, start, size, row_offsets,
                          self.pad_id, input_ids, input_ids)
        else:
            loss_mask = np.empty((ids.shape[0], self.seq_len), mask.dtype)  # 0 = no loss
            pk.fill_batch(values, mask, True, offsets, start, size, row_offsets, self.pad_id,
                          input_ids, loss_mask)
            columns["loss_mask"] = loss_mask
        # Built valid here: Batch._trusted skips from_columns' checks (a test compares them).
        schema = {name: FieldSchema("dense", column.dtype, column.shape[1:])
                  for name, column in columns.items()}
        jagged = FieldSchema("jagged", np.dtype(np.int64), (), counts)
        for name, values in (("seqlens", size), ("doc_ids", doc), ("doc_starts", start)):
            columns[name] = Jagged._unchecked(values, row_offsets)
            schema[name] = jagged
        return Batch._trusted(columns, ids, schema)

    def read_collated(self, indices: Sequence[int] | npt.NDArray[np.integer],
                      padding: npt.NDArray[np.bool_] | None = None,
                      output: str = "numpy") -> dict[str, Any]:
        """``collate(read(indices))`` (with the ``padding`` column when given) in
        one pass where the documents are local files: each row's pieces are
        read straight from the mapped token files (only the pieces' ranges)
        and written as the varlen contract by one kernel, into a recycled
        buffer; no Batch, no intermediate records. Other storage, and
        ``loss_spans`` (which reads span metadata), take ``read`` then
        ``collate``. The Loader calls this when it has no ``transform``."""
        direct = self._direct()
        if direct is None or output not in ("numpy", "torch"):
            return self._read_then_collate(indices, padding, output)
        ids = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        key = int(ids[0]) >> _ROW_BITS if ids.shape[0] else -1  # the kernel checks the others
        if key < 0 or key & _WINDOW_MASK >= self._windows_per_epoch:
            return self._read_then_collate(indices, padding, output)  # read names a bad id
        packed = self._window(key >> _WINDOW_BITS, key & _WINDOW_MASK)
        if packed.shard is None or packed.record is None:
            return self._read_then_collate(indices, padding, output)
        ds = self._docs._ds
        local = ds._local
        nbytes, layout = direct.layout(ids.shape[0], self.seq_len, self.attention_mask)
        buffer = ds._arena.take(nbytes)
        input_ids, labels, position_ids, seq_idx, attention, cu = [
            np.ndarray(shape, dtype, buffer, offset) for shape, dtype, offset in layout]
        records = self._record_buffer()
        flags = _NO_PADDING if padding is None else np.ascontiguousarray(padding, np.bool_)
        rows = ids
        while True:
            handles = ds._token_handles.copy()  # before the file table (tables only grow)
            files, use_pread = local.files()
            offsets, doc_ids, segments, longest, bad, closed, failed, status = \
                pk.read_contract(rows, key, _ROW_BITS, packed.row_offsets, packed.doc,
                                 packed.size, packed.shard, packed.record, handles, direct.bases,
                                 files.fds, files.addresses, files.sizes, use_pread, records,
                                 direct.has_mask, flags, direct.options,
                                 input_ids, labels, position_ids, seq_idx, _NO_SEGMENTS,
                                 attention, cu)
            if closed >= 0:
                ds._open(np.array([closed], np.int64))
                continue
            if bad >= 0 and status == -5 and rows is ids:  # rows of several windows
                joined = self._joined_rows(ids)
                if joined is None:  # a bad id: read names it
                    return self._read_then_collate(indices, padding, output)
                packed, rows, key = joined, np.arange(ids.shape[0], dtype=np.int64), 0
                continue
            break
        if bad >= 0:
            raise IndexError(f"row id {int(ids[bad])}: window {key & _WINDOW_MASK} of epoch "
                             f"{key >> _WINDOW_BITS} has {packed.rows} rows, not "
                             f"{(int(ids[bad]) & _ROW_MASK) + 1}")
        if failed >= 0:
            self._read_failed(ds, packed, failed, status)
        # the columns of collate(), in its order, built directly
        cu = cu[:segments + 1] if self.cu_seqlens_size is None \
            else static_cu_seqlens(cu[:segments + 1], self.cu_seqlens_size)
        out = Columns(input_ids=input_ids, labels=labels, position_ids=position_ids,
                      cu_seqlens=cu, max_seqlen=int(longest), seq_idx=seq_idx)
        if self.attention_mask:
            out["attention_mask"] = attention
        if padding is not None:
            out["padding"] = flags
        if output == "torch":
            import torch

            for name, value in out.items():
                if isinstance(value, np.ndarray):
                    out[name] = torch.from_numpy(value)
            out["doc_ids"] = (torch.from_numpy(doc_ids), torch.from_numpy(offsets))
        else:
            out["doc_ids"] = Jagged._unchecked(doc_ids, offsets)
        return out

    def _joined_rows(self, ids: npt.NDArray[np.int64]) -> _Window | None:
        """The pieces of rows ``ids`` from several windows as one window whose
        row ``j`` is ``ids[j]`` (what ``read_contract`` reads in one pass), or
        None when an id is bad or a window has no piece locations."""
        parts = []
        for i in ids.tolist():  # a step across two windows: a few per epoch
            w, row = (i >> _ROW_BITS) & _WINDOW_MASK, i & _ROW_MASK
            if i < 0 or w >= self._windows_per_epoch:
                return None
            packed = self._window(i >> (_ROW_BITS + _WINDOW_BITS), w)
            if row >= packed.rows or packed.shard is None or packed.record is None:
                return None
            lo, hi = int(packed.row_offsets[row]), int(packed.row_offsets[row + 1])
            parts.append((packed, lo, hi))
        row_offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([hi - lo for _, lo, hi in parts], out=row_offsets[1:])
        doc, start, size, shard, record = (
            np.concatenate([getattr(packed, name)[lo:hi] for packed, lo, hi in parts])
            for name in ("doc", "start", "size", "shard", "record"))
        return _Window(doc, start, size, row_offsets, _NO_STATS, shard, record)

    def _direct(self) -> _Direct | None:
        """What :meth:`read_collated` needs to read in one pass (local files of
        a stream dataset, no span metadata to read), else None."""
        if self._direct_cache is not False:
            return self._direct_cache
        ds: Any = getattr(self._docs, "_ds", None)
        direct = None
        if (self.loss_spans is None and getattr(ds, "_local", None) is not None
                and isinstance(getattr(ds, "_index", None), MappedIndex)):
            record = ds.manifest.record_dtype
            field = ds.manifest.token_field
            stored = record if field is None else record.fields[field][0]
            direct = _Direct(np.dtype(self._docs._dtype or stored),
                             np.array([1 if self.labels == "shifted" else 2, self.pad_id],
                                      np.int64),
                             self.loss_mask is not None, ds._bases)
        self._direct_cache = direct
        return direct

    def _record_buffer(self) -> np.ndarray:
        """This thread's buffer of ``seq_len`` records (one piece at a time), in
        the layout ``read_contract`` reads (``kernel_records``)."""
        cached: np.ndarray | None = getattr(self._threads, "records", None)
        if cached is None:
            dtype = pk.kernel_records(self._docs._ds.manifest.record_dtype, self.loss_mask)
            cached = self._threads.records = np.empty(self.seq_len, dtype)
        return cached

    def _read_then_collate(self, indices: Sequence[int] | npt.NDArray[np.integer],
                           padding: npt.NDArray[np.bool_] | None, output: str
                           ) -> dict[str, Any]:
        """``collate(read(indices))``, with the ``padding`` column when given."""
        batch = self.read(indices)
        if padding is not None:
            columns = batch.to_numpy()
            columns["padding"] = padding
            batch = Batch.from_columns(columns, batch.meta)
        return self.collate(batch, output)

    def _read_failed(self, ds: Any, packed: _Window, piece: int, status: int) -> None:
        """Raise for piece ``piece`` of ``packed`` that ``read_contract`` could not read."""
        assert packed.shard is not None
        shard = int(packed.shard[piece])
        where = (f"document {int(packed.doc[piece])}, tokens {int(packed.start[piece])}:"
                 f"{int(packed.start[piece] + packed.size[piece])}")
        if status == -4:
            raise ValueError(f"{where}: does not fit its row of {self.seq_len} tokens")
        if status == 0:
            raise ds._shard_error(shard, TOKENS, "bytes",
                                  f"file ends before the records of {where}; truncated or "
                                  "not fully written?")
        raise OSError(f"reading {where} from shard {shard} failed (read status {status})")

    def _rows_of(self, ids: npt.NDArray[np.int64]
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                            npt.NDArray[np.int64], npt.NDArray[np.int64],
                            npt.NDArray[np.int64]]:
        """(rows, row offsets, doc, start, size): batch row ``j``'s pieces are
        ``row_offsets[rows[j]]:row_offsets[rows[j] + 1]`` of the piece arrays --
        its window's when the rows come from one window, else the batch's own."""
        bad, key = pk.row_windows(ids, _ROW_BITS, _WINDOW_MASK, self._windows_per_epoch)
        if bad >= 0:
            raise IndexError(f"row id {int(ids[bad])} names window "
                             f"{(int(ids[bad]) >> _ROW_BITS) & _WINDOW_MASK}; an epoch has "
                             f"{self._windows_per_epoch}")
        rows = ids & _ROW_MASK
        if key >= 0:  # the usual: the rows of one window
            packed = self._window(key >> _WINDOW_BITS, key & _WINDOW_MASK)
            return rows, packed.row_offsets, packed.doc, packed.start, packed.size
        offsets, doc, start, size = self._pieces_of(ids, ids >> _ROW_BITS, rows)
        return np.arange(ids.shape[0], dtype=np.int64), offsets, doc, start, size

    def _pieces_of(self, ids: npt.NDArray[np.int64], window_keys: npt.NDArray[np.int64],
                   rows: npt.NDArray[np.int64]
                   ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                              npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(row offsets, doc, start, size) of the pieces of rows ``ids`` from
        several windows."""
        keys, inverse = np.unique(window_keys, return_inverse=True)
        counts = np.empty(ids.shape[0], np.int64)
        groups = []
        for k, key in enumerate(keys.tolist()):  # the windows the rows come from
            epoch, w = key >> _WINDOW_BITS, key & _WINDOW_MASK
            sel = np.flatnonzero(inverse == k)
            packed = self._window(epoch, w)
            r = rows[sel]
            if int(r.max()) >= packed.rows:
                raise IndexError(f"row id {int(ids[sel[r.argmax()]])}: window {w} of epoch "
                                 f"{epoch} has {packed.rows} rows, not {int(r.max()) + 1}")
            lo, hi = packed.row_offsets[r], packed.row_offsets[r + 1]
            counts[sel] = hi - lo
            groups.append((sel, lo, hi, packed))
        row_offsets = np.zeros(ids.shape[0] + 1, np.int64)
        np.cumsum(counts, out=row_offsets[1:])
        total = int(row_offsets[-1])
        doc, start, size = (np.empty(total, np.int64) for _ in range(3))
        for sel, lo, hi, packed in groups:
            pk.scatter_rows(sel, lo, hi, row_offsets, packed.doc, packed.start, packed.size,
                            doc, start, size)
        return row_offsets, doc, start, size

    def _span_mask(self, read: Batch, tokens: Jagged) -> np.ndarray:
        """The per-token loss mask of the documents read (uint8, over their
        tokens): 1 inside spans of kind ``loss_spans``."""
        mask = np.zeros(tokens.values.shape[0], np.uint8)
        if "metadata" not in read:
            return mask
        metadata = read["metadata"]
        assert isinstance(metadata, list)
        for j, spans in enumerate(metadata):
            base = int(tokens.offsets[j])
            for begin, end, value in spans:
                if _kind(value) == self.loss_spans:
                    mask[base + begin:base + end] = 1
        return mask

    def collate(self, batch: Batch, output: str = "numpy") -> dict[str, Any]:
        """The varlen contract (:mod:`zerobatch.varlen`) of a batch of rows, for
        ``output`` ``"numpy"``, ``"torch"`` or ``"jax"`` (:func:`collate_rows`
        with this source's :meth:`collate_options`)."""
        return collate_rows(batch.to_numpy(), output, **self.collate_options())

    def mixable(self) -> MixableRows:
        """These rows as a plain source of positions ``0 .. rows - 1`` (one
        packing: the documents in this source's ``seed``/``shuffle`` order of
        epoch 0), what ``zerobatch.Mixture`` mixes: its passes over the rows
        are its own permutations of this one packing (:class:`MixableRows`)."""
        return MixableRows(self)

    def collate_options(self) -> dict[str, Any]:
        """What :func:`collate_rows` needs besides the rows (JSON-able: a
        ``BatchServer`` sends it to its clients)."""
        return {"labels": self.labels, "attention_mask": self.attention_mask,
                "cu_seqlens_size": self.cu_seqlens_size}

    def bind_plan(self, batch_size: int, *, world_size: int = 1, seed: int = 0,
                  shuffle: bool = True, drop_last: bool = True,
                  block_size: int | None = None) -> tuple[PackedPlan, PackedRows]:
        """The plan a Loader follows over these rows, and the source bound to its
        ``seed`` and ``shuffle`` (which it reads from)."""
        if block_size is not None:
            raise ValueError("block_size does not apply to packed rows: a window's rows "
                             "are read together already; leave block_size=None")
        bound = self if (seed, shuffle) == (self.seed, self.shuffle) \
            else self.with_order(seed, shuffle)
        return PackedPlan(self._documents, batch_size, world_size=world_size, seed=seed,
                          shuffle=shuffle, drop_last=drop_last, packed=bound), bound

    # -- describe ---------------------------------------------------------------

    def describe(self, epoch: int = 0) -> dict[str, Any]:
        """What ``epoch``'s packing does to the data (packs every window:
        O(documents)): documents, rows, tokens placed, padding tokens and
        fraction, documents dropped or cut by the policy and tokens dropped."""
        with self._lock:
            stats = self._epoch_stats(epoch)
            missing = np.flatnonzero(stats[:, 0] < 0)
        for w in missing.tolist():
            self._window(epoch, w)
        with self._lock:
            total = dict(zip(_STAT_NAMES, self._epoch_stats(epoch).sum(0).tolist(),
                             strict=True))
        slots = total["rows"] * self.seq_len
        stored = total["tokens"] + total["dropped_tokens"]
        total.update(seq_len=self.seq_len, window=self.window, policy=self.policy,
                     epoch=epoch, padding_tokens=slots - total["tokens"],
                     padding=(slots - total["tokens"]) / slots if slots else 0.0,
                     dropped=total["dropped_tokens"] / stored if stored else 0.0)
        return total

    def _log_epoch(self, epoch: int) -> None:
        if epoch in self._logged or not _log.isEnabledFor(logging.INFO):
            return
        self._logged.add(epoch)
        d = self.describe(epoch)
        _log.info("zerobatch packing, epoch %d: %d documents -> %d rows of %d tokens; "
                  "padding %.2f%%; policy %r: %d documents cut, %d dropped, %d tokens "
                  "dropped (%.2f%%)", epoch, d["documents"], d["rows"], self.seq_len,
                  100 * d["padding"], self.policy, d["cut_documents"],
                  d["dropped_documents"], d["dropped_tokens"], 100 * d["dropped"])

    # -- windows ----------------------------------------------------------------

    def _epoch_stats(self, epoch: int) -> np.ndarray:
        """(under the lock) ``[windows, stats]``, -1 where a window is not packed yet."""
        stats = self._stats.get(epoch)
        if stats is None:
            stats = np.full((self._windows_per_epoch, len(_STAT_NAMES)), -1, np.int64)
            self._stats[epoch] = stats
            while len(self._stats) > _CACHED_EPOCHS:
                self._stats.popitem(last=False)
        return stats

    def _window(self, epoch: int, w: int) -> _Window:
        """Window ``w`` of ``epoch``, packed (cached)."""
        key = (epoch, w)
        last_key, last = self._last  # one tuple, replaced whole: read without the lock
        if last_key == key and last is not None:
            return last
        with self._lock:
            packed = self._cache.get(key)
            if packed is not None:
                self._cache.move_to_end(key)
                self._last = (key, packed)
                return packed
        packed = self._pack(epoch, w)
        with self._lock:
            self._cache[key] = packed
            self._last = (key, packed)
            while len(self._cache) > _CACHED_WINDOWS:
                self._cache.popitem(last=False)
            self._epoch_stats(epoch)[w] = packed.stats
        return packed

    def _pack(self, epoch: int, w: int) -> _Window:
        if not 0 <= epoch < 1 << _EPOCH_BITS:
            raise ValueError(f"epoch {epoch} is past the {1 << _EPOCH_BITS} packed epochs "
                             "row ids can name")
        first = w * self.window
        count = min(self.window, self._documents - first)
        if self.shuffle:
            docs = Feistel(self._documents, epoch_seed(self.seed, epoch)).strided(first, count)
        else:
            docs = np.arange(first, first + count, dtype=np.int64)
        direct = self._direct()
        if direct is None:
            lengths = self._docs.lengths(docs)
        else:  # where each document lies too, for read_collated (the same plan lengths runs)
            located, offsets, bad, code, shard = self._docs._ds._plan_documents(
                docs, self._docs._max_len or 0)
            if bad >= 0:
                raise IndexError(f"document {int(docs[bad])} is out of range for "
                                 f"{self._documents}")
            self._docs._ds._check(code, shard)
            lengths = np.diff(offsets)
        local, start, size, stats = pk.make_pieces(lengths, self.seq_len,
                                                   pk.POLICIES[self.policy])
        row_of, rows = pk.best_fit_decreasing(size, self.seq_len)
        if rows > _ROW_MASK + 1:
            raise ValueError(f"window {w} packs into {rows} rows, more than 2**{_ROW_BITS}; "
                             "lower window")
        if self.shuffle and rows > 1:
            rank = Feistel(rows, epoch_seed(self.seed ^ _ROW_DOMAIN, epoch) + w)(
                np.arange(rows, dtype=np.int64))
        else:
            rank = np.arange(rows, dtype=np.int64)
        order, offsets = pk.reorder_rows(row_of, rows, rank)
        all_stats = np.array([count, rows, stats[3], stats[0], stats[1], stats[2],
                              local.shape[0]], np.int64)
        local = local[order]
        start = start[order]
        if direct is None:
            return _Window(docs[local], start, size[order], offsets, all_stats)
        return _Window(docs[local], start, size[order], offsets, all_stats,
                       located[local, _SHARD], located[local, _START] + start)

    # -- the row order of an epoch (PackedPlan's arithmetic) ----------------------

    def _walk(self, epoch: int) -> _Walk:
        with self._lock:
            walk = self._walks.get(epoch)
            if walk is None:
                walk = _Walk(0, 0, self._windows_per_epoch)
                self._walks[epoch] = walk
                while len(self._walks) > _CACHED_EPOCHS:
                    self._walks.popitem(last=False)
            return walk

    def _anchor(self, epoch: int, window_documents: int, window_rows: int,
                consumed: int) -> None:
        """Resume ``epoch`` at row ``consumed``, ``window_rows`` rows into the
        window that starts after ``window_documents`` documents."""
        w, rest = divmod(window_documents, self.window)
        if rest or not 0 <= w <= self._windows_per_epoch or not 0 <= window_rows <= consumed:
            raise ValueError(f"state has window_documents={window_documents}, "
                             f"window_rows={window_rows}, consumed={consumed}: not a window "
                             f"start of {self._documents} documents in windows of "
                             f"{self.window}, or more window rows than rows")
        if w < self._windows_per_epoch and window_rows > self._window(epoch, w).rows:
            raise ValueError(f"state has window_rows={window_rows}, but window {w} of epoch "
                             f"{epoch} packs into {self._window(epoch, w).rows} rows: it "
                             "belongs to other data or packing")
        start = consumed - window_rows
        with self._lock:
            known = self._walks.get(epoch)
            if known is not None and known.first <= w < known.first + len(known.starts):
                if known.starts[w - known.first] != start:  # another loader walked here
                    raise ValueError(f"state has consumed={consumed} and window_rows="
                                     f"{window_rows}: window {w} of epoch {epoch} starts at "
                                     f"row {known.starts[w - known.first]}, not {start}")
                return
            self._walks[epoch] = _Walk(w, start, self._windows_per_epoch)

    def _locate(self, epoch: int, row: int | None) -> tuple[int, int] | None:
        """(window, row in it) of ``epoch``'s row ``row`` (None: walk to the end),
        packing windows forward as needed; None past the epoch's end. A row
        before the walk's anchor (a resumed position) walks again from the
        epoch's start."""
        with self._lock:
            walk = self._walk(epoch)
            if row is not None and row < walk.starts[0]:
                walk = self._walks[epoch] = _Walk(0, 0, self._windows_per_epoch)
            while True:
                if walk.total is not None and (row is None or row >= walk.total):
                    if row is None:
                        return None
                    self._log_epoch(epoch)
                    return None
                if row is not None and row < walk.starts[-1]:
                    i = int(np.searchsorted(walk.starts, row, side="right")) - 1
                    return walk.first + i, row - walk.starts[i]
                w = walk.first + len(walk.starts) - 1
                walk.starts.append(walk.starts[-1] + self._window(epoch, w).rows)
                if w + 1 >= walk.windows:
                    walk.total = walk.starts[-1]


class MixableRows:
    """Packed rows as positions ``0 .. len - 1`` for ``zerobatch.Mixture``
    (``PackedRows.mixable()``): position ``j`` is row ``j`` of the packing of
    epoch 0 of ``rows``' document order (its ``seed`` and ``shuffle``). The
    mixture reads a source in passes, each pass every position exactly once in
    its own seeded permutation, so each pass of a packed source takes every
    document exactly once (or exactly its split pieces); the rows' packing is
    the same in every pass (a pass's length must be fixed: another packing
    per pass would change it), their order is not. ``read`` maps positions to
    row ids (the one-window case without a lock, else one walk: O(windows)
    the first time) and reads them; ``collate`` is the packed rows'. Mixing
    two packed sources needs the same ``seq_len`` and collate options
    (``labels``, ``attention_mask``, ``cu_seqlens_size``). Thread-safe."""

    def __init__(self, rows: PackedRows) -> None:
        self._rows = rows
        self._plan, _ = rows.bind_plan(1, seed=rows.seed, shuffle=rows.shuffle)
        self.seq_len = rows.seq_len
        self._length = rows.rows(0)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"MixableRows({self._rows!r}, rows={self._length})"

    @property
    def fingerprint(self) -> str:
        """The rows' fingerprint plus the document order packed."""
        return f"{self._rows.fingerprint}:mixable:{self._rows.seed}:{self._rows.shuffle}"

    def read(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch:
        """Rows at positions ``indices`` (``0 <= i < len``)."""
        positions = np.ascontiguousarray(np.asarray(indices), dtype=np.int64).reshape(-1)
        if positions.size and (int(positions.min()) < 0
                               or int(positions.max()) >= self._length):
            bad = int(positions.min()) if int(positions.min()) < 0 else int(positions.max())
            raise IndexError(f"row {bad} is out of range for {self._length} packed rows")
        return self._rows.read(self._plan._row_ids(0, positions))

    def collate(self, batch: Batch, output: str = "numpy") -> dict[str, Any]:
        """The packed rows' varlen contract (:meth:`PackedRows.collate`)."""
        return self._rows.collate(batch, output)

    def collate_options(self) -> dict[str, Any]:
        return self._rows.collate_options()


def collate_rows(columns: Mapping[str, Any], output: str = "numpy", *,
                 labels: Literal["shifted", "aligned"] = "shifted",
                 attention_mask: bool = False,
                 cu_seqlens_size: int | None = None) -> dict[str, Any]:
    """The varlen contract of packed rows' columns (``PackedRows.read``'s, as
    NumPy: ``input_ids``, jagged ``seqlens`` and ``doc_ids``, maybe
    ``loss_mask`` and the Loader's ``padding``) for ``output`` ``"numpy"``,
    ``"torch"`` or ``"jax"``; rows marked ``padding`` get labels -100
    throughout. Also keeps ``padding``, a Mixture's ``source`` and
    ``doc_ids`` (for torch a ``(values, offsets)`` pair of tensors)."""
    out = varlen_columns(columns["input_ids"], columns["seqlens"], labels=labels,
                         loss_mask=columns.get("loss_mask"), attention_mask=attention_mask,
                         cu_seqlens_size=cu_seqlens_size, jax=output == "jax")
    padding = columns.get("padding")
    if padding is not None:
        out["labels"][np.asarray(padding, bool)] = IGNORE_INDEX
        out["padding"] = np.asarray(padding, bool)
    if "source" in columns:  # a Mixture's column passes through
        out["source"] = np.asarray(columns["source"])
    out = to_output(out, output, keep=("source",))
    doc_ids = columns["doc_ids"]
    assert isinstance(doc_ids, Jagged)
    if output == "torch":
        import torch

        out["doc_ids"] = (torch.from_numpy(np.ascontiguousarray(doc_ids.values)),
                          torch.from_numpy(doc_ids.offsets))
    else:
        out["doc_ids"] = doc_ids
    return out


def _kind(value: Any) -> Any:
    """A span value's kind: the value if a str, else its ``"kind"`` entry."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return value.get("kind")
    return None


def _check_span_kind(documents: _Documents, kind: str, sample: int = 64) -> None:
    """ValueError unless the dataset has span metadata and, among the spans of
    its first ``sample`` documents, one of kind ``kind`` (when there are any)."""
    ds = documents._ds
    if not ds.has_metadata:
        raise ValueError(f"loss_spans={kind!r}: {ds.path} has no span metadata; write "
                         "spans (convert --chat marks assistant turns) or pass loss_mask=")
    count = min(sample, len(documents))
    if count == 0:
        return
    metadata = documents.read(np.arange(count))["metadata"]
    kinds = {_kind(v) for spans in metadata for _, _, v in spans}
    kinds.discard(None)
    if kinds and kind not in kinds:
        raise ValueError(f"loss_spans={kind!r}: the first {count} documents of {ds.path} "
                         f"have spans of kinds {sorted(map(str, kinds))} only; name one of "
                         "those")


@dataclass(frozen=True)
class PackedPlan(Plan):
    """:class:`~zerobatch.plan.Plan` over packed rows (see the module docstring):
    ``length`` is the documents, ``consumed`` counts rows of the epoch."""

    packed: PackedRows | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def _rows(self) -> PackedRows:
        assert self.packed is not None
        return self.packed

    def check_consumed(self, consumed: int) -> int:
        if isinstance(consumed, bool) or not isinstance(consumed, (int, np.integer)):
            raise TypeError(f"consumed must be an int, got {type(consumed).__name__}")
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        return int(consumed)

    def _total(self, epoch: int) -> int:
        return self._rows.rows(epoch)

    def rows(self, epoch: int) -> int:
        """Rows in ``epoch`` (packs every window of it: O(documents))."""
        return self._total(epoch)

    def _exists(self, epoch: int, row: int) -> bool:
        """Whether ``epoch`` has row ``row`` (packing forward only as far as needed)."""
        rows = self._rows
        walk = rows._walks.get(epoch)  # a walk's starts only grow: read without the lock
        if walk is not None and row < walk.starts[-1]:
            return True
        return row < rows._walk(epoch).starts[0] or rows._locate(epoch, row) is not None

    def has_step(self, consumed: int, epoch: int = 0) -> bool:
        last = consumed + (self.step_size if self.drop_last else 1) - 1
        return self._exists(epoch, last)

    def steps(self, consumed: int = 0, epoch: int = 0) -> int:
        left = self._total(epoch) - self.check_consumed(consumed)
        if left <= 0:
            return 0
        return left // self.step_size if self.drop_last else -(-left // self.step_size)

    def end(self, consumed: int = 0, epoch: int = 0) -> int:
        if self.drop_last:
            return consumed + self.steps(consumed, epoch) * self.step_size
        return self._total(epoch)

    def dropped(self, consumed: int = 0, epoch: int = 0) -> int:
        return self._total(epoch) - self.end(consumed, epoch)

    def after(self, epoch: int, consumed: int) -> tuple[int, int]:
        consumed += self.step_size
        return (epoch, consumed) if self.has_step(consumed, epoch) else (epoch + 1, 0)

    def advance(self, epoch: int, consumed: int, steps: int) -> tuple[int, int]:
        """The (epoch, consumed) ``steps`` steps after the step ``(epoch,
        consumed)`` starts, across epoch ends (``steps=1`` is :meth:`after`).
        Inside the epoch it packs the windows up to the target row only;
        each epoch it crosses is packed whole (its row count depends on its
        order): O(windows), no walk step by step."""
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        steps, consumed = int(steps), int(consumed)
        if not self.has_step(consumed, epoch):  # past the epoch's last step: the next one
            epoch, consumed = epoch + 1, 0
        empty = 0
        while True:
            target = consumed + steps * self.step_size
            if self.has_step(target, epoch):
                return epoch, target
            left = self.steps(consumed, epoch)
            empty = empty + 1 if left == 0 else 0
            if empty > 1:
                raise ValueError(f"epoch {epoch} of {self._rows._documents} documents has no "
                                 f"step of {self.step_size} rows: cannot advance")
            steps -= left
            epoch, consumed = epoch + 1, 0

    def order(self, epoch: int) -> Any:
        """``epoch``'s map from row positions (``0 <= p < rows``) to row ids
        (what :meth:`PackedRows.read` takes): how a ``JaxOutput`` finds the
        rows its devices hold."""
        return functools.partial(self._row_ids, epoch)

    def _row_ids(self, epoch: int, positions: Any) -> npt.NDArray[np.int64]:
        """The row ids of ``epoch``'s row positions ``positions`` (positions at
        or past the epoch's end: the first rows again, as padding)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return positions.reshape(-1)
        rows = self._rows
        flat = positions.reshape(-1)
        first, last = int(flat.min()), int(flat.max())
        base = self._one_window(epoch, first, last)
        if base is not None:  # one window: the usual
            return flat + base
        with rows._lock:  # the windows the positions reach, packed; then one walk holds all
            rows._locate(epoch, first)
            rows._locate(epoch, last)
            walk = rows._walk(epoch)
            starts = np.array(walk.starts, np.int64)
            total = walk.total
        inside = flat < (starts[-1] if total is None else total)
        w = np.searchsorted(starts, flat[inside], side="right") - 1
        ids = np.empty(flat.shape[0], np.int64)
        ids[inside] = ((epoch << (_ROW_BITS + _WINDOW_BITS)) | ((walk.first + w) << _ROW_BITS)
                       | (flat[inside] - starts[w]))
        for i in np.flatnonzero(~inside).tolist():  # pads the last step: the first rows again
            pw, pr = self._wrap(epoch, int(flat[i]) - (total or 0))
            ids[i] = (epoch << (_ROW_BITS + _WINDOW_BITS)) | (pw << _ROW_BITS) | pr
        return ids

    def rank_indices(self, epoch: int, consumed: int, rank: int,
                     steps: int = 1) -> npt.NDArray[np.int64]:
        rank = self.check_rank(rank)
        count = steps * self.batch_size
        first = int(consumed) + rank
        base = self._one_window(epoch, first, first + self.world_size * (count - 1))
        if base is not None:  # the usual: no reduction, one add
            return (self._strides(count) + (base + first)).reshape(steps, self.batch_size)
        positions = first + self._strides(count)
        return self._row_ids(epoch, positions).reshape(steps, self.batch_size)

    def _strides(self, count: int) -> npt.NDArray[np.int64]:
        """``world_size * arange(count)``, read-only, made once per count."""
        known = self._cached.get(count)
        if known is None:
            known = self.world_size * np.arange(count, dtype=np.int64)
            known.flags.writeable = False
            self._cached[count] = known
        return known

    @functools.cached_property
    def _cached(self) -> dict[Any, npt.NDArray[Any]]:
        return {}

    def _one_window(self, epoch: int, first: int, last: int) -> int | None:
        """``id - position`` for every row position in ``[first, last]`` when
        they lie in one window the epoch's walk has packed, else None."""
        walk = self._rows._walks.get(epoch)  # a walk's starts only grow: read without the lock
        if walk is None or first < walk.starts[0] or last >= walk.starts[-1]:
            return None
        i = bisect.bisect_right(walk.starts, first) - 1
        if i + 1 < len(walk.starts) and last >= walk.starts[i + 1]:
            return None
        return ((epoch << (_ROW_BITS + _WINDOW_BITS)) | ((walk.first + i) << _ROW_BITS)) \
            - walk.starts[i]

    def _wrap(self, epoch: int, past: int) -> tuple[int, int]:
        """The row that pads position ``past`` after the epoch's end: row
        ``past % rows`` of the first window that has rows."""
        for w in range(self._rows._windows_per_epoch):
            count = self._rows._window(epoch, w).rows
            if count:
                return w, past % count
        raise ValueError(f"epoch {epoch} has no rows")

    def padding(self, consumed: int, rank: int, epoch: int = 0) -> npt.NDArray[np.bool_]:
        first = int(consumed) + self.check_rank(rank)
        if self.drop_last or self._exists(epoch, first + self.world_size * (self.batch_size - 1)):
            none = self._cached.get("none")
            if none is None:  # read-only: one array for every full step
                none = self._cached["none"] = np.zeros(self.batch_size, np.bool_)
                none.flags.writeable = False
            return none
        return first + self._strides(self.batch_size) >= self._total(epoch)

    def indices(self, epoch: int, consumed: int, rank: int
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        return (self.rank_indices(epoch, consumed, rank)[0],
                self.padding(consumed, rank, epoch))

    def iter_rank_steps(self, rank: int, epoch: int, consumed: int,
                        epochs: int | None) -> Iterator[Planned]:
        rank = self.check_rank(rank)
        last = None if epochs is None else epoch + epochs
        while last is None or epoch < last:
            if not self.has_step(0, epoch):
                return
            while self.has_step(consumed, epoch):
                following = self.after(epoch, consumed)
                yield ((epoch, consumed), following,
                       self.rank_indices(epoch, consumed, rank)[0],
                       self.padding(consumed, rank, epoch))
                if following[0] != epoch:
                    break
                consumed = following[1]
            epoch, consumed = epoch + 1, 0

    def cursor_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        if consumed == 0:
            return {"window_documents": 0, "window_rows": 0}
        rows = self._rows
        where = rows._locate(epoch, consumed)
        if where is None:  # the epoch's end
            return {"window_documents": rows._documents, "window_rows": 0}
        w, r = where
        return {"window_documents": w * rows.window, "window_rows": r}

    def restore_cursor(self, epoch: int, consumed: int, state: dict[str, Any]) -> None:
        documents, rows = state.get("window_documents"), state.get("window_rows")
        for name, value in (("window_documents", documents), ("window_rows", rows)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"state has {name}={value!r}; a packed loader's state "
                                 "needs ints there (is it from another source?)")
        assert isinstance(documents, int) and isinstance(rows, int)
        if documents == self._rows._documents and rows == 0:  # the epoch's end
            self._rows._anchor(epoch, documents, 0, consumed)
        else:
            self._rows._anchor(epoch, documents, rows, consumed)
