"""Tokenizers for ``convert``: Hugging Face ``tokenizers`` files and raw bytes.

An ``Encoder`` turns a batch of texts into token ids and, per token, the
character range of the text it came from (its offset mapping). Workers get a
small picklable ``EncoderSpec`` and build the encoder once per process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from zerobatch.errors import FormatError
from zerobatch.stream.manifest import Tokenizer

__all__ = [
    "BYTES",
    "ByteEncoder",
    "Encoded",
    "Encoder",
    "EncoderSpec",
    "HFEncoder",
    "load_tokenizer",
    "resolve_tokenizer",
    "token_dtype",
]

BYTES = "bytes"
_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eos|>", "[SEP]")
_CACHE: dict[EncoderSpec, Encoder] = {}
_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Encoded:
    """One document's ids and, when asked for, per token ``[start, end)`` in
    characters (empty arrays otherwise)."""

    ids: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]


class Encoder(Protocol):
    """What ``convert`` needs from a tokenizer."""

    facts: Tokenizer

    def encode(self, texts: list[str], *, offsets: bool = True) -> list[Encoded]: ...


class ByteEncoder:
    """UTF-8 bytes as ids 0..255, end of document 256 (vocabulary 257)."""

    def __init__(self) -> None:
        self.facts = Tokenizer(BYTES, 257, 256, None)

    def encode(self, texts: list[str], *, offsets: bool = True) -> list[Encoded]:
        out = []
        for text in texts:
            raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            if not offsets:
                out.append(Encoded(raw.astype(np.int64), _NONE, _NONE))
                continue
            # A byte starts a character unless it is a continuation byte 10xxxxxx.
            char = np.cumsum((raw & 0xC0) != 0x80, dtype=np.int64) - 1
            out.append(Encoded(raw.astype(np.int64), char, char + 1))
        return out


class HFEncoder:
    """A Hugging Face ``tokenizers.Tokenizer`` (loaded from its JSON file)."""

    def __init__(self, tokenizer: Any, name: str, eos_id: int | None) -> None:
        self._tokenizer = tokenizer
        vocab = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.facts = Tokenizer(name, vocab, eos_id, None)

    def encode(self, texts: list[str], *, offsets: bool = True) -> list[Encoded]:
        if not offsets:  # encode_batch_fast computes no offsets: the same ids, sooner
            return [Encoded(np.asarray(encoding.ids, dtype=np.int64), _NONE, _NONE)
                    for encoding in self._tokenizer.encode_batch_fast(texts)]
        out = []
        for encoding in self._tokenizer.encode_batch(texts):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            spans = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
            out.append(Encoded(ids, spans[:, 0], spans[:, 1]))
        return out


@dataclass(frozen=True)
class EncoderSpec:
    """A picklable recipe for an encoder: ``BYTES``, or a tokenizer JSON file
    (``digest``: of its bytes, so that a process never reuses the encoder of a
    file that has changed since)."""

    kind: str
    path: str | None = None
    name: str | None = None
    eos_id: int | None = None
    digest: str | None = None

    def build(self) -> Encoder:
        """The encoder, built once per process and spec. ``FormatError`` naming
        the file when it no longer holds the bytes of ``digest`` (edited or
        replaced after the convert began: its workers would otherwise mix two
        tokenizers' ids in one dataset)."""
        encoder = _CACHE.get(self)
        if encoder is None:
            if self.kind == BYTES:
                encoder = ByteEncoder()
            else:
                assert self.path is not None and self.name is not None
                loaded = _parse_tokenizer(self._tokenizer_bytes(), Path(self.path))
                encoder = HFEncoder(loaded, self.name, self.eos_id)
            _CACHE[self] = encoder
        return encoder

    def _tokenizer_bytes(self) -> bytes:
        """The tokenizer file's bytes, checked against ``digest``."""
        assert self.path is not None
        try:
            raw = Path(self.path).read_bytes()
        except OSError as error:
            raise FormatError(f"the tokenizer file cannot be read any more ({error.strerror}); "
                              "it was moved or deleted while the convert ran",
                              path=self.path, field="tokenizer") from None
        if self.digest is not None and xxhash.xxh3_64_hexdigest(raw) != self.digest:
            raise FormatError("the tokenizer file changed while the convert ran (its bytes "
                              "differ from those the convert began with); leave it unchanged "
                              "until the convert ends, then convert again",
                              path=self.path, field="tokenizer")
        return raw


def token_dtype(vocab_size: int) -> str:
    """The stored token dtype: ``<u2`` up to 65,536 ids, else ``<u4``."""
    return "<u2" if vocab_size <= 1 << 16 else "<u4"


def _tokenizer_file(spec: str | os.PathLike[str]) -> Path:
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FormatError("no tokenizer file here; pass a tokenizers JSON file, a folder "
                          "holding tokenizer.json, or 'bytes'", path=path, field="tokenizer")
    return path


def load_tokenizer(spec: str | os.PathLike[str]) -> tuple[Any, Path, str, bytes]:
    """(the ``tokenizers.Tokenizer``, its file, its name, the file's bytes) of
    a tokenizers JSON file or a folder holding ``tokenizer.json``, the file
    read once; ``FormatError`` naming it when it cannot be read."""
    path = _tokenizer_file(spec)
    raw = path.read_bytes()
    loaded = _parse_tokenizer(raw, path)
    return loaded, path, Path(spec).name if Path(spec).is_dir() else path.stem, raw


def _parse_tokenizer(raw: bytes, path: Path) -> Any:
    """The ``tokenizers.Tokenizer`` of a JSON file's bytes; ``FormatError``
    naming ``path`` when they are not one."""
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return HFTokenizer.from_buffer(raw)
    except Exception as error:  # tokenizers raises bare Exceptions
        raise FormatError(f"cannot read the tokenizer ({error})", path=path,
                          field="tokenizer") from None


def _find_eos(tokenizer: Any, eos: int | str | None, path: Path) -> int | None:
    if isinstance(eos, int):
        return eos
    names = (eos,) if isinstance(eos, str) else _EOS_NAMES
    for name in names:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    if isinstance(eos, str):
        raise FormatError(f"the tokenizer has no token {eos!r}", path=path, field="eos")
    return None


def resolve_tokenizer(
    tokenizer: Any, work: Path, *, eos: int | str | None = None
) -> EncoderSpec:
    """An ``EncoderSpec`` for ``tokenizer``: ``"bytes"``, a JSON file or model
    folder path, or a ``tokenizers.Tokenizer`` (saved into ``work``).

    ``eos`` is the end-of-document id or token; by default a usual name
    (``<|endoftext|>``, ``</s>``, …) is looked up. Raises ``FormatError``
    naming the file when it cannot be read.
    """
    if isinstance(tokenizer, str) and tokenizer == BYTES:
        if eos is not None and eos != 256:
            raise ValueError("the byte tokenizer's end-of-document id is 256")
        return EncoderSpec(BYTES)
    from tokenizers import Tokenizer as HFTokenizer

    if isinstance(tokenizer, HFTokenizer):
        path, name, loaded = work / "tokenizer.json", "tokenizer", tokenizer
        raw = tokenizer.to_str().encode("utf-8")
        path.write_bytes(raw)
    elif isinstance(tokenizer, (str, os.PathLike)):
        loaded, path, name, raw = load_tokenizer(tokenizer)
    else:
        raise TypeError("tokenizer must be 'bytes', a path or a tokenizers.Tokenizer, "
                        f"got {type(tokenizer).__name__}")
    digest = xxhash.xxh3_64_hexdigest(raw)
    spec = EncoderSpec("hf", str(path.resolve()), name, _find_eos(loaded, eos, path), digest)
    _CACHE[spec] = HFEncoder(loaded, name, spec.eos_id)  # in-process tasks reuse it
    return spec
