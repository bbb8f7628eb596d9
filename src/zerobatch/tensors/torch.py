"""Drop-in for ``safetensors.torch``: change only the import.

``from zerobatch.tensors.torch import save_file, load_file, save_model,
load_model, safe_open`` takes the same arguments, has the same defaults and
returns the same values as safetensors 0.8.0, and writes the same bytes.
Errors are :class:`zerobatch.FormatError` (exported as ``SafetensorError``)
where safetensors raises its ``SafetensorError``. ``format="bintensors"``
writes bintensors files instead; readers detect the format.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zerobatch.tensors._dropin import Framework
from zerobatch.tensors._errors import SafetensorError
from zerobatch.tensors._header import SAFETENSORS
from zerobatch.tensors._open import safe_open
from zerobatch.tensors._shared import (
    _filter_shared_not_shared,
    _find_shared_tensors,
    _is_complete,
    _remove_duplicate_names,
    storage_ptr,
    storage_size,
)
from zerobatch.tensors._specs import TensorSpec, deserialize, serialize, serialize_file

__all__ = [
    "SafetensorError",
    "TensorSpec",
    "_filter_shared_not_shared",
    "_find_shared_tensors",
    "_is_complete",
    "_remove_duplicate_names",
    "deserialize",
    "load",
    "load_file",
    "load_model",
    "safe_open",
    "save",
    "save_file",
    "save_model",
    "serialize",
    "serialize_file",
    "storage_ptr",
    "storage_size",
]


def _is_tensor(tensor: Any) -> bool:
    import torch

    return isinstance(tensor, torch.Tensor)


def _check_torch(tensors: Mapping[str, Any]) -> None:
    """safetensors' torch refusals, in its order: sparse, shared memory
    (RuntimeError), not contiguous."""
    import torch

    sparse = [name for name, tensor in tensors.items() if tensor.layout != torch.strided]
    if sparse:
        raise ValueError(f"argument 'tensors': {sparse} are sparse; make them dense with "
                         ".to_dense() before saving (the file may grow a lot)")
    shared = [sorted(group) for group in _find_shared_tensors(dict(tensors)) if len(group) > 1]
    if shared:
        raise RuntimeError(f"argument 'tensors': {shared} share memory and would be stored "
                           "twice and load as separate tensors; use save_model, or .clone() "
                           "one of each group")
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(f"argument 'tensors': {name!r} is not contiguous; call "
                             ".contiguous() on it, or save the full tensor it is a view of")


_TORCH = Framework("pt", "tensors", "a torch.Tensor", _is_tensor, _check_torch)


def save(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None, *,
         format: str = SAFETENSORS) -> bytes:
    """The file bytes for ``tensors`` (contiguous, dense, not sharing memory)."""
    return _TORCH.save(tensors, metadata, format)


def save_file(tensors: Mapping[str, Any], filename: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None, *, format: str = SAFETENSORS) -> None:
    """Write ``tensors`` to ``filename`` (atomically: nothing appears on error)."""
    _TORCH.save_file(tensors, filename, metadata, format)


def load(data: bytes) -> dict[str, Any]:
    """All tensors in ``data`` (file bytes), as writable CPU tensors (one copy)."""
    return _TORCH.load(data)


def load_file(filename: Any, device: str | int = "cpu", *, backend: str = "mmap"
              ) -> dict[str, Any]:
    """All tensors in ``filename`` (a path or binary file object) on ``device``."""
    return _TORCH.load_file(filename, device, backend)


def save_model(model: Any, filename: str | os.PathLike[str],
               metadata: dict[str, str] | None = None, force_contiguous: bool = True, *,
               format: str = SAFETENSORS) -> None:
    """Save ``model.state_dict()``, each shared storage once.

    Of each group of tensors sharing memory (tied weights), the name that
    covers the storage and sorts first is written; each dropped name is
    recorded in the metadata as ``dropped -> kept`` (user entries win).
    """
    state_dict = model.state_dict()
    metadata = None if metadata is None else dict(metadata)
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            metadata = {} if metadata is None else metadata
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {name: tensor.contiguous() for name, tensor in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata, format=format)
    except ValueError as error:
        raise ValueError(f"{error}. Or use save_model(..., force_contiguous=True)") from error


def load_model(model: Any, filename: Any, strict: bool = True, device: str | int = "cpu", *,
               backend: str = "mmap") -> tuple[set[str], list[str]]:
    """Load ``filename`` into ``model`` in place; shared tensors saved once by
    :func:`save_model` fill every name that shares them.

    Returns ``(missing, unexpected)``: the set of model names the file did
    not fill and the list of file names the model did not use (a set and a
    list, as safetensors returns them). With ``strict``, raises RuntimeError
    when either is non-empty.
    """
    state_dict = load_file(filename, device, backend=backend)
    shared = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing_keys, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing_keys)
    for dropped in shared.values():
        for name in dropped:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        lines = [f"Error(s) in loading state_dict for {type(model).__name__}:"]
        if missing:
            lines.append("    Missing key(s) in state_dict: "
                         + ", ".join(f'"{name}"' for name in sorted(missing)))
        if unexpected:
            lines.append("    Unexpected key(s) in state_dict: "
                         + ", ".join(f'"{name}"' for name in sorted(unexpected)))
        raise RuntimeError("\n".join(lines))
    return missing, list(unexpected)
