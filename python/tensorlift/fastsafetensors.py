"""A drop-in for the fastsafetensors API (0.5), backed by tensorlift's loader.

    from tensorlift.fastsafetensors import SafeTensorsFileLoader, SingleGroup

    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: ["a.safetensors", "b.safetensors"]})
    fb = loader.copy_files_to_device()
    a0 = fb.get_tensor("a0")             # zero-copy over tensorlift's buffer
    b0 = fb.get_sharded("b0", dim=1)     # one process: the whole tensor
    fb.close()
    loader.close()

This follows the fastsafetensors paper (Figures 8 and 9) and the behaviour of
fastsafetensors 0.5.0 with one process:

- `add_filenames({rank: [files]})` reads and fully validates each header
  (tensorlift.FormatError for a bad file); `get_keys()` lists the tensors file
  by file in the order they were added, each file's tensors by offset.
- `copy_files_to_device(dtype=...)` reads every file with tensorlift (parallel
  reads, the GIL released, page-cache aware) and returns a FilesBufferOnDevice.
  `dtype` (a fastsafetensors `DType`, its name such as "F16", or a torch dtype)
  converts every tensor in place, only to a dtype no larger than the stored one,
  as fastsafetensors does.
- `get_tensor(name)`, `get_sharded(name, dim)` and `push_tensor` return the
  whole tensor (with one process there is nothing to scatter); `as_dict`,
  `get_multi_cols`, `get_tensor_wrapped` and `get_sharded_wrapped` return
  wrapped tensors (`.get_raw()` gives the torch tensor), as fastsafetensors does.
- Tensors own their memory (DLPack): they stay valid after `close()`.
- A missing name raises TensorNotFoundError, which is both a ValueError (what
  fastsafetensors raises) and a KeyError (what the rest of tensorlift raises).

Devices: "cpu" and "cuda:N" (GPU loads go through tensorlift's pinned
pipeline, or GPUDirect Storage unless `nogds=True`; `dtype` then converts on
the GPU while loading, with fastsafetensors' rule that only equal or smaller
sizes are allowed). Differences: the "pytorch" framework only; one process
only (a process group of several ranks raises NotImplementedError, multi-rank
loading comes with a later version). The other GDS options
(`use_buf_register`, `bbuf_size_kb` as a bounce-buffer size, NUMA) are
accepted and ignored, except that an explicit
`max_threads` sets tensorlift's reader threads and an explicit `bbuf_size_kb`
its largest single read. Extra keyword `mode` ("auto" | "buffered" | "direct"
| "mmap") picks tensorlift's I/O mode.
"""
from __future__ import annotations

import enum
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _dtypes
from ._core import _DLPackBytes, device_name, tensor_from
from ._tensorlift import Checkpoint, dtype_bits

__all__ = [
    "DType",
    "FilesBufferOnDevice",
    "SafeTensorsFileLoader",
    "SingleGroup",
    "TensorNotFoundError",
    "TorchTensor",
    "fastsafe_open",
]


class DType(enum.Enum):
    """The dtype names of fastsafetensors' `st_types.DType` (AUTO: no conversion)."""

    BOOL = "BOOL"
    I8 = "I8"
    I16 = "I16"
    I32 = "I32"
    I64 = "I64"
    U8 = "U8"
    U16 = "U16"
    U32 = "U32"
    U64 = "U64"
    F16 = "F16"
    F32 = "F32"
    F64 = "F64"
    BF16 = "BF16"
    F8_E5M2 = "F8_E5M2"
    F8_E4M3 = "F8_E4M3"
    F8_E8M0 = "F8_E8M0"
    F4 = "F4"
    AUTO = "AUTO"


class TensorNotFoundError(KeyError, ValueError):
    """No tensor of that name was loaded (a KeyError and a ValueError)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class SingleGroup:
    """The process group of a single process (rank 0 of 1), as in fastsafetensors."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def _group_size_rank(pg: Any) -> Tuple[int, int]:
    if pg is None:
        return 1, 0
    try:
        size, rank = int(pg.size()), int(pg.rank())
    except AttributeError:
        raise TypeError("tensorlift.fastsafetensors: pg must be SingleGroup(), None or a "
                        f"torch.distributed process group, not {type(pg).__name__}") from None
    return size, rank


def _check_single(pg: Any) -> None:
    size, _ = _group_size_rank(pg)
    if size != 1:
        raise NotImplementedError(
            f"tensorlift.fastsafetensors: a process group of {size} ranks is not supported yet; "
            "this version loads in a single process (use SingleGroup() or a group of size 1)")


def _check_device(device: Any) -> str:
    """"cpu" or "cuda:N" for a str, an int or a torch.device."""
    name = device_name(device)
    if name.split(":", 1)[0].lower() not in ("cpu", "cuda"):
        raise NotImplementedError(
            f"tensorlift.fastsafetensors: device {device!r} is not supported; use 'cpu' or 'cuda:N'")
    return name


def _check_framework(framework: str) -> str:
    if framework in ("pytorch", "pt", "torch"):
        return "pt"
    if framework == "paddle":
        raise NotImplementedError("tensorlift.fastsafetensors: the paddle framework is not supported; use 'pytorch'")
    raise ValueError(f"tensorlift.fastsafetensors: unknown framework {framework!r} (use 'pytorch')")


def _dtype_name(dtype: Any) -> Optional[str]:
    """None for AUTO (no conversion), else the safetensors dtype name."""
    if dtype is None:
        return None
    value = getattr(dtype, "value", dtype)  # our DType or fastsafetensors' DType
    if isinstance(value, str) and value.upper() == "AUTO":
        return None
    try:
        return _dtypes.safetensors_name(value)
    except ValueError:
        raise ValueError(f"tensorlift.fastsafetensors: unsupported dtype {dtype!r}") from None


class TorchTensor:
    """A wrapped tensor, like fastsafetensors' `TorchTensor`: `.get_raw()` is the torch tensor."""

    __slots__ = ("real_tensor", "dtype")

    def __init__(self, real_tensor, dtype: Optional[str] = None):
        self.real_tensor = real_tensor
        name = dtype or _dtypes.st_dtype_of_torch(real_tensor)
        try:
            self.dtype = DType(name)
        except ValueError:  # a dtype fastsafetensors does not name (C64, F8_E4M3FNUZ, ...)
            self.dtype = name

    def get_raw(self):
        return self.real_tensor

    def get_shape(self) -> List[int]:
        shape = list(self.real_tensor.shape)
        if self.dtype == DType.F4 and shape:
            shape[-1] *= 2
        return shape

    def get_nbytes(self) -> int:
        return self.real_tensor.nbytes

    def contiguous(self) -> "TorchTensor":
        return TorchTensor(self.real_tensor.contiguous())

    def clone(self) -> "TorchTensor":
        return TorchTensor(self.real_tensor.clone())

    def detach(self) -> "TorchTensor":
        return TorchTensor(self.real_tensor.detach())

    def to(self, device=None, dtype=None) -> "TorchTensor":
        return TorchTensor(_to(self.real_tensor, device, dtype))

    def __repr__(self) -> str:
        return f"TorchTensor(dtype={self.dtype}, real_tensor={self.real_tensor!r})"


def _to(t, device=None, dtype=None):
    """Applies get_tensor's optional device/dtype arguments (copies only when they differ)."""
    if device is not None:
        _check_device(getattr(device, "as_str", lambda: device)())
    name = _dtype_name(dtype)
    if name is not None:
        tdt = _dtypes.torch_dtype(name)
        if tdt is None:
            raise ValueError(f"tensorlift.fastsafetensors: torch has no dtype for {name}")
        if t.dtype != tdt:
            t = t.to(dtype=tdt)
    return t


class _File:
    """One registered file: its validated header and its tensors in offset order."""

    __slots__ = ("path", "rank", "ckpt", "tensors", "metadata")

    def __init__(self, path: str, rank: int):
        self.path = path
        self.rank = rank
        self.ckpt = Checkpoint.open(path)
        # (name, dtype, shape, begin, end, shard), in file order (by offset, as fastsafetensors lists them).
        self.tensors = [tuple(t) + (shard,) for shard in range(len(self.ckpt.shards()))
                        for t in self.ckpt.shard_tensors(shard)]
        self.metadata = self.ckpt.metadata(0)


class SafeTensorsFileLoader:
    """Loads .safetensors files; see the module docstring (fastsafetensors' signature)."""

    def __init__(self, pg: Any = None, device: Any = "cpu", bbuf_size_kb: Optional[int] = None,
                 max_threads: Optional[int] = None, nogds: bool = False, set_numa: bool = True,
                 disable_cache: bool = True, debug_log: bool = False, framework: str = "pytorch",
                 **kwargs: Any):
        _check_single(pg)
        self.pg = pg if pg is not None else SingleGroup()
        self.device = _check_device(device)
        self.framework = _check_framework(framework)
        self._threads = int(max_threads) if max_threads else 0
        self._block_size = int(bbuf_size_kb) * 1024 if bbuf_size_kb else None
        self._mode = kwargs.pop("mode", "auto")
        self.nogds = nogds
        self.files: Dict[str, _File] = {}
        self._owner: Dict[str, str] = {}
        self._tensor_filter: Optional[Callable[[str], bool]] = None

    # Registration -----------------------------------------------------------------

    def add_filenames(self, filenames: Dict[int, Sequence[Union[str, os.PathLike]]]) -> None:
        """Registers files per rank ({0: [files]} with one process) and validates their headers."""
        if not isinstance(filenames, dict):
            raise TypeError("add_filenames: expected a dict {rank: [filenames]}")
        _, my_rank = _group_size_rank(self.pg)
        for rank, paths in filenames.items():
            if rank != my_rank:
                raise ValueError(f"add_filenames: rank {rank} does not exist in a process group of 1 "
                                 "(with one process, pass {0: [all files]})")
            if isinstance(paths, (str, os.PathLike)):
                paths = [paths]
            for p in paths:
                path = os.fspath(p)
                f = _File(path, rank)
                old = self.files.get(path)
                if old is not None:  # registered again: replaced in place, as fastsafetensors does
                    for t in old.tensors:
                        self._owner.pop(t[0], None)
                for t in f.tensors:
                    other = self._owner.get(t[0])
                    if other is not None:
                        raise ValueError(f"add_filenames: tensor {t[0]!r} is in both {other} and {path}; "
                                         "names must be unique among files")
                for t in f.tensors:
                    self._owner[t[0]] = path
                self.files[path] = f

    def set_tensor_filter(self, keep_tensor: Optional[Callable[[str], bool]]) -> None:
        """Loads only the tensors for which keep_tensor(name) is True (None: all)."""
        self._tensor_filter = keep_tensor

    def _kept(self, name: str) -> bool:
        return self._tensor_filter is None or bool(self._tensor_filter(name))

    def get_keys(self) -> List[str]:
        return [t[0] for f in self.files.values() for t in f.tensors if self._kept(t[0])]

    def _frame(self, name: str):
        path = self._owner.get(name)
        if path is None or not self._kept(name):
            raise TensorNotFoundError(f"get_shape: key {name} was not found in files")
        for t in self.files[path].tensors:
            if t[0] == name:
                return t
        raise TensorNotFoundError(f"get_shape: key {name} was not found in files")

    def get_shape(self, tensor_name: str) -> List[int]:
        return list(self._frame(tensor_name)[2])

    def reset(self) -> None:
        self.files = {}
        self._owner = {}

    def close(self) -> None:
        """Forgets the registered files; buffers belong to the FilesBufferOnDevice."""
        self.reset()

    # Loading ----------------------------------------------------------------------

    def copy_files_to_device(self, dtype: Any = None, use_buf_register: bool = True,
                             max_copy_block_size: int = 16 * 1024 ** 3, allow_inflight: bool = False,
                             borrowed_tensors: bool = False) -> "FilesBufferOnDevice":
        """Reads all registered files with tensorlift and returns their tensors' buffer.

        Files are read in path order (as fastsafetensors does); each file's read is
        parallel with the GIL released. `dtype` converts every tensor in place.
        """
        target = _dtype_name(dtype)
        files: List[Tuple[str, Dict[str, Any], Dict[str, List[int]]]] = []
        try:
            for path in sorted(self.files):
                f = self.files[path]
                names = None
                if self._tensor_filter is not None:
                    names = [t[0] for t in f.tensors if self._kept(t[0])]
                opts = {"mode": self._mode, "threads": self._threads, "device": self.device,
                        "gds": not self.nogds}
                if self._block_size:
                    opts["block_size"] = self._block_size
                on_gpu = self.device != "cpu"
                if on_gpu and target is not None:
                    for t in f.tensors:  # fastsafetensors' rule, checked before any read
                        if (names is None or self._kept(t[0])) and dtype_bits(target) > dtype_bits(t[1]):
                            raise ValueError(f"Online type conversion to larger sizes is not supported "
                                             f"({t[1]} -> {target}) for tensor {t[0]!r}")
                    opts["dtype"] = target  # converted on the GPU while loading
                loaded = f.ckpt.load(names=names, **opts)
                try:
                    tensors, shapes = {}, {}
                    for t in f.tensors:
                        if names is not None and not self._kept(t[0]):
                            continue
                        tensors[t[0]] = _materialize(loaded, t[0], t[1], t[2], None if on_gpu else target)
                        shapes[t[0]] = list(t[2])
                finally:
                    loaded.release()
                files.append((path, tensors, shapes))
        except BaseException:
            files.clear()
            raise
        return FilesBufferOnDevice(files, self.pg)


def _materialize(loaded, name: str, st_dtype: str, shape, target: Optional[str]):
    t = tensor_from(loaded, name, "pt")
    if target is None or target == st_dtype:
        return t
    import torch
    old_bits, new_bits = dtype_bits(st_dtype), dtype_bits(target)
    if new_bits > old_bits:
        raise ValueError(f"Online type conversion to larger sizes is not supported ({st_dtype} -> {target})"
                         f" for tensor {name!r}")
    tdt = _dtypes.torch_dtype(target)
    if tdt is None or target == "F4":
        raise ValueError(f"tensorlift.fastsafetensors: cannot convert tensor {name!r} to {target}")
    converted = t.to(dtype=tdt)
    if converted.numel() == 0:
        return converted
    # In place, as fastsafetensors does: the converted values overwrite the front
    # of the tensor's own bytes, so memory stays at one copy of the file.
    raw = torch.from_dlpack(_DLPackBytes(loaded, name))
    dst = raw[: converted.numel() * converted.element_size()].view(tdt).reshape(converted.shape)
    dst.copy_(converted)
    return dst


class FilesBufferOnDevice:
    """The loaded tensors of a copy_files_to_device call (fastsafetensors' name and methods)."""

    def __init__(self, files: List[Tuple[str, Dict[str, Any], Dict[str, List[int]]]], pg: Any = None):
        self.pg = pg if pg is not None else SingleGroup()
        # (path, name -> tensor, name -> header shape) per file, in path order.
        self._files = files
        # name -> (rank, file index), as fastsafetensors exposes it.
        self.key_to_rank_lidx: Dict[str, Tuple[int, int]] = {}
        for lidx, (_, tensors, _) in enumerate(files):
            for name in tensors:
                self.key_to_rank_lidx[name] = (0, lidx)

    def _lookup(self, tensor_name: str, what: str = "_get_rank") -> Tuple[int, Dict[str, Any]]:
        loc = self.key_to_rank_lidx.get(tensor_name)
        if loc is None or not self._files:
            raise TensorNotFoundError(f"{what}: key {tensor_name} was not found in files")
        return loc[1], self._files[loc[1]][1]

    def _raw(self, tensor_name: str):
        return self._lookup(tensor_name)[1][tensor_name]

    def close(self) -> None:
        """Drops this buffer's references; returned tensors own their memory and stay valid."""
        self._files = []
        self.key_to_rank_lidx = {}

    def __enter__(self) -> "FilesBufferOnDevice":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def keys(self) -> List[str]:
        return list(self.key_to_rank_lidx)

    def get_filename(self, tensor_name: str) -> str:
        return self._files[self._lookup(tensor_name)[0]][0]

    def get_shape(self, tensor_name: str) -> List[int]:
        lidx, _ = self._lookup(tensor_name)
        return list(self._files[lidx][2][tensor_name])

    def get_tensor(self, tensor_name: str, device: Any = None, dtype: Any = None):
        """The tensor itself (zero-copy); device/dtype convert as fastsafetensors' do."""
        return _to(self._raw(tensor_name), device, dtype)

    def get_sharded(self, tensor_name: str, dim: int, device: Any = None, dtype: Any = None):
        """With one process, the whole tensor (fastsafetensors' scatter over a world of 1)."""
        return _to(self._raw(tensor_name), device, dtype)

    def get_tensor_wrapped(self, tensor_name: str, device: Any = None, dtype: Any = None) -> TorchTensor:
        return TorchTensor(self.get_tensor(tensor_name, device, dtype))

    def get_sharded_wrapped(self, tensor_name: str, dim: int, device: Any = None,
                            dtype: Any = None) -> TorchTensor:
        return TorchTensor(self.get_sharded(tensor_name, dim, device, dtype))

    def push_tensor(self, tensor_name: str, dst_rank: int, device: Any = None, dtype: Any = None):
        """With one process, the tensor itself (there is no other rank to send it to)."""
        if dst_rank != 0:
            raise ValueError(f"push_tensor: rank {dst_rank} does not exist in a process group of 1")
        return _to(self._raw(tensor_name), device, dtype)

    def get_multi_cols(self, tensor_names: Sequence[str], dim: int, device: Any = None,
                       dtype: Any = None) -> TorchTensor:
        """The tensors concatenated along dim (grouped by file, in file order, as fastsafetensors does)."""
        import torch
        groups: Dict[int, List[Any]] = {}
        for name in tensor_names:
            lidx, tensors = self._lookup(name)
            groups.setdefault(lidx, []).append(tensors[name])
        parts = [torch.cat(groups[k], dim=dim) for k in sorted(groups)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
        return TorchTensor(_to(out, device, dtype))

    def as_dict(self, tensor_shard_dim: Dict[str, int]) -> Dict[str, TorchTensor]:
        """name -> wrapped tensor (`.get_raw()`), each sharded at its dim: whole with one process."""
        return {name: TorchTensor(self._raw(name)) for name in tensor_shard_dim}

    def iter_local_tensors(self, tensor_names: Sequence[str]) -> Iterator[Tuple[str, Any]]:
        for name in tensor_names:
            yield name, self._raw(name)


class fastsafe_open:
    """Opens one or more files and loads them at once (fastsafetensors' fastsafe_open).

    A context manager with keys(), metadata() ({filename: metadata or ""}),
    get_tensor() and get_tensor_wrapped(). Tensors stay valid after the block.
    """

    def __init__(self, filenames: Union[str, os.PathLike, List[str], Dict[int, List[str]]],
                 framework: str = "pt", pg: Any = None, device: Any = "cpu", nogds: bool = False,
                 debug_log: bool = False, max_copy_block_size: int = 16 * 1024 ** 3,
                 use_fgds: bool = False):
        self.loader = SafeTensorsFileLoader(pg, device, nogds=nogds, debug_log=debug_log,
                                            framework=framework)
        if isinstance(filenames, (str, os.PathLike)):
            file_dict = {0: [filenames]}
        elif isinstance(filenames, dict):
            file_dict = filenames
        else:
            file_dict = {0: list(filenames)}
        self.loader.add_filenames(file_dict)
        self._metadata = {path: (f.metadata if f.metadata is not None else "")
                          for path, f in self.loader.files.items()}
        self.fb = self.loader.copy_files_to_device(max_copy_block_size=max_copy_block_size)

    def metadata(self) -> Dict[str, Any]:
        return dict(self._metadata)

    def keys(self) -> List[str]:
        return self.fb.keys()

    def get_tensor_wrapped(self, name: str) -> TorchTensor:
        return self.fb.get_tensor_wrapped(name)

    def get_tensor(self, name: str):
        return self.fb.get_tensor(name)

    def __enter__(self) -> "fastsafe_open":
        return self

    def __exit__(self, exc_type, exc_value, tb) -> None:
        self.close()

    def close(self) -> None:
        if self.fb is not None:
            self.fb.close()
        if self.loader is not None:
            self.loader.close()
