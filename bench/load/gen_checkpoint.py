"""Generates Llama-shaped bf16 checkpoints for the load benchmark, cached.

    python bench/load/gen_checkpoint.py --gb 4 --shards 4     # prints the directory
    python bench/load/gen_checkpoint.py --self-check          # writer vs the reference

A checkpoint is a directory with model-0000i-of-0000N.safetensors shards and
model.safetensors.index.json, as Hugging Face writes them: tensors in model order
(embed_tokens, then per layer the norms, q/k/v/o and gate/up/down, then the final
norm and lm_head) split greedily into N shards of about equal size; inside a file
the layout is the reference writer's (tensors sorted by dtype, descending, then
name; compact JSON with __metadata__ first; the header padded with spaces to a
multiple of 8). Tensor bytes are random (SFC64), so nothing compresses or dedups.

The shape is a real Llama configuration: the largest of LLAMA_SHAPES that gives at
least 4 layers, with the number of layers rounded up so that the checkpoint has at
least the requested size (4 GB -> Llama-2-7B's shape with 9 layers, 4.17 GB).

Checkpoints are cached under ~/.cache/tensorlift/bench/ (TL_BENCH_CACHE overrides),
one directory per parameter set; a directory is complete once it holds .complete
(written last, after an fsync of every file), so an interrupted run is redone.
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys

import numpy as np

FORMAT_VERSION = 1  # Bump when the layout or the data changes: it keys the cache.

# name: (hidden, intermediate, vocab, attention heads, key/value heads)
LLAMA_SHAPES = [
    ("llama2-7b", 4096, 11008, 32000, 32, 32),
    ("tinyllama-1.1b", 2048, 5632, 32000, 32, 4),
    ("llama-0.3b", 1024, 2816, 32000, 16, 8),
    ("llama-tiny", 256, 688, 32000, 8, 4),
]


def llama_tensors(hidden, inter, vocab, heads, kv_heads, layers):
    """[(name, shape)] in model order (the order of a PyTorch state dict)."""
    kv = hidden // heads * kv_heads
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def nbytes(shape):
    n = 2  # bf16
    for d in shape:
        n *= d
    return n


def choose_shape(target_bytes, min_layers=4):
    """(shape name, [(name, shape)]) with at least target_bytes of tensors."""
    for name, h, i, v, heads, kv in LLAMA_SHAPES:
        fixed = sum(nbytes(s) for _, s in llama_tensors(h, i, v, heads, kv, 0))
        per_layer = sum(nbytes(s) for _, s in llama_tensors(h, i, v, heads, kv, 1)) - fixed
        layers = max(1, -(-(target_bytes - fixed) // per_layer))  # ceil
        if layers >= min_layers or name == LLAMA_SHAPES[-1][0]:
            return name, llama_tensors(h, i, v, heads, kv, layers)
    raise AssertionError("unreachable")


def split_shards(tensors, shards):
    """Greedy split in model order into `shards` groups of about equal bytes."""
    total = sum(nbytes(s) for _, s in tensors)
    target = total / shards
    groups = [[] for _ in range(shards)]
    cum = 0
    for name, shape in tensors:
        g = min(shards - 1, int(cum / target)) if target > 0 else 0
        groups[g].append((name, shape))
        cum += nbytes(shape)
    return [g for g in groups if g]


def header_bytes(entries, metadata):
    """The reference writer's header for [(name, dtype, shape, nbytes)]:
    sorted by dtype (descending; all bf16 here) then name, offsets in that order,
    compact JSON, __metadata__ first, padded with spaces to a multiple of 8."""
    ordered = sorted(entries, key=lambda e: e[0])
    doc = {}
    if metadata:
        doc["__metadata__"] = metadata
    off = 0
    layout = []
    for name, dtype, shape, n in ordered:
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        layout.append((name, n))
        off += n
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, layout


def write_random(f, n, gen, chunk=64 << 20):
    while n > 0:
        k = min(n, chunk)
        words = gen.random_raw((k + 7) // 8)
        f.write(memoryview(words).cast("B")[:k])
        n -= k


def write_checkpoint(directory, tensors, shards, seed):
    """Writes the shards and the index into `directory` (which must not exist)."""
    os.makedirs(directory)
    groups = split_shards(tensors, shards)
    gen = np.random.SFC64(seed)
    weight_map = {}
    total = 0
    paths = []
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        entries = [(name, "BF16", shape, nbytes(shape)) for name, shape in group]
        head, layout = header_bytes(entries, {"format": "pt"})
        path = os.path.join(directory, fname)
        with open(path, "wb") as f:
            f.write(head)
            for name, n in layout:
                write_random(f, n, gen)
                weight_map[name] = fname
                total += n
            f.flush()
            os.fsync(f.fileno())
        paths.append(path)
    index = {"metadata": {"total_size": total},
             "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return paths


def cache_root():
    return os.environ.get("TL_BENCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tensorlift", "bench")


def checkpoint_dir(gb, shards, seed=0):
    """The cached checkpoint's directory for these parameters (generated if needed)."""
    target = int(round(gb * 1e9))
    shape_name, tensors = choose_shape(target)
    layers = sum(1 for n, _ in tensors if n.endswith(".input_layernorm.weight"))
    key = hashlib.sha256(json.dumps([FORMAT_VERSION, target, shards, seed, shape_name, layers]).encode())
    name = f"llama-{gb:g}gb-{shards}shards-{shape_name}-{layers}l-{key.hexdigest()[:10]}"
    directory = os.path.join(cache_root(), name)
    if os.path.exists(os.path.join(directory, ".complete")):
        return directory
    if os.path.exists(directory):
        shutil.rmtree(directory)
    tmp = directory + f".tmp-{os.getpid()}"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(cache_root(), exist_ok=True)
    total = sum(nbytes(s) for _, s in tensors)
    print(f"gen: writing {total / 1e9:.2f} GB ({shape_name}, {layers} layers, {shards} shards) to {directory}",
          file=sys.stderr, flush=True)
    write_checkpoint(tmp, tensors, shards, seed)
    os.rename(tmp, directory)
    with open(os.path.join(directory, ".complete"), "w") as f:
        json.dump({"gb": gb, "shards": shards, "seed": seed, "shape": shape_name, "layers": layers,
                   "bytes": total, "format_version": FORMAT_VERSION}, f)
    return directory


def shard_paths(directory):
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    return [os.path.join(directory, n) for n in sorted(set(index["weight_map"].values()))]


def self_check():
    """Writes a tiny checkpoint and compares every shard, byte for byte, with what
    the reference writer (safetensors.torch.save_file) makes of the same tensors."""
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file

    _, tensors = choose_shape(20_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_checkpoint(os.path.join(tmp, "ckpt"), tensors, 3, seed=7)
        for path in paths:
            loaded = load_file(path)
            again = os.path.join(tmp, "again.safetensors")
            save_file(loaded, again, metadata={"format": "pt"})
            with open(path, "rb") as a, open(again, "rb") as b:
                if a.read() != b.read():
                    print(f"self-check: {path} differs from the reference writer's output", file=sys.stderr)
                    return 1
            assert all(t.dtype == torch.bfloat16 for t in loaded.values())
    print(f"self-check: {len(paths)} shards identical to safetensors.torch.save_file's output")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=4.0, help="checkpoint size in GB (1e9 bytes), at least")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--self-check", action="store_true")
    args = ap.parse_args()
    if args.self_check:
        return self_check()
    print(checkpoint_dir(args.gb, args.shards, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
