"""Peer formats read in place: Megatron ``.bin``/``.idx``, datatrove ``.ds``,
Hugging Face ``save_to_disk`` folders, LitData, MDS and OLMo token arrays.

``open_peer(path, format=None)`` (and ``zerobatch.open_dataset`` when a path
holds no zerobatch manifest) returns a ``PeerDataset``: the same windows,
documents, Loader, plan and resume as a native dataset, with no conversion
and no index build. Each format's module docstring is its byte layout and
what the reader checks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zerobatch.errors import FormatError
from zerobatch.peers import datatrove, hf, litdata, mds, megatron
from zerobatch.peers._base import Location, PeerDataset, PeerFiles, locate
from zerobatch.peers.copy import copy_to_stream
from zerobatch.peers.datatrove import DatatroveFiles
from zerobatch.peers.hf import HFFiles
from zerobatch.peers.litdata import LitDataFiles
from zerobatch.peers.mds import MDSFiles
from zerobatch.peers.megatron import MegatronFiles
from zerobatch.peers.olmo import OlmoFiles
from zerobatch.stream.reader import Dataset, register_peer_formats

__all__ = ["FORMATS", "PeerDataset", "PeerFiles", "copy_to_stream", "detect", "detect_path",
           "open_peer"]

FORMATS: dict[str, type[PeerFiles]] = {
    "megatron": MegatronFiles,
    "datatrove": DatatroveFiles,
    "hf": HFFiles,
    "litdata": LitDataFiles,
    "mds": MDSFiles,
    "olmo": OlmoFiles,
}
"""Every peer format by name. ``detect`` tries all but OLMo's, whose raw
``.npy`` files only ``format="olmo"`` (with its ``dtype=``) opens."""


_DETECT: dict[str, Any] = {"megatron": megatron.detect, "datatrove": datatrove.detect,
                           "hf": hf.detect, "litdata": litdata.detect,
                           "mds": mds.detect}


def detect(location: Location) -> str | None:
    """The name of the peer format at ``location``, or None."""
    for name, found in _DETECT.items():
        if found(location):
            return name
    return None


def detect_path(path: str | os.PathLike[str],
                storage_options: Mapping[str, Any] | None = None) -> str | None:
    """The name of the peer format at ``path`` (a folder, file, prefix or URL;
    one LIST for a URL), or None."""
    location = locate(path, dict(storage_options or {}))
    try:
        return detect(location)
    finally:
        location.storage.close()


def open_peer(
    path: str | os.PathLike[str], format: str | None = None, *,
    storage_options: Mapping[str, Any] | None = None, **format_options: Any,
) -> PeerDataset:
    """Open a peer format's files in place (``format`` detected when None; one
    of ``FORMATS``). Reads headers and sizes only; ``FormatError`` names the
    file and field of anything malformed."""
    found = _open_at(path, format, storage_options, format_options)
    if found is None:
        raise FormatError(f"no zerobatch manifest and no known format here (tried "
                          f"{', '.join(FORMATS)}); pass format= to say which",
                          path=path, field="format")
    return found


def _open_at(path: str | os.PathLike[str], format: str | None,
             storage_options: Mapping[str, Any] | None, options: Mapping[str, Any]
             ) -> PeerDataset | None:
    """``open_peer``, or None when ``format`` is None and none is detected: one
    ``Location`` for the detection and the opening (an index read once)."""
    location = locate(path, dict(storage_options or {}))
    try:
        name = format if format is not None else detect(location)
        if name is None:
            location.storage.close()
            return None
        kind = FORMATS.get(name)
        if kind is None:
            raise ValueError(f"unknown format {name!r}; expected one of {', '.join(FORMATS)}")
        return PeerDataset(kind(location, dict(options)))
    except BaseException:
        location.storage.close()
        raise


class _Formats:
    """What ``zerobatch.stream.open_dataset`` calls to reach the peer formats."""

    def open(self, path: str | os.PathLike[str], format: str | None,
             storage_options: Mapping[str, Any] | None, options: dict[str, Any]
             ) -> Dataset | None:
        """The peer dataset at ``path`` in ``format`` (None: detected; None
        when none is)."""
        return _open_at(path, format, storage_options, options)


register_peer_formats(_Formats())
