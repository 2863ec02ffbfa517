"""make demo: a ~1 GB Llama-shaped sharded checkpoint, inspected and verified with the
tensorlift CLI, then loaded from Python with tensorlift, safetensors and fastsafetensors,
each timed with the page cache cold (the files evicted before every run, mincore checking it)
and warm, and checked with XXH3 to have read the same bytes.

The checkpoint (TinyLlama-1.1B's shapes with 8 of its 22 layers, bf16, 3 shards and a
model.safetensors.index.json, written by the reference `safetensors` package) is made once
and cached in ~/.cache/tensorlift/demo/ (TENSORLIFT_DEMO_DIR overrides the directory).
"""
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import tensorlift

# The benches' page-cache helpers (fsync + posix_fadvise, mincore).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "load"))
from load_bench import evict as evict_files, resident_fraction  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(os.environ.get("TENSORLIFT_BUILD", os.path.join(ROOT, "build")), "tensorlift")
CACHE = os.environ.get("TENSORLIFT_DEMO_DIR",
                       os.path.join(os.path.expanduser("~"), ".cache", "tensorlift", "demo", "llama-8l-bf16-v1"))
RUNS = 5  # warm rounds (best of)
COLD_RUNS = 3  # cold rounds (median of): each reads the whole checkpoint from the disk
SHARD_BYTES = 400 * 1000 * 1000


def llama_shapes(layers=8, hidden=2048, inter=5632, heads=32, kv_heads=4, vocab=32000):
    """name -> shape, in model order (TinyLlama-1.1B's dimensions)."""
    kv = hidden // heads * kv_heads
    t = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": (hidden,),
                  p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                  p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                  p + "post_attention_layernorm.weight": (hidden,),
                  p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                  p + "mlp.down_proj.weight": (hidden, inter)})
    t.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    return t


def make_checkpoint(out):
    """Writes the bf16 shards (at most SHARD_BYTES each) and model.safetensors.index.json."""
    shapes = llama_shapes()
    shards, cur, size = [], [], 0
    for name, shape in shapes.items():
        n = 2 * int(torch.Size(shape).numel())
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += n
    shards.append(cur)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    g = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for k, names in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: torch.randn(shapes[n], generator=g, dtype=torch.bfloat16) for n in names}
        save_file(tensors, os.path.join(tmp, fname), metadata={"format": "pt"})
        for n in names:
            weight_map[n] = fname
            total += tensors[n].nbytes
        del tensors
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    os.rename(tmp, out)


def shard_files(directory):
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        return [os.path.join(directory, s) for s in sorted(set(json.load(f)["weight_map"].values()))]


def cli(*args, **kw):
    return subprocess.run([CLI, *args], check=True, capture_output=True, text=True, **kw)


# The loaders, each returning name -> torch tensor in host memory. --------------------------

def load_tensorlift(directory, files):
    return tensorlift.load(directory)


def load_tensorlift_copy(directory, files):
    return tensorlift.load(directory, copy=True)


def load_tensorlift_mmap(directory, files):
    return tensorlift.load(directory, mode="mmap")


def load_safetensors_load_file(directory, files, backend="mmap"):
    out = {}
    for f in files:
        out.update(load_file(f, backend=backend))
    return out


def load_safetensors_pread(directory, files):
    return load_safetensors_load_file(directory, files, backend="pread")


def load_safetensors_safe_open(directory, files):
    out = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def _fastsafetensors(module, files):
    loader = module.SafeTensorsFileLoader(module.SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: files})
    fb = loader.copy_files_to_device()
    out = {k: fb.get_tensor(k) for k in loader.get_keys()}
    fb.close()  # the tensors own their memory and stay valid
    loader.close()
    return out


def load_fastsafetensors(directory, files):
    import fastsafetensors
    return _fastsafetensors(fastsafetensors, files)


def load_tensorlift_fst_api(directory, files):
    import tensorlift.fastsafetensors
    return _fastsafetensors(tensorlift.fastsafetensors, files)


# (label, what the tensors are, loader): first each loader as its users call it (its
# defaults), then other settings of the same loaders.
COPY, MAPPED, VIEWS = "copy", "mmap (lazy)", "auto's pick"
DEFAULTS = [
    ("tensorlift.load", VIEWS, load_tensorlift),
    ("safetensors load_file", MAPPED, load_safetensors_load_file),
    ("safetensors safe_open+get_tensor", MAPPED, load_safetensors_safe_open),
    ("fastsafetensors (cpu, nogds)", COPY, load_fastsafetensors),
    ("tensorlift.fastsafetensors API", COPY, load_tensorlift_fst_api),
]
OTHER_SETTINGS = [
    ("tensorlift.load(copy=True)", COPY, load_tensorlift_copy),
    ("tensorlift.load(mode=mmap)", MAPPED, load_tensorlift_mmap),
    ("safetensors load_file(pread)", COPY, load_safetensors_pread),
]
LOADERS = DEFAULTS + OTHER_SETTINGS


def checksums(tensors):
    """name -> XXH3-64 of the tensor's bytes, read through a zero-copy memoryview."""
    out = {}
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise RuntimeError(f"{name} is not contiguous")
        out[name] = xxhash.xxh3_64_intdigest(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return out


def xor_all(sums):
    x = 0
    for v in sums.values():
        x ^= v
    return x


def evict(files, extra=()):
    """Drops the files (and `extra`) from the page cache as bench/load/load_bench.py does: fsync (a
    file just written may still be dirty, and dirty pages stay), then posix_fadvise(DONTNEED).
    Returns the largest fraction of one of `files` that mincore still finds cached: a filesystem
    that ignores the advice (tmpfs) keeps it all, and pages a process still maps stay too."""
    left = 1.0
    for _ in range(3):
        evict_files([*files, *extra])
        left = max(resident_fraction(p) for p in files)
        if left <= 0.01:
            break
    return left


def warm_page_cache(files):
    buf = bytearray(16 << 20)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def main():
    t0 = time.perf_counter()
    if not os.path.isdir(CACHE):
        print(f"creating the demo checkpoint in {CACHE} (once; about 1 GB) ...", flush=True)
        os.makedirs(os.path.dirname(CACHE), exist_ok=True)
        t = time.perf_counter()
        make_checkpoint(CACHE)
        print(f"  written in {time.perf_counter() - t:.1f} s")
    files = shard_files(CACHE)

    print(f"\n== tensorlift inspect {CACHE}")
    lines = cli("inspect", CACHE).stdout.splitlines()
    body = [l for l in lines[1:] if l.startswith(("model.", "lm_head"))]
    print("\n".join(lines[:4] + [f"  ... ({len(body)} tensors in {len(files)} shards)"]))

    js = json.loads(cli("inspect", "--json", CACHE).stdout)
    ours = {t["name"]: (t["dtype"], t["shape"]) for t in js["tensors"]}
    ref = {}
    for path in files:
        with safe_open(path, "pt") as f:
            for k in f.keys():
                s = f.get_slice(k)
                ref[k] = (s.get_dtype(), list(s.get_shape()))
    print(f"names, dtypes and shapes identical to the reference safetensors reader: {ours == ref}")
    total = js["total_bytes"]

    print("\n== tensorlift verify")
    r = subprocess.run([CLI, "verify", CACHE], capture_output=True, text=True)
    print(r.stdout.strip() or f"(exit {r.returncode})")
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "interrupted-download.safetensors")
        with open(files[0], "rb") as f, open(bad, "wb") as g:
            g.write(f.read(1 << 20))
        r = subprocess.run([CLI, "verify", bad], capture_output=True, text=True)
        print(f"the first MiB of a shard, as an interrupted download leaves it (exit {r.returncode}):\n"
              f"  {r.stdout.strip()}")

    warm_page_cache(files)
    # The CLI's checksums are the reference the Python loaders are held to.
    cli_sums = {}
    for line in cli("load", "--no-progress", "--checksum", CACHE).stdout.splitlines():
        name, digest = line.split("\t")
        cli_sums[name] = int(digest, 16)
    print(f"\n== tensorlift load {CACHE}   (CLI; page cache warm; the fastest of {RUNS} runs)")
    runs = [cli("load", "--no-progress", CACHE).stdout.rstrip() for _ in range(RUNS)]
    print(min(runs, key=lambda out: float(out.rsplit(" in ", 1)[1].split(" s")[0])))

    index = os.path.join(CACHE, "model.safetensors.index.json")
    left = evict(files, [index])
    out = cli("load", "--no-progress", CACHE).stdout.rstrip()
    if left <= 0.01:
        print(f"\n== tensorlift load {CACHE}   (CLI; page cache cold: the files evicted first; one run)")
        print(out)
    else:
        print(f"\n== tensorlift load, cold: NOT COLD: {left:.0%} of a shard stayed in the page cache after "
              f"posix_fadvise(DONTNEED) (this filesystem ignores it?); no cold figure")

    print(f"\n== loading from Python: {len(ref)} tensors, {total / 1e9:.2f} GB, into host memory")
    print("   Each run loads, then hashes every tensor's bytes with XXH3-64 through a zero-copy memoryview:")
    print("   that touches every byte (so lazy, mmap-backed loaders pay for their page faults, from the disk")
    print("   when cold) and proves what was read. Cold: before every run the shards are evicted from the")
    print("   page cache (posix_fadvise(DONTNEED)) and mincore checks that at most 1% stayed; median of")
    print(f"   {COLD_RUNS} rounds. Warm: every file read before timing; best of {RUNS} rounds. The machine has "
          f"{os.cpu_count()} cores.")
    # Round robin (each loader once per round, the order rotated each round), so that the
    # machine's state (other processes, memory just freed) is shared alike.
    runs_of = {}  # (label, state) -> [(t_load, t_total)] of the runs that count
    not_cold = {}  # label -> [fraction of a shard still cached] of the cold runs that were not cold
    sums_of, nbytes_of = {}, {}

    def timed(label, state, fn):
        gc.collect()
        t = time.perf_counter()
        tensors = fn(CACHE, files)
        t_load = time.perf_counter() - t
        sums = checksums(tensors)
        t_total = time.perf_counter() - t
        nbytes_of[label] = sum(x.nbytes for x in tensors.values())
        del tensors  # (a mapping still held would keep its pages in the cache)
        key = (label, state)
        if key not in sums_of:
            sums_of[key] = sums
        elif sums != sums_of[key]:
            sums_of[key] = {}  # two runs of one loader disagree: fails the check
        return t_load, t_total

    warm_page_cache(files + [index])  # (the cold CLI run above read around the page cache)
    for round_no in range(RUNS):
        k = round_no % len(LOADERS)
        for label, kind, fn in LOADERS[k:] + LOADERS[:k]:
            runs_of.setdefault((label, "warm"), []).append(timed(label, "warm", fn))
    for round_no in range(COLD_RUNS):
        k = round_no % len(DEFAULTS)
        for label, kind, fn in DEFAULTS[k:] + DEFAULTS[:k]:
            gc.collect()
            left = evict(files, [index])
            run = timed(label, "cold", fn)
            if left <= 0.01:
                runs_of.setdefault((label, "cold"), []).append(run)
            else:
                not_cold.setdefault(label, []).append(left)
    gc.collect()

    def figure(label, state):
        """(t_load, t_total): warm the best run by total time, cold the median by total time."""
        runs = sorted(runs_of.get((label, state), []), key=lambda r: r[1])
        if not runs:
            return None
        return runs[0] if state == "warm" else runs[(len(runs) - 1) // 2]

    header = (f"{'loader':<34}{'tensors':<13}{'load s':>8}{'total s':>9}{'GB/s':>7}{'vs tensorlift':>15}"
              f"{'XXH3 (XOR of all)':>19}{'same bytes':>11}")
    checks = []
    for title, group, state in (
            (f"each loader with its default settings, COLD (page cache evicted; median of {COLD_RUNS})",
             DEFAULTS, "cold"),
            (f"each loader with its default settings, WARM (best of {RUNS})", DEFAULTS, "warm"),
            (f"other settings, WARM (best of {RUNS})", OTHER_SETTINGS, "warm")):
        print(f"\n{title}:\n{header}")
        # Every loader against tensorlift.load with its defaults, in the same state.
        base = figure("tensorlift.load", state)
        for label, kind, _ in group:
            fig = figure(label, state)
            if fig is None:
                fracs = not_cold.get(label, [])
                print(f"{label:<34}{kind:<13}  NOT COLD: {max(fracs):.0%} of a shard still in the page cache "
                      f"after eviction in all {len(fracs)} runs (fadvise not honoured?); no figure")
                continue
            t_load, t_total = fig
            sums = sums_of[(label, state)]
            same = sums == cli_sums
            checks.append(same)
            if base is None:
                ratio = "-"
            else:
                r = t_total / base[1]
                ratio = "1.00x" if label == "tensorlift.load" else \
                    f"{r:.2f}x slower" if r >= 1 else f"{1 / r:.2f}x faster"
            dropped = ""
            if state == "cold" and label in not_cold:
                dropped = f"  ({len(not_cold[label])} run(s) not cold, left out)"
            print(f"{label:<34}{kind:<13}{t_load:>8.3f}{t_total:>9.3f}{nbytes_of[label] / t_total / 1e9:>7.2f}"
                  f"{ratio:>15}{xor_all(sums):>19x}{'yes' if same else 'NO':>11}{dropped}")
    print(f"{'tensorlift CLI load --checksum':<34}{'':<13}{'':>8}{'':>9}{'':>7}{'':>15}{xor_all(cli_sums):>19x}")
    print("total: load + XXH3 pass; GB/s and 'vs tensorlift' use it, the ratio against tensorlift.load with its")
    print("defaults in the same state. 'copy': tensors in private host memory; 'mmap (lazy)': private mappings")
    print("of the files, read on first touch (from the disk when cold); \"auto's pick\": tensorlift's default,")
    print("per file: O_DIRECT reads into its own memory for a cold file, views of the page cache for a cached")
    print("one (docs/loading.md; the CLI runs above show its pick per file).")
    print("'same bytes': every tensor's XXH3-64 equals the CLI's.")
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f} s")
    if ours != ref or not all(checks):
        sys.exit("the loaders disagree")


if __name__ == "__main__":
    main()
