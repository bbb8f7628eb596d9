"""Which argument adds a column a source computes only on request, and the
message for a missing column. A leaf: ``columnar.Batch`` and ``varlen.Columns``
both name the argument in their ``KeyError`` (``zerobatch.varlen`` exports both
names)."""

from __future__ import annotations

from typing import Any

__all__ = ["COLUMN_HINTS", "missing_column"]

COLUMN_HINTS = {
    "position_ids": "document_masking=True",
    "cu_seqlens": "document_masking=True",
    "max_seqlen": "document_masking=True",
    "seq_idx": "columns=(..., 'seq_idx')",
    "doc_ids": "columns=(..., 'doc_ids')",
    "metadata": "columns=(..., 'metadata')",
    "document_metadata": "columns=(..., 'document_metadata')",
}
"""For each column a source computes only on request, the argument of
``windows()`` that adds it (named by the error for a missing column)."""


def missing_column(name: object, fields: Any) -> str:
    """The message for a column ``name`` a batch of ``fields`` lacks."""
    message = f"no column {name!r}; the batch has {', '.join(map(str, fields))}"
    hint = COLUMN_HINTS.get(name) if isinstance(name, str) else None
    if hint is not None:
        message += f". Pass {hint} to dataset.windows(...) to compute it"
    return message
