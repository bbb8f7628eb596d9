"""Loader(output=JaxOutput(...)): global arrays per step, the rows of this process only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zerobatch import Loader
from zerobatch.jax import JaxOutput, ShardDataset
from zerobatch.plan import Plan
from zerobatch.stream.npy import open_npy

T = 8


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, np.ndarray, Path]:
    folder = tmp_path_factory.mktemp("loader") / "train"
    folder.mkdir()
    tokens = np.random.default_rng(8).integers(0, 30_000, size=1_300, dtype=np.uint16)
    for i, part in enumerate(np.split(tokens, [500, 900])):
        np.save(folder / f"{i}.npy", part)
    return open_npy(folder).windows(T, dtype="int32"), tokens.astype(np.int64), folder.parent


def sharding() -> NamedSharding:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("pp", "dp", "tp"))
    return NamedSharding(mesh, P("pp", "dp", "tp"))


def test_steps_are_the_plan_in_the_microbatch_layout(windows: tuple[Any, np.ndarray, Path]) -> None:
    source, tokens, _ = windows
    loader = Loader(source, 8, output=JaxOutput(sharding(), microbatch=2), seed=4,
                    prefetch=2, num_threads=2)
    assert (loader.rank, loader.world_size) == (0, 1)
    plan = Plan(len(source), 8, seed=4)
    order = plan.order(0)
    assert order is not None
    steps = list(loader)
    assert len(steps) == len(loader) == len(source) // 8
    for step, (x, y) in enumerate(steps):
        assert x.shape == y.shape == (2, 4, T) and x.sharding == sharding()
        starts = order(step * 8 + np.arange(8)) * T
        np.testing.assert_array_equal(np.asarray(x).reshape(8, T),
                                      tokens[starts[:, None] + np.arange(T)])
        np.testing.assert_array_equal(np.asarray(y).reshape(8, T),
                                      tokens[starts[:, None] + 1 + np.arange(T)])
    numpy = Loader(source, 8, output="numpy", seed=4)
    for (x, _), batch in zip(steps, numpy, strict=True):
        np.testing.assert_array_equal(np.asarray(x).reshape(8, T), batch["input_ids"])


def test_resume(windows: tuple[Any, np.ndarray, Path]) -> None:
    source = windows[0]
    loader = Loader(source, 8, output=JaxOutput(sharding(), microbatch=2), epochs=None)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [np.asarray(next(it)[0]) for _ in range(4)]
    fresh = Loader(source, 8, output=JaxOutput(sharding(), microbatch=2), prefetch=0)
    fresh.load_state_dict(state)
    for want, (got, _) in zip(expected, fresh, strict=False):
        np.testing.assert_array_equal(want, np.asarray(got))


def test_errors(windows: tuple[Any, np.ndarray, Path]) -> None:
    source = windows[0]
    with pytest.raises(ValueError, match="JaxOutput"):
        Loader(source, 8, output="jax")
    with pytest.raises(ValueError, match="drop_last=True"):
        Loader(source, 8, output=JaxOutput(sharding()), drop_last=False)
    with pytest.raises(ValueError, match=r"3 dimensions.*have 2 \(rows x T / seq_len.*microbatch="):
        Loader(source, 8, output=JaxOutput(sharding()))  # a 3-D spec: was a bare IndexError
    with pytest.raises(ValueError, match=r"microbatch \(3\)"):
        Loader(source, 8, output=JaxOutput(sharding(), microbatch=3))
    with pytest.raises(ValueError, match="Sharding"):
        JaxOutput("dp")  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="need output='jax'"):
        Loader(source, 8, output="numpy", sharding=sharding())
    with pytest.raises(TypeError, match="unexpected keyword"):
        Loader(source, 8, shardings=sharding())


def test_deprecated_keywords_still_work(windows: tuple[Any, np.ndarray, Path]) -> None:
    """output="jax" with sharding= and microbatch= (a release of deprecation)."""
    source = windows[0]
    with pytest.warns(DeprecationWarning, match="JaxOutput"):
        old = Loader(source, 8, output="jax", sharding=sharding(), microbatch=2, seed=3)
    new = Loader(source, 8, output=JaxOutput(sharding(), microbatch=2), seed=3)
    for (x0, y0), (x1, y1) in zip(old, new, strict=True):
        np.testing.assert_array_equal(np.asarray(x0), np.asarray(x1))
        np.testing.assert_array_equal(np.asarray(y0), np.asarray(y1))


def test_shard_dataset_shuffles_like_the_loader(windows: tuple[Any, np.ndarray, Path]) -> None:
    source, _, root = windows
    partition = NamedSharding(sharding().mesh, P(None, "pp", "dp", "tp"))
    with ShardDataset(root, "train", T, 4, 2, 2, 2, partition, tp=2, shuffle=True,
                      seed=9) as ds, Loader(source, 8, output=JaxOutput(sharding(), microbatch=2),
                                            seed=9) as loader:
        for x, _ in loader:
            np.testing.assert_array_equal(np.asarray(ds()[0])[0], np.asarray(x))
