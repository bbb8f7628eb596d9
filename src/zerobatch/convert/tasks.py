"""One ``convert`` task: read its records, tokenize them in batches, write a
token-stream dataset of its own. Runs in a worker process (or a Dask worker).

The task writes into a temporary folder and renames it when complete, so a
task folder that exists is finished; a rerun skips it.

Metadata. ``metadata_fields`` become the document's own metadata, the map
``{field: value}``. With ``spans_field``, each document's character
annotations ``{start, end, value}`` are mapped to the tokens whose offset
ranges overlap them and stored as the writer's spans, overlapping and nested
as given, each with its own value.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from zerobatch.convert.encoders import BYTES, Encoded, EncoderSpec, token_dtype
from zerobatch.convert.inputs import Record, Task, read_records
from zerobatch.errors import FormatError
from zerobatch.stream.writer import StreamWriter

__all__ = ["Job", "TaskStats", "map_spans", "run_task"]

STATS = "convert-stats.json"
_BATCH_DOCS = 512
_BATCH_CHARS = 4 << 20


@dataclass(frozen=True)
class Job:
    """Everything a worker needs to convert one task (picklable, small)."""

    task: Task
    folder: str
    encoder: EncoderSpec
    text_field: str
    metadata_fields: tuple[str, ...]
    spans_field: str | None
    append_eos: bool
    skip_bad: bool
    shard_tokens: int
    storage_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class TaskStats:
    """What one task did: counts of documents, tokens and input bytes."""

    documents: int = 0
    tokens: int = 0
    input_bytes: int = 0
    skipped_bad: int = 0
    skipped_empty: int = 0

    def add(self, other: TaskStats) -> None:
        """Accumulate ``other`` into this."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass(frozen=True)
class _Doc:
    text: str
    metadata: dict[str, Any] | None
    spans: list[tuple[int, int, Any]] | None


def map_spans(
    spans: list[tuple[int, int, Any]], encoded: Encoded
) -> list[tuple[int, int, Any]]:
    """Character spans -> token spans: the tokens whose ``[start, end)``
    character range overlaps the span. Spans that cover no token are dropped."""
    out = []
    for start, end, value in spans:
        hit = np.flatnonzero((encoded.starts < end) & (encoded.ends > start))
        if hit.size:
            out.append((int(hit[0]), int(hit[-1]) + 1, value))
    return out


def _check_spans(raw: Any, length: int) -> list[tuple[int, int, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"expected a list of {{start, end, value}}, found {type(raw).__name__}")
    spans = []
    for i, span in enumerate(raw):
        if not isinstance(span, dict) or not {"start", "end"} <= set(span):
            raise ValueError(f"span {i} must be an object with start, end and value")
        start, end = span["start"], span["end"]
        if not (isinstance(start, int) and isinstance(end, int)) or isinstance(start, bool):
            raise ValueError(f"span {i}: start and end must be integers")
        if end <= start:
            raise ValueError(f"span {i} = [{start}, {end}) ends before it starts")
        if start < 0 or end > length:
            raise ValueError(f"span {i} = [{start}, {end}) lies outside the text "
                             f"({length} characters)")
        spans.append((start, end, span.get("value")))
    return spans


def _document(record: Record, job: Job) -> _Doc:
    """The text, document metadata and spans of a parsed record (ValueError if bad)."""
    fields = record.fields
    assert fields is not None
    text = fields.get(job.text_field)
    if text is None:
        raise ValueError(f"missing text field {job.text_field!r}")
    if not isinstance(text, str):
        raise ValueError(f"text field {job.text_field!r} is {type(text).__name__}, not a string")
    metadata = {name: fields.get(name) for name in job.metadata_fields} \
        if job.metadata_fields else None
    spans = None
    if job.spans_field is not None:
        spans = _check_spans(fields.get(job.spans_field), len(text))
    if metadata or spans:
        _check_storable(metadata, spans)
    return _Doc(text, metadata, spans)


def _check_storable(metadata: dict[str, Any] | None,
                    spans: list[tuple[int, int, Any]] | None) -> None:
    """ValueError unless msgpack (the dataset's serializer) can store the
    metadata and span values: integers must fit 64 bits, strings UTF-8."""
    try:
        msgpack.packb([metadata, [value for _, _, value in spans or ()]], use_bin_type=True)
    except (OverflowError, ValueError, TypeError) as error:
        raise ValueError(f"metadata cannot be stored ({type(error).__name__}: {error}): "
                         "integers must fit in 64 bits") from None


def _files(paths: tuple[str, ...]) -> str:
    """``a.jsonl`` or ``a.jsonl and 3 more files``, for messages."""
    more = f" and {len(paths) - 1} more files" if len(paths) > 1 else ""
    return f"{paths[0]}{more}"


def _batches(records: Iterator[Record], job: Job, stats: TaskStats) -> Iterator[list[_Doc]]:
    """Documents in batches of at most ``_BATCH_DOCS`` or ``_BATCH_CHARS``;
    bad records raise ``FormatError`` or, with ``skip_bad``, are counted."""
    batch: list[_Doc] = []
    chars = 0
    for record in records:
        stats.input_bytes += record.nbytes
        try:
            if record.fields is None:
                raise ValueError(record.problem)
            doc = _document(record, job)
        except ValueError as error:
            if job.skip_bad:
                stats.skipped_bad += 1
                continue
            raise FormatError(f"{error}; fix it, or pass skip_bad=True (--skip-bad) to count "
                              "and skip such records", path=record.path,
                              field=record.location(job.storage_options) or None) from None
        if not doc.text:
            stats.skipped_empty += 1
            continue
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= _BATCH_DOCS or chars >= _BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _write(writer: StreamWriter, doc: _Doc, encoded: Encoded, eos: int | None) -> int:
    ids: npt.NDArray[np.int64] = encoded.ids
    if eos is not None:
        ids = np.append(ids, eos)
    if ids.shape[0] == 0:
        return 0
    spans = map_spans(doc.spans, encoded) if doc.spans else None
    writer.add_document(ids, metadata=doc.metadata, spans=spans)
    return int(ids.shape[0])


def run_task(job: Job) -> TaskStats:
    """Convert ``job.task`` into the dataset folder ``job.folder``; returns its
    counts. Skips the work if the folder already exists (a finished task)."""
    final = Path(job.folder)
    if (final / STATS).is_file():
        return TaskStats(**json.loads((final / STATS).read_text()))
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    encoder = job.encoder.build()
    facts = encoder.facts
    eos = facts.eos_id if job.append_eos else None
    if job.append_eos and eos is None:
        raise ValueError("append_eos needs an end-of-document token; the tokenizer has none "
                         "of the usual names, pass eos= (an id or token)")
    stats = TaskStats()
    meta = job.spans_field is not None or bool(job.metadata_fields)
    assert facts.vocab_size is not None
    try:
        with StreamWriter(tmp, token_dtype=token_dtype(facts.vocab_size),
                          metadata="msgpack" if meta else None,
                          shard_tokens=job.shard_tokens, tokenizer=facts) as writer:
            records = read_records(job.task, job.text_field, job.storage_options)
            for batch in _batches(records, job, stats):
                try:
                    encoded = encoder.encode([doc.text for doc in batch],
                                             offsets=job.spans_field is not None)
                except Exception as error:  # tokenizers raises bare Exceptions
                    raise FormatError(
                        f"the tokenizer {facts.name!r} failed on documents of "
                        f"{_files(job.task.paths)} ({error}); check or replace it",
                        path=job.encoder.path or BYTES, field="tokenizer") from None
                for doc, enc in zip(batch, encoded, strict=True):
                    written = _write(writer, doc, enc, eos)
                    if written:
                        stats.documents += 1
                        stats.tokens += written
                    else:
                        stats.skipped_empty += 1
        (tmp / STATS).write_text(json.dumps(asdict(stats)))
        try:
            os.replace(tmp, final)
        except OSError:  # the same task finished elsewhere first (an executor's retry)
            if not (final / STATS).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats
