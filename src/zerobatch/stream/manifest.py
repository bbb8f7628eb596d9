"""The token-stream dataset format, versions 1 and 2: the spec and ``manifest.json``.

A dataset is a folder (or object-store prefix) holding ``manifest.json`` and,
per shard ``NNNNN`` (five or more decimal digits, numbered from 0):

``NNNNN.tokens``
    A headerless little-endian C-order array of ``records`` records of
    ``record_dtype``: the token id alone (``<u2`` or ``<u4``), or a packed
    structured record with the ``token`` field first, then the per-token
    fields, then ``meta_id`` (``<u4``) when the dataset has span metadata.
    Size: ``records * itemsize`` bytes exactly.
``NNNNN.docs``
    ``documents + 1`` little-endian ``<u8`` record offsets: where each
    document starts, then ``records``. Strictly increasing; the first is 0.
    Documents never cross shards.
``NNNNN.meta.index``, ``NNNNN.meta.data``
    Only when the dataset has span metadata. The index holds ``entries + 1``
    ``<u8`` byte offsets into the data file, non-decreasing, first 0, last the
    data file's size; entry ``k`` is ``data[index[k]:index[k+1]]``, one value
    serialized by the manifest's serializer.
    Version 1: a token's ``meta_id`` is the shard-local entry id ``k`` covering
    it, or ``NO_METADATA`` (2**32 - 1). Entry ids grow with token position and
    each entry covers one contiguous run of tokens inside one document.
    Version 2 (annotations may overlap and nest): see ``NNNNN.meta.spans``.
``NNNNN.meta.spans``
    Version 2 only: ``entries`` rows of three ``<u8`` (``SPAN_FIELDS``): the
    entry's first record, its end record (exclusive), both shard-local, and
    its kind (``SPAN_KIND`` 0: an annotation given as a span; ``DOCUMENT_KIND``
    1: a document's own metadata, over the whole document). Each entry covers
    ``[start, end)``, non-empty, inside one document. Rows are sorted by
    start, then kind descending (a document's metadata first), then end
    descending, then the writer's input order. A token's ``meta_id`` is the
    smallest id of the entries covering it, or ``NO_METADATA`` when none does;
    so ids never decrease along a shard's covered tokens, and the entries
    overlapping records ``[a, b)`` all lie in ``[meta_id of the first covered
    token in [a, b), first entry with start >= b)``: one index range and one
    data range per shard.

``manifest.json`` is UTF-8 JSON, at most ``MAX_MANIFEST_BYTES``, written last:
``format`` (``FORMAT``), ``version`` (1, or 2 for a dataset with metadata
written since version 2; ``VERSIONS``), ``record_dtype`` (a NumPy
descr: a string or a list of ``[name, type]`` pairs), ``token_field`` (null for
a plain token array), ``metadata`` (null, or ``{"serializer": name}``),
``tokenizer`` (null, or ``{"name", "vocab_size", "eos_id", "bos_id"}``, any of
them null) and ``shards``: a list of ``{"name", "records", "documents",
"metadata_entries", "files"}`` where ``files`` maps each suffix (``tokens``,
``docs``, ``meta.index``, ``meta.data``, and in version 2 ``meta.spans``) to
``{"bytes", "xxh3_64"}`` (the XXH3-64 digest of the file as 16 lowercase hex
digits).

Readers MUST check file sizes against the manifest before reading and MUST NOT
trust offsets read from files without range checks. Readers MAY ignore unknown
manifest keys; writers MUST NOT write a different layout under an existing
version. Readers MUST refuse a version they do not know (a version-1 reader
refuses version 2, whose ``meta_id`` it would misread).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zerobatch._json import load_json, read_capped
from zerobatch.errors import FormatError, StorageError
from zerobatch.storage.publish import Publisher, publisher
from zerobatch.storage.url import join
from zerobatch.stream.serializers import BUILTIN

__all__ = [
    "DOCS",
    "DOCUMENT_KIND",
    "FORMAT",
    "MANIFEST",
    "MAX_MANIFEST_BYTES",
    "META_DATA",
    "META_ID",
    "META_ID_DTYPE",
    "META_INDEX",
    "META_SPANS",
    "NO_METADATA",
    "OFFSET_DTYPE",
    "SPANS_VERSION",
    "SPAN_DTYPE",
    "SPAN_FIELDS",
    "SPAN_KIND",
    "TOKEN",
    "TOKENS",
    "TOKEN_DTYPES",
    "VERSIONS",
    "Manifest",
    "Shard",
    "Tokenizer",
    "check_sizes",
    "expected_sizes",
    "is_dataset",
    "manifest_bytes",
    "parse_manifest",
    "read_manifest",
    "record_dtype",
    "shard_name",
    "write_manifest",
]

FORMAT = "zerobatch.stream"
VERSIONS = (1, 2)
SPANS_VERSION = 2
"""The version of datasets with metadata and a ``meta.spans`` file."""
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 256 << 20
TOKENS, DOCS, META_INDEX, META_DATA = "tokens", "docs", "meta.index", "meta.data"
META_SPANS = "meta.spans"
SPAN_DTYPE = np.dtype("<u8")
SPAN_FIELDS = 3
SPAN_KIND, DOCUMENT_KIND = 0, 1
TOKEN, META_ID = "token", "meta_id"
OFFSET_DTYPE = np.dtype("<u8")
META_ID_DTYPE = np.dtype("<u4")
NO_METADATA = 2**32 - 1
TOKEN_DTYPES = ("<u2", "<u4")


def shard_name(number: int) -> str:
    """The name of shard ``number``: ``00000``, ``00001``, …"""
    return f"{number:05d}"


@dataclass(frozen=True)
class Tokenizer:
    """Facts about the tokenizer that produced the ids; any may be None."""

    name: str | None = None
    vocab_size: int | None = None
    eos_id: int | None = None
    bos_id: int | None = None


@dataclass(frozen=True)
class Shard:
    """One row of the shard table: sizes in records, documents and entries."""

    name: str
    records: int
    documents: int
    metadata_entries: int | None
    files: dict[str, tuple[int, str]] = field(default_factory=dict)

    def file(self, suffix: str) -> str:
        """The file name of this shard's ``suffix`` file."""
        return f"{self.name}.{suffix}"


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated ``manifest.json``."""

    record_dtype: np.dtype
    token_field: str | None
    metadata: str | None
    tokenizer: Tokenizer | None
    shards: tuple[Shard, ...]
    version: int = 1

    @property
    def has_spans_table(self) -> bool:
        """Whether shards have a ``meta.spans`` file (version 2)."""
        return self.version == SPANS_VERSION

    @property
    def token_dtype(self) -> np.dtype:
        """The dtype of the token ids."""
        if self.token_field is None:
            return self.record_dtype
        return self.record_dtype.fields[self.token_field][0]  # type: ignore[index]

    @property
    def fields(self) -> tuple[str, ...]:
        """The per-token fields besides the token and ``meta_id``."""
        names = self.record_dtype.names or ()
        return tuple(n for n in names if n not in (TOKEN, META_ID))

    def suffixes(self) -> tuple[str, ...]:
        """The file suffixes every shard has."""
        return _suffixes(self.metadata is not None, self.version)

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``manifest.json`` holds."""
        tok = self.tokenizer
        return {
            "format": FORMAT,
            "version": self.version,
            "record_dtype": np.lib.format.dtype_to_descr(self.record_dtype),
            "token_field": self.token_field,
            "metadata": None if self.metadata is None else {"serializer": self.metadata},
            "tokenizer": None if tok is None else {
                "name": tok.name, "vocab_size": tok.vocab_size,
                "eos_id": tok.eos_id, "bos_id": tok.bos_id,
            },
            "shards": [
                {
                    "name": s.name, "records": s.records, "documents": s.documents,
                    "metadata_entries": s.metadata_entries,
                    "files": {k: {"bytes": b, "xxh3_64": h} for k, (b, h) in s.files.items()},
                }
                for s in self.shards
            ],
        }


def record_dtype(
    token_dtype: str, fields: dict[str, np.dtype], *, metadata: bool
) -> tuple[np.dtype, str | None]:
    """The packed record dtype and the token field for these options."""
    if not fields and not metadata:
        return np.dtype(token_dtype), None
    parts: list[tuple[str, np.dtype]] = [(TOKEN, np.dtype(token_dtype)), *fields.items()]
    if metadata:
        parts.append((META_ID, META_ID_DTYPE))
    return np.dtype(parts), TOKEN


def _suffixes(metadata: bool, version: int) -> tuple[str, ...]:
    if not metadata:
        return (TOKENS, DOCS)
    if version == SPANS_VERSION:
        return (TOKENS, DOCS, META_INDEX, META_DATA, META_SPANS)
    return (TOKENS, DOCS, META_INDEX, META_DATA)


def _fail(message: str, path: str | Path, name: str) -> FormatError:
    return FormatError(message, path=path, field=name)


def _int(value: Any, path: str | Path, name: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(f"expected a non-negative integer, found {value!r}", path, name)
    return value


_FIELD_KINDS = "biuf"  # per-token fields: bool, integers, floats (what a Batch carries)
_MAX_NAME_BYTES = 200  # a shard stem; its longest file name stays under NAME_MAX (255)


def _parse_dtype(descr: Any, path: str | Path) -> tuple[np.dtype, str | None]:
    if isinstance(descr, list) and not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str)
        for p in descr
    ):
        raise _fail(f"expected a list of [name, type] string pairs, found {descr!r:.200}",
                    path, "record_dtype")
    if not isinstance(descr, (str, list)) or not descr:
        raise _fail(f"expected a dtype string or a non-empty list, found {descr!r:.200}",
                    path, "record_dtype")
    try:
        spec: Any = [tuple(p) for p in descr] if isinstance(descr, list) else descr
        dtype = np.lib.format.descr_to_dtype(spec)
    except (TypeError, ValueError, SyntaxError) as error:
        raise _fail(f"unknown dtype {descr!r:.200} ({error})", path, "record_dtype") from None
    if dtype.names is None:
        if dtype.str not in TOKEN_DTYPES:
            raise _fail(f"expected one of {TOKEN_DTYPES}, found {dtype.str}", path, "record_dtype")
        return dtype, None
    fields: Any = dtype.fields
    if not dtype.names or dtype.itemsize != sum(fields[n][0].itemsize for n in dtype.names):
        raise _fail("expected packed named fields", path, "record_dtype")
    for name in dtype.names:
        sub = dtype.fields[name][0]  # type: ignore[index]
        if (sub.kind not in _FIELD_KINDS or sub.shape != () or sub.byteorder == ">"
                or not name.isidentifier()):
            raise _fail(f"field {name!r:.80} has an unsupported dtype {sub} (per-token fields "
                        "are scalar bool, integer or float)", path, "record_dtype")
    if dtype.names[0] != TOKEN or dtype.fields[TOKEN][0].str not in TOKEN_DTYPES:  # type: ignore[index]
        raise _fail(f"the first field must be {TOKEN!r} of {TOKEN_DTYPES}", path, "record_dtype")
    if META_ID in dtype.names and dtype.fields[META_ID][0] != META_ID_DTYPE:  # type: ignore[index]
        raise _fail(f"{META_ID!r} must be {META_ID_DTYPE.str}", path, "record_dtype")
    return dtype, TOKEN


def _check_stem(name: Any, path: str | Path, where: str) -> str:
    """``name`` if it is a plain file stem: no separator, NUL or control
    character, not hidden, at most ``_MAX_NAME_BYTES`` UTF-8 bytes."""
    ok = isinstance(name, str) and name and name.isprintable() and not name.startswith(".")
    if ok and not any(c in name for c in "/\\\x00"):
        try:
            ok = len(name.encode("utf-8")) <= _MAX_NAME_BYTES
        except UnicodeEncodeError:
            ok = False
    else:
        ok = False
    if not ok:
        raise _fail(f"expected a plain file stem (printable, no path separator, at most "
                    f"{_MAX_NAME_BYTES} bytes), found {name!r:.80}", path, where)
    return name


def _parse_shard(raw: Any, i: int, suffixes: tuple[str, ...], path: str | Path) -> Shard:
    where = f"shards[{i}]"
    if not isinstance(raw, dict):
        raise _fail("expected an object", path, where)
    name = _check_stem(raw.get("name"), path, f"{where}.name")
    records = _int(raw.get("records"), path, f"{where}.records")
    documents = _int(raw.get("documents"), path, f"{where}.documents")
    entries = _int(raw.get("metadata_entries"), path, f"{where}.metadata_entries", optional=True)
    files_raw = raw.get("files")
    if not isinstance(files_raw, dict):
        raise _fail("expected an object", path, f"{where}.files")
    files: dict[str, tuple[int, str]] = {}
    for suffix in suffixes:
        entry = files_raw.get(suffix)
        if not isinstance(entry, dict):
            raise _fail("missing", path, f"{where}.files.{suffix}")
        size = _int(entry.get("bytes"), path, f"{where}.files.{suffix}.bytes")
        digest = entry.get("xxh3_64")
        if not isinstance(digest, str) or len(digest) != 16:
            raise _fail(f"expected 16 hex digits, found {digest!r}", path,
                        f"{where}.files.{suffix}.xxh3_64")
        files[suffix] = (size, digest)
    return Shard(name, records, documents, entries, files)


def _parse_tokenizer(raw: Any, path: str | Path) -> Tokenizer | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail("expected an object or null", path, "tokenizer")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise _fail(f"expected a string, found {name!r}", path, "tokenizer.name")
    return Tokenizer(
        name,
        *(_int(raw.get(k), path, f"tokenizer.{k}", optional=True)
          for k in ("vocab_size", "eos_id", "bos_id")),
    )


def _serializer_name_ok(name: str) -> bool:
    """A built-in serializer's name or ``custom:<class name>``."""
    if name in BUILTIN:
        return True
    word = name.removeprefix("custom:")
    return word != name and bool(word) and len(name) <= 256 and word.replace(".", "_") \
        .replace("<", "_").replace(">", "_").isidentifier()


def parse_manifest(raw: Any, path: str | Path) -> Manifest:
    """Validate a decoded manifest; ``FormatError`` names the first bad field."""
    if not isinstance(raw, dict):
        raise _fail("expected a JSON object", path, "manifest")
    if raw.get("format") != FORMAT:
        raise _fail(f"expected {FORMAT!r}, found {raw.get('format')!r}", path, "format")
    version = raw.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise _fail(f"expected one of {VERSIONS}, found {version!r}; a newer zerobatch "
                    "wrote it?", path, "version")
    dtype, token_field = _parse_dtype(raw.get("record_dtype"), path)
    if raw.get("token_field") != token_field:
        raise _fail(f"expected {token_field!r}, found {raw.get('token_field')!r}",
                    path, "token_field")
    meta = raw.get("metadata")
    serializer = None
    if meta is not None:
        serializer = meta.get("serializer") if isinstance(meta, dict) else None
        if not isinstance(serializer, str) or not _serializer_name_ok(serializer):
            raise _fail(f"expected a serializer name, found {meta!r:.200}", path, "metadata")
    has_ids = dtype.names is not None and META_ID in dtype.names
    if has_ids != (serializer is not None):
        raise _fail(f"metadata and the {META_ID!r} field must come together", path, "metadata")
    if version == SPANS_VERSION and serializer is None:
        raise _fail(f"version {SPANS_VERSION} is only for datasets with metadata", path,
                    "version")
    shards_raw = raw.get("shards")
    if not isinstance(shards_raw, list):
        raise _fail("expected a list", path, "shards")
    suffixes = _suffixes(serializer is not None, version)
    shards = tuple(_parse_shard(s, i, suffixes, path) for i, s in enumerate(shards_raw))
    if len({s.name for s in shards}) != len(shards):
        raise _fail("shard names must be unique", path, "shards")
    for i, s in enumerate(shards):
        if (s.metadata_entries is None) == (serializer is not None):
            raise _fail("must be set exactly when the dataset has metadata", path,
                        f"shards[{i}].metadata_entries")
    return Manifest(dtype, token_field, serializer, _parse_tokenizer(raw.get("tokenizer"), path),
                    shards, version)


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder whose manifest names this format (no checks)."""
    manifest = Path(path) / MANIFEST
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return False
        raw = load_json(manifest.read_bytes(), path=manifest, field="manifest",
                        max_bytes=MAX_MANIFEST_BYTES)
    except (OSError, FormatError):
        return False
    return isinstance(raw, dict) and raw.get("format") == FORMAT


def read_manifest(folder: str | os.PathLike[str], storage: Any = None) -> Manifest:
    """Read and validate ``folder/manifest.json`` (size and nesting depth capped
    before parsing); through ``storage`` (a ``Storage`` of ``folder``) when
    given, e.g. for URLs."""
    path = join(folder, MANIFEST)
    try:
        if storage is None:
            with open(path, "rb") as file:
                data = read_capped(file, MAX_MANIFEST_BYTES)
        else:
            if storage.size(MANIFEST) > MAX_MANIFEST_BYTES:
                raise _fail(f"larger than {MAX_MANIFEST_BYTES} bytes", path, "manifest")
            data = storage.map(MANIFEST).tobytes()
    except OSError as error:
        if isinstance(error, StorageError):  # the store failed: not a format problem
            raise
        exists = storage.names() if storage is not None else Path(folder).is_dir()
        if not exists:
            raise
        raise _fail(f"cannot be read ({error.strerror or 'no such object'}): not a "
                    "token-stream dataset, or not fully written", path, "manifest") from None
    raw = load_json(data, path=path, field="manifest", max_bytes=MAX_MANIFEST_BYTES)
    return parse_manifest(raw, path)


def expected_sizes(shard: Shard, itemsize: int) -> dict[str, int]:
    """File sizes in bytes implied by the shard table (the data file's is free)."""
    sizes = {TOKENS: shard.records * itemsize, DOCS: (shard.documents + 1) * OFFSET_DTYPE.itemsize}
    if shard.metadata_entries is not None:
        sizes[META_INDEX] = (shard.metadata_entries + 1) * OFFSET_DTYPE.itemsize
        if META_SPANS in shard.files:
            sizes[META_SPANS] = shard.metadata_entries * SPAN_FIELDS * SPAN_DTYPE.itemsize
    return sizes


def check_sizes(
    folder: str | os.PathLike[str], manifest: Manifest, size: Callable[[str], int]
) -> None:
    """Every file exists with the size the manifest gives and the shard table
    implies; ``size(name)`` is the file's size (O(files) stats, no reads)."""
    itemsize = manifest.record_dtype.itemsize
    local = isinstance(folder, Path) and folder.is_dir()
    for i, shard in enumerate(manifest.shards):
        expected = expected_sizes(shard, itemsize)
        for suffix, (recorded, _) in shard.files.items():
            name = shard.file(suffix)
            try:
                actual = size(name)
                if local and not stat.S_ISREG(os.stat(os.path.join(folder, name)).st_mode):
                    raise _fail("not a regular file", join(folder, name), f"shards[{i}].name")
            except FileNotFoundError:
                raise _fail("file is missing", join(folder, name), f"shards[{i}].files") from None
            except OSError as error:
                raise _fail(f"cannot be read ({error})", join(folder, name),
                            f"shards[{i}].files") from None
            if actual != recorded:
                raise _fail(f"manifest says {recorded} bytes, file has {actual}; "
                            "truncated or not fully written?", join(folder, name),
                            f"files.{suffix}.bytes")
            want = expected.get(suffix)
            if want is not None and want != recorded:
                raise _fail(f"the shard table implies {want} bytes, manifest says {recorded}",
                            join(folder, name), f"files.{suffix}.bytes")


def manifest_bytes(manifest: Manifest) -> bytes:
    """The bytes of ``manifest.json`` for ``manifest``."""
    return (json.dumps(manifest.to_json(), indent=1) + "\n").encode("utf-8")


def write_manifest(folder: str | os.PathLike[str] | Publisher, manifest: Manifest) -> None:
    """Publish ``manifest.json`` atomically into ``folder`` (a path, URL or a
    ``Publisher``; locally: temporary name, fsync, rename)."""
    target = publisher(folder) if isinstance(folder, str | os.PathLike) else folder
    target.put(MANIFEST, manifest_bytes(manifest))
