"""tensorlift: moves model weights into memory fast and safely.

A drop-in for `safetensors` (safe_open, tensorlift.torch, tensorlift.numpy) and
`fastsafetensors` (tensorlift.fastsafetensors), plus the fast path
`tensorlift.load`. Errors: tensorlift.FormatError (a ValueError) for files that
break the format, FileNotFoundError / PermissionError / OSError for I/O,
KeyError for a missing tensor. tensorlift.SafetensorError is the common base
of FormatError, the missing-tensor KeyError and safe_open's usage errors
(like safetensors.SafetensorError). See docs/python.md.
"""
from ._tensorlift import FormatError, SafetensorError, __version__
from ._core import load
from ._safe_open import safe_open

__all__ = ["FormatError", "SafetensorError", "load", "safe_open", "__version__"]
