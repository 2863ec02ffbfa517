"""tensorlift.flax: safetensors.flax (save, save_file, load, load_file of jax Arrays) over
tensorlift.numpy. Without jax it imports; its functions raise ModuleNotFoundError (jax's)."""
from __future__ import annotations

from typing import Dict, Optional, Union  # noqa: F401 (Optional, Union: names the reference has)

import numpy as np

from ._framework import NumpyBridge
from ._safe_open import safe_open  # noqa: F401 (the reference's module has it)

__all__ = ["save", "save_file", "load", "load_file"]

_bridge = NumpyBridge("jax.numpy", lambda jnp, a: np.asarray(a), lambda jnp, a: jnp.array(a))
save, save_file, load, load_file = _bridge.functions(__name__, "jax arrays")


def _np2jnp(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, object]:
    """Converted in place, as the reference does."""
    return _bridge.in_place(numpy_dict, to_numpy=False)


def _jnp2np(tensors: Dict[str, object]) -> Dict[str, np.ndarray]:
    """Converted in place, as the reference does."""
    return _bridge.in_place(tensors, to_numpy=True)


def __getattr__(name: str):
    if name == "Array":  # jax.Array, as the reference imports it (ModuleNotFoundError without jax).
        from ._framework import framework
        return framework("jax").Array
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
