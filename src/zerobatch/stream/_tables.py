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
from numba import typed

from zerobatch._jit import njit

__all__ = ["typed_tables"]


@njit(cache=True)
def _empty_like(example: np.ndarray) -> typed.List:
    out = typed.List()
    out.append(example)  # types the list
    out.pop()
    return out


@njit(cache=True)
def _append(out: typed.List, table: np.ndarray) -> None:
    out.append(table)


def typed_tables(tables: Sequence[np.ndarray], empty: np.ndarray) -> typed.List:
    """``tables`` as a typed list of ``empty``'s array type (dtype, dimensions,
    layout, writability): a writable table joins a read-only list as a
    read-only view, so every caller compiles the same two kernels once."""
    out = _empty_like(empty)
    for table in tables:
        if table.flags.writeable and not empty.flags.writeable:
            table = table.view()
            table.flags.writeable = False
        _append(out, table)
    return out
