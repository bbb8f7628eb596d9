"""Copy a peer dataset's tokens into a zerobatch token-stream dataset, without
re-tokenizing: one native document per peer document, per-token fields
(datatrove's ``loss_mask``) kept as fields. For users who want the native
format anyway (span metadata, checksums, ``combine``)."""

from __future__ import annotations

import os

import numpy as np

from zerobatch.columnar import Jagged
from zerobatch.peers._base import PeerDataset
from zerobatch.stream.writer import StreamWriter

__all__ = ["copy_to_stream"]


def _token_dtype(dtype: np.dtype) -> str:
    """The native token dtype that holds every id of ``dtype`` (ids are checked
    to be non-negative and in range as they are copied)."""
    return "<u2" if (dtype.itemsize <= 2 and dtype.kind == "u") or dtype.itemsize == 1 else "<u4"


def copy_to_stream(
    ds: PeerDataset, output: str | os.PathLike[str], *, batch_documents: int = 4096
) -> int:
    """Copy the opened peer dataset ``ds`` (``zerobatch.open_dataset``) into a
    new token-stream dataset at ``output`` (a folder or URL); returns the
    documents written: every document of at least one token (native datasets
    hold no empty documents, so ids after an empty peer document shift down
    by one). ``batch_documents`` documents are read per step
    (memory: their tokens). Raises ``ValueError`` naming the document when a
    token id is negative or does not fit 32 bits (the native formats hold
    ``<u2`` and ``<u4``)."""
    dtype = _token_dtype(ds.manifest.record_dtype)
    limit = np.iinfo(np.dtype(dtype)).max
    fields = {name: ds.files.fields[name][0] for name in ds.fields}
    documents = ds.documents(dtype="stored")
    count, written = len(documents), 0
    with StreamWriter(output, token_dtype=dtype, fields=fields or None) as writer:
        for first in range(0, count, batch_documents):
            ids = np.arange(first, min(first + batch_documents, count))
            batch = documents.read(ids)
            tokens = batch["input_ids"]
            assert isinstance(tokens, Jagged)  # documents are jagged
            values = tokens.values
            if values.size and (int(values.min()) < 0 or int(values.max()) > limit):
                bad = int(np.searchsorted(tokens.offsets, int(np.flatnonzero(
                    (values < 0) | (values > limit))[0]), side="right")) - 1
                raise ValueError(f"{ds.path}: document {int(ids[bad])} holds a token id "
                                 f"outside 0..{limit}; it cannot be stored as {dtype}")
            for row in np.flatnonzero(tokens.lengths).tolist():
                writer.add_document(tokens[row], fields={
                    name: batch[name][row] for name in fields} or None)
                written += 1
    return written
