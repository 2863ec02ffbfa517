"""tensorlift.torch: safetensors.torch's functions (save, save_file, load,
load_file, save_model, load_model) with the same signatures and results,
written over tensorlift's writer and loader.

Files are byte-identical to the reference writer's. Loading goes through the
validating C++ reader; load_file returns tensors that own their memory (DLPack
over tensorlift's buffers, no copy).
"""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

import numpy as np
import torch

from . import _dtypes
from ._core import check_metadata as _check_metadata
from ._safe_open import safe_open
from ._tensorlift import parse_header, serialize, serialize_file

__all__ = ["save", "save_file", "load", "load_file", "save_model", "load_model"]


# --- checks on what is saved -------------------------------------------------

def _storage(t: torch.Tensor) -> Tuple[int, int]:
    """(address, bytes) of the storage under `t`; (0, 0) when it has none (meta)."""
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (NotImplementedError, RuntimeError):
        return 0, 0


def _span(t: torch.Tensor) -> Tuple[int, int]:
    """[first byte, one past the last byte) that `t`'s elements occupy."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _shared_groups(tensors: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Names grouped by the memory they overlap: tensors on one storage whose
    spans intersect (transitively, in address order) form one group. Tensors
    without storage (meta, empty storage) are never grouped."""
    by_storage: Dict[tuple, List[str]] = defaultdict(list)
    for name, t in tensors.items():
        if t.device.type == "meta":
            continue
        ptr, size = _storage(t)
        if ptr == 0 or size == 0:
            continue
        by_storage[(t.device, ptr, size)].append(name)
    groups: List[Set[str]] = []
    for names in by_storage.values():
        spans = sorted((*_span(tensors[n]), n) for n in names)
        current: Set[str] = set()
        reach = None
        for start, stop, name in spans:
            if reach is not None and start < reach:
                current.add(name)
                reach = max(reach, stop)
            else:
                if current:
                    groups.append(current)
                current = {name}
                reach = stop
        if current:
            groups.append(current)
    return groups


def _check_for_save(tensors) -> None:
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}")
        if t.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support. "
            "Make them dense first with `.to_dense()` (the file may get much larger).")
    shared = [g for g in _shared_groups(tensors) if len(g) > 1]
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential differences "
            f"when loading them again: {shared}. Save the model with `save_model` (it keeps one name per "
            "shared storage), or clone the tensors. See https://huggingface.co/docs/safetensors/torch_shared_tensors")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. If it is a view "
                "of another tensor, save the full tensor and slice it after loading; otherwise call "
                "`.contiguous()` on it before saving.")


def _specs(tensors: Dict[str, torch.Tensor], keep_alive: list) -> list:
    """(name, dtype, header shape, data_ptr, nbytes) for the C++ writer; the
    tensors the pointers point into are appended to keep_alive."""
    _check_for_save(tensors)
    specs = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"argument 'tensors': '{type(name).__name__}' object is not an instance of 'str'")
        if t.device.type != "cpu":
            t = t.to("cpu")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()  # Lazy conjugate/negative views: save the values they show.
        dtype = _dtypes.st_dtype_of_torch(t)
        shape = list(t.shape)
        if dtype == "F4":
            if not shape:
                raise ValueError(f"tensor '{name}': a 0-d float4_e2m1fn_x2 tensor has no F4 shape")
            shape[-1] *= 2  # Two F4 values per element; the header counts F4 values.
        nbytes = t.numel() * t.element_size()
        keep_alive.append(t)
        specs.append((name, dtype, shape, t.data_ptr() if nbytes else 0, nbytes))
    return specs


# --- save / load -------------------------------------------------------------

def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding `tensors` (contiguous, dense,
    not sharing memory) and the text `metadata`."""
    _check_metadata(metadata)
    keep_alive: list = []
    return serialize(_specs(tensors, keep_alive), metadata)


def save_file(tensors: Dict[str, torch.Tensor], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes `tensors` to `filename` (through a temporary file renamed over
    it). The GIL is released while writing; do not modify the tensors meanwhile."""
    _check_metadata(metadata)
    keep_alive: list = []
    serialize_file(_specs(tensors, keep_alive), os.fspath(filename), metadata)


def load_file(filename: Union[str, os.PathLike], device: Union[str, int] = "cpu", *,
              backend: str = "mmap") -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, in file order, on `device`.

    backend is accepted for compatibility; tensorlift reads with its own loader."""
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in `data`, each in memory of its own."""
    if not isinstance(data, bytes):
        data = bytes(data)
    tensors, _, data_offset = parse_header(data)
    out = {}
    for name, dtype, shape, begin, end in tensors:
        raw = torch.empty(end - begin, dtype=torch.uint8)
        if end > begin:
            raw.numpy()[:] = np.frombuffer(data, dtype=np.uint8, count=end - begin, offset=data_offset + begin)
        out[name] = _dtypes.torch_view(raw, dtype, shape)
    return out


# --- models with tied weights -------------------------------------------------

def _whole_storage(t: torch.Tensor) -> bool:
    """Whether `t` covers its storage exactly (from its first to its last byte)."""
    ptr, size = _storage(t)
    return t.data_ptr() == ptr and t.numel() * t.element_size() == size


def _names_to_drop(state_dict: Dict[str, torch.Tensor], *, preferred_names: Iterable[str] = (),
                   discard_names: Iterable[str] = ()) -> Dict[str, List[str]]:
    """For each group of tensors sharing memory: the name to keep -> the names
    to drop. The kept name covers its whole storage and is the first in name
    order, preferring names in preferred_names, then names not in discard_names."""
    preferred = set(preferred_names)
    discard = set(discard_names)
    drop: Dict[str, List[str]] = defaultdict(list)
    for group in _shared_groups(state_dict):
        whole = {n for n in group if _whole_storage(state_dict[n])}
        if not whole:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable name to keep"
                f" for saving amongst: {group}. None is covering the entire storage. Refusing to save/load the model"
                " since you could be storing much more memory than needed. Please refer to"
                " https://huggingface.co/docs/safetensors/torch_shared_tensors for more information.")
        candidates = (whole & preferred) or (whole - discard) or whole
        keep = min(candidates)
        for name in sorted(group):
            if name != keep:
                drop[keep].append(name)
    return drop


def save_model(model: torch.nn.Module, filename: str, metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = True) -> None:
    """Saves model.state_dict() to `filename`, keeping one name per group of
    tied (shared) tensors; each dropped name is recorded in the metadata as
    dropped -> kept (user metadata wins on a clash)."""
    state_dict = model.state_dict()
    to_drop = _names_to_drop(state_dict)
    if to_drop:
        metadata = {} if metadata is None else dict(metadata)  # The caller's dict is left as it was.
    for kept, dropped in to_drop.items():
        for name in dropped:
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential "
                         "caveats.") from None


def load_model(model: torch.nn.Module, filename: Union[str, os.PathLike], strict: bool = True,
               device: Union[str, int] = "cpu", *, backend: str = "mmap") -> Tuple[Set[str], List[str]]:
    """Loads `filename` into `model`, tied weights included (a tensor saved
    once under one of its names fills all of them).

    Returns (missing, unexpected): model names the file did not fill (a set),
    and file names the model did not use (a list). With strict, either being
    non-empty raises RuntimeError."""
    state_dict = load_file(filename, device=device, backend=backend)
    dropped = _names_to_drop(model.state_dict(), preferred_names=state_dict.keys())
    missing_list, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing_list)
    for names in dropped.values():
        for name in names:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected
