"""``zerobatch bench``: what the README's Loader reads on this dataset and
machine, against three lines of NumPy measured in the same run.

The limit is ``np.memmap`` of a token file, one fancy-indexing gather of
``batch_size`` random windows of ``seq_len + 1`` tokens, ``astype(int64)``,
inputs and labels split: what a user writes first. Against it, as shares:
``Loader(dataset.windows(seq_len), batch_size)`` with every default (torch
output when torch is installed), the same with ``document_masking=True``,
and the fastest reader-thread settings found by a short search ("tuned").
Readers are timed in interleaved passes (each pass a fresh iterator, its
first batch untimed), best pass of each.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.stream.manifest import TOKENS, is_dataset

__all__ = ["TUNING", "BenchResult", "bench", "numpy_windows", "rates", "tune"]

TUNING: tuple[dict[str, int], ...] = (
    {"num_threads": 0, "prefetch": 0},
    {"num_threads": 1, "prefetch": 2},
    {"num_threads": 1, "prefetch": 4},
    {"num_threads": 2, "prefetch": 4},
    {"num_threads": 2, "prefetch": 8},
)
"""The Loader settings ``tune`` tries (the default is ``num_threads=None``, automatic:
``num_threads=0`` for a local dataset until the loop is seen waiting, ``prefetch=2``)."""

LIMIT = "np.memmap gather + int64 cast"


@dataclass(frozen=True)
class BenchResult:
    """Tokens/s of each reader, the limit among them, and the tuned settings."""

    what: str
    tokens_per_s: Mapping[str, float]
    tuned: Mapping[str, int] = field(default_factory=dict)

    def share(self, name: str) -> float:
        """``name``'s tokens/s as a share of the limit's."""
        return self.tokens_per_s[name] / self.tokens_per_s[LIMIT]

    def table(self) -> str:
        """The result as lines for people."""
        width = max(map(len, self.tokens_per_s))
        lines = [f"source  {self.what}", "",
                 f"{'reader':<{width}}  {'M tokens/s':>10}  {'share of NumPy':>14}"]
        for name, rate in self.tokens_per_s.items():
            lines.append(f"{name:<{width}}  {rate / 1e6:>10,.0f}  {self.share(name):>14.2f}")
        settings = ", ".join(f"{k}={v}" for k, v in self.tuned.items())
        lines += ["", f"tuned settings     Loader(..., {settings})",
                  f"ratio              {self.share(_DEFAULT):.3f} of the NumPy limit "
                  "(README path, defaults)"]
        return "\n".join(lines)


_DEFAULT = "zerobatch Loader, defaults"


def rates(
    readers: Mapping[str, Callable[[], Iterator[Any]]], *, seconds: float, passes: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Best batches/s of each reader: ``passes`` rounds, readers interleaved,
    each pass a fresh iterator from its factory, its first batch untimed, then
    batches for about ``seconds`` of wall time. ``clock`` measures the pass
    (``time.process_time``: batches per CPU second of this process, all its
    threads, which a loaded machine blurs less than wall time; worker
    processes are not counted)."""
    best = dict.fromkeys(readers, 0.0)
    for _ in range(passes):
        for name, make in readers.items():
            batches = make()
            next(batches)  # start-up (threads, files, kernels) is not throughput
            count, started, measured = 0, time.perf_counter(), clock()
            while count < 4 or time.perf_counter() - started < seconds:
                next(batches)
                count += 1
            spent = clock() - measured
            best[name] = max(best[name], count / spent if spent > 0 else 0.0)
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    return best


def numpy_windows(
    files: list[Path], record_dtype: np.dtype, field_name: str | None, seq_len: int,
    batch_size: int, seed: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The limit: per batch, one shard (chosen by size), ``np.memmap`` fancy
    indexing of ``batch_size`` random windows of ``seq_len + 1`` tokens,
    ``astype(int64)``, inputs and labels split. Forever."""
    maps = [np.memmap(f, dtype=record_dtype, mode="r") for f in files]
    maps = [m for m in maps if m.shape[0] > seq_len]
    sizes = np.array([m.shape[0] for m in maps], dtype=np.float64)
    rng = np.random.default_rng(seed)
    span = np.arange(seq_len + 1)
    weights = sizes / sizes.sum()
    while True:
        tokens = maps[0] if len(maps) == 1 else maps[int(rng.choice(len(maps), p=weights))]
        starts = rng.integers(0, (tokens.shape[0] - 1) // seq_len, batch_size) * seq_len
        window = tokens[starts[:, None] + span]
        window = (window if field_name is None else window[field_name]).astype(np.int64)
        yield window[:, :-1], window[:, 1:]


def _loader(windows: Any, batch_size: int, seed: int, **settings: Any) -> Iterator[Any]:
    from zerobatch.loader import Loader

    output: Any = "torch" if importlib.util.find_spec("torch") else "numpy"
    loader = Loader(windows, batch_size, seed=seed, epochs=None, output=output, **settings)
    try:
        yield from loader
    finally:
        loader.close()


def tune(
    windows: Any, batch_size: int, *, seconds: float = 0.3, seed: int = 0
) -> tuple[dict[str, int], float]:
    """The fastest of ``TUNING`` for ``windows`` on this machine, and its batches/s."""
    def reader(settings: dict[str, int]) -> Callable[[], Iterator[Any]]:
        return lambda: _loader(windows, batch_size, seed, **settings)

    found = rates({str(i): reader(s) for i, s in enumerate(TUNING)}, seconds=seconds, passes=1)
    best = max(found, key=found.__getitem__)
    return dict(TUNING[int(best)]), found[best]


def bench(
    path: str | os.PathLike[str], *, seq_len: int = 2048, batch_size: int = 32,
    seconds: float = 1.0, seed: int = 0,
) -> BenchResult:
    """Time the README's Loader path (defaults; with ``document_masking=True``;
    tuned) and the NumPy three-liner on the dataset at ``path``, about
    ``seconds`` per pass, three passes each, interleaved."""
    from zerobatch.stream.reader import Dataset, open_dataset

    folder = Path(path)
    if not is_dataset(folder):
        raise FormatError("bench needs a token-stream dataset folder", path=path)
    with open_dataset(folder) as dataset:
        assert isinstance(dataset, Dataset)  # is_dataset: a manifest, not a .npy folder
        windows = dataset.windows(seq_len)
        if len(windows) < batch_size:
            raise ValueError(f"{folder} has {len(windows)} windows of {seq_len} tokens, fewer "
                             f"than batch_size={batch_size}; pass a smaller --seq-len")
        masking = dataset.windows(seq_len, document_masking=True)
        manifest = dataset.manifest
        files = [folder / shard.file(TOKENS) for shard in manifest.shards]
        tuned, _ = tune(windows, batch_size, seconds=seconds / 3, seed=seed)
        found = rates({
            LIMIT: lambda: numpy_windows(files, manifest.record_dtype, manifest.token_field,
                                         seq_len, batch_size, seed),
            _DEFAULT: lambda: _loader(windows, batch_size, seed),
            "zerobatch Loader, document_masking=True": lambda: _loader(masking, batch_size, seed),
            "zerobatch Loader, tuned": lambda: _loader(windows, batch_size, seed, **tuned),
        }, seconds=seconds)
    tokens = batch_size * seq_len
    return BenchResult(f"{folder}: windows of {seq_len} tokens, batch {batch_size}, shuffled",
                       {name: rate * tokens for name, rate in found.items()}, tuned)
