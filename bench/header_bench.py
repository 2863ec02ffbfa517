"""Header parsing speed: tensorlift against the reference safetensors package.

    .venv/bin/python bench/header_bench.py [--build build] [--runs-small 20] [--runs-large 8] [--rounds 4]

Generates (once; cached under ~/.cache/tensorlift/bench/, keyed by the generator's
parameters) two files whose cost is all in the header:
  tensors100k  100,000 tensors named like a decoder model's (model.layers.N.mlp.up_proj.weight),
               BF16 matrices and F32 norms with tiny shapes, so the data section is small;
  header100mb  a header just under the 100,000,000-byte limit: ~667,000 BF16 tensors
               with long mixture-of-experts names and 4 bytes of data each.
Both are laid out as the reference writer lays them out (by dtype descending, then
name; offsets in that order) and are checked with the reference before use.

Each contender runs in its own processes: ROUNDS rounds, alternating the contenders and
which goes first, each process doing RUNS/ROUNDS timed runs after one untimed warm-up,
with the file in the page cache (read once beforehand):
  tensorlift  build/tl_header_bench FILE RUNS: Header::ReadFile (open, read the
              header, parse, validate), then the Header is freed;
  reference   this script --child FILE RUNS: `with safe_open(FILE, "np") as f: f.keys()`
              (open, mmap, parse, validate, list the names, close).
Speed is header bytes (8 + N, in MB = 10^6 bytes) over the median of all runs; the ratio is
tensorlift's speed over the reference's, from the same run. Peak RSS is each process's
VmHWM (including the interpreter or program itself; the baseline before the first
parse, after imports, is reported too). Results: a table on stdout and bench/out/header.json.
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "tensorlift", "bench")
GENERATOR_VERSION = 2
MAX_HEADER = 100_000_000


# ---------------------------------------------------------------------------------
# File generation: the JSON is built directly (no numpy arrays for ~1M tensors).

def _entry(name, dtype, shape, begin, end):
    return ('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}'
            % (json.dumps(name), dtype, ",".join(map(str, shape)), begin, end))


def _write(path, entries):
    """entries: (name, dtype, shape, nbytes) in file order. Writes atomically."""
    parts = []
    off = 0
    for name, dtype, shape, nbytes in entries:
        parts.append(_entry(name, dtype, shape, off, off + nbytes))
        off += nbytes
    header = ("{" + ",".join(parts) + "}").encode()
    header += b" " * ((8 - len(header) % 8) % 8)
    assert len(header) <= MAX_HEADER, len(header)
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        f.write(bytes(off))
    os.replace(tmp, path)


def _reference_order(entries):
    # The reference writer: dtype descending in its enum order, then name.
    rank = {"BF16": 14, "F32": 17}
    return sorted(entries, key=lambda e: (-rank[e[1]], e[0]))


def gen_tensors100k(num_tensors):
    per_layer = [("input_layernorm.weight", "F32", [4]),
                 ("post_attention_layernorm.weight", "F32", [4])]
    per_layer += [("self_attn.%s_proj.weight" % p, "BF16", [2, 4]) for p in "qkvo"]
    per_layer += [("mlp.%s_proj.weight" % p, "BF16", [4, 2]) for p in ("gate", "up", "down")]
    entries = [("model.embed_tokens.weight", "BF16", [8, 2]), ("model.norm.weight", "F32", [4])]
    layer = 0
    while len(entries) < num_tensors:
        for suffix, dtype, shape in per_layer:
            if len(entries) == num_tensors:
                break
            entries.append(("model.layers.%d.%s" % (layer, suffix), dtype, shape))
        layer += 1
    bits = {"BF16": 16, "F32": 32}
    return [(n, d, s, bits[d] // 8 * s[0] * (s[1] if len(s) > 1 else 1)) for n, d, s in entries]


def gen_header100mb(target_bytes):
    # Mixture-of-experts names, made long the way multimodal checkpoints make them.
    prefix = "model.language_model.decoder.layers.%d.block_sparse_moe.experts.%d.%s.weight"
    projs = ("gate_proj", "up_proj", "down_proj")
    entries = []
    size = 1  # "{" and "}", less the first entry's comma.
    layer = 0
    # Every tensor has 4 bytes, so the offsets' digits do not depend on the order
    # the entries end up in; the padding adds at most 7 bytes to target_bytes.
    while True:
        for expert in range(256):
            for p in projs:
                name = prefix % (layer, expert, p)
                off = 4 * len(entries)
                n = len(_entry(name, "BF16", [1, 2], off, off + 4)) + 1
                if size + n > target_bytes:
                    return entries
                size += n
                entries.append((name, "BF16", [1, 2], 4))
        layer += 1


FILES = {
    "tensors100k": (gen_tensors100k, {"num_tensors": 100_000}),
    "header100mb": (gen_header100mb, {"target_bytes": MAX_HEADER - 64}),
}


def ensure_file(kind, log):
    gen, params = FILES[kind]
    key = hashlib.sha256(json.dumps([GENERATOR_VERSION, kind, params], sort_keys=True).encode())
    path = os.path.join(CACHE, "%s-%s.safetensors" % (kind, key.hexdigest()[:12]))
    if os.path.exists(path):
        return path
    os.makedirs(CACHE, exist_ok=True)
    t0 = time.perf_counter()
    entries = _reference_order(gen(**params))
    tmp = path + ".unchecked"
    _write(tmp, entries)
    # Check the file with the reference before it is cached.
    from safetensors import safe_open
    with safe_open(tmp, "np") as f:
        n = len(f.keys())
    assert n == len(entries), (n, len(entries))
    os.replace(tmp, path)
    log("generated %s (%d tensors, %.1f MB) in %.1f s"
        % (path, n, os.path.getsize(path) / 1e6, time.perf_counter() - t0))
    return path


# ---------------------------------------------------------------------------------
# The reference contender (runs in a child process).

def peak_rss_kb():
    """VmHWM: the peak resident set of this address space, in KiB. (ru_maxrss is
    carried over exec from the forked parent, so it would report at least the size
    of the process that started this one.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def child(path, runs):
    from safetensors import safe_open  # Imported before the baseline is taken.
    baseline = peak_rss_kb()
    with open(path, "rb") as f:
        header_bytes = struct.unpack("<Q", f.read(8))[0]
    times = []
    tensors = 0
    for i in range(runs + 1):  # The first run is an untimed warm-up.
        t0 = time.perf_counter()
        with safe_open(path, "np") as f:
            keys = f.keys()
        t1 = time.perf_counter()
        tensors = len(keys)
        del keys
        if i:
            times.append(t1 - t0)
    print(json.dumps({"median_s": statistics.median(times), "min_s": min(times), "runs": runs,
                      "tensors": tensors, "header_bytes": header_bytes,
                      "baseline_rss_kb": baseline, "max_rss_kb": peak_rss_kb(),
                      "times_s": times}))


# ---------------------------------------------------------------------------------

def merge(rounds):
    """One contender's rounds, merged: median and min over all runs, peak RSS over all."""
    times = [t for r in rounds for t in r["times_s"]]
    first = rounds[0]
    return {"median_s": statistics.median(times), "min_s": min(times), "runs": len(times),
            "processes": len(rounds), "tensors": first["tensors"],
            "header_bytes": first["header_bytes"],
            "baseline_rss_kb": max(r["baseline_rss_kb"] for r in rounds),
            "max_rss_kb": max(r["max_rss_kb"] for r in rounds), "times_s": times}


def run_json(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("header_bench: %s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stderr))
    return json.loads(p.stdout)


def warm(path):
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def machine():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu, "ram_gib": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version()}


def build_info(build):
    info = {}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                for k in ("CMAKE_BUILD_TYPE", "CMAKE_CXX_COMPILER"):
                    if line.startswith(k + ":"):
                        info[k] = line.split("=", 1)[1].strip()
    except OSError:
        pass
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs-small", type=int, default=20, help="timed runs for tensors100k")
    ap.add_argument("--runs-large", type=int, default=8, help="timed runs for header100mb")
    ap.add_argument("--rounds", type=int, default=4,
                    help="processes per contender and file; the runs are split among them")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "header.json"))
    ap.add_argument("--child", nargs=2, metavar=("FILE", "RUNS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return

    def log(msg):
        print("header_bench: " + msg, file=sys.stderr, flush=True)

    import safetensors
    exe = os.path.join(args.build, "tl_header_bench")
    if not os.access(exe, os.X_OK):
        sys.exit("header_bench: %s not found; build it with "
                 "`cmake --build %s --target tl_header_bench`" % (exe, args.build))
    load_before = os.getloadavg()[0]
    results = []
    contenders = {
        "tensorlift": lambda path, n: [exe, path, str(n)],
        "reference": lambda path, n: [sys.executable, os.path.abspath(__file__), "--child", path,
                                      str(n)],
    }
    for kind, runs in (("tensors100k", args.runs_small), ("header100mb", args.runs_large)):
        path = ensure_file(kind, log)
        warm(path)
        # Rounds alternate the contenders (and who goes first), so load from other
        # processes on the machine falls on both alike.
        per_round = -(-runs // args.rounds)
        got = {name: [] for name in contenders}
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(list(contenders)))
            for name in order:
                got[name].append(run_json(contenders[name](path, per_round)))
        log("%s: %d rounds of %d runs per contender" % (kind, args.rounds, per_round))
        tl, ref = (merge(got[name]) for name in contenders)
        runs = tl["runs"]
        if tl["tensors"] != ref["tensors"] or tl["header_bytes"] != ref["header_bytes"]:
            sys.exit("header_bench: the contenders disagree on %s: %r vs %r" % (path, tl, ref))
        mb = (8 + tl["header_bytes"]) / 1e6
        tl_speed = mb / tl["median_s"]
        ref_speed = mb / ref["median_s"]
        results.append({"file": kind, "path": path, "header_mb": mb, "tensors": tl["tensors"],
                        "runs": runs, "tensorlift": dict(tl, mb_per_s=tl_speed),
                        "reference": dict(ref, mb_per_s=ref_speed),
                        "ratio": tl_speed / ref_speed})

    hdr = ("| file | header MB | tensors | tensorlift median s | tensorlift MB/s | "
           "reference median s | reference MB/s | ratio | peak RSS tensorlift MiB | "
           "peak RSS reference MiB |")
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in results:
        tl, ref = r["tensorlift"], r["reference"]
        print("| %s | %.2f | %d | %.4f | %.0f | %.4f | %.0f | %.2fx | %.0f (base %.0f) | %.0f (base %.0f) |"
              % (r["file"], r["header_mb"], r["tensors"], tl["median_s"], tl["mb_per_s"],
                 ref["median_s"], ref["mb_per_s"], r["ratio"], tl["max_rss_kb"] / 1024,
                 tl["baseline_rss_kb"] / 1024, ref["max_rss_kb"] / 1024,
                 ref["baseline_rss_kb"] / 1024))
    report = {
        "benchmark": "header",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable, ROOT)] +
                            [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "machine": machine(),
        "build": build_info(args.build),
        "reference": {"package": "safetensors", "version": safetensors.__version__},
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "page_cache": "warm (each file read once before the runs; one untimed warm-up run per process)",
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    log("wrote %s (1-minute load average %.2f before, %.2f after)"
        % (os.path.relpath(args.out, ROOT), load_before, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
