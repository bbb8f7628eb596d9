"""Where dataset bytes live: the ``Storage`` protocol and ``LocalStorage``."""

from __future__ import annotations

from zerobatch.storage.local import LocalStorage
from zerobatch.storage.protocol import Storage

__all__ = ["LocalStorage", "Storage"]
