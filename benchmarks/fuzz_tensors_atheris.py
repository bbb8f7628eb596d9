"""Long-running coverage-guided fuzzing of the tensor-file readers with atheris.

Every input is read as a whole file by ``zerobatch.tensors.load`` (NumPy, then
PyTorch when that succeeds); anything but ``FormatError`` is a crash atheris
reports with the input that caused it. Valid files of both formats are written
into the corpus folder (the first positional argument) as seeds.

Run (atheris is not a project dependency; it needs a clang-built CPython on
some platforms)::

    .venv/bin/pip install atheris
    mkdir -p /tmp/tensor-corpus
    .venv/bin/python benchmarks/fuzz_tensors_atheris.py /tmp/tensor-corpus -max_total_time=3600

Any libFuzzer flag works (``-runs=N``, ``-jobs=2``); without ``-runs`` or
``-max_total_time`` the run stops after 60 s. Without atheris installed (as in
``make bench``) the script runs a seeded random-mutation loop for the same time
budget and prints what it tried.
"""

from __future__ import annotations

import random
import sys
import time

import ml_dtypes
import numpy as np

import zerobatch.tensors as zt
from zerobatch.errors import FormatError

DEFAULT_SECONDS = 60


def seed_files() -> list[bytes]:
    """Valid files of both formats: several dtypes, metadata, scalars, empties."""
    tensors = {
        "weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "ids": np.arange(3, dtype=np.int64),
        "mask": np.array([True, False]),
        "bf": np.ones((2, 1), ml_dtypes.bfloat16),
        "scalar": np.array(7, np.int8),
        "empty": np.zeros((0, 5), np.float16),
    }
    return [zt.save(tensors, {"k": "v"}, format=fmt) for fmt in ("bintensors", "safetensors")]


def read(data: bytes) -> bool:
    """Whether ``data`` loads; raises anything that is not a FormatError."""
    try:
        zt.load(data)
    except FormatError:
        return False
    zt.load(data, "pt")
    return True


def random_loop(seconds: float) -> None:
    """Seeded byte mutations of the seed files, for ``seconds``."""
    rng = random.Random(0)
    seeds = seed_files()
    tried = loaded = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        buffer = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(buffer) + 1)
            if rng.random() < 0.6 and at < len(buffer):
                buffer[at] = rng.randrange(256)
            elif rng.random() < 0.5:
                buffer[at:at] = rng.randbytes(rng.randint(1, 8))
            else:
                del buffer[at : at + rng.randint(1, 32)]
        loaded += read(bytes(buffer))
        tried += 1
    print(f"{'mode':16} {'inputs':>10} {'loaded':>8} {'FormatError':>12} {'seconds':>8}")
    print(f"{'random (no atheris)':16} {tried:10d} {loaded:8d} {tried - loaded:12d} {seconds:8.0f}")


def main() -> None:
    try:
        import atheris
    except ImportError:
        random_loop(DEFAULT_SECONDS)
        return
    argv = list(sys.argv)
    if not any(arg.startswith(("-runs=", "-max_total_time=")) for arg in argv):
        argv.append(f"-max_total_time={DEFAULT_SECONDS}")
    corpus = [arg for arg in argv[1:] if not arg.startswith("-")]
    if corpus:
        for number, data in enumerate(seed_files()):
            with open(f"{corpus[0]}/seed-{number}", "wb") as file:
                file.write(data)
    atheris.instrument_all()
    atheris.Setup(argv, lambda data: read(bytes(data)))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
