"""tensorlift's exceptions as the safetensors drop-in raises them.

SafetensorError: tensorlift's, and when the reference `safetensors` package is
importable, also a subclass of `safetensors.SafetensorError`, so that code
written for the reference (`except safetensors.SafetensorError`) catches what
tensorlift raises; FormatError (the C++ core's, a ValueError) derives from it.
Without the reference, tensorlift's own class is used: tensorlift never needs
safetensors installed.

The helpers give messages in the reference's words: pyo3's argument errors
("argument 'name': 'int' object is not an instance of 'str'"), and the
reference's "Error while deserializing header: <what>" / "Error while
serializing: ..." prefixes, followed by tensorlift's own message (the path, the
rule broken and its details).
"""
from __future__ import annotations

import os
import re
from typing import Optional

from ._tensorlift import FormatError
from ._tensorlift import SafetensorError as _NativeSafetensorError

__all__ = ["FormatError", "SafetensorError", "reference_error"]


def _reference_class() -> Optional[type]:
    """safetensors.SafetensorError when the reference is importable (and is not tensorlift
    itself under that name), else None."""
    try:
        from safetensors import SafetensorError as ref
    except Exception:  # noqa: BLE001 - not installed, or broken: tensorlift works alone.
        return None
    if not (isinstance(ref, type) and issubclass(ref, Exception)) or issubclass(ref, _NativeSafetensorError):
        return None
    return ref


_REFERENCE = _reference_class()

if _REFERENCE is None:
    SafetensorError = _NativeSafetensorError
else:
    class SafetensorError(_NativeSafetensorError, _REFERENCE):  # type: ignore[no-redef]
        """Base of tensorlift's safetensors errors (FormatError, missing tensor, closed file);
        also a safetensors.SafetensorError."""

    SafetensorError.__module__ = "tensorlift"
    SafetensorError.__qualname__ = "SafetensorError"
    _NativeSafetensorError.__module__ = "tensorlift._tensorlift"  # Its own name, where it is.
    # The C++ core's FormatError derives from its own SafetensorError; make it derive from
    # this one (its layout and first base are unchanged, which is what Python requires).
    FormatError.__bases__ = (ValueError, SafetensorError)


def reference_error() -> Optional[type]:
    """The reference's SafetensorError that tensorlift's derives from (None: not importable)."""
    return _REFERENCE


def not_instance(argument: str, value, expected: str) -> TypeError:
    """pyo3's TypeError for an argument of the wrong type, as the reference raises it."""
    what = "'None'" if value is None else f"'{type(value).__name__}' object"
    return TypeError(f"argument '{argument}': {what} is not an instance of '{expected}'")


def path_argument(filename, argument: str = "filename") -> str:
    """`filename` as the reference takes a path: str or os.PathLike giving str (TypeError otherwise,
    with pyo3's words; bytes paths are refused, as the reference does)."""
    try:
        path = os.fspath(filename)
    except TypeError as e:
        raise TypeError(f"argument '{argument}': {e}") from None
    if not isinstance(path, str):
        raise not_instance(argument, path, "str")
    return path


# The reference's words for each rule of the format (its SafeTensorError's Display), by the
# rule's name, which tensorlift's FormatError messages carry.
_REFERENCE_WORDS = {
    "HeaderTooSmall": "header too small",
    "HeaderTooLarge": "header too large",
    "InvalidHeaderLength": "invalid header length",
    "InvalidHeader": "invalid UTF-8 in header",
    "InvalidHeaderStart": "invalid start character in header, must be `{`",
    "InvalidHeaderDeserialization": "invalid JSON in header",
    "MetadataIncompleteBuffer": "incomplete metadata, file not fully covered",
    "InvalidOffset": "invalid offset for tensor",
    "TensorInvalidInfo": "invalid shape, data type, or offset for tensor",
    "ValidationOverflow": "overflow computing buffer size from shape and/or element type",
    "MisalignedSlice": "The slice is slicing for subbytes dtypes, and the slice does not end up at a byte boundary,"
                       " this is invalid",
}
_RULE = re.compile(r"(?:^|: )(" + "|".join(sorted(_REFERENCE_WORDS, key=len, reverse=True)) + r"): ")


def deserializing(e: BaseException, prefix: str) -> FormatError:
    """A FormatError whose message is `prefix` ("Error while deserializing header: " for files,
    "Error while deserializing: " for bytes), the reference's words for the rule `e` names, then
    `e`'s own message."""
    msg = str(e)
    m = _RULE.search(msg)
    words = _REFERENCE_WORDS[m.group(1)] + ": " if m else ""
    return FormatError(f"{prefix}{words}{msg}")


def serializing(e: BaseException) -> SafetensorError:
    """The reference's SafetensorError("Error while serializing: ...") for an error of the writer
    (I/O errors as "I/O error: ...", as the reference words them)."""
    io = "I/O error: " if isinstance(e, OSError) else ""
    return SafetensorError(f"Error while serializing: {io}{e}")
