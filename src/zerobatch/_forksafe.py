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

Numba's compiler lock is held while a kernel is compiled or loaded from its
cache (a reader's first batch of a dtype, ~1 s): a fork in that window would
leave the child waiting on it, and LLVM's state half-written. A fork therefore
waits until no thread compiles (the lock is taken before the fork, and
released after it in both processes).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Protocol

__all__ = ["lock", "register", "rlock"]

_locks: weakref.WeakSet[Any] = weakref.WeakSet()
_owners: weakref.WeakSet[Any] = weakref.WeakSet()
_numba_held: list[Any] = []  # numba's compiler lock, while this thread holds it over a fork


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


def _before() -> None:
    compiler = sys.modules.get("numba.core.compiler_lock")
    if compiler is not None:
        held = compiler.global_compiler_lock
        held.acquire()  # waits for a compile in another thread to finish
        _numba_held.append(held)


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
