"""Tensor files on S3 (moto on loopback): same tensors as local, one range GET
for the header and one per tensor asked for."""

from __future__ import annotations

import numpy as np
import pytest

from zerobatch import FormatError
from zerobatch.storage import ObjectStorage
from zerobatch.tensors import load_file, safe_open, save_file


@pytest.fixture(scope="module")
def tensors():
    rng = np.random.default_rng(3)
    return {"w": rng.standard_normal((64, 32)).astype(np.float32),
            "b": rng.integers(-5, 5, 100).astype(np.int16),
            "e": np.zeros((0, 4), np.float64)}


def _range_gets(proxy) -> int:
    return sum(1 for method, _, span in proxy.requests if method == "GET" and span)


def test_same_tensors_as_local(s3, s3_proxy, tensors, tmp_path):
    local = tmp_path / "t.bt"
    save_file(tensors, local)
    url = f"{s3.url('tensors')}/t.bt"
    options = s3.storage_options(s3_proxy.endpoint)
    save_file(tensors, url, storage_options=options)
    assert ObjectStorage(url.rpartition("/")[0], **options).map("t.bt").tobytes() \
        == local.read_bytes()
    got, want = load_file(url, storage_options=options), load_file(local)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    s3_proxy.reset_counts()
    with safe_open(url, "np", storage_options=options) as file:
        assert file.keys() == sorted(tensors)
        assert _range_gets(s3_proxy) == 1  # the header
        part = file.get_slice("w")[5:9, ::3]
        assert _range_gets(s3_proxy) == 2  # and the one tensor
    np.testing.assert_array_equal(part, tensors["w"][5:9, ::3])


def test_corrupt_remote_tensor_file_names_the_url(s3, tensors, tmp_path):
    local = tmp_path / "t.bt"
    save_file(tensors, local)
    options = s3.storage_options()
    folder = s3.url("bad-tensors")
    store = ObjectStorage(folder, **options)
    store.put("cut.bt", local.read_bytes()[:-10])
    with pytest.raises(FormatError, match=f"{folder}/cut.bt"):
        load_file(f"{folder}/cut.bt", storage_options=options)
    with pytest.raises(FileNotFoundError, match=f"{folder}/none.bt"):
        load_file(f"{folder}/none.bt", storage_options=options)
