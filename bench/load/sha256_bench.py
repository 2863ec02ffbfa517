"""`tensorlift verify --sha256` against the disk and sha256sum (issue 43), cold.

    .venv/bin/python bench/load/sha256_bench.py --build build [--gb 4] [--shards 4] [--runs 3]

Environment: TL_BENCH_GB, TL_BENCH_SHARDS, TL_BENCH_RUNS (as load_bench.py), TL_BENCH_CACHE
(where the generated checkpoint is kept).

On one generated checkpoint (gen_checkpoint.checkpoint_dir), each run of each
contender starts cold: every shard is fsync'ed and evicted with
posix_fadvise(DONTNEED), and mincore confirms that none of it is cached. The
contenders, each timed from process start to exit:

  disk: dd iflag=direct bs=8M, one dd per shard, all at once (the disk's rate)
  sha256sum, the shards one after another (one process)
  sha256sum, one process per shard, all at once
  tensorlift verify --sha256 SUMS (the digests sha256sum gave; it must agree)
  tensorlift verify --sha256 SUMS, warm (the shards cached: hashing alone)

Prints a markdown table of medians with min-max, in GB/s of shard bytes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import gen_checkpoint  # noqa: E402
from load_bench import env_num, evict, machine_info, read_through, resident_fraction  # noqa: E402


def run_all(commands):
    """Runs the commands at once; seconds until the last exits. A failure raises."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    outs = [p.communicate() for p in procs]
    elapsed = time.perf_counter() - t0
    for c, p, (out, err) in zip(commands, procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(c)} exited {p.returncode}: {out}{err}")
    return elapsed


def make_cold(paths):
    evict(paths)
    cached = max(resident_fraction(p) for p in paths)
    if cached > 0.01:
        raise RuntimeError(f"eviction left {cached:.1%} of a shard cached")


def make_warm(paths):
    if min(resident_fraction(p) for p in paths) < 0.999:
        read_through(paths)
    if min(resident_fraction(p) for p in paths) < 0.999:
        raise RuntimeError("the shards do not stay in the page cache")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory with the tensorlift CLI")
    # The load bench's environment (TL_BENCH_GB, _SHARDS, _RUNS) sets the defaults here too.
    ap.add_argument("--gb", type=float, default=env_num("TL_BENCH_GB", 4.0))
    ap.add_argument("--shards", type=int, default=env_num("TL_BENCH_SHARDS", 4, int))
    ap.add_argument("--runs", type=int, default=env_num("TL_BENCH_RUNS", 3, int))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "sha256.json"))
    args = ap.parse_args()

    cli = os.path.join(args.build, "tensorlift")
    ckpt = gen_checkpoint.checkpoint_dir(args.gb, args.shards)
    shards = gen_checkpoint.shard_paths(ckpt)
    total = sum(os.path.getsize(p) for p in shards)

    # The expected digests, from sha256sum (warm: not a timed run).
    sums = os.path.join(ckpt, "SHA256SUMS")
    if not os.path.exists(sums):
        out = subprocess.run(["sha256sum", *[os.path.basename(p) for p in shards]], cwd=ckpt,
                             check=True, capture_output=True, text=True).stdout
        with open(sums + ".tmp", "w") as f:
            f.write(out)
        os.rename(sums + ".tmp", sums)

    verify = [cli, "verify", "-q", "--sha256", sums, ckpt]
    contenders = [
        ("disk: dd iflag=direct bs=8M, a dd per shard at once", "cold",
         [["dd", f"if={p}", "of=/dev/null", "bs=8M", "iflag=direct", "status=none"] for p in shards]),
        ("sha256sum, shards in turn", "cold", [["sha256sum", *shards]]),
        ("sha256sum, a process per shard at once", "cold", [["sha256sum", p] for p in shards]),
        ("tensorlift verify --sha256", "cold", [verify]),
        ("tensorlift verify --sha256", "warm", [verify]),
    ]
    results = []
    for label, state, commands in contenders:
        times = []
        for _ in range(args.runs):
            make_cold(shards) if state == "cold" else make_warm(shards)
            times.append(run_all(commands))
        results.append({"label": label, "state": state, "times_s": times})
        med = statistics.median(times)
        print(f"{label} ({state}): {med:.2f} s, {total / med / 1e9:.2f} GB/s", file=sys.stderr, flush=True)

    info = machine_info()
    sha_ni = "sha_ni" in open("/proc/cpuinfo").read()
    lines = [
        f"{total / 1e9:.2f} GB in {len(shards)} shards; {info['nproc']} CPUs ({info['cpu']}, "
        f"SHA-NI {'yes' if sha_ni else 'no'}); {info.get('filesystem', '?')}; median of {args.runs} (min-max)",
        "",
        "| contender | state | seconds | GB/s |",
        "|---|---|---|---|",
    ]
    for r in results:
        t = r["times_s"]
        med = statistics.median(t)
        lines.append(f"| {r['label']} | {r['state']} | {med:.2f} ({min(t):.2f}-{max(t):.2f}) | "
                     f"{total / med / 1e9:.2f} ({total / max(t) / 1e9:.2f}-{total / min(t) / 1e9:.2f}) |")
    report = "\n".join(lines)
    print(report)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bytes": total, "shards": shards, "machine": info, "sha_ni": sha_ni,
                   "results": results, "report": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
