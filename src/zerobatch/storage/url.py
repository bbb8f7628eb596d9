"""Dataset locations as URLs: the helpers that tell and split them (``open_storage``,
in ``zerobatch.storage.opener``, turns one into a ``Storage``).

A location is a local path, a ``file://`` URL, or an object-store URL
(``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = ["OBJECT_SCHEMES", "is_url", "join", "local_path"]

OBJECT_SCHEMES = ("s3", "gs", "az")
"""URL schemes served by ``ObjectStorage`` (S3 and S3-compatible, GCS, Azure Blob)."""


def _scheme(location: str | os.PathLike[str]) -> str:
    if not isinstance(location, str):
        return ""
    head, sep, _ = location.partition("://")
    return head.lower() if sep and head[:1].isalpha() and head.isalnum() else ""


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names an object store (``s3://``, ``gs://``, ``az://``)."""
    return _scheme(location) in OBJECT_SCHEMES


def local_path(location: str | os.PathLike[str]) -> Path:
    """The local path of a path or ``file://`` URL; ``ValueError`` for any other
    URL, ``TypeError`` for what is neither a str nor a path."""
    if isinstance(location, Path):  # already one: paths are immutable, no parse
        return location
    if not isinstance(location, (str, os.PathLike)):
        hint = (" (to read through a storage, pass the folder as the path and the "
                "storage as storage=)" if hasattr(location, "read_into") else "")
        raise TypeError(f"expected a folder: a str or os.PathLike path or URL, got "
                        f"{type(location).__name__}{hint}")
    scheme = _scheme(location)
    if scheme == "":
        return Path(location)
    if scheme == "file":
        parsed = urlparse(str(location))
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{location!r}: file:// URLs must name a local path "
                             "(file:///path or file://localhost/path)")
        return Path(unquote(parsed.path))
    raise ValueError(f"{location!r}: unsupported URL scheme {scheme!r}; use a local path, "
                     f"file://, or one of {', '.join(s + '://' for s in OBJECT_SCHEMES)}")


def join(location: str | os.PathLike[str], name: str) -> str | Path:
    """``name`` inside the folder or prefix ``location`` (for messages and writers)."""
    if is_url(location):
        return f"{str(location).rstrip('/')}/{name}"
    return local_path(location) / name


def __getattr__(name: str) -> Any:
    # the old path zerobatch.storage.url.open_storage: the function lives in opener.py,
    # which imports this module (an import here, at module level, would be a cycle)
    if name == "open_storage":
        from zerobatch.storage.opener import open_storage

        return open_storage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
