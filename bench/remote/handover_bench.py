"""Same-host restart (issue 43): a process that needs a checkpoint another process on this host
already holds, through each path, in the same run:

  handover   `tensorlift serve --resident` holds it in sealed shared memory; the client maps it
             (found by its key alone, no URL): no byte copied.
  ucx        the same seed, `--handover off`: pulled over UCX (shared memory transport), every
             chunk checked.
  disk warm  `tensorlift.load` of the files from the page cache.
  disk cold  the same after evicting the files (posix_fadvise DONTNEED, checked with mincore).

    .venv/bin/python bench/remote/handover_bench.py --build build [--gb 2] [--runs 3]

For each path, a fresh Python process (the way users call it: tensorlift.remote.load_from_peer with
the key, tensorlift.load for the disk) reports: the time to usable tensors (torch tensors in hand),
then the time to touch every byte (a sum over every tensor, the first use), and what it added to
the host's memory once it holds the tensors (MemTotal - MemAvailable, /proc/meminfo, before and
after, the page cache's growth excluded for disk loads since it is reclaimable). The CLI's own
`tensorlift fetch` time (the pull alone) is reported for handover and UCX. Medians of --runs with
min-max. Writes bench/out/handover.json and prints a table.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
import gen_checkpoint  # noqa: E402
from load_bench import evict, read_through, resident_fraction  # noqa: E402

CLIENT = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, tensorlift, tensorlift.remote as remote
t_import = time.perf_counter() - t0
path, how, model = sys.argv[1], sys.argv[2], sys.argv[3]
def used():
    m = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":")
        m[k] = int(v.split()[0]) * 1024
    return m["MemTotal"] - m["MemAvailable"], m.get("Cached", 0)
used0, cached0 = used()
t0 = time.perf_counter()
if how == "disk":
    tensors = tensorlift.load(path)
    report = {}
else:
    tensors = remote.load_from_peer(model=model, revision="1", handover=how)
    report = remote.last_report()
t_ready = time.perf_counter() - t0
t1 = time.perf_counter()
total = 0
for t in tensors.values():
    if t.numel():
        # Every byte read once, at memory speed: 8-byte words summed (wrapping), then the tail.
        b = t.reshape(-1).view(torch.uint8)
        head = min(b.numel(), (-b.data_ptr()) % 8)
        n8 = (b.numel() - head) // 8 * 8
        total += int(b[:head].sum(dtype=torch.int64)) + int(b[head + n8:].sum(dtype=torch.int64))
        if n8:
            total += int(b[head:head + n8].view(torch.int64).sum())
t_touch = time.perf_counter() - t1
used1, cached1 = used()
print(json.dumps({"ready_s": t_ready, "touch_s": t_touch, "import_s": t_import,
                  "added_bytes": used1 - used0, "cache_growth": cached1 - cached0,
                  "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                  "handover": bool(report.get("handover")), "source": report.get("source", "disk"),
                  "checksum": total}))
"""


def run_client(python, path, how, model, env):
    r = subprocess.run([python, "-c", CLIENT, path, how, model], capture_output=True, text=True, env=env,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"client {how} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def cli_fetch(build, model, handover, env):
    r = subprocess.run([os.path.join(build, "tensorlift"), "fetch", "--model", model, "--revision", "1",
                        "--handover", handover, "--transports", "sm", "--timeout-ms", "60000"],
                       capture_output=True, text=True, env=env, timeout=600)
    m = re.search(r"fetched \d+ tensors, (\d+) bytes from (\S+) \(.*\) in ([0-9.]+) s", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"fetch failed: {r.stdout}{r.stderr}")
    return {"seconds": float(m.group(3)), "handed_over": "handed over" in r.stdout}


def start_seed(build, path, model, env):
    ready = tempfile.mktemp(prefix="tl_handover_bench_")
    proc = subprocess.Popen([os.path.join(build, "tensorlift"), "serve", path, "--model", model,
                             "--revision", "1", "--resident", "--transports", "sm", "--ready-file", ready],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    t0 = time.perf_counter()
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {proc.stderr.read().decode()}")
        time.sleep(0.05)
    os.unlink(ready)
    return proc, time.perf_counter() - t0


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def fmt(s, scale=1.0, unit="s", digits=3):
    return f"{s['median'] * scale:.{digits}f} {unit} ({s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "handover.json"))
    args = ap.parse_args()
    python = sys.executable
    env = dict(os.environ, UCX_TLS="sm,self", TENSORLIFT_UCX_LOG="")
    path = gen_checkpoint.checkpoint_dir(args.gb, 1)
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    model = f"handover-bench-{os.getpid()}"
    read_through(files)
    seed, seed_start = start_seed(args.build, path, model, env)
    results = {"gb": args.gb, "path": path, "seed_start_s": seed_start, "cpu": open("/proc/cpuinfo").read().split(
        "model name")[1].split("\n")[0].strip(" \t:"), "paths": {}}
    rows = {k: {"ready": [], "touch": [], "added": []} for k in ("handover", "ucx", "disk warm", "disk cold")}
    fetch = {"handover": [], "ucx": []}
    try:
        for _ in range(args.runs):
            # Interleaved rounds: each path once per round.
            for name, how in (("handover", "auto"), ("ucx", "off")):
                r = run_client(python, path, how, model, env)
                if r["handover"] != (how == "auto"):
                    raise RuntimeError(f"{name}: handover={r['handover']} from {r['source']}")
                rows[name]["ready"].append(r["ready_s"])
                rows[name]["touch"].append(r["touch_s"])
                rows[name]["added"].append(r["added_bytes"])
                f = cli_fetch(args.build, model, how, env)
                if f["handed_over"] != (how == "auto"):
                    raise RuntimeError(f"fetch {name}: handed over {f['handed_over']}")
                fetch[name].append(f["seconds"])
            read_through(files)
            r = run_client(python, path, "disk", model, env)
            rows["disk warm"]["ready"].append(r["ready_s"])
            rows["disk warm"]["touch"].append(r["touch_s"])
            rows["disk warm"]["added"].append(r["added_bytes"] - max(0, r["cache_growth"]))
            evict(files)
            fr = min(resident_fraction(f) for f in files)
            if fr > 0.01:
                raise RuntimeError(f"eviction left {fr:.0%} of the files cached")
            r = run_client(python, path, "disk", model, env)
            rows["disk cold"]["ready"].append(r["ready_s"])
            rows["disk cold"]["touch"].append(r["touch_s"])
            rows["disk cold"]["added"].append(r["added_bytes"] - max(0, r["cache_growth"]))
            read_through(files)
    finally:
        seed.send_signal(signal.SIGTERM)
        seed.wait(timeout=60)
    nbytes = sum(os.path.getsize(f) for f in files)
    for name, v in rows.items():
        results["paths"][name] = {"ready_s": summary(v["ready"]), "touch_s": summary(v["touch"]),
                                  "added_bytes": summary(v["added"])}
    for name, v in fetch.items():
        results["paths"][name]["cli_fetch_s"] = summary(v)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    ucx_fetch = results["paths"]["ucx"]["cli_fetch_s"]["median"]
    print(f"\n## Same-host restart, {nbytes / 1e9:.2f} GB, medians of {args.runs} (min-max); {results['cpu']}\n")
    print("| path | to usable tensors | touching every byte | host memory added | `tensorlift fetch` |")
    print("|---|---|---|---|---|")
    for name in rows:
        p = results["paths"][name]
        cli = fmt(p["cli_fetch_s"]) if "cli_fetch_s" in p else "-"
        print(f"| {name} | {fmt(p['ready_s'])} | {fmt(p['touch_s'])} | "
              f"{fmt(p['added_bytes'], 1 / nbytes, 'x', 2)} of the bytes | {cli} |")
    h = results["paths"]["handover"]["cli_fetch_s"]["median"]
    print(f"\nhandover vs UCX pull (fetch): {ucx_fetch / h:.0f}x faster; "
          f"to usable tensors vs disk warm: "
          f"{results['paths']['disk warm']['ready_s']['median'] / results['paths']['handover']['ready_s']['median']:.1f}x")


if __name__ == "__main__":
    main()
