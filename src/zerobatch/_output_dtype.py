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

from zerobatch.errors import FormatError

__all__ = ["CASTS", "STORED", "id_bounds", "output_dtype", "token_error"]

STORED = "stored"
"""The spelling that keeps the dataset's stored dtype (no cast)."""

CASTS = ("int64", "int32")
"""The dtypes token outputs can be cast to."""

_CAST_DTYPES = {name: np.dtype(name) for name in CASTS}


def output_dtype(value: Any, *, argument: str = "dtype",
                 allowed: tuple[str, ...] = (*CASTS, STORED)) -> np.dtype | None:
    """The NumPy dtype ``value`` names, or None for ``"stored"``; ValueError
    naming ``argument`` unless it is one of ``allowed``."""
    if type(value) is str and value in allowed:  # the usual spellings: no dtype parse
        if value == STORED:
            return None
        if value in _CAST_DTYPES:
            return _CAST_DTYPES[value]
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


def id_bounds(stored: np.dtype, out: np.dtype | None) -> np.ndarray:
    """The smallest and largest token id ``out`` holds, as two values of
    ``stored``; empty when every ``stored`` value fits (no check needed)."""
    if out is None:
        return np.empty(0, stored)
    have, hold = np.iinfo(stored), np.iinfo(out)
    low, high = max(have.min, 0), min(have.max, hold.max)  # a token id is never negative
    if (low, high) == (have.min, have.max):
        return np.empty(0, stored)
    return np.array([low, high], stored)


def token_error(
    path: Any, field: str, value: int, record: int, stored: np.dtype, out: np.dtype
) -> FormatError:
    """The error for token id ``value`` at ``record`` of file ``path``: it does
    not fit ``out``."""
    if value < 0:
        return FormatError(f"token id {value} at record {record} is negative (stored as "
                           f"{stored.str}); token ids must be >= 0: the file is corrupt, or "
                           "was written with a signed dtype by mistake", path=path, field=field)
    wider = "int64" if out.itemsize < 8 else None
    hint = (f"read with dtype='{wider}'" if wider else
            "ids this large need dtype='stored' (no cast)")
    return FormatError(f"token id {value} at record {record} does not fit the output "
                       f"dtype {out.name}; {hint}", path=path, field=field)
