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
  * the limit for writes: ``np.copyto`` of 1 GiB, memory to memory, and
    zerobatch's ``save_file`` time over it.

Each figure is the best of several repeats; ratios are reference time divided
by zerobatch time (above 1: zerobatch is faster). Temporary files go to the
system temp folder and are deleted. Run: ``python benchmarks/tensors.py``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bintensors
import bintensors.numpy
import bintensors.torch
import numpy as np
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import zerobatch.tensors as zt
import zerobatch.tensors.torch as ztorch

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=1.0, help="size of the big file (GiB)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    size = int(args.gib * (1 << 30))
    label = f"{args.gib:g} GiB"
    folder = Path(tempfile.mkdtemp(prefix="zerobatch-bench-tensors-"))
    rows: list[tuple[str, str, float, float]] = []
    try:
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
        source = np.ones(size, np.uint8)
        destination = np.empty_like(source)
        copy = min(compare(lambda: np.copyto(destination, source),
                           lambda: np.copyto(destination, source), args.repeats))
    finally:
        shutil.rmtree(folder)
    print(f"{'operation':32} {'format':12} {'reference ms':>13} {'zerobatch ms':>13} "
          f"{'ref/zb':>8}")
    for name, fmt, theirs, ours in rows:
        print(f"{name:32} {fmt:12} {theirs * 1e3:13.2f} {ours * 1e3:13.2f} {theirs / ours:8.1f}")
    print(f"{f'np.copyto {label} (memory bound)':32} {'-':12} {'':13} {copy * 1e3:13.2f}")
    for name, fmt, _, ours in rows:
        if name.startswith("save_file"):
            print(f"{name} {fmt}: zerobatch / np.copyto = {ours / copy:.2f}")


if __name__ == "__main__":
    main()
