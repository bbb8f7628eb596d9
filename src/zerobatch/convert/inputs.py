"""Inputs for ``convert``: find the files, cut them into tasks, read records.

A task is a unit of work one worker converts alone: a byte range of a plain
JSONL file (whole lines: those that start inside the range), a whole
compressed JSONL file, one Parquet row group, one Arrow file (a Hugging Face
``save_to_disk`` folder holds those), or a run of text files (one document
per file). Tasks depend only on the paths and sizes of the inputs, so the
plan, and the dataset, are the same for any number of workers.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from zerobatch.errors import FormatError

__all__ = ["Record", "Task", "expand_inputs", "plan_tasks", "read_records"]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".text")
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Task:
    """One unit of work: ``kind`` over ``paths``, with a byte range or row group."""

    kind: str  # "jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow", "text"
    paths: tuple[str, ...]
    start: int = 0
    stop: int = 0

    def to_json(self) -> list[Any]:
        """A JSON form for the resume plan."""
        return [self.kind, list(self.paths), self.start, self.stop]


@dataclass(frozen=True)
class Record:
    """One input record: where it came from (for errors) and its fields, or
    ``fields`` None with ``problem`` saying why it could not be read."""

    path: str
    where: str
    fields: dict[str, Any] | None
    problem: str = ""
    nbytes: int = 0
    offset: int = -1  # the line's byte offset in a plain JSONL file, where ``where`` is ""

    def location(self) -> str:
        """Where the record is, for messages: ``line 12``, ``row group 0, row 3``."""
        if self.where or self.offset < 0:
            return self.where
        return f"line {_line_number(self.path, self.offset)}"


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in JSONL_SUFFIXES:
        for comp, kind in (("", "jsonl"), (".gz", "jsonl.gz"), (".zst", "jsonl.zst")):
            if name.endswith(suffix + comp):
                return kind
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".arrow"):
        return "arrow"
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def _folder_files(folder: Path) -> list[Path]:
    if (folder / "dataset_info.json").is_file() or (folder / "state.json").is_file():
        return sorted(folder.glob("*.arrow"))  # a Hugging Face save_to_disk folder
    return sorted(p for p in folder.rglob("*") if p.is_file() and _kind(p) is not None
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def expand_inputs(inputs: Any) -> list[Path]:
    """The files named by ``inputs``: a path, a glob, a folder (its known files,
    recursively, sorted), a ``datasets.Dataset`` (its Arrow cache files), or a
    list of these. Raises ``FileNotFoundError`` naming what matched nothing."""
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    files: list[Path] = []
    for item in items:
        cache = getattr(item, "cache_files", None)
        if cache is not None:
            if not cache:
                raise ValueError("an in-memory datasets.Dataset has no files to read; "
                                 "save it with save_to_disk and pass the folder")
            files.extend(Path(c["filename"]) for c in cache)
            continue
        text = os.fspath(item)
        if glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(text, recursive=True))
            found = [p for p in matched if p.is_file() and _kind(p) is not None]
        elif Path(text).is_dir():
            found = _folder_files(Path(text))
        elif Path(text).exists():
            if _kind(Path(text)) is None:
                raise FormatError("unknown input type; expected .jsonl[.gz|.zst], .parquet, "
                                  f".arrow or text ({', '.join(TEXT_SUFFIXES)})", path=text)
            found = [Path(text)]
        else:
            raise FileNotFoundError(f"input {text} does not exist")
        if not found:
            raise FileNotFoundError(f"input {text} holds no file convert can read")
        files.extend(found)
    return files


def _parquet_row_groups(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_row_groups)
    except Exception as error:
        raise FormatError(f"not a readable Parquet file ({error})", path=path) from None


def plan_tasks(files: Sequence[Path], task_bytes: int) -> list[Task]:
    """Cut ``files`` into tasks of about ``task_bytes`` input bytes each."""
    tasks: list[Task] = []
    texts: list[str] = []
    text_bytes = 0
    for path in files:
        kind = _kind(path)
        if kind != "text" and texts:
            tasks.append(Task("text", tuple(texts)))
            texts, text_bytes = [], 0
        if kind == "text":
            texts.append(str(path))
            text_bytes += path.stat().st_size
            if text_bytes >= task_bytes:
                tasks.append(Task("text", tuple(texts)))
                texts, text_bytes = [], 0
        elif kind == "jsonl":
            size = path.stat().st_size
            for start in range(0, max(size, 1), task_bytes):
                tasks.append(Task(kind, (str(path),), start, min(start + task_bytes, size)))
        elif kind == "parquet":
            for group in range(_parquet_row_groups(path)):
                tasks.append(Task(kind, (str(path),), group, group + 1))
        else:
            tasks.append(Task(str(kind), (str(path),)))
    if texts:
        tasks.append(Task("text", tuple(texts)))
    return tasks


def _line_number(path: str, offset: int) -> int:
    """The 1-based line number of the line starting at byte ``offset``."""
    count = 0
    with open(path, "rb") as file:
        left = offset
        while left > 0:
            chunk = file.read(min(_READ_CHUNK, left))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count + 1


def _parse_line(path: str, where: str, line: bytes) -> Record:
    try:
        value = json.loads(line)
    except UnicodeDecodeError as error:
        return Record(path, where, None, f"bytes that are not UTF-8 ({error.reason} at "
                      f"byte {error.start})", len(line))
    except ValueError as error:
        return Record(path, where, None, f"malformed JSON ({error})", len(line))
    if not isinstance(value, dict):
        return Record(path, where, None, f"expected a JSON object, found "
                      f"{type(value).__name__}", len(line))
    return Record(path, where, value, "", len(line))


def _jsonl_range(task: Task) -> Iterator[Record]:
    path = task.paths[0]
    with open(path, "rb") as file:
        position = task.start
        if position > 0:  # the line that starts before the range belongs to the previous task
            file.seek(position - 1)
            position += len(file.readline()) - 1
        while position < task.stop:
            line = file.readline()
            if not line:
                break
            start, position = position, position + len(line)
            if not line.strip():
                continue
            record = _parse_line(path, "", line)
            # Lines are counted only when a message needs one (Record.location).
            yield Record(path, "", record.fields, record.problem, len(line), start)


def _open_compressed(task: Task) -> IO[bytes]:
    path = task.paths[0]
    if task.kind == "jsonl.gz":
        return io.BufferedReader(gzip.GzipFile(path, "rb"))
    import zstandard

    raw = open(path, "rb")  # noqa: SIM115 - closed with the reader
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))


def _jsonl_compressed(task: Task) -> Iterator[Record]:
    path = task.paths[0]
    with _open_compressed(task) as file:
        number = 0
        try:
            for line in file:
                number += 1
                if line.strip():
                    record = _parse_line(path, f"line {number}", line)
                    yield record
        except (OSError, EOFError, ValueError) as error:
            if isinstance(error, FormatError):
                raise
            raise FormatError(f"cannot decompress after line {number} ({error})",
                              path=path) from None


def _arrow_rows(path: str, where: str, batches: Iterator[Any]) -> Iterator[Record]:
    row = 0
    for batch in batches:
        for fields in batch.to_pylist():
            yield Record(path, f"{where}row {row}", fields, "", 0)
            row += 1


def _parquet_group(task: Task) -> Iterator[Record]:
    import pyarrow.parquet as pq

    path = task.paths[0]
    try:
        table = pq.ParquetFile(path).read_row_group(task.start)
    except Exception as error:
        raise FormatError(f"cannot read row group {task.start} ({error})", path=path,
                          field=f"row group {task.start}") from None
    yield from _arrow_rows(path, f"row group {task.start}, ", iter(table.to_batches(4096)))


def _arrow_file(task: Task) -> Iterator[Record]:
    import pyarrow as pa

    path = task.paths[0]
    try:
        with pa.memory_map(path) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) \
                if isinstance(reader, pa.ipc.RecordBatchFileReader) else iter(reader)
            yield from _arrow_rows(path, "", batches)
    except pa.ArrowException as error:
        raise FormatError(f"not a readable Arrow file ({error})", path=path) from None


def _text_files(task: Task, text_field: str) -> Iterator[Record]:
    for path in task.paths:
        data = Path(path).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            yield Record(path, "", None, f"bytes that are not UTF-8 ({error.reason} at byte "
                         f"{error.start})", len(data))
            continue
        yield Record(path, "", {text_field: text, "path": path}, "", len(data))


def read_records(task: Task, text_field: str) -> Iterator[Record]:
    """The records of ``task`` in file order. A record that cannot be parsed
    comes back with ``fields`` None and its problem; a file that cannot be
    read at all raises ``FormatError``."""
    if task.kind == "jsonl":
        return _jsonl_range(task)
    if task.kind in ("jsonl.gz", "jsonl.zst"):
        return _jsonl_compressed(task)
    if task.kind == "parquet":
        return _parquet_group(task)
    if task.kind == "arrow":
        return _arrow_file(task)
    return _text_files(task, text_field)
