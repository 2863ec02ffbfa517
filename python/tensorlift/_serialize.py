"""safetensors' low-level functions: TensorSpec, serialize, serialize_file, deserialize.

The same signatures, argument checks and results as safetensors 0.8's
(`from safetensors import serialize, ...`), over tensorlift's C++ writer and
validating parser: files are byte-identical to the reference writer's, and
serialize_file writes a temporary file in the target's directory and renames it
over the target, so a reader that has the old file mapped keeps its bytes.

What differs (docs/python.md): deserialize returns the tensors in file order
(the reference's order is a hash map's, different from run to run), and the
messages after the reference's "Error while serializing: " / "Error while
deserializing: <the reference's words for the rule>: " prefixes are tensorlift's
(they name the rule broken).
"""
from __future__ import annotations

import operator
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import _tensorlift
from ._core import check_metadata
from ._errors import SafetensorError, deserializing, not_instance, path_argument, serializing

__all__ = ["TensorSpec", "serialize", "serialize_file", "deserialize"]

# The dtype names TensorSpec takes (torch's and numpy's names) and the format's codes.
_CODES = {
    "bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "int32": "I32",
    "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "float32": "F32", "float64": "F64",
    "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4", "complex64": "C64",
}


def _type_error(argument: str, value, expected: str) -> TypeError:
    return not_instance(argument, value, expected)


# What the C++ writer and parser raise for a bad argument, a file that breaks the format, or I/O.
_NATIVE_ERRORS = (ValueError, OSError, _tensorlift.SafetensorError)


def write_bytes(specs, metadata) -> bytes:
    """The C++ writer's bytes for `specs`; its errors as the reference's
    SafetensorError("Error while serializing: ...")."""
    try:
        return _tensorlift.serialize(specs, metadata)
    except _NATIVE_ERRORS as e:
        raise serializing(e) from None


def write_file(specs, path: str, metadata) -> None:
    """The C++ writer's file for `specs` at `path` (through a temporary file renamed over it); its
    errors, I/O ones included, as the reference's SafetensorError("Error while serializing: ...")."""
    try:
        _tensorlift.serialize_file(specs, path, metadata)
    except _NATIVE_ERRORS as e:
        raise serializing(e) from None


def parse_bytes(data, bytes_like: bool = False) -> tuple:
    """(data as bytes, tensors, data offset) of a whole file held in `data`: bytes, or with
    bytes_like any object with the buffer protocol (bytearray, memoryview), else the reference's
    TypeError; a bad file is a FormatError worded as the reference's "Error while deserializing:
    <what>: ..."."""
    if not isinstance(data, bytes):
        try:
            if not bytes_like:
                raise TypeError
            data = bytes(memoryview(data))
        except TypeError:
            raise not_instance("bytes", data, "bytes") from None
    try:
        tensors, _, data_offset = _tensorlift.parse_header(data)
        return data, tensors, data_offset
    except _NATIVE_ERRORS as e:
        raise deserializing(e, "Error while deserializing: ") from None


def _unsigned(argument: str, value) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"argument '{argument}': '{type(value).__name__}' object cannot be interpreted as an "
                        "integer") from None
    if n < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return n


class TensorSpec:
    """One tensor for serialize / serialize_file: TensorSpec(*, dtype, shape, data_ptr, data_len).

    dtype: a torch/numpy dtype name ("float32", "bfloat16", "float8_e4m3fn", ...),
    checked here (SafetensorError for an unknown one); `.dtype` is the format's code
    ("F32"). shape: the framework's shape; for "float4_e2m1fn_x2" (two F4 values a
    byte) the last dimension is doubled, so `.shape` is the header's F4 shape.
    data_ptr / data_len: the address and size of the tensor's contiguous bytes, which
    the caller keeps alive while serializing.
    """

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape: Sequence[int], data_ptr: int, data_len: int) -> None:
        if not isinstance(dtype, str):
            raise _type_error("dtype", dtype, "str")
        code = _CODES.get(dtype)
        if code is None:
            raise SafetensorError(f'Unknown dtype "{dtype}". Supported dtypes: {", ".join(_CODES)}')
        dims = [_unsigned("shape", d) for d in shape]
        if code == "F4" and dims:
            dims[-1] *= 2
        self._dtype = code
        self._shape = dims
        self._data_ptr = _unsigned("data_ptr", data_ptr)
        self._data_len = _unsigned("data_len", data_len)

    @property
    def dtype(self) -> str:
        """The format's dtype code ("F32", "BF16", "F8_E5M2FNUZ", ...)."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        """The header's shape (F4: the last dimension counts F4 values)."""
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        return self._data_ptr

    @property
    def data_len(self) -> int:
        return self._data_len

    def __repr__(self) -> str:
        return (f"TensorSpec(dtype={self._dtype!r}, shape={self._shape!r}, data_ptr={self._data_ptr}, "
                f"data_len={self._data_len})")


def _specs(tensor_dict) -> List[Tuple[str, str, List[int], int, int]]:
    if not isinstance(tensor_dict, dict):
        raise _type_error("tensor_dict", tensor_dict, "dict")
    specs = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise _type_error("tensor_dict", name, "str")
        if not isinstance(spec, TensorSpec):
            raise _type_error("tensor_dict", spec, "TensorSpec")
        specs.append((name, spec._dtype, spec._shape, spec._data_ptr if spec._data_len else 0, spec._data_len))
    return specs


def serialize(tensor_dict: Dict[str, TensorSpec], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The safetensors bytes of `tensor_dict` (name -> TensorSpec), with `metadata` (str -> str)."""
    specs = _specs(tensor_dict)
    check_metadata(metadata)
    return write_bytes(specs, metadata)


def serialize_file(tensor_dict: Dict[str, TensorSpec], filename: Union[str, os.PathLike],
                   metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes serialize()'s bytes to `filename`, through a temporary file renamed over it."""
    specs = _specs(tensor_dict)
    path = path_argument(filename)
    check_metadata(metadata)
    write_file(specs, path, metadata)


def deserialize(bytes) -> List[Tuple[str, Dict[str, object]]]:  # noqa: A002 (the reference's name)
    """[(name, {"shape": [...], "dtype": "F32", "data": bytearray}), ...] of a whole file held in
    `bytes`, in file order, every byte validated first."""
    _, tensors, data_offset = parse_bytes(bytes)
    view = memoryview(bytes)
    return [(name, {"shape": list(shape), "dtype": dtype,
                    "data": bytearray(view[data_offset + begin:data_offset + end])})
            for name, dtype, shape, begin, end in tensors]
