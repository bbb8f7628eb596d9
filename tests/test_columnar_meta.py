"""BatchMeta, Jagged and schema inference: semantics checked against a row-by-row model."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch.columnar import BatchMeta, FieldSchema, Jagged
from zerobatch.columnar import meta as meta_module
from zerobatch.columnar.schema import normalize_column
from zerobatch.errors import FormatError

# -- Jagged ---------------------------------------------------------------------------------


def test_jagged_samples_are_views() -> None:
    values = np.arange(10, dtype=np.int32)
    j = Jagged(values, np.array([0, 3, 3, 10]))
    assert len(j) == 3
    assert j[0].tolist() == [0, 1, 2]
    assert j[1].tolist() == []
    assert j[-1].tolist() == list(range(3, 10))
    assert np.shares_memory(j[2], values)
    assert j.offsets.dtype == np.int64
    assert j.lengths.tolist() == [3, 0, 7]
    assert j[1:].offsets.tolist() == [3, 3, 10]
    assert [s.tolist() for s in j[::2]] == [[0, 1, 2], list(range(3, 10))]
    with pytest.raises(IndexError):
        j[3]


def test_jagged_offsets_may_point_into_a_larger_buffer() -> None:
    j = Jagged(np.arange(10), np.array([2, 4, 5], dtype=np.int32))
    assert j.num_items == 3
    assert [s.tolist() for s in j] == [[2, 3], [4]]
    compact = j.compact()
    assert compact.offsets.tolist() == [0, 2, 3]
    assert compact.values.tolist() == [2, 3, 4]
    assert np.shares_memory(compact.values, j.values)


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([0, 3, 2], "decrease at sample 1"),
        ([0, 11], "past the 10 values"),
        ([-1, 2], "start at -1"),
        ([[0, 1]], "1-D"),
        ([], "1-D"),
        ([0.0, 1.0], "integers"),
    ],
)
def test_jagged_rejects_bad_offsets(offsets: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Jagged(np.arange(10), np.array(offsets))


def test_jagged_rejects_scalar_values() -> None:
    with pytest.raises(ValueError, match="at least one dimension"):
        Jagged(np.float32(1), np.array([0, 1]))


sample_lists = st.lists(st.lists(st.integers(-100, 100), max_size=5), max_size=8)


@settings(max_examples=60, deadline=None)
@given(sample_lists, st.data())
def test_jagged_take_and_concat_match_lists(samples: list[list[int]], data: st.DataObject) -> None:
    j = Jagged.from_arrays(samples, dtype=np.int16)
    assert [s.tolist() for s in j] == samples
    picks = data.draw(st.lists(st.integers(0, max(len(samples) - 1, 0)), max_size=10))
    if not samples:
        picks = []
    assert [s.tolist() for s in j.take(np.array(picks, dtype=np.int64))] == [
        samples[i] for i in picks
    ]
    cut = data.draw(st.integers(0, len(samples)))
    joined = Jagged.concat([j[:cut], j.take(np.arange(cut, len(samples)))])
    assert [s.tolist() for s in joined] == samples
    assert joined.offsets[0] == 0


def test_jagged_concat_checks_item_shapes() -> None:
    a = Jagged(np.zeros((2, 3)), np.array([0, 2]))
    b = Jagged(np.zeros((2, 4)), np.array([0, 2]))
    with pytest.raises(ValueError, match="item shapes differ"):
        Jagged.concat([a, b])


# -- schema inference -------------------------------------------------------------------------


def test_infer_dense_numpy() -> None:
    column, schema = normalize_column("x", np.zeros((4, 2, 3), dtype=np.float16))
    assert schema == FieldSchema("dense", np.dtype("<f2"), (2, 3))
    assert schema.shape == (2, 3) and not schema.is_nested and not schema.is_non_tensor
    assert schema["dtype"] == np.float16 and schema["per_sample_shapes"] is None
    assert isinstance(column, np.ndarray)


def test_infer_dense_torch_shares_memory() -> None:
    tensor = torch.arange(12, dtype=torch.int64).reshape(4, 3)
    column, schema = normalize_column("x", tensor)
    assert schema == FieldSchema("dense", np.dtype("<i8"), (3,))
    assert isinstance(column, np.ndarray)
    assert column.ctypes.data == tensor.data_ptr()


def test_infer_nested_torch_without_unbind() -> None:
    parts = [torch.randn(2, 5), torch.randn(0, 5), torch.randn(3, 5)]
    nested = torch.nested.as_nested_tensor(parts, layout=torch.jagged)
    column, schema = normalize_column("x", nested)
    assert isinstance(column, Jagged)
    assert column.values.ctypes.data == nested.values().data_ptr()
    assert schema.is_nested and schema.shape is None and schema.item_shape == (5,)
    assert list(schema.per_sample_shapes or []) == [(2, 5), (0, 5), (3, 5)]
    assert schema["per_sample_shapes"] == [(2, 5), (0, 5), (3, 5)]
    for got, want in zip(column, parts, strict=True):
        np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_infer_rejects_strided_nested_and_bfloat16() -> None:
    strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(TypeError, match=r"layout=torch\.jagged"):
        normalize_column("x", strided)
    with pytest.raises(TypeError, match="bfloat16"):
        normalize_column("x", torch.zeros(2, dtype=torch.bfloat16))


def test_infer_jagged_and_objects() -> None:
    _, schema = normalize_column("j", Jagged(np.zeros(5, np.uint8), np.array([0, 2, 5])))
    assert schema == FieldSchema("jagged", np.dtype("u1"), (), np.array([2, 3]))
    column, schema = normalize_column("s", ("a", "b"))
    assert column == ["a", "b"] and schema == FieldSchema("objects", "str")
    assert schema.is_non_tensor and schema.shape is None
    column, schema = normalize_column("s", np.array(["ab", "c"]))
    assert column == ["ab", "c"] and schema.kind == "objects"
    assert normalize_column("e", [])[1] == FieldSchema("objects", "object")


def test_infer_big_endian_becomes_little_endian() -> None:
    column, schema = normalize_column("x", np.arange(3, dtype=">u4"))
    assert schema.dtype.str == "<u4"
    assert isinstance(column, np.ndarray) and column.tolist() == [0, 1, 2]


@pytest.mark.parametrize("bad", [np.zeros(3, np.complex64), np.zeros(2, "M8[s]"), np.int32(3)])
def test_infer_rejects_unsupported_arrays(bad: np.ndarray) -> None:
    with pytest.raises((TypeError, ValueError)):
        normalize_column("x", bad)


def test_infer_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="field 'x'"):
        normalize_column("x", {"a": 1})


# -- BatchMeta basics -------------------------------------------------------------------------


def make_meta(size: int = 4) -> BatchMeta:
    meta = BatchMeta(np.arange(10, 10 + size), partition_ids=["p0", "p1"] * (size // 2))
    return meta.add_fields(
        {
            "dense": np.zeros((size, 3), np.float32),
            "jag": Jagged(np.zeros(size * 2, np.int32), np.arange(size + 1) * 2),
            "text": ["t"] * size,
        }
    )


def test_meta_reads_like_the_seed() -> None:
    meta = make_meta()
    assert meta.global_indexes == [10, 11, 12, 13]
    assert list(meta.global_indexes) == [10, 11, 12, 13]
    assert meta.global_indexes[1] == 11 and isinstance(meta.global_indexes[1], int)
    assert meta.partition_ids == ["p0", "p1", "p0", "p1"]
    assert meta.production_status.dtype == np.int8
    assert meta.field_schema["dense"]["shape"] == (3,)
    assert meta.field_schema["jag"]["per_sample_shapes"] == [(2,)] * 4
    assert meta.field_names == ["dense", "jag", "text"]
    assert len(meta) == meta.size == 4
    assert np.asarray(meta.global_indexes).dtype == np.int64
    with pytest.raises(ValueError):
        meta.production_status[0] = 0


def test_add_fields_marks_ready_and_checks_size() -> None:
    meta = BatchMeta([1, 2, 3])
    assert not meta.is_ready
    meta.add_fields({"x": np.zeros((3, 1))}, ready=False)
    assert not meta.is_ready
    meta.add_fields({"y": [1, 2, 3]})
    assert meta.is_ready and meta.field_names == ["x", "y"]
    with pytest.raises(ValueError, match="2 samples, expected 3"):
        meta.add_fields({"z": np.zeros(2)})


def test_set_ready_is_cached_and_copy_on_write() -> None:
    meta = BatchMeta(np.arange(6))
    first, second = meta.chunk(2)
    first.set_ready()
    assert first.is_ready and not meta.is_ready and not second.is_ready
    meta.set_ready(np.array([True, False] * 3))
    assert meta.production_status.tolist() == [1, 0, 1, 0, 1, 0]
    meta.set_ready(slice(1, None, 2))
    assert meta.is_ready
    meta.set_ready([0, -1], ready=False)
    assert meta.production_status.tolist() == [0, 1, 1, 1, 1, 0]
    assert not meta.is_ready
    assert BatchMeta([]).is_ready


def test_getitem_int_and_slice() -> None:
    meta = make_meta()
    sample = meta[-1]
    assert sample.global_index == 13 and sample.partition_id == "p1" and sample.is_ready
    assert sample.fields["jag"].shape == (2,) and sample.fields["dense"].shape == (3,)
    part = meta[1:3]
    assert isinstance(part, BatchMeta) and part.global_indexes == [11, 12]
    with pytest.raises(IndexError):
        meta[4]


def test_select_fields_and_errors() -> None:
    meta = make_meta()
    picked = meta.select_fields(["text", "dense"])
    assert picked.field_names == ["text", "dense"]
    assert np.shares_memory(np.asarray(picked.global_indexes), np.asarray(meta.global_indexes))
    with pytest.raises(KeyError, match="nope"):
        meta.select_fields(["nope"])


def test_chunk_sizes_like_array_split() -> None:
    meta = make_meta(size=10)
    assert [len(c) for c in meta.chunk(4)] == [3, 3, 2, 2]
    assert [len(c) for c in make_meta(size=2).chunk(3)] == [1, 1, 0]
    with pytest.raises(ValueError):
        meta.chunk(0)


def test_concat_and_union_errors() -> None:
    meta = make_meta()
    with pytest.raises(ValueError, match="at least one"):
        BatchMeta.concat([])
    with pytest.raises(ValueError, match="field 'dense'"):
        BatchMeta.concat([meta, meta.select_fields(["jag", "text"])])
    with pytest.raises(ValueError, match="fields"):
        BatchMeta.concat([meta.select_fields(["dense"]), meta])
    with pytest.raises(ValueError, match="global indexes differ"):
        meta.union(meta[1:])
    renamed = BatchMeta(np.asarray(meta.global_indexes), partition_ids=["p0", "p1", "p1", "p1"])
    with pytest.raises(ValueError, match="partition ids differ"):
        meta.union(renamed)
    same = BatchMeta(np.asarray(meta.global_indexes), partition_ids=["p0", "p1", "p0", "p1"])
    assert meta.union(same).partition_ids == meta.partition_ids
    parts = [BatchMeta([1], partition_ids="b"), BatchMeta([2], partition_ids="a")]
    joined = BatchMeta.concat(parts)
    fresh = BatchMeta([1, 2], partition_ids=["b", "a"])
    assert joined.partition_ids.names != fresh.partition_ids.names
    assert joined.union(fresh).partition_ids == ["b", "a"]


def test_custom_meta_follows_global_indexes() -> None:
    meta = BatchMeta([5, 6, 7], custom_meta={6: {"a": 1}, 7: {"b": 2}})
    assert meta.select([2, 0]).custom_meta == {7: {"b": 2}}
    assert meta[1].custom_meta == {"a": 1} and meta[0].custom_meta == {}
    other = BatchMeta([5, 6, 7], custom_meta={6: {"c": 3}}, extra_info={"k": "other"})
    merged = meta.union(other)
    assert merged.custom_meta == {6: {"a": 1, "c": 3}, 7: {"b": 2}}
    assert meta.custom_meta[6] == {"a": 1}
    assert merged.extra_info == {"k": "other"}


def test_samples_view_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta_module, "_warned_samples", False)
    meta = make_meta()
    with pytest.warns(DeprecationWarning, match="deprecated"):
        samples = meta.samples
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = meta.samples
    assert len(samples) == 4 and len(again) == 4
    assert [s.global_index for s in samples] == [10, 11, 12, 13]
    assert samples[2].fields["text"].is_non_tensor
    assert samples[2].fields["jag"].is_nested
    assert [s.global_index for s in samples[1:3]] == [11, 12]
    assert not hasattr(samples[0], "__dict__")


# -- the row model ----------------------------------------------------------------------------

Row = tuple[int, str, int, tuple[tuple[str, Any], ...]]


def rows_of(meta: BatchMeta) -> list[Row]:
    """One tuple per sample: index, partition, status, per-field (name, shape)."""
    out = []
    for i in range(len(meta)):
        fields = tuple(
            (name, s.per_sample_shapes[i] if s.per_sample_shapes is not None else s.shape)
            for name, s in meta.field_schema.items()
        )
        out.append(
            (
                int(meta.global_indexes[i]),
                meta.partition_ids[i],
                int(meta.production_status[i]),
                fields,
            )
        )
    return out


@st.composite
def metas(draw: st.DrawFn, size: int | None = None) -> BatchMeta:
    rows = draw(st.integers(0, 9)) if size is None else size
    indexes = draw(st.lists(st.integers(0, 2**40), min_size=rows, max_size=rows))
    partitions = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=rows, max_size=rows))
    status = draw(st.lists(st.integers(0, 1), min_size=rows, max_size=rows))
    lengths = draw(st.lists(st.integers(0, 4), min_size=rows, max_size=rows))
    meta = BatchMeta(indexes, partition_ids=partitions, production_status=status)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    meta.add_fields(
        {
            "d": np.zeros((rows, 2), np.int32),
            "j": Jagged(np.zeros((int(offsets[-1]), 3), np.float32), offsets),
            "o": ["x"] * rows,
        },
        ready=False,
    )
    return meta


@settings(max_examples=60, deadline=None)
@given(metas(), st.data())
def test_select_matches_rows(meta: BatchMeta, data: st.DataObject) -> None:
    rows = rows_of(meta)
    picks = data.draw(st.lists(st.integers(0, len(meta) - 1), max_size=12)) if rows else []
    assert rows_of(meta.select(np.array(picks, dtype=np.int64))) == [rows[i] for i in picks]
    start, stop = sorted(data.draw(st.lists(st.integers(0, len(meta)), min_size=2, max_size=2)))
    assert rows_of(meta[start:stop]) == rows[start:stop]
    mask = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    assert rows_of(meta.select(np.array(mask, dtype=bool).reshape(-1))) == [
        r for r, keep in zip(rows, mask, strict=True) if keep
    ]


@settings(max_examples=60, deadline=None)
@given(metas(), st.integers(1, 5))
def test_chunk_then_concat_matches_rows(meta: BatchMeta, n: int) -> None:
    rows = rows_of(meta)
    chunks = meta.chunk(n)
    assert len(chunks) == n
    assert [r for c in chunks for r in rows_of(c)] == rows
    assert rows_of(BatchMeta.concat(chunks)) == rows
    assert max(len(c) for c in chunks) - min(len(c) for c in chunks) <= 1


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 8).flatmap(lambda n: st.tuples(metas(size=n), metas(size=n))))
def test_union_matches_rows(pair: tuple[BatchMeta, BatchMeta]) -> None:
    left, right = pair
    right = BatchMeta(
        np.asarray(left.global_indexes),
        partition_ids=left.partition_ids,
        production_status=right.production_status,
        field_schema={"j": right.field_schema["j"], "extra": FieldSchema("objects", "int")},
    )
    merged = left.union(right)
    want = []
    for a, b in zip(rows_of(left), rows_of(right), strict=True):
        fields = dict(a[3])
        fields.update(dict(b[3]))
        want.append((a[0], a[1], a[2] & b[2], tuple(fields.items())))
    assert rows_of(merged) == want
    assert merged.is_ready == all(r[2] for r in want)


@settings(max_examples=40, deadline=None)
@given(metas())
def test_meta_bytes_round_trip(meta: BatchMeta) -> None:
    meta.extra_info["step"] = 3
    back = BatchMeta.from_bytes(meta.to_bytes())
    assert rows_of(back) == rows_of(meta)
    assert back.extra_info == {"step": 3}
    assert all(back.field_schema[n] == s for n, s in meta.field_schema.items())


def test_meta_from_bytes_rejects_garbage() -> None:
    with pytest.raises(FormatError, match="meta"):
        BatchMeta.from_bytes(b"\xc1")
    blob = make_meta().to_bytes()
    with pytest.raises(FormatError):
        BatchMeta.from_bytes(blob[:-3])
