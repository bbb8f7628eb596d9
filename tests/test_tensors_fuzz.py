"""Fuzzing the tensor readers: mutated and crafted files either load or raise
FormatError, nothing else. Hypothesis drives the structured cases; a seeded
loop adds tens of thousands of cheap random mutations."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.bincode_bytes import framed, varint

import zerobatch.tensors as zt
from zerobatch.errors import FormatError


def _seed_files() -> list[bytes]:
    tensors = {
        "weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "bias": np.arange(3, dtype=np.int64),
        "mask": np.array([True, False]),
        "bf": np.ones((2, 1), ml_dtypes.bfloat16),
        "scalar": np.array(7, np.int8),
        "empty": np.zeros((0, 5), np.float16),
        "é名": np.arange(4, dtype=np.uint16),
    }
    files = []
    for fmt in ("bintensors", "safetensors"):
        files.append(zt.save(tensors, {"k": "v"}, format=fmt))
        files.append(zt.save({"x": np.zeros(2, np.uint8)}, format=fmt))
        files.append(zt.save({}, format=fmt))
    return files


SEEDS = _seed_files()


def check(data: bytes) -> None:
    """Load ``data`` with NumPy and PyTorch; only FormatError may escape."""
    try:
        arrays = zt.load(data)
    except FormatError:
        return
    tensors = zt.load(data, "pt")
    assert list(arrays) == list(tensors)
    for name, array in arrays.items():
        assert tuple(tensors[name].shape) == array.shape


def mutate(data: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    buffer = bytearray(data)
    for kind, where, payload in edits:
        at = where % (len(buffer) + 1)
        if kind == "flip" and at < len(buffer):
            buffer[at] ^= payload[0] | 1
        elif kind == "insert":
            buffer[at:at] = payload
        elif kind == "delete":
            del buffer[at : at + len(payload)]
        elif kind == "truncate":
            del buffer[at:]
        elif kind == "overwrite":
            buffer[at : at + len(payload)] = payload
        elif kind == "length":
            buffer[:8] = struct.pack("<Q", int.from_bytes(payload[:8].ljust(8, b"\0"), "little")
                                     % (len(buffer) + 64))
    return bytes(buffer)


edits = st.lists(
    st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate", "overwrite", "length"]),
              st.integers(0, 4096), st.binary(min_size=1, max_size=12)),
    min_size=1, max_size=4,
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(SEEDS), changes=edits)
def test_mutated_files_raise_only_format_error(seed: bytes, changes: list[Any]) -> None:
    check(mutate(seed, changes))


numbers = st.integers(0, 300) | st.sampled_from([2**16, 2**32, 2**63, 2**64 - 1, 2**64, 2**70])
bincode_tokens = st.lists(
    st.one_of(numbers.map(varint), st.binary(max_size=6),
              st.text(max_size=4).map(lambda s: varint(len(s.encode())) + s.encode())),
    max_size=24,
)


@settings(max_examples=1000, deadline=None)
@given(meta=st.sampled_from([b"\x00", b"\x01", b"\x01\x00", b"\x02"]), body=bincode_tokens,
       pad=st.binary(max_size=8), data=st.binary(max_size=64))
def test_crafted_bincode_headers(meta: bytes, body: list[bytes], pad: bytes, data: bytes) -> None:
    check(framed(meta + b"".join(body) + pad, data, pad=b""))


json_leaves = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True), numbers, st.integers(-5, -1),
    st.sampled_from(["F32", "I8", "BOOL", "F4", "C64", "BF16", "F99", ""]), st.text(max_size=4),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["dtype", "shape", "data_offsets", "__metadata__", "x"]) | st.text(
            max_size=3), inner, max_size=4),
    max_leaves=12,
)
tensor_entries = st.fixed_dictionaries(
    {"dtype": st.sampled_from(["F32", "I8", "U16", "F4", "F6_E2M3", "C64", "F8_E8M0"]),
     "shape": st.lists(numbers, max_size=3), "data_offsets": st.lists(numbers, min_size=2,
                                                                       max_size=2)},
)


@settings(max_examples=600, deadline=None)
@given(
    entries=st.dictionaries(st.text(max_size=3), tensor_entries | json_values, max_size=4),
    metadata=st.none() | json_values, spaces=st.sampled_from(["", " ", "\n\t "]),
    data=st.binary(max_size=64), cut=st.integers(0, 8),
)
def test_crafted_json_headers(entries: dict[str, Any], metadata: Any, spaces: str, data: bytes,
                              cut: int) -> None:
    tree = dict(entries)
    if metadata is not None:
        tree = {"__metadata__": metadata, **tree}
    text = json.dumps(tree, ensure_ascii=cut % 2 == 0).replace(" ", spaces)
    check(framed(text.encode("utf-8", "surrogatepass"), data, pad=b""))
    check(framed(text.encode("utf-8", "surrogatepass")[: -cut or None], data, pad=b""))


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_many_random_byte_mutations(seed: int) -> None:
    rng = random.Random(seed)
    base = SEEDS[seed]
    for _ in range(4000):
        buffer = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(buffer) + 1)
            choice = rng.random()
            if choice < 0.6 and at < len(buffer):
                buffer[at] = rng.randrange(256)
            elif choice < 0.8:
                buffer[at:at] = rng.randbytes(rng.randint(1, 4))
            else:
                del buffer[at : at + rng.randint(1, 16)]
        check(bytes(buffer))


def test_fuzzed_files_through_safe_open_and_describe(tmp_path: Path) -> None:
    rng = random.Random(7)
    path = tmp_path / "fuzzed"
    opened = 0
    for _ in range(300):
        buffer = bytearray(rng.choice(SEEDS))
        buffer[rng.randrange(len(buffer))] = rng.randrange(256)
        path.write_bytes(bytes(buffer))
        try:
            assert str(path) in zt.describe(path)
            with zt.safe_open(path, "pt") as file:
                for name in file.keys():  # noqa: SIM118
                    file.get_tensor(name)
                    assert isinstance(file.get_slice(name)[...], torch.Tensor)
            opened += 1
        except FormatError:
            continue
    assert opened > 0
