"""What does the Loader cost over its reads, and how does it compare with peers?

Windows of 2,048 tokens, batch 32, shuffled, int64 ``input_ids`` and
``labels``, a uint16 dataset of one shard, warm page cache. Everything is
measured in this run, passes interleaved, best of each:

0. The headline: the README's path, ``Loader(open_dataset(p).windows(2048),
   32)`` with every default (torch output), the same with
   ``document_masking=True``, the Loader tuned (``zerobatch.tools.bench.tune``)
   and each peer at its own documented defaults, as shares of the same-run
   limit: ``np.memmap``, one fancy-indexing gather of 32 windows of 2,049
   tokens, ``astype(int64)``, inputs and labels split (three lines of NumPy).
   Each pass builds a fresh iterator and skips its first batch
   (``zerobatch.tools.bench.rates``); the Loaders run with ``epochs=None`` so
   that they never run out (no other effect). Peers: torch ``DataLoader``
   (map-style memmap dataset, ``shuffle=True``: 0 workers, its default), Hugging
   Face ``datasets`` (``load_from_disk``, numpy format, ``ds[indices]``),
   LitData (``StreamingDataset`` + ``TokensLoader``, ``StreamingDataLoader``),
   Grain (``MapDataset`` indexed in the caller's thread, and
   ``to_iter_dataset()`` with its default ``ReadOptions``). Draws
   ``docs/img/loader.png``. The columns and figures below it use
   ``position_ids`` too (``COLUMNS``).

1. Loader overhead: tokens/s of ``Loader`` (output ``"batch"``, and one row
   ``"torch"``) with ``num_threads`` 0, 1 and 2 against the same
   ``windows.read`` calls in a plain loop, indices computed before timing or
   by ``Plan.indices`` in the loop, or with each batch kept alive during the
   next read (as a ``for`` loop does: the reader's arena then alternates two
   buffers instead of reusing one), and CPU seconds per batch
   (``time.process_time``, all threads), which other processes on the machine
   disturb less than wall time. "1 thread" is one background reader, plus
   the caller's own thread, which reads a later step whenever the next one is
   not ready (here: always, the consumer does nothing), so two threads read.
   Then the same over a source whose read returns a prebuilt batch: what the
   plan and the Loader cost per step alone.
2. Overlap: a consumer that sleeps a fixed time per step (GIL-free, 2x and 5x
   the measured read time) times how long it waits in ``next()`` for data,
   with ``prefetch`` 0 and 2 (one reader thread).
3. Peers on the same tokens: torch ``DataLoader`` over a map-style memmap
   dataset (0 and 2 workers), Hugging Face ``datasets`` (memory-mapped Arrow,
   random rows), LitData (``TokensLoader``, ``StreamingDataset``) and Grain
   (``MapDataset`` over the memmap, in the caller's thread and on 2 threads).
   Passes of every reader are interleaved; a reader that reads ahead (torch
   workers, threads) may have up to its buffer ready when its pass starts, a
   few batches of each pass. Peers return ``input_ids`` and
   ``labels`` only; zerobatch also computes ``position_ids``. A peer that is
   not installed is skipped.
4. Start and resume: time to the first batch after construction, and after
   ``load_state_dict`` at step 10^9, on a synthetic source of 10^12
   observations; peak RSS of a fresh process for 10^6 versus 10^12.
5. Pictures of 4 on the real dataset: the first batch after resuming at step
   k (zerobatch: ``load_state_dict``; a replaying loader, torch
   ``DataLoader`` with 0 workers, reads and drops k batches, as resuming an
   iterator without a state protocol does), ``docs/img/loader_resume.png``;
   peak RSS of a fresh process against the dataset's length (zerobatch's
   synthetic source; torch's ``RandomSampler``, which draws a permutation of
   the whole dataset each epoch), ``docs/img/loader_memory.png``.

6. A training loop's step time (``--overlap``): a consumer that waits a
   fixed time per step, GIL-free (``time.sleep``, as a step on a GPU) or in
   Python (a spin loop holding the GIL), 10 us to 3 ms; the README path at
   its defaults (automatic ``num_threads``) against ``num_threads=0`` and
   ``num_threads=1, prefetch=2``, best step time over interleaved passes, and
   where the default ended up reading. Draws ``docs/img/loader_overlap_sleep.png``
   and ``loader_overlap_spin.png``.

    python benchmarks/loader.py [--quick] [--tokens 64_000_000] [--passes 5]
        [--headline (section 0, three runs) | --pictures (section 5) | --overlap (6)]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _files import warm
from _plot import bars, lines, scratch_images

from zerobatch import Batch, Loader, StreamWriter, open_dataset
from zerobatch.plan import Plan
from zerobatch.tools.bench import LIMIT, numpy_windows, rates, tune

SEQ_LEN, BATCH = 2048, 32
COLUMNS = ("input_ids", "labels", "position_ids")


def _write(path: Path, tokens: int) -> None:
    """Random documents of 200..3,000 uint16 tokens, one shard."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(200, 3000, size=tokens // 1600 + 1)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), tokens) + 1]
    data = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    with StreamWriter(path, shard_tokens=2 * tokens) as writer:
        for i in range(len(lengths)):
            writer.add_document(data[starts[i] : starts[i + 1]])


def _time(run: Callable[[], int]) -> tuple[float, float]:
    """(wall, CPU) seconds per batch of one pass; ``run`` returns its batches."""
    wall, cpu = time.perf_counter(), time.process_time()
    batches = run()
    return (time.perf_counter() - wall) / batches, (time.process_time() - cpu) / batches


def _best(runs: dict[str, Callable[[], int]], passes: int) -> dict[str, tuple[float, float]]:
    """Best wall and best CPU seconds per batch of each run, passes interleaved."""
    best = {name: (float("inf"), float("inf")) for name in runs}
    for _ in range(passes):
        for name, run in runs.items():
            wall, cpu = _time(run)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def _overhead(windows: Any, steps: int, passes: int) -> dict[str, tuple[float, float]]:
    plan = Plan(len(windows), BATCH, seed=1)
    indices = [plan.indices(0, k * BATCH, 0)[0] for k in range(steps)]

    def plain() -> int:
        for index in indices:
            windows.read(index)
        return steps

    def planned() -> int:
        for k in range(steps):
            windows.read(plan.indices(0, k * BATCH, 0)[0])
        return steps

    def holding() -> int:
        batch = None
        for index in indices:
            batch = windows.read(index)  # alive during the next read, as in a for loop
        del batch
        return steps

    def loader(threads: int, output: str = "batch", prefetch: int = 2) -> Callable[[], int]:
        def run() -> int:
            with Loader(windows, BATCH, seed=1, num_threads=threads, prefetch=prefetch,
                        output=output) as source:  # type: ignore[arg-type]
                for _ in itertools.islice(source, steps):
                    pass
            return steps
        return run

    return _best({"plain loop of windows.read": plain,
                  "plain loop, plan.indices in the loop": planned,
                  "plain loop, previous batch held": holding,
                  "Loader, 0 threads": loader(0),
                  "Loader, 1 thread": loader(1),
                  "Loader, 1 thread, prefetch 4": loader(1, prefetch=4),
                  "Loader, 2 threads": loader(2),
                  "Loader, 2 threads, prefetch 4": loader(2, prefetch=4),
                  "Loader, 1 thread, torch output": loader(1, "torch")}, passes)


class Prebuilt:
    """10^9 observations; every read returns the same prebuilt batch (no work)."""

    def __init__(self) -> None:
        self.batch = Batch.from_columns({"index": np.arange(BATCH)})

    def __len__(self) -> int:
        return 10**9

    def read(self, indices: np.ndarray) -> Batch:
        return self.batch


def _machinery(steps: int, passes: int) -> dict[str, tuple[float, float]]:
    """Per-step cost of the plan and the Loader alone, over :class:`Prebuilt`."""
    source = Prebuilt()
    plan = Plan(len(source), BATCH, seed=1)

    def planned() -> int:
        for k in range(steps):
            source.read(plan.indices(0, k * BATCH, 0)[0])
        return steps

    def loader(threads: int) -> Callable[[], int]:
        def run() -> int:
            with Loader(source, BATCH, seed=1, num_threads=threads, output="batch") as batches:
                for _ in itertools.islice(batches, steps):
                    pass
            return steps
        return run

    return _best({"plain loop, plan.indices in the loop": planned,
                  **{f"Loader, {n} thread(s)": loader(n) for n in (0, 1, 2)}}, passes)


def _overlap(windows: Any, step_s: float, steps: int) -> dict[int, float]:
    """Share of each step spent waiting for data, the consumer sleeping ``step_s``."""
    shares = {}
    for prefetch in (0, 2):
        best = float("inf")
        for _ in range(3):
            waited = 0.0
            with Loader(windows, BATCH, seed=2, prefetch=prefetch, num_threads=1,
                        output="batch") as loader:
                iterator = iter(loader)
                next(iterator)  # the pipeline fills
                for _ in range(steps):
                    start = time.perf_counter()
                    next(iterator)
                    waited += time.perf_counter() - start
                    time.sleep(step_s)
            best = min(best, waited / (waited + steps * step_s))
        shares[prefetch] = best
    return shares


def _spin(seconds: float) -> None:
    """Busy the calling thread for ``seconds`` in Python (holding the GIL), as a
    CPU-bound training step's Python does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


DEFAULT = "zerobatch defaults (automatic)"
OVERLAP = {DEFAULT: {}, "num_threads=0": {"num_threads": 0},
           "num_threads=1, prefetch=2": {"num_threads": 1, "prefetch": 2}}
"""The Loader settings section 6 compares (README path, torch output)."""
OVERLAP_WAITS = [1e-5, 1e-4, 3e-4, 1e-3, 3e-3]  # seconds a step
TITLES = {"sleep": "sleeps (GIL free, as a GPU step)", "spin": "spins in Python (holds the GIL)"}


def _overlap_steps(windows: Any, waits: list[float], passes: int, seconds: float) -> None:
    """Section 6: does the default hurt a training loop? A consumer that does a
    fixed wait per step, GIL-free (``time.sleep``: a GPU step, whose Python
    waits on the device) or holding the GIL (``_spin``: Python on the CPU).
    Per wait, the best step time of each setting over interleaved passes,
    and the default's against the best of the others. Draws
    ``loader_overlap_sleep.png`` and ``loader_overlap_spin.png``."""
    print("6. A training loop's step time: the consumer waits a fixed time per step "
          "(sleep: GIL free, as on a GPU; spin: Python on the CPU); best of "
          f"{passes} interleaved passes of ~{seconds:.1f} s; README path, torch output")
    for kind, wait in (("sleep", time.sleep), ("spin", _spin)):
        best = {name: [float("inf")] * len(waits) for name in OVERLAP}
        modes: dict[str, list[str]] = {name: [""] * len(waits) for name in OVERLAP}
        for _ in range(passes):
            for w, step in enumerate(waits):
                for name, settings in OVERLAP.items():
                    loader = Loader(windows, BATCH, seed=5, epochs=None, **settings)
                    batches = iter(loader)
                    for _ in range(24):  # the pipeline fills; the default decides (16 steps)
                        next(batches)
                        wait(step)
                    count, started = 0, time.perf_counter()
                    while count < 8 or time.perf_counter() - started < seconds:
                        next(batches)
                        wait(step)
                        count += 1
                    best[name][w] = min(best[name][w], (time.perf_counter() - started) / count)
                    modes[name][w] = "thread" if loader._threads is not None else "caller"
                    loader.close()
        rows = []
        for w, step in enumerate(waits):
            others = min(best[name][w] for name in OVERLAP if name != DEFAULT)
            rows.append((f"{kind} {step * 1e6:,.0f} us",
                         *(f"{best[name][w] * 1e6:,.0f}" for name in OVERLAP),
                         f"{best[DEFAULT][w] / others:.2f}", modes[DEFAULT][w]))
        _table(rows, ("wait per step", *(f"{n} us/step" for n in OVERLAP),
                      "default / best other", "default read in"))
        lines(f"loader_overlap_{kind}", [s * 1e3 for s in waits],
              {name: [best[name][w] / min(best[n][w] for n in OVERLAP)
                      for w in range(len(waits))] for name in OVERLAP},
              title=f"Step time of a loop that {TITLES[kind]} per step",
              xlabel="wait per step, ms", ylabel="step time / best setting's")


def _windows_memmap(path: Path) -> np.ndarray:
    return np.memmap(path / "00000.tokens", dtype="<u2", mode="r")


def _rates(readers: dict[str, Iterator[Any]], steps: int, passes: int) -> dict[str, float]:
    """Best batches/s of each reader over ``passes`` runs of ``steps`` batches,
    passes interleaved (after a first batch each)."""
    for batches in readers.values():
        next(batches)
    best = dict.fromkeys(readers, 0.0)
    for _ in range(passes):
        for name, batches in readers.items():
            start = time.perf_counter()
            for _ in range(steps):
                next(batches)
            best[name] = max(best[name], steps / (time.perf_counter() - start))
    return best


def _torch_peer(tokens: np.ndarray, workers: int) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Windows(Dataset):
        def __len__(self) -> int:
            return (len(tokens) - 1) // SEQ_LEN

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            window = tokens[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1].astype(np.int64)
            return {"input_ids": torch.from_numpy(window[:-1]),
                    "labels": torch.from_numpy(window[1:])}

    loader = DataLoader(Windows(), batch_size=BATCH, shuffle=True, drop_last=True,
                        num_workers=workers, persistent_workers=workers > 0)
    while True:
        yield from loader


def _hf_dataset(tokens: np.ndarray, folder: Path) -> Any:
    """The windows saved as a Hugging Face dataset and loaded back (numpy format)."""
    import datasets
    import pyarrow as pa

    rows = (len(tokens) - 1) // SEQ_LEN
    starts = np.arange(rows)[:, None] * SEQ_LEN + np.arange(SEQ_LEN + 1)
    column = pa.FixedSizeListArray.from_arrays(pa.array(tokens[starts].reshape(-1)), SEQ_LEN + 1)
    datasets.Dataset(pa.table({"tokens": column})).save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder)).with_format("numpy")


def _hf_peer(tokens: np.ndarray, folder: Path) -> Iterator[Any]:
    return _hf_batches(_hf_dataset(tokens, folder), len(tokens))


def _hf_batches(ds: Any, count: int) -> Iterator[Any]:
    rows = (count - 1) // SEQ_LEN
    rng = np.random.default_rng(0)
    while True:
        window = ds[rng.integers(0, rows, BATCH).tolist()]["tokens"].astype(np.int64)
        yield {"input_ids": window[:, :-1], "labels": window[:, 1:]}


def _litdata_chunk(part: tuple[str, int, int]) -> Iterator[Any]:
    import torch

    path, start, stop = part
    tokens = np.memmap(path, dtype="<u2", mode="r")
    yield torch.from_numpy(tokens[start:stop].astype(np.int32))


def _litdata_files(tokens_path: Path, count: int, folder: Path) -> Path:
    """The tokens optimized into LitData chunks (``TokensLoader``)."""
    from litdata import TokensLoader, optimize

    step = 1 << 22
    parts = [(str(tokens_path), a, min(a + step, count)) for a in range(0, count, step)]
    optimize(fn=_litdata_chunk, inputs=parts, output_dir=str(folder),
             chunk_size=(SEQ_LEN + 1) * 1024, item_loader=TokensLoader(), num_workers=1)
    return folder


def _litdata_batches(folder: Path) -> Iterator[Any]:
    """``StreamingDataLoader`` at its defaults over ``folder``."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(str(folder), item_loader=TokensLoader(block_size=SEQ_LEN + 1),
                          shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=BATCH)
    while True:
        for window in loader:
            window = window.long()
            yield {"input_ids": window[:, :-1], "labels": window[:, 1:]}


def _litdata_peer(tokens_path: Path, count: int, folder: Path) -> Iterator[Any]:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    _litdata_files(tokens_path, count, folder)
    ds = StreamingDataset(str(folder), item_loader=TokensLoader(block_size=SEQ_LEN + 1),
                          shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=0, drop_last=True)
    while True:
        for window in loader:
            window = window.long()
            yield {"input_ids": window[:, :-1], "labels": window[:, 1:]}


def _grain_peer(tokens: np.ndarray, threads: int) -> Iterator[Any]:
    """Grain's MapDataset over the memmap: in the caller's thread (``threads=0``),
    through ``to_iter_dataset`` with its default ``ReadOptions`` (``threads <
    0``) or with ``threads`` reader threads and a buffer of 2 batches per
    thread (its default buffer of 500 would fill between the interleaved
    passes of section 3, whose iterators live on)."""
    import grain

    class Windows:
        def __len__(self) -> int:
            return (len(tokens) - 1) // SEQ_LEN

        def __getitem__(self, i: int) -> np.ndarray:
            return tokens[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1]

    def split(window: np.ndarray) -> dict[str, np.ndarray]:
        window = window.astype(np.int64)
        return {"input_ids": window[:, :-1], "labels": window[:, 1:]}

    ds = (grain.MapDataset.source(Windows()).shuffle(seed=1)
          .batch(BATCH, drop_remainder=True).map(split))
    while True:
        if threads == 0:
            yield from (ds[i] for i in range(len(ds)))
        elif threads < 0:  # its defaults
            yield from ds.to_iter_dataset()
        else:
            options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
            yield from ds.to_iter_dataset(options)


def _peers(path: Path, work: Path) -> dict[str, Iterator[Any]]:
    """The batches of each installed peer (those missing are skipped, with a note)."""
    tokens = _windows_memmap(path)
    makers: dict[str, Callable[[], Iterator[Any]]] = {
        "torch DataLoader, map-style memmap, 0 workers": lambda: _torch_peer(tokens, 0),
        "torch DataLoader, map-style memmap, 2 workers": lambda: _torch_peer(tokens, 2),
        "HF datasets, numpy format, ds[indices]": lambda: _hf_peer(tokens, work / "hf"),
        "LitData StreamingDataset + TokensLoader": lambda: _litdata_peer(
            path / "00000.tokens", len(tokens), work / "litdata"),
        "Grain MapDataset over the memmap, caller's thread": lambda: _grain_peer(tokens, 0),
        "Grain MapDataset over the memmap, 2 threads": lambda: _grain_peer(tokens, 2),
    }
    peers = {}
    for name, make in makers.items():
        try:
            peers[name] = make()
            next(peers[name])  # builds what the peer needs (HF and LitData files)
        except ImportError as error:
            peers.pop(name)
            print(f"skipped {name}: {error}", file=sys.stderr)
    return peers


def _default_peers(path: Path, work: Path) -> dict[str, Callable[[], Iterator[Any]]]:
    """A fresh iterator of each installed peer at its documented defaults
    (files it needs are built once, here); missing peers are skipped."""
    tokens = _windows_memmap(path)
    peers: dict[str, Callable[[], Iterator[Any]]] = {}
    try:
        import torch  # noqa: F401

        peers["torch DataLoader (map-style memmap, defaults)"] = lambda: _torch_peer(tokens, 0)
    except ImportError as error:
        print(f"skipped torch: {error}", file=sys.stderr)
    try:
        hf = _hf_dataset(tokens, work / "hf-default")
        peers["HF datasets ds[indices] (numpy format)"] = lambda: _hf_batches(hf, len(tokens))
    except ImportError as error:
        print(f"skipped datasets: {error}", file=sys.stderr)
    try:
        folder = _litdata_files(path / "00000.tokens", len(tokens), work / "litdata-default")
        peers["LitData StreamingDataLoader (defaults)"] = lambda: _litdata_batches(folder)
    except ImportError as error:
        print(f"skipped litdata: {error}", file=sys.stderr)
    try:
        import grain  # noqa: F401

        peers["Grain MapDataset (caller's thread)"] = lambda: _grain_peer(tokens, 0)
        peers["Grain to_iter_dataset() (default ReadOptions)"] = lambda: _grain_peer(tokens, -1)
    except ImportError as error:
        print(f"skipped grain: {error}", file=sys.stderr)
    return peers


def _versions() -> str:
    """The installed peers' versions, for the record."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("numpy", "torch", "datasets", "litdata", "grain"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _headline(path: Path, peers: dict[str, Callable[[], Iterator[Any]]], seconds: float,
              passes: int, cpu: bool = False) -> dict[str, float]:
    """Section 0: tokens/s of the README path, document masking, tuned, the
    NumPy limit and every peer at its defaults; prints the table, draws the
    chart and returns each reader's share of the limit."""
    windows = open_dataset(path).windows(SEQ_LEN)
    masking = open_dataset(path).windows(SEQ_LEN, document_masking=True)
    tuned, _ = tune(windows, BATCH, seconds=seconds / 2)
    setting = ", ".join(f"{k}={v}" for k, v in tuned.items())

    def loader(source: Any, **settings: Any) -> Callable[[], Iterator[Any]]:
        return lambda: iter(Loader(source, BATCH, epochs=None, **settings))

    readers: dict[str, Callable[[], Iterator[Any]]] = {
        LIMIT: lambda: numpy_windows([path / "00000.tokens"], np.dtype("<u2"), None, SEQ_LEN,
                                     BATCH),
        CEILING: _stores_only,
        "zerobatch, README path (defaults)": loader(windows),
        "zerobatch, document_masking=True": loader(masking),
        f"zerobatch, tuned ({setting})": loader(windows, **tuned),
        **peers,
    }
    found = rates(readers, seconds=seconds, passes=passes,
                  clock=time.process_time if cpu else time.perf_counter)
    limit = found[LIMIT]
    shares = {name: rate / limit for name, rate in found.items()}
    fastest = max((shares[n] for n in shares
                   if not n.startswith(("zerobatch", "np.", CEILING))), default=float("nan"))
    print("0. The headline: shares of the same-run limit, np.memmap + int64 cast "
          "(windows of 2,048, batch 32, shuffled, int64 input_ids and labels)"
          + ("; per CPU second of this process, all its threads (a peer's worker "
             "processes are not counted)" if cpu else ""))
    print(f"   peers: {_versions()}")
    _table([(name, f"{found[name] * BATCH * SEQ_LEN / 1e6:,.0f}", f"{shares[name]:.2f}",
             f"{shares[name] / fastest:.1f}") for name in found],
           ("reader", "M tok/s", "share of limit", "vs fastest peer"))
    print(f"   5x the fastest peer is {5 * fastest:.2f} of the limit; the output's stores "
          f"alone reach {shares[CEILING]:.2f} (the README path: "
          f"{shares['zerobatch, README path (defaults)'] / shares[CEILING]:.2f} of them)")
    if cpu:  # the chart is the wall-clock table's
        return shares
    bars("loader", shares, title="Tokens/s as a share of np.memmap + int64 cast "
         f"(same run; {SEQ_LEN}-token windows, batch {BATCH}, shuffled)",
         xlabel="share of the NumPy limit (1.0 = np.memmap fancy indexing + astype(int64))",
         limit=1.0, limit_label="np.memmap", labels={
             name: f"{shares[name]:.2f} ({found[name] * BATCH * SEQ_LEN / 1e6:,.0f} M tok/s)"
             for name in found})
    return shares


CEILING = "ceiling: the int64 stores alone (nothing read)"


def _stores_only() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What any loader of this output must do at least: write a batch's two
    int64 planes (here from one hot row of uint16 tokens, so nothing is
    gathered or read from the page cache), two buffers in turn (as an arena
    recycles them while the caller keeps one batch)."""
    rows = np.random.default_rng(0).integers(0, 50_000, (BATCH, SEQ_LEN + 1)).astype("<u2")
    for planes in itertools.cycle([np.empty((2, BATCH, SEQ_LEN), np.int64) for _ in range(2)]):
        np.copyto(planes[0], rows[:, :-1])
        np.copyto(planes[1], rows[:, 1:])
        yield planes[0], planes[1]


def _first_batch_after(windows: Any, steps: list[int]) -> tuple[list[float], list[float]]:
    """Seconds to the first batch resuming at each of ``steps``: zerobatch's
    ``load_state_dict``, and a torch DataLoader that replays (reads and drops)
    the batches before it. Best of 3 (zerobatch), 1 (replay)."""
    import torch  # noqa: F401

    tokens = _windows_memmap(Path(str(windows._ds.path)))
    ours, replay = [], []
    for step in steps:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            loader = Loader(windows, BATCH, seed=3, epochs=None)
            epoch, at = divmod(step, len(loader))  # step k of the run: epoch and step in it
            loader.load_state_dict({**loader.state_dict(), "epoch": epoch,
                                    "consumed": at * BATCH})
            next(iter(loader))
            best = min(best, time.perf_counter() - start)
            loader.close()
        ours.append(best)
        if step <= 10_000:
            start = time.perf_counter()
            batches = _torch_peer(tokens, 0)
            for _ in itertools.islice(batches, step + 1):
                pass
            replay.append(time.perf_counter() - start)
    return ours, replay


_RSS_TORCH = """
import sys, torch
from torch.utils.data import DataLoader, Dataset
class Indices(Dataset):
    def __init__(self, length): self.length = length
    def __len__(self): return self.length
    def __getitem__(self, i): return i
loader = DataLoader(Indices(int(sys.argv[1])), batch_size=32, shuffle=True)
for _, _b in zip(range(200), loader):
    pass
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
           if line.startswith("VmHWM:")))
"""


def _pictures(windows: Any) -> None:
    """Section 5: resume and memory figures."""
    steps = [0, 10, 100, 1_000, 10_000, 10**6, 10**9]
    ours, replay = _first_batch_after(windows, steps)
    print("5. First batch after resuming at step k (seconds)")
    _table([(f"{k:,}", f"{a * 1e3:.1f} ms", f"{b:.2f} s" if i < len(replay) else "-")
            for i, (k, a, b) in enumerate(itertools.zip_longest(steps, ours, replay,
                                                                fillvalue=float("nan")))],
           ("step", "zerobatch load_state_dict", "torch DataLoader replay"))
    x = [max(k, 1) for k in steps]
    lines("loader_resume", x, {"zerobatch Loader (load_state_dict)": ours,
                               "torch DataLoader, replaying k batches": replay},
          title=f"First batch after resuming at step k ({SEQ_LEN}-token windows, batch {BATCH})",
          xlabel="step resumed at (k; 0 drawn at 1)", ylabel="seconds", logy=True)
    sizes = [10**5, 10**6, 10**7, 10**8]
    ours_rss = [_peak_rss(n) / 2**20 for n in [*sizes, 10**12]]
    torch_rss = []
    for n in sizes:
        done = subprocess.run([sys.executable, "-c", _RSS_TORCH, str(n)], capture_output=True,
                              text=True, check=True)
        torch_rss.append(int(done.stdout) / 2**20)
    print("5b. Peak RSS of a fresh process iterating a synthetic source (MiB)")
    _table([(f"{n:.0e}", f"{a:.0f}", f"{b:.0f}" if b == b else "-")
            for n, a, b in itertools.zip_longest([*sizes, 10**12], ours_rss, torch_rss,
                                                 fillvalue=float("nan"))],
           ("observations", "zerobatch Loader", "torch DataLoader shuffle=True"))
    lines("loader_memory", [*sizes, 10**12], {"zerobatch Loader": ours_rss,
                                               "torch DataLoader, shuffle=True": torch_rss},
          title="Peak RSS of a fresh process against the dataset's length",
          xlabel="observations", ylabel="MiB", logy=True)


class Synthetic:
    """``length`` observations; a read returns the indices (no I/O)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def read(self, indices: np.ndarray) -> Batch:
        return Batch.from_columns({"index": indices})


def _first_batch(length: int, resume_step: int | None) -> float:
    """Seconds from constructing a Loader (and loading a state at ``resume_step``)
    to its first batch, best of 5."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        loader = Loader(Synthetic(length), BATCH, seed=3, output="batch")
        if resume_step is not None:
            loader.load_state_dict({**loader.state_dict(), "consumed": resume_step * BATCH})
        next(iter(loader))
        best = min(best, time.perf_counter() - start)
        loader.close()
    return best


_RSS_CHILD = """
import sys
from zerobatch import Batch, Loader
class Synthetic:
    def __init__(self, length): self.length = length
    def __len__(self): return self.length
    def read(self, indices): return Batch.from_columns({"index": indices})
loader = Loader(Synthetic(int(sys.argv[1])), 32, seed=3, output="batch", prefetch=4)
for _, _b in zip(range(2000), loader):
    pass
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
           if line.startswith("VmHWM:")))
"""


def _peak_rss(length: int) -> int:
    """Peak RSS (VmHWM: ru_maxrss would keep the forking parent's) of a fresh
    process iterating 2,000 batches of a synthetic source of ``length``."""
    done = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(length)],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:<{widths[0]}}}" if i == 0 else f"{{:>{w}}}"
                     for i, w in enumerate(widths))
    print(line.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line.format(*row))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64_000_000, help="dataset size")
    parser.add_argument("--steps", type=int, default=200, help="batches per timed pass")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="8 M tokens, 50 steps, 3 passes")
    parser.add_argument("--headline", action="store_true",
                        help="only section 0 (and its chart), three times")
    parser.add_argument("--seconds", type=float, default=1.0, help="per headline pass")
    parser.add_argument("--pictures", action="store_true",
                        help="only section 5 (resume and memory figures)")
    parser.add_argument("--cpu", action="store_true",
                        help="with --headline: batches per CPU second of this process (a "
                             "loaded machine blurs it less than wall time)")
    parser.add_argument("--overlap", action="store_true",
                        help="only section 6 (a training loop's step time, default vs others)")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.steps, args.passes = 8_000_000, 50, 3
        scratch_images()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"nproc={os.cpu_count()}  RAM={ram:.1f} GiB  load={os.getloadavg()[0]:.2f}  "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC\n")
    work = Path(tempfile.mkdtemp(prefix="zerobatch-loader-bench-"))
    try:
        _write(work / "corpus", args.tokens)
        warm(work / "corpus")
        if args.pictures:
            _pictures(open_dataset(work / "corpus").windows(SEQ_LEN, columns=COLUMNS))
            return
        if args.overlap:
            _overlap_steps(open_dataset(work / "corpus").windows(SEQ_LEN), OVERLAP_WAITS,
                           args.passes, args.seconds)
            return
        runs = 3 if args.headline else 1
        peers = _default_peers(work / "corpus", work)
        for run in range(runs):
            if runs > 1:
                print(f"run {run + 1} of {runs}, load {os.getloadavg()[0]:.2f}")
            _headline(work / "corpus", peers, args.seconds, args.passes, args.cpu)
        if args.headline:
            return
        windows = open_dataset(work / "corpus").windows(SEQ_LEN, columns=COLUMNS)
        steps = min(args.steps, len(windows) // BATCH)
        print(f"{args.tokens / 1e6:.0f} M uint16 tokens, {len(windows)} windows of {SEQ_LEN}, "
              f"batch {BATCH}, columns {', '.join(COLUMNS)} (int64), {steps} batches a pass, "
              f"best of {args.passes}\n")

        costs = _overhead(windows, steps, args.passes)
        plain_wall, plain_cpu = costs["plain loop of windows.read"]
        print("1. Loader overhead")
        _table([(name, f"{BATCH * SEQ_LEN / wall / 1e6:,.0f}", f"{plain_wall / wall:.3f}",
                 f"{cpu * 1e3:.2f}", f"{cpu / plain_cpu:.3f}")
                for name, (wall, cpu) in costs.items()],
               ("reader", "M tok/s", "vs plain", "CPU ms/batch", "CPU vs plain"))

        machinery = _machinery(50 * steps, args.passes)
        print("1b. The plan and the Loader alone: a source whose read returns a prebuilt batch")
        _table([(name, f"{cpu * 1e6:.1f}", f"{wall * 1e6:.1f}")
                for name, (wall, cpu) in machinery.items()],
               ("reader", "CPU us/step", "wall us/step"))

        print(f"2. Overlap: the consumer sleeps 2x and 5x a read ({plain_wall * 1e3:.2f} ms) "
              "a step, 1 reader thread")
        rows = []
        for times in (2, 5):
            shares = _overlap(windows, times * plain_wall, min(steps, 100))
            rows += [(f"step {times}x a read, prefetch {p}", f"{share:.1%}")
                     for p, share in shares.items()]
        _table(rows, ("loader", "waiting, share of step"))

        peers = _peers(work / "corpus", work)
        rates = _rates({
            **{f"zerobatch Loader, {n} thread(s), prefetch {p}, torch output":
               iter(Loader(windows, BATCH, seed=4, num_threads=n, prefetch=p, epochs=None))
               for n, p in ((1, 2), (1, 4), (2, 4))},
            **peers}, steps, args.passes)
        fastest = max((rates[name] for name in peers), default=float("nan"))
        print("3. Peers, same tokens (peers: input_ids and labels only)")
        _table([(name, f"{rate * BATCH * SEQ_LEN / 1e6:,.1f}", f"{rate / fastest:.2f}")
                for name, rate in rates.items()],
               ("reader", "M tok/s", "vs fastest peer"))
        _pictures(windows)
        _overlap_steps(open_dataset(work / "corpus").windows(SEQ_LEN), OVERLAP_WAITS,
                       args.passes, args.seconds)
    finally:
        shutil.rmtree(work)

    print("4. Start and resume (synthetic source, reads return the indices)")
    _table([("first batch, 10^12 observations", f"{_first_batch(10**12, None) * 1e3:.2f}"),
            ("first batch after load_state_dict at step 10^9",
             f"{_first_batch(10**12, 10**9) * 1e3:.2f}")], ("", "ms"))
    small, large = _peak_rss(10**6), _peak_rss(10**12)
    _table([("10^6 observations", f"{small / 2**20:.1f}"),
            ("10^12 observations", f"{large / 2**20:.1f}"),
            ("difference", f"{(large - small) / 2**20:.1f}")],
           ("peak RSS, fresh process, 2,000 batches", "MiB"))


if __name__ == "__main__":
    main()
