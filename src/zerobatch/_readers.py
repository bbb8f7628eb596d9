"""The Loader's reader threads: ordered slots, a bounded read-ahead, and a
caller that reads too when its step is not ready. Nothing here knows about
plans or sources: :class:`Readers` produces the items of an iterator of
steps with a ``produce`` function, in order."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Readers", "Waits"]

_Outcome = tuple[Any, Any, BaseException | None]  # (step as the steps give it, item, error)
_ENDED = object()  # Readers._claim: the pass has ended
_FIRST_PAUSE = 20e-6  # seconds a reader thread with no free slot first sleeps, doubling ...
_LAST_PAUSE = 0.02  # ... up to this
WINDOW = 8  # steps per Waits decision


class Readers:
    """``threads`` reader threads that produce a pass's steps into ordered
    slots: at most ``prefetch + 1`` steps are claimed and not yet taken, at
    most ``prefetch`` of them by the threads.

    A thread claims the next step and its sequence number ``seq``, produces
    it, stores the outcome in slot ``seq % (prefetch + 1)`` and releases that
    slot's lock; the caller acquires the slots' locks in order. Claimed steps
    are consecutive, at most ``prefetch + 1``, so they occupy distinct slots.

    A caller that finds its step ready never wakes a thread: taking a step
    only counts it, and a thread that found no free slot sleeps 20 us, then
    twice as long each time up to 20 ms, and looks again. Waking it would cost
    the caller a system call (and, on a virtual machine, an interrupt to
    another core) inside every ``next()`` of a loop that is not input-bound.
    A caller whose step is *not* ready does wake the sleeping threads (it has
    nothing better to do) and meanwhile claims the next step and produces it
    itself (:meth:`_help`), so an idle caller is a free reader. Its step does
    not count against the threads' ``prefetch``: a thread that finishes while
    the caller reads finds a free slot and goes on at once, where it would
    otherwise sleep until woken, which takes as long as a read on a virtual
    machine. The threads hold this object, never the iterator, so a dropped
    pass's finalizer can stop them.
    """

    def __init__(self, produce: Callable[..., Any], steps: Iterator[Any],
                 prefetch: int, threads: int) -> None:
        self._produce = produce
        self._steps = steps
        self._prefetch = prefetch
        self._claim_lock = threading.Lock()  # guards _steps, _claimed, _ended, _mine
        self._filled = [threading.Lock() for _ in range(prefetch + 1)]  # held while empty
        for lock in self._filled:
            lock.acquire()
        self._slots: list[_Outcome | None] = [None] * (prefetch + 1)
        self._claimed = 0
        self._taken = 0  # written by the caller alone
        self._mine: set[int] = set()  # the seqs the caller claimed and has not taken
        self._ended = False
        self._stopped = False
        # Wake-ups for the threads, put by a caller whose step is not ready. A
        # SimpleQueue, not an Event: its put is one C call, where Event.set takes a
        # Condition's lock in Python code, and Ctrl-C arriving just after that
        # lock is taken leaves it held, so every thread and close() hang on it.
        self._wanted: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"zerobatch-loader-{i}",
                                          daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        pause = _FIRST_PAUSE
        while not self._stopped:
            claimed = self._claim(caller=False)
            if claimed is _ENDED:
                return
            if claimed is None:  # every slot is in use: look again later, or when wanted
                try:  # a wake-up put after the claim above is still there
                    self._wanted.get(timeout=pause)
                except queue.Empty:
                    pause = min(2 * pause, _LAST_PAUSE)
                continue
            pause = _FIRST_PAUSE
            self._fill(*claimed, catch=BaseException)

    def _claim(self, *, caller: bool) -> Any:
        """``(seq, step)`` for the next step (step None: the end of the pass),
        None when no slot is free for a thread (or, ``caller``, for the caller),
        or ``_ENDED`` once the pass has ended."""
        with self._claim_lock:
            if self._ended:
                return _ENDED
            ahead = self._claimed - self._taken
            if ahead > self._prefetch or (not caller
                                          and ahead - len(self._mine) >= self._prefetch):
                return None
            if caller:
                self._mine.add(self._claimed)
            seq, step = self._claimed, next(self._steps, None)
            self._claimed += 1
            self._ended = step is None
        return seq, step

    def _fill(self, seq: int, step: Any, *,
              catch: type[BaseException]) -> None:
        """Produce ``step`` into slot ``seq % (prefetch + 1)``; an error that is a
        ``catch`` is kept there, to be re-raised in the caller at its step."""
        outcome: _Outcome | None = None  # the end of the pass
        if step is not None:
            try:
                outcome = (step, self._produce(step), None)
            except catch as error:
                outcome = (step, None, error)
        slot = seq % len(self._slots)
        self._slots[slot] = outcome
        self._filled[slot].release()

    def _help(self) -> bool:
        """Produce the next unclaimed step in the caller's thread if a slot is
        free; False when none is (or the pass has ended). Its errors wait for
        their step, but Ctrl-C and other BaseExceptions go up at once."""
        claimed = None if self._stopped else self._claim(caller=True)
        if claimed is None or claimed is _ENDED:
            return False
        self._fill(*claimed, catch=Exception)
        return True

    def _wake(self) -> None:
        """Wake every thread sleeping for a free slot (wake-ups not yet taken
        are not added to)."""
        if self._wanted.empty():
            for _ in self._threads:
                self._wanted.put(None)

    def take(self) -> _Outcome | None:
        """The next step's ``(step, item, error)`` in order, None at the end of
        the pass or once stopped. While it is not ready, the caller's thread
        produces later steps itself (:meth:`_help`) rather than wait idle."""
        seq = self._taken
        slot = seq % len(self._slots)
        filled = self._filled[slot]
        while not filled.acquire(blocking=False):
            self._wake()  # input-bound: a sleeping thread should look now
            if not self._help():
                filled.acquire()
                break
        outcome, self._slots[slot] = self._slots[slot], None
        if self._mine:
            self._mine.discard(seq)  # before counting it: a thread never sees a slot too many
        self._taken = seq + 1  # frees the slot; a thread sees it when it looks next
        return outcome

    def stop(self, *, wait: bool) -> None:
        """Stop the threads after their current step (or pause, at most 20 ms);
        ``wait``: join them, and wake a caller waiting in :meth:`take` (it gets
        None). Call it from the thread that takes, or once nothing takes any more."""
        self._stopped = True
        for _ in self._threads:  # each sleeping thread wakes and sees it
            self._wanted.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
            for lock in self._filled:
                if lock.locked():
                    lock.release()


class Waits:
    """Whether a caller reading its own steps should hand them to a reader
    thread: the Loader's automatic mode (``num_threads=None``) asks after
    every step it read in the caller's thread.

    A thread pays when the caller, between its ``next()`` calls, waits without
    running (a GPU, a sleep, I/O: time away on the wall clock but not on the
    thread's CPU clock) at least as long as its reads take: a thread then reads
    during that wait. While the caller is input-bound (it comes straight back)
    or busy on its own CPU (Python holding the GIL, which a reader thread would
    fight for), reading in its own thread is the fastest: a thread's hand-over
    costs more than the read it hides (BENCHMARKS.md, the Loader's overlap
    section). Decided per window of ``WINDOW`` steps: a window votes for a
    thread when at least 3/4 of its steps waited as long as their read (so one
    preemption on a loaded machine, or a garbage collection, is not a wait),
    and two windows in a row move the reads. Cost: two ``perf_counter``
    calls a step (~0.1 us); ``thread_time`` (a system call) only around steps
    whose caller was away as long as a read. Not thread-safe: the caller's
    thread alone calls it.
    """

    def __init__(self) -> None:
        self._left_wall: float | None = None  # wall clock when the caller last got a step
        self._left_cpu: float | None = None  # its thread CPU clock then, when watched
        self._last_read = 0.0  # seconds the last read took
        self._watch = False  # the caller was away as long as a read: read its CPU clock
        self._waited = 0.0  # seconds the caller was away and not running before this read
        self._steps = 0  # steps in this window
        self._votes = 0  # steps of this window that waited as long as their read
        self._windows = 0  # windows in a row that voted for a thread

    def begin(self) -> float:
        """Mark the start of a read (the caller is back); returns the wall clock."""
        wall = time.perf_counter()
        self._waited = 0.0
        left = self._left_wall
        # The thread's CPU clock costs a system call (more on a loaded machine):
        # read it only around steps whose caller was away as long as a read.
        self._watch = left is not None and wall - left >= self._last_read
        if self._watch and self._left_cpu is not None:
            assert left is not None
            self._waited = (wall - left) - (time.thread_time() - self._left_cpu)
        return wall

    def end(self, began: float) -> bool:
        """Mark the end of the read begun at ``began``; True once a reader
        thread would hide the reads (see the class docstring)."""
        wall = time.perf_counter()
        self._left_wall = wall
        self._left_cpu = time.thread_time() if self._watch else None
        self._last_read = read = wall - began
        self._votes += self._waited >= read
        self._steps += 1
        if self._steps < WINDOW:
            return False
        self._windows = self._windows + 1 if 4 * self._votes >= 3 * WINDOW else 0
        self._steps = self._votes = 0
        return self._windows >= 2
