"""ManyWindows: windows of many local datasets read in one call equal each
source's own read, row by row, for every column set; errors are the sources' own."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch import FormatError, Loader, Mixture, StreamWriter, open_dataset
from zerobatch.columnar import Jagged
from zerobatch.stream.many import ManyWindows


def _corpus(folder: Path, seed: int, documents: int, token_dtype: str = "<u2",
            high: int = 1000) -> Path:
    rng = np.random.default_rng(seed)
    with StreamWriter(folder, shard_tokens=700, token_dtype=token_dtype) as writer:
        for _ in range(documents):
            writer.add_document(rng.integers(0, high, size=int(rng.integers(3, 40))))
    return folder


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("many")
    return [_corpus(root / f"c{i}", i, 40 + 30 * i) for i in range(4)]


OPTIONS: list[dict[str, Any]] = [
    {},
    {"document_masking": True},
    {"labels": "aligned", "document_masking": True},
    {"dtype": "int32", "columns": ("input_ids", "labels", "seq_idx", "max_seqlen")},
    {"labels": False},
    {"columns": ("labels",)},
]


def _equal(got: Any, want: Any) -> None:
    if isinstance(want, Jagged):
        assert isinstance(got, Jagged)
        np.testing.assert_array_equal(got.offsets, want.offsets)
        np.testing.assert_array_equal(got.values, want.values)
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def _check_rows(group: ManyWindows, windows: list[Any], sources: np.ndarray,
                indices: np.ndarray) -> None:
    columns, schema = group.read(sources, indices)
    expected = [w.read(indices[b:b + 1]) for b, w in
                ((b, windows[s]) for b, s in enumerate(sources.tolist()))]
    names = list(expected[0].fields) if expected else list(columns)
    assert list(columns) == names
    assert list(schema) == names
    for name in names:
        for b, batch in enumerate(expected):
            if isinstance(columns[name], Jagged):
                np.testing.assert_array_equal(columns[name][b], batch[name][0])
            elif name == "seq_idx":  # numbered over the batch: compare its segment boundaries
                row = columns[name][b]
                np.testing.assert_array_equal(row - row[0], batch[name][0])
            else:
                _equal(columns[name][b], batch[name][0])


@pytest.mark.parametrize("options", OPTIONS)
def test_rows_equal_each_sources_own_read(corpora: list[Path], options: dict[str, Any]) -> None:
    datasets = [open_dataset(p) for p in corpora]
    # two views of one dataset (other strides) share its record range
    windows = [ds.windows(16, **options) for ds in datasets]
    windows.append(datasets[1].windows(16, stride=5, **options))
    group = ManyWindows.of(windows)
    assert group is not None
    rng = np.random.default_rng(0)
    for rows in (1, 7, 64):
        sources = rng.integers(0, len(windows), size=rows).astype(np.int64)
        indices = np.array([rng.integers(0, len(windows[s])) for s in sources.tolist()],
                           dtype=np.int64)
        _check_rows(group, windows, sources, indices)
    # a whole batch from the sources' own reads, jagged columns included
    sources = np.repeat(np.arange(len(windows)), 3).astype(np.int64)
    indices = np.tile(np.arange(3), len(windows)).astype(np.int64)
    columns, _ = group.read(sources, indices)
    for s, w in enumerate(windows):
        mine = w.read(np.arange(3))
        for name in mine.fields:
            if name in ("seq_idx",):
                continue
            if isinstance(mine[name], Jagged):
                for r in range(3):
                    np.testing.assert_array_equal(columns[name][3 * s + r], mine[name][r])
            else:
                _equal(columns[name][3 * s:3 * s + 3], mine[name])


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_rows_equal_their_sources_reads(corpora: list[Path], data: Any) -> None:
    windows = [open_dataset(p).windows(8, document_masking=True) for p in corpora]
    group = ManyWindows.of(windows)
    assert group is not None
    rows = data.draw(st.lists(st.integers(0, len(windows) - 1), min_size=0, max_size=30))
    indices = [data.draw(st.integers(0, len(windows[s]) - 1)) for s in rows]
    _check_rows(group, windows, np.array(rows, np.int64), np.array(indices, np.int64))


def test_of_refuses_what_one_call_cannot_read(corpora: list[Path], tmp_path: Path) -> None:
    ds = open_dataset(corpora[0])
    other = open_dataset(corpora[1])
    assert ManyWindows.of([ds.windows(8), None, other.windows(8)]) is not None
    assert ManyWindows.of([ds.windows(8), other.windows(16)]) is None  # seq_len
    assert ManyWindows.of([ds.windows(8), other.windows(8, dtype="int32")]) is None
    assert ManyWindows.of([ds.windows(8), other.windows(8, document_masking=True)]) is None
    assert ManyWindows.of([ds.windows(8, dtype="stored")]) is None  # not the cast path
    assert ManyWindows.of([ds.windows(8, columns=("input_ids", "doc_ids"))]) is None
    assert ManyWindows.of([ds.documents()]) is None
    wide = open_dataset(_corpus(tmp_path / "wide", 9, 20, "<u4"))
    assert ManyWindows.of([ds.windows(8), wide.windows(8)]) is None  # record dtype
    assert ManyWindows.of([None]) is None


def test_errors_are_the_sources_own(corpora: list[Path], tmp_path: Path) -> None:
    a, b = open_dataset(corpora[0]), open_dataset(corpora[2])
    group = ManyWindows.of([a.windows(8), None, b.windows(8)])
    assert group is not None
    with pytest.raises(IndexError, match="out of range"):
        group.read(np.array([0, 2], np.int64), np.array([0, len(b.windows(8))], np.int64))
    with pytest.raises(IndexError, match="cannot be read"):
        group.read(np.array([1], np.int64), np.array([0], np.int64))
    group.read(np.array([0, 2], np.int64), np.array([0, 1], np.int64))
    b.close()
    with pytest.raises(ValueError, match="closed"):
        group.read(np.array([2], np.int64), np.array([1], np.int64))
    group.read(np.array([0], np.int64), np.array([1], np.int64))  # the other still reads
    # a token the output dtype cannot hold: the source's FormatError, naming the file
    big = open_dataset(_corpus(tmp_path / "big", 5, 30, "<u4", high=2**32 - 1))
    small = open_dataset(_corpus(tmp_path / "small", 6, 30, "<u4"))
    group = ManyWindows.of([small.windows(8, dtype="int32"), big.windows(8, dtype="int32")])
    assert group is not None
    with pytest.raises(FormatError, match="tokens"):
        group.read(np.array([0, 1], np.int64), np.arange(2, dtype=np.int64))


def test_a_mixture_reads_its_windows_in_one_call(corpora: list[Path]) -> None:
    class Wrapped:  # the same windows through a plain source: the per-source path
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.seq_len = inner.seq_len
            self.columns = inner.columns

        def __len__(self) -> int:
            return len(self.inner)

        def read(self, indices: np.ndarray) -> Any:
            return self.inner.read(indices)

    for options in ({}, {"document_masking": True}):
        windows = {f"c{i}": open_dataset(p).windows(8, **options) for i, p in enumerate(corpora)}
        weights = {"c0": 1.0, "c1": 2.0, "c2": 0.5, "c3": 1.5}
        fast = Mixture(windows, weights, seed=4, length=2_000, block_size=64)
        slow = Mixture({n: Wrapped(w) for n, w in windows.items()}, weights, seed=4,
                       length=2_000, block_size=64)
        assert fast._windows() is not None and slow._windows() is None
        assert fast.reads_wait is False and slow.reads_wait is True  # local files only
        for positions in (np.arange(100, 164), np.arange(60, 70), np.array([5, 1999, 7, 5]),
                          np.arange(0, 2_000, 37)):
            got, want = fast.read(positions), slow.read(positions)
            assert got.fields == want.fields
            np.testing.assert_array_equal(got.meta.global_indexes, want.meta.global_indexes)
            for name in want.fields:
                if name == "seq_idx":
                    continue
                if isinstance(want[name], Jagged):
                    _equal(got[name], want[name])
                else:
                    _equal(got[name], want[name])
        # a copy (spawn workers) reads the same, its files opened again
        copy = pickle.loads(pickle.dumps(fast))
        assert copy._windows() is not None
        _equal(copy.read(np.arange(64))["input_ids"], fast.read(np.arange(64))["input_ids"])
        # through the Loader, output numpy: the sources' collation (flat cu_seqlens)
        batch = next(iter(Loader(fast, 16, output="numpy")))
        expected = windows["c0"].collate(fast.read(np.arange(16)), "numpy")
        assert set(batch) == set(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(batch[name], value)


def _same_step(got: Any, want: Any) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        if isinstance(value, int):
            assert got[name] == value and type(got[name]) is int
        elif isinstance(value, tuple):  # torch's (values, offsets)
            for a, b in zip(got[name], value, strict=True):
                assert a.dtype == b.dtype and bool((a == b).all())
        elif hasattr(value, "numpy"):  # a tensor
            assert got[name].dtype == value.dtype and bool((got[name] == value).all())
        else:
            _equal(got[name], value)


@pytest.mark.parametrize("options", OPTIONS)
def test_a_mixtures_read_collated_equals_read_then_collate(corpora: list[Path],
                                                           options: dict[str, Any]) -> None:
    """The Loader's one-step read of a mixture (``read_collated``: no Batch in
    between) gives exactly ``collate(read_indices(...))``, with and without
    the padding column, for numpy and torch; so does the Loader."""
    from zerobatch.source import read_indices

    windows = {f"c{i}": open_dataset(p).windows(8, **options) for i, p in enumerate(corpora)}
    mixture = Mixture(windows, {"c0": 1.0, "c1": 2.0, "c2": 0.5, "c3": 1.5}, seed=3,
                      length=900, block_size=64)
    assert mixture._windows() is not None and mixture.collate is not None
    rng = np.random.default_rng(0)
    for positions in (np.arange(60, 76), rng.integers(0, 900, 33), np.arange(0)):
        padding = rng.random(positions.shape[0]) < 0.3
        for pad in (None, padding):
            for output in ("numpy", "torch"):
                want = mixture.collate(read_indices(mixture, positions, pad), output=output)
                _same_step(mixture.read_collated(positions, pad, output), want)
    # the Loader takes it (no transform), padding its last step: the same batches as
    # collating the Batch output
    loader = Loader(mixture, 40, output="numpy", drop_last=False, shuffle=False)
    collated = list(loader)
    assert loader._collated is not None  # the one-step path was the one taken
    batches = list(Loader(mixture, 40, output="batch", drop_last=False, shuffle=False))
    assert len(collated) == len(batches) and "padding" in collated[-1]
    for got, batch in zip(collated, batches, strict=True):
        _same_step(got, mixture.collate(batch, output="numpy"))
