"""tensorlift.tensorflow: safetensors.tensorflow (save, save_file, load, load_file of tf
Tensors) over tensorlift.numpy. Without tensorflow it imports; its functions raise
ModuleNotFoundError (tensorflow's). A 0-d Tensor saves (the reference's numpy scalar does not)."""
from __future__ import annotations

from typing import Dict, Optional, Union  # noqa: F401 (Optional, Union: names the reference has)

import numpy as np

from ._framework import NumpyBridge
from ._safe_open import safe_open  # noqa: F401 (the reference's module has it)

__all__ = ["save", "save_file", "load", "load_file"]

_bridge = NumpyBridge("tensorflow", lambda tf, t: np.asarray(t.numpy()), lambda tf, a: tf.convert_to_tensor(a))
save, save_file, load, load_file = _bridge.functions(__name__, "tf Tensors")


def _np2tf(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, object]:
    """Converted in place, as the reference does."""
    return _bridge.in_place(numpy_dict, to_numpy=False)


def _tf2np(tensors: Dict[str, object]) -> Dict[str, np.ndarray]:
    """Converted in place, as the reference does."""
    return _bridge.in_place(tensors, to_numpy=True)
