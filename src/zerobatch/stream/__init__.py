"""Token-stream datasets: sharded token arrays with documents and span metadata.

The layout is specified in ``zerobatch.stream.manifest``. In short::

    with StreamWriter("corpus", metadata="msgpack") as writer:
        writer.add_document([5, 6, 7, 8], spans=[(1, 3, {"concept": 14})])
    windows = open_dataset("corpus").windows(2)
    batch = windows.read([0])  # input_ids [[5, 6]], labels [[6, 7]],
                               # metadata == [[(1, 2, {"concept": 14})]]

``batch["metadata"]`` holds one ``Spans`` per observation: a read-only sequence
of ``(start, end, value)`` whose values are decoded on first use.
"""

from __future__ import annotations

from zerobatch.stream.combine import combine
from zerobatch.stream.manifest import Tokenizer, is_dataset
from zerobatch.stream.npy import NpyTokens, NpyWindows, open_npy, verify_npy
from zerobatch.stream.reader import Dataset, Documents, TokenWindows, open_dataset
from zerobatch.stream.spans import Spans, SpanTable
from zerobatch.stream.verify import Problem, describe, format_problems, verify
from zerobatch.stream.writer import StreamWriter

__all__ = [
    "Dataset",
    "Documents",
    "NpyTokens",
    "NpyWindows",
    "Problem",
    "SpanTable",
    "Spans",
    "StreamWriter",
    "TokenWindows",
    "Tokenizer",
    "combine",
    "describe",
    "format_problems",
    "is_dataset",
    "open_dataset",
    "open_npy",
    "verify",
    "verify_npy",
]
