"""Imported by the kill tests' forkserver only (``resumed_loops.forkserver``):
runs every loop of ``support.resumed_loops`` once over tiny data written as the
tests write theirs (the same token and field dtypes), so the server holds every
import and every Numba kernel those loops call, and each child forks warm."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from zerobatch import StreamWriter

from support.resumed_loops import loader_loop, mixture_loop, packing_loop  # isort: skip


def _run() -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpora = []
        for i in range(3):
            corpora.append(root / f"c{i}")
            with StreamWriter(corpora[-1], shard_tokens=2_000) as writer:
                for _ in range(30):
                    writer.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 50))))
        packed = root / "packed"
        with StreamWriter(packed, fields={"loss_mask": "u1"}, metadata="json") as writer:
            for n in range(2, 60):
                writer.add_document(np.arange(n) + 1, fields={"loss_mask": np.ones(n)},
                                    spans=[(n // 2, n, "assistant")])
        for name, loop, data in (("loader", loader_loop, corpora[0]),
                                 ("mixture", mixture_loop, corpora),
                                 ("packing", packing_loop, packed)):
            (root / name).mkdir()
            loop(data, root / name / "log", root / name / "checkpoint.json", None)


_run()
