"""LocalStorage, both methods: batched reads into caller buffers, short reads, maps, close;
``method="auto"`` and the mountinfo parser it resolves with."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_stream_helpers import random_corpus, write

from zerobatch import stream
from zerobatch.storage import LocalStorage
from zerobatch.storage import local as local_storage
from zerobatch.storage.local import (
    MAP_FROM,
    MOUNTINFO,
    file_system_type,
    is_network,
    resolve_method,
)


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
    storage = LocalStorage(tmp_path, method="pread")
    handle = storage.open("f")
    with open(tmp_path / "f", "r+b") as file:
        file.truncate(100)  # another process rewriting in place: reads come back short
    buffer = np.zeros(50, dtype=np.uint8)
    reads = (np.array([handle, handle]), np.array([0, 120]), np.array([10, 40]))
    assert storage.read_into(*reads, buffer, np.array([0, 10])) == 1
    assert buffer[:10].tolist() == list(range(10))


_TRUNCATE_WHILE_MAPPED = """
import sys
import numpy as np
from pathlib import Path
from zerobatch.storage import LocalStorage
folder = Path(sys.argv[1])
size = int(sys.argv[2])
(folder / "f").write_bytes(bytes(size))
storage = LocalStorage(folder, method="mmap")
handle = storage.open("f")
with open(folder / "f", "r+b") as file:
    file.truncate(4096)
buffer = np.zeros(8, dtype=np.uint8)
print(storage.read_into(np.array([handle]), np.array([size - 8]), np.array([8]), buffer,
                        np.array([0])))
"""


def test_mmap_dies_of_a_file_truncated_while_mapped(tmp_path: Path) -> None:
    """The trade-off ``method="pread"`` exists for: a mapped read past the new end
    of a file truncated in place kills the process (SIGBUS), as with np.memmap."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_MAPPED, str(tmp_path),
                             str(MAP_FROM)], capture_output=True, env=env)
    assert result.returncode == -signal.SIGBUS, result.stderr.decode()
    # A file under MAP_FROM is read by pread even so: the read comes back short.
    result = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_MAPPED, str(tmp_path),
                             str(MAP_FROM - 4096)], capture_output=True, env=env, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "0"  # the first short request


def test_small_files_are_read_without_a_mapping(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``method="mmap"``, files under ``MAP_FROM`` bytes are read by pread
    (address 0 in ``files()``), larger ones through their mapping, in one batch."""
    monkeypatch.setattr(local_storage, "MAP_FROM", 1024)
    (tmp_path / "small").write_bytes(bytes(range(256)) * 3)  # 768 bytes
    (tmp_path / "big").write_bytes(bytes(range(255, -1, -1)) * 4)  # 1,024 bytes
    storage = LocalStorage(tmp_path, method="mmap")
    small, big = storage.open("small"), storage.open("big")
    files, use_pread = storage.files()
    assert not use_pread
    assert files.addresses[small] == 0 and files.maps[small] is None
    assert files.addresses[big] != 0 and files.maps[big] is not None
    buffer = np.zeros(12, dtype=np.uint8)
    short = storage.read_into(np.array([small, big, small, big]), np.array([510, 1020, 0, 0]),
                              np.array([4, 4, 2, 2]), buffer, np.array([0, 4, 8, 10]))
    assert short == -1
    assert buffer.tolist() == [254, 255, 0, 1, 3, 2, 1, 0, 0, 1, 255, 254]
    assert storage.read_into(np.array([small]), np.array([766]), np.array([4]), buffer,
                             np.array([0])) == 0  # past the end: short, as with a mapping


def _descriptors_into(folder: Path) -> int:
    """This process's open descriptors on files under ``folder`` (not every
    descriptor: another test's files may be closed meanwhile, by a finalizer)."""
    prefix = os.path.join(os.path.realpath(folder), "")
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(prefix)
        except OSError:  # closed between the listing and the link
            continue
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_a_mapped_file_keeps_no_descriptor_of_ours(tmp_path: Path) -> None:
    """A mapping holds its file: the descriptor it was made from is closed
    (only Python's own copy, before 3.13, stays), so a mixture of thousands of
    datasets is not bounded by RLIMIT_NOFILE; readinto reads the mapping."""
    data = bytes((i * 7) % 256 for i in range(MAP_FROM + 100))
    for i in range(8):
        (tmp_path / f"big{i}").write_bytes(data)
    storage = LocalStorage(tmp_path, method="mmap")
    assert _descriptors_into(tmp_path) == 0
    handles = [storage.open(f"big{i}") for i in range(8)]
    kept = 0 if sys.version_info >= (3, 13) else 1  # Python's mmap duplicates it before 3.13
    assert _descriptors_into(tmp_path) == 8 * kept
    files, _ = storage.files()
    assert all(files.fds[h] == -1 and files.maps[h] is not None for h in handles)
    buffer = bytearray(16)
    assert storage.readinto(handles[3], MAP_FROM + 90, buffer) == 10
    assert bytes(buffer[:10]) == data[MAP_FROM + 90:]
    assert storage.readinto(handles[3], len(data) + 5, buffer) == 0
    with pytest.raises(OSError, match="negative offset"):
        storage.readinto(handles[3], -1, buffer)
    out = np.zeros(4, dtype=np.uint8)
    assert storage.read_into(np.array([handles[0]]), np.array([5]), np.array([4]), out,
                             np.array([0])) == -1
    assert out.tobytes() == data[5:9]
    storage.close()  # the descriptors closed at mapping are not closed again
    assert _descriptors_into(tmp_path) == 8 * kept  # Python's copies go with the mappings


_OUT_OF_DESCRIPTORS = """
import os, resource, sys
import numpy as np
from zerobatch.storage import LocalStorage
folder, room = sys.argv[1], int(sys.argv[2])
used = max(int(name) for name in os.listdir("/proc/self/fd")) + 1
# lowering the hard limit needs no privilege: the test runs under any limits
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 20, used + room))
storage = LocalStorage(folder, method="pread")
try:
    handles = [storage.open(f"f{i}") for i in range(60)]
except OSError as error:
    print("error", error)
else:
    buffer = np.zeros(60, dtype=np.uint8)
    storage.read_into(np.array(handles), np.zeros(60, dtype=np.int64), np.ones(60, np.int64),
                      buffer, np.arange(60))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print("read", buffer.tolist() == list(range(60)), soft == hard == used + room)
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux descriptor limits")
def test_out_of_descriptors_raises_the_soft_limit_or_says_what_to_do(tmp_path: Path) -> None:
    """A soft RLIMIT_NOFILE (1,024 on many systems) below what a many-source
    job opens is raised up to the hard limit, and the reads go on; at the hard
    limit, the error names the limit and the fix."""
    for i in range(60):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 3)
    run = subprocess.run([sys.executable, "-c", _OUT_OF_DESCRIPTORS, str(tmp_path), "200"],
                         capture_output=True, text=True, check=True)
    assert run.stdout.startswith("read True True"), run.stdout + run.stderr
    run = subprocess.run([sys.executable, "-c", _OUT_OF_DESCRIPTORS, str(tmp_path), "20"],
                         capture_output=True, text=True, check=True)
    assert run.stdout.startswith("error [Errno 24] too many open files: this process may "
                                 "hold "), run.stdout + run.stderr
    assert "RLIMIT_NOFILE" in run.stdout and "ulimit -n" in run.stdout
    assert str(tmp_path / "f") in run.stdout


def _table_size() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("FDSize:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(),
                    reason="reads FDSize from /proc/self/status")
def test_reserve_descriptors_grows_the_table_once() -> None:
    """Before a mixture's first batch opens hundreds of files, the descriptor
    table grows at once to hold them (one RCU grace period in a threaded
    process, where doubling table by table waits for several); under 64
    files, or past RLIMIT_NOFILE, nothing happens and nothing raises."""
    from zerobatch.storage.local import reserve_descriptors

    before = _table_size()
    reserve_descriptors(10)
    assert _table_size() == before
    probe = os.open(os.devnull, os.O_RDONLY)
    os.close(probe)
    reserve_descriptors(before + 300)
    assert _table_size() >= probe + before + 300
    grown = _table_size()
    reserve_descriptors(200)  # already room: no growth
    assert _table_size() == grown
    reserve_descriptors(1 << 40)  # past any limit: EINVAL, ignored
    assert len(os.listdir("/proc/self/fd")) < grown  # the probes were closed


@pytest.mark.skipif(not Path("/proc/self/status").exists(),
                    reason="reads FDSize from /proc/self/status")
def test_reserve_descriptors_soon_grows_the_table_in_a_thread() -> None:
    """A mixture of many local sources grows the table in a daemon thread
    while it is built; under 64 files no thread starts."""
    import threading

    from zerobatch.storage.local import reserve_descriptors_soon

    def growers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "zerobatch-descriptors"]

    for thread in growers():
        thread.join()
    reserve_descriptors_soon(63)
    assert growers() == []
    wanted = _table_size() + 500
    reserve_descriptors_soon(wanted)
    for thread in growers():
        thread.join(timeout=30)
    assert _table_size() >= wanted


def test_unknown_method(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="method must be one of 'auto', 'pread', 'mmap', "
                                         "got 'direct'"):
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


# Crafted /proc/self/mountinfo text: ID, parent, dev, root, MOUNT POINT, options,
# optional fields, "-", TYPE, source, super options.
CRAFTED = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:40 / /data rw,relatime shared:5 - nfs4 server:/export rw,vers=4.2
41 40 0:41 / /data/local rw,relatime - xfs /dev/sdb1 rw
42 27 0:42 / /mnt/my\\040disk rw - ext4 /dev/sdc1 rw
43 27 0:43 / /mnt/bucket rw,nosuid master:7 shared:8 - fuse.gcsfuse bucket rw
44 27 0:44 / /datasets rw - tmpfs tmpfs rw
45 44 0:45 / /datasets rw - cifs //host/share rw
not a mountinfo line
"""


@pytest.mark.parametrize(("path", "kind"), [
    ("/home/me/ds", "ext4"),
    ("/", "ext4"),
    ("/data", "nfs4"),
    ("/data/shards/00000.tokens", "nfs4"),
    ("/data/local/ds", "xfs"),  # a mount nested in another: the longest mount point
    ("/data/localized", "nfs4"),  # a prefix of the name, not a parent folder
    ("/mnt/my disk/ds", "ext4"),  # \\040 in the mount point is a space
    ("/mnt/my\\040disk/ds", "ext4"),  # no such folder: only the root mount holds it
    ("/mnt/bucket/a", "fuse.gcsfuse"),  # optional fields before the separator
    ("/datasets/x", "cifs"),  # stacked on one mount point: the last line wins
])
def test_file_system_type_from_mountinfo(path: str, kind: str) -> None:
    assert file_system_type(path, CRAFTED) == kind


def test_file_system_type_of_no_mount() -> None:
    assert file_system_type("/data", "") is None
    assert file_system_type("/data", CRAFTED.splitlines()[1] + "\n") == "nfs4"
    assert file_system_type("/home", CRAFTED.splitlines()[1] + "\n") is None


def test_auto_is_pread_without_mountinfo(tmp_path: Path) -> None:
    """No mountinfo file (not Linux, or hidden): the safe method."""
    missing = tmp_path / "missing" / "mountinfo"
    assert resolve_method("auto", tmp_path, mountinfo=missing) == "pread"
    assert resolve_method("mmap", tmp_path, mountinfo=missing) == "mmap"


def test_auto_resolves_by_file_system(tmp_path: Path) -> None:
    """Each file system type of a mountinfo file picks its method; explicit ones stay."""
    mountinfo = tmp_path / "mountinfo"
    for kind, method in [("ext4", "mmap"), ("tmpfs", "mmap"), ("overlay", "mmap"),
                         ("nfs", "pread"), ("fuse.sshfs", "pread"), ("lustre", "pread")]:
        mountinfo.write_text(f"27 1 254:0 / / rw - {kind} /dev/x rw\n")
        assert resolve_method("auto", tmp_path, mountinfo=mountinfo) == method, kind
        assert resolve_method("pread", tmp_path, mountinfo=mountinfo) == "pread"
    mountinfo.write_text("")  # no mount holds the root: cannot tell
    assert resolve_method("auto", tmp_path, mountinfo=mountinfo) == "pread"


def _local_type(path: Path) -> str | None:
    try:
        return file_system_type(path.resolve(), Path(MOUNTINFO).read_text())
    except OSError:
        return None


def test_default_maps_on_a_local_file_system(tmp_path: Path) -> None:
    """``auto`` on the temporary folder, whatever file system holds it: mmap on a
    local one, pread on a network one or where the type cannot be read."""
    kind = _local_type(tmp_path)
    chosen = "pread" if kind is None or is_network(kind) else "mmap"
    storage = LocalStorage(tmp_path)
    assert storage.method == chosen, kind
    assert repr(storage) == f"LocalStorage({str(tmp_path)!r}, method={chosen!r})"
    assert LocalStorage(tmp_path, method="pread").method == "pread"
    # A copy keeps the method asked for, and resolves it again where it is loaded.
    assert pickle.loads(pickle.dumps(storage)).__reduce__()[0].keywords == {"method": "auto"}
    assert pickle.loads(pickle.dumps(storage)).method == chosen


def test_auto_reads_the_mount_table_once_a_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening many datasets on one file system parses the system's mount table
    once: later folders of that device reuse the answer (what 2,000 sources
    of a mixture each paid, ~0.4 ms); another table file is always read."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    chosen = LocalStorage(first).method
    reads: list[str] = []
    real = Path.read_text

    def counting(path: Path, *args: object, **kwargs: object) -> str:
        reads.append(str(path))
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting)
    assert LocalStorage(second).method == chosen
    assert resolve_method("auto", second) == chosen
    assert MOUNTINFO not in reads
    crafted = tmp_path / "mountinfo"
    crafted.write_text("27 1 254:0 / / rw - nfs4 server:/ rw\n")
    assert resolve_method("auto", second, mountinfo=crafted) == "pread"
    assert str(crafted) in reads


def test_default_reads_equal_both_methods(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every method reads the same, and so does ``mmap`` when some shards are
    under ``MAP_FROM`` (read by pread in the same batches as mapped ones)."""
    corpus = random_corpus(np.random.default_rng(9), docs=80, max_len=60)
    path = write(tmp_path / "ds", corpus, metadata=None, mask=False, shard_tokens=500)
    order = np.random.default_rng(1).permutation(len(stream.open_dataset(path).windows(16)))
    columns = ("input_ids", "labels", "position_ids")
    sizes = sorted(p.stat().st_size for p in path.glob("*.tokens"))
    assert sizes[0] < sizes[-1]
    got = {}
    for method in ("auto", "pread", "mmap", "mmap, the smallest shard by pread"):
        monkeypatch.setattr(local_storage, "MAP_FROM", sizes[-1] if "," in method else 0)
        storage = LocalStorage(path, method=method.split(",")[0])  # type: ignore[arg-type]
        ds = stream.open_dataset(path, storage=storage)
        batch = ds.windows(16, columns=columns).read(order)
        got[method] = {name: batch[name] for name in columns}
        whole = ds.windows(16, columns="all").read(order[:5])
        got[method]["records"] = whole["input_ids"]
        if "," in method:
            unmapped = [h for h in range(len(storage.files()[0].maps))
                        if storage.files()[0].maps[h] is None]
            assert 0 < len(unmapped) < len(storage.files()[0].maps)
    for method in list(got)[1:]:
        for name, values in got["auto"].items():
            np.testing.assert_array_equal(values, got[method][name], err_msg=f"{method} {name}")
    assert len(order) > 30


def test_borrowed_views_contiguous_arguments_and_passes_strided_ones() -> None:
    """``borrowed``: a C-contiguous argument comes back as a view of the same
    memory (writes land in the caller's array), a strided one as itself; the
    values read through either are the caller's."""
    from zerobatch._jit import njit
    from zerobatch.storage.local import borrowed

    @njit
    def fill_rows(array: np.ndarray) -> float:
        view = borrowed(array)
        total = 0.0
        for i in range(view.shape[0]):
            for j in range(view.shape[1]):
                total += view[i, j]
                view[i, j] = -1.0
        return total

    whole = np.arange(24, dtype=np.float64).reshape(4, 6)
    assert fill_rows(whole) == float(np.arange(24).sum())
    assert (whole == -1.0).all()
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    strided = base[:, 1:5]  # not C-contiguous: passed as it is
    expected = float(strided.sum())
    assert fill_rows(strided) == expected
    assert (base[:, 1:5] == -1.0).all() and (base[:, [0, 5]] != -1.0).all()
