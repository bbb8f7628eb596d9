"""A process forked while other threads hold zerobatch's locks can read.

A torch DataLoader worker is forked (Linux's default) from a process whose
Loader reader threads may be inside a read of the same source: a lock held
there is held for ever in the child, where that thread does not exist. Each
test holds the locks in a thread, forks, and has the child read within a
timeout; a child that waits fails the test instead of hanging it."""

from __future__ import annotations

import multiprocessing
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zerobatch import Batch, Loader, Mixture, StreamWriter, open_dataset
from zerobatch.storage import LocalStorage
from zerobatch.storage.blocks import BlockCache

_LOCKS = (type(threading.Lock()), type(threading.RLock()))
_TIMEOUT = 60  # seconds a child may take (it reads a few hundred tokens)


def _in_fork(child: Callable[[], None], tmp_path: Path) -> None:
    """Run ``child`` in a forked process; fail with its traceback, or when it
    has not finished after ``_TIMEOUT`` seconds (it is waiting on a lock)."""
    report = tmp_path / "child-error"

    def run() -> None:
        try:
            child()
        except BaseException:
            report.write_text(traceback.format_exc())
            raise

    process = multiprocessing.get_context("fork").Process(target=run)
    process.start()
    process.join(_TIMEOUT)
    if process.exitcode is None:
        process.kill()
        process.join()
        pytest.fail(f"the forked child still waits after {_TIMEOUT} s (a lock held across "
                    "the fork?)")
    assert process.exitcode == 0, report.read_text() if report.exists() else process.exitcode


def _locks(root: Any) -> list[tuple[str, Any]]:
    """Every Lock and RLock reachable from ``root`` through zerobatch objects
    and the containers they hold, with its path (``Owner.attribute`` last)."""
    found, seen, todo = [], set(), [("root", root)]
    while todo:
        path, obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _LOCKS):
            found.append((path, obj))
        elif isinstance(obj, dict):
            todo += [(f"{path}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            todo += [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif any(c.__module__.startswith("zerobatch.") for c in type(obj).__mro__):
            attrs = dict(getattr(obj, "__dict__", {}))
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if hasattr(obj, name):
                        attrs[name] = getattr(obj, name)
            todo += [(f"{path}:{type(obj).__name__}.{k}", v) for k, v in attrs.items()]
    return found


class _Held:
    """A thread holding ``locks`` until the block ends (and after a fork)."""

    def __init__(self, locks: list[Any]) -> None:
        self._locks, self._taken, self._leave = locks, threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        for lock in self._locks:
            lock.acquire()
        self._taken.set()
        self._leave.wait()
        for lock in reversed(self._locks):
            lock.release()

    def __enter__(self) -> _Held:
        self._thread.start()
        assert self._taken.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._leave.set()
        self._thread.join(10)


class _BlockStorage(LocalStorage):
    """Local files read through a ``BlockCache`` (the index path of object storage)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.blocks = BlockCache(self, block_size=64)

    def url_of(self, name: str) -> str:
        return str(self.root / name)

    def version(self, name: str) -> str:
        return self.url_of(name)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fork") / "data"
    with StreamWriter(path, fields={"loss_mask": "u1"}, metadata="json") as writer:
        for n in range(2, 60):
            writer.add_document(np.arange(n) + 1, fields={"loss_mask": np.ones(n)},
                                spans=[(n // 2, n, "assistant")], metadata={"n": n})
    np.save(path.parent / "0.npy", np.arange(1000, dtype=np.uint16))
    with StreamWriter(path.parent / "plain") as writer:  # windows a mixture reads in one call
        for n in range(2, 60):
            writer.add_document(np.arange(n) + 1)
    return path


def _sources(folder: Path) -> dict[str, Any]:
    local, blocks = open_dataset(folder), open_dataset(folder, storage=_BlockStorage(folder))
    plain = folder.parent / "plain"
    return {"windows": local.windows(16, document_masking=True),
            "documents": local.documents(),
            "packed": local.documents().packed(48, window=24, loss_spans="assistant"),
            "blocks": blocks.documents(),
            "npy": open_dataset(folder.parent).windows(16),
            "mixture": Mixture({"a": open_dataset(plain).windows(8),
                                "b": open_dataset(plain).windows(8)}, {"a": 1, "b": 2},
                               seed=1, length=40)}


def _tokens(batch: Any) -> list[Any]:
    return [np.asarray(row).tolist() for row in batch["input_ids"]]


def _read_all(sources: dict[str, Any]) -> dict[str, Any]:
    out = {name: source.read(np.arange(3)) for name, source in sources.items()}
    out["metadata"] = out["documents"]["metadata"]
    return out


def test_every_lock_a_source_holds_is_free_in_a_forked_child(folder: Path,
                                                             tmp_path: Path) -> None:
    """Every lock reachable from the sources (files, index tables, buffers,
    block cache, packed windows, a batch's undecoded span table) held in a
    thread at the fork: the child reads every source, and takes every lock."""
    sources = _sources(folder)
    expected = _read_all(_sources(folder))
    for source in sources.values():
        source.read(np.arange(1))  # the index tables and files built or opened
    batch = sources["documents"].read(np.arange(3))  # its span table not decoded yet
    locks = _locks((sources, batch))
    owners = {path.rsplit(":", 1)[-1] for path, _ in locks}
    assert owners >= {"Arena._lock", "SpanTable._lock", "LocalStorage._lock",
                      "_BlockStorage._lock", "BlockCache._lock", "PackedRows._lock",
                      "ManyWindows._lock"}, owners
    # a dataset's index tables and buffers take the dataset's own lock: one object
    local = sources["windows"]._ds
    assert local._lock is local._index._lock is local._arena._lock
    assert any(lock is local._lock for _, lock in locks)

    def child() -> None:
        assert batch["metadata"] == expected["metadata"]
        got = _read_all(sources)
        for name in sources:
            assert _tokens(got[name]) == _tokens(expected[name]), name
        stuck = [path for path, lock in locks if not lock.acquire(timeout=5)]
        assert not stuck, f"locks still held in the child: {stuck}"

    with _Held([lock for _, lock in locks]):
        _in_fork(child, tmp_path)


class _Stalled:
    """Squares; once ``stall`` is set, a read in a reader thread waits until
    ``go`` is: a thread is inside a read, its step claimed, at the fork."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.stall, self.go, self.inside = threading.Event(), threading.Event(), threading.Event()

    def __len__(self) -> int:
        return self.length

    def read(self, indices: Any) -> Batch:
        if self.stall.is_set() and threading.current_thread() is not threading.main_thread():
            self.inside.set()
            assert self.go.wait(30)
        return Batch.from_columns({"x": np.asarray(indices, dtype=np.int64) ** 2})


def test_a_pass_continues_in_a_forked_child(tmp_path: Path) -> None:
    """A Loader pass iterated in the parent with reader threads, forked while a
    thread is inside a read: the child reads the rest of the pass itself (its
    threads stayed in the parent), the same batches as the parent's."""
    expected = [b["x"].tolist() for b in Loader(_Stalled(90), 4, seed=3, num_threads=0,
                                                  output="numpy", epochs=2)]
    source = _Stalled(90)
    loader = Loader(source, 4, seed=3, num_threads=2, prefetch=3, output="numpy", epochs=2)
    start = loader.state_dict()
    it: Iterator[Any] = iter(loader)
    head = [next(it)["x"].tolist() for _ in range(5)]
    source.stall.set()
    head.append(next(it)["x"].tolist())  # frees a slot: a thread claims a step and waits
    assert source.inside.wait(10)

    def child() -> None:
        rest = [b["x"].tolist() for b in it]
        assert head + rest == expected
        assert (loader.epoch, loader.state_dict()["consumed"]) == (2, 0)
        source.stall.clear()
        loader.load_state_dict(start)
        assert [b["x"].tolist() for b in loader] == expected  # a new pass, new threads

    try:
        _in_fork(child, tmp_path)
    finally:
        source.go.set()
    assert head + [b["x"].tolist() for b in it] == expected
    loader.close()


def test_a_fork_waits_for_a_numba_compile(tmp_path: Path) -> None:
    """A thread compiling (or loading) a Numba kernel holds Numba's compiler
    lock: the fork waits until it is done, so the child can compile too."""
    import time

    from numba import njit
    from numba.core.compiler_lock import global_compiler_lock

    import zerobatch  # noqa: F401  (registers the fork hooks)

    @njit(cache=False)
    def twice(x: Any) -> Any:
        return 2 * x

    def compile_slowly() -> None:
        with global_compiler_lock:
            taken.set()
            time.sleep(1.5)  # the fork starts well within this

    taken = threading.Event()
    thread = threading.Thread(target=compile_slowly)
    thread.start()
    assert taken.wait(10)

    def child() -> None:
        assert twice(21) == 42  # compiles here

    _in_fork(child, tmp_path)
    thread.join(10)


def test_a_fork_waits_for_an_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread importing a module holds its import lock (Numba's first
    ``typeof`` imports ``numpy.ma`` in a reader thread): the fork waits until
    the import is done, so the child can import it too."""
    import importlib
    import sys
    import time

    import zerobatch  # noqa: F401  (registers the fork hooks)

    started = tmp_path / "started"
    (tmp_path / "zb_slow_import.py").write_text(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(1.5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "zb_slow_import", raising=False)
    thread = threading.Thread(target=importlib.import_module, args=("zb_slow_import",))
    thread.start()
    deadline = time.monotonic() + 10
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.001)

    def child() -> None:
        importlib.import_module("zb_slow_import")

    _in_fork(child, tmp_path)
    thread.join(10)
    sys.modules.pop("zb_slow_import", None)


def test_dataloader_workers_forked_beside_held_locks(folder: Path, tmp_path: Path) -> None:
    """zerobatch.torch.DataLoader's forked workers read the source whose locks a
    thread of the main process holds (as a Loader's reader thread would)."""
    from zerobatch.torch import DataLoader

    windows = open_dataset(folder).windows(16)
    expected = [b["input_ids"].tolist() for b in Loader(windows, 4, seed=5, output="numpy")]
    windows.read(np.arange(2))
    loader = Loader(windows, 4, seed=5, output="numpy")
    data = DataLoader(loader, num_workers=2, multiprocessing_context="fork", timeout=_TIMEOUT)
    with _Held([lock for _, lock in _locks(windows)]):
        got = [b["input_ids"].tolist() for b in data]
    assert got == expected
