"""What the safetensors drop-in modules (``torch``, ``numpy``, ``jax``) share:
each declares its functions with safetensors' signatures and docstrings, and
calls the one :class:`Framework` that checks the arguments as safetensors
does and runs ``zerobatch.tensors``' own save and load."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zerobatch.tensors import _api
from zerobatch.tensors._checks import check_filename, check_metadata, check_tensor_dict

__all__ = ["Framework"]


def _no_more_checks(tensors: Mapping[str, Any]) -> None:
    """Frameworks without refusals of their own."""


@dataclass(frozen=True)
class Framework:
    """One framework's drop-in module.

    ``name`` is its ``safe_open`` framework (``"np"``, ``"pt"``, ``"jax"``),
    ``argument`` the name of its save functions' dict argument, ``is_tensor``
    what that dict's values must pass (``expected`` says what they should
    be, in errors), and ``check_more`` the framework's own refusals, run
    after the common ones and before anything is written.
    """

    name: str
    argument: str
    expected: str
    is_tensor: Callable[[Any], bool]
    check_more: Callable[[Mapping[str, Any]], None] = _no_more_checks

    def check_for_save(self, tensors: Any, metadata: Any) -> None:
        """safetensors' refusals, in its order: not a dict of str, bad
        metadata, a value that is not a tensor, then the framework's own."""
        check_tensor_dict(tensors, self.argument)
        check_metadata(metadata)
        for name, tensor in tensors.items():
            if not self.is_tensor(tensor):
                raise ValueError(f"argument {self.argument!r}: {name!r} is a "
                                 f"{type(tensor).__name__}, expected {self.expected}")
        self.check_more(tensors)

    def save(self, tensors: Any, metadata: Any, format: str) -> bytes:
        """The file bytes, after :meth:`check_for_save`."""
        self.check_for_save(tensors, metadata)
        return _api.save(tensors, metadata, format=format)

    def save_file(self, tensors: Any, filename: str | os.PathLike[str], metadata: Any,
                  format: str) -> None:
        """Write the file atomically, after :meth:`check_for_save` and a
        check of ``filename``."""
        self.check_for_save(tensors, metadata)
        check_filename(filename)
        _api.save_file(tensors, filename, metadata, format=format)

    def load(self, data: bytes) -> dict[str, Any]:
        """All tensors in ``data`` (file bytes), in file order."""
        return _api.load(data, self.name)

    def load_file(self, filename: Any, device: str | int, backend: str) -> dict[str, Any]:
        """All tensors in ``filename`` (a path or binary file object), in file order."""
        return _api.load_file(filename, self.name, device, backend=backend)
