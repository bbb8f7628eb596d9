"""The fine-tuning loop of test_packing's SIGKILL test, in a module of its own.

A process that imports it runs the loop once over a tiny dataset (every
kernel loaded), except a multiprocessing child unpickling its target: a
forkserver that preloads this module hands each killed child warm kernels,
and a child of another forkserver only imports it."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import tempfile
from pathlib import Path

import numpy as np

from zerobatch import Loader, StreamWriter, open_dataset


def train(folder: Path, log: Path, checkpoint: Path, kill_at: int | None) -> None:
    """A fine-tuning loop over packed conversations (a hashed bigram table
    trained by SGD on the assistant tokens); checkpoints (model, loader state,
    log lines) every 2 steps, SIGKILLs itself after ``kill_at`` logged steps."""
    packed = open_dataset(folder).documents().packed(48, window=24, loss_spans="assistant",
                                                     labels="aligned")
    loader = Loader(packed, 3, seed=7, prefetch=2, num_threads=2, output="numpy")
    weights = np.zeros(4096)
    lines = 0
    if checkpoint.exists():
        saved = json.loads(checkpoint.read_text())
        loader.load_state_dict(saved["state"])
        weights = np.array(saved["weights"])
        lines = saved["lines"]
    with open(log, "r+" if log.exists() else "w") as file:
        file.truncate(sum(len(x) for x in file.readlines()[:lines]) if lines else 0)
        file.seek(0, os.SEEK_END)
        for step, batch in enumerate(loader, start=1):
            ids, labels = batch["input_ids"][:, :-1], batch["labels"][:, 1:]
            take = labels != -100
            slots = (ids[take] * 31 + labels[take]) % 4096
            np.add.at(weights, slots, 0.1 * (1.0 - weights[slots]))
            file.write(f"{float(weights.sum())!r}\n")
            file.flush()
            lines += 1
            if lines == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % 2 == 0:
                tmp = checkpoint.with_suffix(".tmp")
                tmp.write_text(json.dumps({"state": loader.state_dict(), "lines": lines,
                                           "weights": weights.tolist()}))
                os.replace(tmp, checkpoint)
    np.save(log.parent / "final.npy", weights)


def _warm() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        with StreamWriter(folder, fields={"loss_mask": "u1"}, metadata="json") as writer:
            for n in range(2, 60):
                writer.add_document(np.arange(n) + 1, fields={"loss_mask": np.ones(n)},
                                    spans=[(n // 2, n, "assistant")])
        train(folder, Path(tmp) / "log", Path(tmp) / "checkpoint.json", None)


if not getattr(multiprocessing.current_process(), "_inheriting", False):
    _warm()
