"""The indexes ``get_slice(name)[...]`` accepts: exactly safetensors 0.8.0's.

Accepted per dimension: an int ``i`` with ``-size <= i < size``; a slice with
bounds that are not negative, ``start < size``, ``start <= stop <= size`` (an
omitted start is 0, an omitted stop is ``size``) and a positive step (honoured);
at most one ``...``. Refused with :class:`SliceError`: lists, arrays, ``None``,
negative bounds, steps below 1, slices running past a dimension, and more
indexes than dimensions. Every dimension an ellipsis stands for is checked as
``:`` (so ``...`` over a dimension of size 0 is refused); trailing dimensions
left out are taken whole, unchecked.
"""

from __future__ import annotations

import operator
from typing import Any

from zerobatch.tensors._errors import SliceError

__all__ = ["basic_index"]


def _as_int(value: Any) -> int | None:
    if isinstance(value, (list, tuple, slice)) or value is None or value is Ellipsis:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _bound(value: Any, default: int, what: str, dim: int, where: str) -> int:
    if value is None:
        return default
    number = _as_int(value)
    if number is None:
        raise TypeError(f"{where}: slice {what} {value!r} in dimension #{dim} is not an int")
    return number


def basic_index(index: Any, shape: tuple[int, ...], *, path: object, name: str
                ) -> tuple[int | slice, ...]:
    """``index`` checked against ``shape`` and spelled out, one int or slice
    per dimension, ready for NumPy basic indexing (no Ellipsis, no negatives)."""
    items = index if isinstance(index, tuple) else (index,)
    where = f"tensor {name!r} of shape {list(shape)}"
    for position, item in enumerate(items):
        if item is not Ellipsis and not isinstance(item, slice) and _as_int(item) is None:
            raise SliceError(f"{where}: index at position {position} is {item!r}; only ints, "
                             "slices and one ... are accepted (no lists, arrays or None)",
                             path=path, field=name)
    ellipses = sum(item is Ellipsis for item in items)
    if ellipses > 1:
        raise SliceError(f"{where}: only one ellipsis (...) is allowed", path=path, field=name)
    explicit = len(items) - ellipses
    if explicit > len(shape):
        raise SliceError(f"{where}: {explicit} indexes for {len(shape)} dimensions",
                         path=path, field=name)
    fill = (slice(None),) * (len(shape) - explicit)
    if ellipses:
        cut = next(k for k, item in enumerate(items) if item is Ellipsis)
        items = (*items[:cut], *fill, *items[cut + 1 :])
    result: list[int | slice] = []
    for dim, (item, size) in enumerate(zip(items, shape[: len(items)], strict=True)):
        if not isinstance(item, slice):
            number = operator.index(item)
            if not -size <= number < size:
                raise SliceError(f"{where}: index {number} is out of range for dimension "
                                 f"#{dim} of size {size}", path=path, field=name)
            result.append(number % size)
            continue
        start = _bound(item.start, 0, "start", dim, where)
        stop = _bound(item.stop, size, "stop", dim, where)
        step = _bound(item.step, 1, "step", dim, where)
        if step < 1:
            raise SliceError(f"{where}: slice step must be a positive integer, got {step}",
                             path=path, field=name)
        if start < 0 or stop < 0:
            raise SliceError(f"{where}: slice {start}:{stop} in dimension #{dim} has a "
                             "negative bound; write it with non-negative bounds",
                             path=path, field=name)
        if start >= size or stop > size or start > stop:
            raise SliceError(f"{where}: slice {start}:{stop} runs outside dimension #{dim} "
                             f"of size {size} (need start < size and start <= stop <= size)",
                             path=path, field=name)
        result.append(slice(start, stop, step))
    return tuple(result)
