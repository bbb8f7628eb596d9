"""A user's first run: seconds from a fresh interpreter to the README Loader's
first batch, with a cold Numba cache (the first run on a machine: every kernel
the path needs compiles) and then with the cache it left (every later run),
against three lines of NumPy (``np.memmap`` and a fancy index), which compile
nothing.

Each case runs in its own process with its own ``NUMBA_CACHE_DIR``; the
import (``import zerobatch``, which imports NumPy and Numba) is timed apart
from open-to-first-batch (which imports torch for the default output: timed
here as a separate line, as any torch user pays it once anyway). Run it on two
trees to compare two versions, interleaved::

    PYTHONPATH=OLD/src python benchmarks/first_run.py
    PYTHONPATH=NEW/src python benchmarks/first_run.py

Run: ``python benchmarks/first_run.py [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _plot import groups

_CASE = r"""
import json, sys, time
begin = time.perf_counter()
import torch  # the default output's: apart, a torch user has paid it already
torch_s = time.perf_counter() - begin
begin = time.perf_counter()
import zerobatch
imported = time.perf_counter() - begin
path, options, kind = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
begin = time.perf_counter()
if kind == "numpy":
    import numpy as np
    tokens = np.memmap(f"{path}/00000.tokens", dtype=np.uint32, mode="r")
    starts = np.random.default_rng(0).integers(0, tokens.shape[0] - 2049, 8)
    batch = tokens[starts[:, None] + np.arange(2049)]
elif kind == "mixture":
    sources = {name: zerobatch.open_dataset(path).windows(2048, **options) for name in "ab"}
    mixture = zerobatch.Mixture(sources, {"a": 0.3, "b": 0.7}, length=64)
    batch = next(iter(zerobatch.Loader(mixture, batch_size=8)))
else:
    windows = zerobatch.open_dataset(path).windows(2048, **options)
    batch = next(iter(zerobatch.Loader(windows, batch_size=8, seed=0)))
print(json.dumps({"torch": torch_s, "import": imported, "first": time.perf_counter() - begin}))
"""

CASES = (
    ("np.memmap, three lines", "numpy", {}),
    ("README Loader", "windows", {}),
    ("README Loader, document_masking", "windows", {"document_masking": True}),
    ("Mixture of two", "mixture", {}),
)


def _case(path: Path, kind: str, options: dict[str, object], cache: str) -> dict[str, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", _CASE, str(path), json.dumps(options), kind],
                         env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="cold/warm pairs per case")
    args = parser.parse_args()
    import zerobatch

    tree = Path(zerobatch.__file__).parent
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    print(f"zerobatch at commit {commit}, {os.cpu_count()} CPUs; seconds (best of "
          f"{args.repeats})")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus"
        rng = np.random.default_rng(0)
        with zerobatch.StreamWriter(path) as writer:
            for _ in range(64):
                writer.add_document(rng.integers(0, 50_000, 8_000, dtype=np.uint32))
        print(f"{'case':<34} {'cold first batch':>16} {'warm':>6} {'import':>7} {'torch':>6}")
        drawn: dict[str, dict[str, float]] = {}
        for label, kind, options in CASES:
            cold, warm, imported, torch_s = [], [], [], []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as cache:
                    first = _case(path, kind, options, cache)
                    cold.append(first["first"])
                    again = _case(path, kind, options, cache)
                    warm.append(again["first"])
                    imported.append(again["import"])
                    torch_s.append(again["torch"])
            print(f"{label:<34} {min(cold):>16.2f} {min(warm):>6.2f} {min(imported):>7.2f} "
                  f"{min(torch_s):>6.2f}")
            drawn[label] = {"first run on a machine (cold Numba cache)": min(cold),
                            "every later run (cache warm)": min(warm),
                            "import zerobatch": min(imported)}
        groups("first_run", drawn, fmt="{:.2f} s", title="A fresh process to the first batch "
               f"(best of {args.repeats})", xlabel="seconds (import timed apart)")


if __name__ == "__main__":
    main()
