"""Token-stream datasets on S3 (moto on loopback): the same batches as local."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobatch import FormatError, StorageError
from zerobatch.cli import main
from zerobatch.columnar import Jagged
from zerobatch.storage import ObjectStorage
from zerobatch.stream import StreamWriter, combine, open_dataset, verify


def _write(location, rng, **options):
    with StreamWriter(location, metadata="msgpack", shard_tokens=3_000,
                      fields={"loss_mask": "u1"}, **options) as writer:
        for d in range(60):
            n = int(rng.integers(5, 300))
            tokens = rng.integers(0, 60_000, n)
            spans = [(0, n // 2, {"doc": d})] if d % 3 else None
            writer.add_document(tokens, spans=spans,
                                fields={"loss_mask": rng.integers(0, 2, n)})


@pytest.fixture(scope="module")
def pair(s3, tmp_path_factory):
    """One dataset written locally and to s3:// (several shards, metadata, a field)."""
    local = tmp_path_factory.mktemp("stream") / "local"
    url = s3.url("stream")
    _write(local, np.random.default_rng(7))
    _write(url, np.random.default_rng(7), storage_options=s3.storage_options())
    return local, url


def _same(a, b):
    assert a.fields == b.fields and len(a) == len(b)
    assert a.meta.global_indexes == b.meta.global_indexes
    for name in a.fields:
        x, y = a[name], b[name]
        if isinstance(x, Jagged):
            assert len(x) == len(y)
            for i in range(len(x)):
                np.testing.assert_array_equal(x[i], y[i])
        elif isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert [list(v) for v in x] == [list(v) for v in y]


def test_windows_and_documents_match_local(pair, s3):
    local, url = pair
    with open_dataset(local) as a, open_dataset(url, storage_options=s3.storage_options()) as b:
        assert b.path == url and a.manifest == b.manifest
        assert len(b.manifest.shards) > 1
        rng = np.random.default_rng(0)
        wa, wb = a.windows(128, columns="all"), b.windows(128, columns="all")
        for _ in range(3):
            idx = rng.permutation(len(wa))[:16]
            _same(wa.read(idx), wb.read(idx))
        da, db = a.documents(), b.documents()
        idx = rng.permutation(len(da))[:10]
        _same(da.read(idx), db.read(idx))


def test_verify_and_cli_over_s3(pair, s3, monkeypatch, capsys):
    _, url = pair
    assert verify(url, storage_options=s3.storage_options()) == []
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    assert main(["verify", url]) == 0
    assert main(["inspect", url]) == 0
    assert "token-stream dataset" in capsys.readouterr().out


def test_combine_into_the_same_store(pair, s3):
    local, url = pair
    out = s3.url("combined")
    options = s3.storage_options()
    combine([url, url], out, storage_options=options)
    with open_dataset(local) as a, open_dataset(out, storage_options=options) as b:
        assert b.num_tokens == 2 * a.num_tokens
        wa, wb = a.windows(64, columns="all"), b.windows(64, columns="all")
        idx = np.arange(len(wa) - 5, len(wa))
        _same(wa.read(idx), wb.read(idx))
    assert verify(out, storage_options=options) == []


def test_faults_at_20_percent_give_identical_batches(pair, s3, s3_proxy):
    local, url = pair
    options = s3.storage_options(s3_proxy.endpoint, retries=8)
    with open_dataset(local) as a, s3_proxy.faults(0.2, delay=0.01), \
            open_dataset(url, storage_options=options) as b:
        wa, wb = a.windows(100, columns="all"), b.windows(100, columns="all")
        rng = np.random.default_rng(1)
        for _ in range(4):
            idx = rng.permutation(len(wa))[:8]
            _same(wa.read(idx), wb.read(idx))


def test_faults_at_100_percent_raise(pair, s3, s3_proxy):
    _, url = pair
    options = s3.storage_options(s3_proxy.endpoint, retries=2, budget=3.0)
    with open_dataset(url, storage_options=options) as b, \
            s3_proxy.faults(1.0, kinds=("503", "reset")), pytest.raises(StorageError, match=url):
        b.windows(100, columns="all").read(np.arange(8))


def test_corrupt_and_truncated_remote_shards(pair, s3):
    local, _ = pair
    options = s3.storage_options()
    bad = s3.url("bad")
    store = ObjectStorage(bad, **options)
    for path in sorted(local.iterdir()):
        store.put(path.name, path.read_bytes())
    store.put("00000.tokens", (local / "00000.tokens").read_bytes()[:-4])
    with pytest.raises(FormatError, match=f"{bad}/00000.tokens"):
        open_dataset(bad, storage_options=options)
    docs = np.fromfile(local / "00000.docs", dtype="<u8")
    docs[3] = docs[-1] + 10  # offsets past the end
    store.put("00000.tokens", (local / "00000.tokens").read_bytes())
    store.put("00000.docs", docs.tobytes())
    with open_dataset(bad, storage_options=options) as ds, \
            pytest.raises(FormatError, match=f"{bad}/00000.docs"):
        ds.documents().read(np.arange(5))
    problems = verify(bad, storage_options=options)
    assert any(str(p.path) == f"{bad}/00000.docs" for p in problems)
    store.remove("manifest.json")
    with pytest.raises(FormatError, match=f"{bad}/manifest.json.*not fully written"):
        open_dataset(bad, storage_options=options)
    with pytest.raises(FileNotFoundError, match=f"{bad}-none/manifest.json"):
        open_dataset(f"{bad}-none", storage_options=options)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), block=st.sampled_from([8, 24, 64, 4096]),
       columns=st.sampled_from([None, ("input_ids", "position_ids"), ("doc_ids", "metadata")]))
def test_index_blocks_of_any_size_give_local_batches(pair, s3, seed, block, columns):
    local, url = pair
    options = {**s3.storage_options(), "block_size": block, "cache_bytes": 4 * block}
    with open_dataset(local) as a, open_dataset(url, storage_options=options) as b:
        rng = np.random.default_rng(seed)
        wa, wb = a.windows(97, columns=columns), b.windows(97, columns=columns)
        idx = rng.integers(0, len(wa), 12)
        _same(wa.read(idx), wb.read(idx))
        da, db = a.documents(max_len=50), b.documents(max_len=50)
        idx = rng.integers(0, len(da), 9)
        _same(da.read(idx), db.read(idx))
        assert b._storage.blocks._held <= 4 * block


@pytest.fixture(scope="module")
def many_documents(s3, tmp_path_factory):
    """One shard of 20,000 documents (a 160 kB offsets file), local and on S3."""
    local = tmp_path_factory.mktemp("docs") / "local"
    url = s3.url("docs")
    for location, options in ((local, {}), (url, {"storage_options": s3.storage_options()})):
        rng = np.random.default_rng(3)
        with StreamWriter(location, **options) as writer:
            for _ in range(20_000):
                writer.add_document(rng.integers(0, 1000, int(rng.integers(1, 6))))
    return local, url


def test_offsets_are_read_by_block_never_whole(many_documents, s3, monkeypatch):
    local, url = many_documents
    mapped = []
    original = ObjectStorage.map
    monkeypatch.setattr(ObjectStorage, "map", lambda self, name: (
        mapped.append(name), original(self, name))[1])
    options = {**s3.storage_options(), "block_size": 1024}
    with open_dataset(local) as a, open_dataset(url, storage_options=options) as b:
        size = b._storage.size("00000.docs")
        idx = np.random.default_rng(0).integers(0, len(a.windows(64, columns="all")), 8)
        _same(a.windows(64, columns="all").read(idx), b.windows(64, columns="all").read(idx))
        docs = np.random.default_rng(1).integers(0, len(a.documents()), 8)
        _same(a.documents().read(docs), b.documents().read(docs))
        held = sum(block.size for (name, _), block in b._storage.blocks._blocks.items()
                   if name == "00000.docs")
    assert mapped == ["manifest.json"]
    assert 0 < held <= 16 * 2 * 1024 < size / 4


def _docs_gets(proxy):
    return [r for r in proxy.requests if r[0] == "GET" and r[1].endswith(".docs")]


def test_cache_dir_keeps_blocks_across_runs(many_documents, s3, s3_proxy, tmp_path):
    local, url = many_documents
    options = {**s3.storage_options(s3_proxy.endpoint), "block_size": 512,
               "cache_dir": tmp_path / "cache"}
    idx = np.random.default_rng(5).integers(0, 20_000, 16)
    with open_dataset(local) as a:
        expected = a.documents().read(idx)
    runs = []
    for _ in range(2):
        s3_proxy.reset_counts()
        with open_dataset(url, storage_options=options) as b:
            _same(expected, b.documents().read(idx))
        runs.append(len(_docs_gets(s3_proxy)))
    assert runs[0] > 0 and runs[1] == 0
    files = sorted((tmp_path / "cache").glob("*/*.block"))
    assert files and not list((tmp_path / "cache").glob("*/.*"))  # no temporaries left
    files[0].write_bytes(files[0].read_bytes()[:-1])  # truncated: fetched again
    files[1].write_bytes(b"\0" * files[1].stat().st_size)  # same size, bad checksum
    s3_proxy.reset_counts()
    with open_dataset(url, storage_options=options) as b:
        _same(expected, b.documents().read(idx))
    assert len(_docs_gets(s3_proxy)) >= 1


def test_cache_dir_stays_within_its_budget(many_documents, s3, tmp_path):
    _, url = many_documents
    budget = 20 * (256 + 8)
    options = {**s3.storage_options(), "block_size": 256, "cache_dir": tmp_path,
               "cache_dir_bytes": budget}
    with open_dataset(url, storage_options=options) as b:
        for seed in range(4):
            b.documents().read(np.random.default_rng(seed).integers(0, 20_000, 32))
    total = sum(path.stat().st_size for path in tmp_path.glob("*/*.block"))
    assert 0 < total <= budget


def test_faults_on_the_index_blocks(pair, s3, s3_proxy):
    local, url = pair
    options = {**s3.storage_options(s3_proxy.endpoint, retries=8), "block_size": 16}
    with open_dataset(local) as a, s3_proxy.faults(0.2, delay=0.01), \
            open_dataset(url, storage_options=options) as b:
        for seed in range(3):
            idx = np.random.default_rng(seed).integers(0, len(a.documents()), 6)
            _same(a.documents().read(idx), b.documents().read(idx))
    options = {**s3.storage_options(s3_proxy.endpoint, retries=2, budget=3.0),
               "block_size": 16}
    with open_dataset(url, storage_options=options) as b, \
            s3_proxy.faults(1.0, kinds=("503", "reset")), \
            pytest.raises(StorageError, match=f"{url}/0000[0-9].docs"):
        b.documents().read(np.arange(4))


V1_DATASET = Path(__file__).parent / "data" / "stream-v1-metadata"


@pytest.mark.parametrize("block", [8, 40, 1 << 14])
def test_version_1_metadata_by_range_matches_local(s3, block):
    url = s3.url("v1")
    options = s3.storage_options()
    store = ObjectStorage(url, **options)
    for path in sorted(V1_DATASET.iterdir()):
        store.put(path.name, path.read_bytes())
    with open_dataset(V1_DATASET) as a, \
            open_dataset(url, storage_options={**options, "block_size": block}) as b:
        assert not b.manifest.has_spans_table and b.has_metadata
        rng = np.random.default_rng(block)
        for seq_len in (2, 5, 11):
            wa, wb = a.windows(seq_len, columns="all"), b.windows(seq_len, columns="all")
            idx = rng.integers(0, len(wa), 10)
            _same(wa.read(idx), wb.read(idx))
        idx = rng.integers(0, len(a.documents()), 7)
        _same(a.documents().read(idx), b.documents().read(idx))
        index_blocks = {name for name, _ in b._storage.blocks._blocks}
    assert {"00000.meta.index", "00000.meta.data"} & index_blocks or block > 1000


def _write_annotated(location, **options):
    """Documents with their own metadata and nested, overlapping spans (version 2)."""
    rng = np.random.default_rng(11)
    with StreamWriter(location, metadata="msgpack", shard_tokens=40_000, **options) as writer:
        for d in range(1_500):
            n = int(rng.integers(2, 60))
            spans = []
            for s in range(int(rng.integers(0, 6))):
                start = int(rng.integers(0, n - 1))
                spans.append((start, int(rng.integers(start + 1, n + 1)), [d, s]))
            writer.add_document(rng.integers(0, 50_000, n), spans=spans,
                                metadata={"doc": d} if d % 4 else None)


@pytest.fixture(scope="module")
def annotated(s3, tmp_path_factory):
    """A version-2 dataset with nested and overlapping spans, local and on S3."""
    local = tmp_path_factory.mktemp("annotated") / "local"
    url = s3.url("annotated")
    _write_annotated(local)
    _write_annotated(url, storage_options=s3.storage_options())
    return local, url


def _read_both(a, b, seed):
    rng = np.random.default_rng(seed)
    for seq_len, columns in ((7, None), (64, ("metadata",)), (300, ("document_metadata",))):
        wa, wb = a.windows(seq_len, columns=columns), b.windows(seq_len, columns=columns)
        idx = rng.integers(0, len(wa), 12)
        _same(wa.read(idx), wb.read(idx))
    for max_len in (None, 5):
        da, db = a.documents(max_len=max_len), b.documents(max_len=max_len)
        idx = rng.integers(0, len(da), 9)
        _same(da.read(idx), db.read(idx))


META_FILES = ("meta.spans", "meta.index", "meta.data")


@pytest.mark.parametrize("block", [8, 48, 1024, 1 << 14])
def test_version_2_metadata_by_range_matches_local(annotated, s3, block, monkeypatch):
    local, url = annotated
    mapped = []
    original = ObjectStorage.map
    monkeypatch.setattr(ObjectStorage, "map", lambda self, name: (
        mapped.append(name), original(self, name))[1])
    with open_dataset(local) as a, \
            open_dataset(url, storage_options={**s3.storage_options(), "block_size": block}) as b:
        assert b.has_document_metadata and len(b.manifest.shards) > 1
        idx = np.random.default_rng(block).integers(0, len(a.windows(32, columns="all")), 8)
        _same(a.windows(32, columns="all").read(idx), b.windows(32, columns="all").read(idx))
        held = {suffix: sum(data.size for (name, _), data in b._storage.blocks._blocks.items()
                            if name.endswith(suffix)) for suffix in META_FILES}
        sizes = {suffix: sum(b._storage.size(s.file(suffix)) for s in b.manifest.shards)
                 for suffix in META_FILES}
        for seed in range(2):
            _read_both(a, b, seed)
    assert mapped == ["manifest.json"]
    assert all(held.values())
    if block <= 1024:  # far from the files' sizes: never the whole files
        assert all(held[suffix] < sizes[suffix] / 3 for suffix in META_FILES), (held, sizes)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), block=st.sampled_from([8, 16, 24, 40, 96, 4096]),
       seq_len=st.integers(1, 200))
def test_version_2_blocks_of_any_size_give_local_batches(annotated, s3, seed, block, seq_len):
    local, url = annotated
    options = {**s3.storage_options(), "block_size": block, "cache_bytes": 8 * block}
    with open_dataset(local) as a, open_dataset(url, storage_options=options) as b:
        rng = np.random.default_rng(seed)
        wa, wb = a.windows(seq_len, columns="all"), b.windows(seq_len, columns="all")
        idx = rng.integers(0, len(wa), 10)
        _same(wa.read(idx), wb.read(idx))
        da, db = a.documents(max_len=seq_len), b.documents(max_len=seq_len)
        idx = rng.integers(0, len(da), 6)
        _same(da.read(idx), db.read(idx))


def test_version_2_metadata_ranges_are_small(annotated, s3, s3_proxy):
    local, url = annotated
    options = {**s3.storage_options(s3_proxy.endpoint), "block_size": 512, "coalesce": 0}
    with open_dataset(local) as a, open_dataset(url, storage_options=options) as b:
        s3_proxy.reset_counts()
        idx = np.random.default_rng(3).integers(0, len(a.windows(32, columns="all")), 8)
        _same(a.windows(32, columns="all").read(idx), b.windows(32, columns="all").read(idx))
        gets = [r for r in s3_proxy.requests if r[0] == "GET" and ".meta." in r[1]]
        sizes = sum(b._storage.size(s.file(suffix)) for s in b.manifest.shards
                    for suffix in META_FILES)
    assert {r[1].rsplit(".", 2)[-2] + "." + r[1].rsplit(".", 1)[-1] for r in gets} == set(
        META_FILES)
    assert all(r[2] is not None for r in gets)  # every one a range GET
    ranges = [tuple(map(int, r[2].removeprefix("bytes=").split("-"))) for r in gets]
    assert sum(last + 1 - first for first, last in ranges) < sizes / 5, (ranges, sizes)


def test_version_2_metadata_faults_give_identical_batches(annotated, s3, s3_proxy):
    local, url = annotated
    options = {**s3.storage_options(s3_proxy.endpoint, retries=8), "block_size": 64}
    with open_dataset(local) as a, s3_proxy.faults(0.2, delay=0.01), \
            open_dataset(url, storage_options=options) as b:
        _read_both(a, b, 5)


@pytest.mark.parametrize(("corrupt", "names"), [
    ("kind", "meta.spans: field 'rows'"), ("past_records", "meta.spans: field 'rows'"),
    ("empty", "meta.spans: field 'rows'"), ("uncovered", "tokens: field 'meta_id'"),
    ("index", "meta.index: field 'offsets'")])
def test_corrupt_remote_meta_spans_raise_as_local(annotated, s3, tmp_path, corrupt, names):
    source, _ = annotated
    local = tmp_path / "bad"
    local.mkdir()
    for path in source.iterdir():
        (local / path.name).write_bytes(path.read_bytes())
    shard = open_dataset(local).manifest.shards[0]
    rows = np.fromfile(local / shard.file("meta.spans"), dtype="<u8").reshape(-1, 3)
    index = np.fromfile(local / shard.file("meta.index"), dtype="<u8")
    row = 40
    if corrupt == "kind":
        rows[row, 2] = 2
    elif corrupt == "past_records":
        rows[row, 1] = shard.records + 1
    elif corrupt == "empty":
        rows[row, 1] = rows[row, 0]
    elif corrupt == "uncovered":
        rows[row, 0] = rows[row, 1] - 1  # its tokens' ids still name it
    else:
        index[row + 1] = index[-1] + 100
    rows.tofile(local / shard.file("meta.spans"))
    index.tofile(local / shard.file("meta.index"))
    url = s3.url(f"bad-{corrupt}")
    store = ObjectStorage(url, **s3.storage_options())
    for path in sorted(local.iterdir()):
        store.put(path.name, path.read_bytes())
    start = int(rows[row, 0])
    windows = np.arange(max(0, start // 16 - 2), start // 16 + 3)
    errors = []
    for location, options in ((local, {}), (url, {**s3.storage_options(), "block_size": 64})):
        with open_dataset(location, storage_options=options) as ds, \
                pytest.raises(FormatError) as error:
            ds.windows(16, columns="all").read(windows)
        errors.append(str(error.value))
    assert errors[0].replace(str(local), url) == errors[1]
    assert errors[1].startswith(f"{url}/{shard.name}.{names}")
