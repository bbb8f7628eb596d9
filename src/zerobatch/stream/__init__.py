"""Token-stream datasets: sharded token arrays with documents and span metadata.

The layout is specified in ``zerobatch.stream.manifest``.
"""

from __future__ import annotations

from zerobatch.stream.reader import Dataset, Documents, TokenWindows, open_dataset
from zerobatch.stream.writer import StreamWriter

__all__ = ["Dataset", "Documents", "StreamWriter", "TokenWindows", "open_dataset"]
