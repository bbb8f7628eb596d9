"""``verify`` checks at least what every read checks: on datasets mutated in
their tables with the manifest's checksums kept consistent (so the checksum
cannot be what catches the change), ``verify(path) == []`` implies that every
read succeeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobatch import stream
from zerobatch.errors import FormatError

_BOUNDARY = (0, 1, 2, 3, 7, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**63 + 1,
             2**64 - 1)


V1 = Path(__file__).parent / "data" / "stream-v1-metadata"  # written by a version-1 writer


def _write(folder: Path, metadata: str) -> Path:
    """Documents with nested and overlapping spans and their own metadata,
    over several shards (format version 2)."""
    rng = np.random.default_rng(7)
    with stream.StreamWriter(folder, metadata=metadata, fields={"mask": "u1"},
                             shard_tokens=48) as writer:
        for d in range(9):
            n = int(rng.integers(2, 14))
            spans = [(0, n, {"a": d}), (0, n // 2, {"b": d}), (n // 3, n, [d])]
            writer.add_document(rng.integers(0, 1000, n), spans=spans if d % 3 else None,
                                metadata={"doc": d} if d % 2 else None,
                                fields={"mask": np.ones(n, "u1")})
    return folder


@pytest.fixture(scope="module", params=["v2-msgpack", "v2-json", "v1-msgpack"])
def pristine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("verify") / "ds"
    if request.param == "v1-msgpack":
        shutil.copytree(V1, folder)
    else:
        _write(folder, request.param.removeprefix("v2-"))
    assert json.loads((folder / "manifest.json").read_text())["version"] == int(
        request.param[1])
    assert stream.verify(folder) == []
    _read_all(folder)
    return folder


def reseal(folder: Path) -> None:
    """Give every file's current checksum to the manifest (sizes unchanged)."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for shard in manifest["shards"]:
        for suffix, entry in shard["files"].items():
            entry["xxh3_64"] = xxhash.xxh3_64_hexdigest(
                (folder / f"{shard['name']}.{suffix}").read_bytes())
    path.write_text(json.dumps(manifest))


def _read_all(folder: Path) -> None:
    """Every kind of read, of everything: windows with each column set (the
    direct cast path, positions alone, everything), one-token windows (every
    token then starts a window), documents, and every metadata value."""
    with stream.open_dataset(folder) as ds:
        for seq_len in (1, 5, 16):
            for columns in (None, ("input_ids", "labels"), ("position_ids",), ("metadata",),
                            ("document_metadata",) if ds.has_document_metadata else ("doc_ids",)):
                windows = ds.windows(seq_len, columns=columns)
                batch = windows.read(np.arange(len(windows)))
                _values(batch)
        for documents in (ds.documents(), ds.documents(max_len=3)):
            _values(documents.read(np.arange(len(documents))))


def _values(batch: object) -> None:
    for column in ("metadata", "document_metadata"):
        if column in batch:  # type: ignore[operator]
            for spans in batch[column]:  # type: ignore[index]
                list(spans)


def _slots(folder: Path) -> list[tuple[str, str, int]]:
    """(file, dtype, position) of every value a mutation may change: each
    ``<u8`` of the offset and span tables, each token's metadata id."""
    slots = []
    for name in sorted(p.name for p in folder.iterdir()):
        if name.endswith((".docs", ".meta.index", ".meta.spans")):
            count = (folder / name).stat().st_size // 8
            slots += [(name, "<u8", i) for i in range(count)]
    with stream.open_dataset(folder) as ds:
        dtype = ds.manifest.record_dtype
    for name in sorted(p.name for p in folder.iterdir() if p.name.endswith(".tokens")):
        count = (folder / name).stat().st_size // dtype.itemsize
        slots += [(name, "meta_id", i) for i in range(count)]
    return slots


def _poke(folder: Path, slot: tuple[str, str, int], value: int) -> None:
    name, kind, position = slot
    if kind == "meta_id":
        with stream.open_dataset(folder) as ds:
            dtype = ds.manifest.record_dtype
        records = np.memmap(folder / name, dtype=dtype, mode="r+")
        records["meta_id"][position] = value % 2**32
    else:
        records = np.memmap(folder / name, dtype=kind, mode="r+")
        records[position] = value % 2**64
    records.flush()
    del records


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_verify_passes_only_what_every_read_accepts(
    pristine: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    folder = Path(shutil.copytree(pristine, tmp_path_factory.mktemp("m") / "ds"))
    slots = _slots(folder)
    for _ in range(data.draw(st.integers(1, 3))):
        slot = data.draw(st.sampled_from(slots))
        name, kind, position = slot
        old = int(np.fromfile(folder / name, dtype="<u8")[position]) if kind == "<u8" else 0
        _poke(folder, slot, data.draw(st.one_of(
            st.sampled_from(_BOUNDARY), st.integers(max(0, old - 3), old + 3))))
    reseal(folder)
    problems = stream.verify(folder)
    if problems:
        return
    try:
        _read_all(folder)
    except Exception as error:  # anything a read raises is a false pass
        pytest.fail(f"verify passed a dataset whose read fails: {type(error).__name__}: {error}")


def test_span_kind_past_int64_is_found_by_verify(tmp_path: Path) -> None:
    """A version-2 span row whose kind is >= 2**63, checksums consistent: every
    read rejects it, so verify must too (it once compared the kind as int64)."""
    folder = _write(tmp_path / "ds", "msgpack")
    rows = np.memmap(folder / "00000.meta.spans", dtype="<u8", mode="r+").reshape(-1, 3)
    rows[0, 2] = 2**63
    rows.flush()
    del rows
    reseal(folder)
    problems = stream.verify(folder)
    assert [(Path(p.path).name, p.field) for p in problems] == [("00000.meta.spans", "rows")]
    assert "kind" in problems[0].message
    with pytest.raises(FormatError) as info:
        _read_all(folder)
    assert info.value.path is not None and info.value.path.endswith("00000.meta.spans")
    assert info.value.field == "rows"
