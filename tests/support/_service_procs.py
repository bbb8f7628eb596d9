"""Child-process entry points for the service tests (spawned, so module level)."""

from __future__ import annotations

from typing import Any

import numpy as np

from zerobatch.columnar import Batch, BatchMeta, Jagged

# Producer groups: which fields each producer writes.
GROUPS: dict[str, tuple[str, ...]] = {
    "dense": ("logprobs", "reward"),
    "jagged": ("response",),
    "objects": ("prompt",),
}


def sample_columns(indexes: np.ndarray, group: str) -> dict[str, Any]:
    """Deterministic values of ``group``'s fields for samples ``indexes``."""
    indexes = np.asarray(indexes, dtype=np.int64)
    if group == "dense":
        logprobs = (indexes[:, None] * 4 + np.arange(4)).astype(np.float32) / 7
        return {"logprobs": logprobs, "reward": indexes.astype(np.int64) * -3}
    if group == "jagged":
        lengths = indexes % 5
        parts = [np.full((n, 2), i, dtype=np.int32) for i, n in zip(indexes, lengths, strict=True)]
        return {"response": Jagged.from_arrays(parts, dtype=np.int32)}
    return {"prompt": [f"prompt {i} ✓" * int(i % 3) for i in indexes.tolist()]}


def serve_fieldstore(address: str, queue: Any, **options: Any) -> None:
    """Run a FieldStoreServer; report its bound address on ``queue``."""
    from zerobatch.service import FieldStoreServer

    server = FieldStoreServer(address, **options)
    queue.put(server.address)
    server.serve()


def produce(address: str, partition: str, group: str, count: int, seed: int) -> None:
    """Put ``group``'s fields for samples 0..count-1 in random order and chunk sizes."""
    from zerobatch.service import FieldStore

    rng = np.random.default_rng(seed)
    order = rng.permutation(count)
    with FieldStore(address, timeout=20) as store:
        start = 0
        while start < count:
            size = int(rng.integers(1, 9))
            chosen = order[start : start + size]
            start += size
            meta = BatchMeta(
                chosen, partition_ids=partition, production_status=np.ones(len(chosen))
            )
            store.put(Batch.from_columns(sample_columns(chosen, group), meta), partition)


def serve_batches(path: str, seq_len: int, address: str, queue: Any, **options: Any) -> None:
    """Run a BatchServer over ``path``'s windows; report its bound address on ``queue``."""
    from zerobatch.service import BatchServer
    from zerobatch.stream import open_dataset

    server = BatchServer(open_dataset(path).windows(seq_len), address, **options)
    queue.put(server.address)
    server.serve()
