"""LLMBATCH files and shard folders on S3 (moto on loopback): the same batches
as local, one range GET per batch."""

from __future__ import annotations

import numpy as np
import pytest

from zerobatch import FormatError
from zerobatch.batch_loader import BatchFileReader, BatchNativeLoader
from zerobatch.batch_writer import write_batch_dataset, write_batch_file
from zerobatch.storage import ObjectStorage


@pytest.fixture(scope="module")
def remote(s3, tmp_path_factory):
    """A .batch file and a shard folder, locally and copied under an s3:// prefix."""
    folder = tmp_path_factory.mktemp("batch")
    tokens = np.random.default_rng(4).integers(0, 60_000, (300, 16))
    write_batch_file(folder / "one.batch", tokens, 8, 16, 3)
    write_batch_dataset(folder / "shards", iter(tokens), 300, 8, 16, 3, batches_per_shard=10)
    url = s3.url("batch")
    store = ObjectStorage(url, **s3.storage_options())
    store.put("one.batch", folder / "one.batch")
    for path in (folder / "shards").iterdir():
        store.put(f"shards/{path.name}", path)
    return folder, url


@pytest.mark.parametrize("name", ["one.batch", "shards"])
def test_same_batches_one_get_each(remote, s3, s3_proxy, name):
    folder, url = remote
    options = s3.storage_options(s3_proxy.endpoint)
    with BatchFileReader(folder / name) as local, \
            BatchFileReader(f"{url}/{name}", storage_options=options) as far:
        assert (far.num_batches, far.batch_size, far.seq_len, far.seed) == \
            (local.num_batches, local.batch_size, local.seq_len, local.seed)
        s3_proxy.reset_counts()
        for i in (0, 7, local.num_batches - 1):
            assert np.array_equal(far.read_batch(i), local.read_batch(i))
        assert sum(1 for m, _, r in s3_proxy.requests if m == "GET" and r) == 3
    a = list(BatchNativeLoader(folder / name, block_size=4, seed=1, output="numpy"))
    b = list(BatchNativeLoader(f"{url}/{name}", block_size=4, seed=1, output="numpy",
                               storage_options=options))
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_truncated_remote_batch_file(remote, s3):
    folder, _ = remote
    options = s3.storage_options()
    url = s3.url("bad-batch")
    store = ObjectStorage(url, **options)
    store.put("cut.batch", (folder / "one.batch").read_bytes()[:-100])
    with pytest.raises(FormatError, match=f"{url}/cut.batch"):
        BatchFileReader(f"{url}/cut.batch", storage_options=options)
