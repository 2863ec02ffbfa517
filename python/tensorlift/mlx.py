"""tensorlift.mlx: safetensors.mlx (save, save_file, load, load_file of mlx arrays) over
tensorlift.numpy. Without mlx it imports; its functions raise ModuleNotFoundError (mlx's)."""
from __future__ import annotations

from typing import Dict, Optional, Union  # noqa: F401 (Optional, Union: names the reference has)

import numpy as np

from ._framework import NumpyBridge
from ._safe_open import safe_open  # noqa: F401 (the reference's module has it)

__all__ = ["save", "save_file", "load", "load_file"]

_bridge = NumpyBridge("mlx.core", lambda mx, a: np.asarray(a), lambda mx, a: mx.array(a))
save, save_file, load, load_file = _bridge.functions(__name__, "mlx arrays")


def _np2mx(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, object]:
    """Converted in place, as the reference does."""
    return _bridge.in_place(numpy_dict, to_numpy=False)


def _mx2np(tensors: Dict[str, object]) -> Dict[str, np.ndarray]:
    """A new dict, as the reference returns."""
    return _bridge.to_np(tensors)
