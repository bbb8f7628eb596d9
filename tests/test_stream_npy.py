"""Folders of .npy token files as one token stream (no JAX needed)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zerobatch
from zerobatch.stream.npy import NpyTokens, open_npy


@settings(max_examples=40, deadline=None)
@given(size=st.integers(2, 400), seq_len=st.integers(1, 40), data=st.data())
def test_windows_are_the_concatenated_stream(size: int, seq_len: int,
                                             data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=6)))
    dtype = data.draw(st.sampled_from(["<u2", "<u4", "<i8", "|u1"]))
    tokens = np.random.default_rng(size).integers(0, 200, size=size).astype(dtype)
    with tempfile.TemporaryDirectory() as folder:
        for i, part in enumerate(np.split(tokens, cuts)):
            np.save(Path(folder) / f"{i:04d}.npy", part)
        windows = open_npy(folder).windows(seq_len, dtype="int32")
        assert len(windows) == (size - 1) // seq_len
        order = np.random.default_rng(seq_len).permutation(len(windows))
        batch = windows.read(order)
        starts = order * seq_len
        stream = tokens.astype(np.int64)
        np.testing.assert_array_equal(batch["input_ids"],
                                      stream[starts[:, None] + np.arange(seq_len)])
        np.testing.assert_array_equal(batch["labels"],
                                      stream[starts[:, None] + 1 + np.arange(seq_len)])
        np.testing.assert_array_equal(batch.meta.global_indexes, order)


def test_open_dataset_accepts_a_npy_folder(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.uint16))
    np.save(tmp_path / "b.npy", np.arange(10, 30, dtype=np.uint16))
    tokens = zerobatch.open_dataset(tmp_path)
    assert isinstance(tokens, NpyTokens) and tokens.num_tokens == 30
    windows = tokens.windows(5)
    assert windows.read([1])["labels"].tolist() == [[6, 7, 8, 9, 10]]
    with pytest.raises(IndexError):
        windows.read([len(windows)])
    with pytest.raises(ValueError, match="dtype must be"):
        tokens.windows(5, dtype="float32")
    assert windows.fingerprint != tokens.windows(4).fingerprint
    tokens.close()


@pytest.mark.parametrize(("stored", "value", "dtype", "message"), [
    ("<i2", -3, "int64", "negative"),
    ("<i8", -(2**40), "int32", "negative"),
    ("<u8", 2**63, "int64", "dtype='stored'"),
    ("<u8", 2**31, "int32", "dtype='int64'"),
    ("<i4", 2**31 - 1, "int32", None),  # fits: no error
])
def test_token_ids_that_do_not_fit_raise(tmp_path: Path, stored: str, value: int, dtype: str,
                                         message: str | None) -> None:
    """An id the output dtype cannot hold (or a negative one) raises FormatError
    naming the file and the record, checked in the cast's own pass."""
    from zerobatch.errors import FormatError

    np.save(tmp_path / "0.npy", np.arange(10, dtype=stored))
    tokens = np.arange(10, 20).astype(stored)
    tokens[3] = value
    np.save(tmp_path / "1.npy", tokens)
    windows = open_npy(tmp_path).windows(4, dtype=dtype)
    assert windows.read([0, 1])["input_ids"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    if message is None:
        assert windows.read([3])["input_ids"][0, 1] == value
        return
    with pytest.raises(FormatError, match=rf"token id {value} at record 3 .*{message}") as info:
        windows.read([0, 3])  # stream token 13: record 3 of 1.npy
    assert str(info.value.path).endswith("1.npy")


def test_verify_npy_names_every_file(tmp_path: Path) -> None:
    """verify_npy reports each bad file (header, dtype, an id the output dtype
    cannot hold) instead of stopping at the first, naming file and field."""
    from zerobatch.stream.npy import verify_npy

    np.save(tmp_path / "0.npy", np.arange(10, dtype="<i4"))
    assert verify_npy(tmp_path) == [] and verify_npy(tmp_path, dtype="int32") == []
    np.save(tmp_path / "1.npy", np.array([5, -2, 7], dtype="<i4"))
    np.save(tmp_path / "2.npy", np.arange(3, dtype="<u2"))
    (tmp_path / "3.npy").write_bytes(b"\x93NUMPY\x01\x00")
    found = {(Path(p.path).name, p.field) for p in verify_npy(tmp_path)}
    assert found == {("1.npy", "data"), ("2.npy", "descr"), ("3.npy", "header")}


_NPY_DTYPES = ("<u2", "<i4", "<u8", "<i8", "|u1", "<u4", "<i2", "|i1")


@settings(max_examples=150, deadline=None)
@given(stored=st.sampled_from(_NPY_DTYPES), dtype=st.sampled_from(["int64", "int32"]),
       sizes=st.lists(st.integers(0, 40), min_size=1, max_size=3),
       edits=st.lists(st.tuples(st.integers(0, 4096), st.sampled_from(
           [0, 1, 7, 0x7F, 0xFF, 2**15, 2**31, 2**32 - 1, 2**63, 2**64 - 1])), max_size=3),
       target=st.integers(0, 10), cut=st.none() | st.integers(0, 4096))
def test_verify_npy_passing_means_every_read_succeeds(
        stored: str, dtype: str, sizes: list[int], edits: list[tuple[int, int]],
        target: int, cut: int | None) -> None:
    """Mutated .npy folders (integers written at any offset of one file, its
    header included, or the file cut short): when ``verify_npy(dtype=...)``
    finds nothing, every window read into that dtype succeeds, at any length."""
    from zerobatch.stream.npy import verify_npy

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        top = min(int(np.iinfo(stored).max), 2**31 - 1)
        for i, size in enumerate(sizes):
            np.save(folder / f"{i:05d}.npy", (np.arange(size) * 7919 % (top + 1)).astype(stored))
        victim = folder / f"{target % len(sizes):05d}.npy"
        raw = bytearray(victim.read_bytes())
        for at, value in edits:
            at %= len(raw)
            width = 8 if value >= 2**32 else (4 if value >= 2**16 else 2)
            raw[at:at + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
        if cut is not None:
            raw = raw[:cut % (len(raw) + 1)]
        victim.write_bytes(bytes(raw))
        if verify_npy(folder, dtype=dtype) != []:
            return
        with open_npy(folder) as tokens:
            for seq_len in (1, 3, 8):
                windows = tokens.windows(seq_len, dtype=dtype)
                windows.read(np.arange(len(windows)))
