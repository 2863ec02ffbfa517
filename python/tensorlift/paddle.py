"""tensorlift.paddle: safetensors.paddle (save, save_file, load, load_file, and its
helpers) over tensorlift's writer and reader. Without paddle it imports; its
functions and dtype tables raise ModuleNotFoundError (paddle's), as the
reference's import does."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Union

import numpy as np

from . import numpy as _tl_np
from ._framework import framework
from ._safe_open import safe_open  # noqa: F401 (the reference's module has it)
from ._serialize import TensorSpec, deserialize, serialize, serialize_file

__all__ = ["save", "save_file", "load", "load_file"]


def _paddle():
    return framework("paddle")


def _new_enough(paddle) -> bool:
    """Paddle 3.2 and later build tensors over bytes (the reference's test, kept)."""
    return paddle.__version__ >= "3.2.0"


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The safetensors bytes of paddle Tensors (contiguous, any device)."""
    keep: list = []
    return serialize(_flatten(tensors, keep), metadata=metadata)


def save_file(tensors: Dict[str, Any], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes paddle Tensors to `filename` (through a temporary file renamed over it)."""
    keep: list = []
    serialize_file(_flatten(tensors, keep), filename, metadata=metadata)


def load(data: bytes, device: str = "cpu") -> Dict[str, Any]:
    """paddle Tensors on `device` from a safetensors file held in `data`."""
    paddle = _paddle()
    if _new_enough(paddle):
        return _view2paddle(deserialize(data), device)
    return _np2paddle(_tl_np.load(data), device)


def load_file(filename: Union[str, os.PathLike], device="cpu", *, backend: str = "mmap") -> Dict[str, Any]:
    """paddle Tensors on `device` of every tensor of `filename`, in file order (backend: accepted,
    as safe_open's)."""
    _paddle()
    if backend not in ("mmap", "pread"):
        from ._errors import SafetensorError
        raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')
    # The whole file in memory once, then Tensors over its bytes (as load): paddle builds
    # its bfloat16/float8 Tensors from bytes, not from numpy arrays.
    with open(filename, "rb") as f:
        data = f.read()
    return load(data, device)


def _np2paddle(numpy_dict: Dict[str, np.ndarray], device: str = "cpu") -> Dict[str, Any]:
    """The dict's arrays replaced (in place) by paddle Tensors on `device`."""
    paddle = _paddle()
    for k, v in numpy_dict.items():
        numpy_dict[k] = paddle.to_tensor(v, place=device)
    return numpy_dict


def _paddle2np(paddle_dict: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """The dict's Tensors replaced (in place) by numpy arrays of their values (on the CPU)."""
    for k, v in paddle_dict.items():
        paddle_dict[k] = v.detach().cpu().numpy()
    return paddle_dict


def _tables():
    paddle = _paddle()
    size = {paddle.int64: 8, paddle.float32: 4, paddle.int32: 4, paddle.bfloat16: 2, paddle.float16: 2,
            paddle.int16: 2, paddle.uint8: 1, paddle.int8: 1, paddle.bool: 1, paddle.float64: 8,
            paddle.float8_e4m3fn: 1, paddle.float8_e5m2: 1, paddle.complex64: 8}
    types = {"F64": paddle.float64, "F32": paddle.float32, "F16": paddle.float16, "BF16": paddle.bfloat16,
             "I64": paddle.int64, "I32": paddle.int32, "I16": paddle.int16, "I8": paddle.int8, "U8": paddle.uint8,
             "BOOL": paddle.bool, "F8_E4M3": paddle.float8_e4m3fn, "F8_E5M2": paddle.float8_e5m2}
    # Byte swapping on big-endian hosts: a numpy type of each width (bfloat16 as float16, float8 as uint8).
    npdtypes = {paddle.int64: np.int64, paddle.float32: np.float32, paddle.int32: np.int32,
                paddle.bfloat16: np.float16, paddle.float16: np.float16, paddle.int16: np.int16,
                paddle.uint8: np.uint8, paddle.int8: np.int8, paddle.bool: bool, paddle.float64: np.float64,
                paddle.float8_e4m3fn: np.uint8, paddle.float8_e5m2: np.uint8}
    return {"_SIZE": size, "_TYPES": types, "NPDTYPES": npdtypes}


def __getattr__(name: str):
    # _SIZE, _TYPES and NPDTYPES are made of paddle's dtypes: built on first use.
    if name in ("_SIZE", "_TYPES", "NPDTYPES"):
        tables = _tables()
        globals().update(tables)
        return tables[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"_SIZE", "_TYPES", "NPDTYPES"})


def _getdtype(dtype_str: str):
    """The paddle dtype of a format code (KeyError for one safetensors.paddle does not map)."""
    return __getattr__("_TYPES")[dtype_str]


def _view2paddle(safeview, device) -> Dict[str, Any]:
    """paddle Tensors on `device` from deserialize()'s list."""
    paddle = _paddle()
    out = {}
    for name, v in safeview:
        dtype = _getdtype(v["dtype"])
        if len(v["data"]) == 0:
            t = paddle.empty(v["shape"], dtype=dtype)
        else:
            t = paddle.base.core.frombuffer(v["data"], dtype).reshape(v["shape"])
            if device != "cpu":
                t = t.to(device)
        if sys.byteorder == "big":
            t = paddle.to_tensor(t.numpy().byteswap(inplace=False), place=device)
        out[name] = t
    return out


def _to_ndarray(tensor, name: str):
    """(a uint8 numpy array over the (CPU) tensor's bytes, the tensor it views); ValueError for a
    non-contiguous tensor."""
    if not tensor.is_contiguous():
        raise ValueError(
            f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means you"
            " are trying to save tensors which are reference of each other in which case it's recommended to save"
            " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
            " pack it before saving.")
    if not tensor.place.is_cpu_place():
        tensor = tensor.cpu()
    nbytes = int(np.prod(tensor.shape, dtype=np.int64)) * __getattr__("_SIZE")[tensor.dtype]
    if tensor.data_ptr() == 0:
        return np.empty(0), 0
    import ctypes
    data = np.ctypeslib.as_array(ctypes.cast(tensor.data_ptr(), ctypes.POINTER(ctypes.c_ubyte)), (nbytes,))
    if sys.byteorder == "big":
        data = data.view(__getattr__("NPDTYPES")[tensor.dtype]).byteswap(inplace=False)
    return data, tensor


def _flatten(tensors: Dict[str, Any], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """name -> TensorSpec over each Tensor's bytes, for serialize(); what they point into is
    appended to keep_alive_buffer."""
    paddle = _paddle()
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, paddle.Tensor] but received {type(tensors)}")
    for k, v in tensors.items():
        if not isinstance(v, paddle.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected paddle.Tensor but received {type(v)}")
    out = {}
    for k, v in tensors.items():
        arr, ref = _to_ndarray(v, k)
        keep_alive_buffer.append((arr, ref))
        out[k] = TensorSpec(dtype=str(v.dtype).split(".")[-1], shape=v.shape, data_ptr=arr.ctypes.data,
                            data_len=arr.nbytes)
    return out
