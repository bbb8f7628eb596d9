"""Helpers for the stream tests (no tests here): a plain-NumPy corpus model."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zerobatch import stream


@dataclass
class Corpus:
    """Documents, their spans and a loss mask, as written, with a reference model."""

    docs: list[np.ndarray]
    spans: list[list[tuple[int, int, Any]]] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate(self.docs)

    @property
    def doc_of_token(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.docs)), [len(d) for d in self.docs])

    @property
    def doc_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(d) for d in self.docs])])

    def global_spans(self) -> list[tuple[int, int, Any]]:
        starts = self.doc_starts
        return [(int(starts[i]) + a, int(starts[i]) + b, v)
                for i, doc_spans in enumerate(self.spans) for a, b, v in doc_spans]

    def window(self, start: int, seq_len: int) -> dict[str, Any]:
        """What window ``[start, start + seq_len)`` must hold."""
        doc = self.doc_of_token[start : start + seq_len]
        new = np.ones(seq_len, dtype=bool)
        new[1:] = doc[1:] != doc[:-1]
        cut = np.flatnonzero(new)
        positions = np.arange(seq_len) - cut[np.cumsum(new) - 1]
        spans = [(max(a, start) - start, min(b, start + seq_len) - start, v)
                 for a, b, v in self.global_spans() if a < start + seq_len and b > start]
        starts = np.zeros(len(self.tokens), dtype=bool)
        starts[np.cumsum([0, *map(len, self.docs)])[:-1]] = True  # each document's first token
        mask = np.concatenate(self.masks) if self.masks else np.ones(0, np.uint8)
        aligned = self.tokens[start : start + seq_len].copy()
        first = starts[start : start + seq_len].copy()
        first[0] = True  # the window's first token: a segment start too
        aligned[first | (mask[start : start + seq_len] == 0)] = -100
        return {
            "input_ids": self.tokens[start : start + seq_len],
            "labels": self.tokens[start + 1 : start + seq_len + 1],
            "aligned_labels": aligned,
            "position_ids": positions,
            "cu_seqlens": np.append(cut, seq_len),
            "max_seqlen": int(np.diff(np.append(cut, seq_len)).max()),
            "seq_idx": np.cumsum(new) - 1,
            "doc_ids": doc[cut],
            "metadata": spans,
        }


def random_corpus(rng: np.random.Generator, *, docs: int, max_len: int, vocab: int = 65536,
                  spans: bool = False) -> Corpus:
    """``docs`` random documents of 1..max_len tokens, random spans and masks."""
    lengths = rng.integers(1, max_len + 1, size=docs)
    tokens = [rng.integers(0, vocab, size=n).astype(np.int64) for n in lengths]
    masks = [rng.integers(0, 2, size=n).astype(np.uint8) for n in lengths]
    all_spans: list[list[tuple[int, int, Any]]] = []
    for i, n in enumerate(lengths):
        cuts = np.unique(rng.integers(0, n + 1, size=4))
        doc_spans = [(int(a), int(b), {"doc": i, "at": int(a)})
                     for a, b in itertools.pairwise(cuts) if spans and a < b]
        all_spans.append(doc_spans[::2])
    return Corpus(tokens, all_spans, masks)


def write(path: Path, corpus: Corpus, *, metadata: Any = "msgpack", mask: bool = True,
          **options: Any) -> Path:
    """Write ``corpus`` with one StreamWriter; returns ``path``."""
    fields = {"loss_mask": "u1"} if mask else None
    with stream.StreamWriter(path, fields=fields, metadata=metadata, **options) as writer:
        for i, doc in enumerate(corpus.docs):
            writer.add_document(
                doc,
                spans=corpus.spans[i] if metadata else None,
                fields={"loss_mask": corpus.masks[i]} if mask else None,
            )
    return path
