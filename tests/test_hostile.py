"""Crafted input, one test per class of bug: every reader answers with
FormatError naming the file (or frame) and the field, never a bare Python
error, a false pass of ``verify`` or an allocation larger than the input."""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stream_helpers import random_corpus, write

from zerobatch import Batch, stream
from zerobatch._json import json_depth, load_json
from zerobatch.batch_loader import BatchFileReader, is_batch_file
from zerobatch.batch_writer import write_batch_dataset
from zerobatch.columnar import BatchMeta
from zerobatch.errors import FormatError
from zerobatch.stream.serializers import npy_loads

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = random_corpus(np.random.default_rng(3), docs=10, max_len=20, spans=True)
    return write(tmp_path_factory.mktemp("hostile") / "ds", corpus, shard_tokens=60)


@pytest.fixture
def dataset(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "ds"))


@pytest.fixture(scope="module")
def batch_pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokens = np.arange(400 * 16, dtype=np.uint32).reshape(400, 16)
    folder = tmp_path_factory.mktemp("batch") / "s"
    write_batch_dataset(folder, iter(tokens), 400, 8, 16, 3, batches_per_shard=20)
    return folder


@pytest.fixture
def batches(batch_pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(batch_pristine, tmp_path / "s"))


def _edit(folder: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    path = folder / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def _read_all(folder: Path) -> None:
    ds = stream.open_dataset(folder)
    windows = ds.windows(4, columns="all")
    for batch in (windows.read(np.arange(len(windows))),
                  ds.documents().read(np.arange(ds.num_documents))):
        if "metadata" in batch:
            for spans in batch["metadata"]:
                list(spans)


def _raises(call: Callable[[], Any], path_end: str, field: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        call()
    error = info.value
    assert error.path is not None and error.path.endswith(path_end), error
    assert error.field is not None and field in error.field, error
    return error


# ------------------------------------------------------------------ manifests


def test_json_depth_ignores_brackets_in_strings() -> None:
    assert json_depth(b'["[[\\"[", {"a": [1, "]]"]}]') == 3
    assert json_depth(b'"\\\\" [[]]') == 2
    assert json_depth(DEEP) == 100_000
    with pytest.raises(FormatError, match="nested 100000 levels"):
        load_json(DEEP, path="m.json", field="manifest", max_bytes=1 << 20)
    with pytest.raises(FormatError, match="over the 4-byte limit"):
        load_json(b"[1,2]", path="m.json", field="manifest", max_bytes=4)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(alphabet='ab"\\[]{}', max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(alphabet='k"\\[{', max_size=4), inner, max_size=4), max_leaves=30)


@given(value=_JSON_VALUES, chunk=st.integers(1, 40))
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_json_depth_equals_the_parsed_depth(value: Any, chunk: int, monkeypatch: Any) -> None:
    """Any JSON, strings full of quotes, backslashes and brackets, read in
    chunks of any size (escapes carried across their edges): the depth of
    what json.loads builds."""
    monkeypatch.setattr("zerobatch._json._CHUNK", chunk)
    assert json_depth(json.dumps(value).encode()) == _depth(value)


def test_deep_manifests_are_refused(dataset: Path, batches: Path) -> None:
    for folder, opener in ((dataset, stream.open_dataset), (batches, BatchFileReader)):
        (folder / "manifest.json").write_bytes(DEEP)
        _raises(lambda f=folder, o=opener: o(f), "manifest.json", "manifest")  # type: ignore[misc]
    assert not stream.is_dataset(dataset)
    assert not is_batch_file(batches)
    assert stream.verify(dataset)[0].field == "manifest"


@pytest.mark.parametrize("descr", [
    [], "", 7, [["token", "<u2"], ["x", 3]], [["token", "<u2"], ["x"]],
    [["token", "<u2"], ["z", "<c8"]], [["token", "<u2"], ["u", "<U4"]],
    [["token", "<u2"], ["d", "<M8[s]"]], [["token", "<u2"], ["v", "|V1000000000"]],
    [["token", "<u2"], ["o", "|O"]], [["token", "<u2"], ["s", "|S3"]],
    [["token", "<u2"], ["not a name", "|u1"]], [["token", "<u2"], ["token", "|u1"]],
    [["x", "|u1"]], "<f4", "(", [["token", "<u2"], ["", "|V4"]],
])
def test_record_dtype_is_validated_before_use(dataset: Path, descr: Any) -> None:
    _edit(dataset, lambda m: m.update(record_dtype=descr))
    _raises(lambda: stream.open_dataset(dataset), "manifest.json", "record_dtype")
    assert stream.verify(dataset)[0].field == "record_dtype"


@pytest.mark.parametrize("name", [
    "", ".hidden", "a/b", "..", "a\\b", "a\x00b", "x" * 300, "\ud800", "tab\tname", 7, None,
])
def test_stream_shard_names_are_validated(dataset: Path, name: Any) -> None:
    _edit(dataset, lambda m: m["shards"][0].update(name=name))
    _raises(lambda: stream.open_dataset(dataset), "manifest.json", "shards[0].name")


def test_stream_shards_that_are_not_files(dataset: Path) -> None:
    _edit(dataset, lambda m: m["shards"][0].update(name="gone"))
    _raises(lambda: stream.open_dataset(dataset), "gone.tokens", "shards[0]")
    os.mkdir(dataset / "gone.tokens")
    for suffix in ("docs", "meta.index", "meta.data"):
        shutil.copy(dataset / f"00000.{suffix}", dataset / f"gone.{suffix}")
    size = os.stat(dataset / "gone.tokens").st_size
    _edit(dataset, lambda m: m["shards"][0]["files"]["tokens"].update(bytes=size))
    _raises(lambda: stream.open_dataset(dataset), "gone.tokens", "shards[0]")


@pytest.mark.parametrize("name", [
    "missing.batch", "dir.batch", "a\x00.batch", "x" * 300 + ".batch", "../s.batch",
    "a\\b.batch", "\ud800.batch", "fifo.batch", 5,
])
def test_batch_shard_names_are_validated(batches: Path, name: Any) -> None:
    (batches / "dir.batch").mkdir()
    os.mkfifo(batches / "fifo.batch")
    _edit(batches, lambda m: m["shards"][0].update(name=name))
    _raises(lambda: BatchFileReader(batches), "", "shards[0].name")


@pytest.mark.parametrize(("key", "value"), [
    ("dtype", ["uint32"]), ("dtype", {"a": 1}), ("dtype", "complex64"), ("seed", 2**64),
    ("batch_size", -1), ("version", [1]), ("shards", {"name": "x"}),
])
def test_batch_manifest_fields_are_validated(batches: Path, key: str, value: Any) -> None:
    _edit(batches, lambda m: m.update({key: value}))
    _raises(lambda: BatchFileReader(batches), "manifest.json", key)


@pytest.mark.parametrize(
    "serializer", ["", "custom:", " ", ["msgpack"], {"a": 1}, "a b", "<c8", "msgpack2", ".x"]
)
def test_serializer_names_are_validated(dataset: Path, serializer: Any) -> None:
    _edit(dataset, lambda m: m.update(metadata={"serializer": serializer}))
    _raises(lambda: stream.open_dataset(dataset), "manifest.json", "metadata")
    assert stream.verify(dataset)[0].field == "metadata"


# ------------------------------------------------------------------ verify


def _offsets(folder: Path, shard: str) -> np.memmap:
    return np.memmap(folder / f"{shard}.docs", dtype="<u8", mode="r+")


def test_verify_has_no_false_pass_on_overflowing_offsets(dataset: Path) -> None:
    table = _offsets(dataset, "00000")
    assert table.shape[0] >= 3
    table[1] = 2**63 + 5  # the step from it to the next one overflows int64
    table.flush()
    del table
    problems = [p for p in stream.verify(dataset) if p.field == "offsets"]
    assert problems and str(problems[0].path).endswith("00000.docs")
    _raises(lambda: _read_all(dataset), "00000.docs", "offsets")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_verify_reports_exactly_what_a_read_fails_on(
    pristine: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    folder = Path(shutil.copytree(pristine, tmp_path_factory.mktemp("v") / "ds"))
    table = _offsets(folder, "00000")
    position = data.draw(st.integers(0, table.shape[0] - 1))
    old = int(table[position])
    table[position] = data.draw(
        st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1, old + 1, max(0, old - 1)])
    )
    table.flush()
    del table
    problems = [p for p in stream.verify(folder) if p.field != "xxh3_64"]
    try:
        _read_all(folder)
    except FormatError as error:
        assert problems, f"verify passed a dataset whose read fails: {error}"
        assert any(str(p.path) == error.path for p in problems)
    else:  # the one spec rule reads do not need: entries stay inside their document
        assert all("crosses a document boundary" in p.message for p in problems), problems


# ------------------------------------------------------------------ numpy metadata


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _bomb(entry: bytes, shape: bytes) -> bytes:
    """``entry`` with its header's shape replaced by 2**30 items, same length
    (the header's space padding shrinks)."""
    grown = entry.replace(shape, b"(1073741824,)", 1)
    end = grown.index(b"\n")
    cut = len(grown) - len(entry)
    assert grown[end - cut : end] == b" " * cut
    return grown[: end - cut] + grown[end:]


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_npy_entries_are_capped_by_their_bytes() -> None:
    good = _npy(np.arange(6, dtype="<i4").reshape(2, 3))
    np.testing.assert_array_equal(npy_loads(good), np.arange(6).reshape(2, 3))
    fortran = _npy(np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    np.testing.assert_array_equal(npy_loads(fortran), np.arange(6.0).reshape(2, 3))
    crafted = _bomb(good, b"(2, 3)")
    assert len(crafted) == len(good)
    before = _peak_kib()
    with pytest.raises(ValueError, match="declares shape"):
        npy_loads(crafted)
    assert _peak_kib() - before < 64 << 10  # far below the 4 GiB np.load would take
    for bad in (_npy(np.array([object()])), _npy(np.zeros(2, dtype=[("a", "<i4")])), b"\x93NUMPY",
                good[:-1], good + b"x"):
        with pytest.raises(ValueError):
            npy_loads(bad)


def test_npy_metadata_bomb_is_a_format_error(tmp_path: Path) -> None:
    corpus = random_corpus(np.random.default_rng(4), docs=3, max_len=8, spans=True)
    corpus.spans[:] = [[(0, 1, np.arange(4, dtype="<i8"))] for _ in corpus.spans]
    folder = write(tmp_path / "np", corpus, metadata="numpy", mask=False)
    data = (folder / "00000.meta.data").read_bytes()
    entry = _npy(np.arange(4, dtype="<i8"))
    assert data.startswith(entry)
    (folder / "00000.meta.data").write_bytes(_bomb(entry, b"(4,)") + data[len(entry):])
    problems = stream.verify(folder)
    assert any(p.field == "entries" and "declares shape" in p.message for p in problems)
    before = _peak_kib()
    _raises(lambda: _read_all(folder), "np", "meta.data")
    assert _peak_kib() - before < 64 << 10


# ------------------------------------------------------------------ frames


@pytest.mark.parametrize("dtype", [["<i4"], {"a": "<i4"}, 5, None, b"<i4"])
@pytest.mark.parametrize("kind", ["dense", "jagged", ["dense"], {"k": 1}])
def test_frame_field_dtype_of_any_type(dtype: Any, kind: Any) -> None:
    batch = Batch.from_columns({"x": np.arange(6, dtype=np.int32).reshape(3, 2)})
    frames = batch.to_frames()
    header = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
    header["meta"]["fields"][0][1:3] = [kind, dtype]
    frames[0] = msgpack.packb(header, use_bin_type=True)
    _raises(lambda: Batch.from_frames(frames), "frame 0", "x")
    wire = batch.meta.to_wire()
    wire["fields"][0][1:3] = [kind, dtype]
    _raises(lambda: BatchMeta.from_bytes(msgpack.packb(wire, use_bin_type=True)), "meta", "x")


# ------------------------------------------------------------------ empty datasets


@pytest.mark.parametrize("metadata", [None, "msgpack"])
@pytest.mark.parametrize("empty_shard", [False, True])
def test_empty_datasets_read_empty_batches(
    tmp_path: Path, metadata: str | None, empty_shard: bool
) -> None:
    folder = tmp_path / "empty"
    with stream.StreamWriter(folder, metadata=metadata, fields={"mask": "u1"}):
        pass
    if empty_shard:  # a shard that holds no token at all
        (folder / "00000.tokens").write_bytes(b"")
        (folder / "00000.docs").write_bytes(bytes(8))
        files = {"tokens": 0, "docs": 8}
        if metadata:
            (folder / "00000.meta.index").write_bytes(bytes(8))
            (folder / "00000.meta.data").write_bytes(b"")
            (folder / "00000.meta.spans").write_bytes(b"")
            files.update({"meta.index": 8, "meta.data": 0, "meta.spans": 0})
        _edit(folder, lambda m: m["shards"].append({
            "name": "00000", "records": 0, "documents": 0,
            "metadata_entries": 0 if metadata else None,
            "files": {k: {"bytes": v, "xxh3_64": xxhash.xxh3_64_hexdigest(bytes(v))}
                      for k, v in files.items()},
        }))
    ds = stream.open_dataset(folder)
    assert ds.num_tokens == 0 and ds.num_documents == 0
    windows, documents = ds.windows(8, columns="all"), ds.documents()
    assert len(windows) == 0 and len(documents) == 0
    for source in (windows, documents):
        batch = source.read([])
        assert len(batch) == 0
        assert len(batch["input_ids"]) == 0
        if metadata:
            assert list(batch["metadata"]) == []
    assert stream.verify(folder) == []


def test_opening_allocates_by_the_manifest_not_its_limit(
    dataset: Path, batches: Path
) -> None:
    """Reading a manifest asked ``read`` for its size limit plus one (256 MiB
    for a stream dataset, 64 MiB for a batch folder), which Python allocates
    up front: a transient allocation far larger than the file."""
    import tracemalloc

    for _ in range(2):  # the first round imports and compiles
        tracemalloc.start()
        try:
            stream.open_dataset(dataset).close()
            BatchFileReader(batches).close()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 4 << 20, peak
