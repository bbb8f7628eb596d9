"""The Loader over real datasets: the plan's order, exact and elastic resume, lifecycle."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch import Batch, Loader, StreamWriter, open_dataset
from zerobatch.batch_loader import BatchFileReader
from zerobatch.batch_writer import write_batch_file
from zerobatch.plan import Plan

from support.resumed_loops import kill_and_resume, loader_loop  # isort: skip


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("loader") / "corpus"
    rng = np.random.default_rng(0)
    with StreamWriter(folder, shard_tokens=3000) as writer:
        for _ in range(300):
            writer.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 60))))
    return folder


@pytest.fixture(scope="session")
def windows(corpus: Path):
    return open_dataset(corpus).windows(16)


def _plan_indices(plan: Plan, rank: int, epoch: int, consumed: int, steps: int) -> list[list[int]]:
    out = []
    for _ in range(steps):
        out.append(plan.indices(epoch, consumed, rank)[0].tolist())
        consumed += plan.step_size
    return out


@settings(max_examples=15, deadline=None)
@given(prefetch=st.integers(0, 5), threads=st.integers(0, 3), batch=st.integers(1, 20),
       world=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_loader_yields_the_plan(windows, prefetch, threads, batch, world, seed):
    rank = seed % world
    loader = Loader(windows, batch, seed=seed, rank=rank, world_size=world, prefetch=prefetch,
                    num_threads=threads, output="batch")
    got = [b.meta.global_indexes.tolist() if hasattr(b.meta.global_indexes, "tolist")
           else list(b.meta.global_indexes) for b in loader]
    assert got == _plan_indices(loader.plan, rank, 0, 0, len(loader))
    direct = windows.read(np.array(got[0]))
    again = next(iter(Loader(windows, batch, seed=seed, rank=rank, world_size=world,
                             output="numpy")))
    assert np.array_equal(again["input_ids"], direct["input_ids"])


def test_elastic_resume_exact(windows):
    length = len(windows)
    seen: list[int] = []
    state = None
    for world, batch, steps in ((4, 7, 5), (2, 11, 3), (3, 5, None)):
        loaders = [Loader(windows, batch, seed=3, rank=r, world_size=world, output="batch",
                          prefetch=2, num_threads=2) for r in range(world)]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(json.loads(json.dumps(state)))
        iterators = [iter(loader) for loader in loaders]
        count = 0
        while steps is None or count < steps:
            try:
                parts = [next(it) for it in iterators]
            except StopIteration:
                break
            for part in parts:
                seen += list(part.meta.global_indexes)
            count += 1
        states = [loader.state_dict() for loader in loaders]
        assert all(s == states[0] for s in states)  # the same on every rank
        state = states[0]
        for loader in loaders:
            loader.close()
    plan = Plan(length, 5, world_size=3)
    assert len(seen) == len(set(seen))
    consumed_before_last = 4 * 7 * 5 + 2 * 11 * 3
    assert len(seen) == length - plan.dropped(consumed_before_last)
    assert state["epoch"] == 1 and state["consumed"] == 0


def test_epochs_and_set_epoch(windows):
    loader = Loader(windows, 32, output="batch", epochs=2)
    firsts = [list(b.meta.global_indexes) for b in loader]
    assert len(firsts) == 2 * len(loader)
    assert firsts[0] != firsts[len(loader)]
    assert loader.epoch == 2
    loader.set_epoch(1)
    again = next(iter(loader))
    assert list(again.meta.global_indexes) == firsts[len(loader)]
    forever = iter(Loader(windows, 32, output="batch", epochs=None))
    assert sum(1 for _ in zip(range(3 * len(loader)), forever, strict=False)) == 3 * len(loader)


def test_padding_when_not_dropping_last(windows):
    loader = Loader(windows, 50, world_size=3, rank=2, drop_last=False, output="numpy")
    batches = list(loader)
    assert len(batches) == -(-len(windows) // 150)
    assert batches[-1]["padding"].dtype == np.bool_
    assert batches[-1]["padding"].any() and not batches[0]["padding"].any()


def test_torch_output_shares_memory(windows):
    import torch

    batch = next(iter(Loader(windows, 4, seed=1, num_threads=2)))
    assert batch["input_ids"].dtype == torch.int64
    assert batch["input_ids"].shape == (4, 16)
    assert torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])
    from zerobatch.torch import TorchOutput

    with pytest.warns(UserWarning, match="pin_memory"):
        pinned = next(iter(Loader(windows, 4, seed=1, output=TorchOutput(pin_memory=True))))
    assert torch.equal(pinned["input_ids"], batch["input_ids"])
    with pytest.warns(DeprecationWarning, match=r"TorchOutput\(device=...\)"):
        moved = next(iter(Loader(windows, 4, seed=1, device="cpu")))  # deprecated keyword
    assert moved["input_ids"].device == torch.device("cpu")
    with pytest.raises(ValueError, match="need torch output"):
        Loader(windows, 4, output="numpy", pin_memory=True)


def test_batch_file_source(tmp_path):
    tokens = np.arange(64 * 9, dtype=np.uint32).reshape(64, 9)
    write_batch_file(tmp_path / "t.batch", tokens, batch_size=4, seq_len=9, seed=1)
    reader = BatchFileReader(tmp_path / "t.batch")
    loader = Loader(reader, 2, seed=5, output="batch", num_threads=2)
    seen = []
    for batch in loader:
        assert batch["tokens"].shape == (2, 4, 9)
        for index, rows in zip(batch.meta.global_indexes, batch["tokens"], strict=True):
            assert np.array_equal(rows, reader.read_batch(index))
            seen.append(index)
    assert sorted(seen) == list(range(16))
    other = tmp_path / "u.batch"
    write_batch_file(other, tokens[:60], batch_size=4, seq_len=9, seed=1)
    with pytest.raises(ValueError, match=r"length|fingerprint"):
        Loader(BatchFileReader(other), 2, seed=5).load_state_dict(loader.state_dict())


class _Failing:
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 100

    def read(self, indices):
        if self.bad in indices.tolist():
            raise RuntimeError(f"shard corrupted at {self.bad}")
        return Batch.from_columns({"x": indices})


def test_read_error_surfaces_at_its_batch(windows):
    order = Plan(100, 10, seed=0).indices(0, 30, 0)[0]
    loader = Loader(_Failing(int(order[3])), 10, output="numpy", prefetch=4, num_threads=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    with pytest.raises(RuntimeError, match="shard corrupted") as info:
        next(it)
    assert any(frame.name == "read" for frame in traceback.extract_tb(info.value.__traceback__))
    assert loader.state_dict()["consumed"] == 30


def _loader_threads() -> int:
    """Reader threads of any Loader alive now (other fixtures' threads, such as a
    moto server's, come and go on their own and are not counted)."""
    return sum(t.name.startswith("zerobatch-loader") for t in threading.enumerate())


def test_threads_do_not_leak_and_close_joins_them(windows):
    gc.collect()
    baseline = _loader_threads()
    for i in range(200):
        loader = Loader(windows, 8, prefetch=3, num_threads=2, output="batch")
        it = iter(loader)
        for _ in range(i % 3):
            next(it)
        del it, loader
    deadline = time.monotonic() + 10
    while _loader_threads() > baseline and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert _loader_threads() == baseline
    loader = Loader(windows, 8, prefetch=8, num_threads=2, output="batch")
    it = iter(loader)
    next(it)
    threads = list(loader._threads._threads)
    assert len(threads) == 2 and all(t.is_alive() for t in threads)
    loader.close()
    assert not any(t.is_alive() for t in threads)  # joined by close(), not left to die
    assert loader._threads is None
    loader.close()  # idempotent
    assert _loader_threads() == baseline
    with pytest.raises(StopIteration):
        next(it)  # the closed pass ends
    with Loader(windows, 8, output="batch", num_threads=1) as inner:
        it = iter(inner)
        next(it)
        threads = list(inner._threads._threads)
    assert not any(t.is_alive() for t in threads)
    assert _loader_threads() == baseline


class _Squares:
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def read(self, indices):
        return Batch.from_columns({"x": indices * indices})


def _wait_for_threads(baseline: int) -> int:
    deadline = time.monotonic() + 10
    while _loader_threads() > baseline and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return _loader_threads()


@pytest.mark.parametrize("with_block", [True, False])
def test_keyboard_interrupt_in_the_loop_joins_threads(with_block):
    """Ctrl-C raised in the training step: no thread is left behind, and the
    state points after the last batch the loop received."""
    gc.collect()
    baseline = _loader_threads()
    loader = Loader(_Squares(1000), 10, prefetch=4, num_threads=2, output="numpy")

    def train() -> None:
        for step, _batch in enumerate(loader):
            if step == 3:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        if with_block:
            with loader:
                train()
        else:
            train()
    if with_block:  # close() joined the threads: nothing to wait for
        assert _loader_threads() == baseline
    assert _wait_for_threads(baseline) == baseline
    assert loader.state_dict()["consumed"] == 4 * 10


def test_keyboard_interrupt_while_waiting_for_a_read():
    """Ctrl-C while the caller waits on a read (KeyboardInterrupt out of the
    read itself): it surfaces in the caller, and the threads are joined."""
    gc.collect()
    baseline = _loader_threads()

    class Interrupted(_Squares):
        def read(self, indices):
            if 55 in indices.tolist():
                raise KeyboardInterrupt
            return super().read(indices)

    loader = Loader(Interrupted(100), 10, shuffle=False, prefetch=3, num_threads=2)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for batch in loader:
            got.append(batch["x"])
    # At its batch when a reader thread read it; at once (like a real Ctrl-C)
    # when the caller's thread read it ahead while waiting.
    assert 2 <= len(got) <= 5
    assert [x.tolist() for x in got] == [[i * i for i in range(10 * k, 10 * k + 10)]
                                         for k in range(len(got))]
    assert _loader_threads() == baseline  # __next__ closed the iterator
    assert loader.state_dict()["consumed"] == 10 * len(got)


_SIGINT_CHILD = """
import signal, sys, threading, numpy as np
# Ctrl-C as in a terminal, whatever this process inherited: a shell starts a
# background job (`make test &`) with SIGINT ignored, and exec keeps that (and a
# blocked mask): this child then trained on, deaf to the test's SIGINT.
print("inherited", signal.getsignal(signal.SIGINT), sorted(signal.pthread_sigmask(
    signal.SIG_BLOCK, [])), file=sys.stderr, flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
from zerobatch import Batch, Loader
class Squares:
    def __len__(self): return 10**9
    def read(self, indices): return Batch.from_columns({"x": indices * indices})
loader = Loader(Squares(), 64, prefetch=4, num_threads=2, epochs=None, output="numpy")
weights = np.ones((64, 64))
def train():
    for step, batch in enumerate(loader):
        weights @ weights
        if step == 20:
            print("training", flush=True)
interrupted = False
try:
    train()
except KeyboardInterrupt:
    interrupted = True
# Handled: the traceback, which held the loop's iterator when Ctrl-C came in the
# training code rather than in next(), is gone, and with it the reader threads.
import gc, time
deadline = time.monotonic() + 5
while threading.active_count() > 1 and time.monotonic() < deadline:
    gc.collect(); time.sleep(0.01)
print("interrupted", interrupted, loader.state_dict()["consumed"] > 0, threading.active_count())
"""


def test_ctrl_c_exits_cleanly():
    """A real SIGINT to a process training through a Loader: it leaves the loop
    with KeyboardInterrupt, no loader thread remains, and the process exits."""
    child = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", _SIGINT_CHILD],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "training\n"
    child.send_signal(signal.SIGINT)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        out, err = child.communicate(timeout=30)
        pytest.fail(f"the interrupted process hung; printed {out!r}; its threads:\n{err}")
    finally:
        child.kill()  # a hung child must not outlive the test
    assert child.returncode == 0, err
    assert out == "interrupted True True 1\n"


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 300), batch=st.integers(1, 12), world=st.integers(1, 8),
       drop_last=st.booleans(), threads=st.integers(0, 2), epochs=st.integers(1, 2))
def test_every_rank_ends_at_the_same_step(length, batch, world, drop_last, threads, epochs):
    """Each rank iterates the same number of steps (so DDP never waits on a rank
    that has run out); with padding the only repeats are marked rows."""
    loaders = [Loader(_Squares(length), batch, rank=r, world_size=world, drop_last=drop_last,
                      num_threads=threads, epochs=epochs, output="numpy", shuffle=False)
               for r in range(world)]
    steps = loaders[0].plan.steps()
    if steps == 0:  # too short for one step: every rank refuses alike
        for loader in loaders:
            with pytest.raises(ValueError, match="fewer than one step"):
                iter(loader)
        return
    per_rank = [list(loader) for loader in loaders]
    assert {len(batches) for batches in per_rank} == {steps * epochs}
    assert all(len(loader) == steps for loader in loaders)
    assert {loader.epoch for loader in loaders} == {epochs}
    first_epoch = [b for batches in per_rank for b in batches[:steps]]
    roots = np.sqrt(np.concatenate([b["x"] for b in first_epoch])).astype(np.int64)
    if drop_last:
        assert sorted(roots.tolist()) == list(range(steps * batch * world))
    else:
        padding = np.concatenate([b["padding"] for b in first_epoch])
        assert sorted(roots[~padding].tolist()) == list(range(length))
        assert padding.sum() == steps * batch * world - length


def test_rank_from_environment(windows, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = Loader(windows, 4)
    assert (loader.rank, loader.world_size) == (1, 3)
    assert (Loader(windows, 4, rank=0, world_size=1).rank) == 0
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        Loader(windows, 4)


def test_bad_input(windows):
    with pytest.raises(ValueError, match="batch_size"):
        Loader(windows, 0)
    with pytest.raises(ValueError, match="rank"):
        Loader(windows, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="read"):
        Loader([1, 2, 3], 1)
    with pytest.raises(ValueError, match="output"):
        Loader(windows, 1, output="pandas")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fewer than one step"):
        iter(Loader(windows, len(windows) + 1))
    state = Loader(windows, 2, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        Loader(windows, 2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        Loader(windows, 2, seed=1).load_state_dict({**state, "version": 99})
    ds = windows._ds
    with pytest.raises(ValueError, match="fingerprint"):
        Loader(ds.windows(8), 2, seed=1).load_state_dict(state)


def test_kill_and_resume_equals_one_epoch(corpus, tmp_path):
    """Twenty SIGKILLs at random steps (reader threads mid-flight), each run
    resumed from its last checkpoint: the log equals one uninterrupted epoch."""
    windows = open_dataset(corpus).windows(16)
    expected = [list(b.meta.global_indexes) for b in Loader(windows, 4, seed=11, output="batch")]
    log, checkpoint = tmp_path / "log", tmp_path / "checkpoint.json"
    kill_and_resume(loader_loop, (corpus, log, checkpoint), checkpoint, tmp_path / "done",
                    seed=0, ahead=8)
    got = [[int(x) for x in line.split()] for line in log.read_text().splitlines()]
    assert got == expected


class _Uneven(_Squares):
    """Reads whose cost varies with the indices, so threads finish out of order."""

    def read(self, indices):
        np.linalg.eigvalsh(np.eye(1 + int(indices[0]) % 7 * 12))
        return super().read(indices)


@pytest.mark.parametrize(("prefetch", "threads"), [(1, 3), (2, 3), (3, 2)])
def test_threads_finishing_out_of_order_keep_the_sequence(prefetch, threads):
    expected = [b["x"].tolist() for b in Loader(_Uneven(300), 5, seed=2, num_threads=0,
                                                 output="numpy", epochs=2)]
    with Loader(_Uneven(300), 5, seed=2, prefetch=prefetch, num_threads=threads,
                output="numpy", epochs=2) as loader:
        assert [b["x"].tolist() for b in loader] == expected


class _Gated(_Squares):
    """Reader threads wait until the caller's thread has read a step itself;
    every read is logged as (thread name, first index)."""

    def __init__(self, length: int, *, fail_in_caller: int | None = None) -> None:
        super().__init__(length)
        self.opened = threading.Event()
        self.log: list[tuple[str, int]] = []
        self.fail_in_caller = fail_in_caller

    def read(self, indices):
        caller = threading.current_thread() is threading.main_thread()
        if caller:
            self.opened.set()
            if self.fail_in_caller in indices.tolist():
                raise ValueError("corrupt shard")
        else:
            assert self.opened.wait(10)
        self.log.append((threading.current_thread().name, int(indices[0])))
        return super().read(indices)


@pytest.mark.parametrize(("prefetch", "threads"), [(2, 1), (4, 1), (3, 2)])
def test_the_caller_reads_ahead_instead_of_waiting(prefetch, threads):
    """While the next batch is not ready and a slot is free, the caller's
    thread reads a later step itself: the sequence is unchanged."""
    source = _Gated(200)
    expected = [b["x"].tolist() for b in Loader(_Squares(200), 10, seed=4, num_threads=0,
                                                 output="numpy")]
    with Loader(source, 10, seed=4, prefetch=prefetch, num_threads=threads,
                output="numpy") as loader:
        assert [b["x"].tolist() for b in loader] == expected
    readers = {name for name, _ in source.log}
    assert "MainThread" in readers  # the readers could not start before it read
    assert len(source.log) == len(expected)  # each step read once


def test_an_error_the_caller_read_ahead_waits_for_its_batch():
    """The caller's thread reads step 1 (shuffle off: rows 10-19) while step 0
    is blocked in the reader thread; its error surfaces at step 1, not before."""
    source = _Gated(100, fail_in_caller=10)
    loader = Loader(source, 10, shuffle=False, prefetch=2, num_threads=1, output="numpy")
    it = iter(loader)
    assert next(it)["x"].tolist() == [i * i for i in range(10)]
    with pytest.raises(ValueError, match="corrupt shard"):
        next(it)
    assert loader.state_dict()["consumed"] == 10
    assert _wait_for_threads(0) == 0


@settings(max_examples=20, deadline=None)
@given(prefetch=st.integers(1, 5), threads=st.integers(1, 3), seed=st.integers(0, 99))
def test_batches_alive_stay_within_prefetch(prefetch, threads, seed):
    """At most ``prefetch`` batches are read ahead besides the one the caller
    holds, and one more that the caller's thread reads while its next batch
    is not ready."""
    alive = [0]
    most = [0]
    lock = threading.Lock()

    def gone() -> None:
        with lock:
            alive[0] -= 1

    class Counted(_Uneven):
        def read(self, indices):
            batch = super().read(indices)
            with lock:
                alive[0] += 1
                most[0] = max(most[0], alive[0])
            weakref.finalize(batch["x"], gone)
            return batch

    with Loader(Counted(400), 5, seed=seed, prefetch=prefetch, num_threads=threads,
                output="batch") as loader:
        for batch in loader:
            del batch
    assert most[0] <= prefetch + 2
