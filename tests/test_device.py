"""``TorchOutput`` with a device: every step arrives complete and equal to the
CPU output, jagged columns included, also while the GPU is busy with the
step before (the copies run on each reader's own stream), across a resume,
for packed rows, and for a consumer on a stream of its own.

The CUDA tests need a CUDA device and skip without one (CI has none); the
``device="cpu"`` tests below them run everywhere. ``benchmarks/device.py``
runs these on a GPU machine and measures the same paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from zerobatch import Loader, StreamWriter, open_dataset  # noqa: E402
from zerobatch.torch import TorchOutput  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = tmp_path_factory.mktemp("device") / "corpus"
    rng = np.random.default_rng(7)
    with StreamWriter(folder) as writer:
        for _ in range(400):
            writer.add_document(rng.integers(0, 50_000, size=int(rng.integers(3, 300))))
    return open_dataset(folder)


def _host(step: dict) -> dict:
    """A step's values on the CPU, jagged columns as (values, offsets)."""
    def host(value):
        if isinstance(value, torch.Tensor) and value.is_nested:
            return (value.values().cpu(), value.offsets().cpu())
        if isinstance(value, torch.Tensor):
            return value.cpu()
        if isinstance(value, tuple):
            return tuple(host(part) for part in value)
        return value

    return {name: host(value) for name, value in step.items()}


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        left, right = a[name], b[name]
        if isinstance(left, tuple):
            for x, y in zip(left, right, strict=True):
                assert torch.equal(x, y), name
        elif isinstance(left, torch.Tensor):
            assert left.dtype == right.dtype and torch.equal(left, right), name
        else:
            assert left == right, name


def _steps(loader: Loader, count: int) -> list[dict]:
    out = []
    for step in loader:
        out.append(step)
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("columns", [None, "all"])
def test_cpu_device_output_equals_torch_output(dataset, columns):
    windows = dataset.windows(64, columns=columns)
    expected = _steps(Loader(windows, 8, seed=2), 12)
    got = _steps(Loader(windows, 8, seed=2, output=TorchOutput(device="cpu")), 12)
    for a, b in zip(expected, got, strict=True):
        _equal(_host(a), _host(b))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error(dataset):
    with pytest.raises(ValueError, match=r"sees no CUDA device; drop device="):
        Loader(dataset.windows(64), 8, output=TorchOutput(device="cuda"))


def test_cpu_device_output_of_packed_rows(dataset):
    rows = dataset.documents().packed(256)
    expected = _steps(Loader(rows, 4, seed=3), 6)
    got = _steps(Loader(rows, 4, seed=3, output=TorchOutput(device="cpu")), 6)
    for a, b in zip(expected, got, strict=True):
        _equal(_host(a), _host(b))


@cuda
@pytest.mark.parametrize("pin_memory", [True, False])
@pytest.mark.parametrize("columns", [None, "all"])
def test_cuda_output_equals_cpu_output(dataset, pin_memory, columns):
    windows = dataset.windows(64, columns=columns)
    expected = [_host(s) for s in _steps(Loader(windows, 8, seed=2), 30)]
    output = TorchOutput(pin_memory=pin_memory, device="cuda")
    got = _steps(Loader(windows, 8, seed=2, output=output, num_threads=2), 30)
    for step in got:
        for value in step.values():
            if isinstance(value, torch.Tensor):
                assert value.device.type == "cuda"
    for a, b in zip(expected, [_host(s) for s in got], strict=True):
        _equal(a, b)


@cuda
def test_steps_stay_intact_while_the_gpu_is_busy(dataset):
    """Each step is summed on the GPU behind a long queue of kernels and only
    then dropped: a copy that reused a step's memory before the GPU read it
    (a missing ``record_stream``) would change the sums."""
    windows = dataset.windows(128)
    expected = [int(s["input_ids"].sum()) for s in _steps(Loader(windows, 16, seed=5), 60)]
    work = torch.randn(2048, 2048, device="cuda")
    sums = []
    loader = Loader(windows, 16, seed=5, output=TorchOutput(device="cuda"), prefetch=4)
    for step in _steps_lazy(loader, 60):
        for _ in range(8):  # the GPU is busy for milliseconds before it reads the step
            work = torch.tanh(work @ work)
        sums.append(step["input_ids"].sum())
        del step
    assert [int(s) for s in sums] == expected


def _steps_lazy(loader: Loader, count: int):
    for i, step in enumerate(loader):
        yield step
        if i + 1 == count:
            return


@cuda
def test_consumer_on_its_own_stream(dataset):
    windows = dataset.windows(64)
    expected = [_host(s) for s in _steps(Loader(windows, 8, seed=9), 20)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        got = [_host(s) for s in _steps(Loader(windows, 8, seed=9,
                                               output=TorchOutput(device="cuda")), 20)]
    for a, b in zip(expected, got, strict=True):
        _equal(a, b)


@cuda
def test_resume_on_the_device(dataset):
    windows = dataset.windows(64)
    output = TorchOutput(pin_memory=True, device="cuda")
    loader = Loader(windows, 8, seed=4, output=output)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    rest = [_host(next(it)) for _ in range(10)]
    resumed = Loader(windows, 8, seed=4, output=output)
    resumed.load_state_dict(state)
    for a, b in zip(rest, [_host(s) for s in _steps(resumed, 10)], strict=True):
        _equal(a, b)


@cuda
def test_packed_rows_on_the_device(dataset):
    rows = dataset.documents().packed(256)
    expected = [_host(s) for s in _steps(Loader(rows, 4, seed=3), 15)]
    got = _steps(Loader(rows, 4, seed=3, output=TorchOutput(pin_memory=True, device="cuda")), 15)
    assert got[0]["input_ids"].device.type == "cuda"
    for a, b in zip(expected, [_host(s) for s in got], strict=True):
        _equal(a, b)


@cuda
def test_pinned_output_is_read_straight_into_pinned_memory(dataset):
    """``pin_memory=True``: a source that names its arenas reads into pinned
    buffers (no host copy); the steps equal the unpinned ones."""
    windows = open_dataset(dataset.path).windows(64)  # an arena of its own
    expected = [_host(s) for s in _steps(Loader(windows, 8, seed=6), 10)]
    got = _steps(Loader(windows, 8, seed=6, output=TorchOutput(pin_memory=True)), 10)
    assert all(step["input_ids"].is_pinned() for step in got)
    for a, b in zip(expected, [_host(s) for s in got], strict=True):
        _equal(a, b)


def test_arena_allocate_with():
    from zerobatch.stream._arena import Arena

    made = []

    def allocate(nbytes: int) -> np.ndarray:
        made.append(nbytes)
        return np.zeros(nbytes, np.uint8)

    arena = Arena()
    before = arena.take(100)
    arena.allocate_with(allocate)
    buffer = arena.take(100)
    assert made == [buffer.shape[0]] and buffer is not before
    del buffer
    assert len(made) == 1 and arena.take(100).shape[0] == made[0]  # recycled, not made again
    arena.allocate_with(allocate)  # the same allocator again: its buffers stay
    assert arena.take(100).shape[0] == made[0] and len(made) == 1


@cuda
def test_a_forked_child_may_free_pinned_arenas(dataset):
    """A device output's pinned arena, left as garbage in a cycle, is freed by
    whichever process collects it: a forked child (a DataLoader worker) must
    survive that (torch's pinned allocator would call CUDA there and abort)."""
    import gc
    import multiprocessing

    windows = open_dataset(dataset.path).windows(64)
    loader = Loader(windows, 8, seed=1, output=TorchOutput(device="cuda"))
    _steps(loader, 3)
    loader.close()
    assert all(torch.from_numpy(b).is_pinned() for b in windows.arenas()[0]._buffers)
    cycle: list = [windows]
    cycle.append(cycle)  # garbage that only a collection frees
    del windows, loader, cycle
    child = multiprocessing.get_context("fork").Process(target=gc.collect)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    gc.collect()  # and in this process, which unregisters the pages
