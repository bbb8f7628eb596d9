"""MosaicML Streaming (MDS) shards read in place: written by mosaicml-streaming's
own MDSWriter and compared with its own StreamingDataset, both run in a
separate environment (``support.mds_env``: the package cannot share the
project's). Building that environment needs the package registry once; without
it these tests fail, saying so."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import mds_env
from support._peers import check_against, check_each_once, check_same, upload

from zerobatch import FormatError, open_dataset
from zerobatch.cli import main
from zerobatch.peers import PeerDataset, copy_to_stream
from zerobatch.peers._base import LOOKUP_READS

# name -> (columns, size_limit, token column, token dtype, sample lengths)
DATASETS = {
    # tokens alone, dynamic shape: 1- and 2-byte shape headers, many shards (the
    # first empty: MDSWriter flushes one when a sample is over size_limit)
    "plain": ({"tokens": "ndarray:uint16"}, 1500, "tokens", "<u2",
              [800, 300, 7, 255, 256, 40, 3, 90, 12, 600, 5, 33, 1, 140]),
    # 4-byte shape headers (65,536 values or more)
    "wide": ({"tokens": "ndarray:uint16"}, 1 << 20, "tokens", "<u2",
             [70_000, 3, 65_536, 65_535]),
    # the token column after a fixed and a variable column (two size prefixes)
    "mixed": ({"id": "int64", "text": "str", "tokens": "ndarray:int32"}, 2000, "tokens", "<i4",
              [5, 1, 260, 17, 80, 2, 44, 9, 300, 61, 3, 128]),
    # llm-foundry's older layout: int64 tokens as bytes (dtype= given), empty samples too
    "bytes": ({"n": "int32", "tokens": "bytes"}, 900, "tokens", "<i8",
              [30, 0, 1, 70, 0, 12, 200, 5]),
    # a fixed shape, every column fixed: no table read at opening
    "fixed": ({"input_ids": "ndarray:uint32:16", "k": "uint8"}, 700, "input_ids", "<u4",
              [16] * 30),
    # shards of hundreds of samples, many of one token: the searches' two levels
    # (every COARSE-th sample, then the samples between), shard ends off the grid
    "many": ({"tokens": "ndarray:uint16"}, 9000, "tokens", "<u2",
             np.random.default_rng(5).integers(-6, 30, 900).clip(1).tolist()),
}


def _samples(name):
    columns, _, column, dtype, lengths = DATASETS[name]
    rng = np.random.default_rng(len(name))
    arrays = {}
    for i, n in enumerate(lengths):
        for c, encoding in columns.items():
            if c == column:
                value = rng.integers(0, 60_000, n).astype(dtype)
            elif encoding == "str":
                value = np.array("x" * int(rng.integers(0, 50)))
            else:
                value = np.array(i, dtype=encoding)
            arrays[f"{c}.{i}"] = value
    return arrays


@pytest.fixture(scope="session")
def mds(tmp_path_factory):
    """Each dataset written by MDSWriter, and per dataset the token column of
    every sample as MDS's StreamingDataset returns it: name -> (folder, samples)."""
    try:
        mds_env.python()
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)
    root = tmp_path_factory.mktemp("mds")
    jobs: dict[str, list] = {"write": [], "read": []}
    for name, (columns, limit, column, _, lengths) in DATASETS.items():
        np.savez(root / f"{name}.npz", **_samples(name))
        jobs["write"].append({"out": str(root / name), "columns": columns, "size_limit": limit,
                              "npz": str(root / f"{name}.npz"), "samples": len(lengths)})
        jobs["read"].append({"dir": str(root / name), "column": column,
                             "out": str(root / f"{name}.read.npz"), "dtype": DATASETS[name][3]})
    # MDSWriter's own 2-D samples (ndarray:uint16 takes any shape): refused.
    np.savez(root / "two.npz", **{"tokens.0": np.arange(6, dtype="<u2"),
                                  "tokens.1": np.arange(600, dtype="<u2").reshape(2, 300)})
    jobs["write"].append({"out": str(root / "two"), "columns": {"tokens": "ndarray:uint16"},
                          "size_limit": 1 << 20, "npz": str(root / "two.npz"), "samples": 2})
    (root / "jobs.json").write_text(json.dumps(jobs))
    mds_env.run("jobs", str(root / "jobs.json"))
    found = {"two": (root / "two", [])}
    for name, (_, _, _, _, lengths) in DATASETS.items():
        read = np.load(root / f"{name}.read.npz")
        found[name] = (root / name, [read[str(i)].reshape(-1) for i in range(len(lengths))])
    return found


@pytest.mark.parametrize("name", ["plain", "mixed", "fixed", "bytes", "many"])
def test_windows_and_documents_equal_mds_reader(mds, name):
    folder, samples = mds[name]
    _, _, _, dtype, lengths = DATASETS[name]
    assert [len(s) for s in samples] == lengths
    options = {"dtype": "int64"} if name == "bytes" else {}
    with open_dataset(folder, **options) as ds:
        assert isinstance(ds, PeerDataset) and ds.format == "mds"
        assert ds.files.dtype == np.dtype(dtype) and len(ds.files.shards) > 1
        if name == "plain":
            assert ds.files.shards[0].documents == 0  # an empty shard, as MDSWriter wrote it
        if name == "many":  # each shard's search has both levels
            from zerobatch.peers._kernels import COARSE
            assert min(s.documents for s in ds.files.shards[:-1]) > 4 * COARSE
        assert ds.verify() == []
        check_against(ds, np.concatenate(samples), samples)
        check_each_once(ds)
        assert "token column" in ds.describe()


def test_wide_shape_headers(mds):
    folder, samples = mds["wide"]
    with open_dataset(folder) as ds:
        assert ds.verify() == []
        check_against(ds, np.concatenate(samples), samples, seq_len=4099)


def test_fixed_layout_opens_from_index_alone(mds):
    folder, _ = mds["fixed"]
    with open_dataset(folder) as ds:
        assert ds.files._tables == {}  # no shard read yet
        ds.windows(8).read([0, 20])
        assert ds.files._tables == {}  # windows: arithmetic on the layout
        assert ds.num_documents == 30
        np.testing.assert_array_equal(ds.documents().read([29])["input_ids"][0],
                                      mds["fixed"][1][29])
        assert ds.files._tables == {}  # documents too


def test_column_option_and_copy(mds, tmp_path):
    folder, samples = mds["mixed"]
    with open_dataset(folder, format="mds", column="tokens") as ds:
        assert copy_to_stream(ds, tmp_path / "lib") == len(samples)
    # the command line: detected, the option passed through
    assert main(["convert", str(folder), "-o", str(tmp_path / "native"), "--quiet",
                 "--input-option", "column=tokens"]) == 0
    with open_dataset(tmp_path / "native") as native:
        got = native.documents().read(np.arange(len(samples)))["input_ids"]
        for a, b in zip(got, samples, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)
    with pytest.raises(FormatError, match="column_encodings"):
        open_dataset(folder, format="mds", column="text")
    with pytest.raises(ValueError, match="not a column"):
        open_dataset(folder, format="mds", column="nope")
    with pytest.raises(FormatError, match="dtype= reads a bytes column"):
        open_dataset(folder, format="mds", dtype="int32")  # mixed has no bytes column
    tokens_as_bytes, _ = mds["bytes"]
    with pytest.raises(FormatError, match="with dtype= for tokens stored as bytes"):
        open_dataset(tokens_as_bytes)
    with pytest.raises(ValueError, match="integer dtype"):
        open_dataset(tokens_as_bytes, dtype="float32")


def test_from_s3(mds, s3):
    for name in ("plain", "mixed", "fixed"):
        folder, _ = mds[name]
        url = upload(folder, s3)
        with open_dataset(folder) as local, \
                open_dataset(url, storage_options=s3.storage_options()) as remote:
            assert remote.format == "mds"
            check_same(local, remote)
            assert remote.verify() == []


def test_token_counts_cached_from_s3(mds, s3, tmp_path, monkeypatch):
    """Over object storage the cache is keyed by index.json alone: the second
    open of the same prefix reads no offsets table and every window equals
    the local files'."""
    monkeypatch.setattr("zerobatch.peers.mds.CACHE_FROM_SAMPLES", 0)
    folder, _ = mds["plain"]
    url = upload(folder, s3)
    cache = tmp_path / "cache"
    options = {"storage_options": s3.storage_options(), "cache_dir": cache}
    with open_dataset(url, **options) as first:
        assert not first.files._counts_cached
    reads = _counting_opens(monkeypatch)
    with open_dataset(url, **options) as remote:
        assert remote.files._counts_cached and reads == []
        with open_dataset(folder) as local:
            check_same(local, remote)


def _copy(mds, name, tmp_path):
    folder = tmp_path / name
    shutil.copytree(mds[name][0], folder)
    return folder, json.loads((folder / "index.json").read_text())


def test_hostile_index(mds, tmp_path):
    folder, index = _copy(mds, "mixed", tmp_path)
    cases = (
        (lambda x: x.update(version=3), "'version'"),
        (lambda x: x.update(shards={}), "'index'"),
        (lambda x: x["shards"][0].update(compression="zstd"), r"shards\[0\].compression"),
        (lambda x: x["shards"][1].update(format="json"), r"shards\[1\].format"),
        (lambda x: x["shards"][0]["raw_data"].update(basename="../x"), "basename"),
        (lambda x: x["shards"][0]["raw_data"].update(bytes=7), "'bytes'"),
        (lambda x: x["shards"][0].update(samples=-1), r"shards\[0\].samples"),
        (lambda x: x["shards"][0].update(column_sizes=[8, None]), "column_names"),
        (lambda x: x["shards"][0].update(column_sizes=[4, None, None]), r"column_sizes\[0\]"),
        # equal to shards[0]'s by == (8.0 == 8), yet no size in bytes: refused
        (lambda x: x["shards"][1].update(column_sizes=[8.0, None, None]),
         r"shards\[1\].column_sizes\[0\]"),
        (lambda x: x["shards"][1].update(column_encodings=["int64", "str", "ndarray:int16"]),
         r"shards\[1\].column_encodings"),
        (lambda x: [s.update(column_encodings=["int64", "str", "str"]) for s in x["shards"]],
         "column_encodings"),
        (lambda x: [s.update(column_encodings=["int64", "str", "ndarray:int32:0"])
                    for s in x["shards"]], "column_encodings"),
        (lambda x: x["shards"][0].update(samples=x["shards"][0]["samples"] + 1), "'samples'"),
    )
    for change, field in cases:
        bad = json.loads(json.dumps(index))
        change(bad)
        (folder / "index.json").write_text(json.dumps(bad))
        with pytest.raises(FormatError, match=field) as caught:
            open_dataset(folder, format="mds")
        assert str(folder) in str(caught.value)
    (folder / "index.json").write_text("{\"shards\": [")
    with pytest.raises(FormatError, match="index"):
        open_dataset(folder, format="mds")
    (folder / "index.json").unlink()
    with pytest.raises(FormatError, match="missing"):
        open_dataset(folder, format="mds")


def _shard(folder, index, i=0):
    path = folder / index["shards"][i]["raw_data"]["basename"]
    return path, bytearray(path.read_bytes())


def _shape_lie(mds, tmp_path, ndim):
    """A copy of "plain" whose shard 1 says sample 0 has ``ndim`` dimensions:
    (folder, that shard's path)."""
    folder, index = _copy(mds, "plain", tmp_path)
    path, good = _shard(folder, index, 1)  # shard 0 is empty
    start = int.from_bytes(good[4:8], "little")
    raw = bytearray(good)
    raw[start + 4] = ndim << 2 | (raw[start + 4] & 3)  # after the 4-byte size prefix
    path.write_bytes(bytes(raw))
    return folder, path


def test_hostile_shards(mds, tmp_path):
    folder, index = _copy(mds, "plain", tmp_path)
    path, good = _shard(folder, index, 1)  # shard 0 is empty
    path.write_bytes(bytes(good[:-3]))  # truncated: the size disagrees with index.json
    with pytest.raises(FormatError, match="'bytes'"):
        open_dataset(folder)
    raw = bytearray(good)
    raw[8:12] = (len(good) + 9).to_bytes(4, "little")  # the second sample's offset past the end
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="offsets") as caught:
        open_dataset(folder)
    assert path.name in str(caught.value)
    n = int.from_bytes(good[:4], "little")
    raw = bytearray(good)
    raw[4:8] = (4 * (n + 2) - 1).to_bytes(4, "little")  # the first sample inside the table
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="offsets"):
        open_dataset(folder)
    # The shape header of sample 0 lies (a 2-D shape): reads and verify refuse it.
    start = int.from_bytes(good[4:8], "little")
    raw = bytearray(good)
    raw[start + 4] = 2 << 2 | (raw[start + 4] & 3)
    path.write_bytes(bytes(raw))
    with open_dataset(folder) as ds:
        with pytest.raises(FormatError, match=r"samples\[0\].tokens") as caught:
            ds.documents().read([0])
        assert path.name in str(caught.value)
        assert [p.field for p in ds.verify()] == ["samples[0].tokens"]
    # Its size prefix lies: the sample's bytes disagree.
    raw = bytearray(good)
    raw[start:start + 4] = (int.from_bytes(good[start:start + 4], "little") + 2).to_bytes(
        4, "little")
    path.write_bytes(bytes(raw))
    with open_dataset(folder) as ds, pytest.raises(FormatError, match="size prefix"):
        ds.windows(4).read([0])


def test_direct_reads_check_every_sample(mds, tmp_path):
    """Local reads check each sample's header inside their one kernel call
    (windows, with and without the document columns, and documents); a lie
    is read again by the scattered path, whose error names the file and
    sample."""
    folder, path = _shape_lie(mds, tmp_path, 2)
    with open_dataset(folder) as ds:
        plain = ds.windows(4)
        assert plain._direct
        with pytest.raises(FormatError, match=r"samples\[0\].tokens") as caught:
            plain.read([0])
        assert path.name in str(caught.value)
        masked = ds.windows(4, document_masking=True)
        for _ in range(LOOKUP_READS + 1):  # by lookups, then by the direct kernel
            with pytest.raises(FormatError, match=r"samples\[0\].tokens"):
                masked.read([0])
        assert masked._direct
        with pytest.raises(FormatError, match=r"samples\[0\].tokens"):
            ds.documents().read([0])
        np.testing.assert_array_equal(  # the next sample is sound
            ds.documents().read([1])["input_ids"][0], mds["plain"][1][1])


def test_mapped_shards_check_each_sample_in_place(mds, tmp_path):
    """A shard large enough to be mapped ("wide"): the window kernel checks
    each sample's size prefix and shape header where they lie in the
    mapping. A lie in any of them is a FormatError naming the sample; a
    window that does not touch it still reads."""
    from zerobatch.storage.local import MAP_FROM

    folder, index = _copy(mds, "wide", tmp_path)
    path, good = _shard(folder, index, 0)
    assert len(good) >= MAP_FROM
    tokens = np.concatenate(mds["wide"][1])
    start = int.from_bytes(good[12:16], "little")  # sample 2: 65,536 values, a 5-byte header
    size = int.from_bytes(good[start:start + 4], "little")
    lies = {"size prefix": (start, (size + 2).to_bytes(4, "little")),
            "ndim": (start + 4, bytes([2 << 2 | 2])),
            "width": (start + 4, bytes([1 << 2 | 1])),
            "count": (start + 5, (65_537).to_bytes(4, "little"))}
    for name, (at, value) in lies.items():
        raw = bytearray(good)
        raw[at:at + len(value)] = value
        path.write_bytes(bytes(raw))
        with open_dataset(folder) as ds:
            windows = ds.windows(1000)
            assert windows._direct
            np.testing.assert_array_equal(windows.read([3])["input_ids"][0],
                                          tokens[3000:4000])
            files, use_pread = ds.files.storage.files()
            assert not use_pread and files.addresses.any(), "the shard is not mapped"
            with pytest.raises(FormatError, match=r"samples\[2\]\.tokens") as caught:
                windows.read([3, 71])  # window 71: tokens [71000, 72001), in sample 2
            assert path.name in str(caught.value), name


def test_local_reads_are_one_call(mds, monkeypatch):
    """From local files, windows never go through the scattered read, and the
    scattered read (documents) never through the storage's read_into: both
    are one kernel call that reads and checks the samples."""
    from zerobatch.peers.mds import MDSFiles
    from zerobatch.storage import LocalStorage

    folder, samples = mds["mixed"]
    with open_dataset(folder) as ds:
        ds.files.prepare(np.arange(len(ds.files.shards)))  # each shard's table: read once

        def refuse(*args, **kwargs):
            raise AssertionError("not the one-call path")

        monkeypatch.setattr(LocalStorage, "read_into", refuse)
        for i in range(len(samples)):
            np.testing.assert_array_equal(ds.documents().read([i])["input_ids"][0], samples[i])
        monkeypatch.setattr(MDSFiles, "read_scattered", refuse)
        tokens = np.concatenate(samples)
        batch = ds.windows(9).read([0, 3, 2])
        np.testing.assert_array_equal(batch["labels"][1], tokens[28:37])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq_len=st.integers(1, 700), stride=st.integers(1, 900), data=st.data())
def test_direct_document_columns_equal_mds_samples(mds, seq_len, stride, data):
    """The direct kernel's document columns (after the lookups) equal the
    lookups' and what MDS's samples give, on shards read by ``pread`` (small)
    and mapped (``wide``), dynamic and fixed shapes."""
    name = data.draw(st.sampled_from(["plain", "mixed", "fixed", "wide", "bytes", "many"]))
    folder, samples = mds[name]
    tokens = np.concatenate(samples).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum([len(d) for d in samples])])
    with open_dataset(folder, **({"dtype": "int64"} if name == "bytes" else {})) as ds:
        windows = ds.windows(seq_len, stride=stride, document_masking=True,
                             columns=["input_ids", "labels", "position_ids"])
        if not len(windows):
            return
        picks = np.array(data.draw(st.lists(st.integers(0, len(windows) - 1), min_size=1,
                                            max_size=6)))
        first = windows.read(picks)
        for _ in range(LOOKUP_READS):
            last = windows.read(picks)
        assert windows._direct
        at = picks[:, None] * stride + np.arange(seq_len)
        doc_of = np.searchsorted(starts, at, side="right") - 1
        positions = np.minimum(at - starts[doc_of], at - picks[:, None] * stride)
        for batch in (first, last):
            np.testing.assert_array_equal(batch["input_ids"], tokens[at])
            np.testing.assert_array_equal(batch["labels"], tokens[at + 1])
            np.testing.assert_array_equal(batch["position_ids"], positions)


def test_hostile_fixed_and_mixed(mds, tmp_path):
    folder, index = _copy(mds, "fixed", tmp_path)
    path, good = _shard(folder, index)
    raw = bytearray(good)
    raw[8:12] = (int.from_bytes(good[8:12], "little") + 1).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with open_dataset(folder) as ds:
        with pytest.raises(FormatError, match=r"samples\[0\].input_ids"):
            ds.windows(4).read([0])
        assert [p.field for p in ds.verify()] == ["samples[0].input_ids"]
    folder, index = _copy(mds, "mixed", tmp_path)
    path, good = _shard(folder, index)
    start = int.from_bytes(good[4:8], "little")
    raw = bytearray(good)
    raw[start:start + 4] = (1 << 30).to_bytes(4, "little")  # the text column's size
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"samples\[0\]") as caught:
        open_dataset(folder)
    assert path.name in str(caught.value)


def test_two_dimensional_samples_are_refused(mds):
    """MDSWriter's own 2-D samples are not read as tokens: refused naming the sample."""
    with pytest.raises(FormatError, match=r"samples\[1\].tokens"), \
            open_dataset(mds["two"][0]) as ds:
        ds.documents().read([1])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq_len=st.integers(1, 700), stride=st.integers(1, 900), data=st.data())
def test_any_window_equals_mds_tokens(mds, seq_len, stride, data):
    """Any windows (crossing samples and shards at any offset) are MDS's tokens."""
    name = data.draw(st.sampled_from(["plain", "mixed", "fixed"]))
    folder, samples = mds[name]
    tokens = np.concatenate(samples).astype(np.int64)
    with open_dataset(folder) as ds:
        windows = ds.windows(seq_len, stride=stride)
        if not len(windows):
            assert tokens.shape[0] < seq_len + 1
            return
        picks = data.draw(st.lists(st.integers(0, len(windows) - 1), min_size=1, max_size=6))
        batch = windows.read(picks)
        at = np.array(picks)[:, None] * stride + np.arange(seq_len)
        np.testing.assert_array_equal(batch["input_ids"], tokens[at])
        np.testing.assert_array_equal(batch["labels"], tokens[at + 1])


def test_cli_inspect_and_verify(mds, tmp_path, capsys):
    folder, _ = mds["mixed"]
    assert main(["inspect", str(folder)]) == 0
    assert "mds" in capsys.readouterr().out
    assert main(["verify", str(folder)]) == 0
    assert "OK" in capsys.readouterr().out
    bad, path = _shape_lie(mds, tmp_path, 3)
    assert main(["verify", str(bad)]) == 1  # opens; verify reads every sample's header
    out = capsys.readouterr().out
    assert path.name in out and "samples[0].tokens" in out


def test_one_kernel_specialization_for_any_batch(mds, monkeypatch):
    """Found by the fifth fuzz round: a batch of one piece passed its shard
    column contiguous and every other batch a strided one, so the first batch
    of one piece compiled a second ``mds_pieces`` (seconds, and 55 MiB in a
    forked fuzz child). The column is passed contiguous always. The reads go
    the two-pass way (``mds_pieces``, as from an object store) whatever ran
    before in this process: the one-call local read is told to fail."""
    from zerobatch.peers import mds as mds_module
    from zerobatch.peers._kernels import mds_pieces

    folder, _ = mds["plain"]
    with open_dataset(folder) as ds:
        windows = ds.windows(4, document_masking=True)  # looked up: read_scattered
        indices = np.arange(min(len(windows), 64))
        expected = [windows.read([0]), windows.read(indices)]
    monkeypatch.setattr(mds_module, "mds_read_requests", lambda *args: (0, 0))
    with open_dataset(folder) as ds:
        windows = ds.windows(4, document_masking=True)
        got = [windows.read([0]), windows.read(indices)]  # one piece, then many
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert {signature[0].layout for signature in mds_pieces.signatures} == {"C"}


def test_opening_keeps_no_sample_table(mds, tmp_path):
    """Opening checks every shard's offsets table and keeps none of it: a
    shard's sample table is built on its first read (an O(read) first batch
    of any corpus), and a shard changed after opening is refused there,
    naming its file and sample."""
    folder, samples = mds["plain"]
    tokens = np.concatenate(samples)
    with open_dataset(folder) as ds:
        files = ds.files
        empty = np.array([not shard.documents for shard in files.shards])
        assert files._ready.tolist() == empty.tolist()
        np.testing.assert_array_equal(ds.windows(8).read([0])["labels"][0], tokens[1:9])
        first = int(np.flatnonzero(~empty)[0])  # the shard of the first sample, alone
        assert files._ready.tolist() == (empty | (np.arange(empty.size) == first)).tolist()
        last = len(samples) - 1
        np.testing.assert_array_equal(ds.documents().read([last])["input_ids"][0],
                                      samples[last])
        assert files._ready[-1] and not files._ready[~empty].all()
    copy, index = _copy(mds, "plain", tmp_path)
    with open_dataset(copy) as ds:
        shard = next(s for s, entry in enumerate(ds.files.shards) if entry.documents > 1)
        path, good = _shard(copy, index, shard)
        raw = bytearray(good)  # sample 1 starts a byte later: sample 0 is no 1-D array
        raw[8:12] = (int.from_bytes(good[8:12], "little") + 1).to_bytes(4, "little")
        path.write_bytes(bytes(raw))
        document = sum(entry.documents for entry in ds.files.shards[:shard])
        with pytest.raises(FormatError, match=r"samples\[0\].tokens") as caught:
            ds.documents().read([document])
        assert path.name in str(caught.value)



def _strict_overcommit():
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "2"
    except OSError:
        return False


def test_sample_tables_larger_than_memory_map_without_reserving_it():
    """The sample tables are address space reserving no swap: 48 GiB of them
    (2.1 billion samples, more than this machine's memory and swap, which
    Linux's default overcommit refuses for one mapping that reserves) map,
    and only the pages written become memory."""
    from zerobatch.peers import mds as mds_module

    count = 2 << 30  # samples: 48 GiB of tables
    if _strict_overcommit():  # the system's own limit: refused, clearly
        with pytest.raises(MemoryError, match="overcommit"):
            mds_module._pages(count, "corpus/index.json")
        return
    tokens, samples, coarse = mds_module._pages(count, "corpus/index.json")
    tokens[-1], samples[-1, 1], coarse[-1] = 7, 9, 11
    assert tokens.shape == (count + 1,) and samples.shape == (count, 2)
    assert coarse.shape == (count // mds_module.COARSE + 1,)
    assert (int(tokens[-1]), int(samples[-1, 1]), int(coarse[-1]), int(tokens[0])) == (7, 9, 11, 0)
    assert all(a.flags.c_contiguous for a in (tokens, samples, coarse))


def test_refused_tables_name_the_corpus(mds, monkeypatch):
    """Where the system refuses the tables' address space, opening raises
    MemoryError naming the index, the samples and what to change."""
    import errno
    import mmap

    from zerobatch.peers import mds as mds_module

    real = mmap.mmap

    def refuse(fileno, *args, **kwargs):  # anonymous pages only: files still map
        if fileno == -1:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(fileno, *args, **kwargs)

    folder, samples = mds["plain"]
    monkeypatch.setattr(mds_module.mmap, "mmap", refuse)
    with pytest.raises(MemoryError, match=rf"{len(samples):,} MDS samples.*overcommit") as caught:
        open_dataset(folder)
    assert "index.json" in str(caught.value)

@settings(max_examples=200, deadline=None)
@given(itemsize=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_sample_table_count_equals_the_checked_build(itemsize, data):
    """Opening counts a shard's tokens branch-free (each header width from the
    column's bytes); a shard's first read builds its table sample by sample,
    trying each width: both agree on every column size, sound or not,
    around each width's first and last sizes."""
    from zerobatch.peers._kernels import MDS_OK, mds_header, mds_sample_table

    edges = [2 + itemsize, 2 + 255 * itemsize, 3 + 256 * itemsize, 3 + 65_535 * itemsize,
             5 + 65_536 * itemsize]
    near = st.builds(lambda edge, step: max(edge + step, 0), st.sampled_from(edges),
                     st.integers(-3, 3))
    columns = data.draw(st.lists(st.one_of(near, st.integers(0, 40)), min_size=1, max_size=12))
    offsets = np.cumsum([64] + [4 + c for c in columns]).astype("<u4")
    arguments = (np.zeros((0, 1), np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64), 0,
                 itemsize, 0, 0, 7)
    counted = mds_sample_table(offsets, *arguments, np.zeros(0, np.int64),
                               np.zeros((0, 2), np.int64))
    tokens, samples = np.empty(len(columns) + 1, np.int64), np.empty((len(columns), 2), np.int64)
    built = mds_sample_table(offsets, *arguments, tokens, samples)
    assert counted == built
    sound = [c for c in columns if any(
        c - h >= itemsize and (c - h) % itemsize == 0 and mds_header((c - h) // itemsize) == h
        for h in (2, 3, 5, 9))]
    assert (built[2] == MDS_OK) == (len(sound) == len(columns))
    if built[2] == MDS_OK:
        assert tokens[-1] - tokens[0] == built[0]
        np.testing.assert_array_equal(samples[:, 0], offsets[:-1])


def _counting_opens(monkeypatch):
    """A list that grows by the shards of each offsets-table read."""
    from zerobatch.peers.mds import MDSFiles

    reads: list[int] = []
    original = MDSFiles._offsets_tables

    def counted(self, shards):
        reads.extend(shards)
        return original(self, shards)

    monkeypatch.setattr(MDSFiles, "_offsets_tables", counted)
    return reads


@pytest.mark.parametrize("name", ["plain", "mixed", "bytes", "many"])
def test_token_counts_cached_open_reads_index_alone(mds, name, tmp_path, monkeypatch):
    """After one open, the shards' token counts come from the cache: opening
    reads no offsets table, and every window and document is the same."""
    monkeypatch.setattr("zerobatch.peers.mds.CACHE_FROM_SAMPLES", 0)
    folder, samples = mds[name]
    options = {"dtype": "int64"} if name == "bytes" else {}
    cache = tmp_path / "cache"
    reads = _counting_opens(monkeypatch)
    with open_dataset(folder, cache_dir=cache, **options) as first:
        assert not first.files._counts_cached and reads
        counts = [shard.records for shard in first.files.shards]
    assert len(list((cache / "token-counts").iterdir())) == 1
    reads.clear()
    with open_dataset(folder, cache_dir=cache, **options) as ds:
        assert ds.files._counts_cached and reads == []
        assert [shard.records for shard in ds.files.shards] == counts
        check_against(ds, np.concatenate(samples), samples)
        assert ds.verify() == []


def test_token_count_cache_location_and_threshold(mds, tmp_path, monkeypatch):
    folder, _ = mds["plain"]
    with open_dataset(folder, cache_dir=tmp_path / "small") as ds:  # under CACHE_FROM_SAMPLES
        assert not ds.files._counts_cached
    assert not (tmp_path / "small").exists()
    monkeypatch.setattr("zerobatch.peers.mds.CACHE_FROM_SAMPLES", 0)
    monkeypatch.setenv("ZEROBATCH_CACHE_DIR", str(tmp_path / "env"))
    open_dataset(folder).close()
    assert len(list((tmp_path / "env" / "token-counts").iterdir())) == 1
    monkeypatch.delenv("ZEROBATCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    open_dataset(folder).close()
    assert len(list((tmp_path / "xdg" / "zerobatch" / "token-counts").iterdir())) == 1
    open_dataset(folder, cache_dir=False).close()  # none: nothing more written anywhere
    monkeypatch.setenv("ZEROBATCH_CACHE_DIR", "")
    open_dataset(folder).close()
    assert len(list((tmp_path / "xdg" / "zerobatch" / "token-counts").iterdir())) == 1
    with pytest.raises(ValueError, match="cache_dir"):
        open_dataset(folder, cache_dir=3)
    unwritable = tmp_path / "file"
    unwritable.write_text("")  # a file where the folder would be: counted, not cached
    with open_dataset(folder, cache_dir=unwritable) as ds:
        assert not ds.files._counts_cached and ds.num_documents == len(mds["plain"][1])


def test_broken_token_count_cache_is_counted_again(mds, tmp_path, monkeypatch):
    """A cache file that is not whole and consistent (truncated, a flipped
    byte, another magic, another shard count) is ignored and rewritten."""
    monkeypatch.setattr("zerobatch.peers.mds.CACHE_FROM_SAMPLES", 0)
    folder, samples = mds["mixed"]
    cache = tmp_path / "cache"
    open_dataset(folder, cache_dir=cache).close()
    (path,) = (cache / "token-counts").iterdir()
    good = path.read_bytes()
    shards = int.from_bytes(good[8:16], "little")
    other = good[:8] + (shards + 1).to_bytes(8, "little") + good[16:]
    for broken in (good[:-1], good[:20], b"", b"ZBCOUNT2" + good[8:], other,
                   good[:16] + bytes([good[16] ^ 1]) + good[17:]):
        path.write_bytes(broken)
        with open_dataset(folder, cache_dir=cache) as ds:
            assert not ds.files._counts_cached
            check_against(ds, np.concatenate(samples), samples)
        assert path.read_bytes() == good


def test_token_count_cache_contradicted_by_its_shard(mds, tmp_path, monkeypatch):
    """Counts the shard's own table contradicts (a shard rewritten under an
    unchanged index.json and mtime, or a forged cache) raise a FormatError at
    the shard's first read, naming it and the cache, and remove the cache;
    a shard rewritten in place (a new mtime) is counted again at opening."""
    monkeypatch.setattr("zerobatch.peers.mds.CACHE_FROM_SAMPLES", 0)
    folder, index = _copy(mds, "plain", tmp_path)
    samples = mds["plain"][1]
    cache = tmp_path / "cache"
    with open_dataset(folder, cache_dir=cache) as ds:
        counts = [shard.records for shard in ds.files.shards]
        firsts = list(ds.files._values)
        path = ds.files._count_cache.path
    shard = 2
    forged = list(counts)
    forged[shard] += 1
    forged[shard + 1] -= 1  # the same total: only the shard's own read can tell
    ds.files._count_cache.store(forged, firsts)
    reads = _counting_opens(monkeypatch)
    with open_dataset(folder, cache_dir=cache) as ds:
        assert ds.files._counts_cached and reads == []
        document = sum(entry.documents for entry in ds.files.shards[:shard])
        with pytest.raises(FormatError, match="token-count cache") as caught:
            ds.documents().read([document])
        message = str(caught.value)
        assert index["shards"][shard]["raw_data"]["basename"] in message
        assert str(path) in message
    assert not path.exists()
    with open_dataset(folder, cache_dir=cache) as ds:  # counted again, right
        assert not ds.files._counts_cached
        check_against(ds, np.concatenate(samples), samples)
    shard_path, raw = _shard(folder, index, shard)
    shard_path.write_bytes(bytes(raw))  # rewritten in place: a new mtime, a new key
    os.utime(shard_path, ns=(1, 1))
    reads.clear()
    with open_dataset(folder, cache_dir=cache) as ds:
        assert not ds.files._counts_cached and reads
    assert len(list((cache / "token-counts").iterdir())) == 2
