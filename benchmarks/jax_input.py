"""JAX input pipelines: the stall at shard switches, and the cost of placement.

1. Stall at shard switches. ``.npy`` token shards in an S3 bucket (moto's
   server on 127.0.0.1) behind a proxy that adds a fixed latency to every
   request and caps each response's bandwidth. A consumer takes one step,
   then spends a fixed time "training" (``time.sleep``: the GIL is free, as
   in a real step that runs on the accelerator). Seed 003's way (whole-shard
   synchronous download, ``np.load``, reshape, ``device_put``; with its
   ``dp`` bug fixed so it runs) against ``zerobatch.jax.ShardDataset``
   (range reads of this step's rows, read ahead and placed in a background
   thread). Reported, in ms: the total time the consumer waited for data;
   the first call (building the loader included); the steps that switch to
   a new shard; every other step (for seed 003 these include slicing the
   shard's device arrays per step); and, after the first call, how many
   waits exceeded 1 ms and the longest.

2. Cost of placement. Tokens/s of one step (32 shuffled windows of 1,024
   tokens, int32 inputs and labels) read from a local ``.npy`` folder, then
   made global arrays over 8 CPU devices in seed 003's layout (``GlobalSteps``,
   ``jax.make_array_from_process_local_data``), against the read alone and
   ``np.copyto`` of the same bytes (the memory-copy limit), in one thread.

    python benchmarks/jax_input.py [--shards 4] [--shard-tokens 2_000_000]
        [--latency 0.02] [--bandwidth 100e6] [--step-ms 10] [--seconds 3]
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import numpy as np
import obstore
from _plot import bars, groups
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zerobatch.jax import GlobalSteps, ShardDataset
from zerobatch.shuffle import Feistel
from zerobatch.storage import open_storage
from zerobatch.stream.npy import open_npy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.s3_server import S3Server

T, BATCH, MICRO, DP = 1024, 4, 2, 8
SERVE = """
import sys, threading
from support.s3_server import FaultProxy, S3Server
server = S3Server().start()
proxy = FaultProxy(server.endpoint)
proxy.state.latency, proxy.state.bandwidth = float(sys.argv[1]), float(sys.argv[2])
print(server.endpoint, proxy.endpoint, flush=True)
threading.Event().wait()
"""


class SeedLoader:
    """Seed 003's Dataset: whole shards downloaded synchronously when needed."""

    def __init__(self, url: str, names: list[str], options: dict[str, Any],
                 partition: NamedSharding) -> None:
        self.storage = open_storage(url, **options)
        self.names = names
        self.partition = partition
        self.shard = 0
        self.step_idx = 0
        self.load_next_shard()

    def load_next_shard(self) -> None:
        name = self.names[self.shard % len(self.names)]
        self.shard += 1
        size = self.storage.size(name)
        raw = bytearray(size)
        self.storage.readinto(self.storage.open(name), 0, raw)  # one GET of the whole shard
        data = np.load(io.BytesIO(raw))
        rows = DP * BATCH
        usable = (len(data) - 1) // (rows * T)
        shape = (usable, MICRO, rows // MICRO, T)
        x = data[:-1][: usable * rows * T].astype(np.int32).reshape(shape)
        y = data[1:][: usable * rows * T].astype(np.int32).reshape(shape)
        self.x = jax.device_put(x, self.partition)
        self.y = jax.device_put(y, self.partition)
        self.step_idx = 0

    def __call__(self, step: int = 1) -> tuple[Any, Any]:
        if self.step_idx >= self.x.shape[0]:
            self.load_next_shard()
        x = self.x[self.step_idx : self.step_idx + step]
        y = self.y[self.step_idx : self.step_idx + step]
        self.step_idx += step
        return x, y


def consume(make: Callable[[], Any], steps: int, step_s: float) -> list[float]:
    """Per step, seconds the consumer waited for its arrays (ready on device);
    the first wait includes building the source."""
    waits = []
    start = time.perf_counter()
    source = make()
    for _ in range(steps):
        jax.block_until_ready(source(1))
        waits.append(time.perf_counter() - start)
        time.sleep(step_s)
        start = time.perf_counter()
    if hasattr(source, "close"):
        source.close()
    return waits


def report(name: str, waits: list[float], switches: set[int]) -> dict[str, float]:
    """One row: total wait, first call, the steps that switch shards after the
    first, the others, stalls (waits over 1 ms) after the first call, the
    longest. Returns the row's milliseconds by column, for the chart."""
    after = waits[1:]
    at_switch = sum(w for i, w in enumerate(waits) if i in switches)
    other = sum(after) - at_switch
    stalls = [w for w in after if w > 1e-3]
    print(f"{name:<26} {sum(waits) * 1e3:8.1f} {waits[0] * 1e3:8.1f} {at_switch * 1e3:9.1f} "
          f"{other * 1e3:8.1f} {len(stalls):7d} {max(after) * 1e3:7.1f}")
    return {"waited in all": sum(waits) * 1e3, "first call": waits[0] * 1e3,
            "at shard switches": at_switch * 1e3, "other steps": other * 1e3,
            "longest wait after the first": max(after) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-tokens", type=int, default=2_000_000)
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per request")
    parser.add_argument("--bandwidth", type=float, default=100e6, help="bytes/s per response")
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--prefetch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0, help="per placement row")
    args = parser.parse_args()

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"nproc={os.cpu_count()}  RAM={ram:.1f} GiB  load={os.getloadavg()[0]:.2f}  "
          f"jax={jax.__version__}  date={time.strftime('%Y-%m-%d')}")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(1, DP, 1), ("pp", "dp", "tp"))
    stalls(args, NamedSharding(mesh, P(None, "pp", "dp", "tp")))
    placement(args, NamedSharding(mesh, P("pp", "dp", "tp")))


def stalls(args: argparse.Namespace, partition: NamedSharding) -> None:
    """Part 1: the consumer's waits, seed 003's loader against ShardDataset."""
    print("\n1. stall at shard switches")
    # The S3 server and the proxy run in another process: their Python request
    # handling must not compete with the consumer for this process's GIL.
    server_process = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(args.latency), str(args.bandwidth)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1] / "tests")
    assert server_process.stdout is not None
    endpoint, proxied = server_process.stdout.readline().split()
    server = S3Server(endpoint=endpoint)
    try:
        root = server.url("jax-input")
        store = open_storage(f"{root}/train", **server.storage_options())
        rng = np.random.default_rng(0)
        names = []
        for i in range(args.shards):
            buffer = io.BytesIO()
            np.save(buffer, rng.integers(0, 50_257, size=args.shard_tokens, dtype=np.uint16))
            names.append(f"shard_{i:03d}.npy")
            obstore.put(store.store, store.key(names[-1]), buffer.getvalue())
        rows = DP * BATCH
        steps = args.shards * ((args.shard_tokens - 1) // (rows * T)) - 1
        options = server.storage_options(proxied)
        print(f"{args.shards} shards of {args.shard_tokens:,} uint16 tokens; step = {rows} "
              f"windows of {T} tokens ({rows * T * 2 / 1e3:.0f} kB); {steps} steps; consumer "
              f"{args.step_ms:.0f} ms/step; proxy latency {args.latency * 1e3:.0f} ms, "
              f"{args.bandwidth / 1e6:.0f} MB/s per response")
        print(f"{'':<26} {'wait ms':>8} {'first':>8} {'switches':>9} {'other':>8} "
              f"{'stalls':>7} {'max ms':>7}")
        per_shard = (args.shard_tokens - 1) // (rows * T)
        seed_switches = {i for i in range(1, steps) if i % per_shard == 0}
        ours = {i for i in range(1, steps)
                if (i * rows * T) // args.shard_tokens
                != ((i + 1) * rows * T) // args.shard_tokens}
        step_s = args.step_ms / 1e3
        seed = report("seed 003 (whole shards)", consume(
            lambda: SeedLoader(f"{root}/train", names, options, partition), steps, step_s),
            seed_switches)
        mine = report(f"ShardDataset prefetch={args.prefetch}", consume(
            lambda: ShardDataset(root, "train", T, BATCH, MICRO, DP, 1, partition,
                                 prefetch=args.prefetch, storage_options=options),
            steps, step_s), ours)
        groups("jax_input_stalls", {column: {"seed 003 (whole shards)": seed[column],
                                             f"zerobatch ShardDataset prefetch={args.prefetch}":
                                             mine[column]} for column in seed},
               title=f"Time the consumer waited for data over s3:// ({steps} steps of "
                     f"{args.step_ms:.0f} ms, {args.latency * 1e3:.0f} ms a request)",
               xlabel="ms (shorter is better)", fmt="{:,.1f}")
    finally:
        server_process.kill()
        server_process.wait()


def _rate(step: Callable[[], Any], tokens: int, seconds: float) -> float:
    """Tokens/s of ``step`` (one step of ``tokens``), run for about ``seconds``."""
    step()  # warm up: compile, first buffers
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        count += 1
    return count * tokens / (time.perf_counter() - start)


def placement(args: argparse.Namespace, sharding: NamedSharding) -> None:
    """Part 2: what putting a step on the devices costs, against reading it."""
    print("\n2. cost of placement (shuffled windows from a local .npy folder, warm cache)")
    rows = DP * BATCH
    with tempfile.TemporaryDirectory() as folder:
        rng = np.random.default_rng(1)
        for i in range(args.shards):
            np.save(f"{folder}/{i:03d}.npy",
                    rng.integers(0, 50_257, size=args.shard_tokens, dtype=np.uint16))
        windows = open_npy(folder).windows(T, dtype="int32")
        steps = GlobalSteps(sharding, rows=rows, seq_len=T, microbatch=MICRO)
        order = Feistel(len(windows), seed=0)
        position = [0]

        def indices() -> np.ndarray:
            start = position[0] % (len(windows) - rows)
            position[0] += rows
            return order(np.arange(start, start + rows))

        def read() -> Any:
            return windows.read(indices())

        def read_and_place() -> Any:
            return jax.block_until_ready(steps(windows.read(indices())))

        source = np.empty((2, rows, T), np.int32)
        target = np.empty_like(source)
        results = {
            "np.copyto of the same bytes": _rate(lambda: np.copyto(target, source), rows * T,
                                                 args.seconds),
            "read (NumPy, int32 x and y)": _rate(read, rows * T, args.seconds),
            "read + to_global (8 devices)": _rate(read_and_place, rows * T, args.seconds),
        }
    limit = results["np.copyto of the same bytes"]
    for name, rate in results.items():
        print(f"{name:<32} {rate / 1e6:9.1f} M tokens/s  {rate / limit:6.3f} of the copy limit")
    shares = {("zerobatch " + name if name.startswith(("read", "ShardDataset")) else name):
              rate / limit for name, rate in results.items()}
    bars("jax_input_placement", shares, limit=1.0, limit_label="np.copyto",
         title="One JAX step's read and placement on 8 CPU devices, as a share of np.copyto",
         xlabel="share of the copy limit (same bytes)",
         labels={key: f"{share:.3f}" for key, share in shares.items()})


if __name__ == "__main__":
    main()
