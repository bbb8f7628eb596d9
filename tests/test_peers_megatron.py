"""Megatron .bin/.idx read in place: files written by megatron-core's own
IndexedDatasetBuilder, compared with its own IndexedDataset."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from support._peers import check_against, check_each_once, check_same, upload

from zerobatch import FormatError, open_dataset
from zerobatch.peers import PeerDataset, open_peer
from zerobatch.peers.megatron import HEADER_SIZE


def _write(prefix, dtype, rng, documents, vocab):
    """A pair by megatron-core's builder: each document one to three sequences."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for _ in range(documents):
        for _ in range(int(rng.integers(1, 4))):
            length = int(rng.integers(0 if rng.random() < 0.05 else 1, 40))
            builder.add_item(torch.from_numpy(rng.integers(0, vocab, length).astype(np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


def _megatron(prefixes):
    """Every token and every document as megatron-core's IndexedDataset reads them."""
    tokens, documents = [], []
    for prefix in prefixes:
        ds = IndexedDataset(str(prefix))
        bounds = ds.document_indices
        for d in range(len(bounds) - 1):
            parts = [ds[int(i)] for i in range(bounds[d], bounds[d + 1])]
            documents.append(np.concatenate(parts) if parts else np.zeros(0, ds.index.dtype))
        tokens.extend(documents[len(documents) - len(bounds) + 1:])
    return np.concatenate(tokens), documents


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron")
    rng = np.random.default_rng(5)
    out = {}
    for name, dtype, vocab in (("u16", np.uint16, 50_000), ("i32", np.int32, 200_000)):
        folder = root / name
        folder.mkdir()
        prefixes = [folder / f"part_{i}_text_document" for i in range(2)]
        for prefix, count in zip(prefixes, (60, 45), strict=True):
            _write(prefix, dtype, rng, count, vocab)
        out[name] = (folder, prefixes)
    return out


@pytest.mark.parametrize("name", ["u16", "i32"])
def test_windows_and_documents_equal_megatron(corpora, name):
    folder, prefixes = corpora[name]
    tokens, documents = _megatron(prefixes)
    with open_dataset(folder) as ds:
        assert isinstance(ds, PeerDataset) and ds.format == "megatron"
        assert ds.verify() == []
        assert tokens.dtype == ds.manifest.record_dtype
        check_against(ds, tokens, documents)
        check_against(ds, tokens, documents, seq_len=16, stride=5)
        check_each_once(ds)
        assert "megatron" in ds.describe()


def test_detection_by_prefix_idx_and_bin(corpora):
    folder, prefixes = corpora["u16"]
    tokens, documents = _megatron(prefixes[:1])
    for path in (prefixes[0], f"{prefixes[0]}.idx", f"{prefixes[0]}.bin"):
        with open_dataset(path) as ds:
            assert ds.num_tokens == tokens.shape[0] and ds.num_documents == len(documents)
    with open_peer(folder, "megatron") as a, open_dataset(folder, format="megatron") as b:
        assert a.fingerprint == b.fingerprint
    with pytest.raises(TypeError, match="multimodal"):
        open_dataset(folder, format="megatron", shuffle=True)


def _copy(corpora, tmp_path):
    folder, prefixes = corpora["u16"]
    target = tmp_path / "m"
    shutil.copytree(folder, target)
    return target, target / f"{prefixes[0].name}.idx", target / f"{prefixes[0].name}.bin"


def _patch(path, offset, data):
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(data)


@pytest.mark.parametrize(("offset", "data", "field"), [
    (0, b"MMIDIDY", "magic"),
    (9, struct.pack("<Q", 2), "version"),
    (17, struct.pack("<B", 6), "dtype"),
    (17, struct.pack("<B", 99), "dtype"),
    (18, struct.pack("<Q", 2**62), "sequences"),
    (26, struct.pack("<Q", 0), "documents"),
    (26, struct.pack("<Q", 3), "sequences"),
    (HEADER_SIZE, None, "pointers"),  # first pointer moved: the last no longer ends the .bin
])
def test_crafted_headers_raise_format_error(corpora, tmp_path, offset, data, field):
    folder, idx, _ = _copy(corpora, tmp_path)
    if data is None:
        sequences = struct.unpack_from("<Q", idx.read_bytes(), 18)[0]
        offset, data = HEADER_SIZE + 4 * sequences, struct.pack("<q", 2)
    _patch(idx, offset, data)
    with pytest.raises(FormatError, match=field) as error:
        open_dataset(folder)
    assert error.value.path.endswith(".idx") and error.value.field == field


def test_truncated_and_mismatched_files(corpora, tmp_path):
    folder, idx, bin_ = _copy(corpora, tmp_path)
    raw = idx.read_bytes()
    for cut in (5, HEADER_SIZE - 1, HEADER_SIZE + 3, len(raw) - 1):
        idx.write_bytes(raw[:cut])
        with pytest.raises(FormatError) as error:
            open_dataset(folder, format="megatron")
        assert ".idx" in str(error.value)
    idx.write_bytes(raw + b"\0")  # one byte too many: neither plain nor multimodal
    with pytest.raises(FormatError, match="sequences"):
        open_dataset(folder)
    idx.write_bytes(raw)
    data = bin_.read_bytes()
    bin_.write_bytes(data[:-2])
    with pytest.raises(FormatError, match="bytes") as error:
        open_dataset(folder)
    assert error.value.path.endswith(".bin")
    bin_.write_bytes(data[:-1])
    with pytest.raises(FormatError, match="whole number"):
        open_dataset(folder)
    bin_.unlink()
    with pytest.raises(FormatError, match="missing"):
        open_dataset(folder)


def test_crafted_tables_raise_on_first_document_read(corpora, tmp_path):
    folder, idx, _ = _copy(corpora, tmp_path)
    raw = bytearray(idx.read_bytes())
    sequences = struct.unpack_from("<Q", raw, 18)[0]
    indices_at = HEADER_SIZE + 12 * sequences
    struct.pack_into("<q", raw, indices_at + 8 * 2, sequences + 5)  # past the sequences
    idx.write_bytes(bytes(raw))
    with open_dataset(folder) as ds:
        ds.windows(4, columns=["input_ids"]).read([0])  # tokens alone need no offsets
        with pytest.raises(FormatError, match="document_indices"):
            ds.windows(4, document_masking=True).read([0])
        with pytest.raises(FormatError, match="document_indices"):
            ds.documents().read([0])
        assert [p.field for p in ds.verify()] == ["document_indices"]
    raw = bytearray(idx.read_bytes())
    struct.pack_into("<q", raw, indices_at + 8 * 2, 2)
    struct.pack_into("<q", raw, HEADER_SIZE + 4 * sequences + 8 * 3, 1)  # a pointer moved
    idx.write_bytes(bytes(raw))
    with open_dataset(folder) as ds, pytest.raises(FormatError, match="pointers"):
        ds.documents().read([1])


def test_multimodal_inferred_from_the_size(tmp_path):
    builder = IndexedDatasetBuilder(str(tmp_path / "mm.bin"), dtype=np.uint16, multimodal=True)
    for mode, values in ((0, [1, 2, 3]), (1, [4, 5]), (0, [6, 7, 8, 9])):
        builder.add_item(torch.tensor(values), mode=mode)
        builder.end_document()
    builder.finalize(str(tmp_path / "mm.idx"))
    with open_dataset(tmp_path / "mm") as ds:
        assert ("multimodal", "True") in ds.files.facts()
        docs = ds.documents().read([0, 1, 2])["input_ids"]
        assert [list(np.asarray(d)) for d in docs] == [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    with pytest.raises(FormatError, match="multimodal"):
        open_dataset(tmp_path / "mm", format="megatron", multimodal=False)


def test_from_s3_by_folder_and_prefix(corpora, s3):
    folder, prefixes = corpora["i32"]
    url = upload(folder, s3)
    options = s3.storage_options()
    with open_dataset(folder) as local, open_dataset(url, storage_options=options) as remote:
        assert isinstance(remote, PeerDataset) and remote.format == "megatron"
        check_same(local, remote)
        assert remote.verify() == []
    with open_dataset(prefixes[1]) as local, \
            open_dataset(f"{url}/{prefixes[1].name}", storage_options=options) as remote:
        check_same(local, remote)
