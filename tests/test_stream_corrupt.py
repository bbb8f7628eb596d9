"""Hostile token-stream datasets: each corruption raises FormatError naming the
file and the field, and ``verify`` reports it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stream_helpers import random_corpus, write

from zerobatch import stream
from zerobatch.errors import FormatError


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    corpus = random_corpus(np.random.default_rng(7), docs=12, max_len=30, spans=True)
    return write(tmp_path / "ds", corpus, shard_tokens=1000)


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _rewrite_manifest(path: Path, edit: object) -> None:
    raw = _manifest(path)
    edit(raw)  # type: ignore[operator]  # a callable passed by the tests
    (path / "manifest.json").write_text(json.dumps(raw))


def _poke(path: Path, dtype: str, position: int, value: int) -> None:
    array = np.memmap(path, dtype=dtype, mode="r+")
    array[position] = value
    array.flush()


def _read_all(path: Path) -> None:
    """Read every window (positions alone first: their own kernel), every
    one-token window (each token is then the first of a window: version 2
    reads only that token's metadata id) and document, and decode every
    metadata value."""
    ds = stream.open_dataset(path)
    positions = ds.windows(8, columns=("position_ids",))
    positions.read(np.arange(len(positions)))
    ds.windows(1, labels=False, columns="all").read(np.arange(ds.num_tokens))
    for batch in (ds.windows(8, columns="all").read(np.arange(len(ds.windows(8)))),
                  ds.documents().read(np.arange(ds.num_documents))):
        if "metadata" in batch:
            assert all(len(list(spans)) == len(spans) for spans in batch["metadata"])


def _expect(path: Path, file: str, field: str) -> None:
    with pytest.raises(FormatError) as info:
        _read_all(path)
    assert info.value.path is not None and info.value.path.endswith(file)
    assert info.value.field == field
    assert file in str(info.value) and field in str(info.value)
    problems = stream.verify(path)
    assert problems and any(str(p.path).endswith(file) for p in problems)


def test_truncated_shard(dataset: Path) -> None:
    tokens = dataset / "00000.tokens"
    tokens.write_bytes(tokens.read_bytes()[:-3])
    _expect(dataset, "00000.tokens", "files.tokens.bytes")


def test_manifest_disagrees_with_sizes(dataset: Path) -> None:
    def edit(raw: dict) -> None:
        raw["shards"][0]["records"] += 1
    _rewrite_manifest(dataset, edit)
    _expect(dataset, "00000.tokens", "files.tokens.bytes")


def test_truncated_file_read_after_open(dataset: Path) -> None:
    ds = stream.open_dataset(dataset)
    tokens = dataset / "00000.tokens"
    tokens.write_bytes(tokens.read_bytes()[:100])
    with pytest.raises(FormatError, match=r"00000\.tokens.*truncated"):
        ds.windows(8, columns="all").read([len(ds.windows(8)) - 1])


@pytest.mark.parametrize("suffix", ["meta.data", "meta.index", "meta.spans", "docs"])
@pytest.mark.parametrize("cut", [1, 8])
def test_offsets_or_data_truncated_after_open(dataset: Path, suffix: str, cut: int) -> None:
    ds = stream.open_dataset(dataset)
    target = dataset / f"00000.{suffix}"
    target.write_bytes(target.read_bytes()[:-cut])
    with pytest.raises(FormatError, match=rf"00000\.{suffix}") as info:
        ds.windows(8, columns="all").read([0])
    fields = {"meta.data": "bytes", "meta.spans": "rows"}
    assert info.value.field == fields.get(suffix, "offsets")


@pytest.mark.parametrize(("entry", "column", "value"), [
    (1, 2, 7),  # an unknown kind
    (2, 1, 10**9),  # an end past the shard
    (0, 0, 10**6),  # a start past its end
])
def test_metadata_spans_rows(dataset: Path, entry: int, column: int, value: int) -> None:
    _poke(dataset / "00000.meta.spans", "<u8", 3 * entry + column, value)
    _expect(dataset, "00000.meta.spans", "rows")


@pytest.mark.parametrize(("position", "value"), [(3, 0), (3, 10**9), (-1, 5)])
def test_document_offsets(dataset: Path, position: int, value: int) -> None:
    _poke(dataset / "00000.docs", "<u8", position, value)
    _expect(dataset, "00000.docs", "offsets")


@pytest.mark.parametrize(("position", "value"), [(2, 0), (2, 10**9)])
def test_metadata_index(dataset: Path, position: int, value: int) -> None:
    _poke(dataset / "00000.meta.index", "<u8", position, value)
    _expect(dataset, "00000.meta.index", "offsets")


def _run_starts(records: np.ndarray) -> np.ndarray:
    """Positions of the first token of each run of one metadata id."""
    ids = records["meta_id"].astype(np.int64)
    return np.flatnonzero((ids != 2**32 - 1) & (np.diff(ids, prepend=-1) != 0))


@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])  # the first, a middle or the last run
@pytest.mark.parametrize(("kind", "message"), [("range", "out of range"),
                                               ("order", "does not cover its token")])
def test_metadata_ids(dataset: Path, where: float, kind: str, message: str) -> None:
    ds = stream.open_dataset(dataset)
    records = np.memmap(dataset / "00000.tokens", dtype=ds.manifest.record_dtype, mode="r+")
    starts = _run_starts(records)
    position = starts[round(where * (len(starts) - 1))]
    old = int(records["meta_id"][position])
    records["meta_id"][position] = 10**6 if kind == "range" else (0 if old else 1)
    records.flush()
    _expect(dataset, "00000.tokens", "meta_id")
    with pytest.raises(FormatError, match=message):
        _read_all(dataset)


@pytest.mark.parametrize("pick", [0.1, 0.5, 0.9])
def test_metadata_id_inside_a_run(dataset: Path, pick: float) -> None:
    """Reads find a run's end by probing, so an id strictly inside a run is
    checked only if a probe lands on it: the read then fails, else its output is
    unchanged. verify reads every id and always reports it."""
    ds = stream.open_dataset(dataset)
    windows = ds.windows(8, columns="all")
    before = [s.tolist() for s in windows.read(np.arange(len(windows)))["metadata"]]
    records = np.memmap(dataset / "00000.tokens", dtype=ds.manifest.record_dtype, mode="r+")
    ids = records["meta_id"]
    inside = np.flatnonzero((ids[1:-1] == ids[:-2]) & (ids[1:-1] == ids[2:])
                            & (ids[1:-1] != 2**32 - 1)) + 1
    records["meta_id"][inside[round(pick * (len(inside) - 1))]] = 10**6
    records.flush()
    again = stream.open_dataset(dataset).windows(8, columns="all")
    try:
        assert again.read(np.arange(len(again)))["metadata"] == before
    except FormatError as error:
        assert error.field == "meta_id" and "00000.tokens" in str(error.path)
    problems = stream.verify(dataset)
    assert any(p.field == "meta_id" and str(p.path).endswith("00000.tokens") for p in problems)


@pytest.mark.parametrize(("key", "value", "field"), [
    ("record_dtype", "<f4", "record_dtype"),
    ("record_dtype", "not a dtype", "record_dtype"),
    ("record_dtype", [["token", "<u8"]], "record_dtype"),
    ("format", "other", "format"),
    ("version", 99, "version"),
    ("shards", {}, "shards"),
])
def test_bad_manifest(dataset: Path, key: str, value: object, field: str) -> None:
    def edit(raw: dict) -> None:
        raw[key] = value
    _rewrite_manifest(dataset, edit)
    with pytest.raises(FormatError) as info:
        stream.open_dataset(dataset)
    assert info.value.field == field and "manifest.json" in str(info.value)
    assert stream.verify(dataset)[0].field == field


def test_manifest_not_json(dataset: Path) -> None:
    (dataset / "manifest.json").write_bytes(b'{"format": "zerob')
    with pytest.raises(FormatError, match="not fully written"):
        stream.open_dataset(dataset)


def test_checksum_mismatch_found_by_verify(dataset: Path) -> None:
    _poke(dataset / "00000.tokens", "u1", 0, 255 - np.fromfile(dataset / "00000.tokens",
                                                               dtype="u1")[0])
    problems = stream.verify(dataset)
    assert [p.field for p in problems] == ["xxh3_64"]
    assert "1 problem" in stream.format_problems(dataset, problems)


def test_undecodable_entry_found_by_verify(dataset: Path) -> None:
    data = dataset / "00000.meta.data"
    data.write_bytes(b"\xc1" * data.stat().st_size)
    problems = stream.verify(dataset)
    assert {p.field for p in problems} == {"xxh3_64", "entries"}
    batch = stream.open_dataset(dataset).documents().read([0, 1, 2])  # values decode lazily
    assert [spans.starts.size for spans in batch["metadata"]] == [len(s) for s in batch["metadata"]]
    for touch in (lambda spans: spans.values, list, lambda spans: spans[0]):
        with pytest.raises(FormatError, match=r"meta\.data"):
            touch(batch["metadata"][0])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=st.sampled_from(["tokens", "docs", "meta.index", "meta.data"]),
       data=st.data())
def test_flipped_bytes_never_crash(tmp_path_factory: pytest.TempPathFactory, suffix: str,
                                   data: st.DataObject) -> None:
    corpus = random_corpus(np.random.default_rng(11), docs=6, max_len=20, spans=True)
    path = write(tmp_path_factory.mktemp("ds") / "ds", corpus, shard_tokens=40)
    target = path / f"00000.{suffix}"
    raw = bytearray(target.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    target.write_bytes(bytes(raw))
    try:
        _read_all(path)
    except FormatError as error:
        assert error.path is not None and error.field is not None
    assert isinstance(stream.verify(path), list)


class _Forwarding:
    """Any storage but LocalStorage: readers take the records path."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def _positions_or_error(ds: stream.Dataset) -> object:
    windows = ds.windows(8, columns=("input_ids", "labels", "position_ids"))
    try:
        batch = windows.read(np.arange(len(windows)))
    except FormatError as error:
        return type(error), str(error), error.field
    return [batch[name].tolist() for name in batch.fields]


@pytest.mark.parametrize("method", ["pread", "mmap"])
@pytest.mark.parametrize(("position", "value"), [(3, 0), (3, 10**9), (-1, 5), (-2, 2**63),
                                                 (2, 0)])
def test_document_offsets_direct_read(tmp_path: Path, method: str, position: int,
                                      value: int) -> None:
    """The direct read of a tokens-only dataset gives what the records path
    gives on corrupt offsets: the same error, or the same (wrong but in-range)
    positions where reading positions alone cannot tell (``verify`` does)."""
    from zerobatch.storage import LocalStorage

    corpus = random_corpus(np.random.default_rng(8), docs=12, max_len=30)
    path = write(tmp_path / "ds", corpus, metadata=None, mask=False, shard_tokens=1000)
    _poke(path / "00000.docs", "<u8", position, value)
    local = LocalStorage(path, method=method)  # type: ignore[arg-type]
    direct = _positions_or_error(stream.open_dataset(path, storage=local))
    records = _positions_or_error(stream.open_dataset(path, storage=_Forwarding(local)))  # type: ignore[arg-type]
    assert direct == records
    if position in (-1, 2):  # the file's last offset; a search that finds no document
        assert direct[0] is FormatError and "00000.docs" in direct[1]  # type: ignore[index]
    assert stream.verify(path)
