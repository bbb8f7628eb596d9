"""zerobatch.jax global arrays: seed 003's layout on 8 CPU devices (dp, pp, tp meshes)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zerobatch.jax import (
    GlobalSteps,
    check_layout,
    check_sharding,
    local_box,
    local_rows,
    to_global,
)
from zerobatch.shuffle import Feistel
from zerobatch.stream.npy import open_npy

MESHES = [(1, 8, 1), (1, 4, 2), (2, 2, 2)]  # (pp, dp, tp)


def mesh_of(pp: int, dp: int, tp: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(pp, dp, tp), ("pp", "dp", "tp"))


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    folder = tmp_path_factory.mktemp("npy")
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 50_000, size=3_001, dtype=np.uint16)
    for i, cut in enumerate(np.split(tokens, [700, 701, 1900])):
        np.save(folder / f"{i:05d}.npy", cut)
    return folder, tokens.astype(np.int64)


def test_eight_devices() -> None:
    assert jax.device_count() == 8


@pytest.mark.parametrize(("pp", "dp", "tp"), MESHES)
def test_every_device_holds_its_rows(stream: tuple[Path, np.ndarray], pp: int, dp: int,
                                     tp: int) -> None:
    folder, tokens = stream
    seq_len, batch_size, microbatch = 8, 4, 2
    shape = check_layout(batch_size=batch_size, microbatch=microbatch, seq_len=seq_len,
                         dp=dp, pp=pp, tp=tp)
    assert shape == (microbatch, dp * batch_size // microbatch, seq_len)
    sharding = NamedSharding(mesh_of(pp, dp, tp), P("pp", "dp", "tp"))
    windows = open_npy(folder).windows(seq_len, dtype="int32")
    step = 3  # the step's observations: windows step * rows ... (step + 1) * rows - 1
    rows = dp * batch_size
    wanted = local_rows(sharding, shape)
    np.testing.assert_array_equal(wanted, np.arange(rows))
    out = to_global(windows.read(step * rows + wanted), sharding, global_shape=shape)
    assert sorted(out) == ["input_ids", "labels"]
    for name, shift in (("input_ids", 0), ("labels", 1)):
        array = out[name]
        assert array.shape == shape and array.dtype == np.int32
        assert array.sharding == sharding
        cols = shape[1]
        for shard in array.addressable_shards:
            m, c, t = shard.index
            expected = np.empty(shard.data.shape, np.int64)
            for i, mi in enumerate(range(*m.indices(shape[0]))):
                for j, cj in enumerate(range(*c.indices(cols))):
                    window = step * rows + mi * cols + cj
                    start = window * seq_len + shift
                    expected[i, j] = tokens[start : start + seq_len][t]
            np.testing.assert_array_equal(np.asarray(shard.data), expected)
            assert shard.data.shape == (shape[0] // pp, cols // dp, seq_len // tp)


def test_block_input_and_box() -> None:
    sharding = NamedSharding(mesh_of(2, 2, 2), P("pp", "dp", "tp"))
    shape = (2, 4, 6)
    assert local_box(sharding, shape) == (slice(0, 2), slice(0, 4), slice(0, 6))
    data = np.arange(48, dtype=np.int32).reshape(shape)
    np.testing.assert_array_equal(np.asarray(to_global(data, sharding, global_shape=shape)), data)
    with pytest.raises(ValueError, match="expected this process's 8 rows"):
        to_global(data[:1], sharding, global_shape=shape)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 6, "microbatch": 4}, "batch_size .6. must be a multiple of microbatch .4."),
    ({"microbatch": 2, "pp": 4}, r"microbatch \(2\) must be a multiple of pp \(4\)"),
    ({"seq_len": 6, "tp": 4}, r"seq_len \(6\) must be a multiple of tp \(4\)"),
    ({"dp": 0}, "dp must be a positive int"),
])
def test_layout_conditions(kwargs: dict[str, int], message: str) -> None:
    args = {"batch_size": 8, "microbatch": 2, "seq_len": 8, "dp": 2, "pp": 1, "tp": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        check_layout(**args)


def test_global_steps(stream: tuple[Path, np.ndarray]) -> None:
    folder, tokens = stream
    sharding = NamedSharding(mesh_of(2, 2, 2), P("pp", "dp", "tp"))
    steps = GlobalSteps(sharding, rows=8, seq_len=8, microbatch=2)
    assert steps.shape == (2, 4, 8)
    batch = open_npy(folder).windows(8, dtype="int32").read(steps.positions)
    x, y = steps(batch)
    np.testing.assert_array_equal(np.asarray(x).reshape(8, 8), tokens[:64].reshape(8, 8))
    np.testing.assert_array_equal(np.asarray(y).reshape(8, 8), tokens[1:65].reshape(8, 8))
    np.testing.assert_array_equal(steps.indices(16), 16 + np.arange(8))
    order = Feistel(100, seed=3)
    np.testing.assert_array_equal(steps.indices(16, order), order(16 + np.arange(8)))
    flat = GlobalSteps(NamedSharding(mesh_of(1, 8, 1), P("dp", None)), rows=8, seq_len=8)
    out = flat({"tokens": np.asarray(batch["input_ids"])})
    assert sorted(out) == ["tokens"] and out["tokens"].shape == (8, 8)
    with pytest.raises(ValueError, match=r"rows per step \(8 = batch_size \* world_size\)"):
        GlobalSteps(sharding, rows=8, seq_len=8, microbatch=3)
    with pytest.raises(ValueError, match=r"T / seq_len \(5\) must be a multiple of tp \(2\)"):
        GlobalSteps(sharding, rows=8, seq_len=5, microbatch=2)
    with pytest.raises(ValueError, match=r"microbatch \(1\) must be a multiple of pp \(2\)"):
        check_sharding(sharding, (1, 8, 8))
    with pytest.raises(ValueError, match=r"rows per microbatch \(3\) must be a multiple of "
                       r"dp \* tp \(4\)"):
        check_sharding(NamedSharding(mesh_of(2, 2, 2), P("pp", ("dp", "tp"))), (2, 3, 8))
