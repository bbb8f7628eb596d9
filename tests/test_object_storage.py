"""ObjectStorage against a real S3 endpoint (moto on loopback), with and without faults."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
from pathlib import Path

import numpy as np
import obstore
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobatch import StorageError
from zerobatch.storage import LocalStorage, ObjectStorage, open_storage

SIZES = {"a.bin": 70_000, "b.bin": 3_000, "empty.bin": 0}


@pytest.fixture(scope="module")
def remote(s3, tmp_path_factory):
    """The same three files in a local folder and under an s3:// prefix."""
    folder = tmp_path_factory.mktemp("objects")
    rng = np.random.default_rng(0)
    url = s3.url("objects")
    storage = ObjectStorage(url, **s3.storage_options())
    for name, size in SIZES.items():
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        (folder / name).write_bytes(data)
        obstore.put(storage.store, storage.key(name), data)
    storage.close()
    return folder, url


def _requests(handles, sizes, rng, n):
    h = rng.integers(0, len(handles), n)
    lengths = rng.integers(0, 600, n)
    offsets = np.array([rng.integers(0, max(sizes[i] - lengths[j], 0) + 1)
                        for j, i in enumerate(h)], dtype=np.int64)
    lengths = np.minimum(lengths, np.array([sizes[i] for i in h]) - offsets)
    destinations = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return (np.asarray(handles, dtype=np.int64)[h], offsets, lengths.astype(np.int64),
            destinations, int(lengths.sum()))


def _read_both(local, remote_storage, names, seed, n=40):
    sizes = [SIZES[name] for name in names]
    out = []
    for storage in (local, remote_storage):
        rng = np.random.default_rng(seed)
        handles = [storage.open(name) for name in names]
        h, offsets, lengths, destinations, total = _requests(handles, sizes, rng, n)
        buffer = np.zeros(total, dtype=np.uint8)
        assert storage.read_into(h, offsets, lengths, buffer, destinations) == -1
        out.append(buffer)
    return out


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), coalesce=st.sampled_from([0, 64, 1 << 20]))
def test_read_into_matches_local(remote, s3, seed, coalesce):
    folder, url = remote
    local = LocalStorage(folder)
    storage = ObjectStorage(url, coalesce=coalesce, **s3.storage_options())
    a, b = _read_both(local, storage, ["a.bin", "b.bin", "empty.bin"], seed)
    assert np.array_equal(a, b)


def test_size_open_readinto_map(remote, s3):
    folder, url = remote
    storage = open_storage(url, **s3.storage_options())
    assert isinstance(storage, ObjectStorage)
    assert storage.url == url
    assert {name: storage.size(name) for name in SIZES} == SIZES
    handle = storage.open("a.bin")
    assert storage.open("a.bin") == handle
    buffer = bytearray(100)
    assert storage.readinto(handle, 69_950, buffer) == 50
    assert bytes(buffer[:50]) == (folder / "a.bin").read_bytes()[69_950:]
    mapped = storage.map("b.bin")
    assert not mapped.flags.writeable
    assert mapped.tobytes() == (folder / "b.bin").read_bytes()
    assert storage.map("empty.bin").size == 0
    storage.close()
    storage.close()
    with pytest.raises(OSError, match="not open"):
        storage.readinto(handle, 0, buffer)


def test_past_the_end_is_short(remote, s3):
    _, url = remote
    storage = ObjectStorage(url, **s3.storage_options())
    handle = storage.open("b.bin")
    buffer = np.zeros(20, dtype=np.uint8)
    short = storage.read_into(np.array([handle, handle]), np.array([0, 2_995]),
                              np.array([10, 10]), buffer, np.array([0, 10]))
    assert short == 1


def test_missing_object_names_url(remote, s3):
    _, url = remote
    storage = ObjectStorage(url, **s3.storage_options())
    with pytest.raises(FileNotFoundError, match=f"{url}/nope.bin"):
        storage.open("nope.bin")


def test_environment_variables_configure_the_store(remote, s3, monkeypatch):
    folder, url = remote
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    storage = open_storage(url)
    assert storage.map("b.bin").tobytes() == (folder / "b.bin").read_bytes()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_missing_credentials_name_the_variables(remote, s3, monkeypatch):
    _, url = remote
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    options = s3.storage_options(retries=1)
    # no keys; the instance-metadata endpoint is a closed loopback port
    options["config"] = {"region": "us-east-1", "endpoint": s3.endpoint,
                         "metadata_endpoint": f"http://127.0.0.1:{_closed_port()}"}
    storage = ObjectStorage(url, **options)
    with pytest.raises(StorageError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        storage.size("a.bin")


def test_faults_at_20_percent_give_the_same_bytes(remote, s3, s3_proxy):
    folder, url = remote
    local = LocalStorage(folder)
    storage = ObjectStorage(url, coalesce=0, **s3.storage_options(s3_proxy.endpoint, retries=8))
    with s3_proxy.faults(0.2, delay=0.01):
        for seed in range(4):
            a, b = _read_both(local, storage, ["a.bin", "b.bin"], seed, n=12)
            assert np.array_equal(a, b)


def test_faults_at_100_percent_raise_storage_error(remote, s3, s3_proxy):
    _, url = remote
    storage = ObjectStorage(url, **s3.storage_options(s3_proxy.endpoint, retries=2))
    handle = storage.open("a.bin")
    buffer = np.zeros(30, dtype=np.uint8)
    with s3_proxy.faults(1.0, kinds=("503", "reset")), pytest.raises(StorageError) as info:
        storage.read_into(np.array([handle, handle]), np.array([100, 5_000]), np.array([10, 20]),
                          buffer, np.array([0, 10]))
    message = str(info.value)
    assert f"{url}/a.bin" in message and "bytes 100-5020" in message


def test_a_delay_past_the_timeout_raises(remote, s3, s3_proxy):
    _, url = remote
    storage = ObjectStorage(url, **s3.storage_options(s3_proxy.endpoint, retries=1, timeout=0.2))
    handle = storage.open("b.bin")
    with s3_proxy.faults(1.0, kinds=("delay",), delay=0.5), pytest.raises(StorageError):
        storage.readinto(handle, 0, bytearray(10))


def test_open_storage_picks_the_storage(tmp_path: Path):
    assert isinstance(open_storage(tmp_path), LocalStorage)
    local = open_storage(f"file://{tmp_path}", method="mmap")
    assert isinstance(local, LocalStorage) and local.root == tmp_path
    with pytest.raises(ValueError, match="unsupported URL scheme 'http'"):
        open_storage("http://example.invalid/data")
    with pytest.raises(ValueError, match="names no bucket"):
        open_storage("s3:///data")
    with pytest.raises(ValueError, match="bad storage_options"):
        open_storage("s3://bucket/data", config={"no_such_key": 1})


def test_a_storage_passed_as_the_path_says_to_pass_it_as_storage(tmp_path: Path):
    from zerobatch import open_dataset

    with pytest.raises(TypeError, match=r"got LocalStorage .*storage="):
        open_dataset(LocalStorage(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a str or os\.PathLike path or URL, got int"):
        open_storage(3)  # type: ignore[arg-type]


def test_pickles_as_url_and_options(remote, s3, tmp_path):
    folder, url = remote
    storage = ObjectStorage(url, coalesce=64, block_size=64, cache_dir=tmp_path,
                            **s3.storage_options())
    storage.open("a.bin")
    copy = pickle.loads(pickle.dumps(storage))
    assert copy is not storage and copy.url == url and copy.blocks.block_size == 64
    assert copy.map("b.bin").tobytes() == (folder / "b.bin").read_bytes()
    [got] = copy.blocks.read([("a.bin", 60, 200)])
    assert got.tobytes() == (folder / "a.bin").read_bytes()[60:200]
    local = pickle.loads(pickle.dumps(LocalStorage(folder, method="mmap")))
    assert repr(local) == repr(LocalStorage(folder, method="mmap"))


def _list_in_child(storage, results):
    try:
        storage.names()
        results.put("listed")
    except StorageError as error:
        results.put(str(error))


def test_a_forked_child_raises_instead_of_hanging(remote, s3):
    _, url = remote
    storage = ObjectStorage(url, **s3.storage_options())
    storage.names()  # obstore has run in this process
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_list_in_child, args=(storage, results))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert "multiprocessing_context='spawn'" in results.get(timeout=5)


def test_block_cache_checks_its_options_and_ranges(remote, s3):
    _, url = remote
    options = s3.storage_options()
    for key, value, message in (("block_size", 12, "multiple of 8"),
                                ("block_size", 0, "block_size must be an int >= 8"),
                                ("cache_bytes", -1, "cache_bytes must be an int >= 0"),
                                ("cache_dir_bytes", 1.5, "cache_dir_bytes must be an int")):
        with pytest.raises(ValueError, match=message):
            ObjectStorage(url, **{key: value}, **options)
    storage = ObjectStorage(url, block_size=64, cache_bytes=0, **options)
    with pytest.raises(ValueError, match=f"bytes 2990-3010 are outside {url}/b.bin"):
        storage.blocks.read([("b.bin", 2990, 3010)])
    assert [len(b) for b in storage.blocks.read([("b.bin", 0, 0), ("b.bin", 63, 129)])] == [0, 66]
    assert storage.blocks._held == 0


def test_plain_http_endpoint_without_allow_http_names_the_fix(s3, monkeypatch):
    """Issue 26: obstore's bare 'builder error' becomes a message that says to allow http."""
    from zerobatch.errors import StorageError
    from zerobatch.storage import open_storage

    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    options = s3.storage_options()
    options["client_options"] = {k: v for k, v in options["client_options"].items()
                                 if k != "allow_http"}
    storage = open_storage(s3.url("http"), **options)
    with pytest.raises(StorageError, match=r"plain http.*AWS_ALLOW_HTTP=true.*allow_http"):
        storage.names()
