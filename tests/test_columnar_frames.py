"""The F + 1 frame codec: round trips of every kind and dtype, and crafted frames."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from zerobatch.columnar import Batch, BatchMeta, Jagged, wire
from zerobatch.columnar.schema import DTYPES
from zerobatch.errors import FormatError

ALL_DTYPES = sorted(DTYPES)


def round_trip(batch: Batch) -> Batch:
    frames = batch.to_frames()
    assert len(frames) == len(batch.fields) + 1
    # Received frames are plain immutable bytes, as from a socket.
    return Batch.from_frames([bytes(memoryview(f).cast("B")) for f in frames])


def assert_same(a: Batch, b: Batch) -> None:
    assert a.fields == b.fields and len(a) == len(b)
    assert a.meta.global_indexes == b.meta.global_indexes
    assert a.meta.partition_ids == b.meta.partition_ids
    assert a.meta.production_status.tolist() == b.meta.production_status.tolist()
    assert a.meta.extra_info == b.meta.extra_info
    assert a.meta.custom_meta == b.meta.custom_meta
    for name in a.fields:
        assert a.meta.field_schema[name] == b.meta.field_schema[name]
        x, y = a[name], b[name]
        if isinstance(x, Jagged):
            assert isinstance(y, Jagged)
            assert y.dtype == x.dtype and y.item_shape == x.item_shape
            assert len(x) == len(y)
            for i in range(len(x)):
                np.testing.assert_array_equal(x[i], y[i])
        elif isinstance(x, list):
            assert x == y
        else:
            assert isinstance(y, np.ndarray)
            assert y.dtype == x.dtype and y.shape == x.shape
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 5])
def test_every_dtype_round_trips(dtype: str, rows: int) -> None:
    rng = np.random.default_rng(rows)
    raw = rng.integers(0, 255, size=(rows * 6 + 7) * 8, dtype=np.uint8)
    if np.dtype(dtype).kind == "b":
        raw = raw % 2
    pool = raw.view(np.uint8).view(dtype) if np.dtype(dtype).kind != "b" else raw.astype(bool)
    lengths = rng.integers(0, 4, size=rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    batch = Batch.from_columns(
        {
            "scalar": pool[:rows],
            "matrix": pool[: rows * 6].reshape(rows, 2, 3),
            "jagged": Jagged(pool[: offsets[-1]], offsets),
            "jagged2d": Jagged(pool[: offsets[-1] * 2].reshape(-1, 2), offsets),
            "objects": [{"i": i, "s": "x" * i, "b": b"\x00"} for i in range(rows)],
        },
        BatchMeta(np.arange(rows) * 3, partition_ids="p", custom_meta={0: {"k": [1]}}),
    )
    back = round_trip(batch)
    assert_same(batch, back)
    assert back["scalar"].shape == (rows,)


def test_decoded_arrays_view_the_frames() -> None:
    batch = Batch.from_columns(
        {"d": np.arange(8, dtype=np.int64).reshape(2, 4), "j": Jagged(np.arange(6.0), [0, 1, 6])}
    )
    frames = [bytes(f) for f in batch.to_frames()]
    back = Batch.from_frames(frames)
    dense, jagged = back["d"], back["j"]
    assert isinstance(dense, np.ndarray) and isinstance(jagged, Jagged)
    assert not dense.flags.writeable
    assert np.shares_memory(dense, np.frombuffer(frames[1], np.uint8))
    assert np.shares_memory(jagged.values, np.frombuffer(frames[2], np.uint8))
    assert (jagged.values.ctypes.data - np.frombuffer(frames[2], np.uint8).ctypes.data) % 8 == 0
    assert back.to_torch()["d"].tolist() == batch["d"].tolist()


def test_dense_frames_are_not_copied_on_encode() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = Batch.from_columns({"x": array}).to_frames()
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), array)


def test_jagged_frame_layout_is_offsets_then_values() -> None:
    j = Jagged(np.array([9, 8, 7, 6, 5], np.int16), [1, 3, 4])
    frame = bytes(Batch.from_columns({"j": j}).to_frames()[1])
    assert np.frombuffer(frame[:24], "<i8").tolist() == [0, 2, 3]
    assert np.frombuffer(frame[24:], "<i2").tolist() == [8, 7, 6]


def test_meta_extras_travel() -> None:
    meta = BatchMeta(
        [4, 2],
        partition_ids=["a", "b"],
        production_status=[0, 1],
        extra_info={"step": 7, "tags": ["x"]},
        custom_meta={4: {"shard": 1}},
    )
    batch = Batch.from_columns({"x": np.zeros((2, 0), np.float32)}, meta)
    assert_same(batch, round_trip(batch))


@st.composite
def random_batches(draw: st.DrawFn) -> Batch:
    rows = draw(st.integers(0, 6))
    columns: dict[str, Any] = {}
    for f in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["dense", "jagged", "objects"]))
        dtype = draw(st.sampled_from(ALL_DTYPES))
        item = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
        if kind == "dense":
            columns[f"f{f}"] = draw(hnp.arrays(dtype, (rows, *item)))
        elif kind == "jagged":
            lengths = draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows))
            offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
            columns[f"f{f}"] = Jagged(draw(hnp.arrays(dtype, (int(offsets[-1]), *item))), offsets)
        else:
            columns[f"f{f}"] = draw(st.lists(st.text(max_size=4), min_size=rows, max_size=rows))
    if not columns:
        return Batch.from_columns({}, BatchMeta(np.arange(rows)))
    return Batch.from_columns(columns)


@settings(max_examples=60, deadline=None)
@given(random_batches())
def test_random_batches_round_trip(batch: Batch) -> None:
    back = round_trip(batch)
    assert_same(batch, back)
    assert_same(round_trip(back), batch)


@settings(max_examples=25, deadline=None)
@given(random_batches())
def test_random_batches_round_trip_through_torch(batch: Batch) -> None:
    received = round_trip(batch)
    out = received.to_torch(jagged="offsets")
    nested = received.to_torch()
    for name in batch.fields:
        column = batch[name]
        if isinstance(column, Jagged):
            values, offsets = out[name]
            np.testing.assert_array_equal(values.numpy(), column.compact().values)
            assert offsets.tolist() == column.compact().offsets.tolist()
            samples = nested[name].unbind()
            assert len(samples) == len(column)
            for got, want in zip(samples, column, strict=True):
                np.testing.assert_array_equal(got.numpy(), want)
        elif isinstance(column, np.ndarray):
            np.testing.assert_array_equal(out[name].numpy(), column)
        else:
            assert out[name] == column


# -- crafted frames ---------------------------------------------------------------------------


def good_frames() -> list[bytes]:
    batch = Batch.from_columns(
        {
            "dense": np.arange(6, dtype=np.int32).reshape(3, 2),
            "jag": Jagged(np.arange(5, dtype=np.float32), [0, 2, 2, 5]),
            "obj": ["a", "b", "c"],
        }
    )
    return [bytes(memoryview(f).cast("B")) for f in batch.to_frames()]


def with_header(frames: list[bytes], edit: Callable[[dict[str, Any]], None]) -> list[bytes]:
    header = msgpack.unpackb(frames[0], raw=False)
    edit(header)
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def set_field(index: int, slot: int, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(header: dict[str, Any]) -> None:
        header["meta"]["fields"][index][slot] = value

    return edit


def replace_frame(
    frames: list[bytes], index: int, data: bytes, *, fix_header: bool = True
) -> list[bytes]:
    """``frames`` with frame ``index`` replaced; the header's byte count follows unless told."""
    if fix_header:
        frames = with_header(frames, lambda h: h["columns"][index - 1].__setitem__(0, len(data)))
    return [*frames[:index], data, *frames[index + 1 :]]


def jag_frame(offsets: list[int], values: bytes) -> bytes:
    return np.array(offsets, "<i8").tobytes() + values


F = good_frames()
VALUES = np.arange(5, dtype=np.float32).tobytes()


@pytest.mark.parametrize(
    ("frames", "where", "message"),
    [
        ([], "frame 0", "no frames"),
        (F[:-1], "frame 3: field 'obj'", "missing: 3 frames, expected 4"),
        (F[:1], "frame 1: field 'dense'", "missing: 1 frames"),
        ([*F, b""], "frame 4", "unexpected: 5 frames, expected 4"),
        ([b"\xc1", *F[1:]], "frame 0", "not a valid msgpack"),
        ([F[0][:-5], *F[1:]], "frame 0", "not a valid msgpack"),
        ([F[0] + b"\x00", *F[1:]], "frame 0", "not a valid msgpack"),
        ([msgpack.packb([1, 2]), *F[1:]], "frame 0", "expected a map"),
        ([msgpack.packb(msgpack.ExtType(1, b"x")), *F[1:]], "frame 0", "not a valid msgpack"),
        (with_header(F, lambda h: h.update(version=2)), "frame 0", "version 1"),
        (with_header(F, lambda h: h.update(format="npy")), "frame 0", "zerobatch.frames"),
        (with_header(F, lambda h: h.pop("columns")), "frame 0", "missing key 'columns'"),
        (with_header(F, lambda h: h["columns"].pop()), "frame 0", "2 column layouts"),
        (with_header(F, lambda h: h["columns"].__setitem__(0, [-1, 0])), "'dense'", "layout"),
        (with_header(F, lambda h: h["meta"].update(global_indexes=b"1234")), "frame 0", "int64"),
        (with_header(F, lambda h: h["meta"].update(production_status=b"")), "'production", ""),
        (with_header(F, lambda h: h["meta"].update(partition_names=[])), "codes", "outside"),
        (with_header(F, lambda h: h["meta"].update(custom_meta=[[1]])), "custom_meta", "entries"),
        (with_header(F, set_field(0, 2, "<c8")), "field 'dense'", "unknown dtype '<c8'"),
        (with_header(F, set_field(0, 2, "O")), "field 'dense'", "unknown dtype"),
        (with_header(F, set_field(0, 1, "sparse")), "field 'dense'", "unknown kind"),
        (with_header(F, set_field(0, 3, [2, -1])), "field 'dense'", "bad shape"),
        (with_header(F, set_field(0, 3, [1] * 40)), "field 'dense'", "bad shape"),
        (with_header(F, set_field(0, 3, [0, 2**40, 2**40])), "field 'dense'", "bad shape"),
        (with_header(F, set_field(0, 3, [3])), "field 'dense'", "bytes"),
        (with_header(F, set_field(0, 4, b"")), "field 'dense'", "carry no lengths"),
        (with_header(F, set_field(1, 0, "dense")), "field 'dense'", "listed twice"),
        (with_header(F, set_field(2, 3, [1])), "field 'obj'", "no shape"),
        (replace_frame(F, 1, F[1][:-4], fix_header=False), "frame 1: field 'dense'", "truncated"),
        (replace_frame(F, 1, F[1][:-4]), "frame 1: field 'dense'", "20 bytes, expected 24"),
        (replace_frame(F, 2, jag_frame([0, 3, 2, 5], VALUES)), "frame 2: field 'jag'", "decrease"),
        (replace_frame(F, 2, jag_frame([1, 2, 2, 5], VALUES)), "frame 2: field 'jag'", "from 0"),
        (replace_frame(F, 2, jag_frame([0, 2, 2, 9], VALUES)), "frame 2: field 'jag'", "past"),
        (replace_frame(F, 2, jag_frame([0, 2, 2, 4], VALUES)), "frame 2: field 'jag'", "from 0"),
        (replace_frame(F, 3, msgpack.packb(["a", "b"])), "frame 3: field 'obj'", "list of 3"),
        (replace_frame(F, 3, msgpack.packb({"a": 1})), "frame 3: field 'obj'", "found dict"),
        (replace_frame(F, 3, b"\x93\xa1a"), "frame 3: field 'obj'", "msgpack"),
    ],
)
def test_crafted_frames_raise_format_error(frames: list[bytes], where: str, message: str) -> None:
    with pytest.raises(FormatError) as info:
        Batch.from_frames(frames)
    assert where in str(info.value)
    assert message in str(info.value)


def test_size_mismatch_with_header_is_named() -> None:
    frames = replace_frame(F, 2, F[2] + b"\x00" * 8, fix_header=False)
    with pytest.raises(FormatError, match=r"frame 2: field 'jag': 60 bytes, header says 52"):
        Batch.from_frames(frames)
    frames = replace_frame(F, 2, F[2] + b"\x00" * 8)
    with pytest.raises(FormatError, match=r"frame 2: field 'jag': 60 bytes, expected 52 \(4 off"):
        Batch.from_frames(frames)


def test_header_size_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_HEADER_BYTES", 64)
    with pytest.raises(FormatError, match=r"frame 0: .*exceeds the 64-byte cap"):
        Batch.from_frames(F)


def test_non_contiguous_frame_is_rejected() -> None:
    strided = memoryview(np.zeros(48, np.int32)[::2])
    frames = [F[0], strided, *F[2:]]
    with pytest.raises(FormatError, match="frame 1: field 'dense': not a contiguous"):
        Batch.from_frames(frames)


def test_objects_that_cannot_travel() -> None:
    batch = Batch.from_columns({"o": [object()]})
    with pytest.raises(TypeError, match="field 'o'"):
        batch.to_frames()
    meta = BatchMeta([0], extra_info={"x": object()})
    with pytest.raises(TypeError, match="extra_info"):
        Batch.from_columns({"o": [1]}, meta).to_frames()


def test_objects_keep_nested_values_and_int_keys() -> None:
    values = [{1: "a", "k": [1, 2.5, None, True]}, {"bytes": b"\x00\xff", "nested": {"z": []}}]
    batch = Batch.from_columns({"o": values})
    assert round_trip(batch)["o"] == values


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_frames_decode_or_raise_format_error(data: st.DataObject) -> None:
    frames = list(F)
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[index])
    action = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if action == "flip" and frame:
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    elif action == "truncate":
        del frame[data.draw(st.integers(0, len(frame))) :]
    else:
        frame += data.draw(st.binary(min_size=1, max_size=16))
    frames[index] = bytes(frame)
    try:
        batch = Batch.from_frames(frames)
    except FormatError:
        return
    assert len(batch.fields) == 3


def test_frames_travel_over_zeromq_without_copies() -> None:
    import zmq

    batch = Batch.from_columns(
        {
            "x": np.arange(4096, dtype=np.float32).reshape(4, 1024),
            "j": Jagged(np.arange(10, dtype=np.int64), [0, 1, 1, 4, 10]),
            "s": ["a", "b", "c", "d"],
        }
    )
    context = zmq.Context.instance()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        receiver.bind("inproc://columnar-test")
        sender.connect("inproc://columnar-test")
        frames = batch.to_frames()
        sender.send_multipart(frames, copy=False)
        received = receiver.recv_multipart(copy=False)
        assert len(received) == len(batch.fields) + 1
        back = Batch.from_frames(received)
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
    assert_same(batch, back)
