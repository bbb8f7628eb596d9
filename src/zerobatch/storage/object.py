"""``ObjectStorage``: the files of a dataset prefix in S3, GCS or Azure Blob, via obstore.

Reads are HTTP range GETs. A batch of reads (``read_into``) groups its byte
ranges by object and runs every object's ``obstore.get_ranges`` at once on one
event loop: obstore merges ranges closer than ``coalesce`` bytes (default
1 MiB) into one request and keeps up to 10 requests of an object in flight.

Retries, backoff and timeouts are obstore's (``retry_config``,
``client_options``; by default 10 retries within 3 minutes, 30 s per request).
When they are spent, reads raise ``zerobatch.StorageError`` naming the URL,
the byte range and the last cause; a missing object raises
``FileNotFoundError`` naming its URL. A request that fails while no credentials
are configured says which environment variables to set.

Index files are read through a ``BlockCache`` (``blocks``): fixed-size blocks,
least recently used out first within a byte budget, optionally kept on local
disk across runs (``cache_dir``); see ``zerobatch.storage.blocks``.

obstore is not fork-safe: a process forked after its parent used a store hangs
on its first request. Such a child raises ``StorageError`` on its first
request instead. Start reader processes (DataLoader workers included) with
``spawn`` or ``forkserver``: an ``ObjectStorage`` pickles as its URL and
options and opens its own store in the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from zerobatch import _forksafe
from zerobatch.errors import StorageError
from zerobatch.storage.blocks import BLOCK_SIZE, CACHE_BYTES, CACHE_DIR_BYTES, BlockCache
from zerobatch.storage.protocol import byte_view, check_buffer
from zerobatch.storage.url import OBJECT_SCHEMES

__all__ = ["COALESCE", "CREDENTIAL_VARIABLES", "ObjectStorage"]

COALESCE = 1 << 20
"""Default gap in bytes: ranges of one object closer than this are fetched by one GET."""

CREDENTIAL_VARIABLES = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "gs": ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_APPLICATION_CREDENTIALS"),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"),
}
"""Per scheme, the environment variables that name credentials."""

# config keys (with or without the cloud's prefix) that carry credentials
_CREDENTIAL_KEYS = (
    "access_key_id", "secret_access_key", "session_token", "token", "skip_signature",
    "service_account", "service_account_key", "application_credentials",
    "account_key", "sas_key", "sas_token", "client_secret", "bearer_token",
    "use_emulator", "use_azure_cli", "federated_token_file",
)
_CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SKIP_SIGNATURE",
    "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_STORAGE_USE_EMULATOR",
)

T = TypeVar("T")


class _Loop:
    """One event loop on a daemon thread, shared by every store of this process
    (made again in a child process; obstore itself still needs spawn there)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid = -1
    forked = False  # this process was forked from one that had used obstore

    @classmethod
    def after_fork(cls) -> None:
        """In a forked child: remember whether the parent had used obstore."""
        cls.forked = cls.forked or cls._pid != -1
        cls._lock = threading.Lock()

    @classmethod
    def run(cls, start: Callable[[], Awaitable[T]]) -> T:
        """``await start()`` on the loop (obstore's calls need the loop running);
        ``StorageError`` in a child forked after its parent used obstore, whose
        requests would hang."""
        if cls.forked:
            raise StorageError(
                "object storage used in a process forked from one that had already used "
                "it: obstore is not fork-safe and its requests would hang; start worker "
                "processes with 'spawn' or 'forkserver' (for a torch DataLoader: "
                "multiprocessing_context='spawn')")
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="zerobatch-storage",
                                 daemon=True).start()
                cls._loop, cls._pid = loop, os.getpid()
            loop = cls._loop

        async def main() -> T:
            return await start()

        return asyncio.run_coroutine_threadsafe(main(), loop).result()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Loop.after_fork)


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as error:  # pragma: no cover - the cloud extra is a dev dependency
        raise ImportError("object storage URLs need obstore: pip install 'zerobatch[cloud]'"
                          ) from error
    return obstore


def split_url(url: str) -> tuple[str, str, str]:
    """(scheme, bucket, prefix) of ``s3://bucket/prefix``; the prefix has no slashes
    at either end. ``ValueError`` for other schemes or a URL without a bucket."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in OBJECT_SCHEMES:
        raise ValueError(f"{url!r} is not an object-store URL "
                         f"({', '.join(s + '://bucket/prefix' for s in OBJECT_SCHEMES)})")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket; expected {scheme}://bucket/prefix")
    return scheme, bucket, prefix.strip("/")


def _has_credentials(options: dict[str, Any]) -> bool:
    keys = {str(key).lower() for key in options} | {
        str(key).lower() for key in (options.get("config") or {})}
    if "credential_provider" in keys:
        return True
    for key in keys:
        bare = key.split("_", 1)[1] if key.startswith(("aws_", "google_", "azure_")) else key
        if bare in _CREDENTIAL_KEYS or key in _CREDENTIAL_KEYS:
            return True
    return any(os.environ.get(name) for name in _CREDENTIAL_ENV)


def _plain_http_endpoint(options: dict[str, Any]) -> str | None:
    """The endpoint when it is ``http://`` and plain http was not allowed (by
    ``client_options``, a config key or ``AWS_ALLOW_HTTP``), else None."""
    config = {str(k).lower(): v for k, v in (options.get("config") or {}).items()}
    config.update({str(k).lower(): v for k, v in options.items() if k != "config"})
    endpoint = next((str(config[key]) for key in ("endpoint", "aws_endpoint", "endpoint_url",
                                                   "aws_endpoint_url") if config.get(key)), None)
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
    if not endpoint or not endpoint.lower().startswith("http://"):
        return None
    client = {str(k).lower(): v for k, v in (options.get("client_options") or {}).items()}
    allowed = client.get("allow_http", config.get("allow_http",
                                                  os.environ.get("AWS_ALLOW_HTTP", "")))
    return None if str(allowed).lower() in ("true", "1") else endpoint


def _cause(error: BaseException) -> str:
    """The first line of an obstore error (its debug dump follows)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class ObjectStorage:
    """Read-only access to the objects under ``url`` (``s3://bucket/prefix``,
    ``gs://...``, ``az://...``), names relative to the prefix.

    ``storage_options`` are obstore's keyword arguments for ``from_url``
    (``config`` or config keys, ``client_options``, ``retry_config``,
    ``credential_provider``); without them the cloud's environment variables
    are read. ``coalesce``: ranges of one object closer than this many bytes
    are fetched by one GET (0: never merged). ``block_size``, ``cache_bytes``,
    ``cache_dir`` and ``cache_dir_bytes`` set the ``BlockCache`` that index
    files are read through (``zerobatch.storage.blocks``; defaults: 16 KiB
    blocks, 64 MiB in memory, no ``cache_dir``, 4 GiB when one is given).
    Every entry point's ``storage_options`` accepts them beside obstore's.

    Handles are small ints, one per opened object; opening asks the size (one
    LIST of the prefix for the first size, a HEAD for names it did not show).
    Thread-safe: any number of threads may read at once. ``close()`` is
    idempotent; reads after it raise ``OSError``. Pickles as its URL and
    options (the copy opens its own store, with an empty memory cache): the
    way to hand it to a ``spawn`` or ``forkserver`` process.
    """

    def __init__(
        self, url: str, *, coalesce: int = COALESCE, block_size: int = BLOCK_SIZE,
        cache_bytes: int = CACHE_BYTES, cache_dir: str | os.PathLike[str] | None = None,
        cache_dir_bytes: int = CACHE_DIR_BYTES, **storage_options: Any,
    ) -> None:
        scheme, bucket, prefix = split_url(url)
        if coalesce < 0:
            raise ValueError(f"coalesce must be >= 0 bytes, got {coalesce}")
        self._arguments = (url, {"coalesce": coalesce, "block_size": block_size,
                                 "cache_bytes": cache_bytes, "cache_dir": cache_dir,
                                 "cache_dir_bytes": cache_dir_bytes, **storage_options})
        obstore = _obstore()
        self._obstore = obstore
        self._scheme = scheme
        self._base = f"{scheme}://{bucket}"
        self._prefix = prefix
        self._coalesce = int(coalesce)
        self._options = dict(storage_options)
        self._credentials = _has_credentials(self._options)
        try:
            self._store = obstore.store.from_url(self._base, **self._options)
        except (TypeError, ValueError, obstore.exceptions.BaseError) as error:
            raise ValueError(f"{url}: bad storage_options ({_cause(error)})") from error
        self._lock = _forksafe.lock()
        self._listed: dict[str, int] | None = None
        self._tags: dict[str, str] = {}
        self._blocks = BlockCache(self, block_size=block_size, cache_bytes=cache_bytes,
                                  cache_dir=cache_dir, cache_dir_bytes=cache_dir_bytes)
        self._handles: dict[str, int] = {}
        self._keys: list[str] = []
        self._sizes: list[int] = []
        self._closed = False

    @property
    def url(self) -> str:
        """The prefix URL names are relative to."""
        return f"{self._base}/{self._prefix}" if self._prefix else self._base

    @property
    def bucket_url(self) -> str:
        """``scheme://bucket`` of this prefix."""
        return self._base

    @property
    def store(self) -> Any:
        """The obstore store (of the bucket; keys include the prefix)."""
        return self._store

    @property
    def blocks(self) -> BlockCache:
        """The block cache that index files are read through."""
        return self._blocks

    def __repr__(self) -> str:
        return f"ObjectStorage({self.url!r})"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        url, options = self._arguments
        return functools.partial(ObjectStorage, **options), (url,)

    def key(self, name: str) -> str:
        """The object key of ``name``."""
        return f"{self._prefix}/{name}" if self._prefix else name

    def url_of(self, name: str) -> str:
        """The full URL of ``name`` (for messages)."""
        return f"{self._base}/{self.key(name)}"

    # -- errors ----------------------------------------------------------------

    def _error(self, error: BaseException, name: str, what: str) -> OSError:
        """``error`` from obstore as ``FileNotFoundError`` or ``StorageError``."""
        url = self.url_of(name)
        if isinstance(error, FileNotFoundError):
            return FileNotFoundError(errno.ENOENT, f"{url}: no such object", url)
        message = f"{url}: {what} failed after retries: {_cause(error)}"
        endpoint = _plain_http_endpoint(self._options)
        if endpoint is not None:
            message += (f"; the endpoint {endpoint} is plain http, which obstore refuses unless "
                        "allowed: set AWS_ALLOW_HTTP=true, or pass storage_options="
                        "{'client_options': {'allow_http': True}}")
        if not self._credentials:
            names = " and ".join(CREDENTIAL_VARIABLES[self._scheme])
            message += (f"; no credentials are configured: set {names} (or pass them in "
                        "storage_options={'config': {...}})")
        return StorageError(message)

    def _run(self, start: Callable[[], Awaitable[T]], name: str, what: str) -> T:
        try:
            return _Loop.run(start)
        except (FileNotFoundError, self._obstore.exceptions.BaseError) as error:
            raise self._error(error, name, what) from error

    # -- the Storage protocol -----------------------------------------------------

    def _list(self) -> dict[str, int]:
        """Sizes of the objects directly under the prefix, listed once."""
        if self._listed is None:
            prefix = f"{self._prefix}/" if self._prefix else None
            result = self._run(
                lambda: self._obstore.list_with_delimiter_async(self._store, prefix), "",
                "listing")
            start = len(prefix or "")
            self._listed = {meta["path"][start:]: int(meta["size"])
                            for meta in result["objects"]}
            self._tags.update({meta["path"][start:]: str(meta.get("e_tag"))
                               for meta in result["objects"]})
        return self._listed

    def size(self, name: str) -> int:
        """The size of ``name`` in bytes; ``FileNotFoundError`` naming its URL if absent."""
        listed = self._list()
        size = listed.get(name)
        if size is None:
            meta = self._run(lambda: self._obstore.head_async(self._store, self.key(name)),
                             name, "HEAD")
            size = int(meta["size"])
            with self._lock:
                listed[name] = size
                self._tags[name] = str(meta.get("e_tag"))
        return size

    def version(self, name: str) -> str:
        """The URL, size and entity tag of ``name``: what identifies its content
        (the key of its blocks in a ``cache_dir``)."""
        size = self.size(name)
        return f"{self.url_of(name)}\0{size}\0{self._tags.get(name)}"

    def open(self, name: str) -> int:
        """The handle of ``name`` (its size is fetched once)."""
        handle = self._handles.get(name)
        if handle is not None:
            return handle
        size = self.size(name)
        with self._lock:
            if self._closed:
                raise OSError(f"{self.url} is closed")
            handle = self._handles.get(name)
            if handle is None:
                handle = len(self._keys)
                self._keys.append(name)
                self._sizes.append(size)
                self._handles[name] = handle
            return handle

    def _name(self, handle: int) -> str:
        if self._closed or not 0 <= handle < len(self._keys):
            raise OSError(f"handle {handle} of {self.url} is not open")
        return self._keys[handle]

    async def _fetch(self, name: str, starts: Sequence[int], ends: Sequence[int]) -> Any:
        return await self._obstore.get_ranges_async(
            self._store, self.key(name), starts=starts, ends=ends, coalesce=self._coalesce)

    async def _fetch_all(self, jobs: list[tuple[str, list[int], list[int]]]) -> list[Any]:
        return await asyncio.gather(
            *(self._fetch(name, starts, ends) for name, starts, ends in jobs),
            return_exceptions=True)

    def read_into(
        self,
        handles: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        buffer: npt.NDArray[np.uint8],
        destinations: npt.NDArray[np.int64],
    ) -> int:
        """Run all requests, every object's ranges in flight at once; -1, or the
        first request past the end of its object (nothing is read then)."""
        check_buffer(buffer)
        n = int(handles.shape[0])
        if n == 0:
            return -1
        ends = offsets + lengths
        bad = np.flatnonzero((lengths < 0) | (destinations < 0)
                             | (destinations + lengths > buffer.size))
        if bad.size:
            raise ValueError(f"request {int(bad[0])} does not fit the buffer")
        for handle in np.unique(handles).tolist():
            self._name(int(handle))
        sizes = np.array(self._sizes, dtype=np.int64)
        short = np.flatnonzero((offsets < 0) | (ends > sizes[handles]))
        if short.size:
            return int(short[0])
        wanted = np.flatnonzero(lengths > 0)
        order = wanted[np.argsort(handles[wanted], kind="stable")]
        groups = np.split(order, np.flatnonzero(np.diff(handles[order])) + 1)
        groups = [g for g in groups if g.size]
        jobs = [(self._keys[int(handles[g[0]])], offsets[g].tolist(), ends[g].tolist())
                for g in groups]
        results = _Loop.run(lambda: self._fetch_all(jobs))
        for group, job, result in zip(groups, jobs, results, strict=True):
            if isinstance(result, BaseException):
                first, last = min(job[1]), max(job[2])
                raise self._error(result, job[0],
                                  f"{len(job[1])} range GETs in bytes {first}-{last}"
                                  ) from result
            for i, data in zip(group.tolist(), result, strict=True):
                start = int(destinations[i])
                buffer[start:start + int(lengths[i])] = np.frombuffer(data, dtype=np.uint8)
        return -1

    def readinto(
        self, handle: int, offset: int, buffer: bytearray | memoryview | np.ndarray
    ) -> int:
        """One range GET of up to ``len(buffer)`` bytes at ``offset``; returns bytes read."""
        name = self._name(handle)
        view = byte_view(buffer)
        end = min(offset + len(view), self._sizes[handle])
        if end <= offset:
            return 0
        data = self._run(lambda: self._obstore.get_range_async(
            self._store, self.key(name), start=offset, end=end), name,
            f"range GET of bytes {offset}-{end}")
        view[:end - offset] = memoryview(data).cast("B")
        return end - offset

    def map(self, name: str) -> npt.NDArray[np.uint8]:
        """The whole object, fetched by one GET, as a read-only byte array."""
        size = self.size(name)
        if size == 0:
            empty = np.zeros(0, dtype=np.uint8)
            empty.setflags(write=False)
            return empty
        data = self._run(lambda: self._obstore.get_range_async(
            self._store, self.key(name), start=0, end=size), name, f"GET of bytes 0-{size}")
        array = np.frombuffer(data, dtype=np.uint8)
        array.setflags(write=False)
        return array

    def download(self, name: str, path: Path, *, chunk: int = 64 << 20) -> None:
        """Copy the whole of ``name`` into the local file ``path``, ``chunk`` bytes
        per range GET."""
        handle = self.open(name)
        size = self._sizes[handle]
        buffer = bytearray(min(chunk, max(size, 1)))
        with open(path, "wb") as file:
            offset = 0
            while offset < size:
                got = self.readinto(handle, offset, buffer)
                file.write(memoryview(buffer)[:got])
                offset += got

    # -- writing (used by ``publish``) --------------------------------------------

    def put(self, name: str, data: bytes | Path) -> None:
        """Upload ``data`` (bytes, or a local file by multipart upload when larger
        than 5 MiB) as ``name``; the object appears only once complete."""
        self._run(lambda: self._obstore.put_async(self._store, self.key(name), data), name,
                  "upload")
        with self._lock:
            self._tags.pop(name, None)
            if self._listed is not None:
                self._listed.pop(name, None)

    def copy(self, source: ObjectStorage, name: str, target: str) -> None:
        """Copy ``name`` of ``source`` (in the same bucket) to ``target`` here, inside
        the store (no bytes pass through this process)."""
        if source._base != self._base:
            raise ValueError(f"cannot copy {source.url_of(name)} into {self.url}: "
                             "not the same bucket")
        self._run(lambda: self._obstore.copy_async(
            self._store, source.key(name), self.key(target)), target, "copy")

    def names(self) -> list[str]:
        """The objects directly under the prefix, sorted (one LIST, done now)."""
        self._listed = None
        return sorted(self._list())

    def walk(self) -> dict[str, int]:
        """Every object under the prefix, at any depth: relative name -> size in
        bytes (a fresh recursive LIST, done now)."""
        prefix = f"{self._prefix}/" if self._prefix else None

        async def listing() -> list[Any]:
            found: list[Any] = []
            async for chunk in self._obstore.list(self._store, prefix, chunk_size=1000):
                found.extend(chunk)
            return found

        objects = self._run(listing, "", "listing")
        start = len(prefix or "")
        return {meta["path"][start:]: int(meta["size"]) for meta in objects}

    def remove(self, name: str) -> None:
        """Delete ``name`` (no error if absent)."""
        with contextlib.suppress(FileNotFoundError):
            self._run(lambda: self._obstore.delete_async(self._store, self.key(name)), name,
                      "delete")
        with self._lock:
            self._tags.pop(name, None)
            if self._listed is not None:
                self._listed.pop(name, None)

    def close(self) -> None:
        """Forget every handle; idempotent. Reads after it raise ``OSError``."""
        with self._lock:
            self._closed = True
            self._handles, self._keys, self._sizes = {}, [], []
