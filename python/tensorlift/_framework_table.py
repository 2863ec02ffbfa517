"""The frameworks tensorlift hands tensors to: their names, importing one, and numpy arrays
converted into each. A leaf below safe_open (_safe_open) and the framework modules' common part
(_framework), which both use it."""
from __future__ import annotations

import importlib

import numpy as np


def framework(name: str):
    """The framework's module (ModuleNotFoundError, as the reference's import, when it is missing)."""
    return importlib.import_module(name)


def paddle_from_numpy(a: np.ndarray):
    """A paddle Tensor of `a`'s values; bfloat16 and float8 arrays (ml_dtypes) through their bytes,
    which paddle.to_tensor does not take."""
    paddle = framework("paddle")
    by_bytes = {"bfloat16": paddle.bfloat16, "float8_e4m3fn": paddle.float8_e4m3fn, "float8_e5m2": paddle.float8_e5m2}
    dtype = by_bytes.get(a.dtype.name)
    if dtype is None:
        return paddle.to_tensor(a)
    if a.size == 0:
        return paddle.empty(list(a.shape), dtype=dtype)
    return paddle.base.core.frombuffer(bytearray(a.tobytes()), dtype).reshape(list(a.shape))


# safe_open's framework= names, to the framework they mean.
FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np", "flax": "flax", "jax": "flax",
              "tf": "tensorflow", "tensorflow": "tensorflow", "mlx": "mlx", "paddle": "paddle"}
# The reference's names for the frameworks, in its messages.
REFERENCE_NAMES = {"pt": "pytorch", "np": "numpy"}
# Frameworks read through numpy, then converted (the framework imported on first use:
# ModuleNotFoundError, as the reference, when it is missing).
FROM_NUMPY = {
    "flax": lambda a: framework("jax.numpy").array(a),
    "tensorflow": lambda a: framework("tensorflow").convert_to_tensor(a),
    "mlx": lambda a: framework("mlx.core").array(a),
    "paddle": lambda a: paddle_from_numpy(a),
}
