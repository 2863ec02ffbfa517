"""The fast path `tensorlift.load` (tensors from the C++ core's buffers without copies: _tensors.py)."""
from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

from . import _dtypes
from ._errors import not_instance
from ._sources import is_object_url  # noqa: F401 (importable from here as before)
from ._tensorlift import Checkpoint
from ._tensors import device_name, require_framework, tensor_from


def check_metadata(metadata) -> None:
    """Metadata as the reference accepts it: None or a dict of str to str (TypeError otherwise,
    with the reference's message)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise not_instance("metadata", metadata, "dict")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise not_instance("metadata", k if not isinstance(k, str) else v, "str")


def _paths(paths) -> List[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def _checkpoints(paths, **object_store):
    """The checkpoints to load for `paths`: several .safetensors files open as one checkpoint, so
    their reads are planned and run together (as a directory's shards are), not one file after
    another; anything else (a directory, an index, a single file) opens on its own."""
    names = _paths(paths)
    if len(names) > 1 and all(os.path.isfile(p) and not p.endswith(".json") for p in names):
        yield Checkpoint.open_files(names)
        return
    for path in names:
        yield Checkpoint.open(path, **object_store) if object_store else Checkpoint.open(path)


def load(paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], device="cpu",
         framework: str = "pt", filter: Union[None, str, Iterable[str], Callable[[str], bool]] = None,
         mode: str = "auto", threads: Optional[int] = None, progress: bool = False,
         dtype=None, copy: bool = False, _arena_pool=None, tp_size: int = 1, tp_rank: int = 0,
         layout: str = "") -> Dict[str, object]:
    """Loads tensors fast: returns name -> tensor, zero-copy over tensorlift's buffers.

    paths: a .safetensors file, a model.safetensors.index.json, a directory of
    shards, or a list of those (several .safetensors files load together, as the
    shards of one checkpoint: their reads are planned and run in one go, and a
    tensor in two of them is a ValueError); or a tensorlift.remote.Peer, to pull from a
    running peer (else its fallback from disk). device: "cpu" or "cuda:N" (also an int or a
    torch.device): GPU loads read through pinned staging buffers (or GPUDirect
    Storage) straight into GPU memory. filter: a regex (str), a collection of
    names, or a predicate on names. mode: auto | buffered | direct | mmap;
    auto, per file: a file (nearly) all in the page cache comes back as views
    of the page cache (a private mapping, no copy, as safetensors does), or,
    with copy=True, read into memory of its own; a file mostly not cached is
    read with O_DIRECT. Views are views whatever the header's size: a tensor that an odd
    header leaves misaligned for its dtype is viewed where it is, as safetensors does (its
    data_ptr() is then not a multiple of its element size; copy=True gives aligned copies). dtype: convert floating-point tensors (F32/F16/BF16/F8) to this while
    loading (a torch dtype or "F32"/"F16"/"BF16"). progress: a tqdm bar. The
    GIL is released while reading. tp_size, tp_rank, layout: the tensors `layout` splits
    ("REGEX=DIM;...", docs/remote.md) come back as this tensor-parallel rank's slice, and only the
    slice's bytes are read (from local files, a bucket, onto a device, with dtype, alike).
    """
    require_framework(framework, "tensorlift.load")
    from .remote import Peer, load_peer
    if isinstance(paths, Peer):
        if device_name(device) != "cpu" or dtype is not None:
            raise ValueError("tensorlift.load: a Peer source loads to the host as served (no device=, dtype=)")
        return load_peer(paths, framework=framework, filter=filter)
    device = device_name(device)
    target = _dtypes.safetensors_name(dtype) if dtype is not None else None
    out: Dict[str, object] = {}
    bar = None
    callback = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(unit="B", unit_scale=True, desc="tensorlift")

        def callback(done, total, seconds):
            if bar.total != total:
                bar.total = total
            bar.update(done - bar.n)
    try:
        for ckpt in _checkpoints(paths):
            names = None
            regex = None
            if isinstance(filter, str):
                regex = filter
            elif callable(filter):
                names = [n for n in ckpt.load_names() if filter(n)]
            elif filter is not None:
                names = list(filter)
            # Misaligned views as the reference hands out (odd header sizes): torch and numpy
            # take tensors whose data is not a multiple of the element size.
            loaded = ckpt.load(names=names, regex=regex, mode=mode, threads=threads or 0,
                               progress=callback, device=device, dtype=target, copy=copy,
                               arena_pool=_arena_pool, misaligned_views=True, tp_size=tp_size,
                               tp_rank=tp_rank, layout=layout)
            for name in loaded.names():
                if name in out:
                    raise ValueError(f"tensorlift.load: tensor {name!r} is in more than one of the files")
                out[name] = tensor_from(loaded, name, framework)
            loaded.release()
    finally:
        if bar is not None:
            bar.close()
    return out


def content_root(paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], mode: str = "auto",
                 threads: Optional[int] = None) -> str:
    """The content identity root of a checkpoint (docs/remote.md, "Content identity"): 32 lowercase
    hex digits over its tensors' names, dtypes, shapes and bytes, what `tensorlift load` prints and
    what tensorlift.remote.Peer(content=...) / load_from_peer(content=...) take.

    paths: a .safetensors file, an index, a directory of shards, or several .safetensors files (one
    checkpoint). It loads the checkpoint into host memory and frees it: reads (buffered or direct)
    hash each 4 MiB piece as it lands, with no second pass; files that auto (or mode="mmap") views
    from the page cache are hashed in a pass over the views after they are mapped.
    """
    ckpts = list(_checkpoints(paths))
    if len(ckpts) != 1:
        raise ValueError("tensorlift.content_root: one checkpoint (a file, an index, a directory, or "
                         f"several .safetensors files), got {len(ckpts)}")
    loaded = ckpts[0].load(mode=mode, threads=threads or 0, content_hash="on")
    try:
        return loaded.content
    finally:
        loaded.release()
