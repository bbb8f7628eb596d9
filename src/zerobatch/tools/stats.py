"""Document-length and token-frequency distributions of a dataset, and their plot."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from zerobatch.errors import FormatError
from zerobatch.stream.manifest import DOCS, OFFSET_DTYPE, TOKEN, TOKENS, is_dataset, read_manifest

__all__ = ["Distributions", "distributions", "plot"]

_SAMPLE_TOKENS = 1 << 26  # token frequencies are counted over at most this many tokens


@dataclass(frozen=True)
class Distributions:
    """Per-document lengths (tokens; None for LLMBATCH, which has no documents)
    and per-id token counts over ``sampled`` tokens."""

    lengths: npt.NDArray[np.int64] | None
    counts: npt.NDArray[np.int64]
    sampled: int


def _stream(folder: Path) -> Distributions:
    manifest = read_manifest(folder)
    lengths = [np.diff(np.fromfile(folder / s.file(DOCS), dtype=OFFSET_DTYPE).astype(np.int64))
               for s in manifest.shards]
    total = sum(s.records for s in manifest.shards)
    stride = max(1, -(-total // _SAMPLE_TOKENS))  # every stride-th token, evenly over shards
    counts = np.zeros(1, dtype=np.int64)
    sampled = 0
    for shard in manifest.shards:
        if not shard.records:
            continue
        records = np.memmap(folder / shard.file(TOKENS), dtype=manifest.record_dtype, mode="r",
                            shape=(shard.records,))[::stride]
        tokens = records if manifest.token_field is None else records[TOKEN]
        found = np.bincount(np.asarray(tokens))
        if found.shape[0] > counts.shape[0]:
            found[: counts.shape[0]] += counts
            counts = found
        else:
            counts[: found.shape[0]] += found
        sampled += tokens.shape[0]
    joined = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return Distributions(joined.astype(np.int64, copy=False), counts, sampled)


def _batch_file(path: Path) -> Distributions:
    from zerobatch.llmbatch import BatchFileReader

    with BatchFileReader(path) as reader:
        step = max(1, reader.num_batches * reader.batch_size * reader.seq_len // _SAMPLE_TOKENS)
        counts = np.zeros(1, dtype=np.int64)
        sampled = 0
        for i in range(0, reader.num_batches, step):
            found = np.bincount(np.asarray(reader.read_batch(i)).reshape(-1))
            if found.shape[0] < counts.shape[0]:
                found = np.pad(found, (0, counts.shape[0] - found.shape[0]))
            found[: counts.shape[0]] += counts
            counts = found
            sampled += reader.batch_size * reader.seq_len
    return Distributions(None, counts, sampled)


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
