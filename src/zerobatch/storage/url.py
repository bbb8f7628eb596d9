"""Dataset locations as URLs: ``open_storage`` and the helpers that split them.

A location is a local path, a ``file://`` URL, or an object-store URL
(``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from zerobatch.storage.local import LocalStorage

__all__ = ["OBJECT_SCHEMES", "is_url", "join", "local_path", "open_storage"]

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


def open_storage(location: str | os.PathLike[str], **storage_options: Any) -> Any:
    """The ``Storage`` for the folder or prefix at ``location``.

    Local paths and ``file://`` URLs give ``LocalStorage``; its one option is
    ``method``: ``"auto"`` (default: memory maps on local file systems,
    ``pread`` on network and FUSE ones and wherever the type cannot be told),
    ``"mmap"`` or ``"pread"`` (use ``"pread"`` where files may be truncated in
    place while a job reads them: a mapping then dies of SIGBUS, see
    ``zerobatch.storage.local``). ``s3://``, ``gs://`` and
    ``az://`` give ``ObjectStorage`` (needs the ``cloud`` extra): credentials and
    endpoints come from the cloud's environment variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, ``GOOGLE_SERVICE_ACCOUNT``,
    ``AZURE_STORAGE_ACCOUNT_NAME``, ...) or from ``storage_options``, obstore's
    own keyword arguments (``config``, config keys, ``client_options``,
    ``retry_config``, ``credential_provider``), passed through unchanged.
    """
    if is_url(location):
        from zerobatch.storage.object import ObjectStorage  # object imports this module

        return ObjectStorage(str(location), **storage_options)
    unknown = sorted(set(storage_options) - {"method"})
    if unknown:
        raise ValueError(f"{location!r} is a local path; storage_options {unknown} apply only "
                         "to object-store URLs (LocalStorage takes method='auto'|'pread'|'mmap')")
    return LocalStorage(local_path(location), **storage_options)
