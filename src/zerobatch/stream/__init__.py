"""Token-stream datasets: sharded token arrays with documents and span metadata.

The layout is specified in ``zerobatch.stream.manifest``.
"""

from __future__ import annotations

from zerobatch.stream.combine import combine
from zerobatch.stream.manifest import Tokenizer, is_dataset
from zerobatch.stream.reader import Dataset, Documents, TokenWindows, open_dataset
from zerobatch.stream.verify import Problem, describe, format_problems, verify
from zerobatch.stream.writer import StreamWriter

__all__ = [
    "Dataset",
    "Documents",
    "Problem",
    "StreamWriter",
    "TokenWindows",
    "Tokenizer",
    "combine",
    "describe",
    "format_problems",
    "is_dataset",
    "open_dataset",
    "verify",
]
