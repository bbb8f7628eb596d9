"""``verify`` and ``describe``: check a dataset folder in one pass; summarize it."""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from zerobatch._text import format_table
from zerobatch.errors import FormatError
from zerobatch.storage import is_url, local_path, open_storage
from zerobatch.stream import validate
from zerobatch.stream.manifest import (
    DOCS,
    META_DATA,
    META_ID,
    META_INDEX,
    META_SPANS,
    OFFSET_DTYPE,
    SPAN_DTYPE,
    SPAN_FIELDS,
    TOKENS,
    Manifest,
    Shard,
    check_sizes,
    read_manifest,
)
from zerobatch.stream.serializers import BUILTIN, get_serializer

__all__ = ["Problem", "describe", "format_problems", "verify"]

_CHUNK = validate.CHUNK  # bytes per step of a checksum, to bound memory


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one file of a dataset."""

    path: str | Path
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.field}: {self.message}"


def _digest(path: Path) -> str:
    hasher = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as file:
        buffer = bytearray(max(1, min(_CHUNK, os.fstat(file.fileno()).st_size)))
        view = memoryview(buffer)
        while got := file.readinto(buffer):
            hasher.update(view[:got])
    return hasher.hexdigest()


def _check_entries(folder: Path, shard: Shard, serializer: Any) -> str | None:
    index = np.fromfile(folder / shard.file(META_INDEX), dtype=OFFSET_DTYPE).tolist()
    path = folder / shard.file(META_DATA)
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) \
            if path.stat().st_size else contextlib.nullcontext(b"") as data:
        view = memoryview(data)
        try:
            for k in range(len(index) - 1):
                try:
                    serializer.loads(view[index[k] : index[k + 1]])
                except Exception as error:
                    return f"entry {k} does not decode ({type(error).__name__}: {error})"
        finally:
            view.release()
    return None


def _check_shard(folder: Path, manifest: Manifest, i: int, serializer: Any) -> list[Problem]:
    shard = manifest.shards[i]
    problems: list[Problem] = []

    def note(suffix: str, field: str, message: str | None) -> None:
        if message is not None:
            problems.append(Problem(folder / shard.file(suffix), field, message))

    for suffix, (_, digest) in shard.files.items():
        actual = _digest(folder / shard.file(suffix))
        note(suffix, "xxh3_64", None if actual == digest else
             f"checksum {actual} differs from the manifest's {digest}")
    docs = np.fromfile(folder / shard.file(DOCS), dtype=OFFSET_DTYPE)
    note(DOCS, "offsets", validate.docs_table(shard, docs)
         or validate.offsets(docs, 0, shard.records, strict=True))
    records = np.memmap(folder / shard.file(TOKENS), dtype=manifest.record_dtype, mode="r") \
        if shard.records else np.zeros(0, manifest.record_dtype)
    vocab = manifest.tokenizer.vocab_size if manifest.tokenizer else None
    tokens = records if manifest.token_field is None else records[manifest.token_field]
    if vocab is not None and tokens.size and int(tokens.max()) >= vocab:
        note(TOKENS, "token", f"token {int(tokens.max())} is not below vocab_size {vocab}")
    if shard.metadata_entries is not None:
        size = shard.files[META_DATA][0]
        index = np.fromfile(folder / shard.file(META_INDEX), dtype=OFFSET_DTYPE)
        note(META_INDEX, "offsets", validate.index_table(shard, index)
             or validate.offsets(index, 0, size, strict=False))
        sound = not any(p.field == "offsets" for p in problems)
        if sound and manifest.has_spans_table:
            rows = np.fromfile(folder / shard.file(META_SPANS), dtype=SPAN_DTYPE)
            problem = validate.spans_table(shard, rows) \
                or validate.span_rows(rows, docs, shard.records)
            note(META_SPANS, "rows", problem)
            if problem is None:
                note(TOKENS, META_ID, validate.covering_ids(records, rows.reshape(-1, SPAN_FIELDS)))
        elif sound:
            note(TOKENS, META_ID, validate.run_ids(records, docs, shard.metadata_entries))
        if sound and serializer is not None:
            note(META_DATA, "entries", _check_entries(folder, shard, serializer))
    return problems


def verify(
    path: str | os.PathLike[str], *, metadata: Any = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Problem]:
    """Check a dataset folder or prefix URL (``storage_options`` as for
    ``zerobatch.storage.open_storage``): manifest, sizes, checksums, offsets,
    metadata ids and (for built-in serializers other than pickle, or the
    ``metadata`` serializer passed) that every entry decodes. One pass over
    every byte; a remote shard is downloaded to a temporary folder first.

    Returns the problems found (an empty list: the dataset is sound).
    """
    remote = is_url(path)
    folder: str | Path = str(path) if remote else local_path(path)
    storage = open_storage(folder, **(storage_options or {}))
    try:
        try:
            manifest = read_manifest(folder, storage if remote else None)
            check_sizes(folder, manifest, storage.size)
        except FormatError as error:
            where = error.path or folder
            prefix = f"{error.path}: field {error.field!r}: " if error.path and error.field else ""
            return [Problem(where, error.field or "manifest", str(error).removeprefix(prefix))]
        except OSError as error:
            return [Problem(folder, "manifest", str(error))]
        serializer = None
        if manifest.metadata in BUILTIN and manifest.metadata != "pickle":
            serializer = get_serializer(manifest.metadata)
        elif metadata is not None:
            serializer = get_serializer(metadata)
        problems: list[Problem] = []
        for i in range(len(manifest.shards)):
            if isinstance(folder, Path):
                problems.extend(_check_shard(folder, manifest, i, serializer))
                continue
            with tempfile.TemporaryDirectory(prefix="zerobatch-verify-") as tmp:
                for suffix in manifest.shards[i].files:
                    name = manifest.shards[i].file(suffix)
                    storage.download(name, Path(tmp) / name)
                problems.extend(Problem(f"{folder}/{Path(p.path).name}", p.field, p.message)
                                for p in _check_shard(Path(tmp), manifest, i, serializer))
        return problems
    finally:
        storage.close()


def format_problems(path: str | os.PathLike[str], problems: list[Problem]) -> str:
    """A report for people: ``OK`` or one line per problem."""
    if not problems:
        return f"{path}: OK"
    lines = [f"{path}: {len(problems)} problem(s)"]
    lines.extend(f"  {problem}" for problem in problems)
    return "\n".join(lines)


def describe(
    path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> str:
    """A table describing a dataset folder or prefix URL, from its manifest alone."""
    if is_url(path):
        storage = open_storage(path, **(storage_options or {}))
        try:
            manifest = read_manifest(str(path), storage)
        finally:
            storage.close()
    else:
        manifest = read_manifest(local_path(path))
    shards = manifest.shards
    tok = manifest.tokenizer
    rows = [
        ("format", f"token-stream dataset, version {manifest.version}"),
        ("record dtype", str(manifest.record_dtype)),
        ("token dtype", manifest.token_dtype.str),
        ("fields", ", ".join(manifest.fields) or "-"),
        ("metadata", manifest.metadata or "-"),
        ("tokenizer", "-" if tok is None else
         f"{tok.name} (vocab {tok.vocab_size}, eos {tok.eos_id}, bos {tok.bos_id})"),
        ("shards", str(len(shards))),
        ("tokens", f"{sum(s.records for s in shards):,}"),
        ("documents", f"{sum(s.documents for s in shards):,}"),
        ("metadata entries", f"{sum(s.metadata_entries or 0 for s in shards):,}"),
        ("bytes", f"{sum(b for s in shards for b, _ in s.files.values()):,}"),
    ]
    return format_table(rows)
