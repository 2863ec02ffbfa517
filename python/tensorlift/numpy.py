"""tensorlift.numpy: safetensors.numpy's functions (save, save_file, load,
load_file) with the same signatures, over tensorlift's writer and loader.

Files are byte-identical to the reference writer's for C-contiguous
little-endian (or byte-order-free) arrays. bfloat16 and the float8 types come
from ml_dtypes; dtypes numpy lacks come back as raw uint8 (docs/python.md).
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Union

import numpy as np

from . import _dtypes
from ._core import check_metadata as _check_metadata
from ._errors import SafetensorError, not_instance, path_argument
from ._safe_open import safe_open
from ._serialize import _CODES, TensorSpec, deserialize, parse_bytes, serialize, serialize_file, write_bytes, write_file

__all__ = ["save", "save_file", "load", "load_file"]


def _little_endian(a: np.ndarray) -> np.ndarray:
    order = a.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        return a.astype(a.dtype.newbyteorder("<"))
    return a


def _st_dtype(a: np.ndarray) -> str:
    """The format's dtype of `a`; the reference's SafetensorError for a dtype it has not."""
    try:
        return _dtypes.st_dtype_of_numpy(a)
    except ValueError:
        raise SafetensorError(f'Unknown dtype "{a.dtype.name}". Supported dtypes: {", ".join(_CODES)}') from None


def _specs(tensor_dict: Dict[str, np.ndarray], keep_alive: list) -> list:
    """(name, dtype, shape, data_ptr, nbytes) for the C++ writer; the arrays the pointers point
    into are appended to keep_alive. Checked in the reference's order: each array's dtype, then
    every name a str."""
    if not isinstance(tensor_dict, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    specs = []
    for name, a in tensor_dict.items():
        if not isinstance(a, np.ndarray):
            raise ValueError(f"Key `{name}` is invalid, expected np.ndarray but received {type(a)}")
        # The values the array shows, in C order: numpy views (strided,
        # Fortran-ordered) are written as what they contain.
        a = _little_endian(a)
        dtype = _st_dtype(a)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d.)
        keep_alive.append(a)
        specs.append((name, dtype, list(a.shape), a.ctypes.data if a.nbytes else 0, a.nbytes))
    for name in tensor_dict:
        if not isinstance(name, str):
            raise not_instance("tensor_dict", name, "str")
    return specs


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding the arrays and the text `metadata`."""
    keep_alive: list = []
    specs = _specs(tensor_dict, keep_alive)
    _check_metadata(metadata)
    return write_bytes(specs, metadata)


def save_file(tensor_dict: Dict[str, np.ndarray], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes the arrays to `filename` (through a temporary file renamed over it)."""
    keep_alive: list = []
    specs = _specs(tensor_dict, keep_alive)
    path = path_argument(filename)
    _check_metadata(metadata)
    write_file(specs, path, metadata)


def load(data: bytes) -> Dict[str, np.ndarray]:
    """The arrays of a safetensors file held in `data` (bytes, or any
    bytes-like object), each in memory of its own."""
    data, tensors, data_offset = parse_bytes(data, bytes_like=True)
    out = {}
    for name, dtype, shape, begin, end in tensors:
        raw = np.frombuffer(data, dtype=np.uint8, count=end - begin, offset=data_offset + begin).copy()
        out[name] = _dtypes.numpy_view(raw, dtype, shape)
    return out


def load_file(filename: Union[str, os.PathLike], *, backend: str = "mmap") -> Dict[str, np.ndarray]:
    """Every array of a safetensors file, in file order.

    backend is accepted for compatibility; tensorlift reads with its own loader."""
    with safe_open(filename, framework="np", backend=backend) as f:
        return f.get_tensors()


# --- safetensors.numpy's helpers (the same semantics as safetensors 0.8's) -----

# The format's dtype codes that safetensors.numpy maps to numpy dtypes.
_TYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "U64": np.uint64,
          "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8,
          "BOOL": bool, "C64": np.complex64}


def _getdtype(dtype_str: str) -> np.dtype:
    """The numpy dtype of a format code (KeyError for one safetensors.numpy does not map)."""
    return _TYPES[dtype_str]


def _is_little_endian(tensor: np.ndarray) -> bool:
    """Whether the array's bytes are little-endian (or have no byte order)."""
    order = tensor.dtype.byteorder
    if order == "=":
        return sys.byteorder == "little"
    if order in ("|", "<"):
        return True
    if order == ">":
        return False
    raise ValueError(f"Unexpected byte order {order}")


def _flatten(tensor_dict: Dict[str, np.ndarray], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """name -> TensorSpec over each array's bytes (a little-endian copy of a big-endian one, kept
    alive in keep_alive_buffer), for serialize()."""
    out = {}
    for name, a in tensor_dict.items():
        if not _is_little_endian(a):
            a = a.byteswap(inplace=False)
            keep_alive_buffer.append(a)
        out[name] = TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
    return out


def _view2np(safeview) -> Dict[str, np.ndarray]:
    """Arrays from deserialize()'s list, each over its own bytearray (no copy)."""
    return {name: np.frombuffer(v["data"], dtype=_getdtype(v["dtype"])).reshape(v["shape"]) for name, v in safeview}
