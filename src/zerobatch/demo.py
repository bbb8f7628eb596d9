"""The main job: tokenize a real corpus, write it as LLMBATCH, train a tiny model on it.

The corpus is the Python standard library's own source, which every machine
with Python has. Tokens are bytes (ids 0..255) plus an end-of-document id 256.
Run with ``make demo`` or ``python -m zerobatch.demo``.
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from zerobatch.batch_loader import BatchFileReader, BatchNativeLoader
from zerobatch.batch_writer import write_batch_dataset

__all__ = ["main"]

EOS = 256
VOCAB = 257


def corpus_files(limit_bytes: int) -> list[Path]:
    """Standard-library ``.py`` files in a fixed order, about ``limit_bytes`` in all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        files.append(path)
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    return files


def byte_tokens(files: list[Path]) -> np.ndarray:
    """All files as one stream of byte tokens, each document ending with EOS."""
    pieces = []
    for path in files:
        pieces.append(np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.uint16))
        pieces.append(np.array([EOS], dtype=np.uint16))
    return np.concatenate(pieces)


def records(stream: np.ndarray, record_len: int, chunk: int = 4096) -> Iterator[np.ndarray]:
    """Fixed-length records cut from the stream, ``chunk`` records at a time."""
    usable = len(stream) // record_len * record_len
    rows = stream[:usable].reshape(-1, record_len)
    for start in range(0, len(rows), chunk):
        yield rows[start : start + chunk]


def _model(seq_len: int) -> object:
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        mask: torch.Tensor  # a registered buffer: the causal attention mask

        def __init__(self, width: int = 96, layers: int = 2, heads: int = 4) -> None:
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, width)
            self.positions = nn.Embedding(seq_len, width)
            layer = nn.TransformerEncoderLayer(
                width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
            )
            self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(width, VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            n = ids.shape[1]
            x = self.tokens(ids) + self.positions.weight[:n]
            return self.head(self.body(x, mask=self.mask[:n, :n], is_causal=True))

    return TinyLM()


def main(argv: list[str] | None = None) -> None:
    """Run the demo; sizes in bytes and steps are adjustable for a quick look."""
    parser = argparse.ArgumentParser(prog="python -m zerobatch.demo", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--corpus-bytes", type=int, default=12_000_000)
    parser.add_argument(
        "--seq-len",
        type=int,
        default=63,
        help="tokens the model sees; records are one longer (64 x 32 uint16 = one 4 KiB page)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "stdlib.batch"
    record_len = args.seq_len + 1  # one extra token: labels are inputs shifted by one

    started = time.perf_counter()
    files = corpus_files(args.corpus_bytes)
    stream = byte_tokens(files)
    total = len(stream) // record_len
    batches = write_batch_dataset(
        path,
        records(stream, record_len),
        total,
        args.batch_size,
        record_len,
        seed=1234,
        dtype="uint16",
    )
    took = time.perf_counter() - started
    print(
        f"corpus: {len(files)} standard-library files, {len(stream):,} byte tokens\n"
        f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB): {batches:,} batches of "
        f"{args.batch_size} x {record_len} tokens, globally shuffled, in {took:.1f} s"
    )

    with BatchFileReader(path) as reader:
        for _ in range(3):  # warm the page cache, then time a pass of the loader alone
            for i in range(reader.num_batches):
                reader.read_batch(i)
    loader = BatchNativeLoader(path, block_size=16, seed=1234)
    started = time.perf_counter()
    count = sum(1 for _ in loader)
    rate = count * args.batch_size * record_len / (time.perf_counter() - started)
    print(f"loader alone: {count:,} batches, {rate / 1e6:,.0f} M tokens/s")

    model = _model(args.seq_len)
    assert isinstance(model, torch.nn.Module)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    print(
        f"training a {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M-parameter "
        f"transformer for {args.steps} steps (uniform guess: loss {math.log(VOCAB):.2f})"
    )
    step, epoch, waited, value, first_loss = 0, 0, 0.0, math.nan, None
    started = time.perf_counter()
    while step < args.steps:
        loader.set_epoch(epoch)
        fetch = time.perf_counter()
        for batch in loader:
            waited += time.perf_counter() - fetch
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            value = loss.item()
            first_loss = value if first_loss is None else first_loss
            if step % 25 == 0 or step == 1:
                elapsed = time.perf_counter() - started
                print(
                    f"  step {step:4d}  epoch {epoch}  loss {value:.3f}  "
                    f"({step * args.batch_size * args.seq_len / elapsed:,.0f} tokens/s trained)"
                )
            if step >= args.steps:
                break
            fetch = time.perf_counter()
        epoch += 1
    elapsed = time.perf_counter() - started
    print(
        f"loss {first_loss:.3f} -> {value:.3f} in {elapsed:.0f} s; the loader took "
        f"{waited * 1e3:.1f} ms of it ({100 * waited / elapsed:.3f}%), "
        f"{waited / step * 1e6:.0f} us per batch"
    )
    loader.close()


if __name__ == "__main__":
    main()
