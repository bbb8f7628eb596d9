"""LocalStorage, both methods: batched reads into caller buffers, short reads, maps, close."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zerobatch.storage import LocalStorage


@pytest.fixture(params=["pread", "mmap"])
def storage(tmp_path: Path, request: pytest.FixtureRequest) -> LocalStorage:
    (tmp_path / "a").write_bytes(bytes(range(256)))
    (tmp_path / "b").write_bytes(b"xyz")
    (tmp_path / "empty").write_bytes(b"")
    return LocalStorage(tmp_path, method=request.param)


def test_read_into(storage: LocalStorage) -> None:
    a, b = storage.open("a"), storage.open("b")
    assert storage.open("a") == a
    buffer = np.zeros(10, dtype=np.uint8)
    short = storage.read_into(np.array([a, b, a]), np.array([250, 1, 0]), np.array([6, 2, 2]),
                              buffer, np.array([0, 6, 8]))
    assert short == -1
    assert buffer.tobytes() == bytes(range(250, 256)) + b"yz" + bytes([0, 1])


def test_short_read_reported(storage: LocalStorage) -> None:
    b = storage.open("b")
    buffer = np.zeros(8, dtype=np.uint8)
    assert storage.read_into(np.array([b, b]), np.array([0, 2]), np.array([1, 4]), buffer,
                             np.array([0, 1])) == 1
    with pytest.raises(ValueError, match="does not fit"):
        storage.read_into(np.array([b]), np.array([0]), np.array([9]), buffer, np.array([0]))


def test_readinto_map_size_close(storage: LocalStorage) -> None:
    handle = storage.open("a")
    buffer = bytearray(8)
    assert storage.readinto(handle, 252, buffer) == 4
    assert bytes(buffer[:4]) == bytes(range(252, 256))
    assert storage.map("a")[10] == 10
    assert storage.map("empty").size == 0
    assert storage.size("b") == 3
    with pytest.raises(FileNotFoundError):
        storage.size("missing")
    storage.close()
    storage.close()
    with pytest.raises(OSError):
        storage.readinto(handle, 0, buffer)


def test_read_into_after_close_and_empty_file(storage: LocalStorage) -> None:
    a, empty = storage.open("a"), storage.open("empty")
    buffer = np.zeros(4, dtype=np.uint8)
    assert storage.read_into(np.array([empty]), np.array([0]), np.array([0]), buffer,
                             np.array([0])) == -1
    assert storage.read_into(np.array([empty]), np.array([0]), np.array([1]), buffer,
                             np.array([0])) == 0
    storage.close()
    with pytest.raises(OSError, match="not open"):
        storage.read_into(np.array([a]), np.array([0]), np.array([2]), buffer, np.array([0]))


def test_pread_survives_a_file_shrinking_under_it(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(bytes(range(200)))
    storage = LocalStorage(tmp_path)
    handle = storage.open("f")
    with open(tmp_path / "f", "r+b") as file:
        file.truncate(100)  # another process rewriting in place: reads come back short
    buffer = np.zeros(50, dtype=np.uint8)
    reads = (np.array([handle, handle]), np.array([0, 120]), np.array([10, 40]))
    assert storage.read_into(*reads, buffer, np.array([0, 10])) == 1
    assert buffer[:10].tolist() == list(range(10))


def test_unknown_method(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'pread' or 'mmap'"):
        LocalStorage(tmp_path, method="direct")  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["pread", "mmap"])
def test_many_files_keep_their_handles(tmp_path: Path, method: str) -> None:
    for i in range(40):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 3)
    storage = LocalStorage(tmp_path, method=method)  # type: ignore[arg-type]
    handles = np.array([storage.open(f"f{i}") for i in range(40)])
    assert sorted(set(handles.tolist())) == list(range(40))
    buffer = np.zeros(40, dtype=np.uint8)
    assert storage.read_into(handles, np.full(40, 2), np.ones(40, dtype=np.int64), buffer,
                             np.arange(40)) == -1
    assert buffer.tolist() == list(range(40))
    storage.close()
