"""Running a torch model larger than a memory budget: its repeated blocks are
streamed from the checkpoint (tensorlift's LayerStreamer, include/tensorlift/streamer.h),
the next block read (and, for sparse-bitmask checkpoints, decoded) while the
current one computes, as accelerate's disk offload does with forward hooks.

    handle = tensorlift.offload.stream_model(model, "model.safetensors", 4 << 30)
    with torch.no_grad():
        logits = model(input_ids).logits
    print(handle.stats())

Each block's parameters are emptied (torch.empty(0)); a forward pre-hook
points them (`.data`, no copy: DLPack views over tensorlift's buffers) at the
block's tensors before the block runs, and a forward hook empties them again
and releases the block afterwards. Everything outside the blocks (embeddings,
final norm, lm_head; tied weights with them) is loaded once and stays. For
inference: autograd would keep the streamed weights alive past the block.

With device="cuda:N" the budget is GPU memory: the blocks stream from the
disk into a ring of two GPU buffers allocated once (sparse groups decoded on
the GPU), the rest and the blocks that fit stay on the GPU, and the model
computes there (its buffers are moved to the GPU; inputs go there too). A
block's buffer is reused once the GPU has finished the work queued on the
current stream before the block's forward hook ran (an event, waited for on
tensorlift's thread, never on Python's). device="emulated" is for tests: the
same streaming into the emulated device, whose memory torch cannot touch, so
each block's tensors are copied to host memory for the forward (the model
computes on the CPU).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

from ._tensors import device_name, tensor_from
from ._tensorlift import Checkpoint, LayerStreamer


class StreamHandle:
    """The hooks and the streamer of a model set up by stream_model."""

    def __init__(self, streamer: LayerStreamer, hooks: list, rest_bytes: int, budget_bytes: int):
        self.streamer = streamer
        self._hooks = hooks
        self.rest_bytes = rest_bytes
        self.budget_bytes = budget_bytes

    def stats(self) -> dict:
        """bytes_read, loads, prefetch_hits, prefetch_misses, wait_seconds; on a device also
        device_bytes (all the device memory tensorlift holds for the model: the rest, the
        resident blocks, the ring) and budget_bytes."""
        out = self.streamer.stats()
        if self.streamer.device != "cpu":
            out["device_bytes"] = self.rest_bytes + self.streamer.device_memory
            out["budget_bytes"] = self.budget_bytes
        return out

    def resident_layers(self) -> List[int]:
        return self.streamer.resident_layers()

    def streamed_layers(self) -> List[int]:
        resident = set(self.streamer.resident_layers())
        return [i for i in range(self.streamer.num_layers()) if i not in resident]

    def remove(self) -> None:
        """Removes the hooks; the blocks' parameters stay empty (nothing is restored)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _default_blocks(model) -> Sequence:
    # transformers' Llama-like models (Llama, Mistral, Qwen2, ...): model.model.layers.
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError("tensorlift.offload: no model.model.layers here; pass layer_modules=[...]")
    return list(layers)


def _param_names(model) -> Dict[int, List[str]]:
    """id(parameter) -> every qualified name it has (tied weights have several)."""
    names: Dict[int, List[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def stream_model(model, path, budget_bytes: int, layer_modules: Optional[Sequence] = None,
                 mode: Optional[str] = None, device="cpu") -> StreamHandle:
    """Streams `model`'s blocks from the checkpoint at `path` within `budget_bytes`.

    layer_modules: the blocks in execution order (default: model.model.layers).
    The checkpoint holds the model's state_dict names (dense names, for a
    sparse-bitmask checkpoint); every parameter must be in it, with the
    parameter's shape and dtype. budget_bytes covers the parameters outside the
    blocks (loaded now, kept) and the streamer's (resident blocks, two streamed
    ones in flight): host memory on the CPU, GPU memory with device="cuda:N"
    (the model is built on the CPU; its buffers are moved to the GPU).
    mode: the read mode; None: "direct" on the CPU (bypasses the page cache, so
    that a model larger than memory really streams from the disk), "auto" on a
    device (files the page cache holds are read through it, others with
    O_DIRECT). Raises ValueError when the budget cannot hold the rest plus two
    blocks, MemoryError when the device has less memory free.
    """
    import torch

    path = os.fspath(path)
    device = device_name(device)
    on_device = device != "cpu"
    if mode is None:
        mode = "auto" if on_device else "direct"
    emulated = device.startswith("emulated")
    compute = torch.device("cpu") if device == "cpu" or emulated else torch.device(device)
    blocks = list(layer_modules) if layer_modules is not None else _default_blocks(model)
    prefix_of = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    names_of = _param_names(model)
    in_block = set()
    # Per block: (parameter, checkpoint name, shape, dtype) of each parameter.
    # A parameter also known by a name outside its block (a tied weight) stays
    # with the rest, whose tensors are kept.
    block_params: List[List[Tuple[torch.nn.Parameter, str, Tuple[int, ...], torch.dtype]]] = []
    for block in blocks:
        if id(block) not in prefix_of:
            raise ValueError("tensorlift.offload: a layer module is not a submodule of the model")
        prefix = prefix_of[id(block)] + "."
        entries = []
        for local, p in block.named_parameters():
            if id(p) in in_block or any(not n.startswith(prefix) for n in names_of[id(p)]):
                continue
            in_block.add(id(p))
            entries.append((p, prefix + local, tuple(p.shape), p.dtype))
        block_params.append(entries)

    # A tied parameter may be stored under any of its names (safetensors
    # writers keep one); ask for each name and use what is there. Names, not a
    # predicate: the filter then applies to the dense names of sparse groups.
    params = dict(model.named_parameters(remove_duplicate=False))
    rest_names = [n for pid, ns in names_of.items() if pid not in in_block for n in ns]
    ckpt = Checkpoint.open(path)
    present = set(ckpt.load_names())
    loaded_rest = ckpt.load(names=[n for n in rest_names if n in present], mode=mode, device=device)
    loaded_names = set(loaded_rest.names())
    rest = []  # (parameter, its tensor)
    rest_bytes = 0
    for pid, names in names_of.items():
        if pid in in_block:
            continue
        found = [n for n in names if n in loaded_names]
        if not found:
            raise ValueError(f"tensorlift.offload: parameter {names[0]!r} is not in {path}")
        p = params[names[0]]
        t = _tensor(loaded_rest, found[0], emulated)
        _check(found[0], t, tuple(p.shape), p.dtype)
        rest.append((p, t))
        rest_bytes += t.numel() * t.element_size()
    if on_device:  # What the device holds for them: the load's buffers.
        rest_bytes = loaded_rest.device_plan()["device_bytes"]
    if budget_bytes <= rest_bytes:
        raise ValueError(f"tensorlift.offload: a budget of {budget_bytes} bytes does not hold the "
                         f"parameters outside the blocks ({rest_bytes} bytes"
                         f"{' on ' + device if on_device else ''})")
    streamer = LayerStreamer(path, [[name for _, name, _, _ in entries] for entries in block_params],
                             budget_bytes - rest_bytes, mode, device)

    # Nothing is changed in the model until everything above succeeded.
    for p, t in rest:
        p.data = t
    for entries in block_params:
        for p, _, _, dtype in entries:
            p.data = torch.empty(0, dtype=dtype, device=compute)
    if compute.type != "cpu":
        for module in model.modules():
            for key, buf in module._buffers.items():
                if buf is not None and buf.device != compute:
                    module._buffers[key] = buf.to(compute)

    hooks = []
    for i, (block, entries) in enumerate(zip(blocks, block_params)):
        hooks.append(block.register_forward_pre_hook(_make_pre_hook(streamer, i, entries, emulated)))
        hooks.append(block.register_forward_hook(_make_post_hook(streamer, i, entries, compute)))
    return StreamHandle(streamer, hooks, rest_bytes, budget_bytes)


def _tensor(loaded, name: str, emulated: bool):
    """The tensor `name` of `loaded`: a view over its buffer, or for the
    emulated device (whose memory torch cannot touch) a copy in host memory."""
    if not emulated:
        return tensor_from(loaded, name, "pt")
    import torch
    from . import _dtypes
    dtype, shape, nbytes = loaded.info(name)
    raw = torch.frombuffer(loaded.host_bytes(name), dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
    return _dtypes.torch_view(raw, dtype, shape)


def _check(name: str, t, shape, dtype) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ValueError(f"tensorlift.offload: {name!r} is {t.dtype} {list(t.shape)} in the checkpoint, "
                         f"the model wants {dtype} {list(shape)}")


def _make_pre_hook(streamer: LayerStreamer, i: int, entries, emulated: bool):
    def pre_hook(module, args):
        loaded = streamer.acquire(i)
        for p, name, shape, dtype in entries:
            t = _tensor(loaded, name, emulated)
            _check(name, t, shape, dtype)
            p.data = t
        # The tensors hold their buffers; the streamer's reference goes at release.
        loaded.release()
    return pre_hook


def _make_post_hook(streamer: LayerStreamer, i: int, entries, compute):
    import torch

    def post_hook(module, args, output):
        for p, _, _, dtype in entries:
            p.data = torch.empty(0, dtype=dtype, device=compute)
        # On a GPU: the block's buffer is reused once the work queued so far on
        # the current stream (this block's forward) is done.
        stream = torch.cuda.current_stream(compute).cuda_stream if compute.type == "cuda" else 0
        streamer.release(i, stream)
    return post_hook
