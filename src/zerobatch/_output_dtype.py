"""The dtype of token outputs: one vocabulary for every reader's ``dtype=``.

Readers and loaders that return tokens take the same spellings: a string
(``"int64"``, ``"int32"``, or ``"stored"`` for the dataset's own dtype), a NumPy
dtype or type (``np.int64``, ``np.dtype("<i4")``), or a torch dtype
(``torch.int64``) where torch is installed. Anything else raises one
ValueError that names the argument and the accepted values.

>>> output_dtype("int32"), output_dtype(np.int64), output_dtype("stored")
(dtype('int32'), dtype('int64'), None)
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["CASTS", "STORED", "output_dtype"]

STORED = "stored"
"""The spelling that keeps the dataset's stored dtype (no cast)."""

CASTS = ("int64", "int32")
"""The dtypes token outputs can be cast to."""


def output_dtype(value: Any, *, argument: str = "dtype",
                 allowed: tuple[str, ...] = (*CASTS, STORED)) -> np.dtype | None:
    """The NumPy dtype ``value`` names, or None for ``"stored"``; ValueError
    naming ``argument`` unless it is one of ``allowed``."""
    name = _name(value)
    if name is None or name not in allowed:
        choices = ", ".join(repr(choice) for choice in allowed)
        raise ValueError(f"{argument} must be one of {choices} (a str, a NumPy dtype or a "
                         f"torch dtype), got {value!r}")
    return None if name == STORED else np.dtype(name)


def _name(value: Any) -> str | None:
    if isinstance(value, str) and value == STORED:
        return STORED
    torch = sys.modules.get("torch")  # a torch dtype means torch is imported already
    if torch is not None and isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if value is None or isinstance(value, bool):
        return None
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        return None
    return dtype.name if dtype.isnative else None
