"""``njit`` for zerobatch's kernels, loading them from Numba's on-disk cache
without the whole compiler.

Numba's ``FunctionCache.load_overload`` refreshes the CPU target before it
loads a cached kernel: it imports every typing and lowering registry Numba
has (NumPy's linear algebra among them, which imports ``scipy.linalg`` to
find a BLAS). In a fresh process that is 0.2-0.4 s and tens of MiB before the
first batch, though a cached kernel is machine code that needs none of it:
only Numba's runtime (NRT, for the arrays a kernel allocates). Every process
pays it: each torchrun rank, each spawned DataLoader worker.

Kernels decorated here load with the runtime alone. A kernel that is not in
the cache compiles as usual (Numba's compiler refreshes the target itself),
and a load that fails for any reason falls back to Numba's own path, so the
result never differs from ``numba.njit``'s.

Kernels reached by a first batch must not call NumPy functions that Numba
implements in ``numba.np.arraymath`` (``np.searchsorted``, ``np.cumsum``, ...):
rebuilding such a kernel imports that module, and with it SciPy. Use the
project's own loops (``stream._kernels.count_at_or_below``);
``tests/test_jit.py`` checks a fresh process's first batches.

Numba stamps a cache entry with the mtime and size of the kernel's own file
only, though the machine code holds every callee it inlined and every global
it read, from any module: edit a callee's module alone (a git pull, a
checkout) and the caller kept its old code. Entries made here are stamped
with every ``.py`` file of the kernel's top-level package, so any change to
the package compiles its kernels again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numba
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

__all__ = ["njit"]

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def _package_stamp(root: str) -> str:
    """A digest of the path, mtime and size of every ``.py`` file under ``root``."""
    stamps = []
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                stat = os.stat(path)
                stamps.append(f"{os.path.relpath(path, root)}:{stat.st_mtime_ns}:{stat.st_size}")
    return hashlib.blake2b("\n".join(stamps).encode(), digest_size=16).hexdigest()


def _package_root(py_function: Callable[..., Any]) -> str | None:
    """The folder of ``py_function``'s top-level package, or None (a script's)."""
    module = sys.modules.get(py_function.__module__.partition(".")[0])
    paths = getattr(module, "__path__", None)
    return None if not paths else str(next(iter(paths)))


class _KernelCache(FunctionCache):
    """Numba's per-function cache, loading an entry with the runtime only; its
    entries are stamped with the whole package's sources (the module docstring)."""

    def __init__(self, py_function: Callable[..., Any]) -> None:
        super().__init__(py_function)
        self._root = _package_root(py_function)

    def _stamp(self) -> None:
        """Stamp the entries with the package's sources: on the first load or
        save, not at import (the package's files are stat-ed once a process)."""
        if self._root is not None:
            cache_file = self._cache_file
            cache_file._source_stamp = (cache_file._source_stamp, _package_stamp(self._root))
            self._root = None

    def save_overload(self, sig: Any, data: Any) -> None:
        self._stamp()
        super().save_overload(sig, data)

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        from numba.core.runtime import rtsys

        self._stamp()
        try:
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:  # an entry this path cannot rebuild: Numba's own load
            return super().load_overload(sig, target_context)


def njit(signature: Any = None, **options: Any) -> Any:
    """``numba.njit`` with the light cache load above when ``cache=True``:
    ``@njit``, ``@njit(cache=True, nogil=True)``, or with a signature (or a
    list of them), compiled (or loaded) when decorated, as Numba does."""
    if callable(signature):
        return njit(**options)(signature)
    signatures = [] if signature is None else (
        signature if isinstance(signature, list) else [signature])

    def decorate(py_function: F) -> Any:
        # cache=False here: Numba's own cache would be made (a file written to
        # check the folder) and replaced at once
        dispatcher = numba.njit(**{**options, "cache": False})(py_function)
        if not isinstance(dispatcher, Dispatcher):  # NUMBA_DISABLE_JIT: the function itself
            return dispatcher
        if options.get("cache"):
            # Numba's own slot for it (what Dispatcher.enable_caching sets)
            dispatcher._cache = _KernelCache(py_function)  # type: ignore[attr-defined]
        for each in signatures:
            dispatcher.compile(each)
        if signatures:
            dispatcher.disable_compile()
        return dispatcher

    return decorate
