"""tensorlift.torch: safetensors.torch's functions (save, save_file, load,
load_file, save_model, load_model) with the same signatures and results,
written over tensorlift's writer and loader.

Files are byte-identical to the reference writer's. Loading goes through the
validating C++ reader; load_file returns tensors that own their memory (DLPack
over tensorlift's buffers, no copy).
"""
from __future__ import annotations

import os
import sys
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import numpy as np
import torch

from . import _dtypes
from ._core import check_metadata as _check_metadata
from ._errors import SafetensorError, not_instance, path_argument
from ._safe_open import safe_open
from ._serialize import TensorSpec, deserialize, parse_bytes, serialize, serialize_file, write_bytes, write_file

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


def _check_dense_tensors(tensors) -> None:
    """ValueError unless `tensors` is a dict of strided (not sparse) torch tensors."""
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
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support. You can "
            "make it a dense tensor before saving with `.to_dense()` but be aware this might make a much larger "
            "file than needed.")


def _shared_memory_error(shared) -> RuntimeError:
    """The reference's RuntimeError, word for word, for tensors that share memory."""
    return RuntimeError(
        f"""
            Some tensors share memory, this will lead to duplicate memory on disk and potential differences when loading them again: {shared}.
            A potential way to correctly save your model is to use `save_model`.
            More information at https://huggingface.co/docs/safetensors/torch_shared_tensors
            """)


def _non_contiguous_error(name) -> ValueError:
    """The reference's ValueError, word for word, for a non-contiguous tensor."""
    return ValueError(
        f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means you"
        " are trying to save tensors which are reference of each other in which case it's recommended to save"
        " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
        " pack it before saving.")


def _specs(tensors: Dict[str, torch.Tensor], keep_alive: list) -> list:
    """(name, dtype, header shape, data_ptr, nbytes) for the C++ writer; the
    tensors the pointers point into are appended to keep_alive. The checks, and
    their order, are the reference's: a dict of dense tensors, none sharing
    memory; then each tensor contiguous, with a safetensors dtype; then every
    name a str."""
    _check_dense_tensors(tensors)
    shared = [g for g in _shared_groups(tensors) if len(g) > 1]
    if shared:
        raise _shared_memory_error(shared)
    specs = []
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise _non_contiguous_error(name)
        if t.device.type != "cpu":
            t = t.to("cpu")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()  # Lazy conjugate/negative views: save the values they show.
        dtype = _dtypes.st_dtype_of_torch(t)
        shape = list(t.shape)
        if dtype == "F4":
            if not shape:
                # What the reference's writer reports for it (a sub-byte slice), in its words.
                raise SafetensorError(
                    "Error while serializing: The slice is slicing for subbytes dtypes, and the slice does not end "
                    f"up at a byte boundary, this is invalid. (tensor '{name}': a 0-d float4_e2m1fn_x2 tensor has "
                    "no F4 shape)")
            shape[-1] *= 2  # Two F4 values per element; the header counts F4 values.
        nbytes = t.numel() * t.element_size()
        keep_alive.append(t)
        specs.append((name, dtype, shape, t.data_ptr() if nbytes else 0, nbytes))
    for name in tensors:
        if not isinstance(name, str):
            raise not_instance("tensor_dict", name, "str")
    return specs


# --- save / load -------------------------------------------------------------

def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding `tensors` (contiguous, dense,
    not sharing memory) and the text `metadata`."""
    keep_alive: list = []
    specs = _specs(tensors, keep_alive)
    _check_metadata(metadata)
    return write_bytes(specs, metadata)


def save_file(tensors: Dict[str, torch.Tensor], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes `tensors` to `filename` (through a temporary file renamed over
    it). The GIL is released while writing; do not modify the tensors meanwhile."""
    keep_alive: list = []
    specs = _specs(tensors, keep_alive)
    path = path_argument(filename)
    _check_metadata(metadata)
    write_file(specs, path, metadata)


def load_file(filename: Union[str, os.PathLike], device: Union[str, int] = "cpu", *,
              backend: str = "mmap") -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, in file order, on `device`.

    backend is accepted for compatibility; tensorlift reads with its own loader."""
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in `data` (bytes, or any
    bytes-like object), each in memory of its own."""
    data, tensors, data_offset = parse_bytes(data, bytes_like=True)
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


# --- safetensors.torch's helpers, for the libraries that import them ------------
# (transformers, accelerate, peft, diffusers). The same semantics as safetensors
# 0.8's, shared-tensor grouping included: its groups are cut where a tensor
# starts at or after the end of the one before it in address order, which is
# narrower than the groups save() and save_model() above refuse or deduplicate
# (every overlap, transitively). tests/python/test_safetensors_api.py checks
# each name against the installed reference.

_float8_e4m3fn = getattr(torch, "float8_e4m3fn", None)
_float8_e4m3fnuz = getattr(torch, "float8_e4m3fnuz", None)
_float8_e5m2 = getattr(torch, "float8_e5m2", None)
_float8_e5m2fnuz = getattr(torch, "float8_e5m2fnuz", None)
_float8_e8m0 = getattr(torch, "float8_e8m0fnu", None)
_float4_e2m1_x2 = getattr(torch, "float4_e2m1fn_x2", None)

# Bytes per element of every torch dtype safetensors stores (None: the dtype this torch lacks).
_SIZE = {torch.int64: 8, torch.float32: 4, torch.int32: 4, torch.bfloat16: 2, torch.float16: 2, torch.int16: 2,
         torch.uint8: 1, torch.int8: 1, torch.bool: 1, torch.float64: 8, torch.complex64: 8,
         _float8_e4m3fn: 1, _float8_e4m3fnuz: 1, _float8_e5m2: 1, _float8_e5m2fnuz: 1, _float8_e8m0: 1,
         _float4_e2m1_x2: 1}
if hasattr(torch, "uint64"):
    _SIZE.update({torch.uint64: 8, torch.uint32: 4, torch.uint16: 2})

# The format's dtype codes that safetensors.torch maps to torch dtypes.
_TYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": _float8_e4m3fn, "F8_E4M3FNUZ": _float8_e4m3fnuz,
          "F8_E5M2": _float8_e5m2, "F8_E5M2FNUZ": _float8_e5m2fnuz, "C64": torch.complex64}
if hasattr(torch, "uint64"):
    _TYPES.update({"U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16})


def _getdtype(dtype_str: str) -> torch.dtype:
    """The torch dtype of a format code (KeyError for one safetensors.torch does not map)."""
    return _TYPES[dtype_str]


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the storage under `tensor` (0 for meta tensors)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:
        try:
            return tensor.storage().data_ptr()
        except NotImplementedError:
            return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The bytes of the storage under `tensor`."""
    try:
        return tensor.untyped_storage().nbytes()
    except AttributeError:
        try:
            return tensor.storage().size() * _SIZE[tensor.dtype]
        except NotImplementedError:
            return tensor.nelement() * _SIZE[tensor.dtype]


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the last byte of `tensor`'s last element (its data_ptr when empty)."""
    if tensor.nelement() == 0:
        return tensor.data_ptr()
    return tensor.view(-1)[-1].data_ptr() + _SIZE[tensor.dtype]


def _filter_shared_not_shared(tensors: List[Set[str]], state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Splits each group of names on one storage where a tensor starts at or after the end of the
    tensor before it (in address order): tensors on one storage that do not overlap are not shared."""
    out: List[Set[str]] = []
    for group in tensors:
        if len(group) < 2:
            out.append(group)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in group)
        previous_end = None
        for start, end, name in spans:
            if previous_end is not None and start < previous_end:
                out[-1].add(name)
            else:
                out.append({name})
            previous_end = end
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Names grouped by the storage (device, address, size) they share, then split where they do
    not overlap; meta tensors and empty storages are left out."""
    by_storage: Dict[Any, Set[str]] = defaultdict(set)
    for name, t in state_dict.items():
        if t.device != torch.device("meta") and storage_ptr(t) != 0 and storage_size(t) != 0:
            by_storage[(t.device, storage_ptr(t), storage_size(t))].add(name)
    # sorted() on sets (subset order), as the reference: the same list order.
    return _filter_shared_not_shared(list(sorted(by_storage.values())), state_dict)


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether `tensor` starts at its storage's start and covers all of it."""
    return (tensor.data_ptr() == storage_ptr(tensor)
            and tensor.nelement() * _SIZE[tensor.dtype] == storage_size(tensor))


def _remove_duplicate_names(state_dict: Dict[str, torch.Tensor], *, preferred_names: Optional[List[str]] = None,
                            discard_names: Optional[List[str]] = None) -> Dict[str, List[str]]:
    """For each group of shared tensors: the name kept (complete, the first in name order, preferring
    preferred_names, then names not in discard_names) -> the others, in name order."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    out: Dict[str, List[str]] = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        complete = {n for n in group if _is_complete(state_dict[n])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable name to keep"
                f" for saving amongst: {group}. None is covering the entire storage.Refusing to save/load the model"
                " since you could be storing much more memory than needed. Please refer to"
                " https://huggingface.co/docs/safetensors/torch_shared_tensors for more information. Or open an"
                " issue.")
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        for name in sorted(group):
            if name != keep:
                out[keep].append(name)
    return out


def _view2torch(safeview) -> Dict[str, torch.Tensor]:
    """Tensors from deserialize()'s list (each over its own bytearray, no copy)."""
    out = {}
    for name, v in safeview:
        dtype = _getdtype(v["dtype"])
        if len(v["data"]) == 0:
            t = torch.empty(v["shape"], dtype=dtype)  # frombuffer refuses empty buffers.
        else:
            t = torch.frombuffer(v["data"], dtype=dtype).reshape(v["shape"])
        if sys.byteorder == "big":
            t = torch.from_numpy(t.numpy().byteswap(inplace=False))
        out[name] = t
    return out


def _to_ndarray(tensor: torch.Tensor):
    """(a uint8 numpy array over `tensor`'s bytes, moved to the CPU first; the tensor it views) or
    (an empty array, 0) for a tensor without data."""
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    nbytes = int(np.prod(tensor.shape, dtype=np.int64)) * _SIZE[tensor.dtype]
    if tensor.data_ptr() == 0:
        return np.empty(0), 0
    import ctypes
    data = np.ctypeslib.as_array(ctypes.cast(tensor.data_ptr(), ctypes.POINTER(ctypes.c_ubyte)), (nbytes,))
    if sys.byteorder == "big" and _SIZE[tensor.dtype] > 1:
        width = {2: np.uint16, 4: np.uint32, 8: np.uint32 if tensor.dtype == torch.complex64 else np.uint64}
        data = data.view(width[_SIZE[tensor.dtype]]).byteswap(inplace=False)
    return data, tensor


def _evaluate_tensors_for_save(tensors: Dict[str, torch.Tensor]) -> None:
    """The reference's checks before a save: a dict of strided (not sparse) tensors, none sharing
    memory with another (_find_shared_tensors)."""
    _check_dense_tensors(tensors)
    failing = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if failing:
        raise _shared_memory_error(failing)


def _flatten_as_ptr(tensors: Dict[str, torch.Tensor], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """name -> TensorSpec over each (contiguous) tensor's bytes, for serialize(); what the specs point
    into is appended to keep_alive_buffer."""
    _evaluate_tensors_for_save(tensors)
    out = {}
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise _non_contiguous_error(name)
        arr, ref = _to_ndarray(t)
        keep_alive_buffer.append((arr, ref))
        out[name] = TensorSpec(dtype=str(t.dtype).split(".")[-1], shape=t.shape, data_ptr=arr.ctypes.data,
                               data_len=arr.nbytes)
    return out
