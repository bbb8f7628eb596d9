"""Overlapping and nested annotations (format version 2): every window and
document lists each entry overlapping it once, clipped, as a plain-Python model
says; datasets written before (version 1) read as they did."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobatch import stream
from zerobatch.errors import FormatError
from zerobatch.stream.manifest import SPANS_VERSION

V1_DATASET = Path(__file__).parent / "data" / "stream-v1-metadata"
"""Written by zerobatch before version 2 (``StreamWriter(metadata="msgpack",
shard_tokens=16, fields={"loss_mask": "u1"})``) from ``V1_DOCUMENTS``."""

V1_DOCUMENTS: list[tuple[list[int], Any, list[tuple[int, int, Any]]]] = [
    (list(range(1, 8)), {"url": "a"}, []),
    (list(range(10, 16)), None, [(0, 2, "x"), (3, 6, {"k": [1, 2]})]),
    (list(range(20, 30)), None, [(4, 5, "y")]),
    ([40, 41, 42], "doc3", []),
]

Document = tuple[list[int], Any, list[tuple[int, int, Any]]]


def _entries(documents: list[Document]) -> list[tuple[int, int, bool, Any]]:
    """Every entry in stream coordinates, in the order reads list them:
    by document, then start, a document's own metadata first, longer first,
    then as given."""
    out: list[tuple[int, int, bool, Any]] = []
    offset = 0
    for tokens, metadata, spans in documents:
        mine = [(0, len(tokens), True, metadata)] if metadata is not None else []
        mine += [(a, b, False, v) for a, b, v in spans]
        mine.sort(key=lambda e: (e[0], not e[2], -e[1]))
        out += [(offset + a, offset + b, doc, v) for a, b, doc, v in mine]
        offset += len(tokens)
    return out


def _model(entries: list[tuple[int, int, bool, Any]], lo: int, hi: int, *,
           documents_only: bool = False) -> list[tuple[int, int, Any]]:
    """The entries overlapping tokens ``[lo, hi)``, clipped, in window coordinates."""
    return [(max(a, lo) - lo, min(b, hi) - lo, v) for a, b, doc, v in entries
            if a < hi and b > lo and (doc or not documents_only)]


def _write(path: Path, documents: list[Document], **options: Any) -> stream.Dataset:
    with stream.StreamWriter(path, metadata="msgpack", **options) as writer:
        for tokens, metadata, spans in documents:
            writer.add_document(tokens, metadata=metadata, spans=spans)
    opened = stream.open_dataset(path)
    assert isinstance(opened, stream.Dataset)
    return opened


def _check_reads(ds: stream.Dataset, documents: list[Document], seq_len: int, stride: int,
                 *, document_column: bool) -> None:
    entries = _entries(documents)
    windows = ds.windows(seq_len, stride=stride, columns="all")
    order = np.arange(len(windows))[::-1]  # any order: reversed
    batch = windows.read(order)
    for row, i in enumerate(order.tolist()):
        lo = i * stride
        assert batch["metadata"][row] == _model(entries, lo, lo + seq_len)
        if document_column:
            assert batch["document_metadata"][row] == _model(
                entries, lo, lo + seq_len, documents_only=True)
    assert ("document_metadata" in windows.columns) == document_column
    docs = ds.documents(max_len=max(1, seq_len // 2)).read(np.arange(len(documents)))
    offset = 0
    for d, (tokens, _, _) in enumerate(documents):
        end = offset + min(len(tokens), max(1, seq_len // 2))
        assert docs["metadata"][d] == _model(entries, offset, end)
        if document_column:
            assert docs["document_metadata"][d] == _model(entries, offset, end,
                                                          documents_only=True)
        offset += len(tokens)


@st.composite
def _documents(draw: st.DrawFn) -> list[Document]:
    out: list[Document] = []
    for d in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 24))
        metadata = draw(st.one_of(st.none(), st.just({"doc": d})))
        spans = []
        for k in range(draw(st.integers(0, 6))):
            a = draw(st.integers(0, n - 1))
            b = draw(st.integers(a + 1, n))
            spans.append((a, b, [d, k]))
        out.append((list(range(n)), metadata, spans))
    return out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents=_documents(), shard_tokens=st.integers(1, 40), seq_len=st.integers(1, 12),
       stride=st.integers(1, 5))
def test_every_window_lists_every_overlapping_entry(
    tmp_path: Path, documents: list[Document], shard_tokens: int, seq_len: int, stride: int
) -> None:
    folder = tmp_path / "ds"
    shutil.rmtree(folder, ignore_errors=True)
    with _write(folder, documents, shard_tokens=shard_tokens) as ds:
        assert ds.manifest.version == SPANS_VERSION
        _check_reads(ds, documents, seq_len, stride, document_column=True)


def test_nested_and_overlapping_verify_and_combine(tmp_path: Path) -> None:
    nested: list[Document] = [
        (list(range(30)), {"path": "a.py"},
         [(0, 30, "class"), (2, 10, "method 1"), (4, 6, "keyword"), (12, 28, "method 2"),
          (8, 14, "crosses both methods"), (12, 28, "same extent as method 2")]),
        (list(range(5)), None, []),
        (list(range(9)), "only document metadata", []),
    ]
    whole = _write(tmp_path / "whole", nested, shard_tokens=35)
    assert stream.verify(tmp_path / "whole") == []
    parts = [_write(tmp_path / f"part{i}", [doc]).path for i, doc in enumerate(nested)]
    combined = stream.open_dataset(stream.combine(parts, tmp_path / "all"))
    assert isinstance(combined, stream.Dataset)
    for ds in (whole, combined):
        for seq_len, stride in ((1, 1), (7, 3), (40, 1)):
            _check_reads(ds, nested, seq_len, stride, document_column=True)
    assert stream.verify(tmp_path / "all") == []
    batch = whole.windows(8, columns="all").read([1])  # tokens 8..16 of the nested document
    assert batch["metadata"][0] == [(0, 8, {"path": "a.py"}), (0, 8, "class"),
                                    (0, 2, "method 1"), (0, 6, "crosses both methods"),
                                    (4, 8, "method 2"), (4, 8, "same extent as method 2")]
    assert batch["document_metadata"][0] == [(0, 8, {"path": "a.py"})]


def test_version_1_datasets_read_as_before(tmp_path: Path) -> None:
    ds = stream.open_dataset(V1_DATASET)
    assert isinstance(ds, stream.Dataset) and ds.manifest.version == 1
    for seq_len, stride in ((1, 1), (5, 2), (20, 1)):
        _check_reads(ds, V1_DOCUMENTS, seq_len, stride, document_column=False)
    assert stream.verify(V1_DATASET) == []
    new = _write(tmp_path / "v2", V1_DOCUMENTS, fields={"loss_mask": "u1"})
    with pytest.raises(ValueError, match="format version is 2, the first dataset's is 1"):
        stream.combine([V1_DATASET, new.path], tmp_path / "mixed")


def test_a_newer_version_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "v1"
    shutil.copytree(V1_DATASET, folder)
    manifest = folder / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"version": 1', '"version": 3'))
    with pytest.raises(FormatError, match=r"version.*expected one of \(1, 2\), found 3"):
        stream.open_dataset(folder)


def test_version_2_needs_metadata(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    with stream.StreamWriter(folder) as writer:
        writer.add_document([1, 2, 3])
    manifest = folder / "manifest.json"
    assert '"version": 1' in manifest.read_text()  # no metadata: the version-1 layout
    manifest.write_text(manifest.read_text().replace('"version": 1', '"version": 2'))
    with pytest.raises(FormatError, match="only for datasets with metadata"):
        stream.open_dataset(folder)


@pytest.mark.parametrize(("spans", "message"), [
    ([(0, 4, "past the end")], r"spans\[0\] = \(0, 4\) must satisfy 0 <= start < end <= 3"),
    ([(0, 3, "ok"), (2, 1, "backwards")], r"spans\[1\] = \(2, 1\) must satisfy"),
    ([(-1, 2, "before the start")], r"spans\[0\] = \(-1, 2\)"),
])
def test_bad_spans_name_the_argument(tmp_path: Path, spans: list, message: str) -> None:
    with stream.StreamWriter(tmp_path / "ds", metadata="msgpack") as writer, \
            pytest.raises(ValueError, match=message):
        writer.add_document([1, 2, 3], metadata="doc", spans=spans)
