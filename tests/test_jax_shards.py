"""ShardDataset (seed 003's class, fixed), DataConfig, and the .npy token reader."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import zerobatch
from zerobatch.jax import DataConfig, ShardDataset, get_datasets
from zerobatch.stream.npy import open_npy

T = 8
CUTS = {"train": [1000, 1001, 1500, 2600], "val": [300]}  # shard boundaries in the stream


def mesh_of(pp: int, dp: int, tp: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(pp, dp, tp), ("pp", "dp", "tp"))


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("bucket")
    rng = np.random.default_rng(11)
    streams = {}
    for split, size in (("train", 3_203), ("val", 700)):
        tokens = rng.integers(0, 65_000, size=size, dtype=np.uint16)
        (root / split).mkdir()
        for i, part in enumerate(np.split(tokens, CUTS[split])):
            np.save(root / split / f"shard_{i:03d}.npy", part)
        streams[split] = tokens.astype(np.int64)
    return root, streams


def expected(tokens: np.ndarray, windows: np.ndarray, shift: int) -> np.ndarray:
    starts = windows * T + shift
    return tokens[starts[..., None] + np.arange(T)]


@pytest.mark.parametrize(("pp", "dp", "tp"), [(1, 4, 2), (2, 2, 2)])
def test_stream_in_order_across_shards(bucket: tuple[Path, dict[str, np.ndarray]], pp: int,
                                       dp: int, tp: int) -> None:
    root, streams = bucket
    tokens = streams["train"]
    partition = NamedSharding(mesh_of(pp, dp, tp), P(None, "pp", "dp", "tp"))
    batch_size, microbatch = 4, 2
    with ShardDataset(root, "train", T, batch_size, microbatch, dp, pp, partition, tp=tp) as ds:
        rows = dp * batch_size
        assert len(ds) == ((len(tokens) - 1) // T) // rows
        assert ds.tokens_per_step == rows * T
        consumed = 0
        for _ in range(len(ds) // 2):  # steps=2: every window of the epoch but the tail
            x, y = ds(2)
            shape = (2, microbatch, rows // microbatch, T)
            assert x.shape == y.shape == shape and x.dtype == np.int32
            assert x.sharding == partition == y.sharding
            windows = consumed + np.arange(2 * rows).reshape(2, microbatch, rows // microbatch)
            np.testing.assert_array_equal(np.asarray(x), expected(tokens, windows, 0))
            np.testing.assert_array_equal(np.asarray(y), expected(tokens, windows, 1))
            consumed += 2 * rows
        assert ds.epoch == 0
        x, _ = ds(2)  # the epoch's tail is too short: the next epoch starts over
        assert ds.epoch == 1
        np.testing.assert_array_equal(
            np.asarray(x).reshape(-1, T), expected(tokens, np.arange(2 * rows), 0))


def test_shuffle_covers_each_window_once(bucket: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, streams = bucket
    tokens = streams["train"]
    partition = NamedSharding(mesh_of(1, 8, 1), P(None, None, "dp", None))
    lookup = {expected(tokens, np.array(w), 0).tobytes(): w for w in range((len(tokens) - 1) // T)}
    seen: list[int] = []
    with ShardDataset(root, "train", T, 2, 1, 8, 1, partition, shuffle=True, seed=5) as ds:
        for _ in range(len(ds)):
            x, y = ds()
            for xr, yr in zip(np.asarray(x).reshape(-1, T), np.asarray(y).reshape(-1, T),
                              strict=True):
                w = lookup[xr.astype(np.int64).tobytes()]
                np.testing.assert_array_equal(yr, expected(tokens, np.array(w), 1))
                seen.append(w)
    assert len(seen) == len(set(seen)) == len(ds) * 16
    assert seen != sorted(seen)


def test_resume_at_a_random_step(bucket: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, _ = bucket
    partition = NamedSharding(mesh_of(2, 2, 2), P(None, "pp", "dp", "tp"))
    args = (root, "train", T, 4, 2, 2, 2, partition)
    stop = int(np.random.default_rng().integers(1, 40))
    with ShardDataset(*args, tp=2, shuffle=True, seed=9, prefetch=3) as ds:
        for _ in range(stop):
            ds()
        state = json.loads(json.dumps(ds.state_dict()))
        after = [tuple(np.asarray(a) for a in ds(2)) for _ in range(30)]
    for mismatch, message in (({"seed": 8}, "seed=9"), ({"shuffle": False}, "shuffle=True")):
        with ShardDataset(*args, tp=2, prefetch=0, **{"shuffle": True, "seed": 9, **mismatch}) \
                as other, pytest.raises(ValueError, match=message):
            other.load_state_dict(state)  # refused: it would not continue the same order
    with ShardDataset(*args, tp=2, shuffle=True, seed=9, prefetch=0) as fresh:
        fresh.load_state_dict(state)
        again = [tuple(np.asarray(a) for a in fresh(2)) for _ in range(30)]
    older = {key: state[key] for key in ("version", "epoch", "consumed", "seed", "shuffle",
                                         "fingerprint")}  # before ShardDataset used Position
    with ShardDataset(*args, tp=2, shuffle=True, seed=9, prefetch=0) as old:
        old.load_state_dict(older)
        assert old.state_dict() == state
    for (x0, y0), (x1, y1) in zip(after, again, strict=True):
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)
    assert state["epoch"] == 0 and state["consumed"] == stop * 8
    with ShardDataset(root, "val", T, 4, 2, 2, 2, partition, tp=2) as other, \
            pytest.raises(ValueError, match="another source or order"):
        other.load_state_dict(state)


def test_config_and_get_datasets(bucket: tuple[Path, dict[str, np.ndarray]],
                                 caplog: pytest.LogCaptureFixture) -> None:
    root, streams = bucket
    default = DataConfig.from_args(["--name", "run"])
    assert (default.bucket_name, default.T, default.train_batch_size,
            default.micro_batch_size) == ("10bt_gpt2", 1024, 16, 4)
    cfg = DataConfig.from_args(["--bucket_name", str(root), "--T", str(T), "--train_batch_size",
                                "4", "--val_batch_size", "2", "--micro_batch_size", "2",
                                "--model_dimension", "64", "--shuffle"])
    assert cfg.shuffle and cfg.val_folder_name == "val"
    partition = NamedSharding(mesh_of(1, 4, 2), P(None, None, "dp", "tp"))
    with caplog.at_level(logging.INFO, logger="zerobatch.jax"):
        train, val = get_datasets(cfg, partition, dp=4, tp=2)
    assert "train: 5 shards" in caplog.text
    with train, val:
        x, y = val()
        assert x.shape == (1, 2, 4, T)
        np.testing.assert_array_equal(np.asarray(y).reshape(-1, T),
                                      expected(streams["val"], np.arange(8), 1))
        assert train()[0].shape == (1, 2, 8, T)
    with pytest.raises(ValueError, match=r"T / seq_len \(8\) must be a multiple of tp \(3\)"):
        get_datasets(cfg, partition, dp=4, tp=3)
    train, val = ShardDataset.getDataset(cfg, partition, dp=4, tp=2)
    with train, val:
        assert len(train) == ((len(streams["train"]) - 1) // T) // 16
        assert train.tokens_per_step == 16 * T


@pytest.mark.parametrize(("args", "message"), [
    ((T, 6, 4, 2, 1), r"batch_size \(6\) must be a multiple of microbatch \(4\)"),
    ((T, 4, 2, 2, 4), r"microbatch \(2\) must be a multiple of pp \(4\)"),
    ((T, 400, 2, 8, 1), "fewer than one step"),
])
def test_divisibility(bucket: tuple[Path, dict[str, np.ndarray]], args: tuple[int, ...],
                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardDataset(bucket[0], "train", *args)


def test_bad_shards(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \.npy files"):
        ShardDataset(tmp_path, "train", T, 2, 1)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        ShardDataset(tmp_path, "val", T, 2, 1)
    cases = {
        "float.npy": (np.zeros(10, np.float32), "descr", "integer tokens"),
        "big.npy": (np.zeros(10, ">u4"), "descr", "little-endian"),
        "rank.npy": (np.zeros((2, 5), np.uint16), "shape", "1-D token array"),
    }
    for name, (array, field, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        np.save(folder / name, array)
        with pytest.raises(zerobatch.FormatError, match=message) as info:
            open_npy(folder)
        assert info.value.field == field and info.value.path is not None
        assert info.value.path.endswith(name)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    np.save(mixed / "a.npy", np.zeros(10, np.uint16))
    np.save(mixed / "b.npy", np.zeros(10, np.uint32))
    with pytest.raises(zerobatch.FormatError, match="differs") as info:
        open_npy(mixed)
    assert info.value.field == "descr"
    data = (tmp_path / "float.npy" / "float.npy").read_bytes()
    for cut, field in ((len(data) - 1, "shape"), (30, "header"), (0, "header")):
        folder = tmp_path / f"cut{cut}"
        folder.mkdir()
        np.save(folder / "a.npy", np.arange(100, dtype=np.uint16))
        raw = (folder / "a.npy").read_bytes()
        (folder / "a.npy").write_bytes(raw[: min(cut, len(raw) - 1)])
        with pytest.raises(zerobatch.FormatError, match="truncated") as info:
            open_npy(folder)
        assert info.value.field == field
