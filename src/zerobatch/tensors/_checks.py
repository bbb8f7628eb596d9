"""Argument checks the safetensors-compatible functions share: each error
names the argument, with the exception class safetensors raises for it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["check_filename", "check_metadata", "check_tensor_dict"]


def check_tensor_dict(tensors: Any, argument: str = "tensors") -> None:
    """``tensors`` (the argument named ``argument``) must be a dict with str keys."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"argument {argument!r}: expected a dict of names to tensors, got "
                         f"{type(tensors).__name__}")
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"argument {argument!r}: tensor names must be str, got {name!r} "
                            f"({type(name).__name__})")


def check_metadata(metadata: Any) -> None:
    """``metadata`` must be None or a dict of str to str."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise TypeError("argument 'metadata': expected a dict of str to str or None, got "
                        f"{type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"argument 'metadata': entry {key!r}: {value!r} is not str to str")


def check_filename(filename: Any) -> None:
    """``filename`` must be a str, bytes or ``os.PathLike`` path."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        raise TypeError("argument 'filename': expected str, bytes or os.PathLike, not "
                        f"{type(filename).__name__}")
