"""Malformed tensor files: each corruption raises FormatError naming the file,
the tensor and the field, and the reference packages reject it too (except
where zerobatch is deliberately stricter)."""

from __future__ import annotations

import io
import json
import re
import struct
from pathlib import Path

import bintensors
import bintensors.numpy
import numpy as np
import pytest
import safetensors
import safetensors.numpy
from support.bincode_bytes import framed, text, varint

import zerobatch.tensors as zt
from zerobatch.errors import FormatError

F32, I8 = 11, 2  # bintensors dtype ids


def bt(entries: list[tuple[bytes, int, list[int], int, int]], data: bytes = b"",
       meta: bytes = b"\x00", **kwargs: bytes) -> bytes:
    body = meta + varint(len(entries))
    for name, dtype_id, shape, begin, end in entries:
        body += text(name) + varint(dtype_id) + varint(len(shape))
        body += b"".join(varint(d) for d in shape) + varint(begin) + varint(end)
    return framed(body, data, **kwargs)


def st(header: str | bytes, data: bytes = b"") -> bytes:
    raw = header.encode() if isinstance(header, str) else header
    return framed(raw, data)


def entry(name: str, dtype: str, shape: list[int], begin: int, end: int) -> str:
    return json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}})[1:-1]


def reference_rejects(data: bytes, tmp_path: Path) -> bool:
    path = tmp_path / "reference"
    path.write_bytes(data)
    opener = safetensors.safe_open if data[8:9] == b"{" else bintensors.safe_open
    try:
        with opener(str(path), framework="np") as file:
            for name in file.keys():  # noqa: SIM118
                file.get_tensor(name)
    except Exception:  # the references raise several exception types
        return True
    return False


CASES = {
    "short file": (b"\x08\x00\x00", "too short for the 8-byte header length", "header_length",
                   True),
    "header over the cap": (struct.pack("<Q", 100_000_001) + b"{" + bytes(64),
                            "exceeds the limit of 100000000", "header_length", True),
    "header past the end": (struct.pack("<Q", 64) + b"{}      ", "runs past the end",
                            "header_length", True),
    "bt hole": (bt([(b"a", F32, [1], 0, 4), (b"b", F32, [1], 8, 12)], bytes(12)),
                "'b' (F32, shape [1]): data offsets [8, 12] leave a hole", "data_offsets", True),
    "bt overlap": (bt([(b"a", F32, [2], 0, 8), (b"b", F32, [1], 4, 8)], bytes(8)),
                   "'b' (F32, shape [1]): data offsets [4, 8] overlap the previous tensor",
                   "data_offsets", True),
    "bt disorder": (bt([(b"b", F32, [1], 4, 8), (b"a", F32, [1], 0, 4)], bytes(8)),
                    "'b' (F32, shape [1]): data offsets [4, 8] leave a hole", "data_offsets",
                    True),
    "bt size": (bt([(b"a", F32, [2], 0, 4)], bytes(4)),
                "hold 4 bytes, shape x dtype needs 8", "data_offsets", True),
    "bt trailing": (bt([(b"a", I8, [2], 0, 2)], bytes(3)), "trailing bytes", "data_offsets",
                    True),
    "bt truncated data": (bt([(b"a", F32, [2], 0, 8)], bytes(5)), "not fully written",
                          "data_offsets", True),
    "bt duplicate": (bt([(b"a", I8, [1], 0, 1), (b"a", I8, [1], 1, 2)], bytes(2)),
                     "tensor name 'a' appears twice", "a", True),
    "bt bad utf8": (bt([(b"\xff\xfe", I8, [1], 0, 1)], bytes(1)), "not valid UTF-8",
                    "tensor name", True),
    "bt bad utf8 metadata": (bt([], meta=b"\x01\x01" + text(b"\xff") + text(b"")),
                             "not valid UTF-8", "__metadata__", True),
    "bt unknown dtype": (bt([(b"a", 15, [1], 0, 1)], bytes(1)), "unknown dtype id", "dtype",
                         True),
    "bt overflow": (bt([(b"a", F32, [2**32, 2**32, 16], 0, 0)]), "'a' (F32, shape "
                    "[4294967296, 4294967296, 16]): shape too large (integer overflow)",
                    "shape", True),
    "bt too many dims": (bt([(b"a", I8, [1] * 65, 0, 1)], bytes(1)),
                         "'a': 65 dimensions, more than the 64", "shape", True),
    "bt truncated header": (framed(b"\x00\x01\x05ab"), "ends in the middle", "header", True),
    "bt option tag": (bt([], meta=b"\x02"), "neither bintensors", "header", True),
    "bt huge count": (framed(b"\x00\xfd" + (2**60).to_bytes(8, "little")),
                      "count larger than the bytes left", "header", True),
    "bt long varint": (framed(b"\x00\xfb\x00\x00"), "shortest form", "header", False),
    "bt padding": (bt([], pad=b"\x00"), "must be spaces", "header", False),
    "bt metadata order": (bt([], meta=b"\x01\x02" + text(b"b") + text(b"") + text(b"a")
                             + text(b"")), "sorted", "__metadata__", False),
    "st hole": (st("{" + entry("a", "F32", [1], 0, 4) + "," + entry("b", "F32", [1], 8, 12)
                   + "}", bytes(12)), "'b' (F32, shape [1]): data offsets [8, 12] leave a hole",
                "data_offsets", True),
    "st overlap": (st("{" + entry("a", "F32", [2], 0, 8) + "," + entry("b", "I8", [4], 4, 8)
                      + "}", bytes(8)), "overlap the previous tensor", "data_offsets", True),
    "st size": (st("{" + entry("a", "F32", [3], 0, 8) + "}", bytes(8)), "shape x dtype needs 12",
                "data_offsets", True),
    "st reversed": (st("{" + entry("a", "I8", [0], 4, 0) + "}", bytes(4)),
                    "end before they begin", "data_offsets", True),
    "st trailing": (st("{" + entry("a", "I8", [1], 0, 1) + "}", bytes(2)), "trailing bytes",
                    "data_offsets", True),
    "st duplicate": (st("{" + entry("a", "I8", [1], 0, 1) + "," + entry("a", "I8", [1], 1, 2)
                        + "}", bytes(2)), "tensor name 'a' appears twice", "a", True),
    "st bad utf8": (st(b'{"\xc3(":{"dtype":"I8","shape":[],"data_offsets":[0,1]}}', bytes(1)),
                    "not valid UTF-8", "header", True),
    "st unknown dtype": (st("{" + entry("a", "F99", [1], 0, 1) + "}", bytes(1)),
                         "unknown dtype", "dtype", True),
    "st overflow": (st("{" + entry("a", "F64", [2**62, 2], 0, 0) + "}"),
                    "shape too large (integer overflow)", "shape", True),
    "st too many dims": (st("{" + entry("a", "I8", [1] * 65, 0, 1) + "}", bytes(1)),
                         "'a': 65 dimensions, more than the 64", "shape", True),
    "st number too big": (st("{" + entry("a", "I8", [2**64], 0, 0) + "}"),
                          "integer in [0, 2**64)", "header", True),
    "st float": (st('{"a":{"dtype":"I8","shape":[1.0],"data_offsets":[0,1]}}', bytes(1)),
                 "integer", "header", True),
    "st extra key": (st('{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1],"x":1}}', bytes(1)),
                     "unknown or repeated key", "header", False),
    "st missing key": (st('{"a":{"dtype":"I8","shape":[1]}}', bytes(1)),
                       "needs exactly the keys", "header", True),
    "st metadata value": (st('{"__metadata__":{"k":1}}'), "metadata must be an object",
                          "__metadata__", True),
    "st lone surrogate": (st('{"\\ud800":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}',
                             bytes(1)), "lone surrogate", "header", True),
    "st not json": (st('{"a":'), "not valid JSON", "header", True),
    "neither format": (framed(b"[]"), "neither bintensors", "header", True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_corruption_raises_a_format_error_naming_what_is_wrong(case: str, tmp_path: Path) -> None:
    data, message, field, reference_too = CASES[case]
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    with pytest.raises(FormatError) as error:
        zt.load_file(path)
    assert message in str(error.value)
    assert str(path) in str(error.value)
    assert error.value.field == field
    with pytest.raises(FormatError, match=re.escape(message)):
        zt.load(data)
    assert reference_rejects(data, tmp_path) == reference_too


def test_safetensors_reader_sorts_by_offset_like_the_reference(tmp_path: Path) -> None:
    data = st("{" + entry("b", "I8", [2], 2, 4) + "," + entry("a", "I8", [2], 0, 2) + "}",
              bytes(range(4)))
    assert not reference_rejects(data, tmp_path)
    loaded = zt.load(data)
    assert list(loaded) == ["a", "b"]
    assert loaded["b"].tolist() == [2, 3]


def test_json_whitespace_and_key_order_are_accepted(tmp_path: Path) -> None:
    header = ('{ "__metadata__" : { "k" : "v\\u00e9" } ,\t"a" : { "data_offsets" : [ 0 , 4 ] ,'
              ' "shape" : [ 2 ] , "dtype" : "I16" } }\r\n')
    data = st(header, bytes(range(4)))
    assert not reference_rejects(data, tmp_path)
    path = tmp_path / "f"
    path.write_bytes(data)
    with zt.safe_open(path, "np") as file:
        assert file.metadata() == {"k": "vé"}
        np.testing.assert_array_equal(file.get_tensor("a"), np.array([256, 770], np.int16))


def test_packed_sub_byte_dtypes_validate_but_do_not_view(tmp_path: Path) -> None:
    good = st("{" + entry("a", "F4", [4], 0, 2) + "}", bytes(2))
    with pytest.raises(FormatError, match="packs 4-bit elements"):
        zt.load(good)
    odd = st("{" + entry("a", "F4", [3], 0, 2) + "}", bytes(2))
    with pytest.raises(FormatError, match="do not fill whole bytes"):
        zt.load(odd)
    path = tmp_path / "f4"
    path.write_bytes(good)
    assert "F4" in zt.describe(path)


@pytest.mark.parametrize("fmt", ["safetensors", "bintensors"])
def test_metadata_entries_are_capped_in_both_formats(fmt: str, tmp_path: Path) -> None:
    reference = {"safetensors": safetensors.numpy, "bintensors": bintensors.numpy}[fmt]
    array = np.arange(3, dtype=np.int16)
    at_limit = {f"k{i:06d}": "v" for i in range(zt.METADATA_LIMIT)}
    over = {**at_limit, "one more": "v"}
    ours = zt.save({"a": array}, at_limit, format=fmt)
    for data in (reference.save({"a": array}, at_limit), ours):
        with zt.safe_open(io.BytesIO(data), "np") as file:
            assert file.metadata() == at_limit
            assert file.get_tensor("a").tolist() == [0, 1, 2]
    assert reference.load(ours)["a"].tolist() == [0, 1, 2]
    (tmp_path / "over").write_bytes(reference.save({"a": array}, over))
    with pytest.raises(FormatError, match=f"{zt.METADATA_LIMIT + 1} metadata entries") as error:
        zt.safe_open(tmp_path / "over", "np")
    assert error.value.field == "__metadata__" and str(tmp_path / "over") in str(error.value)
    with pytest.raises(ValueError, match=f"argument 'metadata': {zt.METADATA_LIMIT + 1} entries"):
        zt.save_file({"a": array}, tmp_path / "ours", over, format=fmt)
    assert not (tmp_path / "ours").exists()
