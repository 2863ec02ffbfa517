"""tensorlift.fastsafetensors with several ranks: the process group, the files' assignment, the
collectives (_Comm) and what every rank knows of a loaded file (_RankFile), and the multi-rank
half of FilesBufferOnDevice (_RankExchange: broadcast, scatter, send). The module docstring of
fastsafetensors.py says what the API does with several ranks."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _dtypes
from ._fastsafetensors_types import _to
from ._tensorlift import assign_whole_files, dtype_bits, shard_range


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


class _RankExchange:
    """FilesBufferOnDevice with several ranks: the tensors handed out through collectives.

    A base of FilesBufferOnDevice, over its state: _comm, _entries, _where, _next_tag,
    auto_mem_delete, key_to_rank_lidx and _lookup. Every decision below (found, released,
    sizes) depends only on what all ranks know, so all ranks raise together or enter the same
    collective.
    """

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
