"""``combine``: one dataset over the shards of several, without re-encoding.

Shard files are hard-linked into the output folder under new numbers (a byte
copy where the file system refuses links, e.g. across devices), so the output
is self-contained and the inputs stay valid and untouched. Checksums are taken
from the input manifests, not recomputed; the manifest is written last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from zerobatch.storage import LocalStorage
from zerobatch.stream.manifest import (
    Manifest,
    Shard,
    check_sizes,
    read_manifest,
    shard_name,
    write_manifest,
)

__all__ = ["combine"]


def _link(source: Path, target: Path) -> None:
    """Place ``source`` at ``target`` atomically: a hard link, else a copy."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _same_layout(first: Manifest, other: Manifest, path: Path) -> None:
    checks = {
        "record dtype": (first.record_dtype, other.record_dtype),
        "metadata serializer": (first.metadata, other.metadata),
        "tokenizer": (first.tokenizer, other.tokenizer),
    }
    for what, (a, b) in checks.items():
        if a != b:
            raise ValueError(f"cannot combine {path}: its {what} is {b!r}, the first "
                             f"dataset's is {a!r}")


def combine(
    datasets: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str]
) -> Path:
    """Write ``output`` whose shards are those of ``datasets``, in order.

    Reads through the result equal reads through one writer that was given the
    documents of ``datasets[0]``, then ``datasets[1]``, … (windows do not depend
    on shard boundaries). Every input must have the same record dtype, metadata
    serializer and tokenizer (``ValueError`` otherwise) and its files the sizes
    its manifest gives (``FormatError``). ``output`` must not hold a dataset.
    Returns the output folder.
    """
    if not datasets:
        raise ValueError("combine needs at least one dataset")
    paths = [Path(p) for p in datasets]
    manifests = [read_manifest(p) for p in paths]
    for path, manifest in zip(paths, manifests, strict=True):
        _same_layout(manifests[0], manifest, path)
        check_sizes(path, manifest, LocalStorage(path).size)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    shards: list[Shard] = []
    for path, manifest in zip(paths, manifests, strict=True):
        for shard in manifest.shards:
            name = shard_name(len(shards))
            for suffix in shard.files:
                _link(path / shard.file(suffix), out / f"{name}.{suffix}")
            shards.append(Shard(name, shard.records, shard.documents,
                                shard.metadata_entries, dict(shard.files)))
    first = manifests[0]
    write_manifest(out, Manifest(first.record_dtype, first.token_field, first.metadata,
                                 first.tokenizer, tuple(shards)))
    return out
