"""Tensor files: round trips, byte identity and interop with the reference
packages, zero-copy reads, slices, checksums and the inspect table."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import bintensors
import bintensors.numpy
import bintensors.torch
import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zerobatch.tensors as zt
from zerobatch.cli import main

BIN_DTYPES = [
    np.dtype(d)
    for d in (np.bool_, np.uint8, np.int8, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn,
              np.int16, np.uint16, np.float16, ml_dtypes.bfloat16, np.int32, np.uint32,
              np.float32, np.float64, np.int64, np.uint64)
]
SAFE_DTYPES = [
    *BIN_DTYPES,
    *(np.dtype(d) for d in (np.complex64, ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fnuz,
                            ml_dtypes.float8_e5m2fnuz)),
]
TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.float8_e5m2, torch.float8_e4m3fn,
    torch.float8_e8m0fnu, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.int16,
    torch.uint16, torch.float16, torch.bfloat16, torch.int32, torch.uint32, torch.float32,
    torch.complex64, torch.float64, torch.int64, torch.uint64,
]
TORCH_BIN_DTYPES = [d for d in TORCH_DTYPES if d not in (
    torch.float8_e8m0fnu, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.complex64)]
REFERENCE = {"bintensors": bintensors.numpy, "safetensors": safetensors.numpy}
REFERENCE_TORCH = {"bintensors": bintensors.torch, "safetensors": safetensors.torch}
OPEN = {"bintensors": bintensors.safe_open, "safetensors": safetensors.safe_open}

names = st.text(st.characters(exclude_categories=("Cs",)), max_size=6)
shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)


def random_array(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Random bytes viewed as ``dtype`` (bool as 0 and 1)."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def tensor_sets(dtypes: list[np.dtype[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    entry = st.builds(random_array, st.sampled_from(dtypes), shapes, st.integers(0, 2**32))
    return st.dictionaries(names, entry, max_size=5)


def metadata_for(fmt: str) -> st.SearchStrategy[dict[str, str] | None]:
    keys = st.dictionaries(names, names, max_size=1 if fmt == "safetensors" else 4)
    return st.none() | keys


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def torch_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("fmt", ["bintensors", "safetensors"])
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_save_is_byte_identical_and_reads_back(fmt: str, data: st.DataObject) -> None:
    tensors = data.draw(tensor_sets(BIN_DTYPES if fmt == "bintensors" else SAFE_DTYPES))
    metadata = data.draw(metadata_for(fmt))
    ours = zt.save(tensors, metadata, format=fmt)
    quirk = fmt == "safetensors" and not tensors and metadata == {}  # reference writes bad JSON
    if not quirk:
        assert ours == REFERENCE[fmt].save(tensors, metadata=metadata)
    assert_same(zt.load(ours), tensors)


@pytest.mark.parametrize("fmt", ["bintensors", "safetensors"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_files_interoperate_both_ways(fmt: str, data: st.DataObject, tmp_path_factory: Any
                                      ) -> None:
    tensors = data.draw(tensor_sets(BIN_DTYPES).filter(bool))
    metadata = data.draw(metadata_for(fmt))
    folder = tmp_path_factory.mktemp("interop")
    theirs, ours = folder / "theirs", folder / "ours"
    REFERENCE[fmt].save_file(tensors, theirs, metadata=metadata)
    zt.save_file(tensors, ours, metadata, format=fmt)
    assert ours.read_bytes() == theirs.read_bytes()
    assert_same(zt.load_file(theirs), tensors)
    with zt.safe_open(theirs, "np") as file:
        assert file.metadata() == metadata
    with OPEN[fmt](str(ours), framework="pt") as file:
        assert file.metadata() == metadata
        loaded = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118
    assert {name: torch_bytes(t) for name, t in loaded.items()} == {
        name: array.tobytes() for name, array in tensors.items()
    }


@pytest.mark.parametrize("fmt", ["bintensors", "safetensors"])
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_round_trip_every_dtype(fmt: str, dtype: torch.dtype, tmp_path: Path) -> None:
    if fmt == "bintensors" and dtype not in TORCH_BIN_DTYPES:
        with pytest.raises(ValueError, match="bintensors cannot store dtype"):
            zt.save({"x": torch.zeros(2, dtype=dtype)}, format=fmt)
        return
    raw = torch.randint(0, 256, (3, 2, 8), dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    tensors = {"t": raw.view(dtype), "scalar": raw.view(dtype)[0, 0, 0], "empty":
               torch.zeros((0, 3), dtype=dtype), "strided": raw.view(dtype)[:, ::2].transpose(0, 1)}
    zt.save_file(tensors, tmp_path / "f", format=fmt)
    loaded = zt.load_file(tmp_path / "f", "pt")
    for name, tensor in tensors.items():
        assert loaded[name].dtype == dtype
        assert loaded[name].shape == tensor.shape
        assert torch_bytes(loaded[name]) == torch_bytes(tensor)
    if dtype in TORCH_BIN_DTYPES or fmt == "safetensors":
        reference = REFERENCE_TORCH[fmt]
        if dtype not in (torch.uint16, torch.uint32, torch.uint64) or fmt == "safetensors":
            assert zt.save(tensors, format=fmt) == reference.save(
                {k: v.clone(memory_format=torch.contiguous_format) for k, v in tensors.items()})


@pytest.mark.parametrize("fmt", ["bintensors", "safetensors"])
def test_numpy_reads_are_read_only_views_of_the_map(fmt: str, tmp_path: Path) -> None:
    tensors = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype="<i8")}
    zt.save_file(tensors, tmp_path / "f", format=fmt)
    with zt.safe_open(tmp_path / "f", "np") as file:
        a, b, again = file.get_tensor("a"), file.get_tensor("b"), file.get_tensor("a")
    assert np.shares_memory(a, again)
    assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 1
    assert b.ctypes.data - a.ctypes.data == 40 or a.ctypes.data - b.ctypes.data == 40
    data = zt.save(tensors, format=fmt)
    from_bytes = zt.load(data)
    assert np.shares_memory(from_bytes["a"], np.frombuffer(data, np.uint8))


@pytest.mark.parametrize("fmt", ["bintensors", "safetensors"])
def test_torch_reads_share_a_private_writable_map(fmt: str, tmp_path: Path) -> None:
    tensors = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
               "b": torch.arange(5, dtype=torch.int64)}
    zt.save_file(tensors, tmp_path / "f", format=fmt)
    before = (tmp_path / "f").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with zt.safe_open(tmp_path / "f", "pt") as file:
            b, a = file.get_tensor("b"), file.get_tensor("a")
            start = file.header.data_start
            a_begin = file.header.info(file.header.index["a"]).begin
            b_begin = file.header.info(file.header.index["b"]).begin
    assert b.data_ptr() - a.data_ptr() == b_begin - a_begin
    assert start > 0
    a[0, 0] = 100.0
    assert a[0, 0] == 100.0
    assert (tmp_path / "f").read_bytes() == before
    assert zt.load_file(tmp_path / "f", "pt")["a"][0, 0] == 0.0


def test_reference_bintensors_ignores_steps_and_we_do_not(tmp_path: Path) -> None:
    array = np.arange(10, dtype=np.float32)
    bintensors.numpy.save_file({"x": array}, tmp_path / "f")
    with bintensors.safe_open(str(tmp_path / "f"), framework="np") as file:
        theirs = file.get_slice("x")[::3]
    with zt.safe_open(tmp_path / "f", "np") as file:
        ours = file.get_slice("x")[::3]
    np.testing.assert_array_equal(ours, array[::3])
    assert len(theirs) != len(ours)


def test_keys_offset_keys_and_metadata(tmp_path: Path) -> None:
    tensors = {"b": np.zeros(2, np.int8), "a": np.zeros(3, np.float64), "c": np.zeros(1)}
    for fmt in ("bintensors", "safetensors"):
        zt.save_file(tensors, tmp_path / fmt, {"k": "v"}, format=fmt)
        path = tmp_path / fmt
        with zt.safe_open(path, "np") as ours, OPEN[fmt](str(path), "np") as theirs:
            assert ours.keys() == theirs.keys() == ["a", "b", "c"]
            assert ours.offset_keys() == theirs.offset_keys() == ["a", "c", "b"]
            assert ours.metadata() == theirs.metadata() == {"k": "v"}
        with zt.safe_open(tmp_path / fmt, "np") as ours:
            pass
        with pytest.raises(ValueError, match="closed"):
            ours.get_tensor("a")


def test_checksum_matches_reference_and_file(tmp_path: Path) -> None:
    tensors = {"w": np.arange(100, dtype=np.float32)}
    digest, data = zt.save_with_checksum(tensors, {"k": "v"})
    assert (digest, data) == bintensors.numpy.save_with_checksum(tensors, {"k": "v"})
    zt.save_file(tensors, tmp_path / "f", {"k": "v"})
    assert zt.checksum(tmp_path / "f") == digest
    assert zt.checksum(tmp_path / "f", hashlib.sha256) == hashlib.sha256(data).digest()
    digest, data = zt.save_with_checksum(tensors, hasher=hashlib.md5, format="safetensors")
    assert digest == hashlib.md5(data).digest()


def test_save_file_is_atomic_and_checks_everything_first(tmp_path: Path) -> None:
    path = tmp_path / "f"
    zt.save_file({"a": np.ones(3)}, path)
    before = path.read_bytes()
    with pytest.raises(ValueError) as error:
        zt.save_file({"ok": np.ones(2), "bad": np.array(["x"]), "worse": np.ones(2, np.complex128)},
                     path)
    assert "'bad'" in str(error.value) and "'worse'" in str(error.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    with pytest.raises(ValueError, match="bintensors cannot store dtype complex64"):
        zt.save({"c": np.ones(2, np.complex64)})
    with pytest.raises(ValueError, match="reserved for metadata"):
        zt.save({"__metadata__": np.ones(1)}, format="safetensors")
    with pytest.raises(ValueError, match="format must be one of"):
        zt.save({}, format="npz")
    with pytest.raises(ValueError, match="metadata"):
        zt.save({}, {"k": 1})  # type: ignore[dict-item]


def test_big_endian_and_non_contiguous_inputs_are_written_in_file_order() -> None:
    array = np.arange(12, dtype=">i4").reshape(3, 4)
    tensors = {"be": array, "t": array.T.astype("<i4")}
    for fmt in ("bintensors", "safetensors"):
        loaded = zt.load(zt.save(tensors, format=fmt))
        np.testing.assert_array_equal(loaded["be"], array)
        np.testing.assert_array_equal(loaded["t"], array.T)
        assert loaded["be"].dtype == np.dtype("<i4")


def test_load_bytes_for_torch_is_writable() -> None:
    data = zt.save({"x": np.arange(4, dtype=np.float32)}, format="safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = zt.load(data, "pt")["x"]
    tensor += 1
    assert tensor.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_describe_and_cli_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file({"emb": np.zeros((4, 2), np.float32), "b": np.zeros(3, np.int8)},
                                path, metadata={"format": "np"})
    assert zt.is_tensor_file(path)
    assert not zt.is_tensor_file(tmp_path)
    (tmp_path / "junk").write_bytes(b"LLMBATCH" + bytes(100))
    assert not zt.is_tensor_file(tmp_path / "junk")
    text = zt.describe(path)
    assert "safetensors" in text and "'format': 'np'" in text
    assert "emb   F32    [4, 2]  0      32   32" in text
    assert main(["inspect", str(path)]) == 0
    assert "emb" in capsys.readouterr().out


def test_unknown_framework_and_numpy_device(tmp_path: Path) -> None:
    data = zt.save({"x": np.zeros(1)})
    with pytest.raises(ValueError, match="framework must be one of"):
        zt.load(data, "tf")
    (tmp_path / "f").write_bytes(data)
    with pytest.raises(ValueError, match="CPU"):
        zt.load_file(tmp_path / "f", "np", device="cuda")
    with zt.safe_open(tmp_path / "f", "np") as file, pytest.raises(KeyError, match="'y'"):
        file.get_tensor("y")


@pytest.mark.parametrize("fmt", ["bintensors", "safetensors"])
def test_jax_reads_and_writes(fmt: str, tmp_path: Path) -> None:
    import jax.numpy as jnp

    tensors = {"bf": random_array(np.dtype(ml_dtypes.bfloat16), (3, 4), 1),
               "f8": random_array(np.dtype(ml_dtypes.float8_e4m3fn), (5,), 2),
               "i": np.arange(6, dtype=np.int32).reshape(2, 3), "s": np.array(3, np.uint8)}
    zt.save_file(tensors, tmp_path / "f", format=fmt)
    loaded = zt.load_file(tmp_path / "f", "jax")
    for name, array in tensors.items():
        assert loaded[name].dtype == array.dtype
        assert np.asarray(loaded[name]).tobytes() == array.tobytes()
    with zt.safe_open(tmp_path / "f", "jax", device="cpu") as file:
        part = file.get_slice("i")[:, ::2]
    np.testing.assert_array_equal(np.asarray(part), tensors["i"][:, ::2])
    as_jax = {name: jnp.asarray(array) for name, array in tensors.items()}
    assert zt.save(as_jax, format=fmt) == zt.save(tensors, format=fmt)


def test_cli_inspect_bintensors_and_a_corrupt_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.bt"
    zt.save_file({"w": np.zeros((2, 3), np.float16)}, path, {"step": "10"})
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bintensors" in out and "'step': '10'" in out and "w     F16    [2, 3]" in out
    path.write_bytes(path.read_bytes()[:-1])
    assert main(["inspect", str(path)]) == 1
    assert "file seems not fully written?" in capsys.readouterr().err


def test_docstring_examples() -> None:
    import doctest

    result = doctest.testmod(zt)
    assert result.attempted > 0 and result.failed == 0
