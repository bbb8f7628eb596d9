"""Columnar batches: ``BatchMeta`` (seed 002), ``Batch`` and the F + 1 frame codec.

Every operation costs O(B) + O(F): per-sample facts are NumPy arrays, per-field
facts are stored once. The core never imports torch; ``Batch.to_torch`` and
torch inputs import it on use.
"""

from __future__ import annotations

from zerobatch.columnar.batch import Batch
from zerobatch.columnar.jagged import Jagged
from zerobatch.columnar.meta import BatchMeta
from zerobatch.columnar.schema import FieldSchema

__all__ = ["Batch", "BatchMeta", "FieldSchema", "Jagged"]
