"""StreamWriter validation, atomicity, and combine (including parallel writers)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
from test_stream_helpers import Corpus, random_corpus, write

from zerobatch import stream


@pytest.mark.parametrize(("call", "match"), [
    (lambda w: w.add_document([]), "non-empty"),
    (lambda w: w.add_document([[1, 2]]), "1-D"),
    (lambda w: w.add_document([1.5]), "integers"),
    (lambda w: w.add_document([70_000]), "tokens must be in"),
    (lambda w: w.add_document([-1]), "tokens must be in"),
    (lambda w: w.add_document([1, 2], spans=[(0, 3, "x")]), r"spans\[0\]"),
    (lambda w: w.add_document([1, 2], spans=[(1, 1, "x")]), r"spans\[0\]"),
    (lambda w: w.add_document([1, 2, 3], spans=[(2, 1, 1)]), r"spans\[0\] = \(2, 1\)"),
    (lambda w: w.add_document([1, 2, 3], spans=[(0, 3, 1), (-1, 2, 2)]), r"spans\[1\]"),
    (lambda w: w.add_document([1, 2], spans=[(0, 1)]), r"spans\[0\]"),
    (lambda w: w.add_document([1, 2], fields={"mask": [1]}), r"fields\['mask'\]"),
    (lambda w: w.add_document([1, 2], fields={"mask": [1, 300]}), r"fields\['mask'\]"),
    (lambda w: w.add_document([1, 2], fields={"other": [1, 1]}), "unknown"),
])
def test_add_document_validates(tmp_path: Path, call: object, match: str) -> None:
    with stream.StreamWriter(tmp_path / "ds", metadata="msgpack", fields={"mask": "u1"}) as w:
        with pytest.raises((ValueError, TypeError), match=match):
            call(w)  # type: ignore[operator]  # parametrized lambdas
        w.add_document([1, 2])
    assert stream.open_dataset(tmp_path / "ds").num_documents == 1


def test_writer_options_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token_dtype"):
        stream.StreamWriter(tmp_path / "a", token_dtype="<i8")
    with pytest.raises(ValueError, match="shard_tokens"):
        stream.StreamWriter(tmp_path / "b", shard_tokens=0)
    with pytest.raises(ValueError, match="fields"):
        stream.StreamWriter(tmp_path / "c", fields={"token": "u1"})
    with pytest.raises(ValueError, match="serializer"):
        stream.StreamWriter(tmp_path / "d", metadata="yaml")
    with stream.StreamWriter(tmp_path / "e") as writer, pytest.raises(ValueError, match="metadata"):
        writer.add_document([1], metadata="x")


def test_refuses_existing_dataset(tmp_path: Path) -> None:
    write(tmp_path / "ds", Corpus([np.arange(3)]), metadata=None, mask=False)
    with pytest.raises(FileExistsError):
        stream.StreamWriter(tmp_path / "ds")


def test_failed_writer_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), stream.StreamWriter(tmp_path / "ds", shard_tokens=2) as w:
        for i in range(5):
            w.add_document([i, i])
        raise RuntimeError("killed")
    assert os.listdir(tmp_path / "ds") == []


def test_files_checksummed_and_no_temporaries(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(0), docs=30, max_len=20, spans=True)
    path = write(tmp_path / "ds", corpus, shard_tokens=50)
    names = sorted(os.listdir(path))
    assert not [n for n in names if n.startswith(".")]
    manifest = stream.open_dataset(path).manifest
    assert len(names) == 1 + 5 * len(manifest.shards)
    assert all(len(s.files) == 5 for s in manifest.shards)
    assert stream.verify(path) == []


def test_combine_equals_one_writer(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(5), docs=24, max_len=30, spans=True)
    whole = stream.open_dataset(write(tmp_path / "whole", corpus, shard_tokens=60))
    parts = []
    for k in range(3):
        part = Corpus(corpus.docs[k * 8 : k * 8 + 8], corpus.spans[k * 8 : k * 8 + 8],
                      corpus.masks[k * 8 : k * 8 + 8])
        parts.append(write(tmp_path / f"part{k}", part, shard_tokens=45))
    combined = stream.open_dataset(stream.combine(parts, tmp_path / "all"))
    _assert_same_reads(whole, combined)
    assert stream.verify(tmp_path / "all") == []
    assert stream.verify(parts[0]) == []


def _assert_same_reads(a: stream.Dataset, b: stream.Dataset) -> None:
    assert (a.num_tokens, a.num_documents) == (b.num_tokens, b.num_documents)
    for seq_len in (1, 7, 64):
        wa, wb = a.windows(seq_len, columns="all"), b.windows(seq_len, columns="all")
        indices = np.arange(len(wa))[::-1]
        ba, bb = wa.read(indices), wb.read(indices)
        assert ba.fields == bb.fields
        for name in ba.fields:
            if name == "metadata":
                assert ba[name] == bb[name]
            elif name in ("cu_seqlens", "doc_ids"):
                np.testing.assert_array_equal(ba[name].values, bb[name].values)
                np.testing.assert_array_equal(ba[name].offsets, bb[name].offsets)
            else:
                np.testing.assert_array_equal(ba[name], bb[name])
    da, db = a.documents().read(np.arange(a.num_documents)), b.documents().read(
        np.arange(b.num_documents))
    np.testing.assert_array_equal(da["input_ids"].values, db["input_ids"].values)
    assert da["metadata"] == db["metadata"]


def _write_part(args: tuple[str, int]) -> str:
    path, k = args
    corpus = random_corpus(np.random.default_rng(100 + k), docs=10, max_len=40, spans=True)
    return str(write(Path(path), corpus, shard_tokens=70))


def test_parallel_writers_combined(tmp_path: Path) -> None:
    jobs = [(str(tmp_path / f"part{k}"), k) for k in range(4)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        parts = pool.map(_write_part, jobs)
    docs, spans, masks = [], [], []
    for k in range(4):
        corpus = random_corpus(np.random.default_rng(100 + k), docs=10, max_len=40, spans=True)
        docs += corpus.docs
        spans += corpus.spans
        masks += corpus.masks
    whole = stream.open_dataset(write(tmp_path / "whole", Corpus(docs, spans, masks)))
    _assert_same_reads(whole, stream.open_dataset(stream.combine(parts, tmp_path / "all")))


def test_combine_rejects_mismatch(tmp_path: Path) -> None:
    a = write(tmp_path / "a", Corpus([np.arange(3)]), metadata=None, mask=False)
    with stream.StreamWriter(tmp_path / "b", token_dtype="<u4") as writer:
        writer.add_document([1, 2])
    with stream.StreamWriter(tmp_path / "c", tokenizer={"name": "x"}) as writer:
        writer.add_document([1, 2])
    with pytest.raises(ValueError, match="record dtype"):
        stream.combine([a, tmp_path / "b"], tmp_path / "out1")
    with pytest.raises(ValueError, match="tokenizer"):
        stream.combine([a, tmp_path / "c"], tmp_path / "out2")
    with pytest.raises(FileExistsError):
        stream.combine([a], tmp_path / "c")
