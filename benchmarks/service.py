"""The batch service on loopback: FieldStore against TransferQueue 0.1.11.

FieldStore round trip, seed 002's case: one batch of B = 1,024 samples and
F = 10 fields (six dense float32[128], two jagged float32 of 1 to 256 items,
two string fields; the batch of ``benchmarks/columnar.py``) is put into a new
partition, ``get_meta`` asks for all 10 fields of 1,024 samples for a task, and
``get`` fetches them: put + get_meta + get, timed together, the partition
cleared after each round (not timed). zerobatch runs a FieldStoreServer in a
child process; TransferQueue runs its own system (``tq.init``: a Ray controller
and one SimpleStorage unit, the same work, its client API). The memory-copy
limit is ``np.copyto`` of the batch's bytes twice (in and out), same run.

Times are the median of the rounds; compare the ratios, not absolute times.
Runs without transferqueue or ray (then prints zerobatch alone, with a note).

Usage: python benchmarks/service.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from columnar import B, make_columns

from zerobatch.columnar import Batch, BatchMeta
from zerobatch.service import FieldStore, FieldStoreServer

SPAWN = multiprocessing.get_context("spawn")


def _serve_fieldstore(queue: Any) -> None:
    server = FieldStoreServer("tcp://127.0.0.1:*")
    queue.put(server.address)
    server.serve()


def median_seconds(fn: Callable[[int], Any], rounds: int) -> float:
    """Median wall time of ``fn(round)`` over ``rounds`` rounds, after one warm-up."""
    fn(-1)
    times = []
    for i in range(rounds):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def batch_bytes(batch: Batch) -> int:
    """Bytes of the batch's array data (dense arrays, jagged values and offsets)."""
    total = 0
    for name in batch.fields:
        column = batch[name]
        if isinstance(column, np.ndarray):
            total += column.nbytes
        elif isinstance(column, list):
            total += sum(len(s.encode()) for s in column)
        else:
            total += column.values.nbytes + column.offsets.nbytes
    return total


def zerobatch_round_trip(columns: dict[str, Any], rounds: int) -> tuple[float, int]:
    """Median seconds of put + get_meta + get with a FieldStoreServer in a child process."""
    queue = SPAWN.Queue()
    server = SPAWN.Process(target=_serve_fieldstore, args=(queue,), daemon=True)
    server.start()
    fields = list(columns)
    try:
        with FieldStore(queue.get(timeout=60), timeout=60) as store:

            def one(i: int) -> None:
                partition = f"train@step_{i}"
                meta = BatchMeta(np.arange(B), partition_ids=partition)
                store.put(Batch.from_columns(columns, meta), partition)
                got = store.get(store.get_meta(fields, B, partition, "actor"))
                assert len(got) == B and got.fields == fields

            seconds = median_seconds(one, rounds)
            frames = len(Batch.from_columns(columns).to_frames())
            for i in range(-1, rounds):
                store.clear(f"train@step_{i}")
    finally:
        server.kill()
        server.join()
    return seconds, frames


def transferqueue_round_trip(columns: dict[str, Any], rounds: int) -> float:
    """Median seconds of put + get_meta + get_data through TransferQueue's own system."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        client = tq.get_client()
        data = TensorDict(dict(columns), batch_size=[B])
        fields = list(columns)

        def one(i: int) -> None:
            partition = f"train@step_{i}"
            client.put(data, partition_id=partition)
            meta = client.get_meta(fields, B, partition, mode="fetch", task_name="actor")
            got = client.get_data(meta)
            assert len(got) == B

        seconds = median_seconds(one, rounds)
        for i in range(-1, rounds):
            client.clear_partition(f"train@step_{i}")
        tq.close()
    finally:
        ray.shutdown()
    return seconds


def copy_limit(batch: Batch, rounds: int) -> float:
    """Median seconds to np.copyto the batch's dense and jagged bytes twice (in and out)."""
    arrays = []
    for name in batch.fields:
        column = batch[name]
        if isinstance(column, np.ndarray):
            arrays.append(column)
        elif not isinstance(column, list):
            arrays += [column.values, column.offsets]
    targets = [np.empty_like(a) for a in arrays]

    def one(_: int) -> None:
        for _twice in range(2):
            for src, dst in zip(arrays, targets, strict=True):
                np.copyto(dst, src)

    return median_seconds(one, rounds)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def fieldstore_table(rounds: int) -> list[str]:
    columns = make_columns()
    batch = Batch.from_columns(columns)
    size = batch_bytes(batch)
    ours, frames = zerobatch_round_trip(columns, rounds)
    limit = copy_limit(batch, rounds)
    lines = [
        f"FieldStore round trip (put + get_meta + get), B = {B}, F = {len(columns)}, "
        f"{size / 1e6:.1f} MB of data, median of {rounds}\n",
        "| system | time | GB/s (data in + out) | frames per put | vs zerobatch |",
        "| --- | --- | --- | --- | --- |",
        f"| np.copyto limit (twice) | {fmt(limit)} | {2 * size / limit / 1e9:.2f} | - | "
        f"{limit / ours:.2f}× |",
        f"| zerobatch FieldStore | {fmt(ours)} | {2 * size / ours / 1e9:.2f} | {frames} | 1× |",
    ]
    try:
        theirs = transferqueue_round_trip(columns, rounds)
    except ImportError as exc:
        lines.append(f"\nnote: transferqueue not installed ({exc}); zerobatch alone.")
        return lines
    lines.append(
        f"| TransferQueue 0.1.11 | {fmt(theirs)} | {2 * size / theirs / 1e9:.2f} | - | "
        f"{theirs / ours:,.1f}× slower (target ≥ 10×) |"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed round trips per system")
    args = parser.parse_args()
    print("\n".join(fieldstore_table(args.rounds)))


if __name__ == "__main__":
    main()
