"""make demo: build a small Llama-shaped sharded checkpoint with the reference
`safetensors` package, then inspect and verify it with tensorlift and compare
what both read. Also shows a corrupted copy being rejected.

Until the loader lands (issue #3) this compares headers; later the demo loads.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(os.environ.get("TENSORLIFT_BUILD", os.path.join(ROOT, "build")), "tensorlift")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "tensorlift", "demo", "tiny-llama-v1")


def make_checkpoint(out: str, layers: int = 4, hidden: int = 256, inter: int = 688, vocab: int = 4096):
    """Writes a 2-shard float16 checkpoint with model.safetensors.index.json."""
    rng = np.random.default_rng(0)
    t = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
         "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (hidden, hidden),
                  p + "self_attn.v_proj.weight": (hidden, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                  p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                  p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
                  p + "post_attention_layernorm.weight": (hidden,)})
    names = sorted(t)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: rng.standard_normal(t[n], dtype=np.float32).astype(np.float16) for n in shard}
        save_file(tensors, os.path.join(tmp, fname), metadata={"format": "pt"})
        for n in shard:
            weight_map[n] = fname
            total += tensors[n].nbytes
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    os.rename(tmp, out)


def reference_listing(directory: str):
    """name -> (dtype, shape) as the reference package reads it."""
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fname in files:
        with safe_open(os.path.join(directory, fname), "np") as f:
            for k in f.keys():
                s = f.get_slice(k)
                out[k] = (s.get_dtype(), list(s.get_shape()))
    return out


def main():
    if not os.path.isdir(CACHE):
        print(f"creating a demo checkpoint in {CACHE}")
        os.makedirs(os.path.dirname(CACHE), exist_ok=True)
        make_checkpoint(CACHE)
    print(f"== tensorlift inspect {CACHE}")
    table = subprocess.run([CLI, "inspect", CACHE], check=True, capture_output=True, text=True).stdout
    lines = table.splitlines()
    body = [l for l in lines[1:] if l.startswith(("model.", "lm_head"))]
    print("\n".join(lines[:6] + [f"  ... ({len(body)} tensors)"] + lines[1 + len(body):]))

    js = json.loads(subprocess.run([CLI, "inspect", "--json", CACHE], check=True,
                                   capture_output=True, text=True).stdout)
    ours = {t["name"]: (t["dtype"], t["shape"]) for t in js["tensors"]}
    ref = reference_listing(CACHE)
    same = ours == ref
    ref_bytes = sum(int(np.prod(s, dtype=np.int64)) * 2 for _, s in ref.values())
    print("\n== comparison with the reference safetensors package (headers; loading comes with issue #3)")
    print(f"{'reader':<28}{'tensors':>8}{'bytes':>14}")
    print(f"{'tensorlift inspect --json':<28}{len(ours):>8}{js['total_bytes']:>14}")
    print(f"{'safetensors safe_open':<28}{len(ref):>8}{ref_bytes:>14}")
    print(f"names, dtypes and shapes identical: {same}")

    print(f"\n== tensorlift verify")
    subprocess.run([CLI, "verify", CACHE], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "truncated.safetensors")
        src = os.path.join(CACHE, "model-00001-of-00002.safetensors")
        with open(src, "rb") as f:
            data = f.read()
        with open(bad, "wb") as f:
            f.write(data[:-3])
        r = subprocess.run([CLI, "verify", bad], capture_output=True, text=True)
        print(f"a copy with its last 3 bytes cut (exit {r.returncode}):\n  {r.stdout.strip()}")
    if not same:
        sys.exit("tensorlift and the reference disagree")


if __name__ == "__main__":
    main()
