"""Weighted mixtures: start-up, throughput, proportions and large sizes against the peers.

1. Start-up (``--only startup``, the < 50 ms and < 20 MB targets): time and
   peak memory from the sources to the first batch of 512, for ``10**7`` and
   ``10**9`` samples over 100 and 2,000 sources: zerobatch's ``Mixture`` +
   ``Loader`` against megatron-core's ``BlendedDataset`` index build
   (``helpers.build_blending_indices``, the 10-byte-per-sample arrays it fills
   on rank 0 before training). Sources: real local token-stream datasets (the
   one-call read path; opening them is timed apart) and a user's source that
   holds no data (one read per source present). Each case runs in a fresh
   process; the Numba kernels' load from their cache (once a process) is
   done before the clock starts and printed apart; peak memory is
   tracemalloc's (NumPy's buffers included) less the first batch's arrays.
   The datasets' files are read into the page cache before each run, and
   Python's full garbage collections inside the timed window are printed
   apart (one costs ~100 ms once Numba is loaded, whoever triggers it).
2. Throughput (``--only throughput``, the >= 0.9 target): a Loader over a
   mixture of 100 token-stream datasets against a Loader over one dataset
   holding the same tokens (``--format``: written by zerobatch or by a peer's
   own writer, Megatron, datatrove or LitData, and read in place; windows of
   2,048 tokens, batches of 64 and 512, threads 0, 1 and 2), epochs
   interleaved, best of 5: wall and CPU-time ratios (one / mixture); then both
   Loaders' steps alternated one by one, the ratio of their median CPU time a
   step (the figure that holds under load).
3. Proportion error: per batch of 512, the largest ``|count / 512 - weight|``
   over sources and batches, zerobatch against torchdata's
   ``MultiNodeWeightedSampler`` (random draws) at the same weights.
4. Large sizes (``--only large``): 10**4 sources of up to 10**12
   observations, position 10**15: the cost of a lookup, O(sources) for a
   block's first position, O(1) after.

Run: ``python benchmarks/mixture.py [--only startup throughput proportions large]
[--megatron-max 1000000000] [--format native] [--quick]``. Megatron's build is O(samples *
sources) in time and 10 bytes a sample in memory; cases with samples *
sources above ``--megatron-max`` are extrapolated linearly from the largest
measured one (printed as such).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _files import warm
from _plot import bars, groups, lines, scratch_images

DOCUMENT_MASKING = ("position_ids", "cu_seqlens", "max_seqlen")

_STARTUP_ZEROBATCH = """
import json, os, sys, time, tracemalloc
begin = time.perf_counter()
import numpy as np
from zerobatch import Batch, Loader, Mixture, open_dataset
imported = time.perf_counter() - begin

class Source:
    '''A source of n observations that holds no data (a user's own source:
    the generic path, one read per source present in a step).'''
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def read(self, indices):
        return Batch.from_columns({"x": np.asarray(indices)})

size, count, kind, root, memory = sys.argv[1:6]
size, count, memory = int(size), int(count), memory == "memory"
sources_bytes = 0
rng = np.random.default_rng(0)
weights = rng.random(count) + 0.01
names = [f"source-{i}" for i in range(count)]
# Numba loads each kernel from its cache once a process (issue 21: measured and
# left): load the mixture's and the read path's here, apart from the start-up.
begin = time.perf_counter()
if kind == "windows":
    warm = {n: open_dataset(os.path.join(root, f"d{i}")).windows(2048) for i, n in
            enumerate(("a", "b"))}
else:
    warm = {"a": Source(10), "b": Source(10)}
next(iter(Loader(Mixture(warm, {"a": 1.0, "b": 1.0}, length=64), 8, output="numpy")))
kernels = time.perf_counter() - begin
if memory:
    tracemalloc.start()
import gc
collections = []  # (generation, seconds) of each garbage collection from here on
gc.callbacks.append(lambda phase, info: collections.append(
    (info["generation"], time.perf_counter() * (1 if phase == "stop" else -1))))
start, start_cpu = time.perf_counter(), time.process_time()
if kind == "windows":  # real datasets: open each folder (manifest, file sizes)
    sources = {n: open_dataset(os.path.join(root, f"d{i}")).windows(2048)
               for i, n in enumerate(names)}
else:
    lengths = (size * weights / weights.sum()).astype(np.int64) + 1
    sources = {n: Source(int(k)) for n, k in zip(names, lengths)}
opened, opened_cpu = time.perf_counter(), time.process_time()
collected = len(collections)
if memory:  # the sources' own memory (2,000 opened datasets: ~10 KiB each) apart
    sources_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
mixture = Mixture(sources, dict(zip(names, weights.tolist())), length=size, seed=1)
batch = next(iter(Loader(mixture, 512, output="numpy", num_threads=0)))
end, end_cpu = time.perf_counter(), time.process_time()
# Python's full collections (generation 2) in the window: they scan every object
# of the process (~120,000 with NumPy and Numba loaded: ~80-110 ms here), and the
# objects the opening made (~25 a dataset) make one due; reported apart.
full = sum(t for g, t in collections[collected:] if g == 2)
print(json.dumps({"open": opened - start, "open_cpu": opened_cpu - start_cpu, "gc": full,
                  "seconds": end - opened, "cpu": end_cpu - opened_cpu,
                  "peak": tracemalloc.get_traced_memory()[1] - sources_bytes if memory else 0,
                  "sources_bytes": sources_bytes if memory else 0,
                  "batch": sum(v.nbytes for v in batch.values() if hasattr(v, "nbytes")),
                  "kernels": kernels, "import": imported}))
"""

_STARTUP_MEGATRON = """
import json, sys, time, tracemalloc
import numpy
from megatron.core.datasets import helpers

size, count = int(sys.argv[1]), int(sys.argv[2])
rng = numpy.random.default_rng(0)
weights = rng.random(count) + 0.01
weights = weights / weights.sum()
tracemalloc.start()
start = time.perf_counter()
# BlendedDataset._build_indices, the uncached path: rank 0 fills these before training
dataset_index = numpy.zeros(size, dtype=numpy.int16)
dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
helpers.build_blending_indices(dataset_index, dataset_sample_index, weights, count, size, False)
first = dataset_index[:512], dataset_sample_index[:512]
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak": tracemalloc.get_traced_memory()[1]}))
"""


def _run(code: str, *args: object) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _datasets(root: Path, count: int) -> None:
    """``count`` small token-stream datasets ``root/d{i}`` (8 windows of 2,048
    tokens each; a source's length does not change the start-up): one written,
    the others copies of its files (the writer syncs each file: slow x 2,000)."""
    import shutil

    from zerobatch import StreamWriter

    first = root / "d0"
    if not first.exists():
        with StreamWriter(first) as writer:
            writer.add_document(np.random.default_rng(1).integers(0, 50_000, size=8 * 2048 + 1))
    for i in range(1, count):
        if not (root / f"d{i}").exists():
            shutil.copytree(first, root / f"d{i}")


def startup(megatron_max: int, sizes: list[int], counts: list[int],
            kinds: tuple[str, ...] = ("windows", "noop"), megatron: bool = True) -> None:
    """Start-up to the first batch of 512 (``Loader(num_threads=0)``: nothing
    read ahead), each case in a fresh process (the Numba kernels loaded before
    the clock starts, and reported apart); time and peak memory (tracemalloc:
    from the opened sources to the first batch, less the first batch's own
    arrays, 16 MiB of tokens for windows; the opened sources' own memory is
    printed apart) in two runs, as tracemalloc slows Python. Megatron's smallest size is always
    measured for each source count (the base of the extrapolation)."""
    print("## 1. start-up to the first batch of 512 (fresh process each; ms wall / CPU)")
    print("   windows: real local datasets (open = open_dataset of each, apart); noop: a "
          "user's source holding no data (one read per source present)")
    print("   zerobatch ms: from the opened sources to the first batch (the target), of which "
          "gc: Python's full garbage collections in it; files in the page cache")
    print(f"{'samples':>14} {'sources':>8} {'kind':>8} | {'open ms':>8} | {'zerobatch ms':>12} "
          f"{'CPU ms':>7} {'gc ms':>6} {'MiB':>6} | {'megatron ms':>11} {'MB':>7} | {'x':>6} | "
          "kernels ms, import ms (once a process)")
    measured: dict[int, tuple[int, float]] = {}  # sources -> (samples, seconds) largest run
    drawn: dict[str, dict[str, float]] = {}  # case -> reader -> ms (the figure)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "windows" in kinds:
            _datasets(root, max(counts))
            os.sync()  # no write-back of the new files under the first cases
        for size in sizes:
            for count in counts:
                if not megatron:  # zerobatch alone (the 50 ms target in under a minute)
                    theirs, note = {"seconds": float("nan"), "peak": float("nan")}, ""
                elif size * count <= megatron_max or count not in measured:
                    theirs = _run(_STARTUP_MEGATRON, size, count)
                    measured[count] = (size, theirs["seconds"])
                    note = ""
                else:  # O(samples * sources) time, 10 bytes a sample
                    base_size, base_seconds = measured[count]
                    theirs = {"seconds": base_seconds * size / base_size, "peak": 10 * size}
                    note = " (megatron extrapolated)"
                for kind in kinds:
                    if kind == "windows":
                        warm(root)
                    ours = _run(_STARTUP_ZEROBATCH, size, count, kind, root, "time")
                    memory = _run(_STARTUP_ZEROBATCH, size, count, kind, root, "memory")
                    peak = memory["peak"] - memory["batch"]  # the mixture's, not the tokens
                    opened = memory["sources_bytes"] / 2**20
                    print(f"{size:>14,} {count:>8,} {kind:>8} | {ours['open'] * 1e3:>8.1f} | "
                          f"{ours['seconds'] * 1e3:>12.1f} {ours['cpu'] * 1e3:>7.1f} "
                          f"{ours['gc'] * 1e3:>6.1f} "
                          f"{peak / 2**20:>6.2f} | {theirs['seconds'] * 1e3:>11.0f} "
                          f"{theirs['peak'] / 2**20:>7.0f} | "
                          f"{theirs['seconds'] / ours['seconds']:>6.0f} | "
                          f"{ours['kernels'] * 1e3:.0f}, {ours['import'] * 1e3:.0f}; sources "
                          f"{opened:.1f} MiB{note}")
                    case = f"1e{round(np.log10(size))} samples, {count:,} sources, {kind}"
                    drawn[case] = {"zerobatch Mixture + Loader": ours["seconds"] * 1e3}
                    if not np.isnan(theirs["seconds"]):
                        label = "megatron BlendedDataset" + (" (extrapolated)" if note else "")
                        drawn[case][label] = theirs["seconds"] * 1e3
    groups("mixture_startup", drawn, log=True, fmt="{:.3g} ms",
           title="Start-up to the first batch of 512 (target: zerobatch < 50 ms)",
           xlabel="ms from the opened sources to the first batch (log)")


def _write(folder: Path, tokens: np.ndarray, fmt: str = "native") -> Path:
    """``tokens`` as documents of 1,000 tokens in ``folder``, written by zerobatch's
    ``StreamWriter`` or (``fmt``: megatron, datatrove, litdata) by that peer's own
    writer (``peer_formats.py``); returns the path ``open_dataset`` takes."""
    if fmt != "native":
        import peer_formats

        ends = np.append(np.arange(1000, tokens.shape[0], 1000), tokens.shape[0])
        folder.mkdir(parents=True)
        getattr(peer_formats, f"_write_{fmt}")(folder, tokens, ends - np.diff(ends, prepend=0),
                                               ends)
        return folder / "corpus" if fmt == "megatron" else folder
    from zerobatch import StreamWriter

    with StreamWriter(folder, shard_tokens=1 << 22) as writer:
        for doc in np.split(tokens, np.arange(1000, tokens.shape[0], 1000)):
            writer.add_document(doc)
    return folder


def throughput(total_tokens: int, sources: int, seq_len: int, batch_size: int,
               repeats: int, columns: tuple[str, ...] | None, threads: tuple[int, ...] = (0, 1, 2),
               root: Path | None = None, fmt: str = "native") -> list[float]:
    """Loader epochs over one dataset and over a mixture of ``sources`` parts of
    the same tokens, interleaved ``repeats`` times; prints the best wall and
    CPU (process) time per step of each and their ratios (one / mixture: 1.0
    means the mixture costs nothing). Returns the CPU ratios, per thread count,
    then the ratio of the alternated steps' medians."""
    from zerobatch import Loader, Mixture, open_dataset

    print(f"\n## 2. Loader throughput: one dataset vs a mixture of {sources} "
          f"(files written by {'zerobatch' if fmt == 'native' else fmt}, windows of "
          f"{seq_len}, batch {batch_size}, output='numpy', columns "
          f"{columns or 'default'}; best of {repeats} interleaved epochs)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = (Path(tmp) if root is None else root) / fmt
        paths = [folder / "one", *(folder / f"part{i}" for i in range(sources))]
        if fmt == "megatron":
            paths = [path / "corpus" for path in paths]
        if not folder.exists():
            rng = np.random.default_rng(0)
            tokens = rng.integers(0, 50_000, size=total_tokens, dtype=np.uint16)
            _write(folder / "one", tokens, fmt)
            for i, part in enumerate(np.array_split(tokens, sources)):
                _write(folder / f"part{i}", part, fmt)
            os.sync()  # no write-back of the new files under the measurement
        options = {} if columns is None else {"columns": columns}
        one = open_dataset(paths[0]).windows(seq_len, **options)
        windows = {f"part{i}": open_dataset(path).windows(seq_len, **options)
                   for i, path in enumerate(paths[1:])}
        rows = sum(len(w) for w in windows.values())
        mixture = Mixture(windows, {n: float(len(w)) for n, w in windows.items()}, length=rows,
                          max_passes=1)
        fast = mixture._windows() is not None
        print(f"one source: {len(one):,} windows; mixture: {len(mixture):,} windows over "
              f"{sources} sources (one-call read path: {fast})")
        ratios = []
        for count in threads:
            wall: dict[str, list[float]] = {"one": [], "mixture": []}
            cpu: dict[str, list[float]] = {"one": [], "mixture": []}
            for _ in range(repeats):
                for name, source in (("one", one), ("mixture", mixture)):
                    loader = Loader(source, batch_size, num_threads=count, output="numpy")
                    iterator = iter(loader)
                    next(iterator)  # threads started, first blocks laid out
                    begin, begin_cpu, steps = time.perf_counter(), time.process_time(), 0
                    for _ in iterator:
                        steps += 1
                    wall[name].append((time.perf_counter() - begin) / steps)
                    cpu[name].append((time.process_time() - begin_cpu) / steps)
            per_step = batch_size * seq_len
            w = {n: min(v) for n, v in wall.items()}
            c = {n: min(v) for n, v in cpu.items()}
            ratios.append(c["one"] / c["mixture"])
            print(f"threads={count}: wall one {per_step / w['one'] / 1e6:7.1f} M tok/s, mixture "
                  f"{per_step / w['mixture'] / 1e6:7.1f} M tok/s, "
                  f"ratio {w['one'] / w['mixture']:.3f}"
                  f" | CPU one {c['one'] * 1e6:6.1f} us/step, mixture {c['mixture'] * 1e6:6.1f} "
                  f"us/step, ratio {c['one'] / c['mixture']:.3f}")
        # Steps alternated one by one (caller's thread): both loaders see the same
        # machine, so a loaded machine's noise cancels in the ratio of medians.
        steps: dict[str, list[int]] = {"one": [], "mixture": []}
        clock = time.thread_time_ns
        for _ in range(repeats):
            first = iter(Loader(one, batch_size, num_threads=0, output="numpy"))
            second = iter(Loader(mixture, batch_size, num_threads=0, output="numpy"))
            next(first), next(second)
            while True:
                t0 = clock()
                a = next(first, None)
                t1 = clock()
                b = next(second, None)
                t2 = clock()
                if a is None or b is None:
                    break
                steps["one"].append(t1 - t0)
                steps["mixture"].append(t2 - t1)
        m = {n: float(np.median(v)) / 1e3 for n, v in steps.items()}
        print(f"steps alternated (threads=0, {len(steps['one']):,} pairs): CPU median one "
              f"{m['one']:6.1f} us/step, mixture {m['mixture']:6.1f} us/step, ratio "
              f"{m['one'] / m['mixture']:.3f}")
        return [*ratios, m["one"] / m["mixture"]]


def proportions(batches: int, batch_size: int, count: int) -> None:
    from torchdata.nodes import IterableWrapper, MultiNodeWeightedSampler

    from zerobatch import Batch, Mixture

    print(f"\n## 3. proportion error per batch of {batch_size} ({count} sources, "
          f"{batches} batches)")
    rng = np.random.default_rng(3)
    weights = rng.random(count) ** 3 + 0.002
    weights /= weights.sum()
    names = [f"s{i}" for i in range(count)]

    class Source:
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def read(self, indices: np.ndarray) -> Batch:
            return Batch.from_columns({"x": np.asarray(indices)})

    total = batches * batch_size
    mixture = Mixture({n: Source(10**6) for n in names}, dict(zip(names, weights, strict=True)),
                      length=total, seed=0)
    ours = mixture.locate(np.arange(total))[0].reshape(batches, batch_size)
    nodes = {n: IterableWrapper([i] * 10) for i, n in enumerate(names)}
    sampler = MultiNodeWeightedSampler(nodes, dict(zip(names, weights.tolist(), strict=True)),
                                       stop_criteria="CYCLE_FOREVER", seed=0)
    theirs = np.fromiter((next(sampler) for _ in range(total)), dtype=np.int64, count=total)
    theirs = theirs.reshape(batches, batch_size)
    errors = {}
    for name, drawn in (("zerobatch Mixture", ours), ("torchdata MultiNodeWeightedSampler",
                                                      theirs)):
        counts = np.stack([np.bincount(row, minlength=count) for row in drawn])
        error = np.abs(counts / batch_size - weights).max()
        whole = np.abs(counts.sum(0) / total - weights).max()
        errors[name] = error * batch_size
        print(f"{name:>36}: max per-batch error {error:.5f} ({error * batch_size:.1f} rows); "
              f"over all {total:,} rows {whole:.6f}")
    bars("mixture_proportions", errors, xlabel="rows off the target count (largest over batches "
         "and sources)", title=f"Proportion error per batch of {batch_size}, {count} sources, "
         f"{batches:,} batches")


def large(counts: tuple[int, ...] = (100, 1_000, 10_000), position: int = 10**15,
          repeats: int = 5) -> None:
    """The order at large sizes: sources of up to 10**12 observations, a
    position of 10**15. Per source count: building the order, the first
    lookup in a block never seen (its counts and slots before it: O(sources),
    and its layout: O(block)), and a step of 512 positions inside a known
    block (O(1) each). CPU time of this thread, best of ``repeats``."""
    from zerobatch.mixture import MixtureOrder, Stage

    print(f"\n## 4. large sizes: position {position:.0e}, lengths up to 1e12 (CPU ms, best of "
          f"{repeats})")
    print(f"{'sources':>8} | {'build':>8} | {'first lookup (new block)':>24} | "
          f"{'512 positions, known block':>26} | {'per source (new block)':>22}")
    series: dict[str, list[float]] = {"zerobatch: build the order": [],
                                      "zerobatch: first lookup in a new block": [],
                                      "zerobatch: 512 positions in a known block": []}
    for count in counts:
        rng = np.random.default_rng(count)
        lengths = rng.integers(1, 10**12, size=count).tolist()
        weights = {f"s{i}": float(w) for i, w in enumerate(rng.random(count) + 1e-3)}
        names = list(weights)
        best = {"build": 1e9, "first": 1e9, "step": 1e9}
        for r in range(repeats):
            begin = time.thread_time()
            order = MixtureOrder(names, lengths, [Stage(0, weights)], seed=r)
            table = order.table()
            best["build"] = min(best["build"], time.thread_time() - begin)
            at = position + r * 4096  # a block no earlier repeat laid out
            begin = time.thread_time()
            sources, index, _ = order.observe(np.array([at], dtype=np.int64), table)
            best["first"] = min(best["first"], time.thread_time() - begin)
            assert 0 <= index[0] < lengths[int(sources[0])]
            step = np.arange(at, at + 512, dtype=np.int64)
            begin = time.thread_time()
            order.observe(step, table)
            best["step"] = min(best["step"], time.thread_time() - begin)
        print(f"{count:>8,} | {best['build'] * 1e3:>8.2f} | {best['first'] * 1e3:>24.3f} | "
              f"{best['step'] * 1e3:>26.3f} | {best['first'] / count * 1e9:>19.0f} ns")
        for values, key in zip(series.values(), ("build", "first", "step"), strict=True):
            values.append(best[key] * 1e3)
    lines("mixture_large", counts, series, logy=True, xlabel="sources",
          ylabel=f"CPU ms (best of {repeats})",
          title=f"The order at position {position:.0e}, lengths up to 1e12: O(sources), no table")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-max", type=int, default=10**9,
                        help="largest samples * sources Megatron's index is built for "
                             "(above: extrapolated from the largest measured)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--no-megatron", action="store_true",
                        help="start-up: zerobatch alone (Megatron's 2,000-source build takes "
                             "about a minute)")
    parser.add_argument("--format", default="native",
                        choices=["native", "megatron", "datatrove", "litdata"],
                        help="throughput: who writes the files (a peer's own writer: read in "
                             "place)")
    parser.add_argument("--only", nargs="+",
                        default=["startup", "throughput", "proportions", "large"],
                        choices=["startup", "throughput", "proportions", "large"])
    args = parser.parse_args()
    print(f"nproc={os.cpu_count()} load={os.getloadavg()} date={time.strftime('%Y-%m-%d %H:%M')}")
    if args.quick:
        scratch_images()
        startup(10**10, [10**5], [100], ("windows",))
        throughput(2_000_000, 20, 512, 16, 1, ("input_ids", "labels"), (0,))
        proportions(50, 512, 20)
        large((100,), repeats=1)
        return
    if "startup" in args.only:
        startup(args.megatron_max, [10**7, 10**9], [100, 2_000],
                megatron=not args.no_megatron)
    if "throughput" in args.only:
        shares: dict[str, float] = {}
        with tempfile.TemporaryDirectory() as tmp:  # the datasets written once for all cases
            for batch_size, columns in ((64, ("input_ids", "labels")),
                                        (512, ("input_ids", "labels")),
                                        (64, ("input_ids", "labels", *DOCUMENT_MASKING))):
                threads = (0, 1, 2)
                ratios = throughput(40_000_000, 100, 2048, batch_size, 5, columns, threads,
                                    root=Path(tmp), fmt=args.format)
                masking = ", masking columns" if len(columns) > 2 else ""
                cases = [f"threads={count}" for count in threads] + ["steps alternated"]
                for case, ratio in zip(cases, ratios, strict=True):
                    shares[f"zerobatch, batch {batch_size}{masking}, {case}"] = ratio
        bars(f"mixture_throughput{'' if args.format == 'native' else '_' + args.format}", shares,
             limit=0.9, limit_label="target 0.9",
             xlabel="CPU time a step: one dataset / mixture of 100 (1.0: the mixture is free)",
             title=f"Loader over a mixture of 100 sources against one source ({args.format} "
                   "files, best of 5)")
    if "proportions" in args.only:
        proportions(2_000, 512, 100)
    if "large" in args.only:
        large()

if __name__ == "__main__":
    main()
