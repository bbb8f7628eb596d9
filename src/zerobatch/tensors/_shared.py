"""Finding torch tensors that share memory, as ``safetensors.torch`` does.

A storage is identified by (device, address, size in bytes). Tensors on the
same storage whose byte ranges overlap form one group; tensors on the same
storage that do not overlap (two halves of one buffer) are separate groups.
Names and signatures match safetensors 0.8.0 so code importing them from
``safetensors.torch`` can import them from ``zerobatch.tensors.torch``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = [
    "_filter_shared_not_shared",
    "_find_shared_tensors",
    "_is_complete",
    "_remove_duplicate_names",
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


def _byte_range(tensor: Any) -> tuple[int, int]:
    """[first byte, one past the last byte of the element farthest in memory);
    any strides (transposed views too)."""
    start = int(tensor.data_ptr())
    if tensor.nelement() == 0:
        return start, start
    reach = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(),
                                                            strict=True))
    return start, start + (reach + 1) * tensor.element_size()


def _filter_shared_not_shared(tensors: list[set[str]], state_dict: dict[str, Any]
                              ) -> list[set[str]]:
    """Split each group of same-storage names into groups that really overlap."""
    result: list[set[str]] = []
    for group in tensors:
        if len(group) < 2:
            result.append(group)
            continue
        spans = sorted((*_byte_range(state_dict[name]), name) for name in group)
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
