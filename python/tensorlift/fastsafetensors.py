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

import enum
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _dtypes
from ._tensors import _DLPackBytes, device_name, tensor_from
from ._tensorlift import Checkpoint, assign_whole_files, dtype_bits, shard_range

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


def _check_group(pg: Any) -> Tuple[int, int]:
    """(size, rank); a group of several ranks must be a torch.distributed ProcessGroup."""
    size, rank = _group_size_rank(pg)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"tensorlift.fastsafetensors: rank {rank} of a process group of {size}")
    if size > 1:
        try:
            import torch.distributed as dist
            ok = dist.is_available() and isinstance(pg, dist.ProcessGroup)
        except ImportError:
            ok = False
        if not ok:
            raise TypeError(f"tensorlift.fastsafetensors: a process group of {size} ranks must be a "
                            f"torch.distributed ProcessGroup (e.g. torch.distributed.group.WORLD), "
                            f"not {type(pg).__name__}")
    return size, rank


class DistributedLoadError(RuntimeError):
    """Another rank failed (opening or reading its files); raised on every rank but that one."""


def assign_files(files: Sequence[Union[str, os.PathLike]], world_size: int,
                 sizes: Optional[Dict[str, int]] = None) -> Dict[int, List[str]]:
    """Assigns files to ranks balanced by bytes: {rank: [files]} for add_filenames.

    The C++ multi-rank loader's whole-file rule (AssignByBytes with whole_files):
    largest file first (ties by path), each to the rank with the fewest bytes so
    far (ties: fewer files, then the lowest rank); each rank's files in path
    order. The result depends only on the paths and sizes, so every rank
    computes the same one. Sizes come from os.stat unless given as `sizes` ({path: bytes}), e.g.
    when the files are not all visible to the calling process. Every rank in
    range(world_size) has an entry (maybe empty).
    """
    world_size = int(world_size)
    if world_size < 1:
        raise ValueError(f"assign_files: world_size must be at least 1, not {world_size}")
    paths = [os.fspath(f) for f in files]
    if len(set(paths)) != len(paths):
        dup = sorted({p for p in paths if paths.count(p) > 1})
        raise ValueError(f"assign_files: files listed more than once: {dup}")
    size_of = {p: int(sizes[p]) if sizes is not None and p in sizes else os.stat(p).st_size for p in paths}
    ordered = sorted(paths)
    ranks = assign_whole_files([size_of[p] for p in ordered], world_size)
    return {r: [ordered[f] for f in files] for r, files in enumerate(ranks)}


def _holders(t) -> Tuple[int, int]:
    """(Python references, C++ references) to tensor t.

    Both must be back where they were before a collective. The C++ count
    alone is not enough: a worker thread that drops the second-to-last C++
    reference then releases the tensor's Python object, which takes the GIL.
    Between the two, the C++ count is already back while the Python count is
    not; returning there let the main thread run on into interpreter shutdown
    with the worker still waiting for the GIL (issue 22).
    """
    import sys
    return sys.getrefcount(t), t._use_count()


class _Comm:
    """The collectives of a torch.distributed group of several ranks, on byte (uint8) tensors.

    Every payload travels as uint8, so dtypes a backend lacks (gloo: float8)
    work; ranks are group ranks, converted to global ranks for torch.

    No work is left in flight: on the CPU (gloo), every collective returns
    only once the backend's worker thread has let go of the tensors it was
    given, Python objects included (_holders). gloo's worker keeps a
    finished collective, and with it references to its tensors, a moment
    after wait() returns; dropping a tensor that has
    a Python object takes the GIL, and a worker that tries that after the
    interpreter began to shut down is cancelled mid-destructor, which aborts
    the process ("terminate called without an active exception"). Objects
    travel as pickled bytes through the same path (not all_gather_object,
    whose internal tensors could not be waited for).
    """

    # How long a collective may wait for the backend to release its tensors.
    RELEASE_TIMEOUT_S = 60.0

    def __init__(self, pg: Any, size: int, rank: int, device: str):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.pg = torch, dist, pg
        self.size, self.rank = size, rank
        self.device = torch.device(device)
        self._stuck: List[Any] = []  # tensors a backend never released (kept, never freed off-thread)

    def _global(self, group_rank: int) -> int:
        return self.dist.get_global_rank(self.pg, group_rank)

    def _run(self, what: str, collective: Callable[[], Any], tensors: Sequence[Any]) -> None:
        """Runs one blocking collective over `tensors`; returns once the backend holds none of them."""
        base = [_holders(t) for t in tensors]
        collective()
        if self.device.type != "cpu":
            return  # nccl: tensors are stream-ordered; the watchdog's release is not waited for here
        import time
        deadline = time.monotonic() + self.RELEASE_TIMEOUT_S
        pause = 0.0
        while [_holders(t) for t in tensors] != base:  # measured exactly as base was
            if time.monotonic() > deadline:
                self._stuck.extend(tensors)
                raise DistributedLoadError(
                    f"tensorlift.fastsafetensors: {what}: the process group's backend still holds the "
                    f"tensors of a finished collective after {self.RELEASE_TIMEOUT_S:.0f} s")
            time.sleep(pause)  # releases the GIL, which the worker needs to drop them
            pause = min(0.001, pause * 2 or 1e-5)

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's picklable `obj`, in rank order."""
        import pickle
        torch = self.torch
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        mine = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        sizes = [torch.empty(1, dtype=torch.int64, device=self.device) for _ in range(self.size)]
        self._run("all_gather", lambda: self.dist.all_gather(sizes, mine, group=self.pg), [mine] + sizes)
        lengths = [int(t.item()) for t in sizes]
        most = max(lengths)
        buf = self.empty(most)
        buf[: len(payload)].copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        outs = [self.empty(most) for _ in range(self.size)]
        self._run("all_gather", lambda: self.dist.all_gather(outs, buf, group=self.pg), [buf] + outs)
        return [pickle.loads(o[:n].cpu().numpy().tobytes()) for o, n in zip(outs, lengths)]

    def agree(self, what: str, err: Optional[BaseException], extra: Any = None) -> List[Any]:
        """Exchanges (status, extra) among all ranks; raises on every rank if any failed.

        The failing rank re-raises its own error; the others raise DistributedLoadError.
        Returns every rank's `extra`.
        """
        status = None if err is None else f"{type(err).__name__}: {err}"
        got = self.all_gather_object((status, extra))
        if err is not None:
            raise err
        failed = [(r, st) for r, (st, _) in enumerate(got) if st is not None]
        if failed:
            detail = "; ".join(f"rank {r}: {st}" for r, st in failed)
            raise DistributedLoadError(f"tensorlift.fastsafetensors: {what} failed on "
                                       f"{len(failed)} of {self.size} ranks ({detail})")
        return [x for _, x in got]

    def empty(self, nbytes: int):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def broadcast(self, buf, src: int) -> None:
        self._run("broadcast", lambda: self.dist.broadcast(buf, src=self._global(src), group=self.pg), [buf])

    def scatter(self, chunks: Optional[List[Any]], nbytes: List[int], src: int):
        """Rank r gets chunks[r] (uint8, nbytes[r] bytes) from src; chunks is None off src."""
        most = max(nbytes)
        out = self.empty(most)
        scatter_list = None
        if self.rank == src:
            scatter_list = []
            for c in chunks:  # equal sizes for every backend: pad the short ones
                if c.numel() != most:
                    padded = self.empty(most)
                    padded[: c.numel()].copy_(c)
                    padded[c.numel():].zero_()
                    c = padded
                scatter_list.append(c)
        self._run("scatter", lambda: self.dist.scatter(out, scatter_list=scatter_list, src=self._global(src),
                                                       group=self.pg), [out] + (scatter_list or []))
        return out if nbytes[self.rank] == most else out[: nbytes[self.rank]]

    def send(self, buf, dst: int, tag: int) -> None:
        self._run("send", lambda: self.dist.send(buf, dst=self._global(dst), group=self.pg, tag=tag), [buf])

    def recv(self, buf, src: int, tag: int) -> None:
        self._run("recv", lambda: self.dist.recv(buf, src=self._global(src), group=self.pg, tag=tag), [buf])


def _as_bytes(t):
    """The bytes of a tensor as a flat uint8 tensor (a view when t is contiguous)."""
    import torch
    return t.contiguous().reshape(-1).view(torch.uint8)


def _shard_ranges(size: int, world: int) -> List[Tuple[int, int]]:
    """Every rank's [start, end) of a dim of `size`: tensorlift's one shard-range rule (C++
    ShardRange: blocks of ceil(size / world), the last ones clipped; fastsafetensors' rule too)."""
    ranges = []
    for r in range(world):
        start, length = shard_range(size, r, world)
        ranges.append((start, start + length))
    return ranges


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


class _RankFile:
    """One loaded file with several ranks: what every rank knows, and the tensors on its reader."""

    __slots__ = ("path", "rank", "specs", "tensors", "shapes", "handed", "released")

    def __init__(self, path: str, rank: int, kept: list, target: Optional[str],
                 tensors: Optional[Dict[str, Any]]):
        self.path, self.rank = path, rank
        # name -> (dtype after loading, header shape, bytes), in file order.
        self.specs: Dict[str, Tuple[str, List[int], int]] = {}
        for t in kept:
            dt = target if target is not None else t[1]
            nbytes = t[4] - t[3]
            if dt != t[1]:
                numel = 1
                for d in t[2]:
                    numel *= int(d)
                nbytes = (numel * dtype_bits(dt) + 7) // 8
            self.specs[t[0]] = (dt, list(t[2]), nbytes)
        self.shapes = {name: spec[1] for name, spec in self.specs.items()}
        self.tensors = tensors  # None on the other ranks
        self.handed: set = set()
        self.released = False

    def like(self, name: str):
        """A meta tensor with the dtype and shape the reader's tensor has (no memory)."""
        import torch
        dt, shape, nbytes = self.specs[name]
        return _dtypes.torch_view(torch.empty(nbytes, dtype=torch.uint8, device="meta"), dt, shape)


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

    # Several ranks -------------------------------------------------------------------
    # Every decision below (found, released, sizes) depends only on what all ranks know,
    # so all ranks raise together or enter the same collective.

    def _entry(self, tensor_name: str, what: str) -> _RankFile:
        i, _ = self._lookup(tensor_name, what)
        e = self._entries[i]
        if e.released:
            raise ValueError(f"{what}: tensor {tensor_name!r} of {e.path} was released: every tensor of "
                             "that file had been handed out (auto_mem_delete, as fastsafetensors does); "
                             "set auto_mem_delete = False on the buffer before to keep it")
        return e

    def _handed(self, e: _RankFile, names: Sequence[str]) -> None:
        if not self.auto_mem_delete:
            return
        e.handed.update(names)
        if len(e.handed) >= len(e.specs):
            if e.tensors is not None:
                e.tensors.clear()  # the same dict self._files holds: the reader's buffer goes
            e.tensors = None
            e.released = True

    def _broadcast(self, tensor_name: str, what: str = "get_tensor"):
        import torch
        e = self._entry(tensor_name, what)
        like = e.like(tensor_name)
        nbytes = e.specs[tensor_name][2]
        if nbytes == 0:
            out = torch.empty(like.shape, dtype=like.dtype, device=self._comm.device)
        else:
            if self._comm.rank == e.rank:
                buf = _as_bytes(e.tensors[tensor_name]).clone()  # the caller's own copy
            else:
                buf = self._comm.empty(nbytes)
            self._comm.broadcast(buf, e.rank)
            out = buf.view(like.dtype).reshape(like.shape)
        self._handed(e, [tensor_name])
        return out

    def _check_dim(self, tensor_name: str, like, dim: int, what: str) -> None:
        if not isinstance(dim, int) or not 0 <= dim < like.dim():
            raise ValueError(f"{what}: dim {dim!r} is out of range for tensor {tensor_name!r} of shape "
                             f"{list(like.shape)} (use 0..{like.dim() - 1}, or -1 to broadcast)")

    def _scatter(self, e: _RankFile, names: Sequence[str], dim: int, what: str):
        """This rank's slices of the tensors `names` (one file) along dim, concatenated along dim."""
        import torch
        world = self._comm.size
        likes = [e.like(n) for n in names]
        for n, like in zip(names, likes):
            self._check_dim(n, like, dim, what)
        base = likes[0]
        for n, like in zip(names, likes):
            same = like.dim() == base.dim() and like.dtype == base.dtype and all(
                like.shape[d] == base.shape[d] for d in range(like.dim()) if d != dim)
            if not same:
                raise ValueError(f"{what}: tensor {n!r} {like.dtype} {list(like.shape)} does not match "
                                 f"{names[0]!r} {base.dtype} {list(base.shape)} except at dim {dim}")
        ranges = [_shard_ranges(like.shape[dim], world) for like in likes]
        shapes = []
        for r in range(world):
            shape = list(base.shape)
            shape[dim] = sum(rg[r][1] - rg[r][0] for rg in ranges)
            shapes.append(shape)
        esize = base.element_size()
        nbytes = []
        for shape in shapes:
            n = esize
            for d in shape:
                n *= d
            nbytes.append(n)
        me = self._comm.rank
        if max(nbytes) == 0:
            return torch.empty(shapes[me], dtype=base.dtype, device=self._comm.device)
        chunks = None
        if me == e.rank:
            chunks = []
            for r in range(world):
                parts = [e.tensors[n].narrow(dim, rg[r][0], rg[r][1] - rg[r][0]) for n, rg in zip(names, ranges)]
                part = parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
                chunks.append(_as_bytes(part))
        buf = self._comm.scatter(chunks, nbytes, e.rank)
        return buf.view(base.dtype).reshape(shapes[me])

    def _sharded(self, tensor_name: str, dim: int, what: str = "get_sharded"):
        if dim == -1:
            return self._broadcast(tensor_name, what)
        e = self._entry(tensor_name, what)
        out = self._scatter(e, [tensor_name], dim, what)
        self._handed(e, [tensor_name])
        return out

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

    def _push(self, tensor_name: str, dst_rank: int, device: Any, dtype: Any):
        import torch
        world = self._comm.size
        if not isinstance(dst_rank, int) or not 0 <= dst_rank < world:
            raise ValueError(f"push_tensor: rank {dst_rank!r} does not exist in a process group of {world}")
        e = self._entry(tensor_name, "push_tensor")
        like = e.like(tensor_name)
        nbytes = e.specs[tensor_name][2]
        tag = self._next_tag  # the same on every rank: every rank makes every call
        self._next_tag += 1
        me, out = self._comm.rank, None
        if me == e.rank and me == dst_rank:
            out = e.tensors[tensor_name].clone()
        elif nbytes == 0:
            if me == dst_rank:
                out = torch.empty(like.shape, dtype=like.dtype, device=self._comm.device)
        elif me == e.rank:
            self._comm.send(_as_bytes(e.tensors[tensor_name]), dst_rank, tag)
        elif me == dst_rank:
            buf = self._comm.empty(nbytes)
            self._comm.recv(buf, e.rank, tag)
            out = buf.view(like.dtype).reshape(like.shape)
        self._handed(e, [tensor_name])
        return None if out is None else _to(out, device, dtype)

    def _multi_cols(self, tensor_names: Sequence[str], dim: int):
        import torch
        if not tensor_names:
            raise ValueError("get_multi_cols: no tensor names")
        groups: Dict[Tuple[int, int], List[str]] = {}
        for name in tensor_names:
            self._entry(name, "get_multi_cols")
            groups.setdefault(self.key_to_rank_lidx[name], []).append(name)
        parts = []
        for key in sorted(groups):  # by (rank, file), as fastsafetensors does
            e = self._entries[self._where[groups[key][0]]]
            parts.append(self._scatter(e, groups[key], dim, "get_multi_cols"))
        for key in sorted(groups):
            self._handed(self._entries[self._where[groups[key][0]]], groups[key])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)

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
