"""Lazy span metadata: SpanTable and Spans against plain lists of tuples."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch.columnar import Batch, wire
from zerobatch.errors import FormatError
from zerobatch.stream.spans import Spans, SpanTable

Triples = list[list[tuple[int, int, Any]]]

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=6,
)
SPAN = st.tuples(st.integers(0, 4096), st.integers(0, 4096), VALUES)
OBSERVATIONS = st.lists(st.lists(SPAN, max_size=10), max_size=6)


class Counted:
    """A decode callable over a list, counting its calls."""

    def __init__(self, values: list[Any], *, fail: int = 0) -> None:
        self.values = values
        self.calls = 0
        self.fail = fail

    def __call__(self) -> list[Any]:
        self.calls += 1
        if self.calls <= self.fail:
            raise FormatError("cannot decode metadata entries (test)", field="metadata")
        return list(self.values)


def table_from_arrays(observations: Triples, decode: Callable[[], list[Any]] | None = None
                      ) -> SpanTable:
    flat = [span for spans in observations for span in spans]
    offsets = np.cumsum([0] + [len(spans) for spans in observations]).astype(np.int64)
    starts = np.array([s for s, _, _ in flat], dtype=np.int64)
    ends = np.array([e for _, e, _ in flat], dtype=np.int64)
    values = [v for _, _, v in flat]
    return SpanTable(starts, ends, offsets, decode or Counted(values))


def expected_repr(spans: list[tuple[int, int, Any]]) -> str:
    return f"Spans({spans!r})"


@settings(max_examples=150, deadline=None)
@given(OBSERVATIONS, st.data())
def test_spans_behave_like_lists_of_tuples(observations: Triples, data: st.DataObject) -> None:
    table = table_from_arrays(observations)
    observed = table.observations()
    assert len(table) == len(observations) == len(observed)
    assert observed == observations and observations == observed
    assert list(table) == observations
    assert table.values == [v for spans in observations for _, _, v in spans]
    for b, (spans, plain) in enumerate(zip(observed, observations, strict=True)):
        assert isinstance(spans, Spans)
        assert table[b] == plain and table[b - len(observations)] == plain
        assert len(spans) == len(plain)
        assert spans.tolist() == plain and list(spans) == plain
        assert list(reversed(spans)) == plain[::-1]
        assert all(type(s) is int and type(e) is int for s, e, _ in spans)
        for i in range(-len(plain), len(plain)):
            assert spans[i] == plain[i]
        for i in (len(plain), -len(plain) - 1):
            with pytest.raises(IndexError):
                spans[i]
        part = data.draw(st.slices(len(plain) + 2))
        assert spans[part] == plain[part]
        assert spans.starts.tolist() == [s for s, _, _ in plain]
        assert spans.ends.tolist() == [e for _, e, _ in plain]
        assert spans.starts.dtype == spans.ends.dtype == np.int64
        assert spans.values == [v for _, _, v in plain]
        if len(plain) <= 8:
            assert repr(spans) == expected_repr(plain)
        for view in (spans.starts, spans.ends):
            assert not view.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                view[:] = 0
    for b in (len(observations), -len(observations) - 1):
        with pytest.raises(IndexError):
            table[b]


def test_table_arrays_are_read_only_views() -> None:
    starts = np.array([0, 5, 1], dtype=np.int64)
    table = SpanTable(starts, starts + 2, np.array([0, 2, 3], dtype=np.int64), lambda: [1, 2, 3])
    for array in (table.starts, table.ends, table.offsets):
        assert array.dtype == np.int64 and not array.flags.writeable
    starts[0] = 7
    assert table.starts[0] == 7 and starts.flags.writeable
    assert table.offsets.tolist() == [0, 2, 3]
    assert repr(table) == "SpanTable(observations=2, spans=3)"


def test_repr_shows_eight_spans_then_an_ellipsis() -> None:
    plain = [(i, i + 1, i) for i in range(10)]
    spans = SpanTable.from_lists([plain])[0]
    assert repr(spans) == expected_repr(plain[:8])[:-2] + ", ...])"
    assert repr(SpanTable.from_lists([[]])[0]) == "Spans([])"


def test_arrays_length_and_views_never_decode() -> None:
    decode = Counted(["a", "b", "c"])
    table = table_from_arrays([[(0, 2, "a")], [(0, 1, "b"), (1, 3, "c")]], decode)
    observed = table.observations()
    assert [len(s) for s in observed] == [1, 2]
    assert observed[1].starts.tolist() == [0, 1] and observed[1].ends.tolist() == [1, 3]
    assert repr(table) == "SpanTable(observations=2, spans=3)"
    assert decode.calls == 0
    assert observed[1][1] == (1, 3, "c")
    assert observed[0].values == ["a"] and table.values == ["a", "b", "c"]
    assert decode.calls == 1


def test_decode_runs_once_under_eight_threads() -> None:
    values = [{"concept": i} for i in range(100)]
    calls = []

    def decode() -> list[Any]:
        calls.append(1)
        time.sleep(0.02)
        return list(values)

    table = table_from_arrays([[(i, i + 1, v) for i, v in enumerate(values)]], decode)
    spans = table.observations()[0]
    barrier = threading.Barrier(8)
    seen: list[list[Any]] = []

    def read(as_tuples: bool) -> None:
        barrier.wait()
        seen.append([v for _, _, v in spans] if as_tuples else spans.values)

    threads = [threading.Thread(target=read, args=(i % 2 == 0,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert seen == [values] * 8
    assert table.values == values and len(calls) == 1


def test_failing_decode_raises_every_time_and_is_retried() -> None:
    decode = Counted(["a", "b"], fail=3)
    table = table_from_arrays([[(0, 1, "a")], [(2, 3, "b")]], decode)
    spans = table.observations()
    for access in (lambda: spans[0].values, lambda: spans[1][0], lambda: list(spans[0])):
        with pytest.raises(FormatError, match="cannot decode"):
            access()
    assert decode.calls == 3
    assert spans == [[(0, 1, "a")], [(2, 3, "b")]]
    assert decode.calls == 4
    assert table.values == ["a", "b"] and decode.calls == 4


def test_decoded_value_count_must_match_spans() -> None:
    table = table_from_arrays([[(0, 1, "a"), (1, 2, "b")]], lambda: ["a"])
    with pytest.raises(FormatError, match="decoded 1 span values, expected 2"):
        _ = table.values


def test_from_lists_takes_lists_tuples_and_spans() -> None:
    plain: Triples = [[(0, 1, "a"), (1, 4, {"k": [1]})], [], [(2, 3, None)]]
    table = SpanTable.from_lists(plain)
    assert table.offsets.tolist() == [0, 2, 2, 3]
    again = SpanTable.from_lists([[list(t) for t in s] for s in plain])
    assert again.observations() == table.observations() == plain
    assert SpanTable.from_lists(table.observations()).observations() == plain
    assert len(SpanTable.from_lists([])) == 0 and SpanTable.from_lists([]).observations() == []
    with pytest.raises(TypeError):
        SpanTable.from_lists([[(0.5, 1, "a")]])
    with pytest.raises(ValueError):
        SpanTable.from_lists([[(0, 1)]])


PLAIN: Triples = [[(0, 5, "x"), (5, 9, {"concept": 14})], [], [(1, 2, b"\x00")]]


@pytest.mark.parametrize("protocol", [5, pickle.DEFAULT_PROTOCOL])
def test_pickle_round_trips(protocol: int) -> None:
    table = table_from_arrays(PLAIN)
    observed = table.observations()
    one = pickle.loads(pickle.dumps(observed[0], protocol=protocol))
    assert isinstance(one, Spans) and one == observed[0] == PLAIN[0]
    many = pickle.loads(pickle.dumps(observed, protocol=protocol))
    assert all(isinstance(s, Spans) for s in many) and many == observed == PLAIN
    assert pickle.loads(pickle.dumps(table, protocol=protocol)).observations() == PLAIN
    batch = Batch.from_columns({"metadata": observed, "ids": np.arange(3)})
    back = pickle.loads(pickle.dumps(batch, protocol=protocol))
    assert back.fields == batch.fields and len(back) == 3
    assert back["metadata"] == observed and observed == back["metadata"]
    np.testing.assert_array_equal(back["ids"], np.arange(3))


def test_equality_with_sequences_and_spans() -> None:
    table = SpanTable.from_lists([*PLAIN, PLAIN[0]])
    first, empty, last, twin = table.observations()
    assert first == PLAIN[0] and first == tuple(PLAIN[0])
    assert first == [list(t) for t in PLAIN[0]] and [[list(t) for t in PLAIN[0]]] == [first]
    assert first == twin and first == SpanTable.from_lists([PLAIN[0]])[0]
    assert first == first and empty == [] and empty == () and empty == empty
    assert [first, empty] == PLAIN[:2] and PLAIN[:2] == [first, empty]
    assert first != last and first != empty and empty != first
    assert first != PLAIN[0][:1] and first != [*PLAIN[0], (9, 10, 0)]
    assert first != [(0, 5, "y"), (5, 9, {"concept": 14})]
    assert first != [(0, 6, "x"), (5, 9, {"concept": 14})]
    assert first != [(1, 5, "x"), (5, 9, {"concept": 14})]
    assert first != [(0, 5), (5, 9)] and first != [(0, 5, "x", 1), (5, 9, {"concept": 14}, 1)]
    assert first != ["abc", "def"] and empty != "" and empty != b""
    assert first != 3 and first != None and first != {"a": 1}  # noqa: E711
    assert first.__eq__(3) is NotImplemented
    assert (0, 5, "x") in first and [5, 9, {"concept": 14}] in first and (0, 5, "y") not in first
    with pytest.raises(TypeError, match="unhashable"):
        hash(first)


def test_numpy_values_compare_by_dtype_shape_and_contents() -> None:
    values: list[Any] = [np.arange(4, dtype=np.int32), np.zeros((2, 2))]
    spans = SpanTable.from_lists([[(0, 1, values[0]), (1, 2, values[1])]])[0]
    assert spans == [(0, 1, np.arange(4, dtype=np.int32)), (1, 2, np.zeros((2, 2)))]
    assert spans == SpanTable.from_lists([[(0, 1, values[0].copy()), (1, 2, values[1].copy())]])[0]
    assert spans != [(0, 1, np.arange(4, dtype=np.int64)), (1, 2, np.zeros((2, 2)))]
    assert spans != [(0, 1, np.arange(4, dtype=np.int32)), (1, 2, np.zeros(4))]
    assert spans != [(0, 1, np.arange(1, 5, dtype=np.int32)), (1, 2, np.zeros((2, 2)))]
    assert spans != [(0, 1, [0, 1, 2, 3]), (1, 2, np.zeros((2, 2)))]
    assert (1, 2, np.zeros((2, 2))) in spans
    back = pickle.loads(pickle.dumps(spans, protocol=5))
    assert back == spans and back.values[0].dtype == np.int32


def test_batch_of_spans_round_trips_through_frames() -> None:
    observed = table_from_arrays(PLAIN).observations()
    batch = Batch.from_columns({"metadata": observed, "ids": np.arange(3)})
    frames = batch.to_frames()
    back = Batch.from_frames([bytes(memoryview(f).cast("B")) for f in frames])
    assert back.fields == batch.fields
    assert back["metadata"] == [[list(t) for t in spans] for spans in PLAIN]
    assert back["metadata"] == observed and observed == back["metadata"]
    np.testing.assert_array_equal(back["ids"], np.arange(3))


def test_wire_packs_spans_nested_in_other_objects() -> None:
    spans = SpanTable.from_lists(PLAIN)[0]
    packed = wire.unpack(wire.pack({"spans": spans, "more": [spans]}), where="test")
    assert packed == {"spans": [[0, 5, "x"], [5, 9, {"concept": 14}]],
                      "more": [[[0, 5, "x"], [5, 9, {"concept": 14}]]]}
    with pytest.raises(TypeError, match="can not serialize 'object'"):
        wire.pack([object()])
    with pytest.raises(TypeError):
        wire.pack(SpanTable.from_lists([[(0, 1, np.arange(2))]])[0])
