"""The Loader's automatic reader threads (``num_threads=None``, the default):
where a pass starts reading, when it moves to a thread, and that the batches
never depend on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import zerobatch._readers as readers
from zerobatch import Batch, Loader, StreamWriter, open_dataset
from zerobatch._readers import WINDOW, Waits


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = tmp_path_factory.mktemp("auto") / "corpus"
    rng = np.random.default_rng(1)
    with StreamWriter(folder) as writer:
        for _ in range(200):
            writer.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 60))))
    return open_dataset(folder).windows(16)


class _Plain:
    """A user's own source: it says nothing about its reads."""

    def __len__(self) -> int:
        return 400

    def read(self, indices):
        return Batch.from_columns({"x": indices * 3})


class _Local(_Plain):
    reads_wait = False


def _indices(batches) -> list[list[int]]:
    return [np.asarray(b["input_ids"] if "input_ids" in b else b["x"]).tolist()
            for b in batches]


def test_local_windows_read_in_the_callers_thread(windows):
    assert windows.reads_wait is False
    loader = Loader(windows, 4, seed=3, output="numpy")
    assert loader.num_threads is None and loader._reader_threads() is None
    it = iter(loader)
    next(it)
    assert it._readers is None and loader._threads is None  # no thread started


@pytest.mark.parametrize("settings, threads", [
    ({"transform": lambda batch: batch}, 1),       # user code may wait
    ({"prefetch": 0}, 0),                          # no read-ahead asked for
    ({"num_threads": 2}, 2),                       # explicit wins
])
def test_what_starts_a_thread(windows, settings, threads):
    assert Loader(windows, 4, **settings)._reader_threads() == threads


def test_a_source_that_may_wait_gets_a_thread():
    assert Loader(_Plain(), 4)._reader_threads() == 1
    assert Loader(_Local(), 4)._reader_threads() is None


def test_device_output_gets_a_thread(windows):
    torch = pytest.importorskip("zerobatch.torch")
    assert Loader(windows, 4, output=torch.TorchOutput())._reader_threads() is None
    assert Loader(windows, 4, output=torch.TorchOutput(device="cpu"))._reader_threads() == 1


@pytest.mark.parametrize("switch_at", [1, 5, 23])
def test_moving_to_a_thread_keeps_the_batches_and_the_state(windows, monkeypatch, switch_at):
    plain = Loader(windows, 4, seed=5, output="numpy", num_threads=0)
    expected, expected_states = [], []
    for batch in plain:
        expected.append(batch)
        expected_states.append(plain.state_dict())
    calls = {"n": 0}

    def end(self, began):  # the caller "waits" from step switch_at on
        calls["n"] += 1
        return calls["n"] >= switch_at

    monkeypatch.setattr(Waits, "end", end)
    loader = Loader(windows, 4, seed=5, output="numpy")
    it = iter(loader)
    got, states = [], []
    for batch in it:
        got.append(batch)
        states.append(loader.state_dict())
        if len(got) == switch_at:
            assert it._readers is not None  # moved to one reader thread
            assert len(it._readers._threads) == 1
    assert _indices(got) == _indices(expected)
    assert states == expected_states
    assert loader._threads is None  # the pass ended: its thread was joined


class _Clock:
    """A fake ``time`` for Waits: the test moves the wall and CPU clocks."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu


def _run(waits: Waits, clock: _Clock, steps: int, *, read: float, away: float,
         away_cpu: float) -> int | None:
    """Steps of ``read`` seconds (on the CPU) with ``away`` seconds between them,
    ``away_cpu`` of them on the caller's CPU; the step at which Waits says
    move, or None."""
    for step in range(1, steps + 1):
        clock.wall += away
        clock.cpu += away_cpu
        began = waits.begin()
        clock.wall += read
        clock.cpu += read
        if waits.end(began):
            return step
    return None


def test_waits_moves_once_the_caller_waits_as_long_as_it_reads(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(readers, "time", clock)
    # Input-bound: back at once. Busy on its own CPU (GIL): never a thread.
    assert _run(Waits(), clock, 200, read=50e-6, away=1e-6, away_cpu=1e-6) is None
    assert _run(Waits(), clock, 200, read=50e-6, away=1e-3, away_cpu=1e-3) is None
    # Waiting (a GPU, a sleep) as long as a read: two windows, then a thread.
    assert _run(Waits(), clock, 200, read=50e-6, away=60e-6, away_cpu=5e-6) == 2 * WINDOW
    assert _run(Waits(), clock, 200, read=50e-6, away=10e-3, away_cpu=0.0) == 2 * WINDOW


def test_waits_ignores_a_rare_long_pause(monkeypatch):
    """One preemption (or a garbage collection) a window is not a waiting caller."""
    clock = _Clock()
    monkeypatch.setattr(readers, "time", clock)
    waits = Waits()
    for _ in range(50):
        assert _run(waits, clock, 1, read=50e-6, away=5e-3, away_cpu=0.0) is None
        assert _run(waits, clock, WINDOW - 1, read=50e-6, away=1e-6, away_cpu=1e-6) is None
