#!/usr/bin/env python3
"""Cost of the content identity during a cold load (docs/remote.md, "Content identity").

Runs `tensorlift load` on a checkpoint evicted from the page cache (so auto
reads it with O_DIRECT into owned memory and hashes each 4 MiB piece as its
read completes), with content hashing on (the default) and off
(--no-content-hash), alternating, and prints medians of N runs with min-max.
Target: on costs at most 3% more than off.

  python3 bench/load/content_bench.py --cli build/tensorlift --gib 1 [--runs 3] [--dir DIR]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_bench import evict  # noqa: E402


def write_checkpoint(path, gib):
    """One F16 tensor per 64 MiB of random bytes, a minimal safetensors file."""
    per = 64 << 20
    count = max(1, int(gib * (1 << 30)) // per)
    header, off = {}, 0
    for i in range(count):
        header[f"layers.{i}.weight"] = {"dtype": "F16", "shape": [per // 2],
                                        "data_offsets": [off, off + per]}
        off += per
    import json
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    chunk = os.urandom(per)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for _ in range(count):
            f.write(chunk)
    return off


def one_load(cli, path, hashing):
    evict([path])
    cmd = [cli, "load", path, "--no-progress"] + ([] if hashing else ["--no-content-hash"])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    secs = float(re.search(r"in ([0-9.]+) s", out).group(1))
    has_root = "content " in out
    if has_root != hashing:
        raise SystemExit(f"expected content line {hashing}, output:\n{out}")
    return secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default="build/tensorlift")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (a real disk)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        path = os.path.join(d, "model.safetensors")
        nbytes = write_checkpoint(path, a.gib)
        times = {True: [], False: []}
        for _ in range(a.runs):
            for hashing in (False, True):
                times[hashing].append(one_load(a.cli, path, hashing))
        print(f"cold load of {nbytes / 2**30:.2f} GiB, {a.runs} runs each (medians, min-max)")
        print("| content hash | seconds | GB/s |")
        print("|---|---|---|")
        for hashing in (False, True):
            t = times[hashing]
            print(f"| {'on' if hashing else 'off'} | {statistics.median(t):.3f} "
                  f"({min(t):.3f}-{max(t):.3f}) | {nbytes / statistics.median(t) / 1e9:.2f} |")
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"cost: {100 * (on - off) / off:+.1f}% (target <= 3%)")


if __name__ == "__main__":
    main()
