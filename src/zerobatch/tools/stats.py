"""Document-length and token-frequency distributions of a dataset, and their plot."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from zerobatch.errors import FormatError
from zerobatch.stream.manifest import (
    DOCS,
    OFFSET_DTYPE,
    TOKEN,
    TOKENS,
    check_sizes,
    is_dataset,
    read_manifest,
)

__all__ = ["Distributions", "distributions", "plot"]

_SAMPLE_TOKENS = 1 << 24  # token frequencies are counted over at most this many tokens
_SAMPLE_DOCUMENTS = 1 << 24  # document lengths: at most this many documents


@dataclass(frozen=True)
class Distributions:
    """Per-document lengths (tokens, of at most ``_SAMPLE_DOCUMENTS`` documents
    spread evenly; None for LLMBATCH, which has no documents) and the count of
    each distinct token id (``ids`` sorted, ``counts`` alike) over ``sampled``
    tokens. Memory is bounded by the sample, whatever the ids' range: O(sampled)
    while counting, O(distinct ids) after."""

    lengths: npt.NDArray[np.int64] | None
    ids: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    sampled: int


class _Tally:
    """Counts of distinct ids, merged sample by sample (never indexed by id:
    an id near 2**32 costs what any other does)."""

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)
        self.sampled = 0

    def add(self, tokens: np.ndarray) -> None:
        found, counts = np.unique(np.asarray(tokens).reshape(-1), return_counts=True)
        merged, where = np.unique(np.concatenate([self.ids, found.astype(np.int64)]),
                                  return_inverse=True)
        total = np.zeros(merged.shape[0], np.int64)
        np.add.at(total, where, np.concatenate([self.counts, counts]))
        self.ids, self.counts = merged, total
        self.sampled += int(np.asarray(tokens).size)


def _stream(folder: Path) -> Distributions:
    manifest = read_manifest(folder)
    check_sizes(folder, manifest, lambda name: os.stat(folder / name).st_size)
    documents = sum(s.documents for s in manifest.shards)
    every = max(1, -(-documents // _SAMPLE_DOCUMENTS))  # every k-th document's length
    lengths = []
    for shard in manifest.shards:
        offsets = np.memmap(folder / shard.file(DOCS), dtype=OFFSET_DTYPE, mode="r")
        starts = np.asarray(offsets[:-1:every]).astype(np.int64)
        ends = np.asarray(offsets[1::every]).astype(np.int64)
        lengths.append(ends - starts)
    total = sum(s.records for s in manifest.shards)
    stride = max(1, -(-total // _SAMPLE_TOKENS))  # every stride-th token, evenly over shards
    tally = _Tally()
    for shard in manifest.shards:
        if not shard.records:
            continue
        records = np.memmap(folder / shard.file(TOKENS), dtype=manifest.record_dtype, mode="r",
                            shape=(shard.records,))[::stride]
        tally.add(records if manifest.token_field is None else records[TOKEN])
    joined = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return Distributions(joined, tally.ids, tally.counts, tally.sampled)


def _batch_file(path: Path) -> Distributions:
    from zerobatch.llmbatch import BatchFileReader

    with BatchFileReader(path) as reader:
        step = max(1, reader.num_batches * reader.batch_size * reader.seq_len // _SAMPLE_TOKENS)
        tally = _Tally()
        for i in range(0, reader.num_batches, step):
            tally.add(reader.read_batch(i))
    return Distributions(None, tally.ids, tally.counts, tally.sampled)


def distributions(path: str | os.PathLike[str]) -> Distributions:
    """The distributions of a token-stream dataset folder or an LLMBATCH file."""
    from zerobatch.llmbatch import is_batch_file

    folder = Path(path)
    if is_dataset(folder):
        return _stream(folder)
    if folder.is_file() and is_batch_file(folder):
        return _batch_file(folder)
    raise FormatError("--plot needs a token-stream dataset folder or a .batch file", path=path)


def plot(dist: Distributions, output: str | os.PathLike[str], *, title: str = "") -> None:
    """Write a PNG: a histogram of document lengths (log bins) and the
    rank-frequency curve of token ids (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if dist.lengths is not None and dist.lengths.size:
        top = max(2.0, float(dist.lengths.max()))
        bins = np.unique(np.geomspace(1, top + 1, 50).astype(np.int64))
        left.hist(dist.lengths, bins=bins)
        left.set_xscale("log")
        left.set_title(f"document length ({dist.lengths.size:,} documents)")
        left.set_xlabel("tokens")
        left.set_ylabel("documents")
    else:
        left.text(0.5, 0.5, "no documents in this format", ha="center", va="center")
        left.set_axis_off()
    frequency = np.sort(dist.counts[dist.counts > 0])[::-1]
    if frequency.size:
        right.loglog(np.arange(1, frequency.size + 1), frequency)
    right.set_title(f"token frequency ({frequency.size:,} ids in {dist.sampled:,} tokens)")
    right.set_xlabel("rank")
    right.set_ylabel("count")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(output, format="png", dpi=100)
    plt.close(figure)
