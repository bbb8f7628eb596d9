"""``verify`` for LLMBATCH files and shard folders: every check, every shard.

Runs the open checks a ``BatchFileReader`` runs (``format.py``'s header and
size checks, ``validate``'s manifest checks), reporting each problem instead
of stopping at the first, then the whole-file checks (``validate``), then
opens the reader itself: ``verify(path) == []`` means every read of the file
succeeds (with ``dtype``'s output, ids in range).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from zerobatch._output_dtype import CASTS, id_bounds, output_dtype
from zerobatch.errors import FormatError
from zerobatch.llmbatch import validate
from zerobatch.llmbatch.format import HEADER_SIZE, MANIFEST_NAME, BatchHeader, load_manifest
from zerobatch.llmbatch.reader import BatchFileReader
from zerobatch.stream.verify import Problem

__all__ = ["verify"]


def _problem(error: FormatError, path: object) -> Problem:
    """The problem a reader's ``FormatError`` names (its message without the
    path and field it starts with)."""
    prefix = f"{error.path}: field {error.field!r}: " if error.path and error.field else ""
    return Problem(error.path if error.path is not None else str(path),
                   error.field or "file", str(error).removeprefix(prefix))


def _shard(path: Path, bounds: np.ndarray, problems: list[Problem]) -> BatchHeader | None:
    """Check one ``.batch`` file whole; its header, or None when it does not open."""
    try:
        with open(path, "rb", buffering=0) as file:
            size = os.fstat(file.fileno()).st_size
            head = file.read(HEADER_SIZE)
            header = BatchHeader.unpack(head, path=path)
            header.check_file_size(size, path=path)
            found = validate.reserved(head)
            with mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as mapping:
                data = np.frombuffer(mapping, np.uint8)
                try:
                    found += validate.padding(data, header)
                    found += validate.token_ids(data, header,
                                                id_bounds(header.token_dtype, bounds.dtype))
                finally:
                    del data
    except FormatError as error:
        problems.append(_problem(error, path))
        return None
    except OSError as error:
        problems.append(Problem(path, "file", f"cannot be read ({error.strerror})"))
        return None
    problems.extend(Problem(path, field, message) for field, message in found)
    return header


def verify(path: str | os.PathLike[str], *, dtype: Any = "int64") -> list[Problem]:
    """Every problem of the ``.batch`` file or shard folder at ``path`` (local),
    each naming the file and field; empty when every read succeeds.
    ``dtype`` (``"int64"`` or ``"int32"``): the output the ids must fit (an
    ``int32`` read of an id >= 2**31 would wrap). Reads every byte once."""
    out = output_dtype(dtype, allowed=CASTS)
    assert out is not None
    bounds = np.empty(0, out)
    path = Path(path)
    problems: list[Problem] = []
    if not path.is_dir():
        _shard(path, bounds, problems)
    else:
        try:
            manifest, paths = load_manifest(path)
        except FormatError as error:
            return [_problem(error, path / MANIFEST_NAME)]
        headers = []
        for position, shard in enumerate(paths):
            header = _shard(shard, bounds, problems)
            if header is None:
                continue
            headers.append(header)
            problems.extend(Problem(shard, field, message) for field, message in
                            validate.against_manifest(header, manifest, position))
            problems.extend(Problem(shard, field, message) for field, message in
                            validate.manifest_bytes(manifest["shards"][position],
                                                    header.file_size))
        if len(headers) == len(paths):
            for at, field, message in validate.shard_counts(
                    [h.num_batches for h in headers], manifest["num_batches"]):
                where = path / MANIFEST_NAME if at is None else paths[at]
                problems.append(Problem(where, field, message))
    if not problems:  # the reader's own open: whatever it refuses is reported
        try:
            with BatchFileReader(path):
                pass
        except FormatError as error:
            problems.append(_problem(error, path))
        except OSError as error:
            problems.append(Problem(path, "file", f"cannot be opened ({error.strerror})"))
    return problems
