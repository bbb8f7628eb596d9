"""The benchmarks' one page-cache helper: ``warm(path)`` reads a dataset's
files once, so that a measurement compares readers, not the disk (this
machine kind's memory reclaim evicts files idle for minutes, and whichever
reader ran first would pay the disk for the others)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["warm"]


def warm(path: Path) -> int:
    """Read every file under ``path`` (a folder; for a file or a prefix such
    as Megatron's ``folder/corpus``, its folder) into the page cache; returns
    the bytes read."""
    folder = path if path.is_dir() else path.parent
    total = 0
    for file in folder.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    total += len(chunk)
    return total
