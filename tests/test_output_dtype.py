"""One vocabulary for the output dtype: str, NumPy or torch spellings everywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zerobatch import StreamWriter, open_dataset
from zerobatch._output_dtype import CASTS, output_dtype
from zerobatch.batch_loader import BatchFileReader, BatchNativeLoader
from zerobatch.batch_writer import write_batch_file
from zerobatch.service.client import BatchClient

SPELLINGS = {
    "int64": ["int64", "<i8", np.int64, np.dtype("int64"), torch.int64],
    "int32": ["int32", "<i4", np.int32, np.dtype("int32"), torch.int32],
}
BAD = ["float32", ">i8", "uint16", np.float64, torch.float32, torch.uint8, None, True, 3,
       object(), "int 64"]


@pytest.mark.parametrize("name", SPELLINGS)
def test_every_spelling_names_the_same_dtype(name):
    for spelling in SPELLINGS[name]:
        assert output_dtype(spelling) == np.dtype(name), spelling
    assert output_dtype("stored") is None


@pytest.mark.parametrize("value", BAD)
def test_other_values_raise_one_error(value):
    with pytest.raises(ValueError, match=r"^dtype must be one of 'int64', 'int32', 'stored' "
                                         r"\(a str, a NumPy dtype or a torch dtype\), got "):
        output_dtype(value)


def test_the_error_names_the_argument_and_what_it_allows():
    with pytest.raises(ValueError, match=r"^token_dtype must be one of 'int64', 'int32' \("):
        output_dtype("stored", argument="token_dtype", allowed=CASTS)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocabulary")
    with StreamWriter(folder) as writer:
        for start in range(0, 400, 40):
            writer.add_document(np.arange(start, start + 40, dtype=np.uint16))
    return open_dataset(folder)


@pytest.mark.parametrize("name", SPELLINGS)
def test_windows_and_documents_take_every_spelling(dataset, name):
    expected = dataset.windows(8, dtype=name).read(np.arange(5))
    for spelling in SPELLINGS[name]:
        batch = dataset.windows(8, dtype=spelling).read(np.arange(5))
        for column in ("input_ids", "labels"):
            assert batch[column].dtype == np.dtype(name)
            assert np.array_equal(batch[column], expected[column])
        docs = dataset.documents(dtype=spelling).read(np.arange(3))
        assert docs["input_ids"].values.dtype == np.dtype(name)


def test_windows_refuse_a_torch_float(dataset):
    with pytest.raises(ValueError, match=r"dtype must be one of .*got torch.float32"):
        dataset.windows(8, dtype=torch.float32)


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("batchfile") / "t.batch"
    tokens = np.arange(40 * 8, dtype=np.uint32).reshape(40, 8)
    write_batch_file(path, tokens, batch_size=4, seq_len=8, seed=3)
    return path


@pytest.mark.parametrize("name", SPELLINGS)
def test_batch_files_take_every_spelling(batch_file, name):
    reader = BatchFileReader(batch_file)
    expected = torch.from_numpy(reader.read_batch(2).astype(name))
    for spelling in SPELLINGS[name]:
        tensor = reader.read_batch_torch(2, spelling)
        assert tensor.dtype == getattr(torch, name) and torch.equal(tensor, expected)
        batches = list(BatchNativeLoader(batch_file, block_size=2, dtype=spelling))
        assert {batch.dtype for batch in batches} == {getattr(torch, name)}


def test_batch_files_refuse_stored_for_torch(batch_file):
    with pytest.raises(ValueError, match=r"^dtype must be one of 'int64', 'int32' \("):
        BatchNativeLoader(batch_file, dtype="stored")
    with pytest.raises(ValueError, match=r"^dtype must be one of 'int64', 'int32' \("):
        BatchFileReader(batch_file).read_batch_torch(0, torch.float16)


def test_batch_client_has_no_dtype():
    with pytest.raises(TypeError, match="dtype"):
        BatchClient("tcp://127.0.0.1:1", 4, dtype="int32")  # type: ignore[call-arg]
