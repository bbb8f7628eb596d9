"""Numba typed lists of per-shard tables, built by cached kernels.

``numba.typed.List``'s own methods (creation, ``append``) are compiled the first
time a process calls them from Python, never cached: about 0.15 s of every
fresh process's first batch that needs a table list (position_ids, metadata,
documents, remote reads). Built here by two ``cache=True`` kernels instead, the
same lists cost nothing to compile after the first run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, typed

__all__ = ["typed_tables"]


@njit(cache=True)
def _list_of(first: np.ndarray, keep: bool) -> typed.List:
    out = typed.List()
    out.append(first)
    if not keep:
        out.pop()
    return out


@njit(cache=True)
def _append(out: typed.List, table: np.ndarray) -> None:
    out.append(table)


def typed_tables(tables: Sequence[np.ndarray], empty: np.ndarray) -> typed.List:
    """``tables`` as a typed list (each of ``empty``'s array type: same dtype,
    dimensions and writability); ``empty`` only types the list when there are none."""
    out = _list_of(tables[0] if tables else empty, bool(tables))
    for table in tables[1:]:
        _append(out, table)
    return out
