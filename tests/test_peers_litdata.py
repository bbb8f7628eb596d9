"""LitData token chunks read in place: written by litdata.optimize with
TokensLoader, compared with litdata's own StreamingDataset."""

from __future__ import annotations

import json
import multiprocessing
from itertools import pairwise

import numpy as np
import pytest
import torch
from litdata import StreamingDataset, TokensLoader, optimize
from support._peers import check_against, check_each_once, check_same, upload

from zerobatch import FormatError, Mixture, open_dataset
from zerobatch.peers import PeerDataset
from zerobatch.stream.many import ManyWindows

DOCUMENTS = 60


def _documents(i):
    rng = np.random.default_rng(i)
    for _ in range(3):
        yield torch.tensor(rng.integers(0, 70_000, int(rng.integers(1, 40))), dtype=torch.int32)


@pytest.fixture(scope="module")
def chunks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("litdata") / "out"
    # optimize sets multiprocessing's global start method to spawn (force=True): every
    # later DataLoader of the session would spawn its workers (cold: seconds each)
    # where the tests mean Linux's default fork
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        optimize(fn=_documents, inputs=list(range(DOCUMENTS // 3)), output_dir=str(folder),
                 chunk_size=200, item_loader=TokensLoader(), num_workers=1, mode="overwrite")
    finally:
        multiprocessing.set_start_method(method, force=True)
    return folder


def _reference(folder):
    """Documents from each chunk's item offsets, tokens in index.json's order."""
    documents = []
    for chunk in json.loads((folder / "index.json").read_text())["chunks"]:
        raw = (folder / chunk["filename"]).read_bytes()
        n = int(np.frombuffer(raw, "<u4", 1)[0])
        offsets = np.frombuffer(raw, "<u4", n + 1, 4)
        documents += [np.frombuffer(raw[a:b], "<i4") for a, b in pairwise(offsets)]
    return np.concatenate(documents), documents


def test_windows_and_documents(chunks):
    tokens, documents = _reference(chunks)
    assert len(documents) == DOCUMENTS
    with open_dataset(chunks) as ds:
        assert isinstance(ds, PeerDataset) and ds.format == "litdata"
        assert ds.verify() == [] and len(ds.files.shards) > 1
        check_against(ds, tokens, documents)
        check_each_once(ds)


def test_windows_equal_litdatas_own_blocks(chunks):
    """LitData's items are blocks of block_size tokens inside each chunk (its
    tail dropped): ours with seq_len = block_size - 1 at the same tokens."""
    block = 9
    reference = StreamingDataset(str(chunks), item_loader=TokensLoader(block_size=block),
                                 shuffle=False)
    index = json.loads((chunks / "index.json").read_text())["chunks"]
    firsts = np.cumsum([0] + [c["dim"] for c in index])
    with open_dataset(chunks) as ds:
        windows = ds.windows(block - 1, stride=1)
        item = 0
        for c, chunk in enumerate(index):
            for j in range(chunk["dim"] // block):
                got = windows.read([int(firsts[c]) + j * block])
                row = np.append(got["input_ids"][0], got["labels"][0][-1])
                np.testing.assert_array_equal(row, reference[item].numpy())
                item += 1
        assert item == len(reference)


def test_windows_read_by_the_one_call_kernel(chunks):
    """Each chunk's tokens start after its header (a byte base per file): the
    one-call kernels add it, one dataset's reads and many datasets' alike."""
    tokens, _ = _reference(chunks)
    seq_len = 7
    expected = np.lib.stride_tricks.sliding_window_view(tokens, seq_len + 1)[::seq_len]
    with open_dataset(chunks) as ds, open_dataset(chunks) as again:
        assert len({int(s.base) for s in ds.files.shards}) > 1  # headers of other sizes
        windows = ds.windows(seq_len)
        assert windows._direct
        every = np.arange(len(windows))
        got = windows.read(every)
        np.testing.assert_array_equal(got["input_ids"], expected[:, :-1])
        np.testing.assert_array_equal(got["labels"], expected[:, 1:])
        group = ManyWindows.of([windows, again.windows(seq_len)])
        assert group is not None
        sources = np.tile(np.array([1, 0], np.int64), len(every))
        indices = np.repeat(every[::-1], 2).astype(np.int64)
        columns, _ = group.read(sources, indices)
        np.testing.assert_array_equal(columns["input_ids"], expected[indices, :-1])
        np.testing.assert_array_equal(columns["labels"], expected[indices, 1:])
        # a mixture of them reads its steps the same way
        mixture = Mixture({"a": windows, "b": again.windows(seq_len)}, {"a": 1.0, "b": 2.0},
                          length=3 * len(windows))
        positions = np.arange(len(mixture))
        batch = mixture.read(positions)
        assert mixture._windows() is not None
        _, index = mixture.locate(positions)
        np.testing.assert_array_equal(batch["input_ids"], expected[index, :-1])
        np.testing.assert_array_equal(batch["labels"], expected[index, 1:])


def test_hostile_index_and_chunks(chunks, tmp_path):
    import shutil

    folder = tmp_path / "c"
    shutil.copytree(chunks, folder)
    index = json.loads((folder / "index.json").read_text())
    for change, field in ((lambda x: x["config"].update(item_loader="PyTreeLoader"),
                           "item_loader"),
                          (lambda x: x["config"].update(compression="zstd"), "compression"),
                          (lambda x: x["config"].update(data_format=["no_header_tensor:0"]),
                           "data_format"),
                          # a digit to str.isdigit, not to int()
                          (lambda x: x["config"].update(data_format=["no_header_tensor:\u00b2"]),
                           "data_format"),
                          (lambda x: x["chunks"][0].update(filename="../etc"), "filename"),
                          (lambda x: x["chunks"][1].update(dim=-1), "dim"),
                          (lambda x: x["chunks"][1].update(dim=3), "bytes")):
        bad = json.loads(json.dumps(index))
        change(bad)
        (folder / "index.json").write_text(json.dumps(bad))
        with pytest.raises(FormatError, match=field):
            open_dataset(folder, format="litdata")
    (folder / "index.json").write_text(json.dumps(index))
    first = folder / index["chunks"][0]["filename"]
    raw = bytearray(first.read_bytes())
    raw[8:12] = (2**31).to_bytes(4, "little")  # the second item's offset past the chunk
    first.write_bytes(bytes(raw))
    with open_dataset(folder) as ds:
        with pytest.raises(FormatError, match="offsets"):
            ds.documents().read([0])
        assert [p.field for p in ds.verify()] == ["offsets"]
    (folder / "index.json").write_text("{\"chunks\": [")
    with pytest.raises(FormatError, match="index"):
        open_dataset(folder, format="litdata")


def test_from_s3(chunks, s3):
    url = upload(chunks, s3)
    with open_dataset(chunks) as local, \
            open_dataset(url, storage_options=s3.storage_options()) as remote:
        assert remote.format == "litdata"
        check_same(local, remote)
        assert remote.verify() == []
