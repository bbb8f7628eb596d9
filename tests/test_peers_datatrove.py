"""datatrove .ds files read in place: written by datatrove's own TokenizedFile
(2- and 4-byte tokens, index, loss mask, metadata), compared with its own
DatatroveFileDataset / DatatroveFolderDataset."""

from __future__ import annotations

import numpy as np
import pytest
from datatrove.pipeline.tokens.tokenizer import TokenizedFile
from datatrove.utils.dataset import DatatroveFileDataset, DatatroveFolderDataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support._peers import check_against, check_each_once, check_same, upload

from zerobatch import FormatError, Loader, open_dataset
from zerobatch.peers import PeerDataset
from zerobatch.peers.datatrove import TOKEN_DTYPES


def _write(folder, name, rng, documents, token_size, *, loss=True, metadata=True):
    file = TokenizedFile(str(folder), name, save_loss_metadata=loss, token_size=token_size,
                         save_final_metadata=metadata, tokenizer_name_or_path="gpt2|test")
    vocab = 60_000 if token_size == 2 else 200_000
    for _ in range(documents):
        length = int(rng.integers(1, 30)) if rng.random() > 0.1 else 0  # some empty
        tokens = rng.integers(0, vocab, length).tolist()
        file.write(tokens, rng.random(len(tokens)) < 0.7 if loss else None)
    file.close()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    rng = np.random.default_rng(11)
    out = {}
    for size in (2, 4):
        folder = tmp_path_factory.mktemp(f"ds{size}")
        for i, count in enumerate((40, 25)):
            _write(folder, f"00{i}_tokenized.ds", rng, count, size)
        out[size] = folder
    return out


def _reference(folder):
    """Tokens, documents and loss bytes, from the files datatrove wrote."""
    tokens, documents, losses = [], [], []
    for path in sorted(folder.glob("*.ds")):
        size = int((folder / (path.name + ".metadata")).read_text().split("\n")[0]
                   .rpartition("|")[2])
        values = np.fromfile(path, "<u2" if size == 2 else "<u4")
        ends = np.fromfile(str(path) + ".index", "<u8").astype(np.int64)
        documents += np.split(values, ends[:-1])
        tokens.append(values)
        losses.append(np.fromfile(str(path) + ".loss", np.uint8))
    return np.concatenate(tokens), documents, np.concatenate(losses)


@pytest.mark.parametrize("size", [2, 4])
def test_windows_documents_and_loss_mask(folders, size):
    folder = folders[size]
    tokens, documents, loss = _reference(folder)
    assert any(len(d) == 0 for d in documents)  # empty documents keep their ids
    with open_dataset(folder) as ds:
        assert isinstance(ds, PeerDataset) and ds.format == "datatrove"
        assert ds.manifest.record_dtype.itemsize == size
        assert ds.fields == ("loss_mask",) and ds.verify() == []
        check_against(ds, tokens, documents)
        check_each_once(ds)
        windows = ds.windows(6, stride=4)
        batch = windows.read([0, 5, 2])
        at = np.array([0, 5, 2])[:, None] * 4 + np.arange(6)
        np.testing.assert_array_equal(batch["loss_mask"], loss[at])
        # the Loader's collated read keeps the mask (its one-call read had dropped it)
        for output in ("numpy", "torch"):
            step = next(iter(Loader(windows, 3, shuffle=False, output=output)))
            assert list(step) == ["input_ids", "labels", "loss_mask"]
            first = np.arange(3)[:, None] * 4 + np.arange(6)  # windows 0, 1, 2
            np.testing.assert_array_equal(np.asarray(step["loss_mask"]), loss[first])
        # without the mask asked for: the direct read, the same tokens
        plain = ds.windows(6, stride=4, columns=("input_ids", "labels"))
        step = next(iter(Loader(plain, 3, shuffle=False, output="numpy")))
        assert list(step) == ["input_ids", "labels"]
        np.testing.assert_array_equal(step["input_ids"], tokens[first])
        np.testing.assert_array_equal(step["labels"], tokens[first + 1])
        docs = ds.documents().read([3, 0])
        starts = np.concatenate([[0], np.cumsum([len(d) for d in documents])])
        for got, d in zip(docs["loss_mask"], (3, 0), strict=True):
            np.testing.assert_array_equal(np.asarray(got), loss[starts[d]:starts[d + 1]])


@pytest.mark.parametrize("size", [2, 4])
def test_windows_equal_datatroves_own_reader(folders, size):
    """datatrove's items are windows of seq_len + 1 tokens at a stride of
    seq_len + 1 inside each file: ours with that stride, at the same tokens.
    Positions equal its own except in a window where an empty document ends:
    there datatrove's restart is overwritten by the empty document's (its
    ``pos[doc_ends] = offsets`` with a repeated end), so positions run on
    across the document start; ours restart (``check_against`` checks them
    against the index for every window)."""
    folder, seq_len = folders[size], 9
    reference = DatatroveFolderDataset(str(folder), seq_len, token_size=size,
                                       return_positions=True)
    files = sorted(folder.glob("*.ds"))
    firsts = np.cumsum([0] + [p.stat().st_size // size for p in files])
    with open_dataset(folder) as ds:
        windows = ds.windows(seq_len, stride=1, document_masking=True)
        compared = skipped = 0
        for f, path in enumerate(files):
            one = DatatroveFileDataset(str(path), seq_len, token_size=size)
            ends = np.fromfile(str(path) + ".index", "<u8").astype(np.int64)
            repeated = ends[:-1][ends[1:] == ends[:-1]]  # where an empty document ends
            for item in range(len(one)):
                index = int(firsts[f]) + item * (seq_len + 1)
                got = windows.read([index])
                want = reference[int(reference.lens[f]) + item]
                row = np.append(got["input_ids"][0], got["labels"][0][-1])
                np.testing.assert_array_equal(row, want["input_ids"].numpy())
                start = item * (seq_len + 1)
                if ((repeated > start) & (repeated <= start + seq_len)).any():
                    at = start + np.arange(seq_len)  # the true positions, from the index
                    begins = np.concatenate([[0], ends])[np.searchsorted(
                        np.concatenate([[0], ends]), at, side="right") - 1]
                    np.testing.assert_array_equal(got["position_ids"][0],
                                                  at - np.maximum(begins, start))
                    skipped += 1
                    continue
                np.testing.assert_array_equal(got["position_ids"][0],
                                              want["positions"].numpy()[:seq_len])
                compared += 1
        assert compared > skipped > 0
    with open_dataset(files[1]) as one_file:
        assert one_file.num_tokens == files[1].stat().st_size // size


def test_token_size_from_sizes_and_option(tmp_path):
    rng = np.random.default_rng(2)
    _write(tmp_path, "a.ds", rng, 5, 4, loss=False, metadata=False)
    with open_dataset(tmp_path) as ds:
        assert ds.manifest.record_dtype == np.dtype("<u4") and ds.fields == ()
    with pytest.raises(FormatError, match="ambiguous"):
        open_dataset(tmp_path, format="datatrove", token_size=2)


def test_token_size_after_a_separator_strip_removes(folders, tmp_path):
    """A first line ending in a character ``str.strip`` removes and ``int``
    does not take (U+001E, found by the fuzzer): the size the check saw."""
    import shutil

    folder = tmp_path / "d"
    shutil.copytree(folders[4], folder)
    for meta in folder.glob("*.metadata"):
        first, rest = meta.read_bytes().split(b"\n", 1)
        meta.write_bytes(first + b"\x1e\n" + rest)
    with open_dataset(folder) as ds, open_dataset(folders[4]) as original:
        assert ds.manifest.record_dtype == np.dtype("<u4")
        check_same(original, ds)


def test_hostile_files(folders, tmp_path):
    import shutil

    folder = tmp_path / "d"
    shutil.copytree(folders[2], folder)
    first = sorted(folder.glob("*.ds"))[0]
    index = first.with_name(first.name + ".index")
    loss = first.with_name(first.name + ".loss")
    raw = index.read_bytes()
    index.write_bytes(raw[:-3])
    with pytest.raises(FormatError, match="whole number") as error:
        open_dataset(folder)
    assert error.value.path.endswith(".ds.index")
    index.write_bytes(raw[:-8])
    with pytest.raises(FormatError, match="does not match"):
        open_dataset(folder)
    ends = np.frombuffer(raw, "<u8").copy()
    ends[3] = ends[-1] + 5  # past the end, the last entry intact
    index.write_bytes(ends.tobytes())
    with open_dataset(folder) as ds:
        assert ds.documents().read([0])["input_ids"].lengths[0] == ends[0]  # sound: read
        with pytest.raises(FormatError, match="ends") as error:  # what a read reaches is checked
            ds.documents().read([3])
        assert error.value.path.endswith(".ds.index")
        with pytest.raises(FormatError, match="ends"):
            ds.windows(4, document_masking=True).read(np.arange(int(ends[2]) // 4,
                                                                int(ends[2]) // 4 + 3))
        assert [p.field for p in ds.verify()] == ["ends"]
    index.write_bytes(raw)
    loss.write_bytes(loss.read_bytes()[:-1])
    with pytest.raises(FormatError, match="one byte per token"):
        open_dataset(folder)
    loss.unlink()
    with pytest.raises(FormatError, match="missing"):
        open_dataset(folder)
    meta = first.with_name(first.name + ".metadata")
    meta.write_text("gpt2|7\n10")
    with pytest.raises(FormatError, match="token_size"):
        open_dataset(folder, format="datatrove")


def test_from_s3(folders, s3):
    url = upload(folders[4], s3)
    with open_dataset(folders[4]) as local, \
            open_dataset(url, storage_options=s3.storage_options()) as remote:
        assert remote.format == "datatrove" and remote.fields == ("loss_mask",)
        check_same(local, remote)
        assert remote.verify() == []


def test_cli_inspect_and_verify(folders, tmp_path, capsys):
    import shutil

    from zerobatch.cli import main

    assert main(["inspect", str(folders[2])]) == 0
    out = capsys.readouterr().out
    assert "datatrove" in out and "loss_mask" in out
    assert main(["verify", str(folders[2])]) == 0
    folder = tmp_path / "v"
    shutil.copytree(folders[2], folder)
    loss = sorted(folder.glob("*.ds.loss"))[0]
    loss.write_bytes(b"\x07" * loss.stat().st_size)
    assert main(["verify", str(folder)]) == 1
    assert "loss_mask" in capsys.readouterr().out


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=8), min_size=1,
                        max_size=3),
       size=st.sampled_from([2, 4]), seq_len=st.integers(1, 9), stride=st.integers(1, 9))
def test_any_documents_read_as_written(tmp_path_factory, lengths, size, seq_len, stride):
    """Property: for any documents (empty ones too) in any number of files,
    windows and documents are the tokens datatrove wrote."""
    folder = tmp_path_factory.mktemp("prop")
    rng = np.random.default_rng(len(lengths))
    documents = []
    for i, file_lengths in enumerate(lengths):
        file = TokenizedFile(str(folder), f"{i}.ds", token_size=size)
        for n in file_lengths:
            tokens = rng.integers(0, 60_000, n)
            file.write(tokens.tolist(), None)
            documents.append(tokens.astype(TOKEN_DTYPES[size]))
        file.close()
    tokens = np.concatenate(documents)
    with open_dataset(folder, format="datatrove", token_size=size) as ds:
        if tokens.shape[0] >= seq_len + 1:
            check_against(ds, tokens, documents, seq_len=seq_len, stride=stride)
        else:
            assert len(ds.windows(seq_len)) == 0
        assert ds.num_documents == len(documents)  # empty documents keep their ids
        lengths = ds.documents().lengths(np.arange(len(documents)))
        np.testing.assert_array_equal(lengths, [len(d) for d in documents])


def test_copy_to_a_native_dataset(folders, tmp_path):
    from zerobatch.peers import copy_to_stream

    out = tmp_path / "native"
    with open_dataset(folders[4]) as peer:
        count = copy_to_stream(peer, out)
    with open_dataset(folders[4]) as peer, open_dataset(out) as native:
        empty = int((peer.documents().lengths(np.arange(peer.num_documents)) == 0).sum())
        assert type(native).__name__ == "Dataset" and count == peer.num_documents - empty > 0
        assert native.manifest.token_dtype.str == "<u4" and native.manifest.fields == (
            "loss_mask",)
        a = peer.windows(5, document_masking=True).read([0, 3, 9])
        b = native.windows(5, document_masking=True).read([0, 3, 9])
        for name in ("input_ids", "labels", "position_ids", "loss_mask"):
            np.testing.assert_array_equal(a[name], b[name])
