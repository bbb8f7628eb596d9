"""Write LLMBATCH files (see :mod:`zerobatch.llmbatch.format` for the bytes).

Both writers shuffle records globally at write time with one rule: record ``i``
goes to slot ``Feistel(total_records, seed)(i)`` (``seed`` is the *write* seed,
stored in the header; a loader's *shuffle* seed only orders the batches); slot
``s`` is row ``s % batch_size`` of batch ``s // batch_size``, and records whose
slot falls past the last whole batch are dropped. So the same records and seed give the same file
whichever writer made it, and neither needs the dataset in memory: the
streaming writer puts each record straight into its slot with a positioned
write, so its memory is O(chunk), not O(dataset).

Files appear atomically: bytes go to a temporary name, are flushed to disk and
then renamed; a sharded dataset's manifest is written last.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from zerobatch.llmbatch.format import (
    MANIFEST_NAME,
    BatchHeader,
    dtype_code,
    manifest_bytes,
)
from zerobatch.shuffle import Feistel
from zerobatch.storage.publish import AtomicFile, publisher

__all__ = ["write_batch_dataset", "write_batch_file"]

_U32_MAX = 2**32 - 1
_CHUNK_BYTES = 8 * 2**20  # records are gathered and placed this many bytes at a time


def write_batch_file(
    output_path: str | os.PathLike[str],
    tokens_array: npt.ArrayLike,
    batch_size: int = 32,
    seq_len: int = 512,
    seed: int = 42,
    *,
    dtype: str = "uint32",
) -> int:
    """Write ``tokens_array`` (``[records, seq_len]`` integers) as one ``.batch`` file.

    Records are shuffled with ``seed`` (the write seed, stored in the header) and
    grouped into batches of ``batch_size``; the remainder is dropped. ``dtype``
    is ``"uint32"`` (the original format) or ``"uint16"`` (half the bytes; every
    token must be < 65,536). Returns the number of batches written.
    """
    tokens = np.asarray(tokens_array)
    if tokens.ndim != 2 or tokens.shape[1] != seq_len:
        raise ValueError(
            f"tokens_array must have shape (records, seq_len={seq_len}), got {tokens.shape}"
        )
    return write_batch_dataset(
        output_path, _row_chunks(tokens), len(tokens), batch_size, seq_len, seed, dtype=dtype
    )


def write_batch_dataset(
    output_path: str | os.PathLike[str],
    tokens_iter: Iterable[npt.ArrayLike],
    total_records: int,
    batch_size: int,
    seq_len: int,
    seed: int,
    *,
    dtype: str = "uint32",
    batches_per_shard: int | None = None,
) -> int:
    """Write exactly ``total_records`` records from ``tokens_iter`` as a batch file.

    ``tokens_iter`` yields records of ``seq_len`` tokens (1-D arrays), or
    ``[k, seq_len]`` arrays of k records at once (faster). Memory stays
    O(8 MiB) beyond the imports, whatever the dataset size. With ``batches_per_shard``,
    ``output_path`` becomes a folder of ``.batch`` shards plus ``manifest.json``,
    read as one dataset by :class:`~zerobatch.llmbatch.reader.BatchFileReader`; the
    shuffle is global across shards. Returns the number of batches written.
    """
    header = _plan_header(total_records, batch_size, seq_len, seed, dtype)
    output = Path(output_path)
    if batches_per_shard is None:
        out = publisher(output.parent)
        file = out.file(output.name)
        try:
            placer = _SlotWriter([file.fileno()], header, header.num_batches)
            placer.prepare([header])
            _place_records(placer, tokens_iter, header)
        except BaseException:
            file.abort()
            raise
        file.commit()
        return header.num_batches
    if batches_per_shard < 1:
        raise ValueError(f"batches_per_shard must be >= 1, got {batches_per_shard}")
    _write_shards(output, tokens_iter, header, batches_per_shard)
    return header.num_batches


def _plan_header(
    total_records: int, batch_size: int, seq_len: int, seed: int, dtype: str
) -> BatchHeader:
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _U32_MAX:
            raise ValueError(f"{name} must be an int in [1, 2**32), got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _U32_MAX:
        raise ValueError(
            f"seed must be an int in [0, 2**32) (the header stores uint32), got {seed!r}"
        )
    if not isinstance(total_records, int) or not 0 <= total_records <= _U32_MAX:
        raise ValueError(
            f"total_records must be an int in [0, 2**32) (the header stores uint32), "
            f"got {total_records!r}"
        )
    num_batches = total_records // batch_size
    if num_batches == 0:
        raise ValueError(
            f"total_records={total_records} is fewer than batch_size={batch_size}: "
            "no whole batch to write"
        )
    return BatchHeader(batch_size, seq_len, num_batches, dtype_code(dtype), seed, total_records)


def _row_chunks(tokens: np.ndarray) -> Iterator[np.ndarray]:
    rows = max(1, _CHUNK_BYTES // max(1, tokens.shape[1] * tokens.dtype.itemsize))
    for start in range(0, len(tokens), rows):
        yield tokens[start : start + rows]


class _SlotWriter:
    """Positioned writes of records into their slots, across one or more files."""

    def __init__(self, fds: list[int], header: BatchHeader, batches_per_file: int) -> None:
        self.fds = fds
        self.header = header
        self.batches_per_file = batches_per_file
        self.row_bytes = header.seq_len * header.token_dtype.itemsize

    def prepare(self, headers: list[BatchHeader]) -> None:
        """Write each file's header and size it (zeros fill padding, sparsely)."""
        for fd, header in zip(self.fds, headers, strict=True):
            os.ftruncate(fd, header.file_size)
            os.pwrite(fd, header.pack(), 0)

    def place(self, rows: np.ndarray, slots: npt.NDArray[np.int64]) -> None:
        """Write ``rows[j]`` into slot ``slots[j]`` (slots sorted, all < batches * batch_size)."""
        header = self.header
        batch, row = np.divmod(slots, header.batch_size)
        file_index, batch_in_file = np.divmod(batch, self.batches_per_file)
        offsets = 4096 + batch_in_file * header.padded_batch_bytes + row * self.row_bytes
        data = np.ascontiguousarray(rows).data.cast("B")
        width = self.row_bytes
        # One syscall per record is the price of O(1) memory: slots are scattered.
        for j, (fd_index, offset) in enumerate(
            zip(file_index.tolist(), offsets.tolist(), strict=True)
        ):
            os.pwrite(self.fds[fd_index], data[j * width : (j + 1) * width], offset)


def _place_records(
    placer: _SlotWriter, tokens_iter: Iterable[npt.ArrayLike], header: BatchHeader
) -> None:
    permutation = Feistel(header.total_records, header.seed)
    kept = header.num_batches * header.batch_size
    limit = int(np.iinfo(header.token_dtype).max)
    done = 0
    for rows in _record_batches(tokens_iter, header.seq_len):
        if done + len(rows) > header.total_records:
            raise ValueError(
                f"tokens_iter yielded more than total_records={header.total_records} records"
            )
        _check_token_range(rows, limit, done)
        slots = permutation.range(done, done + len(rows))
        chosen = np.flatnonzero(slots < kept)
        chosen = chosen[np.argsort(slots[chosen])]  # ascending offsets help the page cache
        placer.place(rows[chosen].astype(header.token_dtype, copy=False), slots[chosen])
        done += len(rows)
    if done != header.total_records:
        raise ValueError(
            f"tokens_iter yielded {done} records, but total_records={header.total_records}"
        )


def _record_batches(tokens_iter: Iterable[npt.ArrayLike], seq_len: int) -> Iterator[np.ndarray]:
    """Group the iterator's records into ``[k, seq_len]`` chunks of about 16 MiB."""
    pending: list[np.ndarray] = []
    pending_rows = 0
    target = max(1, _CHUNK_BYTES // (seq_len * 4))
    for position, item in enumerate(tokens_iter):
        rows = np.asarray(item)
        if rows.ndim == 1:
            rows = rows.reshape(1, -1)
        if rows.ndim != 2 or rows.shape[1] != seq_len:
            raise ValueError(
                f"item {position} of tokens_iter has shape {np.shape(item)}; "
                f"expected ({seq_len},) or (k, {seq_len})"
            )
        if rows.dtype.kind not in "iu":
            raise ValueError(
                f"item {position} of tokens_iter has dtype {rows.dtype}; tokens must be integers"
            )
        pending.append(rows)
        pending_rows += len(rows)
        if pending_rows >= target:
            yield np.concatenate(pending) if len(pending) > 1 else pending[0]
            pending, pending_rows = [], 0
    if pending:
        yield np.concatenate(pending) if len(pending) > 1 else pending[0]


def _check_token_range(rows: np.ndarray, limit: int, first_record: int) -> None:
    if rows.size == 0:
        return
    low, high = int(rows.min()), int(rows.max())
    if low < 0 or high > limit:
        bad = low if low < 0 else high
        where = np.argwhere(rows == bad)[0]
        raise ValueError(
            f"token {bad} in record {first_record + int(where[0])} does not fit the file's "
            f"token dtype (0..{limit}); use dtype='uint32' for larger vocabularies"
        )


def _write_shards(
    output: Path, tokens_iter: Iterable[npt.ArrayLike], header: BatchHeader, per_shard: int
) -> None:
    """Publish a shard folder: new shards first (under names the old manifest
    does not use), then the manifest in one atomic replace, then the old shards
    go. A reader opening the folder at any instant sees the old dataset or the
    new one."""
    old = _old_shards(output)
    counts = [
        min(per_shard, header.num_batches - start)
        for start in range(0, header.num_batches, per_shard)
    ]
    headers = [
        BatchHeader(header.batch_size, header.seq_len, n, header.dtype, header.seed,
                    n * header.batch_size)
        for n in counts
    ]
    tag = "" if old is None else f"-{secrets.token_hex(4)}"  # never an old shard's name
    names = [f"{i:05d}{tag}.batch" for i in range(len(counts))]
    out = publisher(output)
    files: list[AtomicFile] = []
    committed = False
    try:
        files = [out.file(name) for name in names]
        placer = _SlotWriter([f.fileno() for f in files], header, per_shard)
        placer.prepare(headers)
        _place_records(placer, tokens_iter, header)
        for file in files:
            file.commit()
        committed = True
        out.put(MANIFEST_NAME, manifest_bytes(header, names, headers))
    except BaseException:
        for file, name in zip(files, names, strict=False):
            if committed:  # published, but no manifest names it
                out.remove(name)
            else:
                file.abort()
        raise
    for name in old or ():
        if name not in names:
            out.remove(name)


def _old_shards(output: Path) -> list[str] | None:
    """The shard names of the batch dataset at ``output``, None if there is none;
    ``FileExistsError`` if ``output`` holds something else."""
    if not output.exists():
        return None
    manifest = output / MANIFEST_NAME
    if not output.is_dir() or (not manifest.exists() and any(output.iterdir())):
        raise FileExistsError(
            f"{output} exists and is not a batch dataset folder; refusing to replace it"
        )
    if not manifest.exists():
        return None
    try:
        shards = json.loads(manifest.read_bytes()).get("shards", [])
        return [str(entry["name"]) for entry in shards]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise FileExistsError(f"{manifest} is not a readable batch manifest; refusing to "
                              "replace the folder") from None
