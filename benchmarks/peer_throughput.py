"""Shuffled tokens per second on datatrove's and LitData's own files: each peer's
loader at its documented defaults against zerobatch's Loader on the same files
(and on its own format), in one process, interleaved, wall time and CPU time;
and zerobatch on MDS shards (windows and documents) against its own format
(MDS's own loader cannot share this process: ``peer_formats.py`` runs it).

Loaders (windows of 2,048 tokens + 1 label token, batch 8 or ``--batch``, torch
tensors):

- datatrove: ``DatatroveFolderDataset(folder, 2048, token_size=2, shuffle=True)``
  in ``torch.utils.data.DataLoader(batch_size=8, shuffle=True)`` (its defaults:
  ``num_workers=0``, the default collate);
- LitData: ``StreamingDataset(folder, item_loader=TokensLoader(block_size=2049),
  shuffle=True)`` in ``StreamingDataLoader(batch_size=8)`` (``num_workers=0``);
- zerobatch: ``Loader(open_dataset(folder).windows(2048), 8, seed=epoch,
  output="torch")`` (default threads and prefetch) on the datatrove files, the
  LitData files, MDS's shards and its own format; ``documents()`` on MDS's
  shards and its own format (``output="numpy"``).

Each round runs every loader for ``--batches`` batches in turn (iterators kept
across rounds), timing wall (``perf_counter``) and the process's CPU time
(``process_time``: every thread, zerobatch's readers included). Under load the
CPU column is the one to trust: tokens per CPU second is what the loader costs.
``--profile`` adds each loader's top functions by own time (cProfile, 200
batches): where the time goes.

    python benchmarks/peer_throughput.py [--tokens 1e8] [--out DIR] [--rounds 5]
        [--batches 300] [--batch 8] [--profile]

The corpora are ``peer_formats.py``'s (built once under ``--out``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _files import warm
from _plot import bars
from peer_formats import BATCH, SEQ, build


def _datatrove(path: Path, batch_size: int) -> Callable[[], Iterator[Any]]:
    import torch
    from datatrove.utils.dataset import DatatroveFolderDataset

    ds = DatatroveFolderDataset(str(path), SEQ, token_size=2, shuffle=True)

    def epoch() -> Iterator[Any]:
        for batch in torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True):
            yield batch["input_ids"]
    return epoch


def _litdata(path: Path, batch_size: int) -> Callable[[], Iterator[Any]]:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(str(path), item_loader=TokensLoader(block_size=SEQ + 1), shuffle=True)

    def epoch() -> Iterator[Any]:
        yield from StreamingDataLoader(ds, batch_size=batch_size)
    return epoch


def _zerobatch(path: Path, batch_size: int, documents: bool = False
               ) -> Callable[[], Iterator[Any]]:
    from zerobatch import Loader, open_dataset

    ds = open_dataset(path)
    source = ds.documents() if documents else ds.windows(SEQ)
    count = [0]

    def epoch() -> Iterator[Any]:
        import torch

        count[0] += 1
        # Documents as NumPy: torch's jagged NestedTensor costs ~170 us a batch of
        # its own Python dispatch, which would hide the reads compared here.
        output = "numpy" if documents else "torch"
        for batch in Loader(source, batch_size, seed=count[0], output=output, epochs=1):
            ids = batch["input_ids"]
            yield torch.from_numpy(ids.values) if documents else ids
    return epoch


class _Stream:
    """Batches from ``make()``'s epochs, one after another."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self._make = make
        self._it = make()

    def take(self, count: int) -> int:
        """Tokens in the next ``count`` batches."""
        tokens = 0
        for _ in range(count):
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = self._make()
                batch = next(self._it)
            tokens += int(batch.numel())
        return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=float, default=1e8)
    parser.add_argument("--out", type=Path, default=None, help="keep the corpora here")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch", type=int, default=BATCH, help="windows a batch")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    tokens = int(args.tokens)
    root = args.out or Path(tempfile.mkdtemp(prefix="zb-peers-"))
    paths = build(root / f"{tokens}", tokens, ["datatrove", "litdata", "mds", "native"])
    loaders = {
        "datatrove DataLoader": _datatrove(paths["datatrove"], args.batch),
        "zerobatch on .ds": _zerobatch(paths["datatrove"], args.batch),
        "LitData StreamingDataLoader": _litdata(paths["litdata"], args.batch),
        "zerobatch on LitData": _zerobatch(paths["litdata"], args.batch),
        "zerobatch on MDS": _zerobatch(paths["mds"], args.batch),
        "zerobatch native": _zerobatch(paths["native"], args.batch),
        "zerobatch documents on MDS": _zerobatch(paths["mds"], args.batch, documents=True),
        "zerobatch documents native": _zerobatch(paths["native"], args.batch, documents=True),
    }
    for path in paths.values():
        warm(path)  # in the page cache: the rounds compare loaders, not the disk
    streams = {name: _Stream(make) for name, make in loaders.items()}
    for stream in streams.values():
        stream.take(2)  # imports, first opens and kernels, untimed
    wall: dict[str, list[float]] = {name: [] for name in streams}
    cpu: dict[str, list[float]] = {name: [] for name in streams}
    loads = []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, stream in streams.items():
            t, c = time.perf_counter(), time.process_time()
            n = stream.take(args.batches)
            wall[name].append(n / (time.perf_counter() - t))
            cpu[name].append(n / max(time.process_time() - c, 1e-9))
    print(f"tokens {tokens:,}, seq_len {SEQ}, batch {args.batch}, {args.rounds} interleaved rounds "
          f"of {args.batches} batches; nproc {os.cpu_count()}; load during rounds "
          f"{min(loads):.1f}-{max(loads):.1f}")
    print(f"{'loader':<28} {'M tok/s wall':>13} {'M tok/CPU-s':>12}  (medians; min-max)")
    for name in streams:
        w, c = wall[name], cpu[name]
        print(f"{name:<28} {median(w) / 1e6:>13.1f} {median(c) / 1e6:>12.1f}  "
              f"({min(w) / 1e6:.1f}-{max(w) / 1e6:.1f}; {min(c) / 1e6:.1f}-{max(c) / 1e6:.1f})")
    bars(f"peer_throughput_batch{args.batch}", {name: median(wall[name]) / 1e6 for name in streams},
         xlabel="M tokens/s, wall (median of rounds)",
         title=f"Shuffled tokens/s on the peers' own files, each at its defaults (batch "
               f"{args.batch}, windows of {SEQ}, {args.rounds} interleaved rounds)")
    pairs = (("zerobatch on .ds", "datatrove DataLoader"),
             ("zerobatch on LitData", "LitData StreamingDataLoader"),
             ("zerobatch on .ds", "zerobatch native"), ("zerobatch on LitData", "zerobatch native"),
             ("zerobatch on MDS", "zerobatch native"),
             ("zerobatch documents on MDS", "zerobatch documents native"))
    print("\nratios of medians (per round: the same round's two figures)")
    for ours, theirs in pairs:
        per_round_wall = [a / b for a, b in zip(wall[ours], wall[theirs], strict=True)]
        per_round_cpu = [a / b for a, b in zip(cpu[ours], cpu[theirs], strict=True)]
        print(f"{ours} / {theirs}: wall {median(per_round_wall):.2f}x "
              f"({min(per_round_wall):.2f}-{max(per_round_wall):.2f}), CPU "
              f"{median(per_round_cpu):.2f}x ({min(per_round_cpu):.2f}-{max(per_round_cpu):.2f})")
    if args.profile:
        for name, stream in streams.items():
            profile = cProfile.Profile()
            profile.enable()
            stream.take(200)
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(8)
            lines = [line for line in text.getvalue().splitlines() if line.strip()]
            start = next(i for i, line in enumerate(lines) if "ncalls" in line)
            print(f"\n{name}: top functions by own time, 200 batches (main thread only)")
            print("\n".join(lines[start:start + 9]))


if __name__ == "__main__":
    main()
