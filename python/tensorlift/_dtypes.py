"""Mapping safetensors dtypes to torch and numpy dtypes.

Rule for dtypes a framework lacks (documented in docs/python.md): the tensor
comes back as uint8 holding its raw bytes, shaped like the tensor with the last
dimension scaled by bits/8 when that is a whole number (e.g. F6_E2M3 [4, 8] ->
uint8 [4, 6]), and flat [nbytes] otherwise. torch's F4 is float4_e2m1fn_x2 with
the last dimension halved, as the reference does. numpy gets bfloat16 and the
float8 types from ml_dtypes when it is installed.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from ._tensorlift import dtype_bits

_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32",
    "C64": "complex64", "F64": "float64", "I64": "int64", "U64": "uint64",
    "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F4": "float4_e2m1fn_x2",
}

_NUMPY_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32", "C64": "complex64",
    "F64": "float64", "I64": "int64", "U64": "uint64",
}
_ML_DTYPES_NAMES = {
    "BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}


def raw_shape(dtype: str, shape: Sequence[int], nbytes: int) -> Tuple[int, ...]:
    """The uint8 shape for a dtype the framework lacks."""
    bits = dtype_bits(dtype)
    if shape and (shape[-1] * bits) % 8 == 0:
        return tuple(shape[:-1]) + (shape[-1] * bits // 8,)
    return (nbytes,)


def torch_dtype(dtype: str):
    """(torch dtype or None, shape transform) for a safetensors dtype."""
    import torch
    name = _TORCH_NAMES.get(dtype)
    return getattr(torch, name, None) if name else None


def numpy_dtype(dtype: str) -> Optional[np.dtype]:
    name = _NUMPY_NAMES.get(dtype)
    if name:
        return np.dtype(name)
    name = _ML_DTYPES_NAMES.get(dtype)
    if name:
        try:
            import ml_dtypes
            return np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError):
            return None
    return None


_MAX_DIM = (1 << 63) - 1


def check_dims(shape: Sequence[int]) -> None:
    """Frameworks index with int64: a (zero-size) tensor may have larger dimensions in the file."""
    for d in shape:
        if d > _MAX_DIM:
            raise ValueError(f"tensorlift: shape {list(shape)} has a dimension above 2^63-1, "
                             "which torch and numpy cannot represent")


def torch_view(raw, dtype: str, shape: Sequence[int]):
    """A torch tensor of the right dtype/shape over `raw` (1-D uint8), no copy."""
    import torch
    check_dims(shape)
    tdt = torch_dtype(dtype)
    if dtype == "F4" and tdt is not None:
        if shape and shape[-1] % 2 == 0:
            return raw.view(tdt).reshape(tuple(shape[:-1]) + (shape[-1] // 2,))
        tdt = None
    if tdt is None:
        return raw.reshape(raw_shape(dtype, shape, raw.numel()))
    if tdt == torch.bool:
        return raw.view(torch.bool).reshape(tuple(shape))
    return raw.view(tdt).reshape(tuple(shape))


def numpy_view(raw: np.ndarray, dtype: str, shape: Sequence[int]) -> np.ndarray:
    check_dims(shape)
    ndt = numpy_dtype(dtype)
    if ndt is None:
        return raw.reshape(raw_shape(dtype, shape, raw.size))
    return raw.view(ndt).reshape(tuple(shape))


def safetensors_name(dtype) -> str:
    """The safetensors name of a dtype given as a name ("bf16", "BF16"), a torch
    dtype, a numpy dtype, or an enum whose value is one of those."""
    value = getattr(dtype, "value", dtype)
    if isinstance(value, str):
        name = value.upper()
        dtype_bits(name)  # ValueError for an unknown name
        return name
    try:
        import torch
        if isinstance(value, torch.dtype):
            for st_name, torch_name in _TORCH_NAMES.items():
                if getattr(torch, torch_name, None) == value:
                    return st_name
    except ImportError:
        pass
    try:
        return st_dtype_of_numpy(np.empty(0, dtype=value))
    except TypeError:
        pass
    raise ValueError(f"tensorlift: unsupported dtype {dtype!r}")


def st_dtype_of_torch(t) -> str:
    import torch
    for k, v in _TORCH_NAMES.items():
        if getattr(torch, v, None) == t.dtype:
            return k
    raise ValueError(f"tensorlift: dtype {t.dtype} has no safetensors equivalent")


def st_dtype_of_numpy(a: np.ndarray) -> str:
    for k, v in _NUMPY_NAMES.items():
        if a.dtype == np.dtype(v):
            return k
    name = a.dtype.name
    for k, v in _ML_DTYPES_NAMES.items():
        if name == v:
            return k
    raise ValueError(f"tensorlift: dtype {a.dtype} has no safetensors equivalent")
