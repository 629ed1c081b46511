"""C spellings of autosched dtypes, for prototypes and C drivers of exported libraries."""

from __future__ import annotations

_C = {
    "float16": "_Float16", "bfloat16": "uint16_t", "float32": "float", "float64": "double", "bool": "uint8_t",
    "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
}


def c_type(dtype: str) -> str:
    return _C[dtype]
