"""How much a seed slows down while a client pulls its weights (issue 42, "undisturbed seeds").

    .venv/bin/python bench/remote/seed_disturbance.py [--device cuda:0|cpu] [--mb 1024]
        [--seconds 4] [--rate-limits 0,2e9] [--runs 3] [--out bench/out/seed-disturbance.json]

This process plays a running instance: it holds --mb of fp16 weights on --device, serves
them through tensorlift.remote.serve_tensors (from the device's memory where UCX can map it,
else host copies, as the vLLM and SGLang formats do), and runs a steady workload standing in
for decoding: a loop of matmuls on the same device, in a thread of the same process (a GPU:
8192 x 8192 fp16; the CPU: 384 x 384 fp32), counting iterations. For each rate limit
(serve_tensors' rate_limit, bytes/s; 0 = none, the default) and each run, it measures the
workload's rate for --seconds alone, then for --seconds while a client process pulls the
weights again and again into the same device (remote.load_from_peer), and reports the
slowdown (1 - during / alone) and the pulls' GB/s. Medians (min-max) of --runs. Prints a table
and writes --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

from tensorlift import remote

CLIENT = r"""
import sys, time
import torch
from tensorlift import remote
url, device, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
print("ready", flush=True)  # imports done: the pulls start now
t0 = time.perf_counter(); pulled = 0; n = 0
while n == 0 or time.perf_counter() - t0 < seconds:  # at least one pull, however late this runs
    out = remote.load_from_peer(url, model="seed-disturbance", revision="1", device=device, timeout=60)
    pulled += sum(t.numel() * t.element_size() for t in out.values()); n += 1
    del out
print(pulled, n, time.perf_counter() - t0)
"""


class Workload:
    """A matmul loop on `device` in a thread; rate() gives iterations per second over a window."""

    def __init__(self, device):
        self.device = device
        n, dtype = (8192, torch.float16) if device.startswith("cuda") else (384, torch.float32)
        self.a = torch.randn(n, n, device=device, dtype=dtype)
        self.b = torch.randn(n, n, device=device, dtype=dtype)
        self.count = 0
        self.stop = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        cuda = self.device.startswith("cuda")
        while not self.stop:
            c = self.a @ self.b
            if cuda:
                torch.cuda.synchronize(self.device)  # One matmul at a time, as a decoding step waits for its result.
            del c
            self.count += 1

    def rate(self, seconds):
        start, t0 = self.count, time.perf_counter()
        time.sleep(seconds)
        while self.count == start:  # at least one iteration in the window, however loaded the machine
            time.sleep(0.01)
        return (self.count - start) / (time.perf_counter() - t0)

    def close(self):
        self.stop = True
        self.thread.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--mb", type=int, default=1024, help="MB of weights the seed serves")
    ap.add_argument("--seconds", type=float, default=4.0, help="each window: alone, then during pulls")
    ap.add_argument("--rate-limits", default="0,2e9", help="serve_tensors rate_limit values, bytes/s (0: none)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "out", "seed-disturbance.json"))
    args = ap.parse_args()

    n_tensors = 16
    per = args.mb * 1000 * 1000 // 2 // n_tensors
    g = torch.Generator(device="cpu").manual_seed(0)
    weights = {f"w{i}": torch.randn(per, generator=g).to(torch.float16).to(args.device) for i in range(n_tensors)}
    workload = Workload(args.device)
    time.sleep(1.0)  # warm up (kernels chosen, clocks up)
    results = {"device": args.device, "mb": args.mb, "seconds": args.seconds, "runs": args.runs,
               "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None,
               "by_rate_limit": {}}
    for limit in [float(x) for x in args.rate_limits.split(",")]:
        served = weights
        try:
            server = remote.serve_tensors(served, model="seed-disturbance", revision="1", rate_limit=limit)
            landing = "device" if args.device.startswith("cuda") else "host"
        except NotImplementedError:  # UCX without CUDA: host copies, as the servers' formats do
            served = {k: v.cpu() for k, v in weights.items()}
            server = remote.serve_tensors(served, model="seed-disturbance", revision="1", rate_limit=limit)
            landing = "host copies"
        rows = []
        with server:
            url = server.url
            for _ in range(args.runs):
                alone = workload.rate(args.seconds)
                client = subprocess.Popen([sys.executable, "-c", CLIENT, url, args.device, str(args.seconds)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                if client.stdout.readline().strip() != "ready":  # its imports are not a pull
                    client.kill()
                    sys.exit(f"seed-disturbance: the client failed: {client.stderr.read()[-2000:]}")
                during = workload.rate(args.seconds)
                out, err = client.communicate(timeout=600)
                if client.returncode != 0:
                    sys.exit(f"seed-disturbance: the client failed: {err[-2000:]}")
                pulled, pulls, secs = out.split()
                rows.append({"alone_per_s": alone, "during_per_s": during, "slowdown": 1 - during / alone,
                             "pulls": int(pulls), "pull_gbps": int(pulled) / float(secs) / 1e9})
                print(f"seed-disturbance: rate limit {limit:g} B/s: alone {alone:.1f}/s, during {during:.1f}/s "
                      f"({rows[-1]['slowdown'] * 100:.1f} % slower), {pulls} pulls at "
                      f"{rows[-1]['pull_gbps']:.2f} GB/s", flush=True)
        results["by_rate_limit"][f"{limit:g}"] = {"served_from": landing, "runs": rows}
    workload.close()

    def med(rows, key):
        v = sorted(r[key] for r in rows)
        return statistics.median(v), v[0], v[-1]

    lines = [f"Seed disturbance, {time.strftime('%Y-%m-%d')}: {results['gpu'] or 'CPU'} ({args.device}), "
             f"{args.mb} MB served, windows of {args.seconds:g} s, medians (min-max) of {args.runs}", "",
             "| rate limit | served from | workload alone /s | during pulls /s | slowdown | pulls GB/s |",
             "|---|---|---|---|---|---|"]
    for limit, r in results["by_rate_limit"].items():
        a, d, s, p = (med(r["runs"], k) for k in ("alone_per_s", "during_per_s", "slowdown", "pull_gbps"))
        lines.append(f"| {'none' if float(limit) == 0 else limit + ' B/s'} | {r['served_from']} | {a[0]:.1f} | "
                     f"{d[0]:.1f} | {s[0] * 100:.1f} % ({s[1] * 100:.1f}-{s[2] * 100:.1f}) | "
                     f"{p[0]:.2f} ({p[1]:.2f}-{p[2]:.2f}) |")
    print("\n".join(lines))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
