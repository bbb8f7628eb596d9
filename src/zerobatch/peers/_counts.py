"""A machine-local cache of the per-shard token counts that opening a corpus
would otherwise derive from every sample (MDS with a dynamic shape).

MDS records no token counts: a shard's count comes from its offsets table,
4 bytes a sample, so opening is O(samples): 4 MB and ~6 ms at a million
samples, 4.8 GB and seconds on every rank at the 1.2 billion samples of a
large corpus. The counts (two int64 a shard: its tokens and its first value
byte) are a pure function of the bytes of ``index.json``, the reader's
layout of the token column and (local files) each shard's modification
time, so they are kept under that key, and every open after the first
reads ``index.json`` alone (O(shards)).

Nothing is trusted: a cache file is checked whole (magic, length, the
shard count, a BLAKE2b digest of its content) and an unreadable or
inconsistent one is ignored and rewritten; a shard's first read builds its
sample table from its own offsets, as before, and a count that differs from
it (a shard rewritten in place under an unchanged ``index.json``) is a
``FormatError`` that removes the cache file. Files are written whole and
renamed into place, so ranks opening the corpus at once race harmlessly.

Where: ``cache_dir=`` (a folder; ``False`` for none), else the
``ZEROBATCH_CACHE_DIR`` environment variable (an empty value: none), else
``$XDG_CACHE_HOME/zerobatch`` (``~/.cache/zerobatch``). Corpora under
:data:`CACHE_FROM_SAMPLES` samples are not cached: their opening is already
under a millisecond.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CACHE_ENV", "CACHE_FROM_SAMPLES", "CountCache"]

CACHE_ENV = "ZEROBATCH_CACHE_DIR"
"""The environment variable naming the cache folder (empty: no cache)."""

CACHE_FROM_SAMPLES = 1 << 16
"""Corpora with fewer samples than this are counted at every open (~0.2 ms)."""

_MAGIC = b"ZBCOUNT1"
_DIGEST = 16  # bytes of the content's BLAKE2b digest at the end of a file
_SUBFOLDER = "token-counts"


def _folder(cache_dir: Any) -> Path | None:
    """The cache folder ``cache_dir`` names (see the module docstring)."""
    if cache_dir is False:
        return None
    if cache_dir is not None and cache_dir is not True:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise ValueError(f"cache_dir must be a folder or False, got {cache_dir!r:.80}")
        return Path(cache_dir) / _SUBFOLDER
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return Path(configured) / _SUBFOLDER if configured else None
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "zerobatch" / _SUBFOLDER


class CountCache:
    """The cached counts of one corpus: ``key`` it, ``load`` them, ``store``
    them once counted, ``forget`` them when a shard contradicts them.
    ``cache_dir`` is checked when it is built (``ValueError``)."""

    def __init__(self, cache_dir: Any, format: str) -> None:
        self._folder = _folder(cache_dir)
        self._format = format
        self.path: Path | None = None  # the cache file, once keyed (None: no cache)

    def key(self, *parts: bytes) -> None:
        """Name the cache file by what the counts are a function of (the bytes
        of the corpus's index, the reader's layout, the files' mtimes)."""
        if self._folder is None:
            return
        digest = hashlib.blake2b(digest_size=16)
        for part in (self._format.encode(), *parts):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        self.path = self._folder / f"{self._format}-{digest.hexdigest()}.bin"

    def load(self, shards: int) -> tuple[list[int], list[int]] | None:
        """Each shard's tokens and first value byte, or None (no cache file,
        or one that is not whole and consistent)."""
        if self.path is None:
            return None
        try:
            raw = self.path.read_bytes()
        except OSError:
            return None
        body = len(_MAGIC) + 8 + 16 * shards
        if (len(raw) != body + _DIGEST or raw[:len(_MAGIC)] != _MAGIC
                or int.from_bytes(raw[len(_MAGIC):len(_MAGIC) + 8], "little") != shards
                or hashlib.blake2b(raw[:body], digest_size=_DIGEST).digest() != raw[body:]):
            return None
        values = np.frombuffer(raw, "<i8", 2 * shards, len(_MAGIC) + 8)
        counts, firsts = values[:shards], values[shards:]
        if shards and (int(counts.min()) < 0 or int(firsts.min()) < -1):  # -1: no samples
            return None
        return counts.tolist(), firsts.tolist()

    def store(self, counts: list[int], firsts: list[int]) -> None:
        """Write the counts (best effort: a folder that cannot be written, a
        full disk, leaves the corpus counted at each open)."""
        if self.path is None:
            return
        values = np.array([*counts, *firsts], "<i8").tobytes()
        body = _MAGIC + len(counts).to_bytes(8, "little") + values
        content = body + hashlib.blake2b(body, digest_size=_DIGEST).digest()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-")
            try:
                with os.fdopen(descriptor, "wb") as file:
                    file.write(content)
                os.chmod(temporary, 0o644)  # (mkstemp's 0600) other users' ranks read it too
                os.replace(temporary, self.path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError:
            pass

    def forget(self) -> None:
        """Remove the cache file (a shard contradicted it)."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

