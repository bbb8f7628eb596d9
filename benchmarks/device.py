"""Does the GPU wait for data? The Loader's device paths on a CUDA machine.

Windows of 2,048 tokens, batch 32, shuffled, int64 ``input_ids`` and
``labels`` (1 MiB a step), a uint16 dataset of one shard, warm page cache.
Every loader below is measured in the same run, passes interleaved, best
of each:

1. The limit: pinned host-to-device copies of one step's bytes (the PCIe
   link), and a pageable copy of the same bytes.
2. Loaders to the GPU, each step consumed by one small kernel: steps/s and
   the CPU seconds the process spends per step (all threads).
3. A training step: each step feeds a stand-in model on the GPU (an
   embedding lookup and ``--layers`` bf16 matmuls of width 1,024, about
   2 ms on an H100), launched asynchronously as a training loop does; the
   GPU is busy for the share ``step time with the data already on the GPU /
   step time with this loader``. 1.00 means the GPU never waits.

Loaders: the batches already on the GPU (the limit); ``np.memmap`` three
lines + ``pin_memory().to(cuda, non_blocking=True)``; torch ``DataLoader``
over a map-style memmap dataset with ``pin_memory=True`` and 0 workers (its
default) and 4 workers; zerobatch as the README writes it plus the user's
``.to("cuda", non_blocking=True)``; ``TorchOutput(device="cuda")`` with and
without ``pin_memory``; and the same two as zerobatch 0.x did them (copies on
the consumer's stream, from the reader thread: a stand-in output object
here). ``--jax`` adds ``JaxOutput`` on the GPU against ``jax.device_put``
of the three lines (in a child process, so that JAX and torch do not share
the GPU's memory pool).

Also checks, on each run, that every zerobatch loader's steps equal the CPU
output (the first 50 steps).

    python benchmarks/device.py [--tokens 32_000_000] [--steps 200] [--passes 3]
        [--layers 8] [--jax]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _plot import bars

from zerobatch import Loader, StreamWriter, open_dataset
from zerobatch.tools.bench import numpy_windows

SEQ_LEN, BATCH = 2048, 32


def _write(path: Path, tokens: int) -> None:
    """Random documents of 200..3,000 uint16 tokens, one shard."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(200, 3000, size=tokens // 1600 + 1)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), tokens) + 1]
    data = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    with StreamWriter(path, shard_tokens=2 * tokens) as writer:
        for document in np.split(data, np.cumsum(lengths)[:-1]):
            writer.add_document(document)


def _tokens_file(path: Path) -> Path:
    return path / "00000.tokens"  # the one shard's raw tokens


class _Legacy:
    """zerobatch 0.x's ``TorchOutput``: pin and copy in the reader thread, on
    that thread's current stream (the default one)."""

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory

    def ranks(self) -> None:
        return None

    def bind(self, plan: Any, source: Any) -> Callable[[Any], Any]:
        pin = self.pin_memory
        return lambda batch: batch.to_torch(pin_memory=pin, device="cuda")


class _Staged:
    """A stand-in output for section 4: each step staged in pinned memory by
    ``stage`` (``"pin_memory"``: ``Tensor.pin_memory()``; ``"copyto"``:
    ``np.copyto`` into a pinned tensor, one thread; ``"arena"``: the reads
    themselves land in pinned memory, nothing copied on the host), copied on
    the reader thread's own stream, then ``wait``: ``"sync"`` (the reader
    waits for its copy) or ``"stream"`` (the consumer's stream waits for it,
    nobody on the host does)."""

    def __init__(self, stage: str, wait: str) -> None:
        self.stage, self.wait = stage, wait

    def ranks(self) -> None:
        return None

    def bind(self, plan: Any, source: Any) -> Callable[[Any], Any]:
        import threading

        import torch

        if self.stage == "arena":
            for arena in source.arenas():
                arena.allocate_with(lambda n: torch.empty(
                    n, dtype=torch.uint8, pin_memory=True).numpy())
        consumer = torch.cuda.current_stream()
        local = threading.local()
        stage, wait = self.stage, self.wait

        def pinned(tensor: Any) -> Any:
            if stage == "pin_memory":
                return tensor.pin_memory()
            if stage == "copyto":
                out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                np.copyto(out.numpy(), tensor.numpy())
                return out
            return tensor

        def step(batch: Any) -> dict[str, Any]:
            stream = getattr(local, "stream", None)
            if stream is None:
                stream = local.stream = torch.cuda.Stream()
            out = {}
            with torch.cuda.stream(stream):
                for name, value in batch.to_torch().items():
                    if isinstance(value, torch.Tensor):
                        value = pinned(value).to("cuda", non_blocking=True)
                        value.record_stream(consumer)
                    out[name] = value
            if wait == "sync":
                stream.synchronize()
            else:
                consumer.wait_stream(stream)
            return out

        return step


def _loaders(path: Path) -> dict[str, Callable[[], Iterator[dict[str, Any]]]]:
    import torch
    from torch.utils.data import DataLoader, Dataset

    from zerobatch.torch import TorchOutput

    tokens = np.memmap(_tokens_file(path), dtype=np.uint16, mode="r")

    def to_cuda(step: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to("cuda", non_blocking=True) for k, v in step.items()
                if k in ("input_ids", "labels")}

    def on_gpu() -> Iterator[dict[str, Any]]:
        made = numpy_windows([_tokens_file(path)], np.dtype(np.uint16), None, SEQ_LEN, BATCH)
        steps = [{"input_ids": torch.from_numpy(x).cuda(), "labels": torch.from_numpy(y).cuda()}
                 for x, y in itertools.islice(made, 8)]
        return itertools.cycle(steps)

    def three_lines() -> Iterator[dict[str, Any]]:
        made = numpy_windows([_tokens_file(path)], np.dtype(np.uint16), None, SEQ_LEN, BATCH)
        for x, y in made:
            yield {"input_ids": torch.from_numpy(x).pin_memory().to("cuda", non_blocking=True),
                   "labels": torch.from_numpy(y).pin_memory().to("cuda", non_blocking=True)}

    class Windows(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return (len(tokens) - 1) // SEQ_LEN

        def __getitem__(self, i: int) -> dict[str, Any]:
            window = tokens[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1].astype(np.int64)
            return {"input_ids": torch.from_numpy(window[:-1]),
                    "labels": torch.from_numpy(window[1:])}

    def torch_loader(workers: int) -> Callable[[], Iterator[dict[str, Any]]]:
        def make() -> Iterator[dict[str, Any]]:
            loader = DataLoader(Windows(), batch_size=BATCH, shuffle=True, drop_last=True,
                                num_workers=workers, pin_memory=True,
                                persistent_workers=workers > 0)
            while True:
                for step in loader:
                    yield to_cuda(step)
        return make

    def zerobatch(output: Any = "torch", user_copy: bool = False
                  ) -> Callable[[], Iterator[dict[str, Any]]]:
        # Each loader its own dataset object: a device output pins the arena its
        # reads land in, which would speed up every other loader of the same object.
        own = open_dataset(path).windows(SEQ_LEN)

        def make() -> Iterator[dict[str, Any]]:
            loader = Loader(own, BATCH, seed=0, epochs=None, output=output)
            try:
                for step in loader:
                    yield to_cuda(step) if user_copy else step
            finally:
                loader.close()
        return make

    return {
        "batches already on the GPU (limit)": on_gpu,
        "np.memmap 3 lines + pin + .to(cuda)": three_lines,
        "torch DataLoader, 0 workers, pin_memory": torch_loader(0),
        "torch DataLoader, 4 workers, pin_memory": torch_loader(4),
        "zerobatch README path + .to(cuda)": zerobatch(user_copy=True),
        "zerobatch TorchOutput(cuda, pin_memory)": zerobatch(TorchOutput(pin_memory=True,
                                                                          device="cuda")),
        "zerobatch TorchOutput(cuda)": zerobatch(TorchOutput(device="cuda")),
        "zerobatch 0.x TorchOutput(cuda, pin_memory)": zerobatch(_Legacy(True)),
        "zerobatch 0.x TorchOutput(cuda)": zerobatch(_Legacy(False)),
    }


def _strategies(path: Path) -> dict[str, Callable[[], Iterator[dict[str, Any]]]]:
    """Section 4: ways of staging and waiting for the copy (``_Staged``)."""
    def make(stage: str, wait: str) -> Callable[[], Iterator[dict[str, Any]]]:
        windows = open_dataset(path).windows(SEQ_LEN)  # its own arena

        def steps() -> Iterator[dict[str, Any]]:
            loader = Loader(windows, BATCH, seed=0, epochs=None, output=_Staged(stage, wait))
            try:
                yield from loader
            finally:
                loader.close()
        return steps

    return {f"stage {stage}, wait {wait}": make(stage, wait)
            for stage in ("pin_memory", "copyto", "arena") for wait in ("sync", "stream")}


def _check(path: Path, steps: int) -> None:
    """Every zerobatch GPU output equals the CPU output, step for step."""
    import torch

    from zerobatch.torch import TorchOutput

    windows = open_dataset(path).windows(SEQ_LEN)
    cpu = Loader(windows, BATCH, seed=0, epochs=None)
    expected = [s["input_ids"].clone() for s in itertools.islice(cpu, steps)]
    for output in (TorchOutput(pin_memory=True, device="cuda"), TorchOutput(device="cuda")):
        loader = Loader(windows, BATCH, seed=0, epochs=None, output=output)
        for i, step in enumerate(itertools.islice(loader, steps)):
            assert step["input_ids"].is_cuda, output
            if not torch.equal(step["input_ids"].cpu(), expected[i]):
                raise SystemExit(f"{output}: step {i} differs from the CPU output")
        loader.close()
    print(f"checked: TorchOutput on cuda equals the CPU output for {steps} steps (with and "
          f"without pin_memory)")


def _model(layers: int) -> Callable[[dict[str, Any]], Any]:
    import torch

    generator = torch.Generator(device="cuda").manual_seed(0)
    table = torch.randn(50_000, 1024, device="cuda", dtype=torch.bfloat16, generator=generator)
    weights = [torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16,
                           generator=generator) / 32 for _ in range(layers)]

    def step(batch: dict[str, Any]) -> Any:
        x = table[batch["input_ids"]]
        for w in weights:
            x = torch.tanh(x @ w)
        return (x.float().mean() + batch["labels"].float().mean()).detach()

    return step


def _consume(batch: dict[str, Any]) -> Any:
    return batch["input_ids"].sum() + batch["labels"].sum()


def _pass(make: Callable[[], Iterator[dict[str, Any]]], steps: int,
          work: Callable[[dict[str, Any]], Any]) -> tuple[float, float]:
    """(wall, CPU) seconds per step of ``steps`` steps, the GPU drained at the end."""
    import torch

    batches = make()
    work(next(batches))  # start-up (threads, workers, kernels) is not throughput
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    total = None
    for _ in range(steps):
        out = work(next(batches))
        total = out if total is None else total + out
    torch.cuda.synchronize()
    result = ((time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps)
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    return result


def _best(loaders: dict[str, Callable[[], Iterator[dict[str, Any]]]], steps: int, passes: int,
          work: Callable[[dict[str, Any]], Any]) -> dict[str, tuple[float, float]]:
    best = {name: (float("inf"), float("inf")) for name in loaders}
    for _ in range(passes):
        for name, make in loaders.items():
            wall, cpu = _pass(make, steps, work)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def _copy_limit() -> None:
    import torch

    nbytes = 2 * BATCH * SEQ_LEN * 8
    for label, pinned in (("pinned", True), ("pageable", False)):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        for _ in range(10):
            device.copy_(host, non_blocking=pinned)
        torch.cuda.synchronize()
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < 0.5:
            device.copy_(host, non_blocking=pinned)
            count += 1
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / count
        print(f"  {label:9s} host-to-device copy of one step ({nbytes / 2**20:.0f} MiB): "
              f"{seconds * 1e6:7.1f} us, {nbytes / seconds / 1e9:5.1f} GB/s")


def _table(results: dict[str, tuple[float, float]], limit: float, limit_name: str,
           figure: str, title: str) -> None:
    """Prints each loader's step time, CPU time and share of ``limit``, and
    draws the shares into ``docs/img/{figure}.png``."""
    print(f"  {'loader':46s} {'ms/step':>8s} {'steps/s':>8s} {'CPU ms/step':>12s} "
          f"{limit_name:>10s}")
    for name, (wall, cpu) in results.items():
        print(f"  {name:46s} {wall * 1e3:8.3f} {1 / wall:8.0f} {cpu * 1e3:12.3f} "
              f"{limit / wall:10.2f}")
    bars(figure, {name: limit / wall for name, (wall, _) in results.items()}, limit=1.0,
         limit_label=limit_name, title=title, xlabel=f"step time as a share: {limit_name}",
         labels={name: f"{limit / wall:.2f} ({wall * 1e3:.3f} ms)"
                 for name, (wall, _) in results.items()})


def _jax(path: Path, steps: int, passes: int) -> None:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from zerobatch.jax import JaxOutput

    devices = jax.devices()
    sharding = NamedSharding(Mesh(np.array(devices[:1]), ("data",)), PartitionSpec("data"))
    windows = open_dataset(path).windows(SEQ_LEN)
    numpy_steps = list(itertools.islice(
        Loader(windows, BATCH, seed=0, epochs=None, output="numpy"), 20))
    loader = Loader(windows, BATCH, seed=0, epochs=None, output=JaxOutput(sharding))
    for i, step in enumerate(itertools.islice(loader, 20)):
        x = step[0] if isinstance(step, tuple) else step["input_ids"]
        assert x.devices() == {devices[0]}, x.devices()
        if not np.array_equal(np.asarray(x), numpy_steps[i]["input_ids"]):
            raise SystemExit(f"JaxOutput: step {i} differs from the numpy output")
    loader.close()
    print(f"checked: JaxOutput on {devices[0].platform} equals the numpy output for 20 steps")

    def three_lines() -> Iterator[Any]:
        for x, y in numpy_windows([_tokens_file(path)], np.dtype(np.uint16), None, SEQ_LEN,
                                  BATCH):
            yield jax.device_put(x, sharding), jax.device_put(y, sharding)

    def ours() -> Iterator[Any]:
        with Loader(windows, BATCH, seed=0, epochs=None, output=JaxOutput(sharding)) as made:
            yield from made

    runs = {"np.memmap 3 lines + jax.device_put": three_lines, "zerobatch JaxOutput": ours}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(passes):
        for name, make in runs.items():
            it = make()
            jax.block_until_ready(next(it))
            started = time.perf_counter()
            last = None
            for _ in range(steps):
                last = next(it)
            jax.block_until_ready(last)
            best[name] = min(best[name], (time.perf_counter() - started) / steps)
            close = getattr(it, "close", None)
            if close is not None:
                close()
    limit = best["np.memmap 3 lines + jax.device_put"]
    print("JAX on the GPU: steps to device arrays, no compute")
    for name, seconds in best.items():
        print(f"  {name:46s} {seconds * 1e3:8.3f} ms/step {1 / seconds:8.0f} steps/s "
              f"{limit / seconds:6.2f} of the 3 lines")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_000_000)
    parser.add_argument("--steps", type=int, default=200, help="steps per timed pass")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8, help="matmuls in the model step")
    parser.add_argument("--jax", action="store_true", help="also JaxOutput on the GPU")
    parser.add_argument("--jax-only", help=argparse.SUPPRESS)  # the child: a dataset path
    args = parser.parse_args()
    if args.jax_only:
        _jax(Path(args.jax_only), args.steps, args.passes)
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/device.py needs a CUDA device")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}, nproc={os.cpu_count()}, load {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="zerobatch-device-bench-") as work:
        path = Path(work) / "corpus"
        _write(path, args.tokens)
        _check(path, 50)
        print("1. The limit")
        _copy_limit()
        loaders = _loaders(path)
        print(f"2. Loaders to the GPU, one small kernel per step ({args.steps} steps, best of "
              f"{args.passes})")
        best = _best(loaders, args.steps, args.passes, _consume)
        _table(best, best["np.memmap 3 lines + pin + .to(cuda)"][0], "of 3 lines",
               "device_loaders", f"Loaders to the GPU, no compute (batch {BATCH} x {SEQ_LEN})")
        model = _model(args.layers)
        for layers in (args.layers, 2):
            print(f"3. A training step of {layers} bf16 matmuls (GPU busy share: step time "
                  f"with the data on the GPU / step time)")
            best = _best(loaders, args.steps, args.passes, _model(layers))
            _table(best, best["batches already on the GPU (limit)"][0], "GPU busy",
                   f"device_step_{layers}", f"GPU busy share, a step of {layers} bf16 matmuls")
        print("4. Copy strategies (stage in pinned memory, then wait): no compute, then "
              f"{args.layers} and 2 matmuls")
        strategies = _strategies(path)
        strategies["batches already on the GPU (limit)"] = loaders[
            "batches already on the GPU (limit)"]
        for label, work, layers in (("no compute", _consume, 0),
                                    (f"{args.layers} matmuls", model, args.layers),
                                    ("2 matmuls", _model(2), 2)):
            best = _best(strategies, args.steps, args.passes, work)
            print(f" {label}")
            _table(best, best["batches already on the GPU (limit)"][0], "of limit",
                   f"device_copies_{layers}", f"Staging a step in pinned memory: {label}")
        if args.jax:
            sys.stdout.flush()
            env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
            subprocess.run([sys.executable, __file__, "--jax-only", str(path), "--steps",
                            str(args.steps), "--passes", str(args.passes)], env=env, check=True)


if __name__ == "__main__":
    main()
