"""Span metadata of a batch as columns, seen per observation as read-only sequences.

A :class:`SpanTable` holds the R spans of a batch of B observations: ``starts``
and ``ends`` (int64 ``[R]``, observation coordinates), ``offsets`` (int64
``[B + 1]``: observation ``b`` owns spans ``offsets[b]:offsets[b + 1]``) and the
R values, decoded by one call on first use. Each observation is a
:class:`Spans`, a ``Sequence`` of ``(start, end, value)`` tuples. Creating the
B ``Spans`` decodes nothing and builds no tuple; ``starts``, ``ends`` and
``len`` never do. The first tuple asked for builds all R, once per table::

    table = SpanTable.from_lists([[(0, 5, "x")], []])
    spans = table.observations()
    spans == [[(0, 5, "x")], []]
    spans[0].starts.tolist() == [0]

Thread safety: both types are read-only; any number of threads may read them
at once, and the values are decoded once per table.

Pickled, a ``Spans`` becomes one over a table of its own (plain data, no
decode callable). Over the wire (``Batch.to_frames``) it travels as a list of
``[start, end, value]`` lists and arrives as that list.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from itertools import islice, repeat
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.columnar import wire
from zerobatch.errors import FormatError

__all__ = ["SpanTable", "Spans"]

_REPR_SPANS = 8
"""Spans shown by ``repr`` before ``...``."""

_NOT_TRIPLES = (str, bytes, bytearray)


def _frozen(array: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    view = array.view()
    view.setflags(write=False)
    return view


class SpanTable:
    """Span metadata of one batch, columnar; shared by the batch's per-observation Spans.

    ``decode()`` returns the R values as a list or raises ``FormatError``. It
    runs at most once successfully, under a lock; when it raises, nothing is
    kept and the next access calls it again. The arrays are trusted, not
    checked: the reader builds them consistent. Cost: O(1).
    """

    __slots__ = ("_decode", "_ends", "_lock", "_offsets", "_rows", "_starts", "_values")

    def __init__(
        self,
        starts: npt.NDArray[np.int64],
        ends: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        decode: Callable[[], list[Any]],
    ) -> None:
        self._starts = _frozen(starts)
        self._ends = _frozen(ends)
        self._offsets = _frozen(offsets)
        self._decode: Callable[[], list[Any]] | None = decode
        self._values: list[Any] | None = None
        self._rows: list[tuple[int, int, Any]] | None = None
        self._lock = _forksafe.lock()

    @classmethod
    def from_lists(cls, observations: Sequence[Sequence[Sequence[Any]]]) -> SpanTable:
        """A table holding ``observations``, each a sequence of ``(start, end, value)``.

        Starts and ends must be integers. Cost: O(B + R).
        """
        counts = [len(spans) for spans in observations]
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        triples = [(start, end, value) for spans in observations for start, end, value in spans]
        starts = np.array([operator.index(t[0]) for t in triples], dtype=np.int64)
        ends = np.array([operator.index(t[1]) for t in triples], dtype=np.int64)
        values = [t[2] for t in triples]
        return cls(starts, ends, offsets, lambda: values)

    @property
    def starts(self) -> npt.NDArray[np.int64]:
        """Start of every span, int64 ``[R]`` (read-only). O(1)."""
        return self._starts

    @property
    def ends(self) -> npt.NDArray[np.int64]:
        """End (exclusive) of every span, int64 ``[R]`` (read-only). O(1)."""
        return self._ends

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """Span ranges per observation, int64 ``[B + 1]`` (read-only). O(1)."""
        return self._offsets

    @property
    def values(self) -> list[Any]:
        """A new list of the R values; decodes them on first use. O(R)."""
        return list(self._decoded())

    def _decoded(self) -> list[Any]:
        values = self._values
        if values is None:
            with self._lock:
                values = self._values
                if values is None:
                    assert self._decode is not None
                    values = self._decode()
                    if len(values) != len(self._starts):
                        raise FormatError(
                            f"decoded {len(values)} span values, expected {len(self._starts)}",
                            field="metadata",
                        )
                    self._values = values
                    self._decode = None
        return values

    def _tuples(self) -> list[tuple[int, int, Any]]:
        """All R ``(start, end, value)`` tuples, built once on first use (O(R)).

        Two threads may both build them; either list is kept, both are equal.
        """
        rows = self._rows
        if rows is None:
            rows = list(zip(self._starts.tolist(), self._ends.tolist(), self._decoded(),
                            strict=True))
            self._rows = rows
        return rows

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, b: int) -> Spans:
        """The spans of observation ``b`` (negative counts from the end). O(1)."""
        count = len(self._offsets) - 1
        i = operator.index(b)
        if i < 0:
            i += count
        if not 0 <= i < count:
            raise IndexError(f"observation {b} out of range for {count} observations")
        return Spans(self, self._offsets.item(i), self._offsets.item(i + 1))

    def __iter__(self) -> Iterator[Spans]:
        return iter(self.observations())

    def observations(self) -> list[Spans]:
        """The B per-observation ``Spans``, in order. O(B), no tuple and no decode."""
        bounds = self._offsets.tolist()
        return list(map(Spans, repeat(self, len(bounds) - 1), bounds, islice(bounds, 1, None)))

    def __reduce__(self) -> tuple[Any, ...]:
        return SpanTable.from_lists, ([spans.tolist() for spans in self.observations()],)

    def __repr__(self) -> str:
        return f"SpanTable(observations={len(self)}, spans={len(self._starts)})"


class Spans(Sequence[tuple[int, int, Any]]):
    """One observation's spans: a read-only sequence of ``(start, end, value)``.

    Made by :class:`SpanTable`; O(1) to create. Equal to any sequence (list,
    tuple, Spans) of the same triples, each given as a tuple or a list of
    three; NumPy array values compare by dtype, shape and contents. Unhashable,
    like a list.
    """

    __slots__ = ("_hi", "_lo", "_table")

    def __init__(self, table: SpanTable, lo: int, hi: int) -> None:
        self._table = table
        self._lo = lo
        self._hi = hi

    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, index: int) -> tuple[int, int, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, int, Any]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[int, int, Any] | list[tuple[int, int, Any]]:
        """Span ``index`` as a tuple (O(1)), or a list of tuples for a slice (O(k))."""
        if isinstance(index, slice):
            return self.tolist()[index]
        count = self._hi - self._lo
        i = operator.index(index)
        if i < 0:
            i += count
        if not 0 <= i < count:
            raise IndexError(f"span {index} out of range for {count} spans")
        k = self._lo + i
        table = self._table
        return table._starts.item(k), table._ends.item(k), table._decoded()[k]

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        return iter(self.tolist())

    def __contains__(self, item: object) -> bool:
        return any(_same_triple(span, item) for span in self)

    @property
    def starts(self) -> npt.NDArray[np.int64]:
        """Starts of this observation's spans, int64 (read-only view). O(1)."""
        return self._table._starts[self._lo : self._hi]

    @property
    def ends(self) -> npt.NDArray[np.int64]:
        """Ends (exclusive) of this observation's spans, int64 (read-only view). O(1)."""
        return self._table._ends[self._lo : self._hi]

    @property
    def values(self) -> list[Any]:
        """A new list of this observation's values (decodes the table's once). O(k)."""
        return self._table._decoded()[self._lo : self._hi]

    def tolist(self) -> list[tuple[int, int, Any]]:
        """A new list of the ``(start, end, value)`` tuples. O(k); the table's
        first call builds (and keeps) all R tuples, O(R).
        """
        return self._table._tuples()[self._lo : self._hi]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Spans):
            if other._table is self._table and (other._lo, other._hi) == (self._lo, self._hi):
                return True
            return (
                np.array_equal(self.starts, other.starts)
                and np.array_equal(self.ends, other.ends)
                and all(map(_same_value, self.values, other.values))
            )
        if not isinstance(other, Sequence) or isinstance(other, _NOT_TRIPLES):
            return NotImplemented
        return len(other) == len(self) and all(map(_same_triple, self, other))

    __hash__ = None  # type: ignore[assignment]  # compares equal to lists, so unhashable too

    def __reduce__(self) -> tuple[Any, ...]:
        return _spans_from_list, (self.tolist(),)

    def __repr__(self) -> str:
        shown = [repr(span) for span in self[:_REPR_SPANS]]
        if len(self) > _REPR_SPANS:
            shown.append("...")
        return f"Spans([{', '.join(shown)}])"


def _spans_from_list(triples: list[tuple[int, int, Any]]) -> Spans:
    """The one observation of an eager table over ``triples`` (unpickling)."""
    return SpanTable.from_lists([triples])[0]


def _same_triple(span: tuple[int, int, Any], item: object) -> bool:
    if isinstance(item, _NOT_TRIPLES) or not isinstance(item, Sequence) or len(item) != 3:
        return False
    start, end, value = item
    return bool(span[0] == start and span[1] == end) and _same_value(span[2], value)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b))
        )
    return bool(a == b)


wire.register_encoder(Spans, Spans.tolist)
