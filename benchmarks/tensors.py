"""Tensor files: zerobatch against the reference bintensors and safetensors.

Measures, in one run, on the same bytes (zerobatch writes byte-identical files):
  * header decode: ``safe_open(path)`` and ``keys()`` of a file of 10,000 small
    tensors (4x4 float32);
  * ``load_file`` of a 1 GiB file (8 float32 tensors of 128 MiB), NumPy and
    PyTorch: zerobatch maps the file and returns views, nothing is read;
  * ``save_file`` of the same 1 GiB to a new path (tensors in memory, file into
    the page cache; dirty pages are synced before each save, untimed);
  * ``save_model`` and ``load_model`` (``safetensors.torch`` against
    ``zerobatch.tensors.torch``) of a torch model with 1 GiB of parameters and
    a tied head;
  * ``save_file`` against its limits, 1 GiB in 8 tensors, six writers
    interleaved in every pass: ``np.copyto`` of the same bytes (memory to
    memory: the copy limit); zerobatch's full ``save_file`` (temp file,
    writes, fsync, rename); the same without its early writeback (each step's
    ``sync_file_range``), as it was before; zerobatch without fsync
    (``os.fsync`` made a no-op for the call); zerobatch with neither (the
    page-cache write alone, the work the copy limit bounds); safetensors'
    ``save_file``, which does not fsync; and two references: the page-cache
    write split over two threads (``pwrite`` of two halves into one
    preallocated file, no fsync: ext4 serialises buffered writes to one file,
    so it shows whether threads could help), and the disk alone (``O_DIRECT``
    writes of 64 MiB from an aligned buffer, then fsync: what any durable save
    waits for). Each gets its best wall time and its
    best CPU time of the calling thread (``time.thread_time``: kernel copies
    included, time spent waiting for the disk or for a core excluded; without
    ``CONFIG_IRQ_TIME_ACCOUNTING``, interrupts that land while the thread runs,
    such as disk completions, count too), so that a loaded machine still shows
    the cost of the work itself.

Each figure is the best of several repeats; ratios are reference time divided
by zerobatch time (above 1: zerobatch is faster). Temporary files go to the
system temp folder (``--folder`` to choose: a disk, or ``/dev/shm``) and are
deleted. Run: ``python benchmarks/tensors.py`` (``--only-save`` for the last
part alone).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import bintensors
import bintensors.numpy
import bintensors.torch
import numpy as np
import safetensors
import safetensors.numpy
import safetensors.torch
import torch
from _plot import bars, groups

import zerobatch.tensors as zt
import zerobatch.tensors.torch as ztorch
from zerobatch.tensors import _write

REFERENCES: dict[str, Any] = {"bintensors": bintensors, "safetensors": safetensors}
NUMPY = {"bintensors": bintensors.numpy, "safetensors": safetensors.numpy}
TORCH = {"bintensors": bintensors.torch, "safetensors": safetensors.torch}


def compare(reference: Callable[[], Any], ours: Callable[[], Any], repeats: int, *,
            settle: Callable[[], None] = gc.collect) -> tuple[float, float]:
    """Fastest of ``repeats`` calls of each, in seconds, the two interleaved so
    that drifts in machine load hit both alike; ``settle`` runs untimed before
    every call (results are dropped before the clock stops)."""
    times: dict[Callable[[], Any], list[float]] = {reference: [], ours: []}
    for _ in range(repeats):
        for run in (reference, ours):
            settle()
            start = time.perf_counter()
            result = run()
            del result
            times[run].append(time.perf_counter() - start)
    return min(times[reference]), min(times[ours])


def fresh_target(path: Path) -> Callable[[], None]:
    """Before each save: delete ``path`` and write dirty pages out, so every
    save creates a new file from the same page-cache state (freeing the old
    file's blocks is not what is measured)."""

    def settle() -> None:
        path.unlink(missing_ok=True)
        gc.collect()
        os.sync()

    return settle


def header_decode(folder: Path, fmt: str, repeats: int) -> tuple[float, float]:
    small = {f"model.layers.{i}.weight": np.zeros((4, 4), np.float32) for i in range(10_000)}
    path = folder / f"small.{fmt}"
    NUMPY[fmt].save_file(small, path)

    def reference() -> list[str]:
        with REFERENCES[fmt].safe_open(str(path), framework="np") as file:
            return list(file.keys())

    def ours() -> list[str]:
        with zt.safe_open(path, "np") as file:
            return file.keys()

    assert reference() == ours()
    return compare(reference, ours, repeats)


def big_tensors(total_bytes: int) -> dict[str, np.ndarray]:
    count = 8
    rng = np.random.default_rng(0)
    return {f"w{i}": rng.standard_normal(total_bytes // count // 4, dtype=np.float32)
            for i in range(count)}


class TiedModel(torch.nn.Module):
    """``layers`` square linear layers of ``total_bytes`` float32 in all, and a
    head tied to the first layer's weight (stored once)."""

    def __init__(self, total_bytes: int, layers: int = 8) -> None:
        super().__init__()
        width = int((total_bytes / layers / 4) ** 0.5)
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(width, width, bias=False) for _ in range(layers))
        self.head = torch.nn.Linear(width, width, bias=False)
        self.head.weight = self.layers[0].weight


def models(folder: Path, size: int, label: str, repeats: int
           ) -> list[tuple[str, str, float, float]]:
    """save_model to a new path and load_model into the model, both libraries."""
    model = TiedModel(size)
    target = folder / "model.safetensors"
    safetensors.torch.save_model(model, str(target))
    reference_bytes = target.read_bytes()
    ztorch.save_model(model, target)
    assert target.read_bytes() == reference_bytes
    del reference_bytes
    rows = [(f"save_model {label} (pt)", "safetensors", *compare(
        lambda: safetensors.torch.save_model(model, str(target)),
        lambda: ztorch.save_model(model, target), repeats, settle=fresh_target(target)))]
    ztorch.save_model(model, target)
    rows.append((f"load_model {label} (pt)", "safetensors", *compare(
        lambda: safetensors.torch.load_model(model, str(target)),
        lambda: ztorch.load_model(model, target), repeats)))
    target.unlink()
    return rows


def save_limits(folder: Path, tensors: dict[str, np.ndarray], repeats: int
                ) -> dict[str, tuple[float, float]]:
    """(best wall s, best thread CPU s) of each writer of ``tensors``, the
    writers interleaved in every pass (in a new order each pass, seed 0),
    each save to a new path."""
    target = folder / "limits.safetensors"
    size = sum(array.nbytes for array in tensors.values())
    source = np.ones(size, np.uint8)
    destination = np.empty_like(source)
    np.copyto(destination, source)  # faults the destination in once

    def full() -> None:
        zt.save_file(tensors, target, format="safetensors")

    def no_early_writeback() -> None:
        with mock.patch.object(_write, "_sync_file_range", lambda: None):
            full()

    def no_fsync() -> None:
        with mock.patch("os.fsync"):
            full()

    def page_cache_only() -> None:
        with mock.patch("os.fsync"):
            no_early_writeback()

    def two_threads() -> None:  # the page-cache write split over two threads
        half = size // 2
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(descriptor, 0, size)
            threads = [threading.Thread(target=_pwrite_all, args=(descriptor, part, start))
                       for part, start in ((source[:half], 0), (source[half:], half))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            os.close(descriptor)

    aligned = _aligned(size)

    def disk() -> None:  # the disk's own limit: no page cache, then fsync
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT,
                             0o600)
        try:
            for start in range(0, size, 64 << 20):
                _pwrite_all(descriptor, aligned[start : start + (64 << 20)], start)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    writers: dict[str, Callable[[], Any]] = {
        "np.copyto (copy limit)": lambda: np.copyto(destination, source),
        "page cache, 2 threads, pwrite": two_threads,
        **({"disk: O_DIRECT writes + fsync": disk} if _direct_io(folder) else {}),
        "zerobatch save_file (fsync)": full,
        "zerobatch, no early writeback": no_early_writeback,
        "zerobatch, no fsync": no_fsync,
        "zerobatch, no fsync, no early": page_cache_only,
        "safetensors save_file": lambda: safetensors.numpy.save_file(tensors, str(target)),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in writers}
    settle = fresh_target(target)
    order = list(writers)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)  # no writer always runs after the same one
        for name in order:
            run = writers[name]
            settle()
            wall, cpu = time.perf_counter(), time.thread_time()
            run()
            times[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
    target.unlink(missing_ok=True)
    return {name: (min(t[0] for t in runs), min(t[1] for t in runs))
            for name, runs in times.items()}


def _pwrite_all(descriptor: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(descriptor, view[done:], offset + done)


def _direct_io(folder: Path) -> bool:
    """Whether files in ``folder`` open with O_DIRECT (tmpfs: no)."""
    probe = folder / "direct.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def _aligned(size: int) -> np.ndarray:
    """``size`` bytes of ones at a 4 KiB-aligned address (what O_DIRECT needs)."""
    raw = np.ones(size + 4096, np.uint8)
    start = -raw.ctypes.data % 4096
    return raw[start : start + size]


def print_save_limits(best: dict[str, tuple[float, float]], label: str, where: str) -> None:
    copy_wall, copy_cpu = best["np.copyto (copy limit)"]
    theirs_wall, theirs_cpu = best["safetensors save_file"]
    print(f"\nsave_file {label} into {where}: best wall and thread CPU; x copy = over "
          "np.copyto, st/w = safetensors over this writer")
    print(f"{'writer':31} {'wall ms':>9} {'x copy':>7} {'st/w':>6} {'CPU ms':>9} "
          f"{'x copy':>7} {'st/w':>6}")
    for name, (wall, cpu) in best.items():
        line = f"{name:31} {wall * 1e3:9.1f} {wall / copy_wall:7.2f} {theirs_wall / wall:6.2f}"
        if name.startswith(("page cache, 2 threads", "disk:")):
            line += f" {'(work not on the calling thread)':>24}"
        else:
            line += f" {cpu * 1e3:9.1f} {cpu / copy_cpu:7.2f} {theirs_cpu / cpu:6.2f}"
        print(line)
    bars("tensors_save", {name: wall * 1e3 for name, (wall, _) in best.items()},
         title=f"save_file {label}: best wall time of each writer", xlabel="ms (shorter is faster)",
         labels={name: f"{wall * 1e3:,.0f} ms ({wall / copy_wall:.2f}x copy)"
                 for name, (wall, _) in best.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=1.0, help="size of the big file (GiB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", default=None,
                        help="where the files go (default: the system temp folder)")
    parser.add_argument("--only-save", action="store_true",
                        help="only save_file against its limits")
    args = parser.parse_args()
    size = int(args.gib * (1 << 30))
    label = f"{args.gib:g} GiB"
    folder = Path(tempfile.mkdtemp(prefix="zerobatch-bench-tensors-", dir=args.folder))
    rows: list[tuple[str, str, float, float]] = []
    try:
        limits = save_limits(folder, big_tensors(size), args.repeats)
        if args.only_save:
            print_save_limits(limits, label, str(folder.parent))
            return
        for fmt in ("bintensors", "safetensors"):
            theirs, ours = header_decode(folder, fmt, args.repeats * 4)
            rows.append(("header decode, 10,000 tensors", fmt, theirs, ours))
        tensors = big_tensors(size)
        for fmt in ("bintensors", "safetensors"):
            path = folder / f"big.{fmt}"
            target = folder / f"written.{fmt}"
            NUMPY[fmt].save_file(tensors, path)
            zt.save_file(tensors, target, format=fmt)
            assert target.read_bytes() == path.read_bytes()
            target.unlink()
            for framework, module in (("np", NUMPY[fmt]), ("pt", TORCH[fmt])):
                rows.append((f"load_file {label} ({framework})", fmt, *compare(
                    lambda m=module, p=path: m.load_file(p),
                    lambda f=framework, p=path: zt.load_file(p, f), args.repeats)))
            rows.append((f"save_file {label} (np)", fmt, *compare(
                lambda f=fmt, t=target: NUMPY[f].save_file(tensors, t),
                lambda f=fmt, t=target: zt.save_file(tensors, t, format=f),
                args.repeats, settle=fresh_target(target))))
            path.unlink()
            target.unlink()
        tensors.clear()  # frees the arrays before the model is built
        gc.collect()
        rows += models(folder, size, label, args.repeats)
    finally:
        shutil.rmtree(folder)
    print(f"{'operation':32} {'format':12} {'reference ms':>13} {'zerobatch ms':>13} "
          f"{'ref/zb':>8}")
    for name, fmt, theirs, ours in rows:
        print(f"{name:32} {fmt:12} {theirs * 1e3:13.2f} {ours * 1e3:13.2f} {theirs / ours:8.1f}")
    groups("tensors", {f"{name}, {fmt}": {"reference package": theirs * 1e3,
                                          "zerobatch": ours * 1e3}
                       for name, fmt, theirs, ours in rows},
           title="Tensor files: zerobatch against bintensors and safetensors (same bytes)",
           xlabel="ms (log scale; shorter is faster)", log=True, fmt="{:,.2f}")
    print_save_limits(limits, label, str(folder.parent))


if __name__ == "__main__":
    main()
