"""The safetensors-compatible surface of zerobatch.tensors, checked call by
call against the real safetensors 0.8.0: slicing rules, closed handles,
argument errors, backends, file objects, tied-weight models and fp4."""

from __future__ import annotations

import inspect
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.flax
import safetensors.numpy
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zerobatch.tensors as zt
import zerobatch.tensors.flax as zflax
import zerobatch.tensors.jax as zjax
import zerobatch.tensors.numpy as znp
import zerobatch.tensors.torch as ztorch
from zerobatch import FormatError

# Besides its own error, safetensors crashes on some slices (start > stop, negative
# bounds, zero-size dimensions) with OverflowError, SystemError, ValueError or a Rust
# panic ("capacity overflow", pyo3's PanicException, a BaseException); zerobatch
# refuses those with SliceError.
REFUSED = (safetensors.SafetensorError, OverflowError, SystemError, ValueError)


def _refused(error: BaseException) -> bool:
    return isinstance(error, REFUSED) or type(error).__name__ == "PanicException"


@pytest.fixture(scope="module")
def slice_files(tmp_path_factory: Any) -> dict[tuple[int, ...], Path]:
    """One safetensors file per shape, tensor "x" = arange, written by safetensors."""
    folder = tmp_path_factory.mktemp("slices")
    files = {}
    for shape in [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4)]:
        path = folder / f"{'x'.join(map(str, shape)) or 'scalar'}.safetensors"
        array = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
        safetensors.numpy.save_file({"x": array}, str(path))
        files[shape] = path
    return files


def index_items(size: int) -> st.SearchStrategy[Any]:
    bound = st.none() | st.integers(-size - 2, size + 2)
    step = st.none() | st.integers(-2, 4)
    return (st.integers(-size - 2, size + 2)
            | st.builds(slice, bound, bound, step)
            | st.just(Ellipsis)
            | st.lists(st.integers(0, max(size - 1, 0)), min_size=1, max_size=2)
            | st.none())


@settings(max_examples=250, deadline=None)
@given(data=st.data())
def test_get_slice_refuses_and_returns_what_safetensors_does(
        slice_files: dict[tuple[int, ...], Path], data: st.DataObject) -> None:
    shape = data.draw(st.sampled_from(sorted(slice_files)))
    length = data.draw(st.integers(0, len(shape) + 1))
    index = tuple(data.draw(index_items(shape[k] if k < len(shape) else 3))
                  for k in range(length))
    if length == 1 and data.draw(st.booleans()):
        index = index[0]  # a bare item, not a 1-tuple
    path = slice_files[shape]
    with safetensors.safe_open(str(path), "np") as theirs:
        try:
            expected = theirs.get_slice("x")[index]
        except BaseException as error:  # a Rust panic is not an Exception
            if not _refused(error):
                raise
            expected = None
    with zt.safe_open(path, "np") as ours:
        part = ours.get_slice("x")
        if expected is None:
            with pytest.raises(zt.SliceError) as error:
                part[index]
            assert isinstance(error.value, zt.SafetensorError)
            assert str(path) in str(error.value)
        else:
            got = part[index]
            assert got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)
    # "pt" indexes as torch does, in safetensors as here: the same tensor or the same error
    outcomes = []
    for module in (safetensors, zt):
        with module.safe_open(str(path), "pt") as file:
            try:
                outcomes.append(file.get_slice("x")[index])
            except (IndexError, ValueError, TypeError) as error:
                outcomes.append(type(error))
    if isinstance(outcomes[0], type):
        assert outcomes[1] is outcomes[0]
    else:
        assert outcomes[1].shape == outcomes[0].shape
        assert outcomes[1].stride() == outcomes[0].stride()
        assert torch.equal(outcomes[1], outcomes[0])


def test_get_slice_honours_steps_and_survives_close(tmp_path: Path) -> None:
    array = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    safetensors.numpy.save_file({"a": array}, str(tmp_path / "f"))
    with zt.safe_open(tmp_path / "f", "pt") as file:
        part = file.get_slice("a")
        assert (part.get_shape(), part.get_dtype()) == ([3, 4, 5], "F32")
    np.testing.assert_array_equal(part[::2, 1, 1::3].numpy(), array[::2, 1, 1::3])
    np.testing.assert_array_equal(part[-1].numpy(), array[-1])
    np.testing.assert_array_equal(part[-2:, [0, 2]].numpy(), array[-2:, [0, 2]])  # torch's rules
    with zt.safe_open(tmp_path / "f", "np") as file:
        part = file.get_slice("a")
    with pytest.raises(zt.SliceError, match="negative bound"):
        part[-2:]
    with pytest.raises(IndexError, match="only ints, slices"):
        part[[0, 1]]


def test_every_closed_handle_call_raises_the_format_error(tmp_path: Path) -> None:
    safetensors.numpy.save_file({"a": np.zeros(3, np.float32)}, str(tmp_path / "f"))
    ours = zt.safe_open(tmp_path / "f", "np")
    theirs = safetensors.safe_open(str(tmp_path / "f"), "np")
    ours.close()
    theirs.__exit__(None, None, None)
    calls = [("keys", ()), ("offset_keys", ()), ("metadata", ()), ("get_tensors", ()),
             ("get_tensor", ("a",)), ("get_slice", ("a",))]
    for method, args in calls:
        with pytest.raises(safetensors.SafetensorError, match="closed"):
            getattr(theirs, method)(*args)
        with pytest.raises(zt.SafetensorError, match="closed"):
            getattr(ours, method)(*args)
    ours.close()  # idempotent


def test_missing_tensor_is_a_format_error_and_a_key_error(tmp_path: Path) -> None:
    safetensors.numpy.save_file({"a": np.zeros(3, np.float32)}, str(tmp_path / "f"))
    with safetensors.safe_open(str(tmp_path / "f"), "np") as theirs, pytest.raises(
            safetensors.SafetensorError, match="does not contain tensor"):
        theirs.get_tensor("y")
    with zt.safe_open(tmp_path / "f", "np") as ours:
        for call in (ours.get_tensor, ours.get_slice):
            with pytest.raises(zt.TensorNotFound, match="does not contain tensor 'y'") as error:
                call("y")
            assert isinstance(error.value, FormatError) and isinstance(error.value, KeyError)
        with pytest.raises(TypeError, match="argument 'name'"):
            ours.get_tensor(3)  # type: ignore[arg-type]


def test_malformed_file_raises_format_error_where_safetensors_raises_its_own(
        tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes((64).to_bytes(8, "little") + b"{}      ")  # truncated
    with pytest.raises(safetensors.SafetensorError):
        safetensors.safe_open(str(tmp_path / "bad"), "np")
    for call in (lambda: ztorch.load_file(tmp_path / "bad"),
                 lambda: znp.load((tmp_path / "bad").read_bytes()),
                 lambda: zt.safe_open(tmp_path / "bad", "np")):
        with pytest.raises(zt.SafetensorError) as error:
            call()
        assert error.value.field is not None
    assert zt.SafetensorError is FormatError is ztorch.SafetensorError is znp.SafetensorError


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_backends_and_file_objects_match_safetensors(backend: str, tmp_path: Path) -> None:
    tensors = {"w": torch.randn(4, 6), "b": torch.arange(5, dtype=torch.int64),
               "e": torch.zeros(0, 3, dtype=torch.float16)}
    path = tmp_path / "f.safetensors"
    safetensors.torch.save_file(tensors, str(path), {"k": "v"})
    theirs = safetensors.torch.load_file(str(path), backend=backend)
    for ours in (ztorch.load_file(path, backend=backend),
                 ztorch.load_file(str(path), "cpu", backend=backend)):
        assert list(ours) == list(theirs)
        for name in theirs:
            assert ours[name].dtype == theirs[name].dtype
            assert torch.equal(ours[name], theirs[name])
    with open(path, "rb") as handle:
        with zt.safe_open(handle, "pt", backend=backend) as file:
            assert file.metadata() == {"k": "v"}
            loaded = file.get_tensors()
            loaded["w"].add_(1)  # writable, never reaches the file
        assert not handle.closed
    torch.testing.assert_close(loaded["w"], theirs["w"] + 1)
    assert torch.equal(ztorch.load_file(path)["w"], theirs["w"])
    with zt.safe_open(io.BytesIO(path.read_bytes()), "np", backend=backend) as file:
        np.testing.assert_array_equal(file.get_slice("w")[1:3, ::2], theirs["w"][1:3, ::2])
    np_ours = znp.load_file(path, backend=backend)
    np_theirs = safetensors.numpy.load_file(str(path), backend=backend)
    assert np_ours.keys() == np_theirs.keys()
    assert np_ours["w"].flags.writeable is (backend == "pread")
    for name in np_theirs:
        np.testing.assert_array_equal(np_ours[name], np_theirs[name])


def test_bad_backend_framework_device_and_filename(tmp_path: Path) -> None:
    path = tmp_path / "f"
    safetensors.numpy.save_file({"a": np.zeros(2, np.float32)}, str(path))
    bad = [
        (dict(filename=str(path), framework="np", backend="zz"), safetensors.SafetensorError),
        (dict(filename=str(path), framework="xx"), safetensors.SafetensorError),
        (dict(filename=str(path), framework="np", device="cuda"), safetensors.SafetensorError),
        (dict(filename=str(path), framework="pt", device="bogus"), safetensors.SafetensorError),
        (dict(filename=5, framework="np"), TypeError),
        (dict(filename=str(tmp_path / "missing"), framework="np"), FileNotFoundError),
    ]
    for kwargs, kind in bad:
        with pytest.raises(kind):
            safetensors.safe_open(**kwargs)
        ours = kind if kind is not safetensors.SafetensorError else zt.SafetensorError
        with pytest.raises(ours) as error:
            zt.safe_open(**kwargs)
        if ours is not FileNotFoundError:
            assert any(word in str(error.value) for word in ("backend", "framework", "device",
                                                             "filename"))


def torch_bad_inputs() -> list[tuple[str, Any, Any, Any]]:
    square = torch.zeros(3, 4)
    return [
        ("not a dict", "str", "f", None),
        ("int key", {1: square}, "f", None),
        ("metadata not a dict", {"a": square}, "f", "x"),
        ("metadata value", {"a": square}, "f", {"k": 1}),
        ("not a tensor", {"a": [1, 2]}, "f", None),
        ("sparse", {"a": square.to_sparse()}, "f", None),
        ("not contiguous", {"a": square.t()}, "f", None),
        ("shared", {"a": square, "b": square[:1]}, "f", None),
        ("filename", {"a": square}, 123, None),
    ]


@pytest.mark.parametrize(("case", "tensors", "filename", "metadata"), torch_bad_inputs())
def test_torch_bad_inputs_raise_the_same_class_as_safetensors(
        case: str, tensors: Any, filename: Any, metadata: Any, tmp_path: Path) -> None:
    target = filename if not isinstance(filename, str) else str(tmp_path / filename)
    with pytest.raises(Exception) as theirs:
        safetensors.torch.save_file(tensors, target, metadata)
    with pytest.raises(type(theirs.value)) as ours:
        ztorch.save_file(tensors, target, metadata)
    assert type(ours.value) is type(theirs.value), case
    assert "argument" in str(ours.value), case
    if case != "filename":
        with pytest.raises(type(theirs.value)):
            ztorch.save(tensors, metadata)
    assert not (tmp_path / "f").exists()


def test_numpy_and_jax_modules_write_safetensors_bytes(tmp_path: Path) -> None:
    import jax.numpy as jnp

    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
              "i": np.array([1, 2], np.int64), "s": np.array(True)}
    assert znp.save(arrays, {"k": "v"}) == safetensors.numpy.save(arrays, {"k": "v"})
    znp.save_file(arrays, tmp_path / "n", {"k": "v"})
    assert (tmp_path / "n").read_bytes() == safetensors.numpy.save(arrays, {"k": "v"})
    for name, array in znp.load((tmp_path / "n").read_bytes()).items():
        np.testing.assert_array_equal(array, arrays[name])
    with pytest.raises(ValueError, match="argument 'tensor_dict'"):
        znp.save("str")  # type: ignore[arg-type]
    jax_arrays = {name: jnp.asarray(array) for name, array in arrays.items()}
    assert zjax.save(jax_arrays) == safetensors.flax.save(jax_arrays)
    assert zflax.save_file is zjax.save_file
    zflax.save_file(jax_arrays, tmp_path / "j")
    for loaded in (zflax.load_file(tmp_path / "j"), zflax.load((tmp_path / "j").read_bytes()),
                   zjax.load_file(tmp_path / "j", backend="pread")):
        theirs = safetensors.flax.load_file(str(tmp_path / "j"))
        assert loaded.keys() == theirs.keys()
        for name in theirs:
            np.testing.assert_array_equal(np.asarray(loaded[name]), np.asarray(theirs[name]))
    assert znp.save(arrays, format="bintensors")[8] in (0, 1)


def parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter, without zerobatch's ``format=``."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()
            if p.name != "format"]


@pytest.mark.parametrize(("ours", "theirs"), [(ztorch, safetensors.torch), (znp, safetensors.numpy),
                                              (zjax, safetensors.flax), (zflax, safetensors.flax)])
def test_framework_modules_take_the_arguments_of_safetensors(ours: Any, theirs: Any) -> None:
    names = ["save", "save_file", "load", "load_file", "save_model", "load_model"]
    for name in [name for name in names if hasattr(theirs, name)]:
        assert parameters(getattr(ours, name)) == parameters(getattr(theirs, name)), name
        assert getattr(ours, name).__doc__, name
    assert {"safe_open", "SafetensorError", "serialize_file", "TensorSpec"} <= set(ours.__all__)


class TinyLM(torch.nn.Module):
    """Embedding, one transformer layer and an LM head tied to the embedding."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.block = torch.nn.TransformerEncoderLayer(width, 2, 32, dropout=0.0,
                                                      batch_first=True)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


def test_tied_weights_save_once_and_load_shared(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    ztorch.save_model(model, tmp_path / "ours", {"note": "x"})
    safetensors.torch.save_model(model, str(tmp_path / "theirs"), {"note": "x"})
    with zt.safe_open(tmp_path / "ours", "pt") as file:
        names = file.keys()
        assert "head.weight" not in names and "embed.weight" in names
        assert file.metadata() == {"note": "x", "head.weight": "embed.weight"}
    with safetensors.safe_open(str(tmp_path / "ours"), "pt") as file:
        assert file.keys() == sorted(model.state_dict().keys() - {"head.weight"})
    tokens = torch.randint(0, 50, (2, 7))
    model.eval()
    with torch.no_grad():
        expected = model(tokens)
    for source in ("ours", "theirs"):
        torch.manual_seed(1)
        fresh = TinyLM().eval()
        result = ztorch.load_model(fresh, tmp_path / source)
        assert result == safetensors.torch.load_model(TinyLM(), str(tmp_path / source))
        assert result == (set(), [])
        assert fresh.head.weight is fresh.embed.weight
        with torch.no_grad():
            torch.testing.assert_close(fresh(tokens), expected, rtol=0, atol=0)
    fresh = TinyLM()
    safetensors.torch.load_model(fresh, str(tmp_path / "ours"))
    assert fresh.head.weight.data_ptr() == fresh.embed.weight.data_ptr()


def test_load_model_missing_and_unexpected_match_safetensors(tmp_path: Path) -> None:
    model = TinyLM()
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()
             if name not in ("head.weight", "block.linear1.bias")}
    state["extra"] = torch.zeros(2)
    safetensors.torch.save_file(state, str(tmp_path / "f"))
    theirs = safetensors.torch.load_model(TinyLM(), str(tmp_path / "f"), strict=False)
    ours = ztorch.load_model(TinyLM(), tmp_path / "f", strict=False)
    assert ours == theirs
    assert ours[0] == {"block.linear1.bias"} and ours[1] == ["extra"]
    with pytest.raises(RuntimeError) as theirs_error:
        safetensors.torch.load_model(TinyLM(), str(tmp_path / "f"))
    with pytest.raises(RuntimeError) as ours_error:
        ztorch.load_model(TinyLM(), tmp_path / "f", backend="pread")
    assert str(ours_error.value) == str(theirs_error.value)


def sharing_cases() -> list[dict[str, torch.Tensor]]:
    base = torch.arange(24.0)
    other = torch.zeros(3, 4)
    return [
        {"a": base, "b": base, "c": other},
        {"lo": base[:12], "hi": base[12:]},  # one storage, no overlap: not shared
        {"full": base, "view": base.view(4, 6), "part": base[3:9], "z": torch.zeros(0)},
        {"w": other, "row": other[1], "u": torch.ones(2)},
    ]


@pytest.mark.parametrize("case", range(4))
def test_sharing_helpers_match_safetensors(case: int) -> None:
    state = sharing_cases()[case]
    ours = sorted(map(sorted, ztorch._find_shared_tensors(state)))
    assert ours == sorted(map(sorted, safetensors.torch._find_shared_tensors(state)))
    assert ztorch.storage_ptr(next(iter(state.values()))) == safetensors.torch.storage_ptr(
        next(iter(state.values())))
    for options in ({}, {"preferred_names": ["view"]}, {"discard_names": ["a", "full"]}):
        results = []
        for helper in (ztorch._remove_duplicate_names,
                       safetensors.torch._remove_duplicate_names):
            try:
                results.append(dict(helper(state, **options)))
            except RuntimeError:  # a view of a larger buffer, alone: both refuse
                results.append(None)
        assert results[0] == results[1]


def test_sharing_sees_transposed_views() -> None:
    weight = torch.zeros(3, 4)  # safetensors' helper fails on .t() (view(-1) of a transpose)
    state = {"w": weight, "wt": weight.t(), "last": weight[2, 3:], "u": torch.ones(2)}
    assert sorted(map(sorted, ztorch._find_shared_tensors(state))) == [["last", "w", "wt"],
                                                                       ["u"]]
    assert dict(ztorch._remove_duplicate_names(state)) == {"w": ["last", "wt"]}


def test_sharing_without_a_complete_tensor_is_refused() -> None:
    base = torch.arange(10.0)
    state = {"x": base[:6], "y": base[2:8]}
    with pytest.raises(RuntimeError):
        safetensors.torch._remove_duplicate_names(state)
    with pytest.raises(RuntimeError, match="none covers the whole storage"):
        ztorch._remove_duplicate_names(state)


def test_fp4_and_new_dtypes_round_trip_like_safetensors(tmp_path: Path) -> None:
    packed = torch.randint(0, 256, (4, 3), dtype=torch.uint8)
    tensors = {"f4": packed.view(torch.float4_e2m1fn_x2),
               "e8": torch.randint(0, 255, (5,), dtype=torch.uint8).view(torch.float8_e8m0fnu),
               "u16": torch.arange(3, dtype=torch.int32).to(torch.uint16),
               "c": torch.ones(2, dtype=torch.complex64)}
    data = ztorch.save(tensors)
    assert data == safetensors.torch.save(tensors)
    ztorch.save_file(tensors, tmp_path / "f")
    with safetensors.safe_open(str(tmp_path / "f"), "pt") as theirs, zt.safe_open(
            tmp_path / "f", "pt") as ours:
        assert ours.get_slice("f4").get_shape() == theirs.get_slice("f4").get_shape() == [4, 6]
        names = theirs.keys()
        for name in names:
            mine, reference = ours.get_tensor(name), theirs.get_tensor(name)
            assert (mine.dtype, mine.shape) == (reference.dtype, reference.shape)
            assert torch.equal(mine.view(torch.uint8), reference.view(torch.uint8))
        with pytest.raises(zt.SafetensorError, match="cannot be sliced"):
            ours.get_slice("f4")[0]
    assert torch.equal(ztorch.load(data)["f4"].view(torch.uint8), packed)
    with pytest.raises(zt.SafetensorError, match="F4"):
        znp.load_file(tmp_path / "f")


def spec_pairs(arrays: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same tensors as zerobatch and safetensors TensorSpecs."""
    ours, theirs = {}, {}
    for name, array in arrays.items():
        kwargs = dict(dtype=str(array.dtype).removeprefix("torch."), shape=list(array.shape),
                      data_ptr=array.data_ptr() if isinstance(array, torch.Tensor)
                      else array.ctypes.data, data_len=array.nbytes)
        ours[name] = zt.TensorSpec(**kwargs)
        theirs[name] = safetensors.TensorSpec(**kwargs)
    return ours, theirs


def test_serialize_file_streams_specs_like_safetensors(tmp_path: Path) -> None:
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "e": np.zeros((0, 2), np.int8),
              "f4": torch.randint(0, 256, (2, 3), dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
              "b": torch.ones(5, dtype=torch.bfloat16)}
    ours, theirs = spec_pairs(arrays)
    for name in arrays:
        assert repr(ours[name]).split("data_ptr")[0] == repr(theirs[name]).split("data_ptr")[0]
        assert (ours[name].dtype, ours[name].shape, ours[name].data_len) == (
            theirs[name].dtype, theirs[name].shape, theirs[name].data_len)
    assert ours["f4"].shape == [2, 6]
    data = zt.serialize(ours, {"k": "v"})
    assert data == safetensors.serialize(theirs, {"k": "v"})
    ztorch.serialize_file(ours, tmp_path / "ours", {"k": "v"})
    safetensors.serialize_file(theirs, str(tmp_path / "theirs"), {"k": "v"})
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes() == data
    ours_items = znp.deserialize(data)
    assert [name for name, _ in ours_items] == sorted(arrays)  # safetensors: hash order
    assert dict(ours_items) == dict(safetensors.deserialize(data))


def test_serialize_refuses_what_safetensors_refuses(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.float32)
    for kwargs in (dict(dtype="F32", shape=[6], data_ptr=1, data_len=24),
                   dict(dtype="bogus", shape=[6], data_ptr=1, data_len=24)):
        with pytest.raises(safetensors.SafetensorError):
            safetensors.TensorSpec(**kwargs)
        with pytest.raises(zt.SafetensorError, match="unknown dtype"):
            zt.TensorSpec(**kwargs)
    with pytest.raises(TypeError):
        zt.TensorSpec("float32", [6], 1, 24)  # type: ignore[misc]
    short = dict(dtype="float32", shape=[6], data_ptr=array.ctypes.data, data_len=20)
    with pytest.raises(safetensors.SafetensorError):
        safetensors.serialize({"a": safetensors.TensorSpec(**short)})
    with pytest.raises(zt.SafetensorError, match="needs 24 bytes, data_len is 20"):
        zt.serialize_file({"a": zt.TensorSpec(**short)}, tmp_path / "f")
    assert not (tmp_path / "f").exists()
    for bad in ({"a": 5}, {"a": {"dtype": "float32", "shape": [6], "data": b""}}):
        with pytest.raises(TypeError):
            safetensors.serialize(bad)
        with pytest.raises(TypeError, match="argument 'tensor_dict'"):
            zt.serialize(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'data'"):
        zt.deserialize("text")  # type: ignore[arg-type]


def test_save_file_writes_many_buffers_in_batches(tmp_path: Path) -> None:
    arrays = {f"t{k:04d}": np.full(k % 7, k, np.int16) for k in range(1300)}  # > 2 writev batches
    znp.save_file(arrays, tmp_path / "f")
    assert (tmp_path / "f").read_bytes() == safetensors.numpy.save(arrays)
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # no temporary left behind


def test_save_file_of_reserved_size_is_exact(tmp_path: Path) -> None:
    tensors = {"big": torch.arange(1 << 19, dtype=torch.float32), "x": torch.ones(3)}  # 2 MiB
    ztorch.save_file(tensors, tmp_path / "f", {"k": "v"})
    expected = safetensors.torch.save(tensors, {"k": "v"})
    assert (tmp_path / "f").stat().st_size == len(expected)
    assert (tmp_path / "f").read_bytes() == expected


def test_save_file_across_writeback_steps_is_exact(tmp_path: Path) -> None:
    # 72 MiB: more than one 64 MiB write step, cut inside a tensor and not at a page
    tensors = {"big": torch.arange(9 << 20, dtype=torch.float64),
               "odd": torch.ones(1001, dtype=torch.int16)}
    ztorch.save_file(tensors, tmp_path / "f")
    with open(tmp_path / "f", "rb") as mine:
        theirs = io.BytesIO(safetensors.torch.save(tensors))
        while chunk := theirs.read(8 << 20):
            assert mine.read(8 << 20) == chunk
        assert mine.read() == b""


@pytest.mark.parametrize("backend", ["mmap", "pread"])
@pytest.mark.parametrize("kind", ["path", "file", "bytesio"])
def test_truncated_and_crafted_files_fail_clearly_through_every_reader(
        backend: str, kind: str, tmp_path: Path) -> None:
    good = safetensors.numpy.save({"a": np.arange(8, dtype=np.float32)}, {"k": "v"})
    cases = {
        "short": (good[:5], "header_length"),
        "header past end": (good[:20], "header_length"),
        "data cut": (good[:-4], "data_offsets"),
        "not a header": (b"\x08" + b"\0" * 7 + b"#" * 8, "header"),
    }
    for name, (data, field) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(safetensors.SafetensorError):
            safetensors.safe_open(str(path), "np", backend=backend)
        with open(path, "rb") as handle:
            source = {"path": path, "file": handle, "bytesio": io.BytesIO(data)}[kind]
            with pytest.raises(zt.SafetensorError) as error:
                zt.safe_open(source, "np", backend=backend)
        assert error.value.field == field, name
        if kind != "bytesio":
            assert str(path) in str(error.value)


def test_pread_reports_a_file_truncated_after_opening(tmp_path: Path) -> None:
    safetensors.numpy.save_file({"a": np.arange(1024, dtype=np.float64)}, str(tmp_path / "f"))
    with zt.safe_open(tmp_path / "f", "np", backend="pread") as file:
        os.truncate(tmp_path / "f", 100)
        with pytest.raises(zt.SafetensorError, match="truncated after it was opened"):
            file.get_tensor("a")


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = self.a


class _Copied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)


def test_whole_slice_and_shared_groups_come_back_as_in_safetensors(tmp_path: Path) -> None:
    # get_slice(name)[()] is the whole tensor, for every shape, framework and backend
    tensors = {"m": torch.arange(12.0).reshape(3, 4), "s": torch.tensor(7.0),
               "e": torch.zeros(2, 0, 3), "z": torch.zeros(0, dtype=torch.int64)}
    path = tmp_path / "f.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    for framework, backend in [("pt", "mmap"), ("pt", "pread"), ("np", "mmap"), ("np", "pread")]:
        with safetensors.safe_open(str(path), framework, backend=backend) as theirs, \
                zt.safe_open(path, framework, backend=backend) as ours:
            for name in tensors:
                want, got = theirs.get_slice(name)[()], ours.get_slice(name)[()]
                assert type(got) is type(want) and got.shape == want.shape
                assert got.tobytes() == want.tobytes() if framework == "np" else torch.equal(
                    got, want)
    # the shared-tensor groups, in safetensors' order (upstream's model tests compare lists)
    base = torch.zeros(8)
    cases = [_Tied().state_dict(), _Copied().state_dict(),
             {"z": base[:4], "y": base[4:], "x": base[2:6], "w": torch.ones(3)},
             {"b": torch.ones(2), "a": base, "c": base[:1]}]
    for state_dict in cases:
        want_groups = safetensors.torch._find_shared_tensors(state_dict)
        assert ztorch._find_shared_tensors(state_dict) == want_groups
        if all(any(ztorch._is_complete(state_dict[n]) for n in g) for g in want_groups):
            assert ztorch._remove_duplicate_names(state_dict) == \
                safetensors.torch._remove_duplicate_names(state_dict)
    for tensor in [base, base[::3], base[2:5], torch.zeros(0), torch.ones(4, 6)[1:, ::2]]:
        assert ztorch._end_ptr(tensor) == safetensors.torch._end_ptr(tensor)
    transposed = torch.zeros(3, 4).t()  # safetensors' _end_ptr raises on this view
    assert ztorch._end_ptr(transposed) == transposed.data_ptr() + 12 * 4


def test_empty_tensors_load_with_the_strides_safetensors_gives(tmp_path: Path) -> None:
    tensors = {"a": torch.zeros(0, 4), "b": torch.zeros(3, 0, 2, dtype=torch.bfloat16),
               "c": torch.zeros(0, dtype=torch.int64), "d": torch.ones(2, 2)}
    path = tmp_path / "f.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    want = safetensors.torch.load_file(str(path))
    loads = [ztorch.load_file(path), ztorch.load_file(path, backend="pread"),
             ztorch.load(path.read_bytes()), zt.load_file(path, "pt")]
    with zt.safe_open(path, "pt") as file:
        loads.append({name: file.get_tensor(name) for name in tensors})
        loads.append({name: file.get_slice(name)[:] for name in tensors})
    for got in loads:
        for name, tensor in want.items():
            assert got[name].shape == tensor.shape and got[name].dtype == tensor.dtype
            assert got[name].stride() == tensor.stride()
            assert got[name].view(torch.uint8).shape == tensor.view(torch.uint8).shape
