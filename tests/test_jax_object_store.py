"""ShardDataset over an S3 bucket (moto on 127.0.0.1): same output as from a
folder, with and without injected faults; StorageError after the budget."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import jax
import numpy as np
import obstore
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zerobatch import StorageError
from zerobatch.jax import ShardDataset
from zerobatch.storage import open_storage

T = 8


@pytest.fixture(scope="module")
def bucket(s3: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The same shards in a local folder and under an s3:// prefix."""
    folder = tmp_path_factory.mktemp("local")
    url = s3.url("shards")
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 50_000, size=2_601, dtype=np.uint16)
    for split in ("train", "val"):
        (folder / split).mkdir()
        remote = open_storage(f"{url}/{split}", **s3.storage_options())
        for i, part in enumerate(np.split(tokens, [800, 1500, 1501])):
            buffer = io.BytesIO()
            np.save(buffer, part)
            (folder / split / f"{i:03d}.npy").write_bytes(buffer.getvalue())
            obstore.put(remote.store, remote.key(f"{i:03d}.npy"), buffer.getvalue())
        obstore.put(remote.store, remote.key("README.txt"), b"not a shard")
        remote.close()
    return folder, url


def _calls(location: Any, options: dict[str, Any] | None, **kwargs: Any) -> list[np.ndarray]:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("pp", "dp", "tp"))
    partition = NamedSharding(mesh, P(None, "pp", "dp", "tp"))
    with ShardDataset(location, "train", T, 4, 2, 2, 2, partition, tp=2,
                      storage_options=options, **kwargs) as ds:
        out = []
        for _ in range(12):
            x, y = ds(2)
            out += [np.asarray(x), np.asarray(y)]
        return out


def test_bucket_equals_folder(s3: Any, s3_proxy: Any, bucket: tuple[Path, str]) -> None:
    folder, url = bucket
    local = _calls(folder, None, shuffle=True, seed=1)
    remote = _calls(url, s3.storage_options(), shuffle=True, seed=1)
    with s3_proxy.faults(rate=0.2):
        faulty = _calls(url, s3.storage_options(s3_proxy.endpoint, retries=10), shuffle=True,
                        seed=1, prefetch=3)
    for a, b, c in zip(local, remote, faulty, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_errors(s3: Any, s3_proxy: Any, bucket: tuple[Path, str]) -> None:
    _, url = bucket
    with pytest.raises(FileNotFoundError, match=r"no \.npy files"):
        ShardDataset(s3.url("empty"), "train", T, 2, 1, storage_options=s3.storage_options())
    with s3_proxy.faults(rate=1.0, kinds=("503",)), pytest.raises(StorageError):
        ShardDataset(url, "val", T, 2, 1,
                     storage_options=s3.storage_options(s3_proxy.endpoint, retries=2,
                                                        budget=1.0))


def test_failed_read_keeps_the_position(s3: Any, s3_proxy: Any, bucket: tuple[Path, str]) -> None:
    folder, url = bucket
    expected = _calls(folder, None)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("pp", "dp", "tp"))
    partition = NamedSharding(mesh, P(None, "pp", "dp", "tp"))
    options = s3.storage_options(s3_proxy.endpoint, retries=1, budget=1.0)
    with ShardDataset(url, "train", T, 4, 2, 2, 2, partition, tp=2, prefetch=0,
                      storage_options=options) as ds:
        got = [np.asarray(a) for a in ds(2)]
        with s3_proxy.faults(rate=1.0, kinds=("503",)), pytest.raises(StorageError):
            ds(2)
        state = ds.state_dict()
        assert state["consumed"] == 16
        for _ in range(11):
            got += [np.asarray(a) for a in ds(2)]
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
