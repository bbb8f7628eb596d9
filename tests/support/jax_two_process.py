"""One of two JAX processes (4 CPU devices each) for tests/test_jax_distributed.py.

Usage: python tests/support/jax_two_process.py COORDINATOR PROCESS_ID DATA_FOLDER OUT.npz

Builds global arrays over the 8 devices of both processes, from this
process's rows only, and saves each addressable shard (its index and data)
and the windows this process read.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


class Recorder:
    """A source that notes every window it reads (to check per-process reads)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.read_windows: list[np.ndarray] = []
        self.fingerprint = source.fingerprint

    @property
    def seq_len(self) -> int:
        return int(self.source.seq_len)

    def __len__(self) -> int:
        return len(self.source)

    def read(self, indices: Any) -> Any:
        self.read_windows.append(np.asarray(indices).copy())
        return self.source.read(indices)


def main() -> None:
    coordinator, process_id, folder, out = sys.argv[1:5]
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2,
                               process_id=int(process_id))
    from zerobatch.jax import JaxOutput, ShardDataset, check_layout, local_rows, to_global
    from zerobatch.stream.npy import open_npy

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("zerobatch.jax")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    assert jax.process_count() == 2 and jax.device_count() == 8
    assert jax.local_device_count() == 4
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("pp", "dp", "tp"))
    saved: dict[str, np.ndarray] = {}

    def save(name: str, array: jax.Array) -> None:
        saved[f"{name}/shape"] = np.array(array.shape)
        for k, shard in enumerate(array.addressable_shards):
            bounds = [part.indices(n)[:2] for part, n in zip(shard.index, array.shape,
                                                              strict=True)]
            saved[f"{name}/{k}/index"] = np.array(bounds)
            saved[f"{name}/{k}/data"] = np.asarray(shard.data)

    # to_global from any source: step 5 of a (pp=2, dp=2, tp=2) layout.
    shape = check_layout(batch_size=4, microbatch=2, seq_len=8, dp=2, pp=2, tp=2)
    sharding = NamedSharding(mesh, P("pp", "dp", "tp"))
    source = Recorder(open_npy(folder + "/train").windows(8, dtype="int32"))
    rows = local_rows(sharding, shape)
    arrays = to_global(source.read(5 * 8 + rows), sharding, global_shape=shape)
    save("x", arrays["input_ids"])
    save("y", arrays["labels"])
    saved["rows"] = rows

    # Tensor parallelism across the processes: each holds half of every row's tokens.
    across = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("tp", "pp", "dp"))
    split_tokens = NamedSharding(across, P("pp", "dp", "tp"))
    tp_rows = local_rows(split_tokens, shape)
    save("t", to_global(source.read(5 * 8 + tp_rows), split_tokens,
                        global_shape=shape)["input_ids"])

    # ShardDataset: three calls of two steps, shuffled.
    partition = NamedSharding(mesh, P(None, "pp", "dp", "tp"))
    with ShardDataset(folder, "train", 8, 4, 2, 2, 2, partition, tp=2, shuffle=True,
                      seed=3, prefetch=0) as ds:
        recorder = Recorder(ds._windows)
        ds._windows = recorder  # type: ignore[assignment]
        for call in range(3):
            x, y = ds(2)
            save(f"ds{call}x", x)
            save(f"ds{call}y", y)
        saved["ds_read"] = np.concatenate(recorder.read_windows)
    saved["log_records"] = np.array(len(records))

    # Loader(output=JaxOutput(...)): rank and world size from JAX, three steps.
    from zerobatch import Loader

    source = Recorder(open_npy(folder + "/train").windows(8, dtype="int32"))
    with Loader(source, 4, output=JaxOutput(sharding, microbatch=2), seed=6,
                prefetch=0) as loader:
        assert (loader.rank, loader.world_size) == (int(process_id), 2)
        for step, (x, y) in zip(range(3), loader, strict=False):
            save(f"ld{step}x", x)
            save(f"ld{step}y", y)
    saved["ld_read"] = np.concatenate(source.read_windows)
    np.savez(out, **saved)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
