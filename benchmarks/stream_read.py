"""How fast do shuffled token windows come out of a token-stream dataset?

Windows of 2,048 tokens (+1 for labels) in Feistel order, batch 32, uint16
tokens, warm page cache. Baselines measured in the same run on the same bytes:
``np.copyto`` of each window into a buffer (the memory-copy limit) and plain
``np.memmap`` fancy indexing. A second dataset carries one metadata span every
64 tokens (value: a list of two concept ids, msgpack); its rate is compared
with the plain dataset's.

    python benchmarks/stream_read.py [--tokens 150_000_000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from zerobatch import stream
from zerobatch.shuffle import Feistel

SEQ_LEN, BATCH, SPAN = 2048, 32, 64


def _write(path: Path, tokens: int, *, metadata: bool, seed: int, shard_tokens: int) -> None:
    """Random documents of 200..3,000 tokens; with metadata, a span every 64 tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 3000, size=tokens // 1600 + 1)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), tokens) + 1]
    data = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    with stream.StreamWriter(path, metadata="msgpack" if metadata else None,
                             shard_tokens=shard_tokens) as writer:
        for i, n in enumerate(lengths.tolist()):
            doc = data[starts[i] : starts[i] + n]
            spans = None
            if metadata:
                cuts = [*range(0, n, SPAN), n]
                spans = [(a, b, [(i + a) % 997, i % 31])
                         for a, b in itertools.pairwise(cuts)]
            writer.add_document(doc, spans=spans)


def _warm(path: Path) -> None:
    for file in path.iterdir():
        with open(file, "rb") as handle:
            while handle.read(1 << 24):
                pass


def _best_rates(steps: dict[str, tuple[Callable[[int], None], int]], seconds: float,
                rounds: int = 10) -> dict[str, float]:
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


def _steps(path: Path) -> dict[str, tuple[Callable[[int], None], int]]:
    """The readers to time on the dataset at ``path``: name -> (step, batches)."""
    ds = stream.open_dataset(path)
    windows = ds.windows(SEQ_LEN)
    stored = ds.windows(SEQ_LEN, dtype="stored")
    order = Feistel(len(windows), seed=2024)
    plans = [order.range(k * BATCH, (k + 1) * BATCH)
             for k in range(min(len(windows) // BATCH, 4096))]
    suffix = " + metadata" if ds.has_metadata else ""
    steps: dict[str, tuple[Callable[[int], None], int]] = {
        f"zerobatch int64{suffix}": (lambda k: windows.read(plans[k]), len(plans)),
        f"zerobatch stored{suffix}": (lambda k: stored.read(plans[k]), len(plans)),
    }
    if ds.has_metadata:
        return steps
    n = SEQ_LEN + 1
    tokens = np.memmap(path / "00000.tokens", dtype="<u2", mode="r")
    starts = [p * SEQ_LEN for p in plans]
    out = np.empty((BATCH, n), dtype=np.uint16)
    offsets = np.arange(n)

    def copy(k: int) -> None:
        for b, s in enumerate(starts[k].tolist()):
            np.copyto(out[b], tokens[s : s + n])

    def fancy(k: int) -> None:
        window = tokens[starts[k][:, None] + offsets]
        window[:, :-1].astype(np.int64), window[:, 1:].astype(np.int64)

    steps["np.copyto (limit)"] = (copy, len(starts))
    steps["np.memmap fancy + int64"] = (fancy, len(starts))
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150_000_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per reader")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zerobatch-stream-bench-"))
    try:
        plain, meta = root / "plain", root / "meta"
        # One shard, so the baselines can index the same bytes through one memmap.
        _write(plain, args.tokens, metadata=False, seed=0, shard_tokens=args.tokens)
        _write(meta, args.tokens // 3, metadata=True, seed=1, shard_tokens=1 << 24)
        size = sum(f.stat().st_size for f in plain.iterdir()) >> 20
        size_meta = sum(f.stat().st_size for f in meta.iterdir()) >> 20
        _warm(plain)
        _warm(meta)
        rates = _best_rates({**_steps(plain), **_steps(meta)}, args.seconds)
    finally:
        shutil.rmtree(root)
    limit, fancy = rates["np.copyto (limit)"], rates["np.memmap fancy + int64"]
    rows = []
    for name, rate in rates.items():
        plain_name = name.removesuffix(" + metadata")
        note = f"{rate / rates[plain_name]:.2f}x no-metadata" if plain_name != name else ""
        rows.append((name, rate, note))
    print(f"datasets: {size} MiB plain, {size_meta} MiB with a span every {SPAN} tokens; "
          f"windows of {SEQ_LEN} tokens, batch {BATCH}, Feistel order, warm page cache")
    header = (f"{'reader':<34}{'batches/s':>10}{'Mtok/s':>9}{'MB/s':>8}"
              f"{'vs copy':>9}{'vs memmap':>11}  note")
    print(header)
    print("-" * len(header))
    for name, rate, note in rows:
        tok = rate * BATCH * SEQ_LEN
        print(f"{name:<34}{rate:>10.0f}{tok / 1e6:>9.1f}{tok * 2 / 1e6:>8.0f}"
              f"{rate / limit:>9.2f}{rate / fancy:>11.2f}  {note}")


if __name__ == "__main__":
    main()
