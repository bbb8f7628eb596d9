"""``combine``: one dataset over the shards of several, without re-encoding.

Shard files are hard-linked into the output folder under new numbers (a byte
copy where the file system refuses links, e.g. across devices), so the output
is self-contained and the inputs stay valid and untouched. Checksums are taken
from the input manifests, not recomputed; the manifest is written last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zerobatch.storage import ObjectStorage, is_url, local_path, open_storage
from zerobatch.storage.publish import LocalPublisher, publisher, temp_path
from zerobatch.stream.manifest import (
    Manifest,
    Shard,
    check_sizes,
    read_manifest,
    shard_name,
    write_manifest,
)
from zerobatch.stream.writer import take_output

__all__ = ["combine"]


def _link(source: Path, target: Path) -> None:
    """Place ``source`` at ``target`` atomically: a hard link, else a copy."""
    tmp = temp_path(target)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _same_layout(first: Manifest, other: Manifest, path: str | Path) -> None:
    checks = {
        "record dtype": (first.record_dtype, other.record_dtype),
        "metadata serializer": (first.metadata, other.metadata),
        "format version": (first.version, other.version),
        "tokenizer": (first.tokenizer, other.tokenizer),
    }
    for what, (a, b) in checks.items():
        if a != b:
            raise ValueError(f"cannot combine {path}: its {what} is {b!r}, the first "
                             f"dataset's is {a!r}")


def combine(
    datasets: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *,
    storage_options: Mapping[str, Any] | None = None,
) -> str | Path:
    """Write ``output`` whose shards are those of ``datasets``, in order.

    Reads through the result equal reads through one writer that was given the
    documents of ``datasets[0]``, then ``datasets[1]``, … (windows do not depend
    on shard boundaries). Every input must have the same record dtype, metadata
    serializer, format version and tokenizer (``ValueError`` otherwise) and its files the sizes
    its manifest gives (``FormatError``). ``output`` must not hold a dataset; what
    a killed ``combine`` or writer left there is removed first, so rerunning after
    a kill completes (as for ``StreamWriter``).

    Any of them may be an object-store URL (``storage_options`` apply to all
    URLs): shards of inputs in the output's bucket are copied inside the store;
    others are uploaded (or downloaded, for a local output). The manifest is
    published last. Returns the output folder or URL.
    """
    if not datasets:
        raise ValueError("combine needs at least one dataset")
    options = dict(storage_options or {})
    locations = [str(p) if is_url(p) else local_path(p) for p in datasets]
    storages = [open_storage(p, **(options if is_url(p) else {})) for p in locations]
    try:
        manifests = [read_manifest(p, s if is_url(p) else None)
                     for p, s in zip(locations, storages, strict=True)]
        for path, storage, manifest in zip(locations, storages, manifests, strict=True):
            _same_layout(manifests[0], manifest, path)
            check_sizes(path, manifest, storage.size)
        out = publisher(output, **(options if is_url(output) else {}))
        take_output(out)
        try:
            shards: list[Shard] = []
            for path, storage, manifest in zip(locations, storages, manifests, strict=True):
                for shard in manifest.shards:
                    name = shard_name(len(shards))
                    for suffix in shard.files:
                        _place(path, storage, shard.file(suffix), out, f"{name}.{suffix}")
                    shards.append(Shard(name, shard.records, shard.documents,
                                        shard.metadata_entries, dict(shard.files)))
            out.wait()
            first = manifests[0]
            write_manifest(out, Manifest(first.record_dtype, first.token_field, first.metadata,
                                         first.tokenizer, tuple(shards), first.version))
            return out.location
        finally:
            out.close()
    finally:
        for storage in storages:
            storage.close()


def _place(path: str | Path, storage: Any, name: str, out: Any, target: str) -> None:
    """Publish ``name`` of the input at ``path`` as ``target`` of ``out``."""
    if isinstance(out, LocalPublisher):
        if isinstance(path, Path):
            _link(path / name, out.folder / target)
            return
        tmp = temp_path(out.folder / target)
        storage.download(name, tmp)
        os.replace(tmp, out.folder / target)
        return
    if isinstance(storage, ObjectStorage):
        if storage.bucket_url == out.storage.bucket_url:
            out.storage.copy(storage, name, target)
            return
        staged = out.staging / target
        storage.download(name, staged)
        out.storage.put(target, staged)
        staged.unlink()
        return
    out.storage.put(target, Path(path) / name)
