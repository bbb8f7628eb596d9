"""Where dataset bytes live: the ``Storage`` protocol, ``LocalStorage``,
``ObjectStorage`` (S3, GCS, Azure via obstore) and ``open_storage(url)``."""

from __future__ import annotations

from zerobatch.storage.local import LocalStorage
from zerobatch.storage.object import ObjectStorage
from zerobatch.storage.opener import open_storage
from zerobatch.storage.protocol import Storage
from zerobatch.storage.url import OBJECT_SCHEMES, is_url, join, local_path

__all__ = [
    "OBJECT_SCHEMES",
    "LocalStorage",
    "ObjectStorage",
    "Storage",
    "is_url",
    "join",
    "local_path",
    "open_storage",
]
