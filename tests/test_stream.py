"""Token-stream datasets: reads agree with a plain NumPy model of the corpus."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stream_helpers import Corpus, random_corpus, write

from zerobatch import stream
from zerobatch.columnar import Batch, BatchMeta, Jagged
from zerobatch.shuffle import Feistel

_settings = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def _same_as_validated(batch: Batch) -> None:
    """The reader's unchecked fast path builds what the validating constructors build."""
    Batch(batch.meta, batch.to_numpy())  # every column matches its schema
    indexes = np.asarray(batch.meta.global_indexes)
    again = Batch.from_columns(batch.to_numpy(), BatchMeta(indexes, production_status=np.ones(
        len(indexes))))
    assert batch.fields == again.fields
    for name in batch.fields:
        ours, theirs = batch.meta.field_schema[name], again.meta.field_schema[name]
        assert ours == theirs and str(ours.dtype) == str(theirs.dtype), name
    assert batch.meta.partition_ids == again.meta.partition_ids
    np.testing.assert_array_equal(batch.meta.production_status, again.meta.production_status)
    assert batch.meta.extra_info == again.meta.extra_info == {}
    assert batch.meta.custom_meta == again.meta.custom_meta == {}
    for name in set(batch.fields) & {"cu_seqlens", "doc_ids"}:
        if not isinstance(batch[name], Jagged):  # a document's id: one per row
            continue
        assert batch[name].offsets[0] == 0 and (np.diff(batch[name].offsets) >= 0).all()


def _check_windows(ds: stream.Dataset, corpus: Corpus, seq_len: int, stride: int,
                   indices: np.ndarray) -> None:
    windows = ds.windows(seq_len, stride=stride, columns="all")
    batch = windows.read(indices)
    _same_as_validated(batch)
    assert batch.meta.global_indexes.tolist() == indices.tolist()
    segments = 0  # seq_idx numbers the batch's segments row after row
    for row, i in enumerate(indices.tolist()):
        want = corpus.window(i * stride, seq_len)
        np.testing.assert_array_equal(batch["seq_idx"][row], want["seq_idx"] + segments)
        segments += len(want["cu_seqlens"]) - 1
        assert batch["max_seqlen"][row] == want["max_seqlen"]
        np.testing.assert_array_equal(batch["input_ids"][row], want["input_ids"])
        np.testing.assert_array_equal(batch["labels"][row], want["labels"])
        np.testing.assert_array_equal(batch["position_ids"][row], want["position_ids"])
        np.testing.assert_array_equal(batch["cu_seqlens"][row], want["cu_seqlens"])
        np.testing.assert_array_equal(batch["doc_ids"][row], want["doc_ids"])
        mask = np.concatenate(corpus.masks)[i * stride : i * stride + seq_len]
        np.testing.assert_array_equal(batch["loss_mask"][row], mask)
        if ds.has_metadata:
            assert batch["metadata"][row] == want["metadata"]


@_settings
@given(seed=st.integers(0, 2**32 - 1), docs=st.integers(1, 30), max_len=st.integers(1, 40),
       shard_tokens=st.integers(1, 120), seq_len=st.integers(1, 50), stride=st.integers(1, 60),
       spans=st.booleans())
def test_windows_match_concatenation(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                     docs: int, max_len: int, shard_tokens: int, seq_len: int,
                                     stride: int, spans: bool) -> None:
    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng, docs=docs, max_len=max_len, spans=spans)
    path = write(tmp_path_factory.mktemp("ds") / "ds", corpus,
                 metadata="msgpack" if spans else None, shard_tokens=shard_tokens)
    with stream.open_dataset(path) as ds:
        count = len(corpus.tokens)
        windows = ds.windows(seq_len, stride=stride, columns="all")
        assert len(windows) == max(0, (count - seq_len - 1) // stride + 1)
        if len(windows):
            order = Feistel(len(windows), seed)(np.arange(len(windows)))
            _check_windows(ds, corpus, seq_len, stride, order)
            _check_windows(ds, corpus, seq_len, stride, np.repeat(order[:1], 3))


def test_windows_cross_documents_and_shards(tmp_path: Path) -> None:
    corpus = Corpus([np.arange(1, 6), np.arange(10, 13), np.arange(20, 30)],
                    spans=[[(1, 4, "a")], [(0, 3, "b")], [(0, 2, "c"), (5, 10, "d")]],
                    masks=[np.ones(5, np.uint8), np.zeros(3, np.uint8), np.ones(10, np.uint8)])
    path = write(tmp_path / "ds", corpus, shard_tokens=4)
    ds = stream.open_dataset(path)
    assert len(ds.manifest.shards) == 3
    batch = ds.windows(8, stride=3, columns="all").read([1])
    assert batch["input_ids"][0].tolist() == [4, 5, 10, 11, 12, 20, 21, 22]
    assert batch["labels"][0].tolist() == [5, 10, 11, 12, 20, 21, 22, 23]
    assert batch["position_ids"][0].tolist() == [0, 1, 0, 1, 2, 0, 1, 2]
    assert batch["cu_seqlens"][0].tolist() == [0, 2, 5, 8]
    assert batch["doc_ids"][0].tolist() == [0, 1, 2]
    assert batch["metadata"][0] == [(0, 1, "a"), (2, 5, "b"), (5, 7, "c")]
    assert batch["loss_mask"][0].tolist() == [1, 1, 0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("dtype", ["int64", "int32", "stored"])
def test_token_dtypes(tmp_path: Path, dtype: str) -> None:
    corpus = random_corpus(np.random.default_rng(1), docs=5, max_len=20)
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None, mask=False,
                                   shard_tokens=16))
    batch = ds.windows(8, dtype=dtype, columns="all").read([0, 2])
    inputs, labels = batch["input_ids"], batch["labels"]
    assert inputs.dtype == {"int64": np.int64, "int32": np.int32, "stored": np.uint16}[dtype]
    np.testing.assert_array_equal(inputs[1], corpus.tokens[16:24])
    np.testing.assert_array_equal(labels[1], corpus.tokens[17:25])
    assert np.shares_memory(inputs, labels) == (dtype == "stored")
    _same_as_validated(batch)
    _same_as_validated(ds.windows(8, dtype=dtype, columns="all").read([]))
    assert batch.to_torch()["input_ids"].shape == (2, 8)


def test_labels_false_and_short_dataset(tmp_path: Path) -> None:
    corpus = Corpus([np.arange(10)])
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None, mask=False))
    assert len(ds.windows(10, columns="all")) == 0
    windows = ds.windows(10, labels=False, columns="all")
    assert len(windows) == 1
    batch = windows.read([0])
    _same_as_validated(batch)
    assert "labels" not in batch.fields
    assert batch["input_ids"][0].tolist() == list(range(10))
    with pytest.raises(IndexError, match="out of range"):
        windows.read([1])


@_settings
@given(seed=st.integers(0, 2**32 - 1), shard_tokens=st.integers(1, 80),
       max_len=st.sampled_from([None, 1, 7]))
def test_documents(tmp_path_factory: pytest.TempPathFactory, seed: int, shard_tokens: int,
                   max_len: int | None) -> None:
    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng, docs=20, max_len=30, spans=True)
    path = write(tmp_path_factory.mktemp("ds") / "ds", corpus, shard_tokens=shard_tokens)
    documents = stream.open_dataset(path).documents(max_len=max_len)
    assert len(documents) == 20
    order = rng.permutation(20)
    batch = documents.read(order)
    limit = max_len or 10**9
    for row, i in enumerate(order.tolist()):
        np.testing.assert_array_equal(batch["input_ids"][row], corpus.docs[i][:limit])
        np.testing.assert_array_equal(batch["loss_mask"][row], corpus.masks[i][:limit])
        want = [(a, min(b, limit), v) for a, b, v in corpus.spans[i] if a < limit]
        assert batch["metadata"][row] == want
    assert batch["doc_ids"].tolist() == order.tolist()


@_settings
@given(seed=st.integers(0, 2**32 - 1), shard_tokens=st.integers(1, 80),
       max_len=st.sampled_from([None, 1, 7]), dtype=st.sampled_from(["int64", "int32"]),
       token_dtype=st.sampled_from(["<u2", "<u4"]))
def test_plain_documents_are_built_as_from_columns_builds_them(
        tmp_path_factory: pytest.TempPathFactory, seed: int, shard_tokens: int,
        max_len: int | None, dtype: str, token_dtype: str) -> None:
    """Documents of tokens alone (no fields, no metadata) skip the batch's
    checks: what they build equals what the checked constructors build, rows
    included, for any order with repeats and any max_len."""
    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng, docs=20, max_len=30)
    path = write(tmp_path_factory.mktemp("ds") / "ds", corpus, metadata=None, mask=False,
                 shard_tokens=shard_tokens, token_dtype=token_dtype)
    documents = stream.open_dataset(path).documents(max_len=max_len, dtype=dtype)
    assert documents._trusted_dtype is not None  # the unchecked path
    order = rng.integers(0, 20, size=int(rng.integers(0, 40)))
    batch = documents.read(order)
    _same_as_validated(batch)
    assert batch.fields == ["input_ids", "doc_ids"] and batch["input_ids"].dtype == dtype
    limit = max_len or 10**9
    for row, i in enumerate(order.tolist()):
        np.testing.assert_array_equal(batch["input_ids"][row], corpus.docs[i][:limit])
    assert batch["doc_ids"].tolist() == order.tolist() == batch.meta.global_indexes


def test_document_metadata(tmp_path: Path) -> None:
    with stream.StreamWriter(tmp_path / "ds", metadata="json") as writer:
        assert writer.add_document([1, 2, 3], metadata={"url": "a"}) == 0
        assert writer.add_document([4, 5]) == 1
        assert writer.add_document([6], metadata=["b"]) == 2
    ds = stream.open_dataset(tmp_path / "ds")
    assert ds.documents().read([0, 1, 2])["metadata"] == [
        [(0, 3, {"url": "a"})], [], [(0, 1, ["b"])]
    ]
    assert ds.windows(4, columns="all").read([0])["metadata"] == [[(0, 3, {"url": "a"})]]


class _Upper:
    """A custom serializer: str values stored upper-case."""

    def dumps(self, value: str) -> bytes:
        return value.upper().encode()

    def loads(self, data: bytes | memoryview) -> str:
        return bytes(data).decode()


@pytest.mark.parametrize(("serializer", "value", "back"), [
    ("msgpack", {"c": [1, 2]}, {"c": [1, 2]}),
    ("json", {"c": [1, 2]}, {"c": [1, 2]}),
    ("bytes", b"\x00abc", b"\x00abc"),
    ("pickle", {1, 2}, {1, 2}),
    (_Upper(), "abc", "ABC"),
])
def test_serializers(tmp_path: Path, serializer: object, value: object, back: object) -> None:
    with stream.StreamWriter(tmp_path / "ds", metadata=serializer) as writer:
        writer.add_document([1, 2, 3], spans=[(1, 2, value)])
    reader_option = serializer if not isinstance(serializer, str) or serializer == "pickle" \
        else None
    if reader_option is not None:
        with pytest.raises(ValueError, match="metadata"):
            stream.open_dataset(tmp_path / "ds")
    ds = stream.open_dataset(tmp_path / "ds", metadata=reader_option)
    assert ds.documents().read([0])["metadata"] == [[(1, 2, back)]]


def test_numpy_serializer(tmp_path: Path) -> None:
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    with stream.StreamWriter(tmp_path / "ds", metadata="numpy") as writer:
        writer.add_document([1, 2], spans=[(0, 2, value)])
    windows = stream.open_dataset(tmp_path / "ds").windows(1, columns=["metadata"])
    [[(start, end, got)]] = windows.read([0])["metadata"]
    assert (start, end) == (0, 1)
    np.testing.assert_array_equal(got, value)


def test_u4_tokens_and_tokenizer(tmp_path: Path) -> None:
    tokenizer = {"name": "t", "vocab_size": 100_000, "eos_id": 0, "bos_id": None}
    with pytest.raises(ValueError, match="does not fit"):
        stream.StreamWriter(tmp_path / "a", tokenizer=tokenizer)
    with stream.StreamWriter(tmp_path / "b", token_dtype="<u4", tokenizer=tokenizer) as writer:
        writer.add_document([99_999, 0, 70_000])
        with pytest.raises(ValueError, match="tokens must be in"):
            writer.add_document([100_000])
    ds = stream.open_dataset(tmp_path / "b")
    assert ds.manifest.tokenizer == stream.Tokenizer("t", 100_000, 0, None)
    assert ds.windows(2, columns="all").read([0])["input_ids"].tolist() == [[99_999, 0]]


def test_threads_read_concurrently(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(3), docs=40, max_len=50, spans=True)
    path = write(tmp_path / "ds", corpus, shard_tokens=64)
    alone = stream.open_dataset(path).windows(16, columns="all")
    expected = [alone.read([i]) for i in range(len(alone))]
    windows = stream.open_dataset(path).windows(16, columns="all")  # files open under the threads

    def check(batch: Any, row: int, i: int) -> None:
        np.testing.assert_array_equal(batch["input_ids"][row], expected[i]["input_ids"][0])
        assert batch["metadata"][row] == expected[i]["metadata"][0]

    _read_from_threads(windows, check)


def _read_from_threads(windows: Any, check: Callable[[Any, int, int], None]) -> None:
    """Four threads read every window of ``windows`` in their own shuffled
    chunks at once; ``check(batch, row, index)`` runs on each row; any failure
    in a thread fails the test."""
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            order = np.random.default_rng(seed).permutation(len(windows))
            for chunk in np.array_split(order, 8):
                batch = windows.read(chunk)
                for row, i in enumerate(chunk.tolist()):
                    check(batch, row, i)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


def test_empty_dataset(tmp_path: Path) -> None:
    with stream.StreamWriter(tmp_path / "ds", metadata="msgpack"):
        pass
    ds = stream.open_dataset(tmp_path / "ds")
    assert (ds.num_tokens, len(ds.windows(4, columns="all")), len(ds.documents())) == (0, 0, 0)
    assert stream.verify(tmp_path / "ds") == []


def test_closed_dataset_refuses_reads(tmp_path: Path) -> None:
    ds = stream.open_dataset(write(tmp_path / "ds", Corpus([np.arange(20)]), metadata=None,
                                   mask=False))
    windows = ds.windows(4, columns="all")
    windows.read([0])
    ds.close()
    ds.close()
    with pytest.raises(ValueError, match="closed"):
        windows.read([1])


def test_batch_buffers_recycled_only_when_unused(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(9), docs=20, max_len=50)
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None))
    windows = ds.windows(16, columns="all")
    first = windows.read([0, 1])
    kept = first["input_ids"].copy()
    second = windows.read([2, 3])
    assert not np.shares_memory(first["input_ids"], second["input_ids"])
    third = windows.read([4, 5])
    np.testing.assert_array_equal(first["input_ids"], kept)
    address = first["input_ids"].ctypes.data
    del first
    again = windows.read([6, 7])
    assert again["input_ids"].ctypes.data == address  # the idle buffer came back
    for batch, start in ((second, 32), (third, 64), (again, 96)):
        np.testing.assert_array_equal(batch["input_ids"][0], corpus.tokens[start : start + 16])


def test_documents_survive_later_reads(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(4), docs=10, max_len=30)
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None))
    kept = [ds.documents(dtype=dtype).read([3, 1]) for dtype in ("int64", "int32", "stored")]
    for i in range(20):
        ds.documents().read([i % 10])
        ds.windows(8, columns="all").read([i % len(ds.windows(8))])
    for batch in kept:
        np.testing.assert_array_equal(batch["input_ids"][0], corpus.docs[3])
        np.testing.assert_array_equal(batch["input_ids"][1], corpus.docs[1])


def test_many_spans_per_window(tmp_path: Path) -> None:
    with stream.StreamWriter(tmp_path / "ds", metadata="msgpack", shard_tokens=700) as writer:
        for d in range(3):
            writer.add_document(np.arange(600) % 50,
                                spans=[(t, t + 1, d * 1000 + t) for t in range(0, 600, 2)])
    windows = stream.open_dataset(tmp_path / "ds").windows(500, stride=250, columns="all")
    batch = windows.read(np.arange(len(windows)))
    for row, i in enumerate(range(len(windows))):
        start = i * 250
        want = [(g - start, g - start + 1, (g // 600) * 1000 + g % 600)
                for g in range(start, start + 500) if g % 2 == 0]
        assert batch["metadata"][row] == want


@pytest.mark.parametrize("method", ["pread", "mmap"])
def test_both_storage_methods_read_the_same(tmp_path: Path, method: str) -> None:
    from zerobatch.storage import LocalStorage

    corpus = random_corpus(np.random.default_rng(5), docs=40, max_len=300, spans=True)
    path = write(tmp_path / "ds", corpus, metadata="msgpack", shard_tokens=1000)
    storage = LocalStorage(path, method=method)  # type: ignore[arg-type]
    with stream.open_dataset(path, storage=storage) as ds:
        windows = ds.windows(64, stride=50, columns="all")
        _check_windows(ds, corpus, 64, 50, Feistel(len(windows), 3)(np.arange(len(windows))))


_ALL_WINDOW_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen",
                       "seq_idx", "doc_ids", "loss_mask", "metadata")


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shard_tokens=st.integers(1, 80),
       seq_len=st.integers(1, 40), stride=st.integers(1, 50),
       dtype=st.sampled_from(["int64", "int32", "stored"]), spans=st.booleans(),
       picks=st.lists(st.sampled_from(_ALL_WINDOW_COLUMNS), min_size=1, max_size=9))
def test_window_columns_on_request(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                   shard_tokens: int, seq_len: int, stride: int, dtype: str,
                                   spans: bool, picks: list[str]) -> None:
    """Any subset of columns, in any order, equals those columns of the full batch."""
    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng, docs=12, max_len=30, spans=spans)
    path = write(tmp_path_factory.mktemp("ds") / "ds", corpus,
                 metadata="msgpack" if spans else None, shard_tokens=shard_tokens)
    ds = stream.open_dataset(path)
    picks = [name for name in picks if spans or name != "metadata"] or ["labels"]
    full = ds.windows(seq_len, stride=stride, dtype=dtype, columns="all")
    some = ds.windows(seq_len, stride=stride, dtype=dtype, columns=picks)
    assert some.columns == tuple(name for name in full.columns if name in picks)
    if not len(full):
        return
    indices = rng.integers(0, len(full), size=int(rng.integers(0, 9)))
    want, got = full.read(indices), some.read(indices)
    _same_as_validated(got)
    assert got.fields == list(some.columns)
    assert got.meta.global_indexes.tolist() == indices.tolist()
    for name in got.fields:
        assert got.meta.field_schema[name] == want.meta.field_schema[name], name
        if name == "metadata":
            assert list(got[name]) == list(want[name])
        elif name in ("cu_seqlens", "doc_ids"):
            np.testing.assert_array_equal(got[name].values, want[name].values)
            np.testing.assert_array_equal(got[name].offsets, want[name].offsets)
        else:
            np.testing.assert_array_equal(got[name], want[name])


def test_window_columns_refuse_bad_names(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(2), docs=4, max_len=20)
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None))
    with pytest.raises(ValueError, match=r"'tokens'.*input_ids, labels, position_ids"):
        ds.windows(4, columns=("input_ids", "tokens"))
    with pytest.raises(ValueError, match="'metadata'"):  # this dataset has no span metadata
        ds.windows(4, columns=["metadata"])
    with pytest.raises(ValueError, match="'labels'"):
        ds.windows(4, labels=False, columns=["labels"])
    with pytest.raises(ValueError, match="sequence of names"):
        ds.windows(4, columns="input_ids")
    with pytest.raises(ValueError, match="empty"):
        ds.windows(4, columns=())


def test_tokens_only_never_read_document_offsets(tmp_path: Path) -> None:
    """Without position_ids, cu_seqlens and doc_ids the document offsets are
    never read; with position_ids alone broken ones are still reported."""
    corpus = random_corpus(np.random.default_rng(3), docs=6, max_len=30)
    path = write(tmp_path / "ds", corpus, metadata=None)
    ds = stream.open_dataset(path)
    docs = path / "00000.docs"
    docs.write_bytes(docs.read_bytes()[:-8])  # after opening: sizes are checked at open
    batch = ds.windows(8, columns=("input_ids", "labels")).read([0, 1])
    np.testing.assert_array_equal(batch["labels"][1], corpus.tokens[9:17])
    from zerobatch.errors import FormatError

    with pytest.raises(FormatError, match=r"00000\.docs") as info:
        ds.windows(8, columns=("position_ids",)).read([0])
    assert info.value.field == "offsets"


_TOKEN_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen", "seq_idx")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shard_tokens=st.integers(1, 80),
       seq_len=st.integers(1, 40), stride=st.integers(1, 50),
       method=st.sampled_from(["pread", "mmap"]), dtype=st.sampled_from(["int64", "int32"]),
       stored=st.sampled_from(["<u2", "<u4"]),
       picks=st.lists(st.sampled_from(_TOKEN_COLUMNS), min_size=1, max_size=6))
def test_direct_windows_match_model(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                    shard_tokens: int, seq_len: int, stride: int, method: str,
                                    dtype: str, stored: str, picks: list[str]) -> None:
    """Cast token columns of a tokens-only dataset, read and cast window by
    window from local files, equal the NumPy model and the full batch."""
    from zerobatch.storage import LocalStorage

    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng, docs=12, max_len=30, vocab=2**16 if stored == "<u2" else 2**31)
    path = write(tmp_path_factory.mktemp("ds") / "ds", corpus, metadata=None, mask=False,
                 shard_tokens=shard_tokens, token_dtype=stored)
    if "input_ids" not in picks:
        picks.append("labels")  # position_ids alone reads no tokens: not this path
    ds = stream.open_dataset(path, storage=LocalStorage(path, method=method))  # type: ignore[arg-type]
    some = ds.windows(seq_len, stride=stride, dtype=dtype, columns=picks)
    assert some._direct
    full = ds.windows(seq_len, stride=stride, dtype=dtype, columns="all")
    if not len(full):
        return
    indices = rng.integers(0, len(full), size=int(rng.integers(0, 9)))
    got, want = some.read(indices), full.read(indices)
    _same_as_validated(got)
    assert got.fields == list(some.columns)
    for row, i in enumerate(indices.tolist()):
        model = corpus.window(i * stride, seq_len)
        for name in got.fields:
            if name in _TOKEN_COLUMNS[:2]:
                assert got[name].dtype == np.dtype(dtype)
            if name == "position_ids":  # int32 whatever dtype: half the bytes
                assert got[name].dtype == np.int32
            if name in ("input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen"):
                np.testing.assert_array_equal(got[name][row], model[name])
            np.testing.assert_array_equal(got[name][row], want[name][row])


@pytest.mark.parametrize("method", ["pread", "mmap"])
def test_direct_windows_truncated_shard(tmp_path: Path, method: str) -> None:
    """A token file cut after the dataset was opened: the direct read names it."""
    from zerobatch.errors import FormatError
    from zerobatch.storage import LocalStorage

    corpus = random_corpus(np.random.default_rng(4), docs=20, max_len=30)
    path = write(tmp_path / "ds", corpus, metadata=None, mask=False, shard_tokens=1000)
    ds = stream.open_dataset(path, storage=LocalStorage(path, method=method))  # type: ignore[arg-type]
    tokens = path / "00000.tokens"
    tokens.write_bytes(tokens.read_bytes()[:100])
    for columns in (("input_ids", "labels"), ("labels", "position_ids")):
        windows = ds.windows(8, columns=columns)
        np.testing.assert_array_equal(windows.read([2])["labels"][0], corpus.tokens[17:25])
        with pytest.raises(FormatError, match=r"00000\.tokens.*truncated") as info:
            windows.read([2, len(windows) - 1])
        assert info.value.field == "bytes"


@pytest.mark.parametrize("method", ["pread", "mmap"])
def test_direct_windows_from_threads(tmp_path: Path, method: str) -> None:
    from zerobatch.storage import LocalStorage

    corpus = random_corpus(np.random.default_rng(6), docs=60, max_len=50)
    path = write(tmp_path / "ds", corpus, metadata=None, mask=False, shard_tokens=40)
    ds = stream.open_dataset(path, storage=LocalStorage(path, method=method))  # type: ignore[arg-type]
    # Files open under the threads, and the storage's file table grows past 16 and 32.
    windows = ds.windows(16, columns=_TOKEN_COLUMNS)

    def check(batch: Any, row: int, i: int) -> None:
        model = corpus.window(i * 16, 16)
        for name in _TOKEN_COLUMNS:
            got = batch[name][row]
            if name == "seq_idx":  # numbered over the batch: from the row's first segment
                got = got - got[0]
            np.testing.assert_array_equal(got, model[name])

    _read_from_threads(windows, check)


def test_shard_table_rows_view_the_tables_and_hold_them() -> None:
    import gc

    from zerobatch._jit import njit
    from zerobatch.stream._tables import (
        bytes_at,
        join_tables,
        offsets_at,
        shard_tables,
        table_slices,
    )

    @njit
    def read(rows: np.ndarray, s: int) -> np.ndarray:
        return offsets_at(rows, s).copy()

    @njit
    def read_bytes(rows: np.ndarray, s: int) -> np.ndarray:
        return bytes_at(rows, s).copy()

    tables = [np.arange(n, dtype="<u8") * 7 for n in (3, 0, 5)]
    expected = [t.copy() for t in tables]
    rows = shard_tables(tables, "<u8")
    assert type(rows) is np.ndarray and rows.shape == (3, 2) and not rows.flags.writeable
    assert rows[2, 0] == tables[2].ctypes.data  # the tables themselves, not copies
    assert shard_tables([], "<u8").shape == (0, 2)
    del tables
    gc.collect()  # the rows hold the tables
    for s, table in enumerate(expected):
        np.testing.assert_array_equal(read(rows, s), table)
    values = np.arange(10, dtype="<u8")
    slices = table_slices(values, np.array([0, 4, 4]), np.array([4, 4, 10]), "<u8")
    with pytest.raises(ValueError, match=r"int64 .* 1-D contiguous uint64"):
        table_slices(values.view("<i8"), np.array([0]), np.array([1]), "<u8")
    blobs = shard_tables([np.frombuffer(b"abc", np.uint8), np.zeros(0, np.uint8)], np.uint8)
    assert read_bytes(blobs, 0).tobytes() == b"abc" and read_bytes(blobs, 1).size == 0
    del values
    joined = join_tables([rows, slices])
    del rows, slices
    gc.collect()
    assert [read(joined, s).tolist() for s in range(6)] == [
        *[t.tolist() for t in expected], [0, 1, 2, 3], [], [4, 5, 6, 7, 8, 9]]
    for bad in (np.arange(4, dtype="<i8"), np.zeros((2, 2), "<u8"), np.arange(8, dtype="<u8")[::2]):
        with pytest.raises(ValueError, match="1-D contiguous"):
            shard_tables([bad], "<u8")


def test_default_columns_and_document_masking(tmp_path: Path) -> None:
    """The default is what a pre-training step uses; document masking is one
    argument away, and a missing column's error names that argument."""
    corpus = random_corpus(np.random.default_rng(7), docs=8, max_len=30)
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None))
    assert ds.windows(8).columns == ("input_ids", "labels", "loss_mask")
    assert ds.windows(8, document_masking=True).columns == (
        "input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen", "loss_mask")
    assert ds.windows(8, columns=["seq_idx"], document_masking=True).columns == (
        "position_ids", "cu_seqlens", "max_seqlen", "seq_idx")
    batch = ds.windows(8).read([0, 1])
    with pytest.raises(KeyError, match=r"'cu_seqlens'.*document_masking=True"):
        batch["cu_seqlens"]
    with pytest.raises(KeyError, match=r"'doc_ids'.*columns=\(\.\.\., 'doc_ids'\)"):
        batch["doc_ids"]
    with pytest.raises(ValueError, match="document_masking"):
        ds.windows(8, document_masking="yes")  # type: ignore[arg-type]


@_settings
@given(seed=st.integers(0, 2**32 - 1), seq_len=st.integers(1, 40),
       mask=st.booleans(), shard_tokens=st.integers(1, 80),
       dtype=st.sampled_from(["int64", "int32"]))
def test_aligned_labels(tmp_path_factory: pytest.TempPathFactory, seed: int, seq_len: int,
                        mask: bool, shard_tokens: int, dtype: str) -> None:
    """``labels="aligned"``: labels are the input ids with -100 at each
    document's first token and wherever the loss mask is 0, on the direct
    path (tokens only) and the buffered one (with a loss_mask field)."""
    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng, docs=10, max_len=30)
    if not mask:
        corpus.masks[:] = [np.ones_like(m) for m in corpus.masks]
    path = write(tmp_path_factory.mktemp("ds") / "ds", corpus, metadata=None, mask=mask,
                 shard_tokens=shard_tokens)
    ds = stream.open_dataset(path)
    windows = ds.windows(seq_len, labels="aligned", dtype=dtype, document_masking=True)
    assert windows.labels == "aligned" and windows._direct is not mask
    assert len(windows) == (ds.num_tokens - seq_len) // seq_len + 1
    indices = rng.integers(0, len(windows), size=5) if len(windows) else np.zeros(0, np.int64)
    batch = windows.read(indices)
    _same_as_validated(batch)
    for row, i in enumerate(indices.tolist()):
        model = corpus.window(i * seq_len, seq_len)
        np.testing.assert_array_equal(batch["labels"][row], model["aligned_labels"])
        np.testing.assert_array_equal(batch["input_ids"][row], model["input_ids"])
        np.testing.assert_array_equal(batch["position_ids"][row], model["position_ids"])
    alone = ds.windows(seq_len, labels="aligned", dtype=dtype).read(indices)
    np.testing.assert_array_equal(alone["labels"], batch["labels"])
    assert windows.fingerprint != ds.windows(seq_len).fingerprint


def test_aligned_labels_refuse_stored_and_unknown(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(8), docs=4, max_len=20)
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None))
    with pytest.raises(ValueError, match="not 'stored'"):
        ds.windows(4, labels="aligned", dtype="stored")
    with pytest.raises(ValueError, match=r"'shifted'.*'aligned'"):
        ds.windows(4, labels="hf")
    assert ds.windows(4, labels=True).labels == "shifted"


def test_loader_outputs_the_varlen_contract(tmp_path: Path) -> None:
    """torch and numpy outputs: one flat int32 cu_seqlens over the flattened
    batch, a host int max_seqlen, no nested tensors, and no warning."""
    import warnings

    import torch

    from zerobatch import Loader

    corpus = random_corpus(np.random.default_rng(9), docs=40, max_len=30)
    ds = stream.open_dataset(write(tmp_path / "ds", corpus, metadata=None))
    windows = ds.windows(16, document_masking=True, columns=["seq_idx"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for output in ("torch", "numpy"):
            with Loader(windows, 4, seed=1, output=output) as loader:  # type: ignore[arg-type]
                for step, got in enumerate(loader):
                    indices = loader.plan.indices(0, step * 4, 0)[0]
                    cu = np.asarray(got["cu_seqlens"])
                    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == 4 * 16
                    assert not isinstance(got["cu_seqlens"], torch.Tensor) or \
                        not got["cu_seqlens"].is_nested
                    want = [0]
                    for row, i in enumerate(indices.tolist()):
                        model = corpus.window(i * 16, 16)
                        want += (model["cu_seqlens"][1:] + row * 16).tolist()
                    assert cu.tolist() == want
                    assert got["max_seqlen"] == int(np.diff(cu).max())
                    assert isinstance(got["max_seqlen"], int)
                    flat = np.asarray(got["seq_idx"]).reshape(-1)
                    np.testing.assert_array_equal(
                        flat, np.repeat(np.arange(len(cu) - 1), np.diff(cu)))
                    np.testing.assert_array_equal(
                        np.asarray(got["position_ids"]).reshape(-1),
                        np.arange(64) - np.repeat(cu[:-1], np.diff(cu)))
        with Loader(ds.windows(16), 4) as loader:
            got = next(iter(loader))
            assert list(got) == ["input_ids", "labels", "loss_mask"]
            with pytest.raises(KeyError, match="document_masking=True"):
                got["position_ids"]


def test_token_ids_that_do_not_fit_the_output_dtype(tmp_path: Path) -> None:
    """A ``<u4`` id >= 2**31 read as int32 raises FormatError naming the token
    file and the record, on both read paths; int64 reads it."""
    from zerobatch.errors import FormatError

    corpus = random_corpus(np.random.default_rng(10), docs=6, max_len=20, vocab=2**31)
    big = 2**32 - 7
    corpus.docs[2][3] = big
    at = sum(map(len, corpus.docs[:2])) + 3
    for mask in (False, True):  # the direct path, then the buffered one (a field)
        path = write(tmp_path / f"ds{mask}", corpus, metadata=None, mask=mask,
                     token_dtype="<u4")
        ds = stream.open_dataset(path)
        windows = ds.windows(4, dtype="int32")
        window = at // 4
        with pytest.raises(FormatError, match=rf"token id {big} at record {at} .*int32.*"
                                              "dtype='int64'") as info:
            windows.read([0, window])
        assert info.value.path is not None and str(info.value.path).endswith("00000.tokens")
        with pytest.raises(FormatError, match=str(big)):
            ds.windows(4, dtype="int32", document_masking=True).read([window])
        assert windows.read([0])["input_ids"].dtype == np.int32  # other windows read
        assert ds.windows(4).read([window])["input_ids"][0, at % 4] == big
        assert ds.windows(4, dtype="stored").read([window])["input_ids"][0, at % 4] == big


def _same_step(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, tuple):
            assert all(torch.equal(p, q) for p, q in zip(x, y, strict=True)), name
        elif isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), name
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            assert type(x) is type(y) and x == y, name


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), seq_len=st.integers(1, 40),
       stride=st.none() | st.integers(1, 40), mask=st.booleans(),
       document_masking=st.booleans(), dtype=st.sampled_from(["int64", "int32", "stored"]),
       labels=st.sampled_from(["shifted", "aligned", None]),
       columns=st.sampled_from([None, ("input_ids",), ("labels", "seq_idx"),
                                ("input_ids", "position_ids", "cu_seqlens", "max_seqlen")]),
       shard_tokens=st.sampled_from([50, 10_000]), padded=st.booleans(),
       output=st.sampled_from(["numpy", "torch"]))
def test_read_collated_equals_read_then_collate(
    tmp_path_factory: pytest.TempPathFactory, seed: int, seq_len: int, stride: int | None,
    mask: bool, document_masking: bool, dtype: str, labels: str | None,
    columns: tuple[str, ...] | None, shard_tokens: int, padded: bool, output: str,
) -> None:
    """The Loader's one-step read (``read_collated``, straight into the
    contract's columns) gives exactly ``collate(read(...))``, padding column
    included, over every column choice, dtype and label convention."""
    from zerobatch.source import read_indices

    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng, docs=int(rng.integers(1, 30)), max_len=60, vocab=30_000)
    path = write(tmp_path_factory.mktemp("collated") / "ds", corpus, mask=mask,
                 shard_tokens=shard_tokens)
    if labels is None and columns is not None and "labels" in columns:
        columns = ("input_ids", "seq_idx")
    if dtype == "stored" and labels == "aligned":
        dtype = "int64"
    try:
        windows = stream.open_dataset(path).windows(
            seq_len, stride=stride, labels=labels, dtype=dtype, columns=columns,
            document_masking=document_masking)
    except ValueError:
        return  # a combination the reader refuses up front (tested elsewhere)
    if len(windows) == 0:
        return
    indices = rng.integers(0, len(windows), size=int(rng.integers(1, 9))).astype(np.int64)
    padding = (rng.integers(0, 2, size=indices.shape[0]).astype(bool) if padded else None)
    expected = windows.collate(read_indices(windows, indices, padding), output)
    _same_step(expected, windows.read_collated(indices, padding, output))


def test_stored_tokens_of_records_with_other_fields_reach_torch(tmp_path: Path) -> None:
    """dtype="stored" over records of a token and a loss mask (3 bytes): the
    token column's row stride is no whole number of tokens, which
    ``torch.from_numpy`` refuses; the torch output copies such a column."""
    import torch

    from zerobatch import Loader

    corpus = random_corpus(np.random.default_rng(4), docs=12, max_len=40, vocab=30_000)
    windows = stream.open_dataset(write(tmp_path / "ds", corpus)).windows(8, dtype="stored")
    step = next(iter(Loader(windows, 4, seed=1)))
    expected = next(iter(Loader(windows, 4, seed=1, output="numpy")))
    assert step["input_ids"].dtype == torch.uint16
    np.testing.assert_array_equal(step["input_ids"].numpy(), expected["input_ids"])
