"""Turning the C++ core's loaded buffers into torch tensors and numpy arrays
without copies (DLPack). A leaf: every module that hands out tensors imports it
(_core, remote, _safe_open, fastsafetensors, offload), and it imports none of them."""
from __future__ import annotations

import numpy as np

from . import _dtypes
from ._tensorlift import Loaded


class _DLPackBytes:
    """The raw bytes of one loaded tensor, offered through the DLPack protocol."""

    __slots__ = ("_loaded", "_name")

    def __init__(self, loaded: Loaded, name: str):
        self._loaded = loaded
        self._name = name

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # GPU loads synchronize their copy stream before they return: the
        # bytes are ready for any consumer stream, so `stream` needs no wait.
        versioned = max_version is not None and max_version[0] >= 1
        return self._loaded.dlpack(self._name, versioned=versioned, raw_bytes=True)

    def __dlpack_device__(self):
        return self._loaded.device(self._name)


# Dtypes whose DLPack export torch imports as they are (every torch release
# tensorlift supports): one typed capsule, 1 us a tensor instead of 7-12 us for
# raw bytes, then a dtype view and a reshape (the load of a checkpoint hands out
# hundreds to thousands of tensors).
_TORCH_TYPED = frozenset({"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"})


TORCH_NAMES = ("pt", "torch", "pytorch")


def require_framework(framework: str, caller: str) -> None:
    """Before any read: torch is importable when `framework` asks for torch tensors, else one error
    that names both ways out (tensorlift never hands back another type in their place)."""
    if framework not in TORCH_NAMES:
        return
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"{caller} returns torch tensors by default (framework=\"pt\"), but torch is not installed: "
            f"pass framework=\"numpy\" for numpy arrays, or install torch with "
            f"`pip install tensorlift[torch]`", name="torch") from e


def tensor_from(loaded: Loaded, name: str, framework: str):
    """A zero-copy tensor over `name`'s bytes in `loaded`, for "pt" or "np"."""
    dtype, shape, _ = loaded.info(name)
    if framework in TORCH_NAMES:
        import torch
        if dtype in _TORCH_TYPED:
            _dtypes.check_dims(shape)
            # GPU loads synchronize their copy stream before they return: the legacy
            # capsule (no stream handshake) is safe for any consumer stream.
            return torch.from_dlpack(loaded.dlpack(name, versioned=False, raw_bytes=False))
        return _dtypes.torch_view(torch.from_dlpack(_DLPackBytes(loaded, name)), dtype, shape)
    raw = _DLPackBytes(loaded, name)
    if framework in ("np", "numpy"):
        if loaded.device(name)[0] != 1:
            raise ValueError("tensorlift: numpy arrays live in host memory; load with device='cpu' for 'np'")
        return _dtypes.numpy_view(np.from_dlpack(raw), dtype, shape)
    raise ValueError(f"tensorlift: unsupported framework {framework!r} (use 'pt' or 'np')")


def device_name(device) -> str:
    """"cpu", "cuda:N" (or "emulated") from a str, an int (a CUDA index) or a torch.device."""
    if device is None:
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    kind = getattr(device, "type", None)  # torch.device
    if kind is not None:
        index = getattr(device, "index", None)
        return kind if kind == "cpu" else f"{kind}:{index or 0}"
    return str(device)
