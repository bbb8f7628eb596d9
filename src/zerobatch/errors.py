"""The exceptions zerobatch raises for bad input.

Every message says what was expected, what was found, where (file, field,
argument) and, where there is one, what to do about it.
"""

from __future__ import annotations

__all__ = ["FormatError", "StorageError"]


class FormatError(ValueError):
    """A file, manifest or message is malformed: wrong magic, a field that
    disagrees with the file size, a truncated or crafted payload.

    Attributes:
        path: the file (or frame, or object key) that is wrong, when known.
        field: the header field or record that is wrong, when known.
    """

    def __init__(self, message: str, *, path: object = None, field: str | None = None) -> None:
        self.path = None if path is None else str(path)
        self.field = field
        where = []
        if self.path is not None:
            where.append(self.path)
        if field is not None:
            where.append(f"field {field!r}")
        prefix = f"{': '.join(where)}: " if where else ""
        super().__init__(f"{prefix}{message}")


class StorageError(OSError):
    """Reading or writing bytes failed after retries (local files or object stores)."""
