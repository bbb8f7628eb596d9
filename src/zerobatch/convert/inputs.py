"""Inputs for ``convert``: find the files, cut them into tasks, read records.

A task is a unit of work one worker converts alone: a byte range of a plain
JSONL file (whole lines: those that start inside the range), a whole
compressed JSONL file, one Parquet row group, one Arrow file (a Hugging Face
``save_to_disk`` folder holds those), or a run of text files (one document
per file). Tasks depend only on the paths and sizes of the inputs, so the
plan, and the dataset, are the same for any number of workers.

Inputs may be object-store URLs (``s3://``, ``gs://``, ``az://``): an object, a
prefix (every known file under it, at any depth), or a glob over the keys
under the prefix before its first wildcard (``*`` also matches ``/``). They
are read by range GETs (plain JSONL byte ranges and Parquet row groups read
only their bytes), through ``zerobatch.storage`` with ``storage_options``.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from zerobatch.errors import FormatError
from zerobatch.storage import is_url, open_storage

__all__ = ["InputFile", "Record", "Task", "expand_inputs", "open_input", "plan_tasks",
           "read_records"]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".text")
_READ_CHUNK = 1 << 20
_GET_BYTES = 8 << 20  # bytes per range GET when reading an object in order


@dataclass(frozen=True)
class InputFile:
    """One input file: a local path or an object URL, and its size in bytes."""

    location: str
    size: int


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

    def location(self, storage_options: Mapping[str, Any] | None = None) -> str:
        """Where the record is, for messages: ``line 12``, ``row group 0, row 3``
        (``storage_options`` to count lines in an object)."""
        if self.where or self.offset < 0:
            return self.where
        return f"line {_line_number(self.path, self.offset, storage_options)}"


def _kind(path: Path | str) -> str | None:
    name = (path.name if isinstance(path, Path) else path.rsplit("/", 1)[-1]).lower()
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


class _ObjectFile(io.RawIOBase):
    """One object, read by range GETs: a seekable raw binary file."""

    def __init__(self, url: str, options: Mapping[str, Any]) -> None:
        parent, name = url.rsplit("/", 1)
        self._storage = open_storage(parent, **options)
        try:
            self._handle = self._storage.open(name)
            self._size = self._storage.size(name)
        except BaseException:
            self._storage.close()
            raise
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        got = int(self._storage.readinto(self._handle, self._position, memoryview(buffer)))
        self._position += got
        return got

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        if not self.closed:
            self._storage.close()
        super().close()


def open_input(location: str, storage_options: Mapping[str, Any] | None = None) -> IO[bytes]:
    """``location`` (a path or an object URL) opened for binary reading, seekable."""
    if is_url(location):
        raw = _ObjectFile(location, storage_options or {})
        return io.BufferedReader(raw, buffer_size=_GET_BYTES)
    return open(location, "rb")


def _walk(url: str, options: Mapping[str, Any]) -> dict[str, int]:
    storage = open_storage(url, **options)
    try:
        return dict(storage.walk())
    finally:
        storage.close()


def _remote_files(url: str, options: Mapping[str, Any]) -> list[InputFile]:
    """The known files named by an object URL: a glob, a prefix or one object."""
    if glob.has_magic(url):
        head = url[:min(url.index(c) for c in "*?[" if c in url)]
        base = head[:head.rindex("/")]
        pattern = url[len(base) + 1:]
        listed = _walk(base, options)
        return [InputFile(f"{base}/{name}", size) for name, size in sorted(listed.items())
                if fnmatch.fnmatchcase(name, pattern) and _kind(name) is not None]
    base = url.rstrip("/")
    listed = _walk(base, options)
    if listed:
        return [InputFile(f"{base}/{name}", size) for name, size in sorted(listed.items())
                if _kind(name) is not None
                and not any(part.startswith(".") for part in name.split("/"))]
    if _kind(base) is None:
        raise FileNotFoundError(f"input {url} holds no file convert can read")
    with open_input(base, options) as file:  # one object: a HEAD, or FileNotFoundError
        return [InputFile(base, file.seek(0, io.SEEK_END))]


def expand_inputs(
    inputs: Any, storage_options: Mapping[str, Any] | None = None
) -> list[InputFile]:
    """The files named by ``inputs``: a path, a glob, a folder (its known files,
    recursively, sorted), an object URL (see the module docstring), a
    ``datasets.Dataset`` (its Arrow cache files), or a list of these. Raises
    ``FileNotFoundError`` naming what matched nothing."""
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    files: list[InputFile] = []
    for item in items:
        cache = getattr(item, "cache_files", None)
        if cache is not None:
            if not cache:
                raise ValueError("an in-memory datasets.Dataset has no files to read; "
                                 "save it with save_to_disk and pass the folder")
            files.extend(_local(Path(c["filename"])) for c in cache)
            continue
        text = os.fspath(item)
        if is_url(text):
            remote = _remote_files(text, storage_options or {})
            if not remote:
                raise FileNotFoundError(f"input {text} holds no file convert can read")
            files.extend(remote)
            continue
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
        files.extend(map(_local, found))
    return files


def _local(path: Path) -> InputFile:
    return InputFile(str(path), path.stat().st_size)


def _parquet_row_groups(path: str, options: Mapping[str, Any]) -> int:
    import pyarrow.parquet as pq

    try:
        with open_input(path, options) as file:
            return int(pq.ParquetFile(file).metadata.num_row_groups)
    except OSError:
        raise
    except Exception as error:
        raise FormatError(f"not a readable Parquet file ({error})", path=path) from None


def plan_tasks(
    files: Sequence[InputFile], task_bytes: int,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Task]:
    """Cut ``files`` into tasks of about ``task_bytes`` input bytes each."""
    tasks: list[Task] = []
    texts: list[str] = []
    text_bytes = 0
    for item in files:
        path = item.location
        kind = _kind(path)
        if kind != "text" and texts:
            tasks.append(Task("text", tuple(texts)))
            texts, text_bytes = [], 0
        if kind == "text":
            texts.append(path)
            text_bytes += item.size
            if text_bytes >= task_bytes:
                tasks.append(Task("text", tuple(texts)))
                texts, text_bytes = [], 0
        elif kind == "jsonl":
            size = item.size
            for start in range(0, max(size, 1), task_bytes):
                tasks.append(Task(kind, (path,), start, min(start + task_bytes, size)))
        elif kind == "parquet":
            for group in range(_parquet_row_groups(path, storage_options or {})):
                tasks.append(Task(kind, (path,), group, group + 1))
        else:
            tasks.append(Task(str(kind), (path,)))
    if texts:
        tasks.append(Task("text", tuple(texts)))
    return tasks


def _line_number(path: str, offset: int, options: Mapping[str, Any] | None) -> int:
    """The 1-based line number of the line starting at byte ``offset``."""
    count = 0
    with open_input(path, options) as file:
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
    except RecursionError:
        return Record(path, where, None, "JSON nested too deeply for Python's parser",
                      len(line))
    if not isinstance(value, dict):
        return Record(path, where, None, f"expected a JSON object, found "
                      f"{type(value).__name__}", len(line))
    return Record(path, where, value, "", len(line))


def _jsonl_range(task: Task, options: Mapping[str, Any]) -> Iterator[Record]:
    path = task.paths[0]
    with open_input(path, options) as file:
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


def _zstd_chunks(raw: IO[bytes]) -> Iterator[bytes]:
    """The decompressed bytes of a zstd file, frame after frame; ``ValueError``
    when it is not zstd, or ends inside a frame (truncated) or holds no frame."""
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    seen = ended = False
    while chunk := raw.read(_READ_CHUNK):
        while chunk:
            seen = True
            try:
                out = frame.decompress(chunk)
            except zstandard.ZstdError as error:
                raise ValueError(f"not zstd, or corrupt ({error})") from None
            if out:
                yield out
            ended = frame.eof
            chunk = frame.unused_data if ended else b""
            if ended:  # another frame may follow (concatenated or multi-threaded output)
                frame = decompressor.decompressobj()
    if not seen:
        raise ValueError("empty: not a zstd stream")
    if not ended:
        raise ValueError("the last zstd frame is cut short: truncated or not fully written")


def _gzip_chunks(raw: IO[bytes]) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file; ``ValueError`` as for zstd."""
    stream = gzip.GzipFile(fileobj=raw, mode="rb")
    seen = bool(raw.read(1))
    if not seen:
        raise ValueError("empty: not a gzip stream")
    raw.seek(0)
    try:
        while out := stream.read(_READ_CHUNK):
            yield out
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"not gzip, truncated or corrupt ({error})") from None


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Lines (each with its newline; the last one may have none) of a byte stream."""
    parts: list[bytes] = []
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            parts.append(chunk[start : end + 1])
            yield b"".join(parts)
            parts = []
            start = end + 1
        if start < len(chunk):
            parts.append(chunk[start:])
    if parts:
        yield b"".join(parts)


def _jsonl_compressed(task: Task, options: Mapping[str, Any]) -> Iterator[Record]:
    """The records of a ``.jsonl.gz`` or ``.jsonl.zst`` file. A file that does
    not decompress to its end yields one bad record after its last whole line
    (a convert fails there, naming the file and line, or counts it with
    ``skip_bad``)."""
    path = task.paths[0]
    with open_input(path, options) as raw:
        number = 0
        chunks = _gzip_chunks(raw) if task.kind == "jsonl.gz" else _zstd_chunks(raw)
        try:
            for line in _lines(chunks):
                number += 1
                if line.strip():
                    yield _parse_line(path, f"line {number}", line)
        except ValueError as error:
            yield Record(path, f"line {number + 1}", None,
                         f"cannot decompress the file from here on: {error}")

def _arrow_rows(path: str, where: str, batches: Iterator[Any]) -> Iterator[Record]:
    row = 0
    for batch in batches:
        for fields in batch.to_pylist():
            yield Record(path, f"{where}row {row}", fields, "", 0)
            row += 1


def _parquet_group(task: Task, options: Mapping[str, Any]) -> Iterator[Record]:
    import pyarrow.parquet as pq

    path = task.paths[0]
    try:
        with open_input(path, options) as file:
            table = pq.ParquetFile(file).read_row_group(task.start)
    except OSError:
        raise
    except Exception as error:
        raise FormatError(f"cannot read row group {task.start} ({error})", path=path,
                          field=f"row group {task.start}") from None
    yield from _arrow_rows(path, f"row group {task.start}, ", iter(table.to_batches(4096)))


def _arrow_file(task: Task, options: Mapping[str, Any]) -> Iterator[Record]:
    import pyarrow as pa

    path = task.paths[0]
    try:
        with pa.PythonFile(open_input(path, options), mode="r") if is_url(path) \
                else pa.memory_map(path) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) \
                if isinstance(reader, pa.ipc.RecordBatchFileReader) else iter(reader)
            yield from _arrow_rows(path, "", batches)
    except pa.ArrowException as error:
        raise FormatError(f"not a readable Arrow file ({error})", path=path) from None


def _text_files(task: Task, text_field: str, options: Mapping[str, Any]) -> Iterator[Record]:
    for path in task.paths:
        with open_input(path, options) as file:
            data = file.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            yield Record(path, "", None, f"bytes that are not UTF-8 ({error.reason} at byte "
                         f"{error.start})", len(data))
            continue
        yield Record(path, "", {text_field: text, "path": path}, "", len(data))


def read_records(
    task: Task, text_field: str, storage_options: Mapping[str, Any] | None = None
) -> Iterator[Record]:
    """The records of ``task`` in file order (objects through
    ``storage_options``). A record that cannot be parsed comes back with
    ``fields`` None and its problem; a file that cannot be read at all raises
    ``FormatError``."""
    options = storage_options or {}
    if task.kind == "jsonl":
        return _jsonl_range(task, options)
    if task.kind in ("jsonl.gz", "jsonl.zst"):
        return _jsonl_compressed(task, options)
    if task.kind == "parquet":
        return _parquet_group(task, options)
    if task.kind == "arrow":
        return _arrow_file(task, options)
    return _text_files(task, text_field, options)
