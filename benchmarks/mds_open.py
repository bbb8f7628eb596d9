"""Opening an MDS corpus as it grows: token counts derived from every sample
against the token-count cache (``zerobatch.peers._counts``).

MDS records no token counts; with a dynamic shape they come from each
shard's offsets table, 4 bytes a sample, so opening is O(samples). The
cache keys the counts by ``index.json`` (and each local shard's mtime), so
every open after the first reads ``index.json`` alone: O(shards).

The corpus: ``--tokens`` tokens written by mosaicml-streaming's own
``MDSWriter`` (``peer_formats.build``), then the same corpus ``x`` times
over: ``index.json`` listing every shard ``x`` times under new names, each
a hard link of a file MDSWriter wrote (no disk used; the linked shards share
their pages, so the offsets tables are read from the page cache: the counts'
CPU cost, a lower bound on a cold corpus's). Each case in a fresh process
(the Numba kernels loaded before the clock): ``open_dataset`` alone, then
the first batch of 8 windows of 2,048 tokens with ``document_masking``;
counted (``cache_dir=False``), counted and written to a fresh cache, then
read from it.

Run: ``python benchmarks/mds_open.py [--tokens 1e8] [--scales 1 10 100 1000] [--out DIR]``.
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

from _plot import groups

_CHILD = """
import json, sys, time
from zerobatch import Loader, open_dataset
path, cache = sys.argv[1], sys.argv[2]
options = {"cache_dir": False if cache == "-" else cache}
ds = open_dataset(path, cache_dir=False)  # the kernels loaded, the files' pages cached
next(iter(Loader(ds.windows(2048, document_masking=True), 8, seed=1, output="numpy")))
ds.close()
start = time.perf_counter()
ds = open_dataset(path, **options)
opened = time.perf_counter()
next(iter(Loader(ds.windows(2048, document_masking=True), 8, seed=1, output="numpy")))
end = time.perf_counter()
print(json.dumps({"open": opened - start, "first": end - opened,
                  "cached": bool(ds.files._counts_cached), "samples": ds.num_documents,
                  "shards": len(ds.files.shards)}))
"""


def _scaled(base: Path, root: Path, times: int) -> Path:
    """``base``'s MDS corpus ``times`` times over (hard links; kept)."""
    folder = root / f"x{times}"
    if (folder / "index.json").exists():
        return folder
    folder.mkdir(parents=True)
    entries = json.loads((base / "index.json").read_text())["shards"]
    shards = []
    for copy in range(times):
        for entry in entries:
            name = f"{copy:05d}.{entry['raw_data']['basename']}"
            os.link(base / entry["raw_data"]["basename"], folder / name)
            shards.append({**entry, "raw_data": {**entry["raw_data"], "basename": name}})
    (folder / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
    return folder


def _run(path: Path, cache: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), cache], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=1e8)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--out", type=Path, default=None, help="keep the corpora here")
    args = parser.parse_args()
    import peer_formats

    tokens = int(args.tokens)
    root = args.out or Path(tempfile.mkdtemp(prefix="zb-mds-open-"))
    base = peer_formats.build(root / f"{tokens}", tokens, ["mds"])["mds"]
    print(f"nproc={os.cpu_count()} load={os.getloadavg()} date={time.strftime('%Y-%m-%d %H:%M')}")
    print(f"MDS corpus of {tokens:,} tokens (MDSWriter), x times over by hard links; ms, "
          "fresh process each")
    print(f"{'x':>6} {'tokens':>18} {'samples':>14} {'shards':>7} | {'counted open':>12} "
          f"{'first':>7} | {'writing':>8} | {'cached open':>11} {'first':>7} | {'open x':>7}")
    drawn: dict[str, dict[str, float]] = {}
    for times in args.scales:
        path = _scaled(base, root, times)
        counted = _run(path, "-")
        with tempfile.TemporaryDirectory() as cache:
            written = _run(path, cache)
            cached = _run(path, cache)
        assert not counted["cached"] and not written["cached"] and cached["cached"]
        print(f"{times:>6} {tokens * times:>18,} {counted['samples']:>14,} "
              f"{counted['shards']:>7,} | {counted['open'] * 1e3:>12.1f} "
              f"{counted['first'] * 1e3:>7.1f} | {written['open'] * 1e3:>8.1f} | "
              f"{cached['open'] * 1e3:>11.2f} {cached['first'] * 1e3:>7.1f} | "
              f"{counted['open'] / cached['open']:>7.0f}", flush=True)
        drawn[f"{tokens * times:.0e} tokens"] = {
            "counted from every sample": (counted["open"] + counted["first"]) * 1e3,
            "token counts cached": (cached["open"] + cached["first"]) * 1e3}
    groups("mds_open", drawn, log=True, fmt="{:.3g} ms",
           title="MDS: opening and the first batch as the corpus grows",
           xlabel="ms from open_dataset to the first batch (log)")


if __name__ == "__main__":
    main()
