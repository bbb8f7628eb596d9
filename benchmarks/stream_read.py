"""How fast do shuffled token windows come out of a token-stream dataset?

Windows of 2,048 tokens (+1 for labels) in Feistel order, batch 32, uint16
tokens, warm page cache. Baselines measured in the same run on the same bytes:
``np.copyto`` of each window into a buffer (the memory-copy limit) and plain
``np.memmap`` fancy indexing plus the int64 cast of inputs and labels, and a
map-style PyTorch ``Dataset`` of the same windows through a ``DataLoader``
(main process; inputs and labels only, no positions). Two more
datasets carry one metadata span every 64 tokens (msgpack), valued either a
list of two concept ids or one id; their rates are compared with the plain
dataset's int64 rate; the one-id dataset is read in format version 2 (the
writer's) and, as ``version 1``, the same files with the manifest set to
version 1 and no ``meta.spans`` (its spans never overlap, so its ``meta_id``
column is the same in both): the two metadata read paths on the same bytes.
A batch's span values are decoded when first used, so
rows marked ``all tuples`` also build every ``(start, end, value)`` of every
window: what a consumer that touches every span pays. zerobatch rows read
through ``LocalStorage``'s default ``pread``; rows marked ``mmap`` copy tokens
from read-only mappings instead.

    python benchmarks/stream_read.py [--tokens 150_000_000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

from zerobatch import stream
from zerobatch.shuffle import Feistel
from zerobatch.storage import LocalStorage

SEQ_LEN, BATCH, SPAN = 2048, 32, 64
V1_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "doc_ids", "metadata")
"""The columns of a version-1 dataset with metadata (no ``document_metadata``)."""
Step = tuple[Callable[[int], object], int]


def _value(kind: str, doc: int, at: int) -> object:
    return [(doc + at) % 997, doc % 31] if kind == "ids" else (doc + at) % 997


def _write(path: Path, tokens: int, *, values: str | None, shard_tokens: int) -> None:
    """Random documents of 200..3,000 tokens; with ``values``, a span every 64 tokens."""
    rng = np.random.default_rng(len(str(values)))
    lengths = rng.integers(200, 3000, size=tokens // 1600 + 1)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), tokens) + 1]
    data = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    with stream.StreamWriter(path, metadata="msgpack" if values else None,
                             shard_tokens=shard_tokens) as writer:
        for i, n in enumerate(lengths.tolist()):
            spans = None
            if values:
                spans = [(a, b, _value(values, i, a))
                         for a, b in itertools.pairwise([*range(0, n, SPAN), n])]
            writer.add_document(data[starts[i] : starts[i] + n], spans=spans)


def _as_version_1(path: Path, target: Path) -> Path:
    """A copy of ``path`` (non-overlapping spans, no document metadata) in the
    version-1 layout: the same files but ``meta.spans``, manifest version 1."""
    shutil.copytree(path, target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["version"] = 1
    for shard in manifest["shards"]:
        del shard["files"]["meta.spans"]
        (target / f"{shard['name']}.meta.spans").unlink()
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def _warm(path: Path) -> int:
    """Read every file once (into the page cache); returns the dataset's bytes."""
    total = 0
    for file in path.iterdir():
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 24):
                total += len(chunk)
    return total


def _best_rates(steps: dict[str, Step], seconds: float, rounds: int = 10) -> dict[str, float]:
    """Batches per second of each step: the best of ``rounds`` short passes,
    interleaved so that noise from other processes hits every reader alike."""
    best = dict.fromkeys(steps, 0.0)
    for step, _ in steps.values():
        step(0)
    for r in range(rounds):
        for name, (step, batches) in steps.items():
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / rounds:
                step((r * 7919 + count) % batches)
                count += 1
            best[name] = max(best[name], count / (time.perf_counter() - start))
    return best


def _plans(windows: stream.TokenWindows) -> list[np.ndarray]:
    order = Feistel(len(windows), seed=2024)
    return [order.range(k * BATCH, (k + 1) * BATCH)
            for k in range(min(len(windows) // BATCH, 4096))]


def _reader(
    path: Path, dtype: str = "int64", method: Literal["pread", "mmap"] = "pread",
    *, tuples: bool = False, columns: tuple[str, ...] | None = None,
) -> Step:
    """Read batches (``columns``: default all); with ``tuples``, also build every
    ``(start, end, value)`` of the metadata column (what a consumer touching
    every span pays)."""
    storage = LocalStorage(path, method=method)
    windows = stream.open_dataset(path, storage=storage).windows(SEQ_LEN, dtype=dtype,
                                                                  columns=columns)
    plans = _plans(windows)
    if tuples:
        return (lambda k: [s.tolist() for s in windows.read(plans[k])["metadata"]]), len(plans)
    return (lambda k: windows.read(plans[k])), len(plans)


def _baselines(path: Path) -> dict[str, Step]:
    """``np.copyto`` per window and memmap fancy indexing, on the same windows."""
    plans = _plans(stream.open_dataset(path).windows(SEQ_LEN))
    tokens = np.memmap(path / "00000.tokens", dtype="<u2", mode="r")
    starts = [p * SEQ_LEN for p in plans]
    n = SEQ_LEN + 1
    out = np.empty((BATCH, n), dtype=np.uint16)
    offsets = np.arange(n)

    def copy(k: int) -> None:
        for b, s in enumerate(starts[k].tolist()):
            np.copyto(out[b], tokens[s : s + n])

    def fancy(k: int) -> tuple[np.ndarray, np.ndarray]:
        window = tokens[starts[k][:, None] + offsets]
        return window[:, :-1].astype(np.int64), window[:, 1:].astype(np.int64)

    return {"np.copyto (limit)": (copy, len(starts)),
            "np.memmap fancy + int64": (fancy, len(starts)),
            **_torch_baseline(tokens, starts)}


def _torch_baseline(tokens: np.ndarray, starts: list[np.ndarray]) -> dict[str, Step]:
    """What a map-style PyTorch dataset does: one window per ``__getitem__``
    (int64 inputs and labels, nanoGPT style), batched by a ``DataLoader`` in
    the main process. Skipped without torch."""
    try:
        import torch
        from torch.utils.data import DataLoader, Dataset
    except ImportError:
        return {}

    class Windows(Dataset):
        def __len__(self) -> int:
            return len(tokens) - SEQ_LEN

        def __getitem__(self, start: int) -> dict[str, torch.Tensor]:
            window = tokens[start : start + SEQ_LEN + 1].astype(np.int64)
            return {"input_ids": torch.from_numpy(window[:-1]),
                    "labels": torch.from_numpy(window[1:])}

    batches = itertools.cycle([s.tolist() for s in starts])
    loader = iter(DataLoader(Windows(), batch_sampler=batches, num_workers=0))
    return {"torch DataLoader, map-style": ((lambda k: next(loader)), len(starts))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150_000_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per reader")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zerobatch-stream-bench-"))
    try:
        plain, ids, one = root / "plain", root / "ids", root / "one"
        # One shard, so the baselines can index the same bytes through one memmap.
        _write(plain, args.tokens, values=None, shard_tokens=2 * args.tokens)
        _write(ids, args.tokens // 3, values="ids", shard_tokens=1 << 24)
        _write(one, args.tokens // 3, values="id", shard_tokens=1 << 24)
        one_v1 = _as_version_1(one, root / "one-v1")
        sizes = [_warm(p) >> 20 for p in (plain, ids, one, one_v1)]
        rates = _best_rates({
            "zerobatch int64": _reader(plain),
            "zerobatch stored": _reader(plain, "stored"),
            "zerobatch int64, mmap": _reader(plain, method="mmap"),
            "zerobatch stored, mmap": _reader(plain, "stored", "mmap"),
            **_baselines(plain),
            "zerobatch int64, spans [id, id]": _reader(ids),
            "zerobatch int64, spans id": _reader(one),
            "zerobatch int64, spans id, no document_metadata": _reader(one, columns=V1_COLUMNS),
            "zerobatch int64, spans id, version 1": _reader(one_v1),
            "zerobatch int64, spans id, mmap": _reader(one, method="mmap"),
            "zerobatch int64, spans id, all tuples": _reader(one, tuples=True),
            "zerobatch int64, spans id, all tuples, version 1": _reader(one_v1, tuples=True),
            "zerobatch int64, spans [id, id], all tuples": _reader(ids, tuples=True),
        }, args.seconds)
    finally:
        shutil.rmtree(root)
    limit, fancy = rates["np.copyto (limit)"], rates["np.memmap fancy + int64"]
    print(f"datasets: {sizes[0]} MiB plain, {sizes[1]} and {sizes[2]} MiB with a span every "
          f"{SPAN} tokens; windows of {SEQ_LEN} tokens, batch {BATCH}, Feistel order, "
          "warm page cache")
    header = (f"{'reader':<44}{'batches/s':>10}{'Mtok/s':>9}{'MB/s':>8}"
              f"{'vs copy':>9}{'vs memmap':>11}  note")
    print(header)
    print("-" * len(header))
    for name, rate in rates.items():
        tok = rate * BATCH * SEQ_LEN
        plain_rate = rates["zerobatch int64, mmap" if "mmap" in name else "zerobatch int64"]
        note = f"{rate / plain_rate:.2f}x no-metadata" if "spans" in name else ""
        print(f"{name:<44}{rate:>10.0f}{tok / 1e6:>9.1f}{tok * 2 / 1e6:>8.0f}"
              f"{rate / limit:>9.2f}{rate / fancy:>11.2f}  {note}")


if __name__ == "__main__":
    main()
