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
sizes are allowed). Differences: the "pytorch" framework only. The other GDS options
(`use_buf_register`, `bbuf_size_kb` as a bounce-buffer size, NUMA) are
accepted and ignored, except that an explicit
`max_threads` sets tensorlift's reader threads and an explicit `bbuf_size_kb`
its largest single read. Extra keyword `mode` ("auto" | "buffered" | "direct"
| "mmap") picks tensorlift's I/O mode.

Several ranks (a torch.distributed process group: gloo on CPU, nccl with
device="cuda:N"), with fastsafetensors' SPMD contract: every rank makes the
same calls in the same order, with the same arguments.

- `add_filenames({rank: [files]})`: each rank opens only its own files; the
  headers (names, dtypes, shapes, owner) are exchanged, so every rank knows
  every tensor and `get_keys()` lists all of them (files taken round-robin
  over the ranks, as fastsafetensors does). `assign_files(files, world_size)`
  makes a byte-balanced {rank: [files]}.
- `copy_files_to_device()`: each rank reads only its own files.
- `get_tensor(name)` (= `get_sharded(name, -1)`): the whole tensor on every
  rank, broadcast from the rank that read it. `get_sharded(name, dim)`: this
  rank's slice along dim, scattered from the reader. `push_tensor` sends to one
  rank (others get None); `get_multi_cols` and `as_dict` shard as
  fastsafetensors does. Bytes travel as uint8, so every dtype works on gloo.
- Uneven sizes follow tensorlift's one shard-range rule (C++ ShardRange, also
  fastsafetensors' rule and vLLM's): block = ceil(size / world);
  rank r gets [r*block, (r+1)*block) clipped to the size, so the last ranks
  get a smaller or empty slice (torch.chunk's slices, with an empty one for
  each rank torch.chunk leaves without a chunk; not torch.tensor_split).
  fastsafetensors 0.5 fails there on gloo; tensorlift pads the scatter.
- Memory: as in fastsafetensors (auto_mem_delete, several ranks only), a
  file's loaded buffer is dropped once every one of its (kept) tensors has
  been handed out; asking for a tensor of that file again raises ValueError on
  every rank (set `fb.auto_mem_delete = False` first to keep the buffers).
  `close()` drops everything. Returned tensors are copies and own their memory.
- Exit: every collective returns only once the backend has released the
  tensors it was given, so nothing is left in flight when the script ends
  (gloo's worker used to drop a finished scatter's tensors during interpreter
  shutdown and abort the process).
- Failure: after each rank opens (add_filenames) and reads
  (copy_files_to_device) its files, the ranks exchange a status; if any rank
  failed, that rank raises its own error and every other rank raises
  DistributedLoadError naming the rank and the error; no rank hangs.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _dtypes
from ._fastsafetensors_ranks import (DistributedLoadError, _check_group, _Comm, _group_size_rank, _RankExchange,
                                     _RankFile, assign_files)
from ._fastsafetensors_ranks import _shard_ranges  # noqa: F401 (importable from here as before)
from ._fastsafetensors_types import (DType, SingleGroup, TensorNotFoundError, TorchTensor, _check_device,
                                     _check_framework, _dtype_name, _to)
from ._tensors import _DLPackBytes, tensor_from
from ._tensorlift import Checkpoint, dtype_bits

__all__ = [
    "DType",
    "DistributedLoadError",
    "FilesBufferOnDevice",
    "SafeTensorsFileLoader",
    "SingleGroup",
    "TensorNotFoundError",
    "TorchTensor",
    "assign_files",
    "fastsafe_open",
]

# The classes and functions of other modules that this one exports keep its name (reprs,
# tracebacks, pickles), as when they were defined here.
for _exported in (DType, DistributedLoadError, SingleGroup, TensorNotFoundError, TorchTensor, assign_files):
    _exported.__module__ = __name__
del _exported


class _File:
    """One registered file: its validated header and its tensors in offset order."""

    __slots__ = ("path", "rank", "ckpt", "tensors", "metadata")

    def __init__(self, path: str, rank: int, header: Optional[Tuple[list, Any]] = None):
        self.path = path
        self.rank = rank
        if header is not None:  # another rank's file: its header, learned from that rank
            self.ckpt = None
            self.tensors = [tuple(t) for t in header[0]]
            self.metadata = header[1]
            return
        self.ckpt = Checkpoint.open(path)
        # (name, dtype, shape, begin, end, shard), in file order (by offset, as fastsafetensors lists them).
        self.tensors = [tuple(t) + (shard,) for shard in range(len(self.ckpt.shards()))
                        for t in self.ckpt.shard_tensors(shard)]
        self.metadata = self.ckpt.metadata(0)

    def header(self) -> Tuple[list, Any]:
        """What the other ranks need to know of this file (picklable)."""
        return ([(t[0], t[1], tuple(int(d) for d in t[2]), int(t[3]), int(t[4]), t[5])
                 for t in self.tensors], self.metadata)


class SafeTensorsFileLoader:
    """Loads .safetensors files; see the module docstring (fastsafetensors' signature)."""

    def __init__(self, pg: Any = None, device: Any = "cpu", bbuf_size_kb: Optional[int] = None,
                 max_threads: Optional[int] = None, nogds: bool = False, set_numa: bool = True,
                 disable_cache: bool = True, debug_log: bool = False, framework: str = "pytorch",
                 **kwargs: Any):
        self._size, self._rank = _check_group(pg)
        self.pg = pg if pg is not None else SingleGroup()
        self.device = _check_device(device)
        self._comm = _Comm(pg, self._size, self._rank, self.device) if self._size > 1 else None
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
        if self._comm is not None:
            return self._add_filenames_ranks(filenames)
        _, my_rank = _group_size_rank(self.pg)
        for rank, paths in filenames.items():
            if rank != my_rank:
                raise ValueError(f"add_filenames: rank {rank} does not exist in a process group of 1 "
                                 "(with one process, pass {0: [all files]})")
            if isinstance(paths, (str, os.PathLike)):
                paths = [paths]
            for p in paths:
                self._register(_File(os.fspath(p), rank))

    def _register(self, f: _File) -> None:
        old = self.files.get(f.path)
        if old is not None:  # registered again: replaced in place, as fastsafetensors does
            for t in old.tensors:
                self._owner.pop(t[0], None)
        for t in f.tensors:
            other = self._owner.get(t[0])
            if other is not None:
                raise ValueError(f"add_filenames: tensor {t[0]!r} is in both {other} and {f.path}; "
                                 "names must be unique among files")
        for t in f.tensors:
            self._owner[t[0]] = f.path
        self.files[f.path] = f

    def _add_filenames_ranks(self, filenames: Dict[int, Any]) -> None:
        """Several ranks: each opens its own files, then all exchange the headers (a collective)."""
        lists: Dict[int, List[str]] = {}
        for rank, paths in filenames.items():
            if not isinstance(rank, int) or not 0 <= rank < self._size:
                raise ValueError(f"add_filenames: rank {rank!r} does not exist in a process group of "
                                 f"{self._size} (ranks 0..{self._size - 1})")
            if isinstance(paths, (str, os.PathLike)):
                paths = [paths]
            lists[rank] = [os.fspath(p) for p in paths]
        # Round-robin over the ranks, as fastsafetensors registers them (get_keys' order).
        order: List[Tuple[int, str]] = []
        for i in range(max((len(v) for v in lists.values()), default=0)):
            for rank, paths in lists.items():
                if i < len(paths):
                    order.append((rank, paths[i]))
        mine: Dict[str, _File] = {}
        err: Optional[BaseException] = None
        try:
            for rank, path in order:
                if rank == self._rank and path not in mine:
                    mine[path] = _File(path, rank)
        except Exception as e:  # reported to every rank before raising
            err = e
        headers = {p: f.header() for p, f in mine.items()} if err is None else None
        got = self._comm.agree("add_filenames", err, (order, headers))
        if any(o != order for o, _ in got):
            raise ValueError("add_filenames: the ranks passed different {rank: [files]}; every rank "
                             "must make the same call (fastsafetensors' SPMD contract)")
        for rank, path in order:
            if rank == self._rank:
                f = mine[path]
            else:
                f = _File(path, rank, got[rank][1][path])
            self._register(f)

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

        This rank's files are read in one load, their reads planned and run together in
        parallel with the GIL released (one load per file, in path order as fastsafetensors
        reads them, where a tensor name is in two files). `dtype` converts every tensor in place.
        """
        target = _dtype_name(dtype)
        if self._comm is not None:
            return self._copy_files_ranks(target)
        if target is not None and self.device != "cpu":
            self._check_conversion(self.files.values(), target)  # before any read
        files: List[Tuple[str, Dict[str, Any], Dict[str, List[int]]]] = []
        loaded = self._load_own([self.files[path] for path in sorted(self.files)], target)
        for path in sorted(self.files):
            f, tensors = self.files[path], loaded[path]
            files.append((path, tensors, {t[0]: list(t[2]) for t in f.tensors if t[0] in tensors}))
        return FilesBufferOnDevice(files, self.pg)

    def _check_conversion(self, files, target: str) -> None:
        """fastsafetensors' rule: conversion only to equal or smaller sizes (ValueError)."""
        for f in files:
            for t in f.tensors:
                if self._kept(t[0]) and dtype_bits(target) > dtype_bits(t[1]):
                    raise ValueError(f"Online type conversion to larger sizes is not supported "
                                     f"({t[1]} -> {target}) for tensor {t[0]!r}")

    def _load_own(self, fs: List["_File"], target: Optional[str]) -> Dict[str, Dict[str, Any]]:
        """Reads this rank's files: path -> {name: tensor} (the kept ones, converted to target).
        Several files are one load, their reads planned and run together as tensorlift.load
        does; where a name is in two of them, one load per file in path order instead."""
        ckpt = None
        if len(fs) > 1:
            try:
                ckpt = Checkpoint.open_files([f.path for f in fs])
            except ValueError:  # a name in two files: fastsafetensors keeps them apart
                ckpt = None
        if ckpt is None:
            return {f.path: self._read(f.ckpt, [f], target) for f in fs}
        both = self._read(ckpt, fs, target)
        return {f.path: {t[0]: both[t[0]] for t in f.tensors if t[0] in both} for f in fs}

    def _read(self, ckpt: Any, fs: List["_File"], target: Optional[str]) -> Dict[str, Any]:
        """One load of `ckpt` (the files `fs`): name -> tensor."""
        names = None
        if self._tensor_filter is not None:
            names = [t[0] for f in fs for t in f.tensors if self._kept(t[0])]
        # The stored tensors, as fastsafetensors sees them (sparse parts too).
        opts = {"mode": self._mode, "threads": self._threads, "device": self.device,
                "gds": not self.nogds, "decode_sparse": False,
                "copy": True}  # fastsafetensors' users own their buffers: never views of the page cache
        if self._block_size:
            opts["block_size"] = self._block_size
        on_gpu = self.device != "cpu"
        if on_gpu and target is not None:
            opts["dtype"] = target  # converted on the GPU while loading
        loaded = ckpt.load(names=names, **opts)
        try:
            return {t[0]: _materialize(loaded, t[0], t[1], t[2], None if on_gpu else target)
                    for f in fs for t in f.tensors if names is None or self._kept(t[0])}
        finally:
            loaded.release()

    def _copy_files_ranks(self, target: Optional[str]) -> "FilesBufferOnDevice":
        """Several ranks: each reads its own files, then all agree on success before any data moves."""
        if target is not None:  # checked on every rank before any read
            self._check_conversion(self.files.values(), target)
        entries: List[_RankFile] = []
        err: Optional[BaseException] = None
        try:
            own = self._load_own([self.files[p] for p in sorted(self.files) if self.files[p].rank == self._rank],
                                 target)
            for path in sorted(self.files):  # path order, as fastsafetensors reads them
                f = self.files[path]
                kept = [t for t in f.tensors if self._kept(t[0])]
                entries.append(_RankFile(path, f.rank, kept, target, own.get(path)))
        except Exception as e:  # reported to every rank before raising
            entries.clear()
            err = e
        self._comm.agree("copy_files_to_device", err)
        return FilesBufferOnDevice([(e.path, e.tensors, e.shapes) for e in entries], self.pg,
                                   _ranks=(self._comm, entries))


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


class FilesBufferOnDevice(_RankExchange):
    """The loaded tensors of a copy_files_to_device call (fastsafetensors' name and methods)."""

    def __init__(self, files: List[Tuple[str, Dict[str, Any], Dict[str, List[int]]]], pg: Any = None,
                 _ranks: Optional[Tuple[_Comm, List[_RankFile]]] = None):
        self.pg = pg if pg is not None else SingleGroup()
        # (path, name -> tensor, name -> header shape) per file, in path order.
        self._files = files
        # name -> (rank, file index), as fastsafetensors exposes it.
        self.key_to_rank_lidx: Dict[str, Tuple[int, int]] = {}
        # Several ranks: the collectives, what every rank knows of each file, and
        # name -> index in self._files (key_to_rank_lidx's index counts per rank).
        self._comm: Optional[_Comm] = None
        self._entries: List[_RankFile] = []
        self._where: Dict[str, int] = {}
        # Drop a file's buffer once all its tensors were handed out (several ranks only).
        self.auto_mem_delete = False
        self._next_tag = 1
        if _ranks is not None:
            self._comm, self._entries = _ranks
            self.auto_mem_delete = True
            per_rank: Dict[int, int] = {}
            for i, e in enumerate(self._entries):
                lidx = per_rank.get(e.rank, 0)
                per_rank[e.rank] = lidx + 1
                for name in e.specs:
                    self.key_to_rank_lidx[name] = (e.rank, lidx)
                    self._where[name] = i
            return
        for lidx, (_, tensors, _) in enumerate(files):
            for name in tensors:
                self.key_to_rank_lidx[name] = (0, lidx)

    def _lookup(self, tensor_name: str, what: str = "_get_rank") -> Tuple[int, Dict[str, Any]]:
        if self._comm is not None:
            i = self._where.get(tensor_name)
            if i is None or not self._files:
                raise TensorNotFoundError(f"{what}: key {tensor_name} was not found in files")
            return i, self._files[i][1]
        loc = self.key_to_rank_lidx.get(tensor_name)
        if loc is None or not self._files:
            raise TensorNotFoundError(f"{what}: key {tensor_name} was not found in files")
        return loc[1], self._files[loc[1]][1]

    def _raw(self, tensor_name: str):
        return self._lookup(tensor_name)[1][tensor_name]

    def close(self) -> None:
        """Drops this buffer's references; returned tensors own their memory and stay valid."""
        for e in self._entries:
            if e.tensors is not None:
                e.tensors.clear()
            e.tensors = None
        self._files = []
        self._entries = []
        self._where = {}
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
        """The tensor itself (zero-copy); device/dtype convert as fastsafetensors' do.

        With several ranks: the whole tensor on every rank, broadcast from its reader.
        """
        if self._comm is not None:
            return _to(self._broadcast(tensor_name), device, dtype)
        return _to(self._raw(tensor_name), device, dtype)

    def get_sharded(self, tensor_name: str, dim: int, device: Any = None, dtype: Any = None):
        """With one process, the whole tensor (fastsafetensors' scatter over a world of 1).

        With several ranks: this rank's slice along dim (block = ceil(size / world);
        the last ranks' slices may be smaller or empty), scattered from the reader;
        dim=-1 broadcasts the whole tensor.
        """
        if self._comm is not None:
            return _to(self._sharded(tensor_name, dim), device, dtype)
        return _to(self._raw(tensor_name), device, dtype)

    def get_tensor_wrapped(self, tensor_name: str, device: Any = None, dtype: Any = None) -> TorchTensor:
        return TorchTensor(self.get_tensor(tensor_name, device, dtype))

    def get_sharded_wrapped(self, tensor_name: str, dim: int, device: Any = None,
                            dtype: Any = None) -> TorchTensor:
        return TorchTensor(self.get_sharded(tensor_name, dim, device, dtype))

    def push_tensor(self, tensor_name: str, dst_rank: int, device: Any = None, dtype: Any = None):
        """With one process, the tensor itself (there is no other rank to send it to).

        With several ranks: the reader sends the tensor to dst_rank, which returns it;
        every other rank returns None.
        """
        if self._comm is not None:
            return self._push(tensor_name, dst_rank, device, dtype)
        if dst_rank != 0:
            raise ValueError(f"push_tensor: rank {dst_rank} does not exist in a process group of 1")
        return _to(self._raw(tensor_name), device, dtype)

    def get_multi_cols(self, tensor_names: Sequence[str], dim: int, device: Any = None,
                       dtype: Any = None) -> TorchTensor:
        """The tensors concatenated along dim (grouped by file, in file order, as fastsafetensors does).

        With several ranks: each tensor's slice for this rank (get_sharded's rule), concatenated.
        """
        import torch
        if self._comm is not None:
            return TorchTensor(_to(self._multi_cols(tensor_names, dim), device, dtype))
        groups: Dict[int, List[Any]] = {}
        for name in tensor_names:
            lidx, tensors = self._lookup(name)
            groups.setdefault(lidx, []).append(tensors[name])
        parts = [torch.cat(groups[k], dim=dim) for k in sorted(groups)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
        return TorchTensor(_to(out, device, dtype))

    def as_dict(self, tensor_shard_dim: Dict[str, int]) -> Dict[str, TorchTensor]:
        """name -> wrapped tensor (`.get_raw()`), each sharded at its dim: whole with one process."""
        if self._comm is not None:
            return {name: TorchTensor(self._sharded(name, dim, "as_dict"))
                    for name, dim in tensor_shard_dim.items()}
        return {name: TorchTensor(self._raw(name)) for name in tensor_shard_dim}

    def iter_local_tensors(self, tensor_names: Sequence[str]) -> Iterator[Tuple[str, Any]]:
        if self._comm is not None:
            raise RuntimeError("iter_local_tensors requires a single-process group")
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
