"""``LocalStorage``: files on a local or network file system.

Each file is opened once (``os.open``) and advised ``POSIX_FADV_RANDOM`` so the
kernel does not read ahead of shuffled reads. A batch of reads runs in one
GIL-free Numba loop straight into the caller's buffer, in one of two ways:

- ``method="mmap"``: ``memcpy`` from a read-only mapping (``MADV_RANDOM``), no
  system call per read once pages are mapped. Fastest from the local page
  cache, but, like any mapping (``np.memmap`` included), a file truncated by
  another process *while open* makes reads past its new end fault: the process
  dies of SIGBUS instead of raising. Files under ``MAP_FROM`` bytes are read
  by ``pread`` all the same: mapping one costs more than the reads it holds.
- ``method="pread"``: one ``pread(2)`` per request. Right for network file
  systems (one request per read instead of a round trip per faulted page), and
  a file that shrinks under a running job only makes reads come back short
  (the dataset readers then raise ``FormatError`` naming the file).
- ``method="auto"`` (default): ``"mmap"`` when the file system holding
  ``root`` is local, ``"pread"`` when it is one of ``NETWORK_FILE_SYSTEMS``
  (NFS, SMB, FUSE, cluster and parallel file systems: a page fault there is a
  round trip, and another host truncating a file is plausible) or when its type
  cannot be told (not Linux, no ``/proc/self/mountinfo``): the safe choice.
  Resolved once, when the storage is built, from the longest mount point of
  ``/proc/self/mountinfo`` that holds the resolved ``root``
  (``file_system_type``, ``resolve_method``; ~0.1 ms for 20 mounts, then
  remembered for that device: one ``stat`` a storage); the ``method``
  property and the ``repr`` say what it chose.

Why mapping is the default on local disks: zerobatch datasets are written
once and published by rename, never truncated in place, so the SIGBUS case
needs someone rewriting a dataset's files under a running job, and loaders
built on ``np.memmap`` (the usual three lines) behave the same way. Pass
``method="pread"`` where files may be rewritten in place.

Measured (``benchmarks/stream_read.py`` windows, 32 reads of 4 KiB from the
page cache): ~42 us per batch with ``pread``, ~16 us with ``mmap``.

A file is checked against the size it had when opened: a read past that size
comes back short.

Descriptors: a file read by ``pread`` keeps one open; a mapped file keeps none
of its own (Python's ``mmap`` holds a copy before 3.13). A process that runs
out (``EMFILE``: many systems set a soft limit of 1,024, below what a mixture
of thousands of small datasets opens) has its soft ``RLIMIT_NOFILE`` raised
toward the hard limit, and at the hard limit gets an error that says so
(``open_descriptor``).

Kernels of other modules may read without a buffer of their own: ``files()``
gives the open files as arrays, ``read_request`` reads one request by the
storage's method, ``mapped_records`` gives a mapped request's records as a
view (no copy), and ``prefetch_request`` starts loading a mapped request
into the CPU caches (issued one read ahead, it hides the memory latency of
shuffled reads).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import mmap
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from zerobatch import _forksafe
from zerobatch._jit import njit
from zerobatch.storage.protocol import byte_view, check_buffer

try:  # imported now: out of descriptors, an import cannot open its file
    import fcntl as fcntl_module
    import resource
except ImportError:  # not a Unix
    fcntl_module = resource = None  # type: ignore[assignment]

__all__ = [
    "MAP_FROM", "METHODS", "MOUNTINFO", "NETWORK_FILE_SYSTEMS", "LocalStorage", "check_status",
    "file_system_type", "is_network", "mapped_records", "prefetch_request", "read_request",
    "reserve_descriptors", "reserve_descriptors_soon", "resolve_method",
]

Method = Literal["auto", "pread", "mmap"]
METHODS: tuple[Method, ...] = ("auto", "pread", "mmap")
"""The values of ``LocalStorage``'s ``method``; ``"auto"`` resolves to one of the others."""

NETWORK_FILE_SYSTEMS = frozenset({
    "9p", "afs", "beegfs", "ceph", "cifs", "coda", "davfs", "fuse", "fuseblk", "gfs2",
    "glusterfs", "gpfs", "lustre", "ncpfs", "nfs", "nfs4", "ocfs2", "orangefs", "panfs",
    "pvfs2", "smb3", "smbfs", "virtiofs", "wekafs",
})
"""File system types (``/proc/self/mountinfo``) that ``method="auto"`` reads by
``pread``, as well as every ``fuse.*`` type (sshfs, s3fs, gcsfuse, ...):
network, FUSE, cluster and shared-disk file systems, and the host shares of
virtual machines (9p, virtiofs)."""

MAP_FROM = 1 << 16
"""Files smaller than this (bytes) are never mapped, whatever the method.
Making a mapping costs 20-50 us (``mmap``, ``madvise``, the first page
fault); reading a window by ``pread`` instead of ``memcpy`` costs ~1.5 us
more. A file under 64 KiB holds at most 16 windows of 2,048 two-byte tokens,
fewer reads an epoch than its mapping costs; a mixture of 2,000 such
datasets opens ~450 files for its first batch. The kernels read a file with
no mapping (address 0) by ``pread``."""

MOUNTINFO = "/proc/self/mountinfo"
"""Where Linux lists the mounts this process sees (``proc(5)``)."""

_memcpy: Any = types.ExternalFunction(
    "memcpy", types.voidptr(types.voidptr, types.voidptr, types.uintp)
)
_pread: Any = types.ExternalFunction(
    "pread", types.intp(types.intc, types.voidptr, types.uintp, types.int64)
)


_LINE = 64  # bytes per cache line


def _prefetch_typer(typingctx: Any, address: Any) -> Any:
    """``_prefetch(address)``: hint the CPU to load the cache line at ``address``
    (``llvm.prefetch``: read, keep in all cache levels). Never faults, whatever
    the address."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer, word = ir.IntType(8).as_pointer(), ir.IntType(32)
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [pointer, word, word, word]),
            "llvm.prefetch.p0i8",
        )
        builder.call(function, [builder.inttoptr(args[0], pointer), word(0), word(3), word(1)])
        return context.get_dummy_value()

    return types.void(types.intp), codegen


_prefetch: Any = intrinsic(_prefetch_typer)


@njit(nogil=True, cache=True, inline="always")
def prefetch_request(
    handle: int, start: int, length: int, addresses: np.ndarray, sizes: np.ndarray,
    use_pread: bool,
) -> None:
    """Start loading the ``length`` bytes at byte ``start`` of file ``handle``
    into the CPU caches, when it is mapped (Numba only; a no-op with pread or
    for a request ``read_request`` would refuse). Issued one window ahead, it
    hides the memory latency of shuffled reads behind the current window's work."""
    if use_pread or handle < 0 or handle >= sizes.shape[0] or sizes[handle] < 0:
        return
    if addresses[handle] == 0 or start < 0 or length <= 0 or start + length > sizes[handle]:
        return
    first = addresses[handle] + start
    for line in range(first - first % _LINE, first + length, _LINE):
        _prefetch(line)


@njit(nogil=True, cache=True, inline="always")
def read_request(
    handle: int, start: int, length: int, address: int,
    descriptors: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool,
) -> int:
    """Read ``length`` bytes at byte ``start`` of file ``handle`` to memory at
    ``address``, by ``pread(2)`` or by ``memcpy`` from its mapping (Numba only;
    the caller checks that they fit). Returns 1, or a status: 0 the file ended
    early (or shrank, with pread), -1 the handle is not open, -3 ``pread`` failed."""
    if handle < 0 or handle >= sizes.shape[0] or sizes[handle] < 0:
        return -1
    if start < 0 or length < 0 or start + length > sizes[handle]:
        return 0
    if not use_pread and addresses[handle] != 0:  # mapped (MAP_FROM)
        if length > 0:
            _memcpy(address, addresses[handle] + start, length)
        return 1
    done = 0
    while done < length:
        got = _pread(np.intc(descriptors[handle]), address + done, length - done, start + done)
        if got == 0:
            return 0
        if got < 0:
            return -3
        done += got
    return 1


def _pointer_typer(typingctx: Any, address: Any) -> Any:
    """``_pointer(address)``: ``address`` as a ``void *`` (for ``numba.carray``)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))

    return types.voidptr(types.intp), codegen


_pointer: Any = intrinsic(_pointer_typer)


@njit(nogil=True, cache=True, inline="always")
def borrowed(array: np.ndarray) -> np.ndarray:
    """``array``'s memory as an array that owns no reference (``numba.carray``)
    when it is C-contiguous, else ``array`` itself. Handing an owned array to
    an inlined function costs two atomic reference counts each time (in a
    window read's per-row loop, 6-7 % of its time); a borrowed one costs none.
    Only for a kernel's arguments, which its caller keeps alive until it
    returns: an array the kernel allocates is freed after its last use, and
    a view of it is not a use."""
    if array.flags.c_contiguous:
        return numba.carray(_pointer(array.ctypes.data), array.shape, array.dtype)
    return array


@njit(nogil=True, cache=True, inline="always")
def mapped_records(
    handle: int, start: int, count: int, like: np.ndarray, addresses: np.ndarray,
    sizes: np.ndarray, use_pread: bool,
) -> tuple[np.ndarray, int]:
    """``count`` records of ``like``'s dtype at byte ``start`` of file
    ``handle``, as a view of its mapping: no copy (Numba only; valid while the
    ``files()`` that gave ``addresses`` is held). Returns (the view, 1), or
    (an empty view, a status): ``read_request``'s 0 (the file ends before
    them) and -1 (not open), or -2 with pread or for a file not mapped
    (``MAP_FROM``): read them."""
    if use_pread:
        return like[:0], -2
    if handle < 0 or handle >= sizes.shape[0] or sizes[handle] < 0:
        return like[:0], -1
    if addresses[handle] == 0:  # not mapped (MAP_FROM)
        return like[:0], -2
    length = count * like.itemsize
    if start < 0 or count < 0 or start + length > sizes[handle]:
        return like[:0], 0
    return numba.carray(_pointer(addresses[handle] + start), count, like.dtype), 1


@njit(nogil=True, cache=True)
def _read_all(
    handles: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
    buffer: np.ndarray, destinations: np.ndarray,
    descriptors: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, use_pread: bool,
) -> tuple[int, int]:
    """Run every request (``read_request``) into ``buffer``.

    Returns (-1, 0), or (request, status): ``read_request``'s status, or -2
    when the request does not fit the buffer."""
    base = buffer.ctypes.data
    for i in range(handles.shape[0]):
        length = lengths[i]
        if length < 0 or destinations[i] < 0 or destinations[i] + length > buffer.size:
            return i, -2
        status = read_request(handles[i], offsets[i], length, base + destinations[i],
                              descriptors, addresses, sizes, use_pread)
        if status < 1:
            return i, status
    return -1, 0


def check_status(status: int, request: int, handles: npt.NDArray[np.int64]) -> None:
    """Raise for a ``read_request`` status below 0 (or -2: a request that does
    not fit the buffer); a short read (0) is the caller's to report."""
    if status == -3:
        raise OSError(f"request {request}: pread failed on handle {int(handles[request])}")
    if status == -2:
        raise ValueError(f"request {request} does not fit the buffer")
    if status < 0:
        raise OSError(f"request {request}: handle {int(handles[request])} is not open")


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` space, ``\\011`` tab,
    ``\\012`` newline, ``\\134`` backslash) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def file_system_type(path: str | os.PathLike[str], mountinfo: str) -> str | None:
    """The type of the file system holding ``path`` (absolute, resolved), read
    from the text of ``/proc/self/mountinfo``: that of the longest mount point
    that is ``path`` or one of its parents (the last such line when mounts are
    stacked on one point). ``None`` when no line mounts a parent of ``path``.
    Lines that are not mountinfo lines are skipped."""
    target = os.fspath(path)
    best, found = -1, None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        point = _unescape(fields[4])
        separator = fields.index("-", 6)
        if separator + 1 >= len(fields) or not _contains(point, target):
            continue
        if len(point) >= best:
            best, found = len(point), fields[separator + 1]
    return found


def _contains(point: str, path: str) -> bool:
    """Whether the mount point ``point`` is ``path`` or one of its parents."""
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def resolve_method(
    method: str, root: str | os.PathLike[str], *,
    mountinfo: str | os.PathLike[str] = MOUNTINFO,
) -> Literal["pread", "mmap"]:
    """``method`` itself, or for ``"auto"`` the method for ``root``'s file
    system, read from the ``mountinfo`` file: ``"pread"`` on
    ``NETWORK_FILE_SYSTEMS`` and ``fuse.*``, and when the type cannot be told
    (no such file: not Linux; no mount holds ``root``); ``"mmap"`` otherwise.
    ``ValueError`` for any other ``method``."""
    if method not in METHODS:
        raise ValueError(f"LocalStorage({str(root)!r}): method must be one of "
                         f"{', '.join(repr(m) for m in METHODS)}, got {method!r}")
    if method != "auto":
        return "pread" if method == "pread" else "mmap"
    device = None
    if os.fspath(mountinfo) == MOUNTINFO:  # the system's table: one answer per device
        with contextlib.suppress(OSError):  # no such folder yet: resolved from its path
            device = os.stat(root).st_dev
        found = _METHOD_BY_DEVICE.get(device) if device is not None else None
        if found is not None:
            return found
    try:
        text = Path(mountinfo).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return "pread"
    kind = file_system_type(Path(root).resolve(), text)
    chosen: Literal["pread", "mmap"] = (
        "mmap" if kind is not None and not is_network(kind) else "pread")
    if device is not None:
        _METHOD_BY_DEVICE[device] = chosen
    return chosen


# ``resolve_method``'s answers for the system's mount table, by the device
# (``st_dev``) holding the root: every folder of one file system has one type, so
# opening 2,000 datasets reads and parses the table once, not 2,000 times
# (~0.4 ms each). Kept for the process's life: a file system unmounted and
# another mounted on a reused device number keeps the first one's method.
_METHOD_BY_DEVICE: dict[int, Literal["pread", "mmap"]] = {}


def is_network(kind: str) -> bool:
    """Whether the file system type ``kind`` (as mountinfo names it) is one that
    ``method="auto"`` reads by ``pread``: ``NETWORK_FILE_SYSTEMS`` or ``fuse.*``."""
    return kind in NETWORK_FILE_SYSTEMS or kind.startswith("fuse.")


class _Files:
    """The open files of one LocalStorage: handle -> descriptor, mapping, size.

    Slots are only ever added (a size of -1 marks a free slot), and a full
    table is replaced by a copy twice its size, so opening is amortized O(1);
    a read holds the table it started with, whose mappings stay alive until
    it returns even if ``close()`` runs meanwhile. A storage with no file
    open holds the shared empty table, :data:`_NO_FILES` (full, so the first
    ``add`` copies it): a dataset opened and never read leaves no table, and
    2,000 of them leave no garbage-collected objects but their own.
    """

    __slots__ = ("addresses", "count", "fds", "maps", "sizes")

    def __init__(self, capacity: int = 16) -> None:
        self.count = 0  # slots in use: handles 0 .. count - 1
        self.maps: list[np.ndarray | None] = []
        self.fds = np.full(capacity, -1, dtype=np.int64)  # -1 for a mapped file
        self.addresses = np.zeros(capacity, dtype=np.int64)
        self.sizes = np.full(capacity, -1, dtype=np.int64)

    def add(self, descriptor: int, size: int, mapping: np.ndarray | None) -> _Files:
        """This table, or a larger copy, with one more file (call under a lock)."""
        files, handle = self, self.count
        if handle == self.sizes.shape[0]:
            files = _Files(max(16, 2 * handle))
            files.maps = list(self.maps)
            files.count = handle
            files.fds[:handle] = self.fds
            files.addresses[:handle] = self.addresses
            files.sizes[:handle] = self.sizes
        files.maps.append(mapping)
        files.count = handle + 1
        files.fds[handle] = descriptor
        files.addresses[handle] = 0 if mapping is None else mapping.ctypes.data
        files.sizes[handle] = size  # last: the slot is valid from here on
        return files


_NO_FILES = _Files(0)  # every storage's table until it opens a file (never added to)


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def open_descriptor(path: str) -> int:
    """``os.open(path)`` read-only. When the process is out of descriptors
    (``EMFILE``: ``RLIMIT_NOFILE``'s soft limit, 1,024 on many systems, where a
    mixture of thousands of small datasets keeps one open per file under
    ``MAP_FROM``), the soft limit is raised as far as the hard one allows
    and the open tried again; at the hard limit, an ``OSError`` that says
    which limit and what to do."""
    return _spare_descriptors(lambda: os.open(path, _OPEN_FLAGS), path)


def reserve_descriptors(count: int) -> None:
    """Grow this process's descriptor table at once to hold ``count`` more
    files, before opening them (e.g. a mixture's first batch, ~500 files).

    Linux grows the table by doubling, and in a multithreaded process (any
    process with NumPy's BLAS threads) each growth waits for an RCU grace
    period: 512 opens took 21-33 ms that way here, against 10-13 ms (median)
    with the table grown to its final size by one ``F_DUPFD`` first, and
    4.4 ms in a single-threaded process. A no-op under 64 files, where the
    table already holds them, or where it cannot be done (not Linux, a
    target past ``RLIMIT_NOFILE``: the opens then go as they would)."""
    if count < 64 or not hasattr(fcntl_module, "F_DUPFD_CLOEXEC"):
        return
    try:
        probe = os.open(os.devnull, _OPEN_FLAGS)
    except OSError:
        return
    try:
        high = fcntl_module.fcntl(probe, fcntl_module.F_DUPFD_CLOEXEC, probe + count)
    except OSError:  # EINVAL past the limit, EMFILE
        pass
    else:
        os.close(high)
    finally:
        os.close(probe)


def reserve_descriptors_soon(count: int) -> None:
    """``reserve_descriptors(count)`` in a daemon thread, so that its wait (an
    RCU grace period, 5-15 ms here) passes while the caller goes on: e.g.
    while a mixture of thousands of local datasets is built, before its first
    batch opens their files (an ``open`` meanwhile waits for the growth, as
    it would have made it). A no-op under 64 files."""
    if count >= 64 and fcntl_module is not None:
        threading.Thread(target=reserve_descriptors, args=(count,), daemon=True,
                         name="zerobatch-descriptors").start()


_T = TypeVar("_T")


def _spare_descriptors(call: Callable[[], _T], path: str) -> _T:
    """``call()``, again after ``_raise_descriptor_limit`` if it ran out of
    descriptors (``EMFILE``); then an ``OSError`` naming the limit and ``path``."""
    try:
        return call()
    except OSError as error:
        if error.errno != errno.EMFILE:
            raise
    limits = _raise_descriptor_limit()
    try:
        return call()
    except OSError as error:
        if error.errno != errno.EMFILE:
            raise
        soft, hard = limits or (None, None)
        raise OSError(errno.EMFILE, f"too many open files: this process may hold {soft} "
                      f"(RLIMIT_NOFILE; hard limit {hard}), and zerobatch keeps one open "
                      "per file it has read (a mapped one too, before Python 3.13); raise "
                      "the limit (ulimit -n), or write fewer, larger shards", path) from None


def _raise_descriptor_limit() -> tuple[int, int] | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` toward its hard limit;
    returns (soft, hard) after, or None where there are no such limits."""
    if resource is None:  # not a Unix
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(4 * soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # a limit the kernel refuses
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# Python 3.13's mmap can leave the descriptor alone; before, each mapping holds
# a duplicate of it (one descriptor per mapped file for the mapping's life).
_UNTRACKED: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def _map(descriptor: int, path: str, size: int) -> np.ndarray:
    """The whole file of ``size`` bytes read-only, as uint8 (an empty array for
    an empty file)."""
    if size == 0:
        empty = np.zeros(0, dtype=np.uint8)
        empty.setflags(write=False)  # like a mapping: one array type for Numba
        return empty
    mapping = _spare_descriptors(
        lambda: mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ, **_UNTRACKED), path)
    if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapping.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapping, dtype=np.uint8)


class LocalStorage:
    """Read-only access to the files under ``root``, by ``pread`` or ``mmap``
    (``method``; ``"auto"``, the default, picks by ``root``'s file system: see
    the module docstring for the trade-off).

    Handles are small ints, one per opened file. Thread-safe: files are opened
    under a lock; reads share nothing mutable. ``close()`` is idempotent;
    reads after it raise ``OSError`` (a read already running finishes first).
    Pickles as its root and the method asked for (a copy made with ``"auto"``
    resolves again where it is loaded, and opens its files again).

    >>> LocalStorage(".", method="pread").method
    'pread'
    """

    def __init__(self, root: str | os.PathLike[str], *, method: Method = "auto") -> None:
        self._root = root if isinstance(root, Path) else Path(root)  # one Path a dataset
        self._prefix = os.path.join(self._root, "")  # open() joins names to it: no Path a file
        self._requested = method
        self._method = resolve_method(method, self._root)
        self._handles: dict[str, int] = {}
        self._files = _NO_FILES
        self._lock = _forksafe.lock()

    @property
    def root(self) -> Path:
        """The folder the names are relative to."""
        return self._root

    @property
    def method(self) -> Literal["pread", "mmap"]:
        """How files are read: ``"pread"`` or ``"mmap"``, ``"auto"`` resolved."""
        return self._method

    def __repr__(self) -> str:
        return f"LocalStorage({str(self._root)!r}, method={self._method!r})"

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        """Pickles as its root and the method asked for; the copy opens its files again."""
        return functools.partial(LocalStorage, method=self._requested), (self._root,)

    def size(self, name: str) -> int:
        """The size of ``name`` in bytes."""
        return os.stat(self._prefix + name).st_size

    def stat(self, name: str) -> os.stat_result:
        """``os.stat`` of ``name``: its size and modification time in one call."""
        return os.stat(self._prefix + name)

    def open(self, name: str) -> int:
        """The handle of ``name``: opened (and mapped) once, ``POSIX_FADV_RANDOM``."""
        handle = self._handles.get(name)
        if handle is not None:
            return handle
        with self._lock:
            handle = self._handles.get(name)
            if handle is None:
                descriptor = open_descriptor(self._prefix + name)
                try:
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)
                    size = os.fstat(descriptor).st_size
                    mapping = (_map(descriptor, self._prefix + name, size)
                               if self._method == "mmap" and size >= MAP_FROM else None)
                except BaseException:
                    os.close(descriptor)
                    raise
                if mapping is not None:  # the mapping holds the file: no descriptor kept
                    os.close(descriptor)
                    descriptor = -1
                handle = self._files.count
                self._files = self._files.add(descriptor, size, mapping)
                self._handles[name] = handle
            return handle

    def read_into(
        self,
        handles: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        buffer: npt.NDArray[np.uint8],
        destinations: npt.NDArray[np.int64],
    ) -> int:
        """Run all requests in one GIL-free loop; -1, or the first short request."""
        check_buffer(buffer)
        files, use_pread = self.files()  # holds the mappings alive until the copies are done
        short, status = _read_all(handles, offsets, lengths, buffer, destinations,
                                  files.fds, files.addresses, files.sizes, use_pread)
        check_status(status, short, handles)
        return int(short)

    def files(self) -> tuple[_Files, bool]:
        """The open files as arrays for Numba kernels that call ``read_request``
        themselves (``fds``, ``addresses``, ``sizes``), and whether to ``pread``.
        Keep the table until those reads return: it keeps the mappings alive."""
        return self._files, self._method == "pread"

    def readinto(
        self, handle: int, offset: int, buffer: bytearray | memoryview | np.ndarray
    ) -> int:
        """Up to ``len(buffer)`` bytes at ``offset`` (``os.preadv``; from its
        mapping for a mapped file); returns the bytes read."""
        files = self._files
        if not 0 <= handle < files.count:
            raise OSError(f"handle {handle} is not open")
        view = byte_view(buffer)
        mapping = files.maps[handle]
        if mapping is not None:  # mapped: its descriptor was closed
            if offset < 0:
                raise OSError(errno.EINVAL, f"negative offset {offset}")
            part = mapping[offset:offset + len(view)]
            view[:part.shape[0]] = part.data
            return int(part.shape[0])
        done, descriptor = 0, int(files.fds[handle])
        while done < len(view):
            got = os.preadv(descriptor, [view[done:]], offset + done)
            if got == 0:
                break
            done += got
        return done

    def map(self, name: str) -> npt.NDArray[np.uint8]:
        """``name`` mapped read-only (an empty array for an empty file)."""
        path = self._prefix + name
        descriptor = open_descriptor(path)
        try:
            return _map(descriptor, path, os.fstat(descriptor).st_size)
        finally:
            os.close(descriptor)

    def close(self) -> None:
        """Close every handle; idempotent. Mappings are released once no read uses them."""
        with self._lock:
            files, self._files, self._handles = self._files, _NO_FILES, {}
        for descriptor in files.fds[:files.count].tolist():
            if descriptor >= 0:  # -1: a mapped file, closed when it was mapped
                os.close(descriptor)
