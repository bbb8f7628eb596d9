"""Tensor-file bytes as each framework's arrays: NumPy views, PyTorch tensors,
JAX arrays, whole or sliced, the way safetensors 0.8.0 hands them out.

NumPy arrays are read-only views of the file's bytes (bf16 and the fp8 types
from ``ml_dtypes``; the packed F4 and F6 types have no NumPy form and raise
:class:`FormatError`). PyTorch tensors share a private copy-on-write map of
the file (writable; writes never reach the file); a device other than the CPU
costs one copy. JAX arrays are placed with one ``device_put``. torch and JAX
are imported only when a tensor of theirs is made.

``get_slice(name)[index]`` accepts what safetensors 0.8.0 accepts. For
``"pt"`` that is torch's own indexing of the whole tensor. For NumPy and JAX,
per dimension: an int ``i`` with ``-size <= i < size``; a slice with bounds
that are not negative, ``start < size``, ``start <= stop <= size`` (an omitted
start is 0, an omitted stop is ``size``) and a positive step (honoured); at
most one ``...``. Refused with :class:`SliceError`: lists, arrays, ``None``,
negative bounds, steps below 1, slices running past a dimension, and more
indexes than dimensions. Every dimension an ellipsis stands for is checked as
``:`` (so ``...`` over a dimension of size 0 is refused); trailing dimensions
left out are taken whole, unchecked.
"""

from __future__ import annotations

import mmap
import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.tensors.format import (
    DTYPES,
    Header,
    SafetensorError,
    SliceError,
    code_of_numpy,
    numpy_dtype,
)

__all__ = ["F4_PAIRS", "Adapter", "adapter", "view"]

F4_PAIRS = np.dtype("V1")
"""The NumPy dtype :func:`view` gives packed F4 data (two elements per byte)."""


def view(buffer: Any, header: Header, row: int, *, path: object, offset: int | None = None,
         packed: bool = False) -> np.ndarray[Any, Any]:
    """The tensor at ``row`` as an array over ``buffer`` (no copy); its bytes
    start at ``offset`` (default: where the header puts them in a whole-file
    buffer). With ``packed``, F4 comes back as :data:`F4_PAIRS` bytes, the
    last dimension halved."""
    info = header.info(row)
    code = int(header.codes[row])
    dtype = numpy_dtype(code)
    shape = info.shape
    if dtype is None and packed and DTYPES[code].bits == 4 and shape and shape[-1] % 2 == 0:
        dtype, shape = F4_PAIRS, (*shape[:-1], shape[-1] // 2)
    if dtype is None:
        raise FormatError(f"tensor {info.name!r}: dtype {info.dtype} packs "
                          f"{DTYPES[code].bits}-bit elements, which this framework cannot "
                          "view", path=path, field="dtype")
    count = (info.end - info.begin) // dtype.itemsize
    if count == 0:
        return np.empty(shape, dtype)
    if offset is None:
        offset = header.data_start + info.begin
    return np.frombuffer(buffer, dtype, count=count, offset=offset).reshape(shape)


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


def _basic_index(index: Any, shape: tuple[int, ...], *, path: object, name: str
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


def _numpy_device(device: str | int) -> str | int:
    """``device`` if NumPy can live there (the CPU only)."""
    if device != "cpu":
        raise SafetensorError(f"device {device!r} is not supported: NumPy arrays live on the CPU",
                              field="device")
    return device


def _numpy_array(array: np.ndarray[Any, Any], device: str | int) -> np.ndarray[Any, Any]:
    """``array`` itself: NumPy lives on the CPU only."""
    return array


_SAME_SIZE_INT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


@cache
def _torch_dtype(dtype: np.dtype[Any]) -> Any:
    import torch

    if dtype == F4_PAIRS:
        return torch.float4_e2m1fn_x2
    code = code_of_numpy(dtype)
    if code is None:
        raise TypeError(f"no torch dtype for {dtype}")
    return getattr(torch, str(DTYPES[code].torch_name))


def _torch_device(device: str | int) -> str | int:
    """``device`` if torch knows it (``"cpu"``, ``"cuda:1"``, ``0``)."""
    import torch

    if not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"argument 'device': expected str or int, not {type(device).__name__}")
    try:
        torch.device(device)
    except RuntimeError:
        raise SafetensorError(f"device {device!r} is invalid", field="device") from None
    return device


def _torch_tensor(array: np.ndarray[Any, Any], device: str | int) -> Any:
    """A ``torch.Tensor`` sharing ``array``'s memory (then moved to ``device``)."""
    import torch

    raw = array.view(_SAME_SIZE_INT[array.dtype.itemsize])
    if raw.size == 0:
        # NumPy gives empty arrays all-zero strides, and torch's .view(dtype) refuses
        # those: an empty tensor has no bytes to share, so it gets torch's own strides
        tensor = torch.empty(raw.shape, dtype=_torch_dtype(raw.dtype))
    else:
        if not raw.flags.aligned or any(stride < 0 for stride in raw.strides):
            raw = raw.copy()  # copy: torch needs aligned data and non-negative strides
        tensor = torch.from_numpy(raw)
    tensor = tensor.view(_torch_dtype(array.dtype))
    if device != "cpu" and torch.device(device).type != "cpu":
        tensor = tensor.to(device)
    return tensor


def _torch_take(array: np.ndarray[Any, Any], index: Any, device: str | int, *, path: object,
                name: str) -> Any:
    """``tensor[index]`` with torch's indexing rules, as safetensors 0.8.0 slices
    for ``"pt"`` (negative and clipped bounds, ``None``, lists and index tensors
    included; torch's own IndexError or ValueError otherwise), then moved to
    ``device``: only the part taken leaves the CPU."""
    part = _torch_tensor(array, "cpu")[index]
    return part.to(device) if device != "cpu" else part


def _jax_device(device: str | int) -> str | int:
    """``device`` as given; JAX resolves it when a tensor is placed."""
    if not isinstance(device, (str, int)):
        raise TypeError(f"argument 'device': expected str or int, not {type(device).__name__}")
    return device


def _jax_array(array: np.ndarray[Any, Any], device: str | int) -> Any:
    """``array`` placed on ``device``: ``"cpu"``, ``"gpu"``, or ``"gpu:1"``-style
    (one copy, which on the CPU backend may alias the read-only mapping)."""
    import jax

    platform, _, number = str(device).partition(":")
    target = jax.devices(platform)[int(number or 0)]
    return jax.device_put(array, target)


@dataclass(frozen=True)
class Adapter:
    """How one framework receives tensors.

    ``access`` is the mmap access its files are mapped with (``ACCESS_READ``:
    shared, read-only; ``ACCESS_COPY``: private, copy-on-write); ``packed``
    whether it takes F4 as :data:`F4_PAIRS` (torch's ``float4_e2m1fn_x2``);
    ``check_device`` returns a valid device or raises; ``convert(array,
    device)`` makes its tensor from a view; ``take(array, index, device, *,
    path, name)`` makes one from part of it, ``get_slice``'s rules.
    """

    access: int
    packed: bool
    check_device: Callable[[str | int], str | int]
    convert: Callable[[np.ndarray[Any, Any], str | int], Any]
    torch_indexing: bool = False

    def take(self, array: np.ndarray[Any, Any], index: Any, device: str | int, *,
             path: object, name: str) -> Any:
        """``array[index]`` under this framework's slicing rules, placed on ``device``."""
        if self.torch_indexing:
            return _torch_take(array, index, device, path=path, name=name)
        spelled = _basic_index(index, array.shape, path=path, name=name)
        # the trailing ... keeps all-int indexes a 0-d view, not a NumPy scalar
        return self.convert(array[(*spelled, Ellipsis)], device)


_NUMPY = Adapter(mmap.ACCESS_READ, False, _numpy_device, _numpy_array)
_TORCH = Adapter(mmap.ACCESS_COPY, True, _torch_device, _torch_tensor, torch_indexing=True)
_JAX = Adapter(mmap.ACCESS_READ, False, _jax_device, _jax_array)
_ADAPTERS = {"np": _NUMPY, "numpy": _NUMPY, "pt": _TORCH, "torch": _TORCH, "jax": _JAX,
             "flax": _JAX}


def adapter(framework: str) -> Adapter:
    """The :class:`Adapter` for ``framework`` (``"np"``/``"numpy"``, ``"pt"``/``"torch"``,
    ``"jax"``/``"flax"``)."""
    if not isinstance(framework, str):
        raise TypeError(f"argument 'framework': expected str, not {type(framework).__name__}")
    try:
        return _ADAPTERS[framework]
    except KeyError:
        known = sorted(_ADAPTERS)
        raise SafetensorError(f"framework must be one of {known}, got {framework!r}",
                              field="framework") from None
