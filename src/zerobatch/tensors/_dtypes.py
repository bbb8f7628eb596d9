"""The element types both tensor formats know, and their names in each world.

A dtype's *code* is its position in :data:`DTYPES`, which follows the
safetensors dtype order; writers sort tensors by it (safetensors) or by the
bintensors id (bintensors), largest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

__all__ = [
    "BINTENSORS_CODE",
    "BINTENSORS_ID",
    "DTYPES",
    "SAFETENSORS_CODE",
    "DType",
    "code_of_numpy",
    "numpy_dtype",
]


@dataclass(frozen=True)
class DType:
    """One element type.

    Attributes:
        name: the safetensors dtype string (``"F32"``).
        bits: size of one element in bits (4 and 6 for the packed float types).
        bintensors_id: the bincode enum index in bintensors, or None where
            bintensors has no such type.
        numpy_name: the NumPy (or ``ml_dtypes``) type name, or None where NumPy
            has no packed equivalent.
        torch_name: the ``torch`` attribute name, or None.
    """

    name: str
    bits: int
    bintensors_id: int | None
    numpy_name: str | None
    torch_name: str | None


DTYPES: tuple[DType, ...] = (
    DType("BOOL", 8, 0, "bool", "bool"),
    DType("F4", 4, None, None, "float4_e2m1fn_x2"),
    DType("F6_E2M3", 6, None, None, None),
    DType("F6_E3M2", 6, None, None, None),
    DType("U8", 8, 1, "uint8", "uint8"),
    DType("I8", 8, 2, "int8", "int8"),
    DType("F8_E5M2", 8, 3, "float8_e5m2", "float8_e5m2"),
    DType("F8_E4M3", 8, 4, "float8_e4m3fn", "float8_e4m3fn"),
    DType("F8_E8M0", 8, None, "float8_e8m0fnu", "float8_e8m0fnu"),
    DType("F8_E4M3FNUZ", 8, None, "float8_e4m3fnuz", "float8_e4m3fnuz"),
    DType("F8_E5M2FNUZ", 8, None, "float8_e5m2fnuz", "float8_e5m2fnuz"),
    DType("I16", 16, 5, "int16", "int16"),
    DType("U16", 16, 6, "uint16", "uint16"),
    DType("F16", 16, 7, "float16", "float16"),
    DType("BF16", 16, 8, "bfloat16", "bfloat16"),
    DType("I32", 32, 9, "int32", "int32"),
    DType("U32", 32, 10, "uint32", "uint32"),
    DType("F32", 32, 11, "float32", "float32"),
    DType("C64", 64, None, "complex64", "complex64"),
    DType("F64", 64, 12, "float64", "float64"),
    DType("I64", 64, 13, "int64", "int64"),
    DType("U64", 64, 14, "uint64", "uint64"),
)

SAFETENSORS_CODE: dict[str, int] = {d.name: code for code, d in enumerate(DTYPES)}
"""safetensors dtype string -> code."""

BINTENSORS_CODE: dict[int, int] = {
    d.bintensors_id: code for code, d in enumerate(DTYPES) if d.bintensors_id is not None
}
"""bintensors dtype id -> code."""

BINTENSORS_ID: dict[int, int] = {code: dtype_id for dtype_id, code in BINTENSORS_CODE.items()}
"""code -> bintensors dtype id, for the dtypes bintensors has."""


@cache
def numpy_dtype(code: int) -> np.dtype[Any] | None:
    """The little-endian NumPy dtype for ``code``; None for packed sub-byte types."""
    name = DTYPES[code].numpy_name
    if name is None:
        return None
    if name.startswith(("float8", "bfloat")):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name).newbyteorder("<")


@cache
def _codes_by_numpy() -> dict[np.dtype[Any], int]:
    return {
        dtype: code
        for code in range(len(DTYPES))
        if (dtype := numpy_dtype(code)) is not None
    }


def code_of_numpy(dtype: np.dtype[Any]) -> int | None:
    """The code for a NumPy dtype (either byte order), or None if neither format has it."""
    codes = _codes_by_numpy()
    code = codes.get(dtype)
    if code is None and dtype.byteorder == ">":
        code = codes.get(dtype.newbyteorder("<"))
    return code
