"""tensorlift.stream: (name, tensor) pairs as their bytes are in place, while later bytes are read.

A consumer that copies each tensor somewhere (an inference server's
`load_weights`, a model's parameters) starts after the first piece instead of
after the whole checkpoint, and its copies overlap the remaining reads.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
from typing import Callable, Iterable, Iterator, List, Optional, Tuple, Union

PIECE_BYTES = 256 << 20  # the unit read ahead: large reads, a short wait for the first tensors


def shard_files(paths) -> List[str]:
    """The .safetensors files of `paths` (files, indexes, directories, or a list of them), in order."""
    from ._core import _paths
    from ._tensorlift import Checkpoint
    files: List[str] = []
    for path in _paths(paths):
        if os.path.isfile(path) and not path.endswith(".json"):
            files.append(path)
        else:
            files.extend(Checkpoint.open(path).shards())
    return files


def _matcher(filter) -> Optional[Callable[[str], bool]]:
    if filter is None:
        return None
    if isinstance(filter, str):
        return re.compile(filter).search
    if callable(filter):
        return filter
    names = set(filter)
    return names.__contains__


def plan_pieces(files: List[str], filter=None, piece_bytes: Optional[int] = None) -> List[Tuple[str, List[str]]]:
    """(file, [tensor names]) pieces in file order, each about piece_bytes of stored bytes.

    A file with sparse-bitmask groups (whose dense tensors have no single byte
    range) is one piece; `filter` (a regex, a collection of names or a
    predicate) keeps the matching names only.
    """
    from ._tensorlift import Checkpoint
    piece_bytes = PIECE_BYTES if piece_bytes is None else piece_bytes
    keep = _matcher(filter)
    pieces: List[Tuple[str, List[str]]] = []
    for path in files:
        ckpt = Checkpoint.open(path)
        stored = ckpt.shard_tensors(0)  # (name, dtype, shape, begin, end), in file order
        dense = ckpt.load_names()
        if len(ckpt.shards()) != 1 or set(dense) != {t[0] for t in stored}:
            names = [n for n in dense if keep is None or keep(n)]
            if names:
                pieces.append((path, names))
            continue
        group: List[str] = []
        size = 0
        for name, _, _, begin, end in stored:
            if keep is not None and not keep(name):
                continue
            group.append(name)
            size += end - begin
            if size >= piece_bytes:
                pieces.append((path, group))
                group, size = [], 0
        if group:
            pieces.append((path, group))
    return pieces


def stream(paths, device="cpu", framework: str = "pt",
           filter: Union[None, str, Iterable[str], Callable[[str], bool]] = None, mode: str = "auto",
           threads: Optional[int] = None, dtype=None, copy: bool = False, progress: bool = False,
           piece_bytes: Optional[int] = None) -> Iterator[Tuple[str, object]]:
    """Yields (name, tensor) for every tensor of `paths`, each as soon as its piece is read.

    The same arguments as tensorlift.load (paths: files, indexes, directories
    or a list of them). The tensors are cut, in file order, into pieces of
    about `piece_bytes` (256 MiB) of stored bytes; a worker thread reads piece
    k+1 (tensorlift releases the GIL) while the caller consumes piece k, so
    the first tensor comes after one piece and the caller's work overlaps the
    remaining reads. At most two pieces are held: a piece's memory is freed
    once the caller has dropped its tensors. Page-cached files come back as
    views of the page cache (mode auto, unless copy=True) at once. Pieces read
    into memory reuse the memory of pieces whose tensors were dropped (an
    ArenaPool): a few pieces' worth is faulted in, not the whole checkpoint.
    """
    from ._core import load
    from ._sources import is_object_url
    from ._tensorlift import ArenaPool
    from ._tensors import require_framework
    require_framework(framework, "tensorlift.stream")
    files = shard_files(paths)
    pieces = plan_pieces(files, filter, piece_bytes)
    if not pieces:
        return
    # Object storage: each piece's ranged GETs land in memory of its own (no arena pool).
    pool = None if any(is_object_url(f) for f in files) else ArenaPool(1)
    kwargs = dict(device=device, framework=framework, mode=mode, threads=threads, dtype=dtype, copy=copy,
                  progress=progress, _arena_pool=pool)

    def read(piece: Tuple[str, List[str]]):
        return load(piece[0], filter=piece[1], **kwargs)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensorlift-stream") as pool:
        pending = pool.submit(read, pieces[0])
        try:
            for i in range(len(pieces)):
                tensors = pending.result()
                pending = pool.submit(read, pieces[i + 1]) if i + 1 < len(pieces) else None
                for name in list(tensors):
                    yield name, tensors.pop(name)
                del tensors
        finally:
            if pending is not None:
                pending.cancel()
