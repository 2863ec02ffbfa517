"""Sparse load benchmark (issue #7): a 50%-pruned checkpoint, cold, stored sparse
against the same tensors stored dense.

    .venv/bin/python bench/sparse/load_bench.py --build build [--runs 3] [--gb 4]

Takes bench/load's cached dense checkpoint of --gb GB (generated if needed), prunes
it with `tensorlift sparsify --prune magnitude:0.5` (cached next to it), writes the
pruned tensors dense (tl_sparse_densify), and then, for each run, evicts every file
(posix_fadvise DONTNEED) and times, in a rotating order:
  - tensorlift, sparse: tl_load_bench on the sparse checkpoint (reads the stored
    parts, decodes while reading);
  - tensorlift, dense: tl_load_bench on the dense copy;
  - safetensors load_file on the dense copy (bench/load/contender.py).
Every contender ends with one XXH3 pass over every tensor's bytes, and the
contenders' XORs of those must agree (the same tensors). Prints a table (medians,
spreads, GB/s of dense output, peak RSS) and writes bench/out/sparse-load.json.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
import gen_checkpoint  # noqa: E402
from load_bench import evict  # noqa: E402


def run_with_rss(cmd):
    """Runs cmd; its JSON result plus peak_rss_bytes of the child (wait4)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{cmd} exited with {code}: {err.decode()[-2000:]}")
    res = json.loads([ln for ln in out.decode().splitlines() if ln.startswith("{")][-1])
    res["process_wall_s"] = time.perf_counter() - t0
    res["peak_rss_bytes"] = ru.ru_maxrss * 1024
    return res


def files_of(d):
    return sorted(glob.glob(os.path.join(d, "*.safetensors")))


def dir_bytes(d):
    return sum(os.path.getsize(f) for f in files_of(d))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=3.0)
    args = ap.parse_args()

    dense_src = gen_checkpoint.checkpoint_dir(args.gb, 4)
    sparse_dir = dense_src.rstrip("/") + "-pruned50-sparse"
    dense_dir = dense_src.rstrip("/") + "-pruned50-dense"
    if not os.path.exists(os.path.join(sparse_dir, ".complete")):
        subprocess.run(["rm", "-rf", sparse_dir, dense_dir], check=True)
        subprocess.run([os.path.join(args.build, "tensorlift"), "sparsify", dense_src, sparse_dir,
                        "--prune", "magnitude:0.5", "--max-shard-size", "1GB"], check=True)
        open(os.path.join(sparse_dir, ".complete"), "w").close()
    if not os.path.exists(os.path.join(dense_dir, ".complete")):
        subprocess.run(["rm", "-rf", dense_dir], check=True)
        subprocess.run([os.path.join(args.build, "tl_sparse_densify"), sparse_dir, dense_dir], check=True)
        open(os.path.join(dense_dir, ".complete"), "w").close()

    contenders = {
        "tensorlift, sparse": [os.path.join(args.build, "tl_load_bench"), sparse_dir],
        "tensorlift, dense": [os.path.join(args.build, "tl_load_bench"), dense_dir],
        "safetensors load_file, dense": [sys.executable, os.path.join(ROOT, "bench", "load", "contender.py"),
                                         "st_load_file", *files_of(dense_dir)],
    }
    everything = files_of(sparse_dir) + files_of(dense_dir)
    results = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.runs):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            evict(everything)
            time.sleep(args.settle)
            evict(everything)
            res = run_with_rss(contenders[name])
            results[name].append(res)
            print(f"run {r + 1} {name}: {res['total_s']:.3f} s", file=sys.stderr)

    xors = {name: {res["xor"] for res in rs} for name, rs in results.items()}
    dense_bytes = results["tensorlift, dense"][0]["bytes"]
    summary = {
        "checkpoint": {"source": dense_src, "sparse_dir": sparse_dir, "dense_dir": dense_dir,
                       "sparse_file_bytes": dir_bytes(sparse_dir), "dense_file_bytes": dir_bytes(dense_dir),
                       "dense_tensor_bytes": dense_bytes},
        "runs": args.runs,
        "same_tensors": len(set().union(*xors.values())) == 1,
        "contenders": {},
    }
    print(f"sparse load bench: {dense_src}, pruned 50%: sparse files {dir_bytes(sparse_dir) / 1e9:.2f} GB, "
          f"dense files {dir_bytes(dense_dir) / 1e9:.2f} GB ({dir_bytes(sparse_dir) / dir_bytes(dense_dir):.1%}); "
          f"{args.runs} cold runs; same tensors in every run: {summary['same_tensors']}")
    print("| contender | median s | spread s | GB/s (dense out) | peak RSS / dense bytes |")
    print("|---|---|---|---|---|")
    medians = {}
    for name, rs in results.items():
        ts = [res["total_s"] for res in rs]
        med = statistics.median(ts)
        medians[name] = med
        rss = max(res["peak_rss_bytes"] for res in rs)
        summary["contenders"][name] = {"total_s": ts, "median_s": med, "peak_rss_bytes": rss,
                                       "runs": rs}
        print(f"| {name} | {med:.3f} | {min(ts):.3f}-{max(ts):.3f} | {dense_bytes / med / 1e9:.2f} | "
              f"{rss / dense_bytes:.3f}x |")
    s = medians["tensorlift, sparse"]
    print(f"sparse vs dense (tensorlift): {medians['tensorlift, dense'] / s:.2f}x as fast (target 1.6x); "
          f"vs safetensors on the dense files: {medians['safetensors load_file, dense'] / s:.2f}x")
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "sparse-load.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
