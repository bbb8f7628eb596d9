"""OLMo / Dolma token arrays (``*.npy`` that are raw, headerless), read in place.

Despite the suffix, OLMo's token files carry no NumPy header: each is
little-endian token ids back to back, their dtype given in the training
configuration (``memmap_dtype``), never in the file. So zerobatch takes it
from the caller: ``dtype=`` (``"uint8"``, ``"uint16"``, ``"uint32"`` or
``"uint64"``), and refuses a file that starts with NumPy's magic
(``\\x93NUMPY``): that is a real ``.npy`` array, whose header would be read as
tokens (open its folder without ``format="olmo"``: zerobatch reads NumPy
files as such).

Documents come from, per file, in this order:

- ``<name>.csv.gz`` beside ``<name>.npy`` (Dolma's tokenizer writes it):
  one line per document, ``start,end,...``, token offsets in the file;
  documents must tile the file in order (``start`` the previous ``end``);
- else ``eos_id=``: a document ends after each EOS token (the tokens after
  the last EOS are a document of their own).

Opening reads the folder listing and sizes (every file a whole number of
tokens, first bytes not NumPy's magic); the boundaries (the csv.gz, or a pass
over the tokens for EOS) are read on the first read that needs documents.
Files are one logical token array in name order. Until then the number of
documents is unknown: ``documents`` in the shard table is a placeholder
that the first use replaces (``PeerIndex`` counts them).
"""

from __future__ import annotations

import gzip
import io
from typing import Any

import numpy as np

from zerobatch.errors import FormatError
from zerobatch.peers._base import Location, PeerFiles, PeerShard, checked_offsets, read_at

__all__ = ["DTYPES", "NUMPY_MAGIC", "OlmoFiles"]

NUMPY_MAGIC = b"\x93NUMPY"
DTYPES = ("uint8", "uint16", "uint32", "uint64")
SUFFIX, BOUNDS = ".npy", ".csv.gz"
_SCAN = 1 << 24  # tokens per step of an EOS scan


class OlmoFiles(PeerFiles):
    """OLMo's raw token files at a location (see the module docstring).

    Options: ``dtype`` (required), ``eos_id`` (where no ``.csv.gz`` is)."""

    format = "olmo"
    boundary_field = "documents"
    counted = False  # documents come from a pass (EOS scan or csv.gz), made on first use

    def __init__(self, location: Location, options: dict[str, Any]) -> None:
        super().__init__(location, options)
        unknown = set(options) - {"dtype", "eos_id"}
        if unknown:
            raise TypeError(f"unknown OLMo option(s) {sorted(unknown)}; they are dtype= "
                            "and eos_id=")
        dtype = options.get("dtype")
        if dtype is None or str(np.dtype(dtype)) not in DTYPES:
            raise ValueError(f"OLMo token files do not record their dtype: pass dtype= (one "
                             f"of {', '.join(DTYPES)}, the run's memmap_dtype), got {dtype!r}")
        self.dtype = np.dtype(dtype).newbyteorder("<")
        eos = options.get("eos_id")
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int) or eos < 0):
            raise ValueError(f"eos_id must be a non-negative int, got {eos!r}")
        self._eos = eos
        names = [location.stem] if location.stem is not None else sorted(
            n for n in location.names if n.endswith(SUFFIX))
        if not names:
            raise FormatError("no .npy file here", path=location.root, field="files")
        listed = set(location.names)
        shards = []
        for name in names:
            size = int(self.storage.size(name))
            if size % self.dtype.itemsize:
                raise FormatError(f"{size} bytes is not a whole number of {self.dtype} tokens",
                                  path=self.path(name), field="bytes")
            head = read_at(self.storage, name, 0, min(size, len(NUMPY_MAGIC)),
                           path=self.path(name), field="magic")
            if head == NUMPY_MAGIC:
                raise FormatError("the file has a NumPy header: it is a .npy array, not "
                                  "OLMo's raw tokens (open it without format='olmo')",
                                  path=self.path(name), field="magic")
            bounds = name[:-len(SUFFIX)] + BOUNDS
            if bounds not in listed and eos is None:
                raise FormatError(f"no {bounds} beside it: pass eos_id= to find documents "
                                  "by their EOS token", path=self.path(name), field="documents")
            boundary = bounds if bounds in listed else name
            records = size // self.dtype.itemsize
            shards.append(PeerShard(name, 0, records, 1 if records else 0, boundary))
        self.shards = tuple(shards)

    def _documents(self, shard: int) -> tuple[str, str | None, np.ndarray | None]:
        entry = self.shards[shard]
        if entry.boundary != entry.tokens:
            raw = bytes(self.storage.map(entry.boundary))
            try:
                text = gzip.decompress(raw).decode("ascii")
                rows = np.loadtxt(io.StringIO(text), delimiter=",", usecols=(0, 1),
                                  dtype=np.int64, ndmin=2)
            except (OSError, EOFError, ValueError, UnicodeDecodeError) as error:
                return "documents", f"expected gzip'd lines 'start,end,...' ({error})", None
            if rows.shape[0] and (rows[1:, 0] != rows[:-1, 1]).any():
                return ("documents",
                        "documents do not tile the file (a start is not the previous end)", None)
            offsets = np.concatenate([rows[:1, 0], rows[:, 1]]) if rows.shape[0] else \
                np.zeros(1, np.int64)
        else:
            tokens = self.storage.map(entry.tokens)[:entry.records * self.dtype.itemsize] \
                .view(self.dtype)
            ends = [np.flatnonzero(tokens[a:a + _SCAN] == self._eos) + a + 1
                    for a in range(0, entry.records, _SCAN)]
            found = np.concatenate([np.zeros(1, np.int64), *ends])
            offsets = found if found[-1] == entry.records else np.append(found, entry.records)
        message = checked_offsets(offsets, entry.records, path=self.path(entry.boundary),
                                  field="documents")
        return "documents", message, offsets.astype(np.uint64) if message is None else None

    def facts(self) -> list[tuple[str, str]]:
        how = "csv.gz" if any(s.boundary != s.tokens for s in self.shards) else \
            f"eos_id {self._eos}"
        return [("documents from", how)]
