"""Training loops SIGKILLed and resumed from their checkpoints, and the driver
that kills them (the kill tests of test_loader, test_mixture and test_packing).

A killed child started cold costs seconds (imports, Numba kernels loaded from
their cache, ~1.3 s); twenty of them were most of a kill test. :func:`forkserver`
starts one forkserver that has imported this module and ``support._warm_loops``
(which ran every loop once over tiny data), so each child forks warm. Python
3.11's forkserver imports its preloads on the ``PYTHONPATH`` it inherits (not
``sys.path``), silently skips one it cannot import, and ignores
``set_forkserver_preload`` once running: :func:`forkserver` sets the path,
restarts a server started with other preloads, and checks that a child is warm.

Every loop appends one line per step to ``log``, SIGKILLs itself once the log
has ``kill_at`` lines (reader threads mid-flight), and checkpoints the loader's
state and the log's length every few steps; a resumed run truncates the log to
the checkpoint's length first, so a finished log equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sys
from collections.abc import Callable
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import numpy as np

from zerobatch import Loader, Mixture, open_dataset

__all__ = ["AFTER", "BEFORE", "CHANGE_FROM", "forkserver", "kill_and_resume", "loader_loop",
           "mixture_loop", "packing_loop", "windows_mixture"]

_PRELOAD = ["zerobatch", "support.resumed_loops", "support._warm_loops"]


def _logged(loader: Loader, log: Path, checkpoint: Path, kill_at: int | None, *, every: int,
            line: Callable[[Any], str], extra: Callable[[], dict[str, Any]] = dict) -> None:
    """Iterate ``loader`` (its state already loaded), appending ``line(batch)``
    to ``log``; SIGKILL at line ``kill_at``; every ``every`` steps write
    ``{"state", "lines", **extra()}`` to ``checkpoint`` atomically."""
    lines = json.loads(checkpoint.read_text())["lines"] if checkpoint.exists() else 0
    with open(log, "r+" if log.exists() else "w") as file:
        file.truncate(sum(len(x) for x in file.readlines()[:lines]) if lines else 0)
        file.seek(0, os.SEEK_END)
        for step, batch in enumerate(loader, start=1):
            file.write(line(batch) + "\n")
            file.flush()
            lines += 1
            if lines == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % every == 0:
                tmp = checkpoint.with_suffix(".tmp")
                tmp.write_text(json.dumps({"state": loader.state_dict(), "lines": lines,
                                           **extra()}))
                os.replace(tmp, checkpoint)


def _saved(checkpoint: Path) -> dict[str, Any] | None:
    return json.loads(checkpoint.read_text()) if checkpoint.exists() else None


def loader_loop(folder: Path, log: Path, checkpoint: Path, kill_at: int | None) -> None:
    """One shuffled epoch of 16-token windows, 4 a step (2 reader threads);
    logs each batch's indices; checkpoints every 3 steps; writes ``done``."""
    loader = Loader(open_dataset(folder).windows(16), 4, seed=11, prefetch=3, num_threads=2,
                    output="batch")
    saved = _saved(checkpoint)
    if saved is not None:
        loader.load_state_dict(saved["state"])
    _logged(loader, log, checkpoint, kill_at, every=3,
            line=lambda batch: " ".join(map(str, batch.meta.global_indexes)))
    (log.parent / "done").write_text("ok")


BEFORE = {"c0": 0.5, "c1": 0.3, "c2": 0.2}
AFTER = {"c0": 0.1, "c1": 0.3, "c2": 0.6}
CHANGE_FROM = 30  # lines: mixture_loop's first resume at or past this many changes the weights


def windows_mixture(corpora: list[Path], weights: dict[str, float], length: int) -> Mixture:
    """8-token windows of ``corpora`` (named c0, c1, ...) mixed by ``weights``."""
    return Mixture({f"c{i}": open_dataset(p).windows(8) for i, p in enumerate(corpora)},
                   weights, seed=17, length=length, block_size=32)


def mixture_loop(corpora: list[Path], log: Path, checkpoint: Path, kill_at: int | None) -> None:
    """A mixture of ``corpora``, 800 rows, 4 a step (2 reader threads); logs
    ``position:source:first token`` per row; checkpoints every 3 steps. The
    first resume from a checkpoint of ``CHANGE_FROM`` lines or more changes the
    weights from ``BEFORE`` to ``AFTER``; writes ``done``."""
    saved = _saved(checkpoint)
    weights = BEFORE if saved is None or saved["lines"] < CHANGE_FROM else AFTER
    loader = Loader(windows_mixture(corpora, weights, 800), 4, prefetch=3, num_threads=2,
                    output="batch")
    if saved is not None:
        loader.load_state_dict(saved["state"], allow={"weights"})

    def line(batch: Any) -> str:
        rows = zip(batch.meta.global_indexes.tolist(), batch["source"].tolist(),
                   batch["input_ids"][:, 0].tolist(), strict=True)
        return " ".join(f"{p}:{s}:{t}" for p, s, t in rows)

    _logged(loader, log, checkpoint, kill_at, every=3, line=line)
    (log.parent / "done").write_text("ok")


def packing_loop(folder: Path, log: Path, checkpoint: Path, kill_at: int | None) -> None:
    """A fine-tuning loop over packed conversations (a hashed bigram table
    trained by SGD on the assistant tokens); checkpoints (loader state, the
    table, the log's length) every 2 steps; writes ``final.npy``."""
    packed = open_dataset(folder).documents().packed(48, window=24, loss_spans="assistant",
                                                     labels="aligned")
    loader = Loader(packed, 3, seed=7, prefetch=2, num_threads=2, output="numpy")
    saved = _saved(checkpoint)
    weights = np.zeros(4096)
    if saved is not None:
        loader.load_state_dict(saved["state"])
        weights = np.array(saved["weights"])

    def step(batch: Any) -> str:
        ids, labels = batch["input_ids"][:, :-1], batch["labels"][:, 1:]
        take = labels != -100
        slots = (ids[take] * 31 + labels[take]) % 4096
        np.add.at(weights, slots, 0.1 * (1.0 - weights[slots]))
        return repr(float(weights.sum()))

    _logged(loader, log, checkpoint, kill_at, every=2, line=step,
            extra=lambda: {"weights": weights.tolist()})
    np.save(log.parent / "final.npy", weights)


def _is_warm() -> None:
    """Exit 0 in a child of a warm forkserver, 3 otherwise."""
    sys.exit(0 if "support._warm_loops" in sys.modules else 3)


def forkserver() -> ForkServerContext:
    """The forkserver context, its server running with this module and the warm
    loops preloaded (started once per process; one started with other preloads
    is stopped first). AssertionError if its children are not warm."""
    from multiprocessing import forkserver as server_module

    context = multiprocessing.get_context("forkserver")
    server: Any = server_module._forkserver
    if server._forkserver_pid is not None and server._preload_modules == _PRELOAD:
        return context
    server._stop()  # started with other preloads (or never): those cannot change
    context.set_forkserver_preload(_PRELOAD)
    tests = str(Path(__file__).parents[1])
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([tests, *filter(None, [before])])
    try:
        server.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    probe = context.Process(target=_is_warm)
    probe.start()
    probe.join(120)
    assert probe.exitcode == 0, (f"forkserver children are not warm (exit {probe.exitcode}): "
                                 f"could it import {_PRELOAD}?")
    return context


def kill_and_resume(loop: Callable[..., None], args: tuple[Any, ...], checkpoint: Path,
                    done: Path, *, seed: int, ahead: int, kills: int = 20,
                    timeout: float = 60) -> None:
    """Run ``loop(*args, kill_at)`` in warm forkserver children until it writes
    ``done``: the first ``kills`` runs are killed at a random line 1 to
    ``ahead - 1`` past their checkpoint, the last runs to the end. Asserts each
    child was killed or exited 0, within ``timeout`` seconds."""
    context = forkserver()
    rng = random.Random(seed)
    killed = 0
    while not done.exists():
        saved = json.loads(checkpoint.read_text())["lines"] if checkpoint.exists() else 0
        target = saved + rng.randrange(1, ahead) if killed < kills else None
        child = context.Process(target=loop, args=(*args, target))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise AssertionError(f"{loop.__name__} still ran after {timeout} s")
        if child.exitcode == -signal.SIGKILL:
            killed += 1
        else:
            assert child.exitcode == 0, f"{loop.__name__} exited {child.exitcode}"
    assert killed == kills
