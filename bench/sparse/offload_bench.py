"""Offload benchmark (issue #7, "Loading and streaming"): greedy generation with a
Llama whose weights do not fit the memory budget, its blocks streamed from disk
by tensorlift.offload.stream_model, from a dense checkpoint of 50%-pruned
weights and from the sparse-bitmask checkpoint of the same weights.

    PYTHONPATH=<built tensorlift package> .venv/bin/python bench/sparse/offload_bench.py \
        --build build [--tokens 8] [--layers 22]

The model is transformers' LlamaForCausalLM from a config (hidden 2048,
intermediate 5632, 22 layers, vocab 32000: 1.26 B parameters, 2.5 GB in bf16),
with random N(0, 0.02) weights from a fixed seed (norms 1), pruned with
`tensorlift sparsify --prune magnitude:0.5`; the sparse checkpoint and a dense
copy of its weights are cached in ~/.cache/tensorlift/bench/. The budget is a
quarter of the weights' bytes; reads are O_DIRECT (mode "direct"), so every
forward pass reads the streamed blocks from the disk. For each checkpoint: the
tokens/s of generating --tokens tokens after a 16-token prompt (the first token
includes the prompt; an untimed one-token forward before it loads the resident
blocks and warms torch up), median of --runs runs in a rotating order, the
streamer's stats, and the logits, which must be identical across checkpoints
and runs. A third row runs the dense checkpoint with a budget above the
weights' bytes (every block resident: the compute alone, for scale).

The baseline is accelerate's disk offload, set up the way its users do it,
under the same budget: the model built on the meta device (init_empty_weights),
infer_auto_device_map(max_memory={"cpu": budget}, no_split_module_classes=
["LlamaDecoderLayer"]), which maps the first modules to "cpu" and the rest to
"disk", and dispatch_model with an offload folder. The folder, in accelerate's
format (one .dat per tensor, np.memmap, and index.json), is written once by
accelerate's offload_weight from the dense checkpoint and cached next to it;
each run loads the "cpu" modules' weights from the dense checkpoint and
dispatches (untimed). accelerate reads the .dat files through the page cache,
so its rows are timed the same way but cold by eviction: the folder's files
are evicted with posix_fadvise(DONTNEED) (mincore checks it), in one row
before the timed generation only (later tokens may then find the weights in
the page cache, memory beyond the budget), in the other before every forward
pass (each pass reads every "disk" weight from the disk, as O_DIRECT
streaming does). Their logits are compared with the dense-streamed ones and
reported (max abs difference), not required to be equal. Without `import
accelerate`, the row says why it was skipped. Prints a table and writes
bench/out/offload.json.

On a device (issue 44: --device cuda:N; --device emulated runs the tensorlift
rows on tensorlift's emulated device with the compute on the CPU, a dry run):

    PYTHONPATH=... python bench/sparse/offload_bench.py --build build-gpu --device cuda:0 [--quick]

the same model and checkpoints, built on the CPU and handed to
stream_model(..., device=DEVICE), which streams the blocks into a ring of
device buffers and loads the rest (embeddings, norm, lm_head) onto the device
once; the prompt is on the device. The budget is --budget-fraction (default
0.5) of the weights' bytes, so the weights are about twice the budget. Rows:
tensorlift streaming the dense and the sparse checkpoint (stream_model's
default read mode: the page cache for cached files, O_DIRECT otherwise), each
cold (files evicted before the model is set up and again before the timed
generation; the cached bytes are measured with mincore) and warm (the files
read through the page cache at both points); accelerate's disk offload to the
device (the model on meta, infer_auto_device_map(max_memory={N: budget,
"cpu": 0}): the first modules on the device, the rest on "disk", an offload
folder as above, dispatch_model executing on the device), cold (the folder
evicted before every forward pass) and warm; accelerate's CPU offload (the
same map with "cpu" for "disk": those weights in host memory, copied to the
device at each pass). Each row: tokens/s, median (min–max) of --runs runs in a
rotating order, the ratio to accelerate's disk offload in the same state
(targets: sparse 2.25x, dense 1.3x), the peak device memory above the idle
baseline (torch's max_memory_allocated, tensorlift's stats()["device_bytes"],
and total - free polled every 5 ms), whether tensorlift's device bytes stayed
within the budget, and whether its greedy tokens equal the dense cold row's
(required of tensorlift's rows; exit 1 otherwise). --quick: 12 layers, 2
tokens, 2 runs (a GPU lease's step). The JSON (bench/out/offload-cuda0.json,
--out) and its table (the same name with .md) are rewritten after every run
of a row, so a run cut short keeps what it measured; the table is printed at
the end.
"""

import argparse
import ctypes
import gc
import json
import mmap
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.initialization import no_init_weights

import tensorlift
from tensorlift.offload import stream_model

try:
    import accelerate
    from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
    from accelerate.utils import offload_weight, save_offload_index, set_module_tensor_to_device
    ACCELERATE_MISSING = None
except ImportError as e:
    accelerate = None
    ACCELERATE_MISSING = f"import accelerate failed ({e}); not installed in this environment"

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
from load_bench import evict, read_through  # noqa: E402  (posix_fadvise DONTNEED; a read of each file)
PROMPT_TOKENS = 16


def config(layers):
    return LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                       max_position_embeddings=2048, tie_word_embeddings=False)


def empty_model(cfg):
    """The model with uninitialized bf16 parameters (stream_model replaces them)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with no_init_weights():
            return LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(previous)


def cache_dir(layers):
    return os.path.join(os.path.expanduser("~/.cache/tensorlift/bench"), f"offload-llama-h2048-l{layers}")


def checkpoints(build, layers):
    """(dense pruned file, sparse directory), made once and cached."""
    cache = cache_dir(layers)
    dense = os.path.join(cache, "pruned.safetensors")
    sparse = os.path.join(cache, "sparse")
    if os.path.exists(dense) and os.path.isdir(sparse):
        return dense, sparse
    os.makedirs(cache, exist_ok=True)
    original = os.path.join(cache, "original.safetensors")
    gen = torch.Generator().manual_seed(0)
    weights = {}
    t0 = time.perf_counter()
    for name, p in empty_model(config(layers)).named_parameters():
        if p.dim() == 1:
            weights[name] = torch.ones(p.shape, dtype=torch.bfloat16)
        else:
            weights[name] = (torch.randn(p.shape, generator=gen) * 0.02).to(torch.bfloat16)
    save_file(weights, original)
    del weights
    print(f"wrote {original} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    subprocess.run([os.path.join(build, "tensorlift"), "sparsify", original, sparse, "--prune", "magnitude:0.5"],
                   check=True, stdout=subprocess.DEVNULL)
    save_file({k: v.contiguous() for k, v in tensorlift.load(sparse).items()}, dense + ".tmp")
    os.rename(dense + ".tmp", dense)
    os.remove(original)
    print(f"pruned checkpoints in {cache} after {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return dense, sparse


def file_bytes(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
    return os.path.getsize(path)


def greedy(model, prompt, tokens):
    """Greedy generation of exactly `tokens` tokens after `prompt`, with the logits of each."""
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)


def run(cfg, path, budget, tokens, prompt):
    """One generation with a freshly hooked-up model: (row, logits, sequences)."""
    model = empty_model(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    handle = stream_model(model, path, budget, mode="direct")
    # One forward of one token first, untimed: it loads the resident blocks
    # and lets torch set its kernels up, so the timed part is steady state.
    with torch.no_grad():
        model(prompt[:, :1])
    before = handle.stats()
    t0 = time.perf_counter()
    out = greedy(model, prompt, tokens)
    seconds = time.perf_counter() - t0
    stats = {k: v - before[k] for k, v in handle.stats().items()}
    row = streamed_row(path, weight_bytes, budget, handle, tokens, seconds, stats)
    handle.remove()
    return row, torch.stack(out.logits), out.sequences


def streamed_row(path, weight_bytes, budget, handle, tokens, seconds, stats):
    """The figures of one generation with streamed blocks."""
    return {
        "checkpoint": path,
        "checkpoint_bytes": file_bytes(path),
        "weight_bytes": weight_bytes,
        "budget_bytes": budget,
        "rest_bytes": handle.rest_bytes,
        "resident_layers": len(handle.resident_layers()),
        "streamed_layers": len(handle.streamed_layers()),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "stats": stats,
        "read_gb_per_s": stats["bytes_read"] / seconds / 1e9,
    }


def median_run(rows):
    """The run of median tokens/s (the lower middle one for an even count), with every run's tokens/s."""
    ordered = sorted(rows, key=lambda x: x["tokens_per_s"])
    return dict(ordered[(len(ordered) - 1) // 2], tokens_per_s_runs=[x["tokens_per_s"] for x in rows])


def meta_model(cfg):
    """The model on the meta device, bf16, as accelerate users build it before dispatching."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with init_empty_weights():
            return LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(previous)


def device_map_for(cfg, budget):
    """accelerate's device map under `budget` bytes of CPU memory (the rest on "disk")."""
    return dict(infer_auto_device_map(meta_model(cfg), max_memory={"cpu": budget},
                                      no_split_module_classes=["LlamaDecoderLayer"], dtype=torch.bfloat16))


def placement(name, device_map):
    """The device of parameter `name`: that of its longest module prefix in the map."""
    best = None
    for module in device_map:
        if module == "" or name == module or name.startswith(module + "."):
            if best is None or len(module) > len(best):
                best = module
    return device_map[best]


def offload_folder(cfg, dense, device_map):
    """accelerate's offload folder (a .dat per tensor, index.json) of the weights the
    map puts on "disk", written once from the dense checkpoint with accelerate's own
    offload_weight (what load_checkpoint_and_dispatch does on every call) and cached."""
    names = [n for n, _ in meta_model(cfg).named_parameters() if placement(n, device_map) == "disk"]
    folder = os.path.join(cache_dir(cfg.num_hidden_layers), "accelerate-offload-" + "-".join(
        f"{device}{sum(1 for d in device_map.values() if d == device)}" for device in ("cpu", "disk")))
    index_file = os.path.join(folder, "index.json")
    if os.path.exists(index_file):
        with open(index_file) as f:
            if sorted(json.load(f)) == sorted(names):
                return folder
    t0 = time.perf_counter()
    tmp = folder + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    index = {}
    with safe_open(dense, "pt") as f:
        for name in names:
            offload_weight(f.get_tensor(name), name, tmp, index=index)
    save_offload_index(index, tmp)
    if os.path.exists(folder):
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
    os.rename(tmp, folder)
    print(f"wrote accelerate's offload folder {folder} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return folder


def folder_files(folder):
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder))]


def cached_bytes(paths):
    """Bytes of the files in the page cache (mincore over a read-only mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    page = mmap.PAGESIZE
    total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr is None or addr == ctypes.c_void_p(-1).value:
                raise OSError(ctypes.get_errno(), f"mmap {p}")
            try:
                vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
                if libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {p}")
                total += min(size, sum(b & 1 for b in bytes(vec)) * page)
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total


def disk_read_bytes():
    """Bytes this process has had read from the block device (/proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def run_accelerate(cfg, dense, folder, device_map, budget, tokens, prompt, evict_each_forward):
    """One generation with accelerate's disk offload, dispatched afresh: (row, logits, sequences)."""
    model = meta_model(cfg)
    params = dict(model.named_parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    on_cpu = [n for n in params if placement(n, device_map) == "cpu"]
    # The "cpu" modules' weights from the dense checkpoint, as load_checkpoint_in_model
    # loads them; dispatch_model then finds the "disk" ones in the prepared folder
    # (its index.json is there, so it writes nothing) and hooks the model up.
    with safe_open(dense, "pt") as f:
        for name in on_cpu:
            set_module_tensor_to_device(model, name, "cpu", value=f.get_tensor(name))
    model = dispatch_model(model, device_map=device_map, offload_dir=folder)
    files = folder_files(folder)
    with torch.no_grad():
        model(prompt[:, :1])
    hook = None
    if evict_each_forward:
        hook = model.register_forward_pre_hook(lambda module, args: evict(files))
    evict(files)
    cached_before = cached_bytes(files)
    read_before = disk_read_bytes()
    t0 = time.perf_counter()
    out = greedy(model, prompt, tokens)
    seconds = time.perf_counter() - t0
    read = disk_read_bytes() - read_before
    cached_after = cached_bytes(files)
    if hook is not None:
        hook.remove()
    modules = lambda device: [m for m, d in device_map.items() if d == device]
    blocks = lambda device: sum(1 for m in modules(device) if m.startswith("model.layers.")) \
        if "" not in device_map else (cfg.num_hidden_layers if device_map[""] == device else 0)
    row = {
        "checkpoint": folder,
        "checkpoint_bytes": sum(os.path.getsize(p) for p in files if p.endswith(".dat")),
        "weight_bytes": weight_bytes,
        "budget_bytes": budget,
        "max_memory": {"cpu": budget},
        "device_map": device_map,
        "cpu_bytes": sum(params[n].numel() * params[n].element_size() for n in on_cpu),
        "disk_bytes": sum(p.numel() * p.element_size() for n, p in params.items() if n not in on_cpu),
        "resident_layers": blocks("cpu"),
        "streamed_layers": blocks("disk"),
        "eviction": "posix_fadvise(DONTNEED) of the offload folder before "
                    + ("every forward pass" if evict_each_forward else "the timed generation"),
        "cached_bytes_before": cached_before,
        "cached_bytes_after": cached_after,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "disk_read_bytes": read,
        "read_gb_per_s": read / seconds / 1e9,
    }
    return row, torch.stack(out.logits), out.sequences


# --- The device path (--device cuda:N, or emulated for a dry run) ---------------------------

QUICK = {"layers": 12, "tokens": 2, "runs": 2}
# Rows of the device path: (name, loader, checkpoint, state). Cold: the files evicted
# (posix_fadvise DONTNEED, mincore-checked) before the model is set up and again just before the
# timed generation; warm: read through the page cache at both points.
DEVICE_ROWS = [("tl-dense-cold", "tensorlift", "dense", "cold"), ("tl-dense-warm", "tensorlift", "dense", "warm"),
               ("tl-sparse-cold", "tensorlift", "sparse", "cold"), ("tl-sparse-warm", "tensorlift", "sparse", "warm"),
               ("acc-disk-cold", "accelerate-disk", "folder", "cold"),
               ("acc-disk-warm", "accelerate-disk", "folder", "warm"),
               ("acc-cpu", "accelerate-cpu", "dense", "host")]
# Throughput targets against accelerate's disk offload in the same state (issue 44).
TARGETS = {"dense": 1.3, "sparse": 2.25}
COUNTERS = ("bytes_read", "loads", "prefetch_hits", "prefetch_misses", "wait_seconds")


def cuda_index(device):
    """N of "cuda:N"; None for the emulated device (no torch device)."""
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else None


def sync(device):
    if cuda_index(device) is not None:
        torch.cuda.synchronize(cuda_index(device))


def checkpoint_files(path):
    if os.path.isdir(path):
        return [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
    return [path]


def set_state(files, state):
    """Cold: evicts the files; warm: reads them through the page cache. Returns their cached bytes."""
    if state == "cold":
        evict(files)
    elif state == "warm":
        read_through(files)
    return cached_bytes(files)


class DeviceMemory:
    """The device memory a row takes: torch's allocator peak (max_memory_allocated) and the peak
    of the device's used memory (total - free, cudaMemGetInfo polled every 5 ms by a thread), both
    from a baseline taken when the row starts (the previous row's memory freed). Nothing on the
    emulated device."""

    def __init__(self, device):
        self.index = cuda_index(device)
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        self._thread = None

    def used(self):
        free, total = torch.cuda.mem_get_info(self.index)
        return total - free

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used())
            self._stop.wait(0.005)

    def __enter__(self):
        if self.index is None:
            return self
        gc.collect()
        torch.cuda.synchronize(self.index)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.index)
        self.baseline = self.peak = self.used()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            torch.cuda.synchronize(self.index)
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self.used())

    def report(self):
        if self.index is None:
            return {}
        return {"torch_peak_bytes": torch.cuda.max_memory_allocated(self.index),
                "polled_peak_bytes": self.peak - self.baseline, "baseline_bytes": self.baseline}


def run_streamed(cfg, path, budget, tokens, prompt, device, state):
    """One generation with tensorlift streaming the blocks onto `device`: (row, logits, sequences)."""
    files = checkpoint_files(path)
    model = empty_model(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    set_state(files, state)
    with DeviceMemory(device) as mem:
        handle = stream_model(model, path, budget, device=device)
        device_bytes = [handle.stats().get("device_bytes")]
        with torch.no_grad():
            model(prompt[:, :1])  # untimed: the resident blocks, torch's kernels
        sync(device)
        cached_before = set_state(files, state)
        before = handle.stats()
        t0 = time.perf_counter()
        out = greedy(model, prompt, tokens)
        sync(device)
        seconds = time.perf_counter() - t0
        after = handle.stats()
        device_bytes.append(after.get("device_bytes"))
    stats = {k: after[k] - before[k] for k in COUNTERS if k in after}
    stats.update({k: v for k, v in after.items() if k not in COUNTERS})
    peak_device = max((b for b in device_bytes if b is not None), default=None)
    memory = mem.report()
    memory["tensorlift_device_bytes"] = peak_device
    if "torch_peak_bytes" in memory and peak_device is not None:
        memory["torch_plus_tensorlift_bytes"] = memory["torch_peak_bytes"] + peak_device
    row = dict(streamed_row(path, weight_bytes, budget, handle, tokens, seconds, stats), loader="tensorlift",
               state=state, cached_bytes_before=cached_before, cached_bytes_after=cached_bytes(files), memory=memory,
               device_bytes_within_budget=peak_device <= budget if peak_device is not None else None)
    handle.remove()
    logits, sequences = torch.stack(out.logits).cpu(), out.sequences.cpu()
    del model, handle, out
    return row, logits, sequences


def run_dispatched(cfg, dense, folder, device_map, budget, tokens, prompt, device, state):
    """One generation with accelerate's hooks executing on `device`, dispatched afresh: the blocks
    the map puts on "disk" read from the offload folder (np.memmap) at each forward pass, those on
    "cpu" copied from host memory at each pass. (row, logits, sequences)."""
    index = cuda_index(device)
    model = meta_model(cfg)
    params = dict(model.named_parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    where = {n: placement(n, device_map) for n in params}
    on_disk = "disk" in where.values()
    files = folder_files(folder) if on_disk else []
    with DeviceMemory(device) as mem:
        # The weights that are not on "disk", from the dense checkpoint, where the map puts them
        # (load_checkpoint_in_model's way); dispatch_model hooks the model up, the "disk" ones
        # from the prepared folder (its index.json is there: it writes nothing).
        with safe_open(dense, "pt") as f:
            for name, d in where.items():
                if d != "disk":
                    set_module_tensor_to_device(model, name, "cpu" if d == "cpu" else f"cuda:{d}",
                                                value=f.get_tensor(name))
        model = dispatch_model(model, device_map=device_map, main_device=index,
                               offload_dir=folder if on_disk else None)
        with torch.no_grad():
            model(prompt[:, :1])
        sync(device)
        hook = None
        if on_disk and state == "cold":
            # Every pass reads every "disk" weight from the disk, as tensorlift's cold
            # (O_DIRECT) streaming does; accelerate reads through the page cache.
            hook = model.register_forward_pre_hook(lambda module, args: evict(files))
        cached_before = set_state(files, state)
        read_before = disk_read_bytes()
        t0 = time.perf_counter()
        out = greedy(model, prompt, tokens)
        sync(device)
        seconds = time.perf_counter() - t0
        read = disk_read_bytes() - read_before
        if hook is not None:
            hook.remove()
    def placed_bytes(devices):
        return sum(p.numel() * p.element_size() for n, p in params.items() if where[n] in devices)

    offloaded_blocks = sum(1 for m, d in device_map.items() if d in ("cpu", "disk") and m.startswith("model.layers."))
    row = {
        "loader": "accelerate",
        "checkpoint": folder if on_disk else dense,
        "checkpoint_bytes": (sum(os.path.getsize(p) for p in files if p.endswith(".dat")) if on_disk
                             else file_bytes(dense)),
        "state": state,
        "weight_bytes": weight_bytes,
        "budget_bytes": budget,
        "device_bytes": weight_bytes - placed_bytes(("cpu", "disk")),
        "offloaded_to": "disk" if on_disk else "cpu",
        "offloaded_bytes": placed_bytes(("cpu", "disk")),
        "resident_layers": cfg.num_hidden_layers - offloaded_blocks,
        "streamed_layers": offloaded_blocks,
        "eviction": "posix_fadvise(DONTNEED) of the offload folder before every forward pass" if hook else None,
        "cached_bytes_before": cached_before,
        "cached_bytes_after": cached_bytes(files),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "disk_read_bytes": read,
        "read_gb_per_s": read / seconds / 1e9,
        "memory": mem.report(),
    }
    logits, sequences = torch.stack(out.logits).cpu(), out.sequences.cpu()
    del model, out
    return row, logits, sequences


def device_maps(cfg, budget, index):
    """accelerate's map under `budget` bytes of device memory and none of the host's: the first
    modules that fit (less the largest layer, which accelerate keeps free for the offloaded
    ones) on the device, the rest on "disk"; and the same map with "cpu" for "disk"."""
    disk = dict(infer_auto_device_map(meta_model(cfg), max_memory={index: budget, "cpu": 0},
                                      no_split_module_classes=["LlamaDecoderLayer"], dtype=torch.bfloat16))
    return disk, {m: "cpu" if d == "disk" else d for m, d in disk.items()}


def summarize_rows(runs):
    """Per row: tokens/s median (min, max) of its runs, and the figures of the median run."""
    rows = {}
    for name, rs in runs.items():
        if not rs:
            continue
        rates = sorted(r["tokens_per_s"] for r in rs)
        median_row = sorted(rs, key=lambda r: r["tokens_per_s"])[(len(rs) - 1) // 2]

        def peak(key):
            values = [r.get("memory", {}).get(key) for r in rs]
            return max((v for v in values if v is not None), default=None)

        within = [r.get("device_bytes_within_budget") for r in rs]
        rows[name] = {
            "tokens_per_s": statistics.median(rates), "tokens_per_s_min": rates[0], "tokens_per_s_max": rates[-1],
            "tokens_per_s_runs": [r["tokens_per_s"] for r in rs], "runs": len(rs),
            "peak_polled_bytes": peak("polled_peak_bytes"), "peak_torch_bytes": peak("torch_peak_bytes"),
            "tensorlift_device_bytes": peak("tensorlift_device_bytes"),
            "device_bytes_within_budget": all(within) if None not in within else None,
            "median_run": median_row,
        }
    for name, row in rows.items():
        state = runs[name][0]["state"]
        base = rows.get(f"acc-disk-{state}")
        row["vs_accelerate_disk"] = (row["tokens_per_s"] / base["tokens_per_s"]
                                     if base and name.startswith("tl-") else None)
        kind = "sparse" if "sparse" in name else "dense"
        row["target_vs_accelerate_disk"] = TARGETS[kind] if name.startswith("tl-") else None
        row["target_met"] = (row["vs_accelerate_disk"] >= row["target_vs_accelerate_disk"]
                             if row["vs_accelerate_disk"] is not None else None)
    return rows


def device_table(result):
    """The markdown table of a device run, as it stands."""
    gib = 1 << 30
    m = result["model"]
    lines = [f"Offload to {result['device']} ({result['gpu']}): Llama {m['layers']} x h{m['hidden']}, "
             f"{m['weight_bytes'] / gib:.2f} GiB bf16, budget {result['budget_bytes'] / gib:.2f} GiB "
             f"({result['budget_fraction']:g} of the weights), {result['tokens']} greedy tokens after "
             f"{result['prompt_tokens']}, tokens/s median (min–max) of {result['runs']} runs", "",
             "| row | state | tokens/s | vs acc disk (target) | resident | streamed | read GB/s | "
             "peak device GiB: polled | torch | tensorlift | tl ≤ budget | tokens = tl-dense |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def gb(x):
        return f"{x / gib:.2f}" if x is not None else "–"

    for name, r in result["rows"].items():
        mr = r["median_run"]
        vs = (f"{r['vs_accelerate_disk']:.2f}x ({r['target_vs_accelerate_disk']}x: "
              f"{'met' if r['target_met'] else 'NOT met'})" if r["vs_accelerate_disk"] is not None else "–")
        within = {True: "yes", False: "NO", None: "–"}[r["device_bytes_within_budget"]]
        same = result["tokens_identical"].get(name)
        rate = f"{r['tokens_per_s']:.2f}" + (f" ({r['tokens_per_s_min']:.2f}–{r['tokens_per_s_max']:.2f})"
                                             if r["runs"] > 1 else "")
        lines.append(f"| {name} | {mr['state']} | {rate} | {vs} | {mr['resident_layers']} | {mr['streamed_layers']} | "
                     f"{mr['read_gb_per_s']:.2f} | {gb(r['peak_polled_bytes'])} | {gb(r['peak_torch_bytes'])} | "
                     f"{gb(r['tensorlift_device_bytes'])} | {within} | "
                     f"{'–' if same is None else ('yes' if same else 'NO')} |")
    acc = result["accelerate"]
    if "skipped" in acc:
        lines += ["", f"accelerate: not run ({acc['skipped']})"]
    else:
        lines += ["", f"acc-*: accelerate {acc['version']}, infer_auto_device_map(max_memory={{device: budget, "
                      f"'cpu': 0}}): {acc['device_modules']} modules on the device, {acc['offloaded_modules']} "
                      "offloaded (acc-disk: to an offload folder of .dat files, read through the page cache, "
                      "evicted before every forward pass when cold; acc-cpu: the same modules in host memory); "
                      "executed on the device."]
    lines += ["", "read GB/s: tensorlift's bytes_read, or bytes this process read from the disk (/proc/self/io) "
                  "for accelerate, over the timed generation. Peak device memory from the idle baseline: polled "
                  "(total - free), torch's max_memory_allocated, tensorlift's device_bytes (rest + resident "
                  "blocks + ring)."]
    return "\n".join(lines) + "\n"


def device_main(args):
    """The rows on a device (module docstring, "On a device")."""
    torch.manual_seed(0)
    device = args.device
    index = cuda_index(device)
    if index is not None and not torch.cuda.is_available():
        sys.exit(f"offload_bench: --device {device}: torch {torch.__version__} sees no GPU")
    cfg = config(args.layers)
    dense, sparse = checkpoints(args.build, args.layers)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
    weight_bytes = sum(p.numel() * p.element_size() for p in empty_model(cfg).parameters())
    fraction = 0.5 if args.budget_fraction is None else args.budget_fraction
    budget = int(weight_bytes * fraction)
    if index is not None:
        torch.cuda.init()
        torch.empty(1, device=device)  # the CUDA context, before any baseline
        prompt = prompt.to(device)
    paths = {"dense": dense, "sparse": sparse}
    cells = [c for c in DEVICE_ROWS if c[1] == "tensorlift"]
    accelerate_info = {"skipped": ACCELERATE_MISSING} if accelerate is None else None
    if accelerate is not None and index is None:
        accelerate_info = {"skipped": "accelerate's rows need a CUDA device (torch cannot use the emulated one)"}
    if accelerate_info is None:
        disk_map, cpu_map = device_maps(cfg, budget, index)
        paths["folder"] = offload_folder(cfg, dense, disk_map)
        cells = DEVICE_ROWS
        accelerate_info = {"version": accelerate.__version__, "device_map": disk_map, "cpu_device_map": cpu_map,
                           "device_modules": sum(1 for d in disk_map.values() if d not in ("cpu", "disk")),
                           "offloaded_modules": sum(1 for d in disk_map.values() if d == "disk")}
    os.sync()  # Dirty pages of fresh checkpoints would make the first cold reads wait for their writeback.
    result = {
        "device": device, "gpu": torch.cuda.get_device_name(index) if index is not None else "emulated (CPU compute)",
        "model": {"hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size, "layers": cfg.num_hidden_layers,
                  "vocab": cfg.vocab_size, "dtype": "bf16", "weight_bytes": weight_bytes},
        "checkpoints": {k: {"path": p, "bytes": file_bytes(p) if k != "folder" else
                            sum(os.path.getsize(f) for f in folder_files(p))} for k, p in paths.items()},
        "prompt_tokens": PROMPT_TOKENS, "tokens": args.tokens, "runs": args.runs, "quick": args.quick,
        "budget_bytes": budget, "budget_fraction": fraction, "mode": "stream_model's default (auto on a device)",
        "targets_vs_accelerate_disk": TARGETS, "accelerate": accelerate_info,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
        "rows": {}, "runs_by_row": {name: [] for name, *_ in cells}, "tokens_identical": {},
        "tensorlift_tokens_identical": False, "logits_max_abs_diff": {}, "complete": False,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    md = os.path.splitext(args.out)[0] + ".md"

    def save():
        """The JSON and the table beside it (.md) as they stand; every row's greedy tokens against
        the first tl-dense-cold run's."""
        runs = result["runs_by_row"]
        result["rows"] = summarize_rows(runs)
        ref = runs.get("tl-dense-cold", [{}])[0].get("sequence") if runs.get("tl-dense-cold") else None
        result["tokens_identical"] = {name: all(x["sequence"] == ref for x in rs)
                                      for name, rs in runs.items() if rs and ref is not None}
        tl_same = [v for k, v in result["tokens_identical"].items() if k.startswith("tl-")]
        result["tensorlift_tokens_identical"] = bool(tl_same) and all(tl_same)
        for path, text in ((args.out, json.dumps(result, indent=1)), (md, device_table(result))):
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)

    reference = None  # tl-dense-cold's logits, for the differences reported
    failed = []
    for r in range(args.runs):
        for name, loader, which, state in cells[r % len(cells):] + cells[:r % len(cells)]:
            try:
                if loader == "tensorlift":
                    row, logits, sequences = run_streamed(cfg, paths[which], budget, args.tokens, prompt, device, state)
                else:
                    row, logits, sequences = run_dispatched(
                        cfg, dense, paths["folder"], disk_map if loader == "accelerate-disk" else cpu_map,
                        budget, args.tokens, prompt, device, state)
            except Exception as e:  # noqa: BLE001 - a row that fails says why; the others still run
                print(f"run {r} {name}: failed: {type(e).__name__}: {e}", file=sys.stderr)
                result.setdefault("errors", {}).setdefault(name, []).append(f"{type(e).__name__}: {e}")
                failed.append(name)
                save()
                continue
            if reference is None and name == "tl-dense-cold":
                reference = logits
            if reference is not None:
                diff = (logits.float() - reference.float()).abs().max().item()
                result["logits_max_abs_diff"][name] = max(diff, result["logits_max_abs_diff"].get(name, 0.0))
            row["sequence"] = sequences[0, PROMPT_TOKENS:].tolist()
            result["runs_by_row"][name].append(row)
            save()
            print(f"run {r} {name}: {row['tokens_per_s']:.3f} tokens/s", file=sys.stderr)
    result["complete"] = True
    save()
    print(device_table(result))
    print(f"greedy tokens identical across tensorlift's rows: {result['tensorlift_tokens_identical']}")
    problems = ([f"rows failed: {', '.join(sorted(set(failed)))}"] if failed else []) + (
        [] if result["tensorlift_tokens_identical"] else ["tensorlift's rows gave other tokens than tl-dense-cold"])
    if problems:
        print(f"offload_bench: {'; '.join(problems)}", file=sys.stderr)
        return 1
    return 0


def cpu_main(args):
    """The host's rows: tensorlift streaming into host memory against accelerate's disk offload."""
    torch.manual_seed(0)
    cfg = config(args.layers)
    dense, sparse = checkpoints(args.build, args.layers)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
    weight_bytes = sum(p.numel() * p.element_size() for p in empty_model(cfg).parameters())
    budget = weight_bytes // 4 if args.budget_fraction is None else int(weight_bytes * args.budget_fraction)

    cells = [("dense", dense, budget), ("sparse", sparse, budget), ("resident", dense, 4 * weight_bytes)]
    if accelerate is not None:
        device_map = device_map_for(cfg, budget)
        folder = offload_folder(cfg, dense, device_map)
        cells += [("acc-run", folder, budget), ("acc-pass", folder, budget)]
    # Dirty pages of freshly written checkpoints would make the first O_DIRECT
    # reads wait for their writeback.
    os.sync()
    runs = {name: [] for name, _, _ in cells}
    first = None
    identical = True
    accelerate_outputs = []
    for r in range(args.runs):
        for name, path, cell_budget in cells[r % len(cells):] + cells[:r % len(cells)]:
            if name.startswith("acc-"):
                row, logits, sequences = run_accelerate(cfg, dense, path, device_map, cell_budget, args.tokens,
                                                        prompt, evict_each_forward=name == "acc-pass")
                accelerate_outputs.append((logits, sequences))
            else:
                row, logits, sequences = run(cfg, path, cell_budget, args.tokens, prompt)
                if first is None:
                    first = (logits, sequences)
                identical = identical and torch.equal(logits, first[0]) and torch.equal(sequences, first[1])
            runs[name].append(row)
            print(f"run {r} {name}: {row['tokens_per_s']:.3f} tokens/s", file=sys.stderr)
    rows = {name: median_run(rs) for name, rs in runs.items()}
    if accelerate is None:
        accelerate_row = {"skipped": ACCELERATE_MISSING}
        print(f"accelerate disk offload: skipped: {accelerate_row['skipped']}", file=sys.stderr)
    else:
        diffs = [(lg.float() - first[0].float()).abs().max().item() for lg, _ in accelerate_outputs]
        accelerate_row = {
            "version": accelerate.__version__,
            "rows": ["acc-run", "acc-pass"],
            "device_map": device_map,
            "logits_identical_to_dense": all(torch.equal(lg, first[0]) for lg, _ in accelerate_outputs),
            "logits_max_abs_diff": max(diffs),
            "sequences_identical_to_dense": all(torch.equal(sq, first[1]) for _, sq in accelerate_outputs),
        }

    result = {
        "model": {"hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size, "layers": cfg.num_hidden_layers,
                  "vocab": cfg.vocab_size, "dtype": "bf16", "weight_bytes": weight_bytes},
        "prompt_tokens": PROMPT_TOKENS,
        "runs": args.runs,
        "budget_bytes": budget,
        "mode": "direct",
        "rows": rows,
        "accelerate": accelerate_row,
        "logits_identical": identical,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)

    gib = 1 << 30
    print(f"\nLlama {cfg.num_hidden_layers} x h{cfg.hidden_size}, {weight_bytes / gib:.2f} GiB bf16, "
          f"budget {budget / gib:.2f} GiB, O_DIRECT, {args.tokens} tokens after {PROMPT_TOKENS}, "
          f"the run of median tokens/s of {args.runs}")
    print(f"{'checkpoint':<10} {'file GiB':>8} {'resident':>8} {'streamed':>8} {'tokens/s':>9} "
          f"{'read GB/s':>9} {'hits':>5} {'misses':>6} {'waited s':>8}")
    for name, r in rows.items():
        s = r.get("stats")  # accelerate's rows have no streamer
        counters = (f"{s['prefetch_hits']:>5} {s['prefetch_misses']:>6} {s['wait_seconds']:>8.2f}" if s
                    else f"{'-':>5} {'-':>6} {'-':>8}")
        print(f"{name:<10} {r['checkpoint_bytes'] / gib:>8.2f} {r['resident_layers']:>8} {r['streamed_layers']:>8} "
              f"{r['tokens_per_s']:>9.3f} {r['read_gb_per_s']:>9.2f} {counters}")
    if accelerate is None:
        print(f"accelerate: skipped ({accelerate_row['skipped']})")
    else:
        a = accelerate_row
        cpu, disk = rows["acc-run"]["cpu_bytes"], rows["acc-run"]["disk_bytes"]
        print(f"acc-*: accelerate {a['version']} disk offload, max_memory cpu {budget / gib:.2f} GiB (the same budget): "
              f"device map {cpu / gib:.2f} GiB on cpu ({sum(1 for d in device_map.values() if d == 'cpu')} modules), "
              f"{disk / gib:.2f} GiB on disk ({sum(1 for d in device_map.values() if d == 'disk')} modules) as .dat "
              f"files; page cache evicted (posix_fadvise DONTNEED) before the timed generation (acc-run) or before "
              f"every forward pass (acc-pass); read = bytes read from the disk (/proc/self/io)")
        for name in a["rows"]:
            r = rows[name]
            print(f"  {name}: {r['cached_bytes_before'] / gib:.2f} GiB of the folder cached at the start, "
                  f"{r['cached_bytes_after'] / gib:.2f} GiB at the end")
        print(f"accelerate logits vs dense-streamed: identical {a['logits_identical_to_dense']}, "
              f"max abs diff {a['logits_max_abs_diff']:.3g}; greedy tokens identical {a['sequences_identical_to_dense']}")
    print(f"logits identical (tensorlift's three rows, all runs): {identical}")
    if not identical:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory with the tensorlift CLI")
    ap.add_argument("--device", default="cpu",
                    help="cpu (host memory, the default), cuda:N (a GPU), or emulated (tensorlift's emulated device, "
                         "compute on the CPU, the tensorlift rows only: a dry run of the GPU path)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a short run for a GPU lease: {QUICK['layers']} layers, {QUICK['tokens']} tokens, "
                         f"{QUICK['runs']} runs unless given")
    ap.add_argument("--tokens", type=int, default=None, help="tokens generated (default 8; --quick 2)")
    ap.add_argument("--layers", type=int, default=None, help="decoder blocks (default 22; --quick 12)")
    ap.add_argument("--runs", type=int, default=None, help="runs of each row (default 3; --quick 2)")
    ap.add_argument("--budget-fraction", type=float, default=None,
                    help="the memory budget as a fraction of the weights' bytes (default: 0.25 on cpu, "
                         "0.5 on a device)")
    ap.add_argument("--out", default=None,
                    help="JSON output (default bench/out/offload.json on cpu, bench/out/offload-<device>.json "
                         "otherwise, without the colon: offload-cuda0.json)")
    args = ap.parse_args()
    sizes = QUICK if args.quick else {"layers": 22, "tokens": 8, "runs": 3}
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        name = "offload.json" if args.device == "cpu" else f"offload-{args.device.replace(':', '')}.json"
        args.out = os.path.join(ROOT, "bench", "out", name)
    if args.device == "cpu":
        return cpu_main(args)
    if not (args.device == "emulated" or args.device.startswith("cuda:")):
        ap.error(f"--device {args.device!r}: cpu, cuda:N or emulated")
    return device_main(args)


if __name__ == "__main__":
    sys.exit(main())
