"""Hugging Face save_to_disk folders read in place: written by datasets'
own save_to_disk, compared with load_from_disk."""

from __future__ import annotations

import dataclasses
from unittest import mock

import datasets
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support._peers import check_against, check_each_once, upload

from zerobatch import FormatError, open_dataset
from zerobatch.peers import PeerDataset, arrow_ipc


def _rows(rng, count, vocab):
    return [rng.integers(0, vocab, int(rng.integers(0 if i % 17 == 5 else 1, 25))).tolist()
            for i in range(count)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two folders: int32 lists in two files of two record batches each, and
    int64 large lists with a text column beside them."""
    rng = np.random.default_rng(4)
    root = tmp_path_factory.mktemp("hf")
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    small = datasets.Dataset.from_dict({"input_ids": _rows(rng, 2300, 50_000)}, features=features)
    small.save_to_disk(str(root / "i32"), num_shards=2)
    large = datasets.Features({"text": datasets.Value("string"),
                               "ids": datasets.LargeList(datasets.Value("int64"))})
    rows = _rows(rng, 120, 300_000)
    wide = datasets.Dataset.from_dict({"text": ["x" * len(r) for r in rows], "ids": rows},
                                      features=large)
    wide.save_to_disk(str(root / "i64"))
    return root


def _reference(folder, column):
    loaded = datasets.load_from_disk(str(folder)).with_format("numpy")
    documents = [np.asarray(row, dtype=loaded.features[column].feature.dtype
                            if hasattr(loaded.features[column], "feature") else np.int64)
                 for row in loaded[column]]
    return np.concatenate(documents), documents


@pytest.mark.parametrize(("name", "column"), [("i32", "input_ids"), ("i64", "ids")])
def test_windows_and_documents_equal_load_from_disk(saved, name, column):
    tokens, documents = _reference(saved / name, column)
    options = {} if column == "input_ids" else {"column": column}
    with open_dataset(saved / name, **options) as ds:
        assert isinstance(ds, PeerDataset) and ds.format == "hf"
        assert ds.verify() == []
        assert ds.manifest.record_dtype.itemsize == (4 if name == "i32" else 8)
        tokens = tokens.astype(ds.manifest.record_dtype)
        check_against(ds, tokens, documents)
        check_each_once(ds)
        if name == "i32":
            assert len(ds.files.shards) > 2  # several record batches in each of two files


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.tuples(st.integers(0, 10**6), st.floats(0, 1)), min_size=1,
                      max_size=64))
def test_offsets_of_all_shards_at_once_equals_each_shards_own(saved, picks):
    """A batch of documents touches a record batch (a shard) per document:
    ``offsets_of`` reads every pair from the mapped files at once, and gives
    what each shard's own lookup gives, across both files of the folder."""
    with open_dataset(saved / "i32") as ds:
        files = ds.files
        assert files._flat is not None and len(set(files._flat[1])) == 2  # two files
        shards = np.array([p % len(files.shards) for p, _ in picks], np.int64)
        ids = np.array([round(f * files.shards[s].documents) for s, (_, f) in
                        zip(shards.tolist(), picks, strict=True)], np.int64)
        expected = [int(files.offsets(int(s), np.array([i]))[0]) for s, i in
                    zip(shards.tolist(), ids.tolist(), strict=True)]
        assert files.offsets_of(shards, ids).tolist() == expected


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(-3, 2400), max_size=48),
       max_len=st.sampled_from([0, 1, 5, 30]))
def test_documents_planned_in_one_kernel_as_shard_by_shard(saved, picks, max_len):
    """The one-kernel plan over the mapped offsets gives the generic plan's
    pieces, offsets and errors (an index out of range), any order, repeats
    and empty documents included."""
    with open_dataset(saved / "i32") as ds:
        index = ds._index
        assert ds.files.document_tables() is not None
        indices = np.array(picks, np.int64)
        fast = index.plan_documents(indices, max_len)
        ds.files._flat = None  # the generic path: offsets_of shard by shard
        slow = index.plan_documents(indices, max_len)
        np.testing.assert_array_equal(fast[0], slow[0])
        np.testing.assert_array_equal(fast[1], slow[1])
        assert fast[2:] == slow[2:]


def test_offsets_of_a_crafted_table_names_the_file(saved, tmp_path):
    """An offsets table whose entry lies below the record batch's first offset
    raises FormatError naming the file and column, on the one-call path too."""
    import shutil

    folder = tmp_path / "crafted"
    shutil.copytree(saved / "i32", folder)
    with open_dataset(folder) as ds:
        at, _, dtype = ds.files._offsets[1]
        first = ds.files._firsts[1]
        name = ds.files.shards[1].tokens
    with open(folder / name, "r+b") as handle:  # its fourth offset: below its first
        handle.seek(at + 3 * dtype.itemsize)
        handle.write(np.array([first - 1], dtype).tobytes())
    with open_dataset(folder) as ds:
        with pytest.raises(FormatError, match="before the batch's first row") as error:
            ds.files.offsets_of(np.array([0, 1], np.int64), np.array([0, 3], np.int64))
        assert error.value.path.endswith(name) and error.value.field == "input_ids"
        with pytest.raises(FormatError) as error:  # reading them: the one-kernel plan
            ds.documents().read(np.arange(ds.num_documents))
        assert error.value.path.endswith(name)


def test_one_arrow_file_and_errors(saved, tmp_path):
    arrow = sorted((saved / "i32").glob("*.arrow"))[0]
    with open_dataset(arrow) as ds:
        rows = datasets.Dataset.from_file(str(arrow))["input_ids"]
        assert ds.num_documents == len(rows)  # one document per row, empty rows too
        got = ds.documents().read(np.arange(len(rows)))["input_ids"]
        assert [list(np.asarray(d)) for d in got] == [list(row or []) for row in rows]
    with pytest.raises(FormatError, match="no column 'input_ids'"):
        open_dataset(saved / "i64")
    with pytest.raises(FormatError, match="list of integers"):
        open_dataset(saved / "i64", column="text")
    bad = tmp_path / "cut.arrow"
    bad.write_bytes(arrow.read_bytes()[:-300])
    with pytest.raises(FormatError, match=r"past the file's .*truncated") as error:
        open_dataset(bad)
    assert error.value.path.endswith("cut.arrow") and error.value.field == "message"
    bad.write_bytes(b"\xff\xff\xff\xff" + b"\x7f" * 64)
    with pytest.raises(FormatError):
        open_dataset(bad)


@pytest.fixture(scope="module")
def batches_file(tmp_path_factory):
    """The bytes of one Arrow file of six record batches (datasets writes
    1,000 rows a batch: the last one shorter), varied row lengths."""
    rng = np.random.default_rng(9)
    root = tmp_path_factory.mktemp("hf-batches")
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    datasets.Dataset.from_dict({"input_ids": _rows(rng, 5500, 50_000)},
                               features=features).save_to_disk(str(root), num_shards=1)
    (arrow,) = root.glob("*.arrow")
    return arrow.read_bytes()


def _walk(data):
    """read_batches over ``data``: (layout, every ListBatches column) or the
    FormatError's (message, field)."""
    def read(offset, count):
        return data[offset:offset + count] if offset >= 0 else b""

    try:
        layout, found = arrow_ipc.read_batches(read, len(data), "input_ids", "f.arrow")
    except FormatError as error:
        return str(error), error.field
    return layout, {f.name: getattr(found, f.name).tolist() for f in dataclasses.fields(found)}


def test_walk_parses_the_first_record_batch_and_matches_the_rest(batches_file):
    """The walk finds the buffers pyarrow finds in every record batch; it
    parses the first batch's flatbuffer alone and reads the others by its
    template, one read each (header and both end offsets)."""
    import pyarrow as pa

    reads, parsed = [], []
    real = arrow_ipc._record_batch

    def read(offset, count):
        reads.append(offset)
        return batches_file[offset:offset + count]

    def record_batch(*args):
        parsed.append(args[1])
        return real(*args)

    with mock.patch.object(arrow_ipc, "_record_batch", record_batch):
        _, found = arrow_ipc.read_batches(read, len(batches_file), "input_ids", "f.arrow")
    batches = pa.ipc.open_stream(batches_file).read_all().to_batches()
    assert found.rows.tolist() == [b.num_rows for b in batches] and len(batches) == 6
    for i, batch in enumerate(batches):
        column = batch.column(0)
        offsets = column.offsets.to_numpy()
        assert (found.first[i], found.last[i]) == (offsets[0], offsets[-1])
        values = np.frombuffer(batches_file, np.int32, int(offsets[-1] - offsets[0]),
                               int(found.values_at[i]) + 4 * int(offsets[0]))
        assert np.array_equal(values, column.values.to_numpy())
    assert len(parsed) == 1
    # the magic, the schema, the first batch and its offsets, five batches, the end
    assert len(reads) == 1 + 1 + 2 + 5 + 1


def _header_spans(data):
    """(start, end) of every message's prefix and metadata: the continuation
    markers (int32 tokens under 50,000 never hold four 0xFF bytes)."""
    spans, at = [], data.find(b"\xff\xff\xff\xff")
    while at >= 0:
        length = int(np.frombuffer(data, "<i4", 1, at + 4)[0])
        if length > 0:
            spans.append((at, at + 8 + length))
        at = data.find(b"\xff\xff\xff\xff", at + 8 + max(length, 0))
    return spans


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1,
                      max_size=3))
def test_template_walk_equals_a_parse_of_every_message(batches_file, edits):
    """Bytes of the record batches' headers changed at random (the first one's
    too: the template's): the walk by the first batch's template gives
    exactly what parsing every message's flatbuffer gives, the same columns
    or the same FormatError."""
    spans = _header_spans(batches_file)[1:]  # after the schema
    assert len(spans) == 6
    mutated = bytearray(batches_file)
    total = sum(end - start for start, end in spans)
    for where, value in edits:
        k = where % total
        for start, end in spans:
            if k < end - start:
                mutated[start + k] = value
                break
            k -= end - start
    data = bytes(mutated)
    walked = _walk(data)
    with mock.patch.object(arrow_ipc._Template, "match", lambda self, chunk: None):
        assert walked == _walk(data)


def test_a_first_batch_whose_numbers_overlap_is_parsed_each_time(batches_file):
    """A crafted first record batch whose nodes vector lies on its buffers
    vector (the fuzzer's case: one number read twice) makes no template:
    the walk gives what the parse gives, never an error of its own."""
    import struct

    start, end = _header_spans(batches_file)[1]
    metadata = batches_file[start + 8:end]
    message = arrow_ipc._Table(metadata, struct.unpack_from("<I", metadata)[0], "f", "message")
    header = message.table(2, "header")
    nodes_slot, (buffers_at, _) = header.slot(1), header.vector(2)
    mutated = bytearray(batches_file)  # the nodes' offset: to the buffers' count
    struct.pack_into("<I", mutated, start + 8 + nodes_slot, buffers_at - 4 - nodes_slot)
    walked = _walk(bytes(mutated))
    with mock.patch.object(arrow_ipc._Template, "match", lambda self, chunk: None):
        assert walked == _walk(bytes(mutated))


@pytest.mark.parametrize(("name", "column"), [("i32", "input_ids"), ("i64", "ids")])
def test_from_s3_equals_load_from_disk(saved, s3, s3_proxy, name, column):
    """Arrow files on S3 open by range reads of their message headers (no
    object fetched whole) and read what load_from_disk reads from the same
    files; the header walk finds the buffers pyarrow finds."""
    from zerobatch.peers.hf import HFFiles

    tokens, documents = _reference(saved / name, column)
    url = upload(saved / name, s3)
    options = {} if column == "input_ids" else {"column": column}
    s3_proxy.reset_counts()
    with open_dataset(url, storage_options=s3.storage_options(s3_proxy.endpoint),
                      **options) as remote, open_dataset(saved / name, **options) as local:
        assert isinstance(remote, PeerDataset) and remote.format == "hf"
        assert isinstance(remote.files, HFFiles) and isinstance(local.files, HFFiles)
        assert remote.files.shards == local.files.shards  # the same buffers, found by range
        assert remote.files._offsets == local.files._offsets
        check_against(remote, tokens.astype(remote.manifest.record_dtype), documents)
        assert remote.fingerprint == local.fingerprint and remote.verify() == []
    gets = [r for r in s3_proxy.requests if r[0] == "GET" and r[1].endswith(".arrow")]
    assert gets and all(r[2] is not None for r in gets)  # ranges, never a whole file


def test_from_s3_hostile_streams(saved, s3, tmp_path):
    arrow = sorted((saved / "i32").glob("*.arrow"))[0]
    raw = arrow.read_bytes()
    folder = tmp_path / "bad"
    folder.mkdir()
    cases = {"cut.arrow": raw[:-300], "head.arrow": raw[:40], "noise.arrow":
             b"\xff\xff\xff\xff" + b"\x7f" * 64, "zeros.arrow": raw[:8] + bytes(len(raw) - 8)}
    for name, data in cases.items():
        (folder / name).write_bytes(data)
    url = upload(folder, s3)
    for name in cases:
        with pytest.raises(FormatError) as error:
            open_dataset(f"{url}/{name}", storage_options=s3.storage_options())
        assert error.value.path.endswith(name) and error.value.field


@pytest.mark.parametrize("files", ["", {}, "data-00000-of-00002.arrow", None])
def test_state_whose_data_files_is_not_a_list_is_refused(saved, tmp_path, files):
    """A state.json whose _data_files is not a list of {filename} is a FormatError
    naming it (a string was iterated as no file at all: an empty dataset)."""
    import json
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(saved / "i32", folder)
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, "_data_files": files}))
    with pytest.raises(FormatError, match="_data_files") as error:
        open_dataset(folder)
    assert error.value.field == "_data_files" and str(error.value.path).endswith("state.json")
