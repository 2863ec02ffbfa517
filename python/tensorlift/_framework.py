"""The framework modules' common part (tensorlift.flax, .tensorflow, .mlx, .paddle).

Each is safetensors' module of the same name over tensorlift.numpy: arrays go
through numpy on the way in and out. Unlike the reference's, the module imports
without its framework; each function then raises the reference's error, the
ModuleNotFoundError of the framework's import (docs/python.md).
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Union

import numpy as np

from . import numpy as _tl_np
from ._framework_table import framework, paddle_from_numpy  # noqa: F401 (importable from here as before)


class NumpyBridge:
    """save, save_file, load and load_file of one framework, given its conversions to and from
    numpy arrays (each takes the framework's module first)."""

    def __init__(self, module: str, to_numpy: Callable, from_numpy: Callable):
        self.module = module
        self.to_numpy = to_numpy
        self.from_numpy = from_numpy

    def to_np(self, tensors: Dict[str, object]) -> Dict[str, np.ndarray]:
        fw = framework(self.module)
        return {k: self.to_numpy(fw, v) for k, v in tensors.items()}

    def from_np(self, arrays: Dict[str, np.ndarray]) -> Dict[str, object]:
        fw = framework(self.module)
        return {k: self.from_numpy(fw, v) for k, v in arrays.items()}

    def in_place(self, tensors: Dict[str, object], to_numpy: bool) -> Dict[str, object]:
        """The dict's values converted in place (the reference's _np2X / _X2np helpers do so)."""
        fw = framework(self.module)
        convert = self.to_numpy if to_numpy else self.from_numpy
        for k, v in tensors.items():
            tensors[k] = convert(fw, v)
        return tensors

    def save(self, tensors, metadata: Optional[Dict[str, str]] = None) -> bytes:
        return _tl_np.save(self.to_np(tensors), metadata=metadata)

    def save_file(self, tensors, filename: Union[str, os.PathLike], metadata: Optional[Dict[str, str]] = None) -> None:
        _tl_np.save_file(self.to_np(tensors), filename, metadata=metadata)

    def load(self, data: bytes):
        framework(self.module)
        return self.from_np(_tl_np.load(data))

    def load_file(self, filename: Union[str, os.PathLike]):
        framework(self.module)
        return self.from_np(_tl_np.load_file(filename))

    def functions(self, module_name: str, what: str):
        """save, save_file, load and load_file for the module `module_name`, whose tensors are `what`."""

        def save(tensors: Dict[str, object], metadata: Optional[Dict[str, str]] = None) -> bytes:
            return self.save(tensors, metadata)

        def save_file(tensors: Dict[str, object], filename: Union[str, os.PathLike],
                      metadata: Optional[Dict[str, str]] = None) -> None:
            self.save_file(tensors, filename, metadata)

        def load(data: bytes) -> Dict[str, object]:
            return self.load(data)

        def load_file(filename: Union[str, os.PathLike]) -> Dict[str, object]:
            return self.load_file(filename)

        save.__doc__ = f"The safetensors bytes of {what}."
        save_file.__doc__ = f"Writes {what} to `filename` (through a temporary file renamed over it)."
        load.__doc__ = f"{what} from a safetensors file held in `data`."
        load_file.__doc__ = f"{what} of every tensor of `filename`, in file order."
        for fn in (save, save_file, load, load_file):
            fn.__module__ = module_name
            fn.__qualname__ = fn.__name__
        return save, save_file, load, load_file
