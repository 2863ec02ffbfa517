"""Odd headers on the host (issue 40, item 6): a bf16 file whose header length is odd, so that
every tensor is misaligned for its dtype, loaded from the page cache and every byte touched.

    python bench/load/odd_header_bench.py [--gb 2] [--runs 3] [--out DIR]

Contenders, each in a process of its own (its peak RSS its own), timed from the loader's first
call to the end of one pass over every byte (--consumer: an Adler-32 of each tensor on one thread,
as a checksum or a copy into parameters reads them, or torch's max on every CPU):
  safetensors       safetensors.torch.load_file (the reference: misaligned views of its mapping)
  tensorlift        tensorlift.load with its defaults (views, misaligned ones as the reference's)
  tensorlift_copy   tensorlift.load(copy=True): aligned copies in memory of its own
Every contender's Adler-32 of each tensor must equal the reference's. Writes
DIR/odd_header_CONSUMER.json and .md: medians (min-max) of --runs, and peak RSS against the file's size.
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys

CONTENDERS = ["safetensors", "tensorlift", "tensorlift_copy"]


def make_file(path, gb, tensors=64):
    """bf16 tensors of equal size behind a header whose length is odd (8n + 3)."""
    if os.path.exists(path):
        return
    import numpy as np
    per = int(gb * 1e9 / tensors) // 2 // 4096 * 4096  # elements
    meta, at = {}, 0
    for i in range(tensors):
        meta[f"layers.{i}.weight"] = {"dtype": "BF16", "shape": [per // 4096, 4096],
                                      "data_offsets": [at, at + per * 2]}
        at += per * 2
    header = json.dumps(meta).encode()
    header += b" " * ((3 - len(header) % 8) % 8)
    rng = np.random.default_rng(40)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        for _ in range(tensors):
            f.write(rng.integers(0, 1 << 16, per, dtype=np.uint16).tobytes())
    os.replace(tmp, path)


def child(name, path, consumer):
    """One load, timed; prints {"load_s", "peak_rss_bytes", "sums", "misaligned"}."""
    import resource
    import time
    import torch
    if name == "baseline":  # The interpreter with torch and both loaders imported, nothing loaded.
        import safetensors.torch  # noqa: F401
        import tensorlift  # noqa: F401
        print(json.dumps({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
        return
    if name == "safetensors":
        from safetensors.torch import load_file
        load = lambda: load_file(path)  # noqa: E731
    else:
        import tensorlift
        load = lambda: tensorlift.load(path, copy=name == "tensorlift_copy")  # noqa: E731
    import zlib
    t0 = time.perf_counter()
    out = load()
    # The consumer's one pass over every byte: an Adler-32 of each tensor (one thread, as a
    # checksum or a copy into parameters reads them), compared with the reference's after.
    if consumer == "adler32":
        sums = {k: zlib.adler32(t.view(torch.uint8).numpy()) for k, t in out.items()}
        dt = time.perf_counter() - t0
    else:  # torch's max over the bytes, on every CPU; the checksums after the clock.
        assert all(int(t.view(torch.uint8).max()) >= 0 for t in out.values())
        dt = time.perf_counter() - t0
        sums = {k: zlib.adler32(t.view(torch.uint8).numpy()) for k, t in out.items()}
    print(json.dumps({"load_s": dt, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "sums": sums, "misaligned": sum(t.data_ptr() % 2 for t in out.values())}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "out", "load"))
    ap.add_argument("--consumer", choices=["adler32", "max"], default="adler32",
                    help="the pass over every byte: an Adler-32 on one thread, or torch's max on every CPU")
    ap.add_argument("--child", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child, args.consumer)
        return 0
    cache = os.path.join(os.path.expanduser("~"), ".cache", "tensorlift", "bench")
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, f"odd-header-{args.gb:g}gb.safetensors")
    make_file(path, args.gb)
    size = os.path.getsize(path)
    with open(path, "rb") as f:  # warm: the whole file in the page cache
        while f.read(64 << 20):
            pass
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "baseline", path,
                        "--consumer", args.consumer],
                       capture_output=True, text=True, timeout=300, check=True)
    base_rss = json.loads(p.stdout.strip().splitlines()[-1])["peak_rss_bytes"]
    runs = {c: [] for c in CONTENDERS}
    for r in range(args.runs):
        for c in CONTENDERS:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", c, path,
                                "--consumer", args.consumer],
                               capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                runs[c].append({"error": p.stderr.strip()[-400:]})
            else:
                runs[c].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"odd-header: run {r + 1}/{args.runs} {c}: "
                  + (f"{runs[c][-1]['load_s']:.3f} s" if "load_s" in runs[c][-1] else runs[c][-1]["error"]),
                  flush=True)
    ref = next((x["sums"] for x in runs["safetensors"] if "sums" in x), None)
    lines = [f"Odd header: {size / 1e9:.2f} GB of bf16 in 64 tensors behind a header of odd length, page cache "
             f"warm, load + one pass over every byte ({args.consumer}); medians of {args.runs} runs (min-max)", "",
             f"Peak RSS less the interpreter's with torch and both loaders imported ({base_rss / 1e9:.2f} GB); "
             "views count the file's mapped pages.", "",
             "| contender | s | vs safetensors | peak RSS GB | RSS / file | tensors misaligned | same bytes |",
             "|---|---|---|---|---|---|---|"]
    ref_s = statistics.median(x["load_s"] for x in runs["safetensors"] if "load_s" in x) if ref else None
    for c, rs in runs.items():
        ok = [x for x in rs if "load_s" in x]
        if not ok:
            lines.append(f"| {c} | failed: {rs[0].get('error', '')[:200]} ||||||")
            continue
        ts = sorted(x["load_s"] for x in ok)
        m = statistics.median(ts)
        rss = max(x["peak_rss_bytes"] for x in ok) - base_rss
        same = "yes" if ref and all(x["sums"] == ref for x in ok) else "NO"
        lines.append(f"| {c} | {m:.3f} ({ts[0]:.3f}-{ts[-1]:.3f}) | {ref_s / m:.2f}x | {rss / 1e9:.2f} | "
                     f"{rss / size:.2f}x | {ok[0]['misaligned']} | {same} |")
    md = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"odd_header_{args.consumer}.json"), "w") as f:
        json.dump({"file_bytes": size, "baseline_rss_bytes": base_rss, "consumer": args.consumer, "runs": runs},
                  f, indent=1)
    with open(os.path.join(args.out, f"odd_header_{args.consumer}.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
