"""LLMBATCH read speed against the limit and the loaders users would pick instead.

Measures, in one run and on the same records:
  * per-batch latency (p50/p95/p99) and tokens/s of ``read_batch_torch`` (int64),
    the int32 zero-copy path and ``read_batch``, warm and cold page cache;
  * the limit: ``astype(int64)`` of a resident array of one batch's shape;
  * seed 000's v1: a per-sample memmap reader stacking 32 records;
  * ``torch.utils.data.DataLoader`` over a map-style memmap dataset (batch 32,
    shuffle, 0 and 2 workers) and Hugging Face ``datasets`` with the torch format;
  * the Feistel permutation against ``np.random.default_rng().permutation``;
  * the streaming writer's peak resident memory on a large dataset.

Run: ``python benchmarks/batchfile.py`` (``--help`` for sizes). Needs torch;
``datasets`` is optional (``make bench`` installs it).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from _plot import bars

from zerobatch.batch_loader import BatchFileReader, BatchNativeLoader
from zerobatch.batch_writer import write_batch_dataset
from zerobatch.shuffle import Feistel

BATCH, SEQ = 32, 512
TOKENS = BATCH * SEQ


def chunks(records: int, seed: int = 0, rows: int = 8192) -> Iterator[np.ndarray]:
    """Random uint32 token records (< 50,257, like GPT-2's vocabulary), in chunks."""
    rng = np.random.default_rng(seed)
    for start in range(0, records, rows):
        yield rng.integers(0, 50_257, size=(min(rows, records - start), SEQ), dtype=np.uint32)


def evict(path: Path) -> None:
    """Drop ``path`` (a file or every file of a folder) from the page cache."""
    for file in [path] if path.is_file() else sorted(path.iterdir()):
        fd = os.open(file, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def percentiles(samples_ns: np.ndarray) -> tuple[float, float, float, float]:
    """p50, p95, p99 (microseconds) and tokens/s from per-batch times."""
    us = samples_ns / 1e3
    p50, p95, p99 = np.percentile(us, [50, 95, 99])
    return float(p50), float(p95), float(p99), TOKENS / (float(us.mean()) / 1e6)


def time_calls(call: Callable[[int], object], indices: np.ndarray) -> np.ndarray:
    """Per-call wall time in ns; each result is dropped before the next call."""
    out = np.empty(len(indices), dtype=np.int64)
    clock = time.perf_counter_ns
    for k, i in enumerate(indices.tolist()):
        start = clock()
        call(i)
        out[k] = clock() - start
    return out


def throughput(batches: Iterator[object], limit_s: float = 10.0, warmup: int = 3) -> float:
    """Tokens/s of an iterator of batches, after ``warmup`` batches, for at most ``limit_s``."""
    for _ in range(warmup):
        next(batches)
    count, start = 0, time.perf_counter()
    for _ in batches:
        count += 1
        if time.perf_counter() - start > limit_s:
            break
    return count * TOKENS / (time.perf_counter() - start)


class MemmapRecords(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The map-style dataset users write: one record per ``__getitem__``."""

    def __init__(self, path: Path, records: int) -> None:
        self.path, self.records = path, records
        self.data: np.memmap | None = None

    def __len__(self) -> int:
        return self.records

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.data is None:  # opened lazily: once per worker process
            self.data = np.memmap(self.path, dtype=np.uint32, mode="r", shape=(self.records, SEQ))
        return torch.from_numpy(self.data[i].astype(np.int64))


def loader_batches(dataset: MemmapRecords, workers: int) -> Iterator[torch.Tensor]:
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        persistent_workers=workers > 0,
    )
    while True:
        yield from loader


def hf_batches(
    flat: Path, records: int, folder: Path
) -> tuple[Iterator[torch.Tensor], Iterator[torch.Tensor]] | None:
    """Hugging Face ``datasets`` over the same records, memory-mapped Arrow, torch
    format: random batches by list indexing (its fastest path), and through a
    DataLoader (how most training scripts use it)."""
    try:
        import datasets
        import pyarrow as pa
    except ImportError:
        return None
    tokens = np.memmap(flat, dtype=np.uint32, mode="r").reshape(-1)
    column = pa.FixedSizeListArray.from_arrays(pa.array(tokens), SEQ)
    datasets.Dataset(pa.table({"input_ids": column})).save_to_disk(str(folder))
    ds = datasets.load_from_disk(str(folder)).with_format("torch")
    rng = np.random.default_rng(0)

    def indexed() -> Iterator[torch.Tensor]:
        while True:
            yield ds[rng.integers(0, records, BATCH).tolist()]["input_ids"]

    def loaded() -> Iterator[torch.Tensor]:
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, drop_last=True)
        while True:
            for batch in loader:
                yield batch["input_ids"]

    return indexed(), loaded()


def _paths(reader: BatchFileReader, cold: bool) -> dict[str, Callable[[int], object]]:
    if cold:  # a view costs nothing until touched: make the cold rows page the data in
        return {
            "read_batch_torch int64": reader.read_batch_torch,
            "read_batch_torch int32 + first touch": lambda i: reader.read_batch_torch(
                i, torch.int32
            ).sum(),
            "read_batch + first touch": lambda i: reader.read_batch(i).sum(),
        }
    return {
        "read_batch_torch int64": reader.read_batch_torch,
        "read_batch_torch int32 (zero-copy)": lambda i: reader.read_batch_torch(i, torch.int32),
        "read_batch (uint32 view)": reader.read_batch,
    }


def bench_reads(path: Path, label: str, rows: list[tuple[str, ...]], n: int, cold: bool) -> None:
    """Time each read path on the same random batches. Cold: every path gets a
    fresh reader after the file was evicted (pages still mapped by a live reader
    cannot be evicted, so readers are closed first)."""
    if not cold:
        with BatchFileReader(path) as reader:
            indices = np.random.default_rng(1).integers(0, reader.num_batches, size=n)
            for i in range(reader.num_batches):  # bring every page in, and map it
                reader.read_batch(i).sum()
            for name, call in _paths(reader, cold).items():
                p50, p95, p99, rate = percentiles(time_calls(call, indices))
                rows.append(
                    (label, name, f"{p50:.1f}", f"{p95:.1f}", f"{p99:.1f}", f"{rate / 1e6:,.0f}")
                )
    else:
        with BatchFileReader(path) as reader:
            indices = np.random.default_rng(1).integers(0, reader.num_batches, size=n)
            names = list(_paths(reader, cold))
        for name in names:
            gc.collect()
            evict(path)
            with BatchFileReader(path) as reader:
                p50, p95, p99, rate = percentiles(time_calls(_paths(reader, cold)[name], indices))
            rows.append(
                (label, name, f"{p50:.1f}", f"{p95:.1f}", f"{p99:.1f}", f"{rate / 1e6:,.0f}")
            )
    if cold:
        gc.collect()
        evict(path)
    loader = BatchNativeLoader(path)
    start = time.perf_counter()
    count = sum(1 for _ in loader)
    rate = count * TOKENS / (time.perf_counter() - start)
    rows.append(
        (label, "BatchNativeLoader epoch (block shuffle)", "", "", "", f"{rate / 1e6:,.0f}")
    )
    loader.close()


def limit_rates(n: int, records: int) -> list[tuple[float, float, float, float]]:
    """The issue's limit (one cache-hot resident batch cast to int64) and the same cast
    of random batches of a resident copy of the whole dataset (same memory traffic)."""
    rng = np.random.default_rng(2)
    hot = rng.integers(0, 50_257, size=(BATCH, SEQ), dtype=np.uint32)
    every = rng.integers(0, 50_257, size=(records // BATCH, BATCH, SEQ), dtype=np.uint32)
    indices = rng.integers(0, len(every), size=n)
    return [
        percentiles(time_calls(lambda _: hot.astype(np.int64), np.zeros(n, dtype=np.int64))),
        percentiles(time_calls(lambda i: every[i].astype(np.int64), indices)),
    ]


def bench_feistel(n: int) -> list[tuple[str, str, str]]:
    p = Feistel(n, seed=1)
    p.range(0, 1000)
    best_f = min(_timed(lambda: p.range(0, n)) for _ in range(3))
    arange = np.arange(n)
    best_a = min(_timed(lambda: p(arange)) for _ in range(3))
    best_np = min(_timed(lambda: np.random.default_rng(1).permutation(n)) for _ in range(3))
    return [
        (
            "np.random.default_rng().permutation(n)",
            f"{n / best_np / 1e6:,.1f}",
            "1.00",
            f"O(n): {n * 8 / 2**20:,.0f} MiB",
        ),
        ("Feistel(n).range(0, n)", f"{n / best_f / 1e6:,.1f}", f"{best_np / best_f:.2f}", "O(1)"),
        ("Feistel(n)(np.arange(n))", f"{n / best_a / 1e6:,.1f}", f"{best_np / best_a:.2f}", "O(1)"),
    ]


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def big_write(folder: Path, gigabytes: float) -> tuple[float, float, float]:
    """Write ``gigabytes`` with write_batch_dataset in a child process: (GB, seconds, peak RSS MiB).

    Peak RSS is the child's VmHWM (ru_maxrss would carry the parent's peak across exec)."""
    records = int(gigabytes * 1e9) // (SEQ * 4)
    code = (  # a bare child: no torch, only what a writing job imports
        "import sys, time, numpy as np;"
        "from zerobatch.batch_writer import write_batch_dataset;"
        "n = int(sys.argv[2]); rng = np.random.default_rng(0);"
        "gen = (rng.integers(0, 50257, size=(min(4096, n - s), 512), dtype=np.uint32)"
        " for s in range(0, n, 4096));"
        "t = time.perf_counter(); write_batch_dataset(sys.argv[1], gen, n, 32, 512, 7);"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1];"
        "print(time.perf_counter() - t, hwm)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder / "big.batch"), str(records)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    size = (folder / "big.batch").stat().st_size
    (folder / "big.batch").unlink()
    return size / 1e9, float(out[0]), int(out[1]) / 1024


def table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(
            "  ".join(
                str(c).ljust(w) if i < 2 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=104_829, help="seed 000's dataset size")
    parser.add_argument("--big-gb", type=float, default=2.0, help="size of the second file")
    parser.add_argument("--write-gb", type=float, default=10.0, help="streaming-writer memory test")
    parser.add_argument("--samples", type=int, default=20_000, help="timed calls per path")
    parser.add_argument("--feistel-n", type=int, default=10**7)
    parser.add_argument("--only-feistel", action="store_true",
                        help="only the permutation table (no files written)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="scratch folder (default: a temp dir)"
    )
    args = parser.parse_args()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    today = time.strftime("%Y-%m-%d")
    print(f"nproc={os.cpu_count()}  RAM={ram:.1f} GiB  torch={torch.__version__}  date={today}")
    if args.only_feistel:
        table(f"Permutation of n = {args.feistel_n:,}", ("method", "M idx/s", "vs numpy", "memory"),
              bench_feistel(args.feistel_n))
        return
    scratch = Path(tempfile.mkdtemp(prefix="zerobatch-bench-", dir=args.dir))
    try:
        small, flat = scratch / "seed.batch", scratch / "seed.u32"
        write_batch_dataset(small, chunks(args.records), args.records, BATCH, SEQ, 42)
        with open(flat, "wb") as f:  # the same records, headerless, for the per-sample readers
            for rows in chunks(args.records):
                f.write(rows.tobytes())
        big_records = int(args.big_gb * 2**30) // (SEQ * 4)
        big = scratch / "big.batch"
        write_batch_dataset(big, chunks(big_records, seed=5), big_records, BATCH, SEQ, 42)
        print(
            f"files: {small.stat().st_size / 1e6:,.0f} MB ({args.records:,} records), "
            f"{big.stat().st_size / 1e9:,.2f} GB ({big_records:,} records)"
        )

        rows: list[tuple[str, ...]] = []
        (p50, p95, p99, limit), (q50, q95, q99, ram_limit) = limit_rates(args.samples, args.records)
        rows.append(
            (
                "resident",
                "limit: astype(int64), one cache-hot batch",
                f"{p50:.1f}",
                f"{p95:.1f}",
                f"{p99:.1f}",
                f"{limit / 1e6:,.0f}",
            )
        )
        rows.append(
            (
                "resident",
                "limit: astype(int64), random batch in RAM",
                f"{q50:.1f}",
                f"{q95:.1f}",
                f"{q99:.1f}",
                f"{ram_limit / 1e6:,.0f}",
            )
        )
        for path, name in ((small, "205 MB"), (big, f"{args.big_gb:g} GiB")):
            bench_reads(path, f"{name} warm", rows, args.samples, cold=False)
            bench_reads(path, f"{name} cold", rows, min(args.samples, 3000), cold=True)
            gc.collect()
        table(
            "LLMBATCH reads, batch 32 x 512 (latency in microseconds)",
            ("file", "path", "p50", "p95", "p99", "M tok/s"),
            rows,
        )
        int64_rate = float(rows[2][5].replace(",", "")) * 1e6

        competitors: list[tuple[str, float]] = []
        memmap = np.memmap(flat, dtype=np.uint32, mode="r", shape=(args.records, SEQ))
        rng = np.random.default_rng(3)

        def v1() -> Iterator[torch.Tensor]:
            while True:
                idx = rng.integers(0, args.records, BATCH).tolist()
                yield torch.from_numpy(np.stack([memmap[i] for i in idx]).astype(np.int64))

        competitors.append(("seed v1: per-sample memmap + np.stack", throughput(v1())))
        dataset = MemmapRecords(flat, args.records)
        competitors.append(
            (
                "torch DataLoader, map-style memmap, 0 workers",
                throughput(loader_batches(dataset, 0)),
            )
        )
        competitors.append(
            (
                "torch DataLoader, map-style memmap, 2 workers",
                throughput(loader_batches(dataset, 2), warmup=10),
            )
        )
        hf = hf_batches(flat, args.records, scratch / "hf")
        if hf is not None:
            competitors.append(("HF datasets, torch format, ds[indices]", throughput(hf[0])))
            competitors.append(("HF datasets, torch format, DataLoader", throughput(hf[1])))
        else:
            print(
                "\n(datasets is not installed: Hugging Face row skipped; `make bench` installs it)"
            )
        int32_rate = float(rows[3][5].replace(",", "")) * 1e6
        comp_rows = [
            ("zerobatch read_batch_torch int64 (205 MB warm)", f"{int64_rate / 1e6:,.1f}", "1", ""),
            ("zerobatch read_batch_torch int32 (205 MB warm)", f"{int32_rate / 1e6:,.1f}", "", "1"),
        ]
        comp_rows += [
            (name, f"{rate / 1e6:,.2f}", f"{int64_rate / rate:,.0f}x", f"{int32_rate / rate:,.0f}x")
            for name, rate in competitors
        ]
        for name, rate in (
            ("limit: astype(int64), cache-hot batch", limit),
            ("limit: astype(int64), random batch in RAM", ram_limit),
        ):
            comp_rows.append((name, f"{rate / 1e6:,.1f}", f"{int64_rate / rate:.2f} of it", ""))
        table(
            "Against other readers, random batches of 32 x 512, warm cache",
            ("reader", "M tok/s", "int64 path is", "int32 path is"),
            comp_rows,
        )
        rates = {"zerobatch read_batch_torch int64": int64_rate,
                 "zerobatch read_batch_torch int32": int32_rate, **dict(competitors),
                 "limit: astype(int64), random batch in RAM": ram_limit}
        bars("batchfile", {name: rate / 1e6 for name, rate in rates.items()},
             title=f"Random batches of {BATCH} x {SEQ} tokens from a .batch file, warm cache",
             xlabel="M tokens/s (log scale)", log=True,
             labels={name: f"{rate / 1e6:,.1f}" for name, rate in rates.items()})

        table(
            f"Permutation of n = {args.feistel_n:,}",
            ("method", "M idx/s", "vs numpy", "memory"),
            bench_feistel(args.feistel_n),
        )
        if args.write_gb > 0:
            gb, seconds, rss = big_write(scratch, args.write_gb)
            table(
                "Streaming writer (write_batch_dataset, global Feistel shuffle, child process)",
                ("dataset", "seconds", "MB/s", "peak RSS MiB"),
                [(f"{gb:.2f} GB", f"{seconds:.1f}", f"{gb * 1e3 / seconds:,.0f}", f"{rss:,.0f}")],
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
