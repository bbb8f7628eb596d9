"""Batch: construction, torch conversion, and select/chunk/concat against a row model."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch.columnar import Batch, BatchMeta, Jagged


def token_batch() -> Batch:
    return Batch.from_columns(
        {
            "input_ids": np.arange(12, dtype=np.uint32).reshape(3, 4),
            "cu_seqlens": Jagged(np.array([0, 2, 4, 0, 4, 0, 1, 4], np.int32), [0, 3, 5, 8]),
            "metadata": [{"doc": 1}, {"doc": 2}, None],
        }
    )


def test_trusted_fast_path_matches_from_columns() -> None:
    public = token_batch()
    schema = dict(public.meta.field_schema)
    fast = Batch._trusted(public.to_numpy(), np.array([4, 5, 6]), schema)
    assert fast.fields == public.fields and len(fast) == 3
    assert dict(fast.meta.field_schema) == schema
    assert fast.meta.global_indexes == [4, 5, 6] and fast.meta.is_ready
    assert fast.meta.partition_ids == ["", "", ""]
    assert fast["cu_seqlens"][1].tolist() == [0, 4]
    Batch(fast.meta, fast.to_numpy())  # what it built passes the checks it skipped
    assert Batch.from_frames(fast.to_frames())["metadata"] == public["metadata"]


def test_contract_for_readers() -> None:
    batch = token_batch()
    assert len(batch) == 3
    assert batch.fields == ["input_ids", "cu_seqlens", "metadata"]
    assert isinstance(batch["input_ids"], np.ndarray)
    assert isinstance(batch["cu_seqlens"], Jagged)
    assert batch["cu_seqlens"][1].tolist() == [0, 4]
    assert batch["metadata"] == [{"doc": 1}, {"doc": 2}, None]
    assert "metadata" in batch and "labels" not in batch
    assert batch.meta.global_indexes == [0, 1, 2] and batch.meta.is_ready
    assert batch.meta.field_schema["cu_seqlens"].is_nested
    with pytest.raises(KeyError, match="labels"):
        batch["labels"]


def test_from_columns_keeps_given_meta() -> None:
    meta = BatchMeta([7, 9], partition_ids="train", production_status=[1, 0], extra_info={"e": 1})
    batch = Batch.from_columns({"x": np.zeros((2, 1))}, meta)
    assert batch.meta.global_indexes == [7, 9]
    assert batch.meta.partition_ids == ["train", "train"]
    assert batch.meta.production_status.tolist() == [1, 0]
    assert batch.meta.extra_info == {"e": 1}
    assert batch.meta.field_names == ["x"]
    with pytest.raises(ValueError, match="meta has 2 samples"):
        Batch.from_columns({"x": np.zeros(3)}, meta)


def test_from_columns_rejects_mixed_sizes() -> None:
    with pytest.raises(ValueError, match="disagree"):
        Batch.from_columns({"a": np.zeros(2), "b": [1, 2, 3]})
    assert len(Batch.from_columns({})) == 0


def test_dense_columns_are_not_copied() -> None:
    array = np.zeros((4, 8), np.float32)
    batch = Batch.from_columns({"x": array})
    assert batch["x"] is array
    assert batch.to_numpy()["x"] is array
    assert batch.to_torch()["x"].data_ptr() == array.ctypes.data


def test_to_torch_kinds() -> None:
    batch = token_batch()
    out = batch.to_torch()
    assert out["input_ids"].dtype == torch.uint32
    nested = out["cu_seqlens"]
    assert nested.is_nested and nested.layout == torch.jagged
    assert [t.tolist() for t in nested.unbind()] == [[0, 2, 4], [0, 4], [0, 1, 4]]
    assert out["metadata"] == batch["metadata"]
    values, offsets = batch.to_torch(jagged="offsets")["cu_seqlens"]
    assert values.tolist() == [0, 2, 4, 0, 4, 0, 1, 4] and offsets.tolist() == [0, 3, 5, 8]
    with pytest.raises(ValueError, match="jagged"):
        batch.to_torch(jagged="list")  # type: ignore[arg-type]


def test_to_torch_of_read_only_columns_shares_memory_without_a_warning() -> None:
    frozen = np.arange(6, dtype=np.int64)
    frozen.flags.writeable = False
    batch = Batch.from_columns({"x": frozen, "y": np.arange(6.0)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "not writable" warning would raise
        out = batch.to_torch()
    assert out["x"].data_ptr() == frozen.ctypes.data and out["x"].tolist() == list(range(6))
    assert out["y"].data_ptr() == batch["y"].ctypes.data


def test_to_torch_rebases_offsets_and_handles_views() -> None:
    j = Jagged(np.arange(10, dtype=np.float32), np.array([2, 5, 6]))
    flipped = np.arange(6, dtype=np.int16).reshape(2, 3)[:, ::-1]
    out = Batch.from_columns({"j": j, "f": flipped}).to_torch(device="cpu")
    assert [t.tolist() for t in out["j"].unbind()] == [[2, 3, 4], [5]]
    assert out["f"].tolist() == flipped.tolist()


def test_columns_to_torch_views_what_torch_can_hold_and_copies_the_rest() -> None:
    """The CPU fast path (C-contiguous, writable: a view) and the rest: a
    strided view is shared, a reversed one or a record's field is copied."""
    from zerobatch.columnar.batch import columns_to_torch

    base = np.arange(24, dtype=np.int64).reshape(4, 6)
    records = np.zeros(3, dtype=[("token", "<u2"), ("flag", "u1")])
    records["token"] = [7, 8, 9]
    # A window of one token of records (dtype="stored", seq_len=1): NumPy calls
    # it C-contiguous, its strides are 3-byte records; the hypothesis test of
    # read_collated found it.
    one = records["token"][:2].reshape(1, 2)[:, :1]
    assert one.flags.c_contiguous and one.strides[1] == 3
    columns = {"plain": base, "strided": base[:, ::2], "flipped": base[:, ::-1],
               "field": records["token"], "one": one, "host": 5}
    out = columns_to_torch(columns)
    assert out["one"].tolist() == [[7]]
    assert columns_to_torch({"one": one}, pin_memory=False, device="cpu")["one"].tolist() == [[7]]
    assert out["plain"].data_ptr() == base.ctypes.data
    assert out["strided"].data_ptr() == base.ctypes.data
    assert out["flipped"].data_ptr() != base.ctypes.data
    assert {name: out[name].tolist() for name in ("plain", "strided", "flipped", "field")} == {
        name: columns[name].tolist() for name in ("plain", "strided", "flipped", "field")}
    assert out["host"] == 5


def test_torch_round_trip_through_nested_input() -> None:
    parts = [torch.arange(n, dtype=torch.int64) for n in (3, 1, 4)]
    nested = torch.nested.as_nested_tensor(parts, layout=torch.jagged)
    batch = Batch.from_columns({"n": nested, "d": torch.ones(3, 2, dtype=torch.float16)})
    back = batch.to_torch()
    assert [t.tolist() for t in back["n"].unbind()] == [p.tolist() for p in parts]
    assert back["d"].dtype == torch.float16 and back["d"].shape == (3, 2)


# -- the row model ----------------------------------------------------------------------------


def rows_of(batch: Batch) -> list[tuple[Any, ...]]:
    """One plain tuple per sample: meta facts, then each column's value as lists."""
    meta = batch.meta
    out = []
    for i in range(len(batch)):
        values: list[Any] = []
        for name in batch.fields:
            column = batch[name]
            if isinstance(column, list):
                values.append(column[i])
            else:
                values.append(column[i].tolist())
        out.append(
            (
                meta.global_indexes[i],
                meta.partition_ids[i],
                int(meta.production_status[i]),
                *values,
            )
        )
    return out


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    rows = draw(st.integers(0, 8))
    lengths = draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    meta = BatchMeta(
        draw(st.lists(st.integers(0, 1000), min_size=rows, max_size=rows)),
        partition_ids=draw(st.lists(st.sampled_from("pq"), min_size=rows, max_size=rows)),
        production_status=draw(st.lists(st.integers(0, 1), min_size=rows, max_size=rows)),
    )
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return Batch.from_columns(
        {
            "d": rng.integers(0, 100, size=(rows, 2), dtype=np.int64),
            "j": Jagged(rng.random((int(offsets[-1]), 2)).astype(np.float32), offsets),
            "s": [f"s{seed % 97}-{i}" for i in range(rows)],
        },
        meta,
    )


@settings(max_examples=60, deadline=None)
@given(batches(), st.data())
def test_batch_select_matches_rows(batch: Batch, data: st.DataObject) -> None:
    rows = rows_of(batch)
    picks = data.draw(st.lists(st.integers(0, len(batch) - 1), max_size=10)) if rows else []
    assert rows_of(batch.select(picks)) == [rows[i] for i in picks]
    assert rows_of(batch.select(slice(None, None, -1))) == rows[::-1]
    picked = batch.select_fields(["s", "d"])
    assert picked.fields == ["s", "d"] and len(picked) == len(batch)


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(1, 4))
def test_batch_chunk_concat_matches_rows(batch: Batch, n: int) -> None:
    rows = rows_of(batch)
    chunks = batch.chunk(n)
    assert [r for c in chunks for r in rows_of(c)] == rows
    joined = Batch.concat(chunks)
    assert rows_of(joined) == rows
    assert joined.meta.field_schema["j"] == batch.meta.field_schema["j"]


def test_objects_concat_whatever_their_first_sample() -> None:
    a = Batch.from_columns({"m": [None, 1]})
    b = Batch.from_columns({"m": [[1, 2], "x"]})
    assert Batch.concat([a, b])["m"] == [None, 1, [1, 2], "x"]


def test_batch_concat_checks_fields() -> None:
    a = Batch.from_columns({"x": np.zeros((2, 3))})
    b = Batch.from_columns({"x": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="field 'x'"):
        Batch.concat([a, b])


def test_batch_constructor_checks_columns() -> None:
    meta = BatchMeta([0, 1]).add_fields({"x": np.zeros(2)})
    with pytest.raises(ValueError, match="do not match"):
        Batch(meta, {"y": np.zeros(2)})
    with pytest.raises(ValueError, match="3 samples"):
        Batch(meta, {"x": np.zeros(3)})
    with pytest.raises(ValueError, match="does not match"):
        Batch(meta, {"x": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="does not match"):
        Batch(meta, {"x": [0.0, 0.0]})


def test_importing_columnar_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, zerobatch.columnar; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
