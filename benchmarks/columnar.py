"""Columnar batch metadata and its wire codec against TransferQueue 0.1.11's BatchMeta.

One batch of B = 1024 samples and F = 10 fields: 6 dense float32[128], 2 jagged
(1 to 256 float32 items per sample, torch nested tensors in the jagged layout),
2 string fields. Both libraries get the same tensors. Measured per library:
building a BatchMeta with ``add_fields``, metadata encode + decode, ``chunk(8)``,
``concat`` of the 8 chunks, ``select_fields`` of 3, a data message (PUT) encode +
decode, frames per PUT and per GET, and memory blocks the results keep alive.

Times are the best of repeated runs; compare the ratios, not absolute times.
Runs without transferqueue installed (then prints zerobatch alone, with a note).

Usage: python benchmarks/columnar.py [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _plot import groups

from zerobatch.columnar import Batch, BatchMeta

B = 1024
DENSE_FIELDS = 6
DENSE_WIDTH = 128
JAGGED_FIELDS = 2
STRING_FIELDS = 2
MAX_ITEMS = 256
CHUNKS = 8
SELECTED = ["dense0", "jagged0", "text0"]


def make_columns(seed: int = 0) -> dict[str, Any]:
    """The benchmark batch as torch tensors (dense, nested jagged) and lists of str."""
    rng = np.random.default_rng(seed)
    columns: dict[str, Any] = {}
    for f in range(DENSE_FIELDS):
        columns[f"dense{f}"] = torch.from_numpy(rng.random((B, DENSE_WIDTH), dtype=np.float32))
    for f in range(JAGGED_FIELDS):
        lengths = rng.integers(1, MAX_ITEMS + 1, size=B)
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        values = torch.from_numpy(rng.random(int(offsets[-1]), dtype=np.float32))
        columns[f"jagged{f}"] = torch.nested.nested_tensor_from_jagged(values, offsets)
    for f in range(STRING_FIELDS):
        columns[f"text{f}"] = [f"sample {i} of field {f}" for i in range(B)]
    return columns


def best_seconds(fn: Callable[[], Any], budget: float) -> float:
    """Best wall time of ``fn`` over at least 3 runs and about ``budget`` seconds.

    The best run is the least disturbed by other processes on a shared machine.
    """
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 1000):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def retained_blocks(fn: Callable[[], Any]) -> int:
    """Memory blocks (Python objects and buffers) that ``fn``'s result keeps alive."""
    gc.collect()
    before = sys.getallocatedblocks()
    result = fn()
    gc.collect()
    after = sys.getallocatedblocks()
    del result
    return after - before


class Zerobatch:
    """The operations, done with zerobatch."""

    name = "zerobatch"

    def __init__(self, columns: dict[str, Any]) -> None:
        self.columns = columns
        self.meta = self.add_fields()
        self.chunks = self.meta.chunk(CHUNKS)
        self.batch = Batch.from_columns(columns)

    def add_fields(self) -> BatchMeta:
        return BatchMeta(np.arange(B), partition_ids="train").add_fields(self.columns)

    def encode_decode_meta(self) -> BatchMeta:
        return BatchMeta.from_bytes(self.meta.to_bytes())

    def chunk(self) -> list[BatchMeta]:
        return self.meta.chunk(CHUNKS)

    def concat(self) -> BatchMeta:
        return BatchMeta.concat(self.chunks)

    def select_fields(self) -> BatchMeta:
        return self.meta.select_fields(SELECTED)

    def put_frames(self) -> list[Any]:
        return self.batch.to_frames()

    def get_frames(self) -> list[Any]:
        return self.batch.to_frames()

    def encode_decode_put(self) -> Batch:
        return Batch.from_frames(self.batch.to_frames())


class TransferQueue:
    """The same operations with transfer_queue 0.1.11 (its own code paths)."""

    name = "TransferQueue 0.1.11"

    def __init__(self, columns: dict[str, Any]) -> None:
        from tensordict import TensorDict
        from transfer_queue import metadata, storage
        from transfer_queue.storage.managers import simple_storage_manager as manager
        from transfer_queue.utils import serial_utils, zmq_utils

        self.metadata = metadata
        self.serial = serial_utils
        self.zmq = zmq_utils
        self.manager = manager.AsyncSimpleStorageManager
        self.unit_data = storage.simple_storage.StorageUnitData
        self.data = TensorDict(dict(columns), batch_size=[B])
        self.meta = self.add_fields()
        self.chunks = self.meta.chunk(CHUNKS)

    def add_fields(self) -> Any:
        meta = self.metadata.BatchMeta(list(range(B)), ["train"] * B)
        return meta.add_fields(self.data)

    def encode_decode_meta(self) -> Any:
        return self.serial.decode(self.serial.encode(self.meta))

    def chunk(self) -> list[Any]:
        return self.meta.chunk(CHUNKS)

    def concat(self) -> Any:
        return self.metadata.BatchMeta.concat(self.chunks)

    def select_fields(self) -> Any:
        return self.meta.select_fields(SELECTED)

    def _put_body(self) -> dict[str, Any]:
        positions = list(range(B))
        fields = list(self.data.keys())  # iterating a TensorDict walks its rows, not its keys
        data = {f: self.manager._select_by_positions(self.data[f], positions) for f in fields}
        return {"global_indexes": positions, "data": data}

    def put_frames(self) -> list[Any]:
        """Frames of the storage manager's PUT request to one storage unit."""
        request = self.zmq.ZMQRequestType.PUT_DATA
        return self.zmq.ZMQMessage.create(request, "manager", self._put_body()).serialize()

    def get_frames(self) -> list[Any]:
        """Frames of a storage unit's answer to a GET of all fields of the batch."""
        body = self._put_body()
        unit = self.unit_data()
        unit.put_data(body["data"], body["global_indexes"])
        result = unit.get_data(list(self.data.keys()), body["global_indexes"])
        response = self.zmq.ZMQRequestType.GET_DATA_RESPONSE
        return self.zmq.ZMQMessage.create(response, "unit", {"data": result}).serialize()

    def encode_decode_put(self) -> Any:
        return self.zmq.ZMQMessage.deserialize(self.put_frames())


OPERATIONS = [
    ("add_fields (new BatchMeta, 10 fields)", "add_fields", "≥100×"),
    ("metadata encode + decode", "encode_decode_meta", "≥5×"),
    ("chunk(8)", "chunk", "≥100×"),
    ("concat of 8 chunks", "concat", ""),
    ("select_fields(3)", "select_fields", ""),
    ("PUT message encode + decode (data)", "encode_decode_put", ""),
]


def fmt_time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per cell")
    args = parser.parse_args()
    torch.set_num_threads(1)
    columns = make_columns()
    libraries: list[Any] = [Zerobatch(columns)]
    try:
        libraries.append(TransferQueue(columns))
    except ImportError as exc:
        print(f"note: transferqueue not installed ({exc}); showing zerobatch alone.\n")
    names = [lib.name for lib in libraries]
    header = ["operation", *names]
    if len(libraries) == 2:
        header += ["ratio", "target"]
    rows: list[list[str]] = []
    drawn: dict[str, dict[str, float]] = {}
    for label, method, target in OPERATIONS:
        times = [best_seconds(getattr(lib, method), args.seconds) for lib in libraries]
        drawn[label] = {name: t * 1e6 for name, t in zip(names, times, strict=True)}
        row = [label, *(fmt_time(t) for t in times)]
        if len(times) == 2:
            row += [f"{times[1] / times[0]:,.0f}×", target]
        rows.append(row)
    for label, method, target in [
        ("frames per PUT", "put_frames", "F+1 = 11"),
        ("frames per GET", "get_frames", "F+1 = 11"),
    ]:
        counts = [len(getattr(lib, method)()) for lib in libraries]
        row = [label, *(f"{c:,}" for c in counts)]
        if len(counts) == 2:
            row += [f"{counts[1] / counts[0]:,.0f}×", target]
        rows.append(row)
    for label, method in [
        ("memory blocks kept by add_fields' meta", "add_fields"),
        ("memory blocks kept by chunk(8)", "chunk"),
        ("memory blocks kept by a decoded meta", "encode_decode_meta"),
    ]:
        counts = [retained_blocks(getattr(lib, method)) for lib in libraries]
        row = [label, *(f"{c:,}" for c in counts)]
        if len(counts) == 2:
            row += [f"{counts[1] / max(counts[0], 1):,.0f}×", ""]
        rows.append(row)
    fields = DENSE_FIELDS + JAGGED_FIELDS + STRING_FIELDS
    print(f"B = {B}, F = {fields}; ratio = other / zerobatch\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    groups("columnar", drawn, title=f"Batch metadata, B = {B}, F = {fields}: time per operation",
           xlabel="microseconds (log scale; shorter is faster)", log=True, fmt="{:,.1f}")


if __name__ == "__main__":
    main()
