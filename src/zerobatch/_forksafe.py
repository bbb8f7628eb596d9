"""Locks a forked child finds unlocked, and objects told that they are in one.

A process forked (``os.fork``; ``multiprocessing``'s and a torch
``DataLoader``'s default start method on Linux) while another of its threads
holds a lock gets that lock held for ever: the thread does not exist in the
child. A Loader's reader threads take the locks of the source they read (its
files, index tables, block cache, buffers, packed windows); a DataLoader worker
forked from a process where such a thread was reading would wait on its first
read for ever. So every lock zerobatch's sources hold comes from :func:`lock`
or :func:`rlock`, and a forked child re-makes each one unlocked
(``_at_fork_reinit``, as the standard library does for its own). What those
locks guard stays usable: every critical section writes finished values in
single steps (a table built or a file opened lands in one assignment, or is
missing in the child and built again), so a child sees a state of some
bytecode boundary of the parent's threads, which is a consistent one.

Objects that need more than their locks re-made (a Loader pass whose reader
threads stayed in the parent) :func:`register` an ``_after_fork()`` method,
called in the child.

Two locks outside zerobatch are held by reader threads on a first batch, for
long enough that a DataLoader starting its workers meets them: Numba's
compiler lock while a kernel is compiled or loaded from its cache (~1 s), and
an import's module lock while a module loads (Numba's ``typeof`` imports
``numpy.ma`` on first use; the standard library re-makes only the global
import lock in a child, not the module locks). A child forked in either
window would wait on it for ever, with the module or LLVM's state half
written. A fork therefore waits (at most ``_WAIT`` seconds, then forks as
before) until no other thread imports a module, and takes the compiler lock
before it forks, releasing it after in both processes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any, Protocol

__all__ = ["lock", "register", "rlock"]

_locks: weakref.WeakSet[Any] = weakref.WeakSet()
_owners: weakref.WeakSet[Any] = weakref.WeakSet()
_numba_held: list[Any] = []  # numba's compiler lock, while this thread holds it over a fork
_WAIT = 10.0  # seconds a fork waits at most for another thread's import


class _ForkAware(Protocol):
    def _after_fork(self) -> None: ...


def lock() -> threading.Lock:
    """A ``threading.Lock`` that a forked child finds unlocked."""
    made = threading.Lock()
    _locks.add(made)
    return made


def rlock() -> threading.RLock:
    """A ``threading.RLock`` that a forked child finds unlocked."""
    made = threading.RLock()
    _locks.add(made)
    return made


def register(owner: _ForkAware) -> None:
    """Call ``owner._after_fork()`` in every child forked while ``owner`` lives
    (after every lock is re-made). It runs in the child's only thread, before
    the child does anything else: it must not start threads or block."""
    _owners.add(owner)


def _importing_elsewhere() -> bool:
    """Whether another thread holds a module's import lock (CPython's
    ``importlib._bootstrap`` module locks; False where they are not found)."""
    locks = getattr(sys.modules.get("importlib._bootstrap"), "_module_locks", None)
    if not isinstance(locks, dict):
        return False
    me = threading.get_ident()
    for ref in list(locks.values()):
        owner = getattr(ref() if callable(ref) else ref, "owner", None)
        if owner is not None and owner != me:
            return True
    return False


def _wait_for_imports() -> None:
    deadline = time.monotonic() + _WAIT
    while _importing_elsewhere() and time.monotonic() < deadline:
        time.sleep(0.001)


def _before() -> None:
    _wait_for_imports()
    compiler = sys.modules.get("numba.core.compiler_lock")
    if compiler is not None:
        held = compiler.global_compiler_lock
        held.acquire()  # waits for a compile in another thread to finish
        _numba_held.append(held)
        _wait_for_imports()  # one the compile started


def _after_in_parent() -> None:
    while _numba_held:
        _numba_held.pop().release()


def _after_in_child() -> None:
    for made in list(_locks):
        made._at_fork_reinit()
    _after_in_parent()  # the forking thread's own hold: this thread, in the child
    for owner in list(_owners):
        owner._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent,
                        after_in_child=_after_in_child)
