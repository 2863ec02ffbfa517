"""tensorlift: moves model weights into memory fast and safely.

A drop-in for `safetensors` (safe_open, serialize, serialize_file, deserialize,
TensorSpec, tensorlift.torch, tensorlift.numpy) and `fastsafetensors`
(tensorlift.fastsafetensors), plus the fast paths
`tensorlift.load` (name -> tensor) and `tensorlift.stream` ((name, tensor)
pairs as their bytes land, the rest read meanwhile). Errors: tensorlift.FormatError (a ValueError) for files that
break the format, FileNotFoundError / PermissionError / OSError for I/O,
KeyError for a missing tensor. tensorlift.SafetensorError is the common base
of FormatError, the missing-tensor KeyError and safe_open's usage errors; when
the safetensors package is installed it is also a safetensors.SafetensorError,
so code that catches the reference's error catches tensorlift's. GPU loads keep their pinned staging memory
for the next load; tensorlift.release_pinned_staging() frees it. See docs/python.md.
"""
from ._tensorlift import __version__, release_pinned_staging
from ._errors import FormatError, SafetensorError
from ._core import content_root, load
from ._stream import stream
from ._safe_open import _safe_open_handle, safe_open
from ._serialize import TensorSpec, deserialize, serialize, serialize_file

__all__ = ["FormatError", "SafetensorError", "TensorSpec", "content_root", "deserialize", "load", "safe_open",
           "serialize", "serialize_file", "stream", "release_pinned_staging", "__version__"]
