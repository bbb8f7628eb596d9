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
through ``LocalStorage``'s default ``method="auto"`` (memory maps on a local
file system, ``pread`` on a network or FUSE one: the first line printed says
what it chose for the temporary folder); rows marked ``mmap`` or ``pread``
ask for that method explicitly.

Then the issue-9 targets, on the plain dataset, in CPU time of the reading
thread (``time.thread_time``, best of interleaved passes, so other processes'
load does not count): ``columns=("input_ids", "labels")`` int64, and with
``position_ids``, by the default method (``auto``, with what it resolved to),
``pread`` and ``mmap``, against the limit: one vectorized
NumPy gather of the same windows from a resident copy of the tokens (fancy
indexing of a ``[windows, 2049]`` view) plus the int64 cast of inputs and
labels into reused arrays. Rows marked ``read_into`` read the same columns
through a ``Storage`` that is not ``LocalStorage`` (the records path: one
batch of records, then the cast); ``reads only`` rows are the batch's 32
reads of 4 KiB alone, by each method. Two threads: wall-clock batches/s of two threads
calling ``read`` against one, and the share of a read's CPU time that holds
the GIL (a read of no window, against a full one) with the speed-up it
allows two threads on two idle cores (Amdahl). Cold start: fresh processes that import
zerobatch, open the dataset and read one batch, with what each step costs.

    python benchmarks/stream_read.py [--tokens 150_000_000] [--seconds 3] [--targets-only]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from _files import warm
from _plot import bars
from numpy.lib.stride_tricks import as_strided

from zerobatch import stream
from zerobatch.shuffle import Feistel
from zerobatch.storage import LocalStorage
from zerobatch.storage.local import MOUNTINFO, file_system_type

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
    path: Path, dtype: str = "int64", method: Literal["auto", "pread", "mmap"] = "auto",
    *, tuples: bool = False, columns: tuple[str, ...] | str = "all",
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


TARGET_COLUMNS = {"input_ids, labels": ("input_ids", "labels"),
                  "+ position_ids": ("input_ids", "labels", "position_ids"),
                  "document_masking=True": ("input_ids", "labels", "position_ids",
                                            "cu_seqlens", "max_seqlen")}
TARGETS = {"input_ids, labels": 0.8, "+ position_ids": 0.55, "document_masking=True": 0.55}


class _Forwarding:
    """A ``Storage`` that forwards to a ``LocalStorage``: readers then take the
    generic records path (``read_into``), as for any storage but local files."""

    def __init__(self, inner: LocalStorage) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _cpu_times(steps: dict[str, Callable[[int], object]], batches: int,
               passes: int = 20, per_pass: int = 50) -> dict[str, float]:
    """Best CPU seconds per batch of each step (``time.thread_time``), passes
    interleaved; each step reads its own batches in a pass, so none finds the
    windows another step just brought into the CPU caches."""
    best = dict.fromkeys(steps, float("inf"))
    for step in steps.values():
        step(0)
    for r in range(passes):
        for i, (name, step) in enumerate(steps.items()):
            first = (r * len(steps) + i) * per_pass
            start = time.thread_time()
            for j in range(per_pass):
                step((first + j) % batches)
            best[name] = min(best[name], (time.thread_time() - start) / per_pass)
    return best


def _targets(path: Path) -> list[str]:
    """The single-thread rows against the gather limit, as table lines."""
    tokens = np.fromfile(path / "00000.tokens", dtype="<u2")  # resident: the limit's source
    local = {m: LocalStorage(path, method=m) for m in ("auto", "pread", "mmap")}
    datasets = {_method_label(m, s): stream.open_dataset(path, storage=s) for m, s in local.items()}
    plans = _plans(datasets["mmap"].windows(SEQ_LEN))
    n = SEQ_LEN + 1
    rows = as_strided(tokens, ((len(tokens) - n) // SEQ_LEN + 1, n), (SEQ_LEN * 2, 2),
                      writeable=False)
    out = np.empty((2, BATCH, SEQ_LEN), dtype=np.int64)

    def limit(k: int) -> None:
        windows = rows[plans[k]]  # one vectorized gather
        np.copyto(out[0], windows[:, :-1])
        np.copyto(out[1], windows[:, 1:])

    steps: dict[str, Callable[[int], object]] = {"limit: NumPy gather + int64 cast": limit}
    for method in ("pread", "mmap"):  # the reads alone: 32 requests of 4 KiB
        storage = local[method]
        handle = storage.open("00000.tokens")
        records = np.empty(BATCH * n * 2, dtype=np.uint8)
        lengths, destinations = np.full(BATCH, n * 2), np.arange(BATCH) * n * 2
        steps[f"reads only (read_into), {method}"] = (
            lambda st, h, r, ln, d: lambda k: st.read_into(
                np.full(BATCH, h), plans[k] * SEQ_LEN * 2, ln, r, d)
        )(storage, handle, records, lengths, destinations)
    for label, columns in TARGET_COLUMNS.items():
        for method in datasets:
            windows = datasets[method].windows(SEQ_LEN, columns=columns)
            steps[f"{label}, {method}"] = (lambda w: lambda k: w.read(plans[k]))(windows)
        forwarded = stream.open_dataset(path, storage=_Forwarding(local["mmap"]))  # type: ignore[arg-type]
        windows = forwarded.windows(SEQ_LEN, columns=columns)
        steps[f"{label}, mmap, read_into"] = (lambda w: lambda k: w.read(plans[k]))(windows)
    seconds = _cpu_times(steps, len(plans))
    limit_s = seconds["limit: NumPy gather + int64 cast"]
    lines = [f"{'reader (CPU time of the reading thread)':<44}{'us/batch':>9}{'Mtok/s':>8}"
             f"{'vs limit':>10}  target"]
    lines.append("-" * len(lines[0]))
    for name, value in seconds.items():
        target = next((f">= {t}" for label, t in TARGETS.items() if name.startswith(label)), "")
        lines.append(f"{name:<44}{value * 1e6:>9.1f}{BATCH * SEQ_LEN / value / 1e6:>8.0f}"
                     f"{limit_s / value:>10.2f}  {target}")
    bars("stream_read", {name: limit_s / value for name, value in seconds.items()},
         title=f"windows.read, CPU time of the reading thread ({SEQ_LEN}-token windows, "
         f"batch {BATCH})", xlabel="share of the limit (NumPy gather + int64 cast, resident)",
         limit=1.0, limit_label="limit")
    return lines


def _method_label(method: str, storage: LocalStorage) -> str:
    """``pread`` or ``mmap`` as asked, or ``default (auto: ...)`` with what it resolved to."""
    return f"default (auto: {storage.method})" if method == "auto" else method


def _threads(path: Path, seconds: float) -> list[str]:
    """Wall-clock batches/s of one and of two threads calling ``read``, each
    on its own batches, best of interleaved passes."""
    lines = [f"{'reader':<44}{'1 thread':>10}{'2 threads':>11}{'speed-up':>10}"
             f"{'GIL share':>11}{'bound':>7}  target"]
    lines.append("-" * len(lines[0]))
    for method in ("auto", "pread", "mmap"):
        storage = LocalStorage(path, method=method)
        ds, method = stream.open_dataset(path, storage=storage), _method_label(method, storage)
        for label, columns in TARGET_COLUMNS.items():
            windows = ds.windows(SEQ_LEN, columns=columns)
            plans = _plans(windows)
            windows.read(plans[0])
            rates = {1: 0.0, 2: 0.0}
            for _ in range(5):
                for count in (1, 2):
                    rates[count] = max(rates[count], _threaded_rate(windows, plans, count,
                                                                    seconds / 10))
            share = _gil_share(windows, plans)
            lines.append(f"{label + ', ' + method:<44}{rates[1]:>10.0f}{rates[2]:>11.0f}"
                         f"{rates[2] / rates[1]:>10.2f}{share:>11.2f}"
                         f"{1 / (share + (1 - share) / 2):>7.2f}  >= 1.5")
    return lines


def _gil_share(windows: stream.TokenWindows, plans: list[np.ndarray]) -> float:
    """The share of a read's CPU time that holds the GIL: a read of no window
    runs all of ``read``'s Python (and kernel calls) and none of its kernels' work."""
    empty = np.zeros(0, dtype=np.int64)
    cpu = _cpu_times({"none": lambda k: windows.read(empty),
                      "batch": lambda k: windows.read(plans[k])}, len(plans))
    return cpu["none"] / cpu["batch"]


def _threaded_rate(windows: stream.TokenWindows, plans: list[np.ndarray], count: int,
                   seconds: float) -> float:
    """Batches per second of ``count`` threads reading for ``seconds``."""
    done = [0] * count
    stop = time.perf_counter() + seconds

    def work(t: int) -> None:
        k = t * len(plans) // count
        while time.perf_counter() < stop:
            windows.read(plans[k % len(plans)])
            k += 1
            done[t] += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - start)


_COLD = """
import sys, time
clock = time.process_time
t = [clock()]
{hide}
import numpy
t.append(clock())
import numba
t.append(clock())
import zerobatch
t.append(clock())
windows = zerobatch.stream.open_dataset({path!r}).windows(2048, columns=("input_ids", "labels"))
t.append(clock())
{warm}
t.append(clock())
windows.read([0, 1])
t.append(clock())
print(*t)
"""
_WARM = ("import scipy.linalg  # what numba's first kernel load imports (its BLAS check)\n"
         "from numba.core.registry import cpu_target\n"
         "cpu_target.target_context.refresh()  # numba's implementation registries")
_COLD_PARTS = ("Python start", "import numpy", "import numba", "import zerobatch (rest)",
               "open_dataset + windows", "numba: scipy.linalg + registries",
               "first read (3 cached kernels)")


def _cold_start(path: Path, runs: int = 5) -> list[str]:
    """Fresh processes: best wall time of the whole ``python -c``, and the
    best CPU time of each step inside it, with numba's one-time set-up split
    out of the first read in a second set of processes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    plain, split, bare = [], [], []
    hide = "sys.modules['scipy'] = None  # as where SciPy is not installed"
    for _ in range(runs):
        for script, into in ((_COLD.format(path=str(path), warm="", hide=""), plain),
                             (_COLD.format(path=str(path), warm=_WARM, hide=""), split),
                             (_COLD.format(path=str(path), warm="", hide=hide), bare)):
            start = time.perf_counter()
            result = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                    capture_output=True, text=True)
            wall = time.perf_counter() - start
            into.append((wall, [float(x) for x in result.stdout.split()]))
    best_wall = min(wall for wall, _ in plain)
    best_cpu = min(times[-1] for _, times in plain)
    parts = [min(times[0] for _, times in split)]
    parts += [min(times[i + 1] - times[i] for _, times in split) for i in range(6)]
    bare_wall = min(wall for wall, _ in bare)
    bare_cpu = min(times[-1] for _, times in bare)
    lines = [f"fresh process (import zerobatch, open, read a batch of 2 windows): best of "
             f"{runs}: {best_wall:.3f} s wall, {best_cpu:.3f} s CPU; target < 0.5 s",
             f"the same where SciPy is not installed (numba then skips its BLAS check): "
             f"{bare_wall:.3f} s wall, {bare_cpu:.3f} s CPU",
             f"{'step (CPU s, best of ' + str(runs) + ')':<44}{'s':>8}"]
    lines.append("-" * len(lines[2]))
    lines += [f"{name:<44}{value:>8.3f}" for name, value in zip(_COLD_PARTS, parts, strict=True)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150_000_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per reader")
    parser.add_argument("--targets-only", action="store_true",
                        help="only the issue-9 targets (no metadata datasets)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zerobatch-stream-bench-"))
    method = LocalStorage(root).method
    try:
        kind = file_system_type(root.resolve(), Path(MOUNTINFO).read_text())
    except OSError:
        kind = None
    try:
        plain, ids, one = root / "plain", root / "ids", root / "one"
        # One shard, so the baselines can index the same bytes through one memmap.
        _write(plain, args.tokens, values=None, shard_tokens=2 * args.tokens)
        warm(plain)
        targets = _targets(plain)
        threads = _threads(plain, args.seconds)
        cold = _cold_start(plain)
        if not args.targets_only:
            _write(ids, args.tokens // 3, values="ids", shard_tokens=1 << 24)
            _write(one, args.tokens // 3, values="id", shard_tokens=1 << 24)
            one_v1 = _as_version_1(one, root / "one-v1")
            sizes = [warm(p) >> 20 for p in (plain, ids, one, one_v1)]
            rates = _all_rates(plain, ids, one, one_v1, args.seconds)
    finally:
        shutil.rmtree(root)
    print(f"windows of {SEQ_LEN} tokens, batch {BATCH}, Feistel order, uint16 tokens, warm "
          f"page cache, {args.tokens / 1e6:.0f} M tokens")
    print(f"default method: auto -> {method} (file system of the temporary folder: {kind})")
    print("\n".join(["", *targets, "", *threads, "", *cold]))
    if not args.targets_only:
        print()
        _print_rates(rates, sizes)


def _all_rates(plain: Path, ids: Path, one: Path, one_v1: Path,
               seconds: float) -> dict[str, float]:
    """Batches/s of every reader of the wall-clock table."""
    return _best_rates({
        "zerobatch int64": _reader(plain),
        "zerobatch stored": _reader(plain, "stored"),
        "zerobatch int64, mmap": _reader(plain, method="mmap"),
        "zerobatch stored, mmap": _reader(plain, "stored", "mmap"),
        "zerobatch int64, pread": _reader(plain, method="pread"),
        "zerobatch stored, pread": _reader(plain, "stored", "pread"),
        **_baselines(plain),
        "zerobatch int64, spans [id, id]": _reader(ids),
        "zerobatch int64, spans id": _reader(one),
        "zerobatch int64, spans id, no document_metadata": _reader(one, columns=V1_COLUMNS),
        "zerobatch int64, spans id, version 1": _reader(one_v1),
        "zerobatch int64, spans id, mmap": _reader(one, method="mmap"),
        "zerobatch int64, spans id, pread": _reader(one, method="pread"),
        "zerobatch int64, spans id, all tuples": _reader(one, tuples=True),
        "zerobatch int64, spans id, all tuples, version 1": _reader(one_v1, tuples=True),
        "zerobatch int64, spans [id, id], all tuples": _reader(ids, tuples=True),
    }, seconds)


def _print_rates(rates: dict[str, float], sizes: list[int]) -> None:
    limit, fancy = rates["np.copyto (limit)"], rates["np.memmap fancy + int64"]
    print(f"datasets: {sizes[0]} MiB plain, {sizes[1]} and {sizes[2]} MiB with a span every "
          f"{SPAN} tokens (wall clock, full batches)")
    header = (f"{'reader':<44}{'batches/s':>10}{'Mtok/s':>9}{'MB/s':>8}"
              f"{'vs copy':>9}{'vs memmap':>11}  note")
    print(header)
    print("-" * len(header))
    for name, rate in rates.items():
        tok = rate * BATCH * SEQ_LEN
        plain_rate = rates[next((f"zerobatch int64, {m}" for m in ("mmap", "pread")
                                 if name.endswith(f", {m}") or f", {m}," in name),
                                "zerobatch int64")]
        note = f"{rate / plain_rate:.2f}x no-metadata" if "spans" in name else ""
        print(f"{name:<44}{rate:>10.0f}{tok / 1e6:>9.1f}{tok * 2 / 1e6:>8.0f}"
              f"{rate / limit:>9.2f}{rate / fancy:>11.2f}  {note}")
    bars("stream_read_rates", {name: rate / fancy for name, rate in rates.items()},
         title=f"Shuffled window batches/s, wall clock ({SEQ_LEN}-token windows, batch {BATCH})",
         xlabel="share of np.memmap fancy indexing + int64 cast", limit=1.0,
         limit_label="np.memmap")


if __name__ == "__main__":
    main()
