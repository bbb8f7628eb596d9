"""zerobatch: the data path of LLM training.

Write a tokenized corpus once, then read any observation in O(1), shuffle
globally in O(1) memory, resume exactly, and feed PyTorch or JAX.
"""

from __future__ import annotations

from zerobatch.columnar import Batch, BatchMeta, Jagged
from zerobatch.errors import FormatError, StorageError
from zerobatch.loader import Loader
from zerobatch.mixture import Mixture
from zerobatch.plan import Plan
from zerobatch.shuffle import BlockShuffle, Feistel
from zerobatch.source import Source
from zerobatch.stream import StreamWriter, combine, open_dataset, verify

from zerobatch import peers  # isort: skip (after stream: registers the peer formats with it)

__all__ = [
    "Batch",
    "BatchMeta",
    "BlockShuffle",
    "Feistel",
    "FormatError",
    "Jagged",
    "Loader",
    "Mixture",
    "Plan",
    "Source",
    "StorageError",
    "StreamWriter",
    "combine",
    "open_dataset",
    "peers",
    "verify",
]
__version__ = "0.1.0"
