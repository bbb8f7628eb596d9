"""``StreamWriter``: write documents into a token-stream dataset folder."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from zerobatch.storage.publish import Publisher, publisher
from zerobatch.stream.manifest import (
    DOCS,
    DOCUMENT_KIND,
    MANIFEST,
    META_DATA,
    META_ID,
    META_INDEX,
    META_SPANS,
    NO_METADATA,
    OFFSET_DTYPE,
    SPAN_DTYPE,
    SPAN_FIELDS,
    SPAN_KIND,
    SPANS_VERSION,
    TOKEN,
    TOKEN_DTYPES,
    TOKENS,
    Manifest,
    Shard,
    Tokenizer,
    record_dtype,
    shard_name,
    write_manifest,
)
from zerobatch.stream.serializers import get_serializer, serializer_name

__all__ = ["DEFAULT_SHARD_TOKENS", "StreamWriter", "take_output"]

_LEFTOVER = re.compile(
    r"^\.?\d{5,}\.(tokens|docs|meta\.index|meta\.data|meta\.spans)(\.\d+\.[0-9a-f]+\.tmp)?$"
    r"|^\.manifest\.json\.\d+\.[0-9a-f]+\.tmp$"
)



def take_output(out: Publisher) -> None:
    """Claim ``out`` for one writer and remove what a dead writer left there:
    shard files and temporary files of a dataset whose manifest was never
    written (other names are left alone). Raises ``FileExistsError`` when a
    live writer holds ``out`` or it holds a dataset; ``out`` is closed then.
    StreamWriter and ``combine`` start here, so a rerun after a kill completes.
    """
    try:
        out.claim()
        names = out.names()
        if MANIFEST in names:
            raise FileExistsError(f"{out.location} already holds a dataset ({MANIFEST})")
        for name in names:  # a dead writer's files: its manifest was never written
            if _LEFTOVER.match(name):
                out.remove(name)
    except BaseException:
        out.close()
        raise


DEFAULT_SHARD_TOKENS = 1 << 28
_FLUSH_BYTES = 8 << 20


class _ShardBuilder:
    """Buffers one shard's records, document offsets and metadata entries."""

    def __init__(self, out: Publisher, number: int, metadata: bool) -> None:
        self.name = shard_name(number)
        self.tokens = out.file(f"{self.name}.{TOKENS}")
        self.meta = out.file(f"{self.name}.{META_DATA}") if metadata else None
        self.spans = out.file(f"{self.name}.{META_SPANS}") if metadata else None
        self.pending: list[np.ndarray] = []
        self.pending_bytes = 0
        self.records = 0
        self.doc_offsets = [0]
        self.meta_offsets = [0]

    def add(self, records: np.ndarray) -> None:
        self.pending.append(records)
        self.pending_bytes += records.nbytes
        self.records += records.shape[0]
        self.doc_offsets.append(self.records)
        if self.pending_bytes >= _FLUSH_BYTES:
            self.flush()

    def add_entries(self, rows: np.ndarray, blobs: list[bytes]) -> None:
        """Append entries: ``rows`` (``[k, SPAN_FIELDS]``, document coordinates)
        and their serialized values; call before ``add`` of their document."""
        assert self.meta is not None and self.spans is not None
        for blob in blobs:
            self.meta.write(blob)
            self.meta_offsets.append(self.meta.size)
        if rows.shape[0]:
            shifted = rows.astype(SPAN_DTYPE)
            shifted[:, :2] += self.records
            self.spans.write(shifted)

    def flush(self) -> None:
        if self.pending:
            self.tokens.write(np.concatenate(self.pending))
            self.pending, self.pending_bytes = [], 0

    def commit(self, out: Publisher) -> Shard:
        self.flush()
        files = {TOKENS: self.tokens.commit()}
        docs = out.file(f"{self.name}.{DOCS}")
        docs.write(np.asarray(self.doc_offsets, dtype=OFFSET_DTYPE))
        files[DOCS] = docs.commit()
        entries = None
        if self.meta is not None and self.spans is not None:
            index = out.file(f"{self.name}.{META_INDEX}")
            index.write(np.asarray(self.meta_offsets, dtype=OFFSET_DTYPE))
            files[META_INDEX] = index.commit()
            files[META_DATA] = self.meta.commit()
            files[META_SPANS] = self.spans.commit()
            entries = len(self.meta_offsets) - 1
        return Shard(self.name, self.records, len(self.doc_offsets) - 1, entries, files)

    def abort(self) -> None:
        self.tokens.abort()
        if self.meta is not None and self.spans is not None:
            self.meta.abort()
            self.spans.abort()


def _check_fields(fields: Mapping[str, Any] | None) -> dict[str, np.dtype]:
    out: dict[str, np.dtype] = {}
    for name, spec in (fields or {}).items():
        if not isinstance(name, str) or not name.isidentifier() or name in (TOKEN, META_ID):
            raise ValueError(f"fields: {name!r} is not a usable field name")
        dtype = np.dtype(spec)
        if dtype.kind not in "iufb" or dtype.names is not None or dtype.shape:
            raise ValueError(f"fields: {name!r} must be a scalar numeric dtype, got {dtype}")
        out[name] = dtype.newbyteorder("<")
    return out


def _check_tokenizer(tokenizer: Tokenizer | Mapping[str, Any] | None) -> Tokenizer | None:
    if tokenizer is None or isinstance(tokenizer, Tokenizer):
        return tokenizer
    unknown = set(tokenizer) - {"name", "vocab_size", "eos_id", "bos_id"}
    if unknown:
        raise ValueError(f"tokenizer: unknown keys {sorted(unknown)}")
    return Tokenizer(**tokenizer)


def _meta_ids(rows: np.ndarray, n: int, first: int) -> np.ndarray:
    """Each token's ``meta_id``: the smallest id of the entries (``rows`` in
    stored order, ids from ``first``) covering it, or ``NO_METADATA``.

    Entries sorted by start: entry ``k`` is the smallest covering the tokens
    from ``max(start_k, the furthest end of entries before k)`` to its end.
    O(tokens + entries).
    """
    ids = np.full(n, NO_METADATA, dtype=np.uint32)
    reach = 0
    for k, (start, end) in enumerate(rows[:, :2].tolist()):
        if end > reach:
            ids[max(start, reach):end] = first + k
            reach = end
    return ids


class StreamWriter:
    """Write documents into a new token-stream dataset folder (see ``manifest``).

    Args:
        path: the output folder or prefix URL; created if missing, and refused
            if it already holds a manifest.
        token_dtype: ``"<u2"`` (ids below 65,536) or ``"<u4"``.
        fields: per-token fields, name -> dtype (``{"loss_mask": "u1"}``).
        metadata: the span-metadata serializer: ``"msgpack"``, ``"json"``,
            ``"bytes"``, ``"numpy"``, ``"pickle"`` (by name only), or an object
            with ``dumps``/``loads``. None: the dataset has no metadata.
        shard_tokens: a shard is closed before a document would take it past
            this many tokens (records); a longer document gets a shard alone.
        tokenizer: a ``Tokenizer`` or a dict of its fields, for the manifest.
        storage_options: for an object-store URL ``path`` (``s3://``, ``gs://``,
            ``az://``), obstore's options (see ``zerobatch.storage.open_storage``).

    Files are published through ``zerobatch.storage.publish``: locally under a
    temporary name, fsynced and renamed; to an object store staged on local
    disk and uploaded as each shard closes, while the next is written. The
    manifest goes last, on ``close()``, after every file is published. After
    an exception inside ``with``, the writer removes what it wrote and writes
    no manifest. A writer that was killed leaves shard files and no manifest;
    the next writer to the same place removes them (a local folder is locked
    while a writer is alive, so a live writer's files are never taken).
    Not thread-safe.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        token_dtype: str = "<u2",
        fields: Mapping[str, Any] | None = None,
        metadata: Any = None,
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        tokenizer: Tokenizer | Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if np.dtype(token_dtype).str not in TOKEN_DTYPES:
            raise ValueError(f"token_dtype must be one of {TOKEN_DTYPES}, got {token_dtype!r}")
        if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
            raise ValueError(f"shard_tokens must be a positive int, got {shard_tokens!r}")
        self._fields = _check_fields(fields)
        self._serializer = None if metadata is None else get_serializer(metadata)
        self._tokenizer = _check_tokenizer(tokenizer)
        self._dtype, self._token_field = record_dtype(
            np.dtype(token_dtype).str, self._fields, metadata=self._serializer is not None
        )
        self._limit = int(np.iinfo(np.dtype(token_dtype)).max)
        vocab = self._tokenizer.vocab_size if self._tokenizer else None
        if vocab is not None:
            if vocab - 1 > self._limit:
                raise ValueError(f"tokenizer vocab_size {vocab} does not fit token_dtype "
                                 f"{token_dtype}; use '<u4'")
            self._limit = vocab - 1
        self._shard_tokens = shard_tokens
        self._out = publisher(path, **(storage_options or {}))
        take_output(self._out)
        self._shards: list[Shard] = []
        self._current: _ShardBuilder | None = None
        self._documents = 0
        self._closed = False

    @property
    def path(self) -> str | Path:
        """The output folder (a ``Path``) or prefix URL (a ``str``)."""
        return self._out.location

    @property
    def record_dtype(self) -> np.dtype:
        """The dtype of one stored record."""
        return self._dtype

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def add_document(
        self,
        tokens: Any,
        *,
        metadata: Any = None,
        spans: Sequence[tuple[int, int, Any]] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> int:
        """Append one document; returns its global id (0, 1, …).

        ``metadata`` is the document's own metadata (None: none); ``spans`` are
        any number of annotations ``(start, end, value)`` in the document's
        token coordinates, ``0 <= start < end <= len(tokens)``, which may
        overlap and nest. Both may be given. ``fields`` maps field names to
        per-token arrays; omitted fields are zero.
        """
        if self._closed:
            raise ValueError("the writer is closed")
        ids = self._check_tokens(tokens)
        n = ids.shape[0]
        records = np.zeros(n, dtype=self._dtype)
        if self._token_field is None:
            records[:] = ids
        else:
            records[TOKEN] = ids
        for name, values in self._check_doc_fields(fields, n).items():
            records[name] = values
        rows, values = self._check_metadata(metadata, spans, n)
        builder = self._builder_for(n, len(values))
        if self._serializer is not None:
            records[META_ID] = _meta_ids(rows, n, len(builder.meta_offsets) - 1)
            builder.add_entries(rows, [self._serializer.dumps(v) for v in values])
        builder.add(records)
        self._documents += 1
        return self._documents - 1

    def _check_tokens(self, tokens: Any) -> np.ndarray:
        array = np.asarray(tokens)
        if array.ndim != 1 or array.shape[0] == 0:
            raise ValueError(f"tokens must be a non-empty 1-D sequence, got shape {array.shape}")
        if array.dtype.kind not in "iu":
            raise TypeError(f"tokens must be integers, got dtype {array.dtype}")
        low, high = int(array.min()), int(array.max())
        if low < 0 or high > self._limit:
            raise ValueError(f"tokens must be in [0, {self._limit}] for this dataset, "
                             f"found {low if low < 0 else high}")
        return array

    def _check_doc_fields(self, fields: Mapping[str, Any] | None, n: int) -> dict[str, Any]:
        given = dict(fields or {})
        unknown = set(given) - set(self._fields)
        if unknown:
            raise ValueError(f"fields: unknown {sorted(unknown)}; the writer has "
                             f"{sorted(self._fields)}")
        for name, values in given.items():
            array = np.asarray(values)
            if array.shape != (n,):
                raise ValueError(f"fields[{name!r}] must have shape ({n},), got {array.shape}")
            target = self._fields[name]
            if target.kind in "iu" and array.dtype.kind in "iub" and array.size:
                info = np.iinfo(target)
                if int(array.min()) < info.min or int(array.max()) > info.max:
                    raise ValueError(f"fields[{name!r}] has values outside {target}")
            given[name] = array
        return given

    def _check_metadata(
        self, metadata: Any, spans: Sequence[tuple[int, int, Any]] | None, n: int
    ) -> tuple[np.ndarray, list[Any]]:
        """The document's entries in stored order: rows ``[k, SPAN_FIELDS]``
        (start, end, kind) and their values."""
        if self._serializer is None:
            if metadata is not None or spans:
                raise ValueError("metadata/spans need a writer opened with metadata=...")
            return np.zeros((0, SPAN_FIELDS), np.int64), []
        given: list[tuple[int, int, int, Any]] = []
        if metadata is not None:
            given.append((0, n, DOCUMENT_KIND, metadata))
        for i, span in enumerate(spans or ()):
            try:
                start, end, value = span
            except (TypeError, ValueError):
                raise ValueError(f"spans[{i}] must be (start, end, value)") from None
            if not (isinstance(start, (int, np.integer)) and isinstance(end, (int, np.integer))):
                raise TypeError(f"spans[{i}]: start and end must be ints")
            if not 0 <= start < end <= n:
                raise ValueError(f"spans[{i}] = ({start}, {end}) must satisfy "
                                 f"0 <= start < end <= {n} (the document's length)")
            given.append((int(start), int(end), SPAN_KIND, value))
        given.sort(key=lambda e: (e[0], -e[2], -e[1]))  # stable: ties keep input order
        rows = np.array([e[:3] for e in given], dtype=np.int64).reshape(-1, SPAN_FIELDS)
        return rows, [e[3] for e in given]

    def _builder_for(self, n: int, entries: int) -> _ShardBuilder:
        current = self._current
        if current is not None and (
            current.records + n > self._shard_tokens
            or len(current.meta_offsets) + entries > NO_METADATA
        ):
            self._shards.append(current.commit(self._out))
            current = None
        if current is None:
            current = _ShardBuilder(self._out, len(self._shards), self._serializer is not None)
            self._current = current
        return current

    def close(self) -> None:
        """Finish the last shard and write the manifest; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._shards.append(self._current.commit(self._out))
            self._current = None
        name = None if self._serializer is None else serializer_name(self._serializer)
        try:
            self._out.wait()  # every shard is published before the manifest names it
            write_manifest(self._out, Manifest(
                self._dtype, self._token_field, name, self._tokenizer, tuple(self._shards),
                1 if name is None else SPANS_VERSION,
            ))
        finally:
            self._out.close()

    def abort(self) -> None:
        """Remove every file written so far and write no manifest; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._current.abort()
            self._current = None
        try:
            with contextlib.suppress(OSError):
                self._out.wait()
            for shard in self._shards:
                for suffix in shard.files:
                    self._out.remove(shard.file(suffix))
        finally:
            self._out.close()
