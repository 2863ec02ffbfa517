"""tensorlift.fastsafetensors' types and conversions, shared by the loader (fastsafetensors.py) and
its multi-rank exchange (_fastsafetensors_ranks.py): fastsafetensors' DType, the wrapped tensor,
the process group of one process, and the checks of devices, frameworks and dtypes."""
from __future__ import annotations

import enum
from typing import Any, List, Optional

from . import _dtypes
from ._tensors import device_name


class DType(enum.Enum):
    """The dtype names of fastsafetensors' `st_types.DType` (AUTO: no conversion)."""

    BOOL = "BOOL"
    I8 = "I8"
    I16 = "I16"
    I32 = "I32"
    I64 = "I64"
    U8 = "U8"
    U16 = "U16"
    U32 = "U32"
    U64 = "U64"
    F16 = "F16"
    F32 = "F32"
    F64 = "F64"
    BF16 = "BF16"
    F8_E5M2 = "F8_E5M2"
    F8_E4M3 = "F8_E4M3"
    F8_E8M0 = "F8_E8M0"
    F4 = "F4"
    AUTO = "AUTO"


class TensorNotFoundError(KeyError, ValueError):
    """No tensor of that name was loaded (a KeyError and a ValueError)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class SingleGroup:
    """The process group of a single process (rank 0 of 1), as in fastsafetensors."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def _check_device(device: Any) -> str:
    """"cpu" or "cuda:N" for a str, an int or a torch.device."""
    name = device_name(device)
    if name.split(":", 1)[0].lower() not in ("cpu", "cuda"):
        raise NotImplementedError(
            f"tensorlift.fastsafetensors: device {device!r} is not supported; use 'cpu' or 'cuda:N'")
    return name


def _check_framework(framework: str) -> str:
    if framework in ("pytorch", "pt", "torch"):
        return "pt"
    if framework == "paddle":
        raise NotImplementedError("tensorlift.fastsafetensors: the paddle framework is not supported; use 'pytorch'")
    raise ValueError(f"tensorlift.fastsafetensors: unknown framework {framework!r} (use 'pytorch')")


def _dtype_name(dtype: Any) -> Optional[str]:
    """None for AUTO (no conversion), else the safetensors dtype name."""
    if dtype is None:
        return None
    value = getattr(dtype, "value", dtype)  # our DType or fastsafetensors' DType
    if isinstance(value, str) and value.upper() == "AUTO":
        return None
    try:
        return _dtypes.safetensors_name(value)
    except ValueError:
        raise ValueError(f"tensorlift.fastsafetensors: unsupported dtype {dtype!r}") from None


class TorchTensor:
    """A wrapped tensor, like fastsafetensors' `TorchTensor`: `.get_raw()` is the torch tensor."""

    __slots__ = ("real_tensor", "dtype")

    def __init__(self, real_tensor, dtype: Optional[str] = None):
        self.real_tensor = real_tensor
        name = dtype or _dtypes.st_dtype_of_torch(real_tensor)
        try:
            self.dtype = DType(name)
        except ValueError:  # a dtype fastsafetensors does not name (C64, F8_E4M3FNUZ, ...)
            self.dtype = name

    def get_raw(self):
        return self.real_tensor

    def get_shape(self) -> List[int]:
        shape = list(self.real_tensor.shape)
        if self.dtype == DType.F4 and shape:
            shape[-1] *= 2
        return shape

    def get_nbytes(self) -> int:
        return self.real_tensor.nbytes

    def contiguous(self) -> "TorchTensor":
        return TorchTensor(self.real_tensor.contiguous())

    def clone(self) -> "TorchTensor":
        return TorchTensor(self.real_tensor.clone())

    def detach(self) -> "TorchTensor":
        return TorchTensor(self.real_tensor.detach())

    def to(self, device=None, dtype=None) -> "TorchTensor":
        return TorchTensor(_to(self.real_tensor, device, dtype))

    def __repr__(self) -> str:
        return f"TorchTensor(dtype={self.dtype}, real_tensor={self.real_tensor!r})"


def _to(t, device=None, dtype=None):
    """Applies get_tensor's optional device/dtype arguments (copies only when they differ)."""
    if device is not None:
        _check_device(getattr(device, "as_str", lambda: device)())
    name = _dtype_name(dtype)
    if name is not None:
        tdt = _dtypes.torch_dtype(name)
        if tdt is None:
            raise ValueError(f"tensorlift.fastsafetensors: torch has no dtype for {name}")
        if t.dtype != tdt:
            t = t.to(dtype=tdt)
    return t
