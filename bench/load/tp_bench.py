"""A tensor-parallel rank's load of its slices, against the ways a rank gets them otherwise, on
the load benchmark's Llama-shaped checkpoint (bench/load/gen_checkpoint.py).

    .venv/bin/python bench/load/tp_bench.py [--gb 2] [--runs 3] [--sizes 2,4] [--states cold,warm]

Contenders, each in a fresh process (peak RSS is the child's), timed from the first loader call
to every tensor of the rank in hand (contiguous, every page touched: a lazily mapped tensor is
read then), with their default settings:

- `tl rank`: tensorlift.load(dir, tp_size=N, tp_rank=r, layout=LLAMA): the planner plans the
  slices, only their bytes are read;
- `tl whole + cut`: tensorlift.load(dir), then each split tensor narrowed and copied (what a
  seed serving a rank, and a rank without slicing, did before slices were planned);
- `st get_slice`: safetensors.safe_open(..., "pt") and get_slice(name)[rows] for the split
  tensors, get_tensor for the others (the reference's way to read part of a tensor);
- `tl whole`: tensorlift.load(dir), every tensor whole (the bytes of all ranks).

The rank is the last one (its slices are the smallest when a dim does not divide). Cold: the files
are evicted from the page cache before each run (posix_fadvise DONTNEED, checked with mincore by
mincore); warm: they are all cached. Medians of --runs, contenders shuffled per round.
Output: a markdown table on stdout and in bench/out/tp.md, everything in bench/out/tp.json.
"""

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import load_bench  # noqa: E402  (evict, read_through, resident_fraction: the load bench's checks)

LLAMA = r"(q|k|v|gate|up)_proj\.weight$=0;(o|down)_proj\.weight$=1;embed_tokens=0;lm_head=0"

CHILD = r"""
import json, os, re, sys, time
import torch
how, path, size, rank, layout = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rules = [(re.compile(r.rsplit("=", 1)[0]), int(r.rsplit("=", 1)[1])) for r in layout.split(";")]
def dim_of(name, t):
    for rx, d in rules:
        if rx.search(name):
            return d if d < len(t) else -1
    return -1
def part(extent):
    block = -(-extent // size)
    lo = min(extent, block * rank)
    return lo, min(extent, lo + block)
t0 = time.perf_counter()
out = {}
if how == "tl rank":
    import tensorlift
    out = tensorlift.load(path, tp_size=size, tp_rank=rank, layout=layout)
elif how in ("tl whole", "tl whole + cut"):
    import tensorlift
    whole = tensorlift.load(path)
    if how == "tl whole":
        out = whole
    else:
        for n, t in whole.items():
            d = dim_of(n, t.shape)
            if d < 0:
                out[n] = t
            else:
                lo, hi = part(t.shape[d])
                out[n] = t.narrow(d, lo, hi - lo).contiguous()
        del whole
else:
    from safetensors import safe_open
    for f in sorted(os.listdir(path)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(path, f), "pt") as st:
            for n in st.keys():
                s = st.get_slice(n)
                shape = s.get_shape()
                d = dim_of(n, shape)
                if d < 0:
                    out[n] = st.get_tensor(n)
                else:
                    lo, hi = part(shape[d])
                    idx = tuple([slice(None)] * d + [slice(lo, hi)])
                    out[n] = s[idx]
# In hand: contiguous (a view across rows is copied, as a model's parameter would be), and every
# page touched (a lazily mapped tensor is read now).
for n, t in out.items():
    c = t if t.is_contiguous() else t.contiguous()
    if c.numel():
        c.reshape(-1).view(torch.uint8)[::4096].sum()
seconds = time.perf_counter() - t0
import resource
print(json.dumps({"seconds": seconds, "bytes": sum(t.numel() * t.element_size() for t in out.values()),
                  "tensors": len(out), "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""

CONTENDERS = ("tl rank", "tl whole + cut", "st get_slice", "tl whole")


def run_one(how, path, size, rank):
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, how, path, str(size), str(rank), LLAMA],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{how}: {err.decode()[-2000:]}")
    got = json.loads(out.decode().strip().splitlines()[-1])
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="2,4")
    ap.add_argument("--states", default="cold,warm")
    args = ap.parse_args()
    path = subprocess.run([sys.executable, os.path.join(HERE, "gen_checkpoint.py"), "--gb", str(args.gb),
                           "--shards", "4"], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
    total = sum(os.path.getsize(f) for f in files)
    results = []
    for state in args.states.split(","):
        for size in [int(s) for s in args.sizes.split(",")]:
            rank = size - 1
            runs = {c: [] for c in CONTENDERS}
            for _ in range(args.runs):
                order = list(CONTENDERS)
                random.shuffle(order)
                for how in order:
                    (load_bench.evict if state == "cold" else load_bench.read_through)(files)
                    resident = min(load_bench.resident_fraction(f) for f in files)
                    if (state == "cold" and resident > 0.05) or (state == "warm" and resident < 0.95):
                        raise RuntimeError(f"{state} run, but {resident:.0%} of a file is in the page cache")
                    t0 = time.perf_counter()
                    got = run_one(how, path, size, rank)
                    got["wall"] = time.perf_counter() - t0
                    runs[how].append(got)
            for how in CONTENDERS:
                secs = [r["seconds"] for r in runs[how]]
                results.append({"state": state, "size": size, "rank": rank, "contender": how,
                                "median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs),
                                "bytes": runs[how][0]["bytes"], "tensors": runs[how][0]["tensors"],
                                "rss_gib": statistics.median(r["rss_gib"] for r in runs[how]),
                                "runs": runs[how]})
    lines = [f"# A tensor-parallel rank's load ({datetime.date.today()}, {total / 1e9:.2f} GB checkpoint, "
             f"medians of {args.runs}, the last rank)", "",
             "| state | ranks | contender | s (min-max) | rank's GB | GB/s of the rank's bytes | time vs tl rank | peak RSS GiB |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        base = next(x for x in results if x["state"] == r["state"] and x["size"] == r["size"]
                    and x["contender"] == "tl rank")
        lines.append(f"| {r['state']} | {r['size']} | {r['contender']} | {r['median_s']:.3f} "
                     f"({r['min_s']:.3f}-{r['max_s']:.3f}) | {r['bytes'] / 1e9:.3f} | "
                     f"{r['bytes'] / 1e9 / r['median_s']:.2f} | {r['median_s'] / base['median_s']:.2f}x | "
                     f"{r['rss_gib']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "tp.md"), "w") as f:
        f.write(text)
    with open(os.path.join(ROOT, "bench", "out", "tp.json"), "w") as f:
        json.dump({"gb": total / 1e9, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
