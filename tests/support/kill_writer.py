"""Write a small token-stream dataset and SIGKILL this process at step K of the
publish sequence (tests/test_publish.py runs it; ``K = 0`` never kills).

A step is one call of ``os.fsync``, ``os.replace`` (local) or one
``ObjectStorage.put`` (an upload: a shard file or the manifest), counted from 1;
``K = -1`` kills at the upload of the manifest.

    python tests/support/kill_writer.py LOCATION K SEED [ENDPOINT]
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import numpy as np

from zerobatch.storage.object import ObjectStorage
from zerobatch.stream import StreamWriter
from zerobatch.stream.manifest import MANIFEST

ACCESS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


def arm(kill_at: int) -> None:
    """Make the ``kill_at``-th publish step SIGKILL this process, before it runs."""
    count = 0

    def step(args: tuple[Any, ...]) -> None:
        nonlocal count
        count += 1
        if count == kill_at or (kill_at == -1 and MANIFEST in args):
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(real: Any) -> Any:
        def patched(*args: Any, **kwargs: Any) -> Any:
            step(args)
            return real(*args, **kwargs)
        return patched

    os.fsync = wrap(os.fsync)
    os.replace = wrap(os.replace)
    ObjectStorage.put = wrap(ObjectStorage.put)  # type: ignore[method-assign]


def write(location: str, seed: int, options: dict[str, Any] | None = None) -> None:
    """Three shards of documents from ``seed``."""
    rng = np.random.default_rng(seed)
    with StreamWriter(location, shard_tokens=500, storage_options=options) as writer:
        for _ in range(12):
            writer.add_document(rng.integers(0, 1000, int(rng.integers(50, 120))))


if __name__ == "__main__":
    location, kill_at, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    options = None
    if len(sys.argv) > 4:
        options = {"config": {**ACCESS, "endpoint": sys.argv[4]},
                   "client_options": {"allow_http": True}}
    arm(kill_at)
    write(location, seed, options)
