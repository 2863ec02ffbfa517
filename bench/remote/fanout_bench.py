"""Many new instances pulling one model at once, on a cluster of hosts (tests/python/cluster.py):
a root seed on host 0, N receivers on hosts 1..N, every link capped (tbf, both directions), etcd on
the root's host as the registry. Measures, per N and mode, the time until every receiver is done
(and the median receiver's) against T1, one receiver alone on the same harness, and the bytes the
root's link sent (its interface's counter, headers included) against the checkpoint's.

Modes (each receiver runs `tensorlift fetch --registry URL --model M --revision R` with
--transports tcp):
  relay    the default: each receiver serves what it has received while it receives, and takes
           from the one registered before it (docs/remote.md, "Relaying");
  star     --no-relay: the receivers list the registry's seeds (the root) and pull from them;
  seed     --no-relay --seed: a receiver that is done serves what it got and registers ("doubling"
           when later receivers start after earlier ones finish; here they all start together, as
           a scaling event starts them);
  kill     relay, with the relay registered second killed once a relay is half way: the others'
           times (none may fall back).

    sudo .venv/bin/python bench/remote/fanout_bench.py --mib 128 --cap-mbit 200 --n 2 4 8 --runs 3

Needs root (namespaces), etcd and tensorlift's CLI (build/tensorlift). Writes
bench/out/fanout.json and prints a table. Nothing here is asserted: it measures.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import cluster as cl  # noqa: E402

MODEL = ["--model", "fanout", "--revision", "r1"]


def make_checkpoint(path, mib):
    """A checkpoint of `mib` MiB of random bytes in 8 MiB tensors (safetensors, one file)."""
    import numpy as np
    from safetensors.numpy import save_file
    rng = np.random.default_rng(1)
    tensors = {}
    left = mib << 20
    i = 0
    while left > 0:
        n = min(8 << 20, left)
        tensors[f"layers.{i}.w"] = rng.integers(0, 255, size=n, dtype=np.uint8)
        left -= n
        i += 1
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return sum(t.nbytes for t in tensors.values())


def tx_bytes(c, host):
    r = subprocess.run(["ip", "-n", c.names[host], "-s", "-j", "link", "show", "eth0"], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]


def wait_file(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) or not open(path).read().strip():
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args}: exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        time.sleep(0.02)
    return open(path).read().strip()


def one_run(args, ckpt, tensor_bytes, n, mode, workdir):
    """Seed + n receivers started together; (per-receiver seconds, root tx bytes, sources)."""
    caps = [args.cap_mbit] * (n + 1)
    if args.slow and n >= args.slow:
        caps[args.slow] = args.cap_mbit / 4  # One receiver behind a link 4x slower.
    with cl.Cluster(n + 1, cap_mbit=caps) as c:
        etcd = c.etcd(0)
        ready = os.path.join(workdir, "root-url")
        if os.path.exists(ready):
            os.unlink(ready)
        root = c.popen(0, [args.cli, "serve", ckpt, *MODEL, "--host", c.addr(0), "--transports", "tcp",
                           "--no-handover", "--registry", etcd, "--ready-file", ready, *args.serve_args.split()],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_file(ready, root)
        tx0 = tx_bytes(c, 0)
        env = dict(os.environ, UCX_TLS="tcp")
        procs = []
        start = time.monotonic()
        for i in range(1, n + 1):
            argv = [args.cli, "fetch", "--registry", etcd, *MODEL, "--transports", "tcp", "--handover", "off",
                    "--no-local", "--seed-host", c.addr(i), "--checksum", *args.fetch_args.split()]
            if mode not in ("relay", "kill"):
                argv.append("--no-relay")
            if mode == "seed":
                argv += ["--seed"]
            procs.append(c.popen(i, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env))
        done = [None] * n
        errs = [[] for _ in range(n)]

        def follow(k, p):
            # A receiver is done when it says what it fetched (a relay then serves its children
            # on until they are done, a seed until stopped).
            for line in p.stderr:
                errs[k].append(line)
                if line.startswith("fetched ") and done[k] is None:
                    done[k] = time.monotonic() - start

        readers = [threading.Thread(target=follow, args=(k, p), daemon=True) for k, p in enumerate(procs)]
        for t in readers:
            t.start()
        killed = None
        if mode == "kill":
            # The relay registered second (it has a child), once a relay is half way.
            while True:
                relays = sorted((rev, v) for v, rev in c.seed_entries(etcd) if v.get("partial"))
                if len(relays) == n and max(v["progress"] for _, v in relays) >= 0.5:
                    break
                if time.monotonic() > start + args.timeout:
                    raise RuntimeError("no relay got half way")
                time.sleep(0.05)
            victim_url = relays[1][1]["url"]
            killed = next(k for k in range(n) if f"//{c.addr(k + 1)}:" in victim_url)
            c.stop(procs[killed])
            done[killed] = float("nan")
        deadline = start + args.timeout
        while any(d is None for d in done):
            for k, p in enumerate(procs):
                if done[k] is None and p.poll() is not None:
                    readers[k].join(timeout=5)
                    if done[k] is None:
                        raise RuntimeError(f"receiver {k + 1} exited {p.returncode}: {''.join(errs[k])}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"n={n} {mode}: not done after {args.timeout} s")
            time.sleep(0.01)
        for k, p in enumerate(procs):
            if k == killed:
                continue
            if mode == "seed":
                c.stop(p)
            try:
                p.wait(timeout=150)
            except subprocess.TimeoutExpired:
                c.stop(p)
            readers[k].join(timeout=5)
            if mode != "seed" and p.returncode != 0:
                raise RuntimeError(f"receiver {k + 1} failed: {''.join(errs[k])}")
            if mode == "kill" and any("relaying pull:" in line for line in errs[k]):
                raise RuntimeError(f"receiver {k + 1} did not finish relaying: {''.join(errs[k])}")
        tx = tx_bytes(c, 0) - tx0
        sources = [[line.rstrip() for line in e if " from " in line or "fallback" in line or line.startswith("  http")]
                   for e in errs]
        if killed is not None:
            del done[killed]
            del sources[killed]
        if args.verbose:
            for k in range(len(done)):
                print(f"  receiver {k + 1} ({c.addr(k + 1)}): done at {done[k]:.2f} s; " +
                      "; ".join(x.strip() for x in sources[k][1:]), flush=True)
        return done, tx, sources


def median_spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "tensorlift"))
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--cap-mbit", type=float, default=200)
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--modes", nargs="+", default=["relay", "star", "seed"],
                    choices=["relay", "star", "seed", "kill"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--slow", type=int, default=0,
                    help="receiver K's link is 4x slower (0: none); the others' times are reported apart")
    ap.add_argument("--verbose", action="store_true", help="each receiver's time and sources")
    ap.add_argument("--fetch-args", default="", help="more arguments for every receiver's fetch")
    ap.add_argument("--serve-args", default="", help="more arguments for the root seed's serve")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "fanout.json"))
    args = ap.parse_args(argv)
    why = cl.reason()
    if why:
        sys.exit(f"fanout bench: {why}")
    if args.cap_mbit * max(args.n) > 1600:
        print(f"note: {max(args.n)} x {args.cap_mbit:g} Mbit/s is more than 2 cores relay (~1.6 Gbit/s)",
              file=sys.stderr)
    workdir = tempfile.mkdtemp(prefix="tl_fanout_")
    ckpt = os.path.join(workdir, "ckpt")
    tensor_bytes = make_checkpoint(ckpt, args.mib)
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "nproc": os.cpu_count()},
               "bytes": tensor_bytes, "cap_mbit": args.cap_mbit, "runs": args.runs, "rows": []}
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    results["commit"] = git.stdout.strip()
    wire_s = tensor_bytes * 8 / (args.cap_mbit * 1e6)
    print(f"fanout bench: {tensor_bytes / 2**20:.0f} MiB, links {args.cap_mbit:g} Mbit/s each way "
          f"(one checkpoint's bytes on one link: {wire_s:.2f} s), {args.runs} runs per cell", flush=True)
    t1_runs = []
    for r in range(args.runs):
        done, tx, _ = one_run(args, ckpt, tensor_bytes, 1, "star", workdir)  # Alone: nothing to relay.
        t1_runs.append(done[0])
    t1 = statistics.median(t1_runs)
    results["t1"] = median_spread(t1_runs)
    print(f"T1 (one receiver alone): {t1:.2f} s (min {min(t1_runs):.2f}, max {max(t1_runs):.2f})", flush=True)
    for n in args.n:
        for mode in args.modes:
            last, med, up, slow_s = [], [], [], []
            for r in range(args.runs):
                done, tx, sources = one_run(args, ckpt, tensor_bytes, n, mode, workdir)
                if args.slow and n >= args.slow:
                    # The others: does the slow receiver hold them back?
                    slow_s.append(done[args.slow - 1])
                    done = done[:args.slow - 1] + done[args.slow:]
                last.append(max(done))
                med.append(statistics.median(done))
                up.append(tx / tensor_bytes)
            row = {"n": n, "mode": mode, "all_done_s": median_spread(last), "median_receiver_s": median_spread(med),
                   "root_upload_x": median_spread(up), "sources_last_run": sources}
            if slow_s:
                row["slow_receiver_s"] = median_spread(slow_s)
                print(f"  the slow receiver (link at a quarter): {statistics.median(slow_s) / t1:.2f}x T1; "
                      "the others below", flush=True)
            results["rows"].append(row)
            print(f"N={n} {mode}: all done {statistics.median(last):.2f} s = {statistics.median(last) / t1:.2f}x T1 "
                  f"(min {min(last) / t1:.2f}, max {max(last) / t1:.2f}); median receiver "
                  f"{statistics.median(med) / t1:.2f}x; root sent {statistics.median(up):.2f}x the checkpoint",
                  flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print("\n| N | mode | all done / T1 (min-max) | median receiver / T1 | root sent / checkpoint |")
    print("|---|---|---|---|---|")
    for row in results["rows"]:
        a, m, u = row["all_done_s"], row["median_receiver_s"], row["root_upload_x"]
        print(f"| {row['n']} | {row['mode']} | {a['median'] / t1:.2f}x ({a['min'] / t1:.2f}-{a['max'] / t1:.2f}) | "
              f"{m['median'] / t1:.2f}x | {u['median']:.2f}x |")
    print(f"\nT1 = {t1:.2f} s; written {args.out}")


if __name__ == "__main__":
    main()
