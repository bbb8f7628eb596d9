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
    """A pair by megatron-core's builder: each document one to three sequences,
    some of zero tokens; about one document in twelve is empty (no sequence)."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for _ in range(documents):
        for _ in range(int(rng.integers(1, 4)) if rng.random() > 0.08 else 0):
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
    original = idx.read_bytes()
    raw = bytearray(original)
    sequences = struct.unpack_from("<Q", raw, 18)[0]
    indices_at = HEADER_SIZE + 12 * sequences
    struct.pack_into("<q", raw, indices_at + 8 * 2, sequences + 5)  # past the sequences
    idx.write_bytes(bytes(raw))
    with open_dataset(folder) as ds:
        ds.windows(4, columns=["input_ids"]).read([0])  # tokens alone need no offsets
        ds.documents().read([0])  # reads check the entries they reach, no more
        windows = ds.windows(4, document_masking=True)
        with pytest.raises(FormatError, match="document_indices") as error:
            windows.read(np.arange(len(windows)))
        assert error.value.path.endswith(".idx")
        with pytest.raises(FormatError, match="document_indices"):
            ds.documents().read([2])
        assert [p.field for p in ds.verify()] == ["document_indices"]
        # windows whose lookups never reach the bad entry, until the reader
        # derives every offset (after LOOKUP_READS reads): the same error
        from zerobatch.peers._base import LOOKUP_READS

        windows = ds.windows(4, document_masking=True)
        last = np.array([len(windows) - 1])
        for _ in range(LOOKUP_READS - 1):
            windows.read(last)
        with pytest.raises(FormatError, match="document_indices") as error:
            windows.read(last)
        assert error.value.path.endswith(".idx")
    raw = bytearray(original)
    starts = np.frombuffer(original, "<i8", offset=indices_at)
    start = int(starts[np.flatnonzero((starts > 0) & (starts < sequences))[0]])
    at = HEADER_SIZE + 4 * sequences + 8 * start
    struct.pack_into("<q", raw, at, struct.unpack_from("<q", raw, at)[0] + 1)  # half a token
    idx.write_bytes(bytes(raw))
    with open_dataset(folder) as ds:
        with pytest.raises(FormatError, match="pointers"):
            ds.documents().read(np.arange(ds.num_documents))
        assert [p.field for p in ds.verify()] == ["pointers"]


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


def test_remote_reads_fetch_only_the_index_entries_they_need(tmp_path, s3, s3_proxy):
    """Over object storage, a batch reads the .idx entries it needs by range:
    opening and a batch of 4 windows with document columns, then 4 documents,
    fetch a few 1 KiB blocks of a 190 KB .idx, never the whole file."""
    folder = tmp_path / "big"
    folder.mkdir()
    rng = np.random.default_rng(11)
    _write(folder / "corpus", np.uint16, rng, 6_000, 50_000)
    url = upload(folder, s3)
    size = (folder / "corpus.idx").stat().st_size
    options = {**s3.storage_options(s3_proxy.endpoint), "block_size": 1024,
               "coalesce": 0}  # each block its own GET: the bytes counted are the blocks read
    s3_proxy.reset_counts()
    with open_dataset(folder) as local, open_dataset(url, storage_options=options) as remote:
        windows = local.windows(64, columns="all")
        order = rng.permutation(len(windows))[:4]
        a, b = windows.read(order), remote.windows(64, columns="all").read(order)
        for name in ("input_ids", "position_ids", "seq_idx"):
            np.testing.assert_array_equal(a[name], b[name])
        for name in ("cu_seqlens", "doc_ids"):
            np.testing.assert_array_equal(a[name].values, b[name].values)
            np.testing.assert_array_equal(a[name].offsets, b[name].offsets)
        # remote reads never derive the offsets whole (that would fetch the .idx)
        assert remote.windows(64, document_masking=True)._lookups_left == 0
        assert local.windows(64, document_masking=True)._lookups_left > 0
        docs = rng.integers(0, local.num_documents, 4)
        for x, y in zip(local.documents().read(docs)["input_ids"],
                        remote.documents().read(docs)["input_ids"], strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    fetched = 0
    for method, path, ranged in s3_proxy.requests:
        if method == "GET" and path.endswith("corpus.idx"):
            assert ranged is not None  # never the whole object
            first, last = ranged.split("=")[1].split("-")
            fetched += int(last) - int(first) + 1
    assert 0 < fetched < size / 4


def test_empty_documents_keep_the_peer_ids_and_copy_skips_them(corpora, tmp_path):
    from zerobatch.peers import copy_to_stream

    folder, prefixes = corpora["u16"]
    _, documents = _megatron(prefixes)
    empty = [d for d, tokens in enumerate(documents) if not len(tokens)]
    assert empty  # the corpus has empty documents (a sequence of zero tokens alone)
    with open_dataset(folder) as peer:
        assert peer.documents().lengths(np.array(empty)).tolist() == [0] * len(empty)
        count = copy_to_stream(peer, tmp_path / "native")
    with open_dataset(tmp_path / "native") as native:
        assert count == native.num_documents == len(documents) - len(empty)
        kept = [d for d in documents if len(d)]
        got = native.documents().read(np.arange(count))["input_ids"]
        for x, want in zip(got, kept, strict=True):
            np.testing.assert_array_equal(np.asarray(x), want.astype(np.int64))


@pytest.mark.parametrize("name", ["u16", "i32"])
def test_mixture_with_document_masking_reads_in_one_call(corpora, name):
    """A mixture's step over Megatron datasets with document columns: one
    kernel call over every shard's offsets whole (empty documents dropped),
    the same columns as each dataset's own per-batch lookups."""
    from zerobatch import Mixture

    folder, prefixes = corpora[name]
    parts = [open_dataset(prefix) for prefix in prefixes]
    windows = {str(i): ds.windows(8, document_masking=True)
               for i, ds in enumerate([*parts, open_dataset(folder)])}
    mixture = Mixture(windows, {"0": 1.0, "1": 2.0, "2": 0.5},
                      length=sum(len(w) for w in windows.values()), max_passes=1)
    positions = np.random.default_rng(0).permutation(len(mixture))[:300]
    batch = mixture.read(positions)
    assert mixture._windows() is not None  # the one-call path
    sources, index = mixture.locate(positions)
    names = mixture.names
    for row, (s, i) in enumerate(zip(sources.tolist(), index.tolist(), strict=True)):
        own = windows[names[s]].read([i])
        for column in ("input_ids", "labels", "position_ids"):
            np.testing.assert_array_equal(batch[column][row], own[column][0])
        np.testing.assert_array_equal(np.asarray(batch["cu_seqlens"][row]),
                                      np.asarray(own["cu_seqlens"][0]))


@pytest.mark.parametrize("name", ["u16", "i32"])
def test_one_dataset_moves_from_lookups_to_whole_offsets(corpora, name):
    """The first LOOKUP_READS reads with document columns look offsets up (an
    O(1) first batch); later ones read by the direct kernel over the whole
    offsets. Both give the same columns, empty documents included."""
    from zerobatch.peers._base import LOOKUP_READS

    folder, _ = corpora[name]
    with open_dataset(folder) as ds, open_dataset(folder) as again:
        windows = ds.windows(8, document_masking=True)
        looked_up = again.windows(8, document_masking=True)
        looked_up._lookups_left = 10**9  # never moves
        rng = np.random.default_rng(1)
        for read in range(LOOKUP_READS + 5):
            assert windows._direct == (read >= LOOKUP_READS)
            indices = rng.integers(0, len(windows), 12)
            got, want = windows.read(indices), looked_up.read(indices)
            for column in want.fields:
                if column == "cu_seqlens":
                    for row in range(12):
                        np.testing.assert_array_equal(np.asarray(got[column][row]),
                                                      np.asarray(want[column][row]))
                else:
                    np.testing.assert_array_equal(got[column], want[column])
        assert not looked_up._direct


def test_mixture_of_datasets_too_large_to_derive_whole_reads_each(corpora, monkeypatch):
    """Past ``WHOLE_DOCUMENTS_MAX`` documents a dataset's offsets are not derived
    whole (memory per process): the mixture reads it by its own lookups."""
    from zerobatch import Mixture
    from zerobatch.peers import _base

    _, prefixes = corpora["u16"]
    monkeypatch.setattr(_base, "WHOLE_DOCUMENTS_MAX", 10)
    windows = {str(i): open_dataset(p).windows(8, document_masking=True)
               for i, p in enumerate(prefixes)}
    mixture = Mixture(windows, {"0": 1.0, "1": 1.0}, length=50, max_passes=1)
    batch = mixture.read(np.arange(50))
    assert mixture._windows() is None
    sources, index = mixture.locate(np.arange(50))
    for row, (s, i) in enumerate(zip(sources.tolist(), index.tolist(), strict=True)):
        np.testing.assert_array_equal(batch["position_ids"][row],
                                      windows[str(s)].read([i])["position_ids"][0])


def test_negative_token_names_the_peer_file(corpora, tmp_path):
    """Found by the fifth fuzz round (an MDS input): a negative token id of a
    peer dataset raised a FormatError naming the native layout's token file
    (``00000.tokens``), which does not exist; it names the peer's own file."""
    folder, prefixes = corpora["i32"]
    target = tmp_path / "m"
    shutil.copytree(folder, target)
    _patch(target / f"{prefixes[0].name}.bin", 0, struct.pack("<i", -5))
    with open_dataset(target) as ds, pytest.raises(FormatError, match="negative") as error:
        ds.windows(4).read([0])
    assert error.value.path.endswith(f"{prefixes[0].name}.bin"), error.value.path
    assert error.value.field == "tokens"
