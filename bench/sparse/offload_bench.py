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
"""

import argparse
import ctypes
import json
import mmap
import os
import platform
import subprocess
import sys
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
from load_bench import evict  # noqa: E402  (posix_fadvise DONTNEED of each file)
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
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    seconds = time.perf_counter() - t0
    stats = {k: v - before[k] for k, v in handle.stats().items()}
    row = {
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
    handle.remove()
    return row, torch.stack(out.logits), out.sequences


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
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory with the tensorlift CLI")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "offload.json"))
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = config(args.layers)
    dense, sparse = checkpoints(args.build, args.layers)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
    weight_bytes = sum(p.numel() * p.element_size() for p in empty_model(cfg).parameters())
    budget = weight_bytes // 4

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


if __name__ == "__main__":
    main()
