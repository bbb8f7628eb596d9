from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobatch import FormatError
from zerobatch.batch_format import HEADER_SIZE, BatchHeader, read_header
from zerobatch.batch_loader import BatchFileReader, BatchNativeLoader
from zerobatch.batch_writer import write_batch_dataset, write_batch_file
from zerobatch.loader import Loader
from zerobatch.shuffle import Feistel

TMP = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _records(n: int, seq_len: int, *, high: int = 2**32, seed: int = 0) -> np.ndarray:
    """Records whose first two tokens encode their index, so every row is unique."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, high, size=(n, seq_len), dtype=np.uint64)
    rows[:, 0] = np.arange(n) % high
    if seq_len > 1:
        rows[:, 1] = np.arange(n) // high
    return rows.astype(np.uint32 if high > 2**16 else np.uint16)


def _write(
    tmp_path: Path, n: int = 200, bs: int = 8, seq: int = 16, **kw: object
) -> tuple[Path, np.ndarray]:
    tokens = _records(n, seq, high=2**31)  # int32 views need ids < 2**31, like any vocabulary
    path = tmp_path / "d.batch"
    write_batch_file(path, tokens, bs, seq, 7, **kw)  # type: ignore[arg-type]
    return path, tokens


# ---------------------------------------------------------------- byte layout


def test_header_bytes_at_documented_offsets(tmp_path: Path) -> None:
    path, _ = _write(tmp_path, n=100, bs=8, seq=16)
    raw = path.read_bytes()
    assert raw[0:8] == b"LLMBATCH"
    assert struct.unpack_from("<I", raw, 8)[0] == 1
    assert struct.unpack_from("<I", raw, 12)[0] == 8
    assert struct.unpack_from("<I", raw, 16)[0] == 16
    assert struct.unpack_from("<Q", raw, 20)[0] == 12
    assert struct.unpack_from("<I", raw, 28)[0] == 0
    assert struct.unpack_from("<I", raw, 32)[0] == 7
    assert struct.unpack_from("<I", raw, 36)[0] == 100
    assert raw[40:4096] == bytes(4056)
    # 8 x 16 x 4 = 512 raw bytes, padded to one page per batch
    assert len(raw) == 4096 + 12 * 4096
    for i in range(12):
        slot = raw[4096 + i * 4096 : 4096 + (i + 1) * 4096]
        assert slot[512:] == bytes(4096 - 512), "slot padding must be zeros"


def test_spec_file_size_formula() -> None:
    header = BatchHeader(32, 512, 104829 // 32, 0, 42, 104829)
    assert header.num_batches == 3275
    assert header.padded_batch_bytes == 65536
    # The seed prints 214,643,796, a slip: 4096 + 3275 * 65536 is 214,634,496.
    assert header.file_size == 4096 + 3275 * 65536 == 214_634_496


def test_batch_i_holds_the_feistel_slots(tmp_path: Path) -> None:
    path, tokens = _write(tmp_path, n=203, bs=8, seq=16)
    perm = Feistel(203, 7)
    raw = path.read_bytes()
    for batch in range(203 // 8):
        data = np.frombuffer(raw, "<u4", count=8 * 16, offset=4096 + batch * 4096).reshape(8, 16)
        wanted = perm.inverse(np.arange(batch * 8, batch * 8 + 8))
        assert np.array_equal(data, tokens[wanted])


@given(
    n=st.integers(1, 300),
    bs=st.integers(1, 40),
    seq=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    chunked=st.booleans(),
)
@TMP
def test_writers_agree_and_keep_each_record_once(
    tmp_path: Path, n: int, bs: int, seq: int, seed: int, chunked: bool
) -> None:
    if n < bs:
        return
    tokens = _records(n, seq, seed=seed)
    a, b = tmp_path / "a.batch", tmp_path / "b.batch"
    assert write_batch_file(a, tokens, bs, seq, seed) == n // bs
    items = [tokens[i : i + 7] for i in range(0, n, 7)] if chunked else list(tokens)
    assert write_batch_dataset(b, iter(items), n, bs, seq, seed) == n // bs
    assert a.read_bytes() == b.read_bytes()
    with BatchFileReader(a) as reader:
        got = np.concatenate([reader.read_batch(i) for i in range(reader.num_batches)])
    assert len(got) == (n // bs) * bs
    index = (
        got[:, 0].astype(np.int64)
        if seq == 1
        else got[:, 0].astype(np.int64) + got[:, 1].astype(np.int64) * 2**32
    )
    if seq > 1:
        assert len(np.unique(index)) == len(got), "a record appears twice"
        assert np.array_equal(tokens[index], got)


def test_uint16_halves_the_file_and_reads_back(tmp_path: Path) -> None:
    tokens = _records(256, 256, high=2**16)
    path32, path16 = tmp_path / "a.batch", tmp_path / "b.batch"
    write_batch_file(path32, tokens, 16, 256, 1)
    write_batch_file(path16, tokens, 16, 256, 1, dtype="uint16")
    assert read_header(path16).dtype == 1
    with BatchFileReader(path32) as r32, BatchFileReader(path16) as r16:
        assert r16.dtype == np.uint16
        assert r16.padded_batch_bytes * 2 == r32.padded_batch_bytes
        for i in range(r32.num_batches):
            assert np.array_equal(r32.read_batch(i), r16.read_batch(i))
            assert torch.equal(r32.read_batch_torch(i), r16.read_batch_torch(i))
            assert torch.equal(
                r16.read_batch_torch(i, torch.int32), r32.read_batch_torch(i, torch.int32)
            )


# ---------------------------------------------------------------- writer errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be"),
        ({"seq_len": 15}, r"shape \(records, seq_len=15\)"),
        ({"seed": -1}, "seed must be an int in"),
        ({"seed": 2**32}, "seed must be"),
        ({"batch_size": 500}, "fewer than batch_size"),
        ({"dtype": "int8"}, "dtype must be uint32 or uint16"),
    ],
)
def test_writer_rejects_bad_arguments(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"batch_size": 8, "seq_len": 16, "seed": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        write_batch_file(tmp_path / "x.batch", _records(100, 16), **args)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_tokens_that_do_not_fit(tmp_path: Path) -> None:
    tokens = _records(64, 16, high=2**16).astype(np.int64)
    tokens[37, 3] = 70_000
    with pytest.raises(ValueError, match="token 70000 in record 37"):
        write_batch_file(tmp_path / "x.batch", tokens, 8, 16, 1, dtype="uint16")
    tokens[37, 3] = -4
    with pytest.raises(ValueError, match="token -4 in record 37"):
        write_batch_file(tmp_path / "x.batch", tokens, 8, 16, 1)
    with pytest.raises(ValueError, match="must be integers"):
        write_batch_file(tmp_path / "x.batch", tokens.astype(np.float32), 8, 16, 1)


def test_streaming_writer_count_mismatch_leaves_previous_file(tmp_path: Path) -> None:
    path, _ = _write(tmp_path, n=64, bs=8, seq=16)
    before = path.read_bytes()
    tokens = _records(64, 16)
    with pytest.raises(ValueError, match="yielded 64 records, but total_records=65"):
        write_batch_dataset(path, iter(tokens), 65, 8, 16, 1)
    with pytest.raises(ValueError, match="more than total_records=63"):
        write_batch_dataset(path, iter(tokens), 63, 8, 16, 1)
    with pytest.raises(ValueError, match=r"item 0 of tokens_iter has shape \(17,\)"):
        write_batch_dataset(path, iter([np.zeros(17)]), 8, 8, 16, 1)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.batch"]


# ---------------------------------------------------------------- reader


def test_read_batch_is_a_read_only_view(tmp_path: Path) -> None:
    path, _ = _write(tmp_path)
    with BatchFileReader(path) as reader:
        a = reader.read_batch(3)
        assert a.shape == (8, 16) and a.dtype == np.dtype("<u4")
        assert not a.flags.writeable
        assert np.shares_memory(a, reader.read_batch(3))
        assert np.array_equal(reader.read_batch(-1), reader.read_batch(reader.num_batches - 1))
        with pytest.raises(IndexError, match="batch index 25 is out of range for 25 batches"):
            reader.read_batch(25)
        with pytest.raises(IndexError):
            reader.read_batch_torch(-26)
    with pytest.raises(ValueError, match="closed"):
        reader.read_batch(0)
    reader.close()  # idempotent
    assert a.sum() >= 0  # views outlive close


def test_int32_torch_is_zero_copy_writable_and_private(tmp_path: Path) -> None:
    path, _ = _write(tmp_path)
    with BatchFileReader(path) as reader:
        expected = reader.read_batch(2).astype(np.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            t = reader.read_batch_torch(2, dtype=torch.int32)
        assert t.dtype == torch.int32 and t.shape == (8, 16)
        again = reader.read_batch_torch(2, dtype=torch.int32)
        assert t.data_ptr() == again.data_ptr(), "int32 reads must not copy"
        t[0, 0] = -1
        assert int(again[0, 0]) == -1  # same private pages
        assert int(reader.read_batch(2)[0, 0]) == expected[0, 0]  # the shared view is untouched
        reader.discard_private_writes()
        assert torch.equal(
            reader.read_batch_torch(2, torch.int32).long(), torch.from_numpy(expected)
        )
        with pytest.raises(ValueError, match=r"^dtype must be one of 'int64', 'int32' \("):
            reader.read_batch_torch(0, torch.float32)
    with BatchFileReader(path) as fresh:
        assert int(fresh.read_batch(2)[0, 0]) == expected[0, 0], "writes must never reach the file"


# ---------------------------------------------------------------- hostile files


def _corrupt(path: Path, offset: int, fmt: str, value: int) -> None:
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, offset, value)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "field", "message"),
    [
        (0, "<Q", 0x4843544142, "magic", "expected magic b'LLMBATCH'"),
        (8, "<I", 2, "version", "expected version 1, found 2"),
        (12, "<I", 0, "batch_size", "batch_size is 0"),
        (16, "<I", 0, "seq_len", "seq_len is 0"),
        (20, "<Q", 0, "num_batches", "num_batches is 0"),
        (20, "<Q", 26, "total_records", "need 208 records"),
        (36, "<I", 50, "total_records", "total_records is 50"),
        (28, "<I", 9, "dtype", "unknown dtype code 9"),
        (12, "<I", 2**32 - 1, "total_records", "need 107374182375 records"),
        (16, "<I", 2**32 - 1, "num_batches", "file seems not fully written"),
        (20, "<Q", 2**63, "total_records", "records"),
    ],
)
def test_crafted_headers_raise_format_error(
    tmp_path: Path, offset: int, fmt: str, value: int, field: str, message: str
) -> None:
    path, _ = _write(tmp_path)
    _corrupt(path, offset, fmt, value)
    with pytest.raises(FormatError, match=message) as caught:
        BatchFileReader(path)
    assert caught.value.field == field
    assert str(path) in str(caught.value)


def test_num_batches_beyond_the_file_with_consistent_records(tmp_path: Path) -> None:
    path, _ = _write(tmp_path)
    _corrupt(path, 36, "<I", 10_000)
    _corrupt(path, 20, "<Q", 1000)
    with pytest.raises(FormatError, match=r"promises 1000 batches .* file seems not fully written"):
        BatchFileReader(path)


@pytest.mark.parametrize("cut", [0, 7, 100, 4095, 4096, 4096 + 100, -1])
def test_truncated_files(tmp_path: Path, cut: int) -> None:
    path, _ = _write(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[:cut])
    with pytest.raises(FormatError) as caught:
        BatchFileReader(path)
    assert "not fully written" in str(caught.value)


def test_trailing_bytes(tmp_path: Path) -> None:
    path, _ = _write(tmp_path)
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(FormatError, match="1 bytes after the last batch slot"):
        BatchFileReader(path)


@given(
    fields=st.tuples(
        st.integers(0, 3),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 3),
        st.integers(0, 2**32 - 1),
    ),
    extra=st.integers(0, 3 * 4096),
)
@TMP
def test_random_headers_never_crash(tmp_path: Path, fields: tuple[int, ...], extra: int) -> None:
    version, bs, seq, nb, dtype, total = fields
    header = struct.pack("<8sIIIQIII", b"LLMBATCH", version, bs, seq, nb, dtype, 0, total)
    path = tmp_path / "crafted.batch"
    path.write_bytes(header + bytes(HEADER_SIZE - len(header) + extra))
    try:
        reader = BatchFileReader(path)
    except FormatError:
        return
    with reader:  # a header that passed must describe this very file
        assert reader.read_batch(reader.num_batches - 1).size == reader.batch_size * reader.seq_len


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        BatchFileReader(tmp_path / "missing.batch")


# ---------------------------------------------------------------- shards


def test_sharded_dataset_reads_like_one_file(tmp_path: Path) -> None:
    tokens = _records(1000, 16)
    write_batch_file(tmp_path / "one.batch", tokens, 8, 16, 3)
    assert (
        write_batch_dataset(tmp_path / "shards", iter(tokens), 1000, 8, 16, 3, batches_per_shard=40)
        == 125
    )
    names = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert names == ["00000.batch", "00001.batch", "00002.batch", "00003.batch", "manifest.json"]
    with (
        BatchFileReader(tmp_path / "one.batch") as one,
        BatchFileReader(tmp_path / "shards") as many,
    ):
        assert many.num_batches == one.num_batches == 125
        assert many.total_records == 1000 and many.seed == 3
        for i in range(125):
            assert np.array_equal(one.read_batch(i), many.read_batch(i))
        assert torch.equal(
            one.read_batch_torch(77, torch.int32), many.read_batch_torch(77, torch.int32)
        )
    # rewriting replaces the folder atomically
    write_batch_dataset(
        tmp_path / "shards", iter(tokens[:800]), 800, 8, 16, 3, batches_per_shard=50
    )
    with BatchFileReader(tmp_path / "shards") as again:
        assert again.num_batches == 100


def test_shards_never_replace_a_folder_that_is_not_a_batch_dataset(tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")
    tokens = _records(64, 16)
    with pytest.raises(FileExistsError, match="not a batch dataset folder"):
        write_batch_dataset(tmp_path / "keep", iter(tokens), 64, 8, 16, 3, batches_per_shard=2)
    assert (tmp_path / "keep" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"], "no staging folder left behind"


def _shards(tmp_path: Path) -> Path:
    tokens = _records(400, 16)
    write_batch_dataset(tmp_path / "s", iter(tokens), 400, 8, 16, 3, batches_per_shard=20)
    return tmp_path / "s"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(format="other"), "expected format"),
        (lambda m: m.update(version=2), "expected version 1"),
        (lambda m: m.update(seq_len="16"), "expected a non-negative int"),
        (lambda m: m.update(dtype="float32"), "dtype must be uint32 or uint16"),
        (lambda m: m.update(shards=[]), "non-empty list"),
        (lambda m: m["shards"][0].update(name="../x.batch"), "plain '\\*.batch' file name"),
        (lambda m: m.update(seed=4), "shard header has seed=3, manifest says 4"),
        (lambda m: m.update(num_batches=51), "shards hold 50 batches, manifest says 51"),
        (lambda m: m["shards"][1].update(num_batches=19), "num_batches=20, manifest says 19"),
    ],
)
def test_corrupt_manifest(tmp_path: Path, edit: object, message: str) -> None:
    folder = _shards(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)  # type: ignore[operator]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=message):
        BatchFileReader(folder)


def test_manifest_not_json_and_missing_shard(tmp_path: Path) -> None:
    folder = _shards(tmp_path)
    (folder / "00001.batch").unlink()
    with pytest.raises(FormatError, match="cannot be opened"):
        BatchFileReader(folder)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        BatchFileReader(folder)


# ---------------------------------------------------------------- loader


def _loader_order(path: Path, **kw: object) -> list[int]:
    with BatchNativeLoader(path, output="numpy", **kw) as loader:  # type: ignore[arg-type]
        return [int(b[0, 0]) for b in loader]


def _batch_ids(path: Path) -> dict[int, int]:
    with BatchFileReader(path) as reader:
        return {int(reader.read_batch(i)[0, 0]): i for i in range(reader.num_batches)}


def test_loader_visits_every_batch_once_in_blocks(tmp_path: Path) -> None:
    path, _ = _write(tmp_path, n=8 * 103, bs=8, seq=16)
    ids = _batch_ids(path)
    orders = []
    for epoch in range(3):
        order = [ids[x] for x in _loader_order(path, block_size=10, epoch=epoch)]
        assert sorted(order) == list(range(103))
        starts = [i for i in range(103) if i == 0 or order[i] != order[i - 1] + 1]
        assert all(order[s] % 10 == 0 for s in starts), "blocks must be read in file order"
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]
    assert [ids[x] for x in _loader_order(path, shuffle=False)] == list(range(103))


@given(world=st.integers(1, 7), block=st.integers(1, 20), epoch=st.integers(0, 5))
@TMP
def test_ranks_partition_the_epoch(tmp_path: Path, world: int, block: int, epoch: int) -> None:
    path = tmp_path / "r.batch"
    if not path.exists():
        write_batch_file(path, _records(8 * 50, 4), 8, 4, 1)
    ids = _batch_ids(path)
    seen: list[int] = []
    for rank in range(world):
        got = [
            ids[x]
            for x in _loader_order(path, block_size=block, epoch=epoch, rank=rank, world_size=world)
        ]
        assert len(got) == 50 // world
        seen += got
    assert len(set(seen)) == len(seen) == 50 // world * world


@given(
    old_world=st.integers(1, 5),
    new_world=st.integers(1, 5),
    steps=st.integers(0, 12),
    dtype=st.sampled_from([None, torch.int32]),
)
@TMP
def test_exact_elastic_resume(
    tmp_path: Path, old_world: int, new_world: int, steps: int, dtype: torch.dtype | None
) -> None:
    path = tmp_path / "r.batch"
    if not path.exists():
        write_batch_file(path, _records(8 * 50, 4), 8, 4, 1)
    ids = _batch_ids(path)
    steps = min(steps, 50 // old_world - 1)  # mid-epoch: a finished epoch's state names the next
    received: list[int] = []
    state = None
    for rank in range(old_world):
        loader = BatchNativeLoader(
            path, block_size=4, epoch=2, rank=rank, world_size=old_world, dtype=dtype
        )
        iterator = iter(loader)
        for _ in range(steps):
            received.append(ids[int(next(iterator)[0, 0])])
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
    assert state is not None and state["consumed"] == steps * old_world
    for rank in range(new_world):
        loader = BatchNativeLoader(path, block_size=4, rank=rank, world_size=new_world, dtype=dtype)
        loader.load_state_dict(state)
        loader.set_epoch(2)  # the usual training loop calls this again: keeps the position
        received += [ids[int(b[0, 0])] for b in loader]
        loader.close()
    assert len(set(received)) == len(received), "a batch was yielded twice"
    assert len(received) >= 50 - new_world + 1, "more than the documented tail was dropped"
    full = [ids[x] for x in _loader_order(path, block_size=4, epoch=2)]
    assert set(full[: steps * old_world]) <= set(received)


def test_loader_state_mismatch_and_epoch_end(tmp_path: Path) -> None:
    path, _ = _write(tmp_path)
    loader = BatchNativeLoader(path, seed=1)
    with pytest.raises(ValueError, match="seed=2, this loader has 1"):
        loader.load_state_dict({**loader.state_dict(), "seed": 2})
    with pytest.raises(ValueError, match="consumed"):
        loader.load_state_dict({**loader.state_dict(), "consumed": 10**6})
    with pytest.raises(ValueError, match="version"):
        loader.load_state_dict({})
    assert len(list(loader)) == len(loader) == 25
    finished = loader.state_dict()
    assert (finished["epoch"], finished["consumed"]) == (1, 0), "a finished epoch names the next"
    assert len(list(loader)) == 25, "a finished epoch starts over when iterated again"
    resumed = BatchNativeLoader(path, seed=1)
    resumed.load_state_dict(finished)
    assert resumed.epoch == 1
    resumed.close()
    loader.set_epoch(1)
    assert loader.state_dict()["consumed"] == 0
    with pytest.raises(ValueError, match="rank"):
        BatchNativeLoader(path, rank=2, world_size=2)
    loader.close()


def test_int32_loader_edits_do_not_leak_into_the_next_epoch(tmp_path: Path) -> None:
    path, _ = _write(tmp_path)
    loader = BatchNativeLoader(path, dtype=torch.int32, shuffle=False)
    first = [b.clone() for b in loader]
    for b in loader:
        b.fill_(-1)  # a training loop masking tokens in place
    second = list(loader)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    loader.close()


@given(world=st.integers(1, 4), new_world=st.integers(1, 4), steps=st.integers(0, 11),
       native_first=st.booleans())
@TMP
def test_native_loader_and_loader_resume_each_other(
    tmp_path: Path, world: int, new_world: int, steps: int, native_first: bool
) -> None:
    """One state protocol: a BatchNativeLoader's state resumes a Loader over the
    same file's BatchFileReader and the reverse, also with another world_size."""
    path = tmp_path / "r.batch"
    if not path.exists():
        write_batch_file(path, _records(8 * 50, 4), 8, 4, 1)
    ids = _batch_ids(path)

    def native(rank: int, size: int) -> BatchNativeLoader:
        return BatchNativeLoader(path, block_size=4, seed=7, rank=rank, world_size=size,
                                 output="numpy")

    def loader(rank: int, size: int) -> tuple[Loader, BatchFileReader]:
        reader = BatchFileReader(path)
        return Loader(reader, 1, seed=7, block_size=4, rank=rank, world_size=size,
                      output="numpy", num_threads=0), reader

    steps = min(steps, 50 // world - 1)
    received: list[int] = []
    state = None
    for rank in range(world):
        if native_first:
            with native(rank, world) as first:
                batches = iter(first)
                received += [ids[int(next(batches)[0, 0])] for _ in range(steps)]
                state = first.state_dict()
        else:
            first_loader, reader = loader(rank, world)
            batches = iter(first_loader)
            received += [ids[int(next(batches)["tokens"][0, 0, 0])] for _ in range(steps)]
            state = first_loader.state_dict()
            first_loader.close()
            reader.close()
    state = json.loads(json.dumps(state))
    for rank in range(new_world):
        if native_first:
            then_loader, reader = loader(rank, new_world)
            then_loader.load_state_dict(state)
            received += [ids[int(b["tokens"][0, 0, 0])] for b in then_loader]
            reader.close()
        else:
            with native(rank, new_world) as then:
                then.load_state_dict(state)
                received += [ids[int(b[0, 0])] for b in then]
    assert len(set(received)) == len(received), "a batch was yielded twice"
    assert len(received) >= 50 - new_world + 1, "more than the documented tail was dropped"


def test_native_loader_refuses_another_files_state_and_loads_the_older_form(
    tmp_path: Path,
) -> None:
    first, _ = _write(tmp_path)
    other = tmp_path / "other.batch"
    write_batch_file(other, _records(200, 16, high=2**31, seed=1), 8, 16, 7)  # same shape and seeds
    loader = BatchNativeLoader(first, seed=1)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    with BatchNativeLoader(other, seed=1) as stranger, \
            pytest.raises(ValueError, match="fingerprint"):
        stranger.load_state_dict(state)
    for bad in (None, [], "state", 3):
        with pytest.raises(ValueError, match="must be a dict"):
            loader.load_state_dict(bad)  # type: ignore[arg-type]
    older = {"version": 1, "epoch": 0, "consumed": 3, "seed": 1, "block_size": 256,
             "shuffle": True, "num_batches": len(loader)}
    with BatchNativeLoader(first, seed=1) as resumed:
        resumed.load_state_dict(older)
        assert resumed.state_dict()["consumed"] == 3
        assert [b.tolist() for b in resumed] == [b.tolist() for b in batches]
        with pytest.raises(ValueError, match="seed"):
            resumed.load_state_dict({**older, "seed": 2})
    loader.close()


# ----------------------------------------------------------------- verify


def _batch_sources(root: Path) -> dict[str, Path]:
    """A uint32 file, a uint16 file and a shard folder, written by the writers."""
    tokens = np.arange(30 * 6, dtype=np.uint32).reshape(30, 6)
    write_batch_file(root / "a.batch", tokens, 4, 6, 3)
    write_batch_file(root / "b.batch", tokens[:9].astype(np.uint16), 2, 6, 1, dtype="uint16")
    write_batch_dataset(root / "s", iter(tokens), 30, 4, 6, 3, batches_per_shard=3)
    return {"a.batch": root / "a.batch", "b.batch": root / "b.batch", "s": root / "s"}


def _read_everything(path: Path, dtype: str) -> None:
    """Every read of a batch file: each batch as a view, as a Batch, as torch
    tensors of ``dtype``, the fingerprint, and an epoch of the native loader
    (an id that wrapped negative in an int32 output counts as a failed read)."""
    with BatchFileReader(path) as reader:
        for i in range(len(reader)):
            assert np.asarray(reader.read_batch(i)).shape == (reader.batch_size, reader.seq_len)
            tensor = reader.read_batch_torch(i, dtype=dtype)
            assert int(tensor.min()) >= 0
        reader.read(np.arange(len(reader)))
        assert reader.fingerprint
    steps = list(BatchNativeLoader(path, block_size=2, seed=1, dtype=dtype))
    assert steps and all(int(step.min()) >= 0 for step in steps)


def test_verify_names_every_problem_of_a_batch_file(tmp_path: Path) -> None:
    from zerobatch.llmbatch.verify import verify

    paths = _batch_sources(tmp_path)
    assert all(verify(path) == [] for path in paths.values())
    raw = bytearray(paths["a.batch"].read_bytes())
    raw[200] = 1  # a reserved header byte
    raw[HEADER_SIZE + 4 * 6 * 4 + 3] = 9  # slot 0's padding
    raw[HEADER_SIZE + 8:HEADER_SIZE + 12] = (2**31 + 1).to_bytes(4, "little")  # an id >= 2**31
    paths["a.batch"].write_bytes(bytes(raw))
    assert {p.field for p in verify(paths["a.batch"])} == {"reserved", "padding"}
    assert {p.field for p in verify(paths["a.batch"], dtype="int32")} == {
        "reserved", "padding", "tokens"}
    manifest = json.loads((paths["s"] / "manifest.json").read_text())
    manifest["shards"][1]["bytes"] += 1
    manifest["shards"][0]["num_batches"] = 2
    (paths["s"] / "manifest.json").write_text(json.dumps(manifest))
    shard = paths["s"] / manifest["shards"][2]["name"]
    shard.write_bytes(shard.read_bytes()[:-1])
    found = {(Path(p.path).name, p.field) for p in verify(paths["s"])}
    assert found == {(manifest["shards"][0]["name"], "num_batches"),
                     (manifest["shards"][1]["name"], "bytes"),
                     (manifest["shards"][2]["name"], "num_batches")}


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(source=st.sampled_from(["a.batch", "b.batch", "s"]), dtype=st.sampled_from(
    ["int64", "int32"]), edits=st.lists(st.tuples(st.integers(0, 2**20), st.sampled_from(
        [0, 1, 2, 7, 255, 2**31, 2**32 - 1, 2**63])), min_size=1, max_size=3),
       target=st.integers(0, 100), cut=st.none() | st.integers(0, 2**20))
def test_verify_passing_means_every_read_succeeds(tmp_path_factory: pytest.TempPathFactory,
                                                  source: str, dtype: str,
                                                  edits: list[tuple[int, int]], target: int,
                                                  cut: int | None) -> None:
    """Mutated files (integers written at any offset of one file, header or
    manifest included, or a file cut short): when ``verify(dtype=...)`` finds
    nothing, every read of that output dtype succeeds."""
    from zerobatch.llmbatch.verify import verify

    path = _batch_sources(tmp_path_factory.mktemp("verify"))[source]
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    victim = files[target % len(files)]
    raw = bytearray(victim.read_bytes())
    for at, value in edits:
        at %= max(1, len(raw))
        width = 8 if value >= 2**32 else 4
        raw[at:at + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
    if cut is not None:
        raw = raw[:cut % (len(raw) + 1)]
    victim.write_bytes(bytes(raw))
    if verify(path, dtype=dtype) == []:
        _read_everything(path, dtype)
