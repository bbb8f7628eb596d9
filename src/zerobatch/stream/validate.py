"""The token-stream format's checks, one home for each, shared by the reader and ``verify``.

Each function returns what is wrong (a message) or None. Two levels:

* **Open checks** (``docs_table``, ``index_table``, ``data_bytes``,
  ``spans_table``): O(1) per shard, what a reader checks of a table when it
  first maps it, and what ``verify`` checks first.
* **Whole-file checks** (``offsets``, ``span_rows``, ``run_ids``,
  ``covering_ids``): one pass over a table, what ``verify`` checks of every
  entry. Each is at least as strict as the reads' per-entry checks, which run
  in the kernels (``_kernels``) on the entries a batch touches, and
  ``span_rows`` runs the reads' own row predicate: whatever a read of any
  entry rejects, ``verify`` reports (``tests/test_stream_verify.py`` checks
  this over mutated datasets).

Tables are compared as stored (unsigned 64-bit offsets and rows), never cast
to a signed type first, so no value can overflow or turn negative.
"""

from __future__ import annotations

import numpy as np

from zerobatch.stream import _kernels as k
from zerobatch.stream.manifest import (
    META_DATA,
    META_ID,
    NO_METADATA,
    SPAN_FIELDS,
    Shard,
)

__all__ = [
    "covering_ids",
    "data_bytes",
    "docs_table",
    "index_table",
    "offsets",
    "run_ids",
    "span_rows",
    "spans_table",
]

CHUNK = 1 << 22
"""Records per step of the whole-file checks, to bound their memory."""


def docs_table(shard: Shard, table: np.ndarray) -> str | None:
    """Open check of a ``.docs`` table: ``documents + 1`` offsets, 0 to ``records``."""
    if table.shape[0] == shard.documents + 1 and table[0] == 0 \
            and int(table[-1]) == shard.records:
        return None
    return f"expected {shard.documents + 1} offsets from 0 to {shard.records}"


def index_table(shard: Shard, table: np.ndarray) -> str | None:
    """Open check of a ``.meta.index`` table: ``entries + 1`` offsets."""
    want = (shard.metadata_entries or 0) + 1
    return None if table.shape[0] == want else f"expected {want} offsets"


def data_bytes(shard: Shard, data: np.ndarray) -> str | None:
    """Open check of a ``.meta.data`` file: the manifest's size (a file that
    shrank after the sizes were checked fails here)."""
    want = shard.files[META_DATA][0]
    return None if data.shape[0] == want else f"expected {want} bytes; truncated after opening?"


def spans_table(shard: Shard, rows: np.ndarray) -> str | None:
    """Open check of a ``.meta.spans`` table (flat): ``entries`` rows of three."""
    want = (shard.metadata_entries or 0) * SPAN_FIELDS
    return None if rows.shape[0] == want else f"expected {want} values"


def offsets(table: np.ndarray, first: int, last: int, *, strict: bool) -> str | None:
    """Whole-file check of an offsets table: from ``first`` to ``last``,
    increasing (``strict``) or non-decreasing."""
    if table.shape[0] == 0 or int(table[0]) != first or int(table[-1]) != last:
        return f"expected offsets from {first} to {last}"
    bad = table[1:] <= table[:-1] if strict else table[1:] < table[:-1]
    if bad.any():
        return f"offsets go backwards at position {int(np.argmax(bad))}"
    return None


def span_rows(rows: np.ndarray, docs: np.ndarray, records: int) -> str | None:
    """Whole-file check of a ``.meta.spans`` table (flat ``<u8``, three per
    row) against its shard's sound ``docs`` offsets: every row is what every
    read accepts (the kernels' own predicate), inside one document, in the
    spec's order."""
    code, row = k.span_rows_status(rows, docs, records)
    if code == k.OK:
        return None
    start, end, kind = (int(v) for v in rows[SPAN_FIELDS * row : SPAN_FIELDS * row + 3])
    where = f"row {row} (start {start}, end {end}, kind {kind})"
    if code == k.SPAN_ORDER:
        return f"{where}: rows must be sorted by start, then kind and end descending"
    if code == k.SPAN_CROSSES:
        return f"{where}: an entry crosses a document boundary"
    if kind > 1:
        return f"{where}: unknown kind (0: a span, 1: a document's metadata)"
    return f"{where}: the entry is empty or ends past the shard's {records} records"


def run_ids(records: np.ndarray, docs: np.ndarray, entries: int) -> str | None:
    """Whole-file check of a version-1 shard's ``meta_id`` column: each entry
    0..entries-1 covers one contiguous run of tokens inside one document, in
    order."""
    ids = records[META_ID]
    expected = 0
    last_pos = -2
    for begin in range(0, ids.shape[0], CHUNK):
        chunk = np.asarray(ids[begin : begin + CHUNK])
        pos = np.flatnonzero(chunk != NO_METADATA)
        if pos.size == 0:
            continue
        values = chunk[pos].astype(np.int64)  # from <u4: exact
        pos = pos + begin
        prev_values = np.concatenate([[expected - 1], values[:-1]])
        prev_pos = np.concatenate([[last_pos], pos[:-1]])
        same = values == prev_values
        if (same & (pos != prev_pos + 1)).any() or ((~same) & (values != prev_values + 1)).any():
            return "entry ids must cover one contiguous run each, in increasing order"
        expected, last_pos = int(values[-1]) + 1, int(pos[-1])
    if expected != entries:
        return f"tokens use entries 0..{expected - 1}, the index has {entries}"
    starts = docs[1:-1].astype(np.int64)  # sound offsets: below records, exact
    if starts.size:
        at, before = ids[starts], ids[starts - 1]
        if ((at == before) & (at != NO_METADATA)).any():
            return "a metadata entry crosses a document boundary"
    return None


def covering_ids(records: np.ndarray, rows: np.ndarray) -> str | None:
    """Whole-file check of a version-2 shard's ``meta_id`` column against its
    sound rows (``[entries, 3]``): each token holds the smallest id of the
    entries covering it, or ``NO_METADATA``."""
    ids = records[META_ID]
    start, end = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64)  # sound: exact
    reach = np.maximum.accumulate(np.concatenate([[0], end]))[:-1]
    own = end > reach  # entries that are the smallest covering somewhere
    lows = np.maximum(start, reach)[own]
    highs, numbers = end[own], np.flatnonzero(own)
    for begin in range(0, ids.shape[0], CHUNK):
        chunk = np.asarray(ids[begin : begin + CHUNK]).astype(np.int64)
        expected = np.full(chunk.shape[0], NO_METADATA, np.int64)
        if lows.size:
            at = np.arange(begin, begin + chunk.shape[0])
            j = np.searchsorted(lows, at, side="right") - 1
            hit = (j >= 0) & (at < highs[j])  # j = -1 picks the last row: masked out
            expected[hit] = numbers[j[hit]]
        wrong = np.flatnonzero(chunk != expected)
        if wrong.size:
            return (f"token {begin + int(wrong[0])} holds {int(chunk[wrong[0]])}, the smallest "
                    f"entry covering it is {int(expected[wrong[0]])} (none: {NO_METADATA})")
    return None
