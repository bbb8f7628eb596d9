"""LLMBATCH's checks, one home for each, shared by ``BatchFileReader`` and ``verify``.

Each check returns what is wrong as ``(field, message)`` pairs (empty: nothing).

* **Open checks** (``against_manifest``, ``shard_counts``): what a reader
  checks when it opens a shard folder, after each header has passed
  ``BatchHeader.unpack`` and ``check_file_size`` (``format.py``). A reader
  raises the first; ``verify`` reports them all.
* **Whole-file checks** (``reserved``, ``padding``, ``manifest_bytes``,
  ``token_ids``): what the spec says writers MUST do and a reader never
  looks at (reserved header bytes and slot padding are zeros, the manifest's
  ``bytes`` are the shard's size), and the token ids an output ``dtype``
  holds (``int32`` reads of ids >= 2**31 would wrap). ``verify`` runs these.

Whatever a read rejects, ``verify`` reports: reads are views of slots whose
placement the open checks fix, and ``verify`` also opens the reader itself
(``tests/test_batch_file.py`` checks this over mutated files).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zerobatch.llmbatch.format import HEADER_SIZE, BatchHeader

__all__ = ["CHUNK", "against_manifest", "manifest_bytes", "padding", "reserved",
           "shard_counts", "token_ids"]

CHUNK = 1 << 24
"""Bytes per step of the whole-file checks, to bound their memory."""

_DEFINED = 40  # bytes of the header's defined fields; the rest are reserved


def against_manifest(header: BatchHeader, manifest: dict[str, Any],
                     position: int) -> list[tuple[str, str]]:
    """Open check of shard ``position``'s header against the manifest: the
    same batch_size, seq_len, dtype and seed, and its ``num_batches``."""
    expected = manifest["shards"][position].get("num_batches") \
        if isinstance(manifest["shards"][position], dict) else None
    return [(field, f"shard header has {field}={found}, manifest says {wanted}")
            for field, found, wanted in (
                ("batch_size", header.batch_size, manifest["batch_size"]),
                ("seq_len", header.seq_len, manifest["seq_len"]),
                ("dtype", header.dtype, manifest["dtype_code"]),
                ("seed", header.seed, manifest["seed"]),
                ("num_batches", header.num_batches, expected),
            ) if found != wanted]


def shard_counts(counts: list[int], total: int) -> list[tuple[int | None, str, str]]:
    """Open check of the shards' batch counts (in order): every shard but the
    last holds as many as the first, the last no more, and they add up to the
    manifest's ``total``. Returns ``(shard position or None for the
    manifest, field, message)``."""
    wrong: list[tuple[int | None, str, str]] = []
    per_shard = counts[0]
    for position, count in enumerate(counts[:-1]):
        if count != per_shard:
            wrong.append((position, "num_batches", f"every shard but the last must hold "
                          f"{per_shard} batches, found {count}"))
    if counts[-1] > per_shard:
        wrong.append((len(counts) - 1, "num_batches",
                      f"the last shard holds more than {per_shard} batches"))
    if sum(counts) != total:
        wrong.append((None, "num_batches",
                      f"shards hold {sum(counts)} batches, manifest says {total}"))
    return wrong


def reserved(head: bytes) -> list[tuple[str, str]]:
    """Whole-file check: the header's reserved bytes (40 to 4096) are zeros."""
    rest = np.frombuffer(head, np.uint8, HEADER_SIZE - _DEFINED, _DEFINED)
    nonzero = np.flatnonzero(rest)
    if nonzero.size == 0:
        return []
    return [("reserved", f"{nonzero.size} reserved header byte(s) are not zero (the first at "
             f"byte {_DEFINED + int(nonzero[0])}); writers MUST write zeros")]


def padding(data: np.ndarray, header: BatchHeader) -> list[tuple[str, str]]:
    """Whole-file check: every slot's padding (after its ``raw_batch_bytes``)
    is zeros. ``data``: the file's bytes (a mapping)."""
    pad = header.padded_batch_bytes - header.raw_batch_bytes
    if pad == 0:
        return []
    slots = data[HEADER_SIZE:].reshape(header.num_batches, header.padded_batch_bytes)
    step = max(1, CHUNK // header.padded_batch_bytes)
    for start in range(0, header.num_batches, step):
        tails = slots[start:start + step, header.raw_batch_bytes:]
        rows = np.flatnonzero(tails.any(axis=1))
        if rows.size:
            return [("padding", f"slot {start + int(rows[0])} has non-zero bytes after its "
                     f"batch; writers MUST pad slots with zeros")]
    return []


def manifest_bytes(entry: Any, size: int) -> list[tuple[str, str]]:
    """Whole-file check: a manifest shard entry's ``bytes``, when given, is the
    shard file's ``size``."""
    given = entry.get("bytes") if isinstance(entry, dict) else None
    if given is None or given == size:
        return []
    return [("bytes", f"manifest says {given!r:.40} bytes, the file has {size}")]


def token_ids(data: np.ndarray, header: BatchHeader,
              bounds: np.ndarray) -> list[tuple[str, str]]:
    """Whole-file check: every token id of every batch lies in ``bounds``
    (``_output_dtype.id_bounds`` of the stored and output dtypes; empty:
    every stored id fits)."""
    if bounds.shape[0] == 0:
        return []
    low, high = bounds[0], bounds[1]
    slots = data[HEADER_SIZE:].reshape(header.num_batches, header.padded_batch_bytes)
    step = max(1, CHUNK // header.padded_batch_bytes)
    for start in range(0, header.num_batches, step):
        tokens = slots[start:start + step, :header.raw_batch_bytes].view(header.token_dtype)
        bad = np.flatnonzero(((tokens < low) | (tokens > high)).any(axis=1))
        if bad.size:
            row = tokens[int(bad[0])]
            value = int(row[np.flatnonzero((row < low) | (row > high))[0]])
            return [("tokens", f"batch {start + int(bad[0])} holds token id {value}, which the "
                     f"output dtype does not hold (ids {int(low)} to {int(high)})")]
    return []
