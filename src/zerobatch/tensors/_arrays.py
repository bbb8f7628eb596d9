"""Turning caller tensors (NumPy, PyTorch, JAX) into what the writers need:
dtype code, shape and the raw little-endian C-order bytes, without copying
arrays that already are contiguous and little-endian."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from zerobatch.tensors._dtypes import BINTENSORS_ID, DTYPES, code_of_numpy
from zerobatch.tensors._header import BINTENSORS, FORMATS, SAFETENSORS
from zerobatch.tensors._safetensors_header import METADATA_KEY

__all__ = ["Planned", "plan"]

_F4_PAIRS = "float4_e2m1fn_x2"


@dataclass(frozen=True)
class Planned:
    """One tensor ready to write: ``data`` is a flat uint8 view of its bytes."""

    name: str
    code: int
    shape: tuple[int, ...]
    data: np.ndarray[Any, np.dtype[np.uint8]]


def _from_torch(tensor: Any) -> tuple[int | None, tuple[int, ...], Any]:
    import torch

    if tensor.layout != torch.strided:
        raise ValueError(f"is a sparse tensor ({tensor.layout}); make it dense with "
                         ".to_dense() before saving")
    name = str(tensor.dtype).removeprefix("torch.")
    code = next((c for c, dtype in enumerate(DTYPES) if dtype.torch_name == name), None)
    shape = tuple(tensor.shape)
    if name == _F4_PAIRS:  # two 4-bit elements per byte: the file counts elements
        if not shape:
            raise ValueError("is a 0-d float4_e2m1fn_x2 tensor; F4 needs a last dimension")
        shape = (*shape[:-1], shape[-1] * 2)
        tensor = tensor.view(torch.uint8)
    flat = tensor.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return code, shape, flat.view(torch.uint8).numpy()


def _from_numpy(array: np.ndarray[Any, Any]) -> tuple[int | None, tuple[int, ...], Any]:
    code = code_of_numpy(array.dtype)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))  # copy: files are little-endian
    # ascontiguousarray copies only arrays that are not C-contiguous already
    flat = np.ascontiguousarray(array).reshape(-1)
    return code, tuple(array.shape), flat.view(np.uint8) if code is not None else flat


def _convert(value: Any) -> tuple[int | None, tuple[int, ...], Any]:
    module = type(value).__module__
    if module.startswith("torch"):
        return _from_torch(value)
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)  # JAX and other array-likes: one copy to host
    return _from_numpy(value)


def _check_metadata(metadata: Mapping[str, str] | None) -> list[str]:
    if metadata is None:
        return []
    if not isinstance(metadata, Mapping):
        return [f"metadata must be a dict of str to str, got {type(metadata).__name__}"]
    return [f"metadata {k!r}: keys and values must be str" for k, v in metadata.items()
            if type(k) is not str or type(v) is not str]


def plan(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None,
         fmt: str) -> tuple[list[Planned], list[tuple[str, int, tuple[int, ...], int, int]]]:
    """The tensors in write order, and header entries (name, code, shape, begin, end).

    Writers sort by dtype (largest id first) then name, as the reference
    writers do. Raises ValueError naming every offending tensor at once.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if not isinstance(tensors, Mapping):
        raise ValueError(f"argument 'tensors': expected a dict of names to tensors, got "
                         f"{type(tensors).__name__}")
    problems = _check_metadata(metadata)
    planned = []
    for name, value in tensors.items():
        if type(name) is not str:
            problems.append(f"tensor name {name!r} is not a str")
            continue
        if fmt == SAFETENSORS and name == METADATA_KEY:
            problems.append(f"{METADATA_KEY!r} is reserved for metadata in safetensors")
            continue
        try:
            code, shape, data = _convert(value)
        except ValueError as error:
            problems.append(f"tensor {name!r} {error}")
            continue
        if code is None or (fmt == BINTENSORS and code not in BINTENSORS_ID):
            dtype = getattr(value, "dtype", type(value).__name__)
            problems.append(f"tensor {name!r}: {fmt} cannot store dtype {dtype}")
            continue
        planned.append(Planned(name, code, shape, data))
    if problems:
        raise ValueError("cannot save: " + "; ".join(problems))

    def rank(item: Planned) -> tuple[int, str]:
        return -(BINTENSORS_ID[item.code] if fmt == BINTENSORS else item.code), item.name

    planned.sort(key=rank)
    entries = []
    offset = 0
    for item in planned:
        entries.append((item.name, item.code, item.shape, offset, offset + item.data.size))
        offset += item.data.size
    return planned, entries
