"""Drop-in for ``safetensors.torch``: change only the import.

``from zerobatch.tensors.torch import save_file, load_file, save_model,
load_model, safe_open`` takes the same arguments, has the same defaults and
returns the same values as safetensors 0.8.0, and writes the same bytes.
Errors are :class:`zerobatch.FormatError` (exported as ``SafetensorError``)
where safetensors raises its ``SafetensorError``. ``format="bintensors"``
writes bintensors files instead; readers detect the format.

Tensors that share memory (tied weights) are found as ``safetensors.torch``
finds them, with the same helper names and signatures (``storage_ptr``,
``_find_shared_tensors``, ``_remove_duplicate_names`` ...). A storage is
identified by (device, address, size in bytes); tensors on the same storage
whose byte ranges overlap form one group, and tensors on the same storage
that do not overlap (two halves of one buffer) are separate groups.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from zerobatch.tensors._dropin import DropIn, TensorSpec, deserialize, serialize, serialize_file
from zerobatch.tensors._open import safe_open
from zerobatch.tensors.format import SAFETENSORS, SafetensorError

__all__ = [
    "SafetensorError",
    "TensorSpec",
    "_end_ptr",
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


def storage_ptr(tensor: Any) -> int:
    """Address of the start of ``tensor``'s storage (0 for meta tensors)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: Any) -> int:
    """Bytes in ``tensor``'s whole storage (its own bytes when it has none)."""
    try:
        return int(tensor.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError):
        return int(tensor.nelement() * tensor.element_size())


def _end_ptr(tensor: Any) -> int:
    """One past the last byte of ``tensor``'s element farthest in memory (its
    ``data_ptr()`` when empty), for any strides: safetensors' helper of this
    name fails on a transposed view."""
    start = int(tensor.data_ptr())
    if tensor.nelement() == 0:
        return start
    reach = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(),
                                                            strict=True))
    return start + (reach + 1) * tensor.element_size()


def _filter_shared_not_shared(tensors: list[set[str]], state_dict: dict[str, Any]
                              ) -> list[set[str]]:
    """Split each group of same-storage names into groups that really overlap."""
    result: list[set[str]] = []
    for group in tensors:
        if len(group) < 2:
            result.append(group)
            continue
        spans = sorted((int(state_dict[name].data_ptr()), _end_ptr(state_dict[name]), name)
                       for name in group)
        end = None
        for start, stop, name in spans:
            if end is None or start >= end:
                result.append({name})
            else:
                result[-1].add(name)
            end = stop
    return result


def _find_shared_tensors(state_dict: dict[str, Any]) -> list[set[str]]:
    """Groups of names whose tensors overlap in memory (singletons included;
    meta tensors and empty storages are left out), in safetensors' order: by
    storage, in the order each storage is first met in ``state_dict``."""
    by_storage: dict[tuple[Any, int, int], set[str]] = defaultdict(set)
    for name, tensor in state_dict.items():
        if tensor.device.type == "meta":
            continue
        pointer, size = storage_ptr(tensor), storage_size(tensor)
        if pointer and size:
            by_storage[(tensor.device, pointer, size)].add(name)
    # safetensors sorts the sets themselves: set < set is "proper subset", never
    # true between disjoint groups, so the stable sort keeps first-seen order
    groups = sorted(by_storage.values())
    return _filter_shared_not_shared(groups, state_dict)


def _is_complete(tensor: Any) -> bool:
    """Whether ``tensor`` starts at its storage and covers all of it."""
    return bool(tensor.data_ptr() == storage_ptr(tensor)
                and tensor.nelement() * tensor.element_size() == storage_size(tensor))


def _remove_duplicate_names(state_dict: dict[str, Any], *,
                            preferred_names: Iterable[str] | None = None,
                            discard_names: Iterable[str] | None = None) -> dict[str, list[str]]:
    """For each group of shared tensors: the name to keep -> the names to drop.

    The kept name covers the whole storage; among those, the first by sort
    order, preferring names not in ``discard_names`` and then names in
    ``preferred_names`` (the names a file holds, when loading). Raises
    RuntimeError when no name covers the whole storage.
    """
    preferred = set(preferred_names or ())
    discard = set(discard_names or ())
    drops: dict[str, list[str]] = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        complete = {name for name in group if _is_complete(state_dict[name])}
        if not complete:
            raise RuntimeError(
                f"tensors {sorted(group)}: none covers the whole storage it lies in (each is a "
                "view of a larger buffer), so it cannot stand for that storage; save .clone()d "
                "tensors or the full tensor they are views of")
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        for name in sorted(group):
            if name != keep:
                drops[keep].append(name)
    return drops


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


_TORCH = DropIn("pt", "tensors", "a torch.Tensor", _is_tensor, _check_torch)


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
