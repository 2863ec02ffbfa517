"""tensorlift: moves model weights into memory fast and safely.

A drop-in for `safetensors` (safe_open, tensorlift.torch, tensorlift.numpy) and
`fastsafetensors` (tensorlift.fastsafetensors), plus the fast path
`tensorlift.load`. Errors: tensorlift.FormatError (a ValueError) for files that
break the format, FileNotFoundError / PermissionError / OSError for I/O,
KeyError for a missing tensor.
"""
from ._tensorlift import FormatError, __version__
from ._core import load

__all__ = ["FormatError", "load", "__version__"]
