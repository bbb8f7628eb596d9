"""Two JAX processes on 127.0.0.1 (jax.distributed, 4 CPU devices each) build the
same global arrays as this process with 8 devices, each reading only its rows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zerobatch import Loader
from zerobatch.jax import JaxOutput, ShardDataset, to_global
from zerobatch.stream.npy import open_npy

WORKER = Path(__file__).parent / "support" / "jax_two_process.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("two")
    (root / "train").mkdir()
    tokens = np.random.default_rng(2).integers(0, 60_000, size=2_500, dtype=np.uint16)
    for i, part in enumerate(np.split(tokens, [900, 1700])):
        np.save(root / "train" / f"{i}.npy", part)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    env.pop("XLA_FLAGS", None)
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, str(WORKER), coordinator, str(i), str(root),
                               str(root / f"out{i}.npz")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        logs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, log
    return root, [dict(np.load(root / f"out{i}.npz")) for i in range(2)]


def _shards(saved: dict[str, np.ndarray], name: str) -> list[tuple[tuple[slice, ...], np.ndarray]]:
    out = []
    k = 0
    while f"{name}/{k}/index" in saved:
        index = tuple(slice(int(a), int(b)) for a, b in saved[f"{name}/{k}/index"])
        out.append((index, saved[f"{name}/{k}/data"]))
        k += 1
    return out


def _check_same(runs: list[dict[str, np.ndarray]], name: str, whole: np.ndarray) -> None:
    """Each process holds 4 shards, all equal to this process's array there,
    and together they cover it."""
    covered = np.zeros(whole.shape, bool)
    for saved in runs:
        assert tuple(saved[f"{name}/shape"]) == whole.shape
        shards = _shards(saved, name)
        assert len(shards) == 4
        for index, data in shards:
            np.testing.assert_array_equal(data, whole[index])
            covered[index] = True
    assert covered.all()


def mesh8() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("pp", "dp", "tp"))


def test_to_global_matches_one_process(runs: tuple[Path, list[dict[str, np.ndarray]]]) -> None:
    root, saved = runs
    shape = (2, 4, 8)
    windows = open_npy(root / "train").windows(8, dtype="int32")
    one = to_global(windows.read(5 * 8 + np.arange(8)), NamedSharding(mesh8(), P("pp", "dp", "tp")),
                    global_shape=shape)
    _check_same(saved, "x", np.asarray(one["input_ids"]))
    _check_same(saved, "y", np.asarray(one["labels"]))
    _check_same(saved, "t", np.asarray(one["input_ids"]))  # tokens split over the processes
    rows = [set(s["rows"].tolist()) for s in saved]
    assert len(rows[0]) == len(rows[1]) == 4 and not rows[0] & rows[1]
    assert rows[0] | rows[1] == set(range(8))


def test_shard_dataset_matches_one_process(
    runs: tuple[Path, list[dict[str, np.ndarray]]],
) -> None:
    root, saved = runs
    partition = NamedSharding(mesh8(), P(None, "pp", "dp", "tp"))
    with ShardDataset(root, "train", 8, 4, 2, 2, 2, partition, tp=2, shuffle=True,
                      seed=3) as ds:
        for call in range(3):
            x, y = ds(2)
            _check_same(saved, f"ds{call}x", np.asarray(x))
            _check_same(saved, f"ds{call}y", np.asarray(y))
    read = [s["ds_read"] for s in saved]
    assert len(read[0]) == len(read[1]) == 3 * 2 * 8 // 2  # each process half of each call
    assert not set(read[0].tolist()) & set(read[1].tolist())
    assert saved[0]["log_records"] > 0 and saved[1]["log_records"] == 0  # process 0 logs


def test_loader_matches_one_process(runs: tuple[Path, list[dict[str, np.ndarray]]]) -> None:
    root, saved = runs
    source = open_npy(root / "train").windows(8, dtype="int32")
    sharding = NamedSharding(mesh8(), P("pp", "dp", "tp"))
    with Loader(source, 8, output=JaxOutput(sharding, microbatch=2), seed=6) as loader:
        for step, (x, y) in zip(range(3), loader, strict=False):
            _check_same(saved, f"ld{step}x", np.asarray(x))
            _check_same(saved, f"ld{step}y", np.asarray(y))
    read = [set(s["ld_read"].tolist()) for s in saved]
    assert len(read[0]) == len(read[1]) == 3 * 4 and not read[0] & read[1]
